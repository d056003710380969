"""The ``cpu`` backend's kernel for ``Compiled`` (a fused element-wise run).

The program is rendered to C++ (:mod:`lazyx.codegen.cpp`), built once
(:mod:`lazyx.codegen.jit`, cached in memory and on disk) and called through
ctypes. Per call:

* the loop shape is the broadcast of the input shapes; inputs of one element
  are *scalars* (part of the kernel's source: loaded once);
* when every other input has the loop's shape and is C-contiguous, the
  contiguous entry runs (one flat loop); otherwise the strided entry runs on
  the layout with size-1 dimensions dropped and contiguous dimensions merged;
* large loops are split over the backend's threads (see :data:`PARALLEL_WORK`);
* the output is written into a donated input (``donors``, given by the compiled
  plan, see ``lazyx.transforms.compile``) of the loop's shape and the output's
  dtype, C-contiguous, when there is one: each element is read before its own
  slot is written, so a single-output loop may overwrite its input in place.

What the kernel cannot cover (no compiler, more dimensions than the strided
path takes after merging, odd strides) runs the reference evaluation of
``Compiled.eval_cpu``, so the result is the same either way.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from lazyx.arguments import broadcast_shapes
from lazyx.codegen import cpp, jit
from lazyx.errors import KernelOutputError
from lazyx.transforms.fusion import interpret

from . import native_kernels

#: Work (elements times the program's cost per element, see :func:`_cost`) from which a
#: kernel splits its loop over threads. Starting a thread costs 10 to 80 us on the
#: 2-core VM this was measured on, and a fused loop runs at 0.3 to 0.7 ns per element
#: (memory-bound; transcendental functions are vectorised): two threads paid from
#: about 500K elements of ``x * 2 + 1`` and about 200K of a GELU.
PARALLEL_WORK = 1 << 21
# Cost per element of an op beyond the loop's own (loads and stores count 4), relative
# to an add. libmvec's exp, log and sin vectorise well; erfinv runs scalar.
_COST = {"exp": 2, "expm1": 3, "log": 2, "log1p": 3, "log2": 2, "log10": 2, "sin": 3,
         "cos": 3, "tan": 4, "asin": 4, "acos": 4, "atan": 4, "sinh": 4, "cosh": 4,
         "tanh": 3, "asinh": 4, "acosh": 4, "atanh": 4, "erf": 3, "erfinv": 40,
         "sigmoid": 3, "pow": 6, "atan2": 6, "logaddexp": 6, "floordiv": 4, "mod": 4,
         "div": 2, "sqrt": 2, "rsqrt": 2}
_LOOP_COST = 4

_empty = np.empty
_ndarray = np.ndarray


class _Kernel:
    """The two entry points of one built kernel."""

    __slots__ = ("lib", "contiguous", "strided")

    def __init__(self, lib):
        self.lib = lib
        self.contiguous = ctypes.cast(lib.lazyx_contiguous, ctypes.c_void_p).value
        self.strided = ctypes.cast(lib.lazyx_strided, ctypes.c_void_p).value


class _Plan:
    """What a call at one set of input shapes needs."""

    __slots__ = ("program", "shape", "size", "dtypes", "kernel", "contiguous", "scalar",
                 "parallel", "layouts")


_kernels: dict = {}
_plans: dict = {}


def kernel_for(program, scalar: tuple) -> _Kernel:
    """The built kernel of ``program`` for the scalar mask ``scalar`` (cached)."""
    key = (program, scalar)
    k = _kernels.get(key)
    if k is None:
        source = cpp.render(program, scalar, jit.vector_math_header())
        k = _kernels[key] = _Kernel(jit.build(source))
    return k


def _cost(program) -> int:
    return _LOOP_COST + sum(_COST.get(e.op, 1) for e in program.nodes
                            if e.op not in ("input", "const"))


def _plan(program, inputs):
    """The plan for these input shapes, or None when the native kernel cannot run them."""
    if not jit.available():
        jit.warn_missing_compiler()
        return None
    if len(inputs) + len(program.outputs) > jit.MAX_BUFFERS:
        return None
    shapes = [x.shape for x in inputs]
    for x, d in zip(inputs, program.inputs):
        if x.dtype != d.np:
            return None
    shape = broadcast_shapes(*shapes) if shapes else ()
    p = _Plan()
    p.program = program
    p.shape = shape
    p.size = int(np.prod(shape, dtype=np.int64))
    p.dtypes = [o.dtype.np for o in program.outputs]
    p.scalar = tuple(x.size == 1 for x in inputs)
    p.contiguous = contiguous_layout(shape, inputs, p.scalar)
    p.parallel = p.size * _cost(program) >= PARALLEL_WORK
    p.layouts = {}
    p.kernel = kernel_for(program, p.scalar)
    return p


def _c_strides(shape, itemsize) -> tuple:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def contiguous_layout(shape, inputs, scalar):
    """The contiguous path of a plan: ``((k, C strides), ...)`` of the non-scalar inputs
    when every one has the loop's shape (its strides are checked per call with
    :func:`runs_contiguous`), else None. Shared by the CPU and CUDA kernels."""
    full = [k for k, x in enumerate(inputs) if not scalar[k]]
    if all(inputs[k].shape == shape for k in full):
        return tuple((k, _c_strides(shape, inputs[k].itemsize)) for k in full)
    return None


def runs_contiguous(contiguous, inputs) -> bool:
    """Whether this call's inputs have the C strides of ``contiguous_layout``."""
    if contiguous is None:
        return False
    for k, strides in contiguous:
        if inputs[k].strides != strides:
            return False
    return True


