"""What the Metal backend's built-in kernels share: a library of MSL source, one
dispatch of one of its functions, the dtype tables, the strided-row layout, and the
MSL helpers every row kernel includes.

A launcher (``reductions.reduce``, ``softmax.softmax``, ...) is
``launcher(primitive, inputs, run) -> output``: it picks the kernel function, plans
the grid and threadgroup sizes, allocates the output (a NumPy array: on a Mac, a view
of a shared ``MTLBuffer``) and binds the buffers in the order of the function's
``[[buffer(n)]]`` parameters, with :mod:`..launch`'s conventions (a scalar constant
is a one-element array, ``constant T&``; shapes are ``int``, strides ``int64_t`` in
elements), then calls ``run(dispatch)`` once per :class:`Dispatch`. The runner is
whoever executes MSL: the GPU runtime on a Mac, :func:`run_on_cpu` (lazyx's C++ shim)
in the tests. :class:`Dispatch` carries a threadgroup size, which ``launch.Launch``
does not have yet; it lives here so that the launch planner stays as it is. The
backend runs dispatches with :func:`lazyx.backends.metal.runtime.dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lazyx import dtypes as ldt
from lazyx.errors import DtypeError

from ..launch import MSL_TYPE_OF, host_array

__all__ = ["Library", "Dispatch", "run_on_cpu", "instantiate", "msl_type", "row_layout",
           "threadgroup_for_rows", "bindable", "host_array", "unsupported", "UnsupportedDtype",
           "PRELUDE", "SIMD_WIDTH", "MAX_THREADGROUP"]

SIMD_WIDTH = 32
MAX_THREADGROUP = 1024


class Library:
    """An MSL source of built-in kernels, compiled as one Metal library.

    Args:
        name: How messages name it (``"reductions"``).
        source: The MSL text (templates, then their explicit instantiations).
    """

    def __init__(self, name: str, source: str):
        self.name = name
        self.source = source
        self.filename = None
        self.label = f"lazyx's built-in Metal kernels ({name})"

    def __repr__(self) -> str:
        return f"<{self.label}>"


@dataclass
class Dispatch:
    """One kernel launch: Metal's ``dispatchThreads(grid, threadgroup)``.

    ``grid`` counts threads per dimension; threadgroups of ``threadgroup`` threads
    tile it. ``buffers[n]`` is bound to ``[[buffer(n)]]``. ``writes`` lists the
    indices of the buffers the kernel writes (read back after a GPU run; the
    built-in kernels write their output, buffer 1). ``threadgroup_memory[n]`` is the
    byte length of a ``[[threadgroup(n)]]`` argument (``setThreadgroupMemoryLength``);
    the built-in kernels declare their threadgroup arrays inside and need none.
    """

    library: Library
    function: str
    buffers: list
    grid: tuple
    threadgroup: tuple
    writes: tuple = (1,)
    threadgroup_memory: tuple = ()


def run_on_cpu(dispatch: Dispatch, schedule: str = "forward") -> None:
    """Run ``dispatch`` through lazyx's MSL shim on the CPU (a launcher's ``run`` in the tests)."""
    from .. import msl_cpu  # the C++ toolchain: only when MSL runs on the CPU
    msl_cpu.dispatch_on_cpu(dispatch.library, dispatch.function, dispatch.buffers,
                            dispatch.grid, dispatch.threadgroup,
                            threadgroup_memory=dispatch.threadgroup_memory, schedule=schedule)


def instantiate(host: str, template: str, *args: str) -> str:
    """The explicit instantiation of kernel template ``template<args...>`` as function ``host``."""
    spec = f"{template}<{', '.join(args)}>"
    return f'template [[host_name("{host}")]] [[kernel]] decltype({spec}) {spec};\n'


def msl_type(dtype) -> str:
    """The MSL type of a lazyx dtype's elements (``float16`` -> ``half``)."""
    return MSL_TYPE_OF[ldt.to_dtype(dtype).name]


class UnsupportedDtype(DtypeError):
    """A launcher was asked for a dtype its kernel has no version for (raised before
    anything runs; the backend then falls back to the CPU explicitly, float64 aside)."""


def unsupported(kernel: str, dtype, supported) -> UnsupportedDtype:
    """The error of a launcher asked for a dtype its kernel has no instantiation for."""
    return UnsupportedDtype(f"Metal kernel {kernel} has no version for dtype "
                            f"{ldt.to_dtype(dtype).name}; it has "
                            f"{', '.join(d.name for d in supported)}. Run the primitive on "
                            f"another backend (the CPU's) for this dtype.")


# -- strided rows ---------------------------------------------------------------------------
def _collapse(shape, *strides):
    """Merge neighbouring dimensions that every stride list walks as one; drop size-1 ones."""
    dims, out = [], [[] for _ in strides]
    for k, n in enumerate(shape):
        if n == 1:
            continue
        if dims and all(s[-1] == st[k] * n for s, st in zip(out, strides)):
            dims[-1] *= n
            for s, st in zip(out, strides):
                s[-1] = st[k]
            continue
        dims.append(n)
        for s, st in zip(out, strides):
            s.append(st[k])
    return dims, out


