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
  dtype, C-contiguous, when there is one, each donor serving one output: the loop
  reads all of an element's inputs before it stores that element's outputs, so it may
  overwrite its inputs in place.

What the kernel cannot cover (no compiler, more dimensions than the strided
path takes after merging, odd strides) runs the reference evaluation of
``Compiled.eval_cpu``, so the result is the same either way.

**Single ops** (as the ``cuda`` backend's, :mod:`lazyx.backends.cuda.compiled`). For
a primitive class that declares ``to_expression`` (and has no ``eval_cpu`` of its
own), the ``cpu`` backend's kernel is :func:`eager_kernel`: below
:data:`ELEMENTWISE_MIN_SIZE` elements in every input it is the NumPy kernel, after
one size check; from there the primitive's own expression for the call's parameters
and input dtypes is a one-node program run as above (cached per (parameters,
dtypes), built once, both cores from :data:`PARALLEL_WORK`), so a large ``exp`` or
``add`` runs the code ``compile`` generates instead of NumPy's one-thread loop.
Where the primitive is not expressible for the dtypes, or the layout is one the
kernel does not take, or there is no compiler, the NumPy kernel runs.
``LAZYX_CPU_ELEMENTWISE=0`` makes every single op run it.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from lazyx import dtypes as _dt
from lazyx import log as _log
from lazyx.arguments import broadcast_shapes
from lazyx.codegen import cpp, ir, jit
from lazyx.environment import read_variable
from lazyx.errors import KernelCompileError, KernelOutputError
from lazyx.transforms.fusion import _expression, interpret

from . import native_kernels

#: Work (elements times the program's cost per element, see :func:`_cost`) from which a
#: kernel splits its loop over threads. The threads are the native module's pool, whose
#: helpers spin between back-to-back kernels, so a split costs little more than handing
#: out chunks; what it buys depends on where the inputs are: a product's output, written
#: by both cores, is read at twice the speed by two threads. Measured on 2 cores,
#: interleaved in one process: at ``1 << 19`` (a bias and ReLU on 256 x 512 floats goes
#: parallel; ``x * 2 + 1`` from about 90K elements) the compiled MLP step and the
#: transformer block's step ran 1.4-1.8% faster than at ``1 << 21`` (20-21 of 25 pairs).
PARALLEL_WORK = 1 << 19
# Cost per element of an op beyond the loop's own (loads and stores count 4), relative
# to an add. libmvec's exp, log and sin vectorise well; erfinv runs scalar.
_COST = {"exp": 2, "expm1": 3, "log": 2, "log1p": 3, "log2": 2, "log10": 2, "sin": 3,
         "cos": 3, "tan": 4, "asin": 4, "acos": 4, "atan": 4, "sinh": 4, "cosh": 4,
         "tanh": 3, "asinh": 4, "acosh": 4, "atanh": 4, "erf": 3, "erfinv": 40,
         "sigmoid": 3, "pow": 6, "atan2": 6, "logaddexp": 6, "floordiv": 4, "mod": 4,
         "div": 2, "sqrt": 2, "rsqrt": 2}
_LOOP_COST = 4

#: Whether single element-wise ops on large arrays run generated kernels
#: (``LAZYX_CPU_ELEMENTWISE=0``: never; read once, at import).
ELEMENTWISE = read_variable("LAZYX_CPU_ELEMENTWISE") != "0"  # (checked: 0 or 1)
#: The element count of an input from which a single element-wise op runs its generated
#: kernel rather than NumPy's (see :func:`eager_kernel`; measured crossover, the
#: benchmark is benchmarks/eager_large.py).
ELEMENTWISE_MIN_SIZE = 1 << 16


def set_elementwise(enabled: bool) -> bool:
    """Switch generated single ops on or off from now on (``LAZYX_CPU_ELEMENTWISE`` sets
    it at start-up); returns the previous setting. The dispatch tables are rebuilt."""
    global ELEMENTWISE
    previous, ELEMENTWISE = ELEMENTWISE, bool(enabled)
    from lazyx.backend import invalidate_dispatch  # the kernel tables cache the choice
    invalidate_dispatch()
    return previous


#: Counters for tests and diagnostics: single-op calls that ran a generated kernel
#: (``elementwise``) and large ones that ran the NumPy kernel instead (``fallbacks``).
stats = {"elementwise": 0, "fallbacks": 0}

_empty = np.empty
_ndarray = np.ndarray


class _Kernel:
    """The entry points of one built kernel (see :mod:`lazyx.codegen.cpp`)."""

    __slots__ = ("lib", "contiguous", "strided", "contiguous_range", "strided_range")

    def __init__(self, lib):
        self.lib = lib
        self.contiguous = ctypes.cast(lib.lazyx_contiguous, ctypes.c_void_p).value
        self.strided = ctypes.cast(lib.lazyx_strided, ctypes.c_void_p).value
        self.contiguous_range = ctypes.cast(lib.lazyx_contiguous_range, ctypes.c_void_p).value
        self.strided_range = ctypes.cast(lib.lazyx_strided_range, ctypes.c_void_p).value


class _Plan:
    """What a call at one set of input shapes needs."""

    __slots__ = ("program", "shape", "size", "dtypes", "kernel", "contiguous", "scalar",
                 "parallel", "layouts", "checked", "rows")


_kernels: dict = {}
_plans: dict = {}


def kernel_for(program, scalar: tuple, rows: tuple | None = None) -> _Kernel:
    """The built kernel of ``program`` for the scalar mask ``scalar`` and, for a strided
    path that runs rows, the row mask ``rows`` (see :func:`lazyx.codegen.cpp.render`;
    cached)."""
    key = (program, scalar, rows)
    k = _kernels.get(key)
    if k is None:
        source = cpp.render(program, scalar, jit.vector_math_header(), rows)
        jit.prefetch_shim()  # the kernel's call needs the shim too: both compile at once
        k = _kernels[key] = _Kernel(jit.build(source))
    return k


def _cost(program) -> int:
    return _LOOP_COST + sum(_COST.get(e.op, 1) for e in program.nodes
                            if e.op not in ("input", "const"))


def _plan(program, inputs):
    """The plan for these input shapes, or None when the native kernel cannot run them."""
    if not jit.available():
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
    p.checked = False
    # Inputs that broadcast (a bias): the strided path runs rows of the last dimension,
    # in the layout C-contiguous inputs of these shapes take; the kernel of any other
    # layout is built when one comes (see _layout).
    p.rows = None if p.contiguous is not None else _row_mask(shape, inputs, p.scalar)
    p.kernel = kernel_for(program, p.scalar, p.rows)
    return p


class _CLayout:
    """The shape, strides and item size of a C-contiguous array of ``x``'s shape."""

    __slots__ = ("shape", "ndim", "strides", "itemsize")

    def __init__(self, x):
        self.shape, self.ndim, self.itemsize = x.shape, x.ndim, x.itemsize
        self.strides = _c_strides(x.shape, x.itemsize)


def _row_mask(shape, inputs, scalar):
    """The row mask (:func:`lazyx.codegen.cpp.render`) of C-contiguous ``inputs`` of
    these shapes, or None when one would not read its elements of a row at stride 0
    or 1."""
    got = collapse(shape, [_CLayout(x) for x in inputs], scalar)
    if got is None or not got[0]:
        return None
    return _fitting_rows(got[1], scalar)


def _fitting_rows(strides, scalar):
    """The row mask of a collapsed layout's per-input element ``strides``, or None."""
    mask = []
    for st, sc in zip(strides, scalar):
        inner = 0 if sc else st[-1]
        if inner not in (0, 1):
            return None
        mask.append(not sc and inner == 0)
    return tuple(mask)


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
    """The collapsed loop shape and element strides (bytes for the kernel), and the
    kernel whose strided path runs it, or None."""
    def make(dims, strides):
        kernel = p.kernel
        if p.rows is not None and _fitting_rows(strides, p.scalar) != p.rows:
            kernel = kernel_for(p.program, p.scalar)  # not the rows the plan's kernel runs
        return (np.asarray(dims + [v for s in strides for v in s], dtype=np.int64).tobytes(),
                len(dims), kernel)
    return cached_layout(p, inputs, make)


def _plan_for(program, inputs):
    """The cached plan of ``program`` at these input shapes, or None when the native
    kernel cannot run them."""
    # Plans are found by the program's identity (cheap) and checked against it.
    key = (id(program), tuple([x.shape for x in inputs]))
    p = _plans.get(key)
    if p is None or p.program is not program:
        p = _plan(program, inputs)
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = p if p is not None else _Unplanned(program)
        return p
    return p if p.kernel is not None else None


def _run(p: _Plan, inputs, outs, what):
    """Run plan ``p`` on ``inputs`` into ``outs``; False when the layout is one the kernel
    does not take (nothing was written)."""
    n = p.size
    if n:
        threads = _threads() if p.parallel else 1
        arrays = (*inputs, *outs)
        if runs_contiguous(p.contiguous, inputs):
            rc = _call_contiguous(p.kernel, arrays, n, threads)
        else:
            layout = _layout(p, inputs)
            if layout is None:
                return False
            rc = _call_strided(layout[2], arrays, layout[0], layout[1], n, threads)
        if rc:
            raise KernelOutputError(f"The generated kernel of {what!r} failed (code {rc}); "
                                    f"its outputs were discarded.")
    return True


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
    try:
        p = _plan_for(program, inputs)
    except jit.CompilerFailedError:
        p = None  # the toolchain, not the kernel, fails: warned below, as without one
    if p is None:
        if not jit.available():
            jit.warn_missing_compiler()
        return interpret(program, inputs, prim.stream)
    outs = (_donated(inputs, donors, p) if donors
            else [_empty(p.shape, d) for d in p.dtypes])
    if not _run(p, inputs, outs, prim):
        return interpret(program, inputs, prim.stream)
    return outs[0] if len(outs) == 1 else tuple(outs)


compiled_kernel.donates = True  # the compiled plan may pass donors


def _donated(inputs, donors, p) -> list:
    """The output buffers: for each output, the first donated input that can hold it
    (the loop's shape, the output's dtype, C-contiguous, writeable, owning its memory),
    each donor serving one output (an optimizer's update writes a parameter and its
    moments into their own buffers), else a new buffer."""
    free = [inputs[j] for j in donors]
    outs = []
    for d in p.dtypes:
        got = None
        for k, b in enumerate(free):
            if b is not None and type(b) is _ndarray and b.shape == p.shape and b.dtype == d \
                    and b.base is None:
                flags = b.flags
                if flags.c_contiguous and flags.writeable:
                    got, free[k] = b, None
                    break
        outs.append(_empty(p.shape, d) if got is None else got)
    return outs


class _Unplanned:
    """A plan-cache entry saying the native kernel cannot run these shapes."""

    __slots__ = ("program", "kernel")

    def __init__(self, program):
        self.program = program
        self.kernel = None


def _pooled_shim():
    """The call shim with the native module's thread pool as its runner, or None (no shim,
    or a native module without the pool): the kernels then start threads of their own."""
    global _pool_shim
    if _pool_shim is None:
        shim = jit.shim()
        native = native_kernels.load()
        runner = getattr(native, "parallel_runner", None)
        if shim is None or runner is None or not hasattr(shim, "set_runner"):
            _pool_shim = False
        else:
            shim.set_runner(runner())
            _pool_shim = shim
    return _pool_shim or None


_pool_shim = None


def _call_contiguous(k: _Kernel, arrays, n, threads) -> int:
    shim = _pool_shim or _pooled_shim()
    if shim is not None:
        return shim.range_contiguous(k.contiguous_range, arrays, n, threads)
    shim = jit.shim()
    if shim is not None:
        return shim.contiguous(k.contiguous, arrays, n, threads)
    fn = k.lib.lazyx_contiguous
    return fn(_pointers(arrays), ctypes.c_int64(n), ctypes.c_int(threads))


def _call_strided(k: _Kernel, arrays, layout: bytes, nd: int, n, threads) -> int:
    shim = _pool_shim or _pooled_shim()
    if shim is not None:
        return shim.range_strided(k.strided_range, arrays, layout, nd, n, threads)
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


# -- single ops --------------------------------------------------------------------------
_NONE = object()


def cached_program(programs: dict, prim, inputs, with_params: bool, program_of):
    """The one-node program of a single op for its inputs' dtypes (and, ``with_params``,
    its parameters), made by ``program_of(prim, inputs)`` once and kept in ``programs``;
    None where there is none (or the parameters do not hash). Both backends' single-op
    kernels look their programs up here."""
    key = tuple([x.dtype for x in inputs])
    if with_params:
        key = (prim.params(), key)
    try:
        program = programs.get(key, _NONE)
    except TypeError:  # parameters that do not hash
        return None
    if program is _NONE:
        program = programs[key] = program_of(prim, inputs)
    return program
_broken: set = set()


def compile_failed(broken: set, program, exc, kernel: str, instead: str) -> None:
    """Remember in ``broken`` that ``program``'s generated kernel did not compile (a bug
    in the renderer, or a broken compiler), and warn at the user's line the first time:
    the cause is likely the same for every program. Both backends' generated kernels
    report through here."""
    warn = not broken
    broken.add(program)
    if warn:
        _log.warn(f"The generated {kernel} of an element-wise op did not compile; {instead} "
                  f"(so does any other whose kernel fails). This is a bug in lazyx's code "
                  f"generation, please report it.\n{exc}", RuntimeWarning)


def _compile_failed(program, exc) -> None:
    compile_failed(_broken, program, exc, "C++ kernel", "the op runs its NumPy kernel instead")


def op_program(prim, inputs, identity: bool = True):
    """The one-node program of element-wise primitive ``prim``'s own expression for
    ``inputs``' dtypes, or None where it has none (a dtype lazyx does not know, no
    expression for these parameters; with ``identity`` False, an output that is just an
    input). The single-op kernels of every backend make their programs here."""
    try:
        args = [ir.input(k, _dt.from_numpy(x.dtype)) for k, x in enumerate(inputs)]
    except Exception:  # a dtype lazyx does not know: not expressible
        return None
    es = _expression(prim, args)
    if es is None or (not identity and any(e.op == "input" for e in es)):
        return None
    return ir.Program([a.dtype for a in args], es)


def eager_kernel(cls, fallback):
    """The ``cpu`` kernel of element-wise primitive class ``cls``: ``fallback`` (its NumPy
    kernel) on small inputs, and a generated kernel of the primitive's own expression
    from :data:`ELEMENTWISE_MIN_SIZE` elements in an input (see the module docstring).

    The size check reads the inputs' sizes only, the one cost added to a small op: an
    outer broadcast of small inputs (``a[:, None] + b``) runs ``fallback`` whatever
    the size of its result.
    """
    programs: dict = {}
    with_params = bool(cls._param_names)
    limit = ELEMENTWISE_MIN_SIZE

    def program_of(prim, inputs):
        # An output that is an input (stop_gradient, a cast to the same dtype) is the
        # NumPy kernel's view or copy: nothing to compute.
        return op_program(prim, inputs, identity=False)

    def generated(prim, inputs):
        for x in inputs:
            if type(x) is not _ndarray:
                return fallback(prim, inputs)
        program = cached_program(programs, prim, inputs, with_params, program_of)
        if program is not None and program not in _broken:
            try:
                p = _plan_for(program, inputs)
            except jit.CompilerFailedError:
                jit.warn_missing_compiler()  # the toolchain fails, not this kernel
                p = None
            except KernelCompileError as exc:
                _compile_failed(program, exc)
                p = None
            if p is not None:
                if not p.checked:  # first call at these shapes: the primitive's own rule
                    p.checked = True
                    try:
                        ok = tuple(prim.output_shapes(inputs)[0]) == p.shape
                    except Exception:
                        ok = False
                    if not ok:
                        p.kernel = None  # the plan cache then says: not this way
                if p.kernel is not None:
                    outs = [_empty(p.shape, d) for d in p.dtypes]
                    if _run(p, inputs, outs, prim):
                        stats["elementwise"] += 1
                        return outs[0] if len(outs) == 1 else tuple(outs)
        stats["fallbacks"] += 1
        return fallback(prim, inputs)

    # One size check in front of the NumPy kernel, written per arity (no loop); a kernel
    # that is one ufunc call (backends/cpu/kernels/elementwise.py) is called inline, so
    # that a small op runs as many Python frames as without this kernel.
    arity = getattr(cls, "arity", None)
    ufunc = getattr(fallback, "ufunc", None)
    if arity == 1 and ufunc is not None:
        def kernel(prim, inputs):
            x = inputs[0]
            if x.size < limit:
                return ufunc(x)
            return generated(prim, inputs)
    elif arity == 2 and ufunc is not None:
        def kernel(prim, inputs):
            a, b = inputs
            if a.size < limit and b.size < limit:
                return ufunc(a, b)
            return generated(prim, inputs)
    elif arity == 1:
        def kernel(prim, inputs):
            if inputs[0].size < limit:
                return fallback(prim, inputs)
            return generated(prim, inputs)
    elif arity == 2:
        def kernel(prim, inputs):
            if inputs[0].size < limit and inputs[1].size < limit:
                return fallback(prim, inputs)
            return generated(prim, inputs)
    else:
        def kernel(prim, inputs):
            for x in inputs:
                if x.size >= limit:
                    return generated(prim, inputs)
            return fallback(prim, inputs)

    kernel.generated = True
    kernel.fallback = fallback
    if arity in (1, 2) and ufunc is not None:
        # The scheduler's native loop calls the ufunc itself below the limit (no frame
        # of this function; see Backend's "small_ufunc" in lazyx.backend).
        kernel.small_ufunc = ufunc
        kernel.small_limit = limit
        native = native_kernels.load()
        small = native.small_kernel(cls.name) if native is not None and \
            cls.__module__ == "lazyx.plugins.elementwise" else None
        if small is not None:  # the same arithmetic without the ufunc's dispatch
            kernel.small_native = small
    kernel.__name__ = f"cpu_elementwise_{cls.name}"
    return kernel