def cached_layout(p, inputs, make):
    """The strided path's layout of ``inputs`` under plan ``p``: ``make(dims, strides)``
    of the collapsed loop, cached per input strides in ``p.layouts``; None when the
    kernels cannot run it (too many dimensions, or strides that are not whole elements)."""
    key = tuple([x.strides for x in inputs])
    got = p.layouts.get(key)
    if got is not None:
        return got
    got = collapse(p.shape, inputs, p.scalar)
    if got is None:
        return None
    dims, strides = got
    if not dims or len(dims) > cpp.MAX_DIMS:
        return None
    got = make(dims, strides)
    if len(p.layouts) > 64:
        p.layouts.clear()
    p.layouts[key] = got
    return got


def _threads() -> int:
    native = native_kernels.load()
    if native is not None:
        return native.get_num_threads()
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def collapse(shape, inputs, scalar):
    """The loop ``shape`` with size-1 dimensions dropped and dimensions that are
    contiguous for every input merged, and each input's element strides along it (0
    for a broadcast dimension and for the inputs marked in ``scalar``).

    Shared with the CUDA backend (``inputs`` may be CuPy arrays: only ``shape``,
    ``ndim``, ``strides`` and ``itemsize`` are read).

    Returns:
        ``(dims, strides)``: a list of extents and one list of strides per input;
        None when a stride is not a whole number of elements.
    """
    nd = len(shape)
    per = []
    for k, x in enumerate(inputs):
        st = [0] * nd
        if not scalar[k]:
            off = nd - x.ndim
            xs, xst, item = x.shape, x.strides, x.itemsize
            for d in range(x.ndim):
                if xs[d] != 1:
                    q, r = divmod(xst[d], item)
                    if r:
                        return None
                    st[off + d] = q
        per.append(st)
    dims, strides = [], [[] for _ in inputs]
    for d in range(nd):
        n = shape[d]
        if n == 1:
            continue
        if dims and all(s[-1] == q[d] * n for s, q in zip(strides, per)):
            dims[-1] *= n
            for s, q in zip(strides, per):
                s[-1] = q[d]
        else:
            dims.append(n)
            for s, q in zip(strides, per):
                s.append(q[d])
    return dims, strides


def _layout(p: _Plan, inputs):
    """The collapsed loop shape and element strides (bytes for the kernel), or None."""
    return cached_layout(p, inputs, lambda dims, strides: (
        np.asarray(dims + [v for s in strides for v in s], dtype=np.int64).tobytes(), len(dims)))


def compiled_kernel(prim, inputs, donors=()):
    """Run a ``Compiled`` node's program natively (see the module docstring).

    ``donors``: positions of inputs whose buffers nothing else reads any more; the
    output may be written into one of them instead of a new buffer.
    """
    program = prim.program
    for x in inputs:
        if type(x) is not _ndarray:
            inputs = [np.asarray(x) for x in inputs]
            break
    shapes = tuple([x.shape for x in inputs])
    # Plans are found by the program's identity (cheap) and checked against it.
    key = (id(program), shapes)
    p = _plans.get(key)
    if p is None or p.program is not program:
        p = _plan(program, inputs)
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = p if p is not None else _Unplanned(program)
    elif p.kernel is None:
        p = None
    if p is None:
        return interpret(program, inputs, prim.stream)
    out = _donated(inputs, donors, p) if donors else None
    outs = [_empty(p.shape, d) for d in p.dtypes] if out is None else [out]
    n = p.size
    if n:
        threads = _threads() if p.parallel else 1
        arrays = (*inputs, *outs)
        if runs_contiguous(p.contiguous, inputs):
            rc = _call_contiguous(p.kernel, arrays, n, threads)
        else:
            layout = _layout(p, inputs)
            if layout is None:
                return interpret(program, inputs, prim.stream)
            rc = _call_strided(p.kernel, arrays, layout[0], layout[1], n, threads)
        if rc:
            raise KernelOutputError(f"The fused kernel of {prim!r} failed (code {rc}); its "
                                    f"outputs were discarded.")
    return outs[0] if len(outs) == 1 else tuple(outs)


compiled_kernel.donates = True  # the compiled plan may pass donors


def _donated(inputs, donors, p):
    """The first donated input that can hold the (single) output, or None."""
    if len(p.dtypes) != 1:
        return None
    d = p.dtypes[0]
    for j in donors:
        b = inputs[j]
        if type(b) is _ndarray and b.shape == p.shape and b.dtype == d and b.base is None:
            flags = b.flags
            if flags.c_contiguous and flags.writeable:
                return b
    return None


class _Unplanned:
    """A plan-cache entry saying the native kernel cannot run these shapes."""

    __slots__ = ("program", "kernel")

    def __init__(self, program):
        self.program = program
        self.kernel = None


def _call_contiguous(k: _Kernel, arrays, n, threads) -> int:
    shim = jit.shim()
    if shim is not None:
        return shim.contiguous(k.contiguous, arrays, n, threads)
    fn = k.lib.lazyx_contiguous
    return fn(_pointers(arrays), ctypes.c_int64(n), ctypes.c_int(threads))


def _call_strided(k: _Kernel, arrays, layout: bytes, nd: int, n, threads) -> int:
    shim = jit.shim()
    if shim is not None:
        return shim.strided(k.strided, arrays, layout, nd, n, threads)
    fn = k.lib.lazyx_strided
    buf = ctypes.create_string_buffer(layout, len(layout))
    addr = ctypes.addressof(buf)
    return fn(_pointers(arrays), ctypes.c_void_p(addr), ctypes.c_void_p(addr + 8 * nd),
              ctypes.c_int(nd), ctypes.c_int64(n), ctypes.c_int(threads))


def _pointers(arrays):
    return (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