def bindable(a) -> np.ndarray:
    """``a`` as a NumPy array a kernel can index: copied when a stride is negative or not a
    whole number of elements (as :mod:`..launch` does for ``MetalKernel``)."""
    a = np.asarray(a)
    if any(s < 0 or s % a.itemsize for s in a.strides):
        return host_array(a)
    return a


def row_layout(shape, axes, *arrays):
    """How the row kernels walk ``arrays`` (of ``shape``; NumPy arrays): one row per
    position of the axes not in ``axes``, its elements the positions of ``axes``.

    Returns ``(rows, row_size, buffers)``: ``buffers`` are, for the reduced part then
    for the kept part, the collapsed shape (``int``), each array's strides (``int64_t``,
    elements) and the number of dimensions (``int``) — the order the kernels'
    ``[[buffer(n)]]`` parameters take them in.
    """
    kept = [k for k in range(len(shape)) if k not in axes]
    strides = [[s // a.itemsize for s in a.strides] for a in arrays]
    buffers, counts = [], []
    for part in (list(axes), kept):
        dims, st = _collapse([shape[k] for k in part], *[[s[k] for k in part] for s in strides])
        buffers.append(np.array(dims or [1], np.int32))
        buffers += [np.array(s or [0], np.int64) for s in st]
        buffers.append(np.array([len(dims)], np.int32))
        counts.append(int(np.prod([shape[k] for k in part], dtype=np.int64)))
    return counts[1], counts[0], buffers


def threadgroup_for_rows(row_size: int) -> int:
    """Threads per row: whole simdgroups, enough for one element each up to 1024."""
    return int(min(MAX_THREADGROUP, max(SIMD_WIDTH, -(-row_size // SIMD_WIDTH) * SIMD_WIDTH)))


#: The MSL every row kernel starts with: strided indexing, the reduction operators
#: (NumPy's semantics: a NaN wins max and min) and a threadgroup-wide reduction.
PRELUDE = r"""
#include <metal_stdlib>
using namespace metal;

// The offset of element `index` (C order over `shape`) of a strided view.
inline int64_t elem_to_loc(uint64_t index, constant int* shape, constant int64_t* strides,
                           int ndim) {
  if (ndim == 1) return int64_t(index) * strides[0];
  int64_t loc = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    loc += int64_t(index % uint64_t(shape[d])) * strides[d];
    index /= uint64_t(shape[d]);
  }
  return loc;
}

template <typename U> struct Sum {
  static U init() { return U(0); }
  static U apply(U a, U b) { return a + b; }
  static U simd(U v) { return simd_sum(v); }
};
template <typename U> struct Prod {
  static U init() { return U(1); }
  static U apply(U a, U b) { return a * b; }
  static U simd(U v) { return simd_prod(v); }
};
template <typename U> struct All {
  static U init() { return true; }
  static U apply(U a, U b) { return a && b; }
  static U simd(U v) { return simd_all(v); }
};
template <typename U> struct Any {
  static U init() { return false; }
  static U apply(U a, U b) { return a || b; }
  static U simd(U v) { return simd_any(v); }
};
// Max and Min: a NaN wins (NumPy's max), where Metal's simd_max/fmax let it lose, so the
// simdgroup step is a butterfly of the operator itself over simd_shuffle_xor.
template <typename U> struct Max {
  static U init() {
    return numeric_limits<U>::has_infinity ? U(-numeric_limits<U>::infinity())
                                           : numeric_limits<U>::lowest();
  }
  static U apply(U a, U b) { return (a > b || a != a) ? a : b; }
  static U simd(U v) {
    for (ushort offset = 16; offset > 0; offset /= 2) v = apply(v, simd_shuffle_xor(v, offset));
    return v;
  }
};
template <typename U> struct Min {
  static U init() {
    return numeric_limits<U>::has_infinity ? U(numeric_limits<U>::infinity())
                                           : numeric_limits<U>::max();
  }
  static U apply(U a, U b) { return (a < b || a != a) ? a : b; }
  static U simd(U v) {
    for (ushort offset = 16; offset > 0; offset /= 2) v = apply(v, simd_shuffle_xor(v, offset));
    return v;
  }
};

// Reduce one value per thread over the threadgroup (whole simdgroups, at most 32 of
// them); every thread gets the result. `partial` holds one value per simdgroup.
template <typename U, typename Op>
U threadgroup_reduce(U value, threadgroup U* partial, uint lane, uint simd_group, uint n_simd) {
  value = Op::simd(value);
  if (lane == 0) partial[simd_group] = value;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  value = Op::simd(lane < n_simd ? partial[lane] : Op::init());
  threadgroup_barrier(mem_flags::mem_threadgroup);   // `partial` is free again
  return value;
}
"""


def empty(run, shape, dtype) -> np.ndarray:
    """A kernel's output array for the dispatch function ``run``: its ``empty`` where it has
    one (:func:`lazyx.backends.metal.runtime.dispatch`: a shared ``MTLBuffer`` on the GPU,
    which the kernel writes and the next kernel binds in place, no copy either way), else
    a plain NumPy array (:func:`run_on_cpu`, the shim)."""
    return getattr(run, "empty", np.empty)(shape, dtype)
