"""CuPy kernels of the CUDA backend, for the primitives whose NumPy kernels
cannot run on CuPy arrays as written (they create host arrays, or loop in
Python). Everything else runs its NumPy kernel on CuPy arrays (see the
package docstring).

Each kernel returns exactly the shape and dtype the NumPy kernel returns; the
GPU tests compare the two backends element for element.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

import ml_dtypes

from lazyx.plugins import creation as cr
from lazyx.plugins import elementwise as ew
from lazyx.plugins import indexing as ix
from lazyx.plugins import products as pr
from lazyx.plugins import random as rd
from lazyx.plugins import reductions as red
from lazyx.plugins import shapes as sh
from lazyx.plugins import sorting as so

from lazyx.backends.cpu.kernels import creation as np_creation
from lazyx.backends.cpu.kernels.common import bf16_as_float32, bool_as_uint8
from lazyx.backends.cpu.kernels import indexing as np_indexing
from lazyx.backends.cpu.kernels import random as np_random
from lazyx.backends.cpu.kernels import reductions as np_reductions
from lazyx.backends.cpu.kernels import shapes as np_shapes
from lazyx.backends.cpu.kernels import sorting as np_sorting

from lazyx.transforms.fusion import Compiled

from . import gemm as _gemm
from . import runtime as _rt
from .runtime import CudaKernel, launch_config
from . import rowwise
from .compiled import compiled_kernel


# -- creation ----------------------------------------------------------------------
def _fill(p, ins):
    if p.value == 0:
        return cp.zeros(p.shape, p.dtype.np)
    return cp.full(p.shape, p.value, p.dtype.np)


def _arange(p, ins):
    n = p.output_shapes(())[0][0]
    d = p.dtype
    if d.kind in "iu" and p.start == int(p.start) and p.step == int(p.step):
        start, step = int(p.start), int(p.step)
        info = np.iinfo(d.np)
        if (step > 0 or d.kind == "i") and info.min <= min(start, start + (n - 1) * step) and \
                max(start, start + (n - 1) * step) <= info.max:
            return cp.arange(start, start + n * step, step, dtype=d.np)  # exact: no wrap
    if d.kind in "iu":
        i = cp.arange(n, dtype=cp.int64)
        return (int(p.start) + i * int(p.step)).astype(d.np)
    return (p.start + cp.arange(n, dtype=cp.float64) * p.step).astype(d.np)


def _from_parameters(host_kernel):
    """Linspace and the windows are functions of their parameters alone: they are
    computed by the NumPy kernel (so the bits, truncation to integers included, are
    the CPU's) and copied to the device."""
    return lambda p, ins: cp.asarray(host_kernel(p, ins))


# -- random bits: Threefry-2x32 (20 rounds), the counters of the NumPy kernel ------
_THREEFRY = CudaKernel(r"""
__device__ __forceinline__ unsigned int rotl(unsigned int x, int r) {
    return (x << r) | (x >> (32 - r));
}
extern "C" __global__ void random_bits(const unsigned int* keys, unsigned int* words,
                                       long long nkeys, long long nwords, long long half) {
    const int R0[4] = {13, 15, 26, 6};
    const int R1[4] = {17, 29, 16, 24};
    long long total = nkeys * half;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / half, c = t - b * half;
        unsigned int k0 = keys[2 * b], k1 = keys[2 * b + 1];
        unsigned int ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
        unsigned int x0 = (unsigned int)c + k0;
        unsigned int x1 = ((c == half - 1 && (nwords & 1)) ? 0u : (unsigned int)(c + half)) + k1;
        for (int i = 0; i < 5; ++i) {
            const int* R = (i & 1) ? R1 : R0;
            for (int j = 0; j < 4; ++j) { x0 += x1; x1 = rotl(x1, R[j]); x1 ^= x0; }
            x0 += ks[(i + 1) % 3];
            x1 += ks[(i + 2) % 3] + (unsigned int)(i + 1);
        }
        words[b * nwords + c] = x0;
        if (c + half < nwords) words[b * nwords + c + half] = x1;
    }
}
""", "lazyx.backends.cuda.kernels (threefry)")


def _random_bits(p, ins):
    keys = cp.ascontiguousarray(ins[0])
    batch = keys.shape[:-1]
    keys = keys.reshape(-1, 2)
    nbytes, nwords, half = np_random.bit_counts(p)
    words = cp.empty((keys.shape[0], nwords), cp.uint32)
    if words.size:
        grid, block = launch_config(keys.shape[0] * half)
        _THREEFRY.function("random_bits")(
            grid, block, (keys, words, np.int64(keys.shape[0]), np.int64(nwords), np.int64(half)))
    return np_random.words_to_bits(p, words, batch, nbytes)


def _matrix_sqrt(p, ins):
    c = ins[0]
    if c.size == 0:
        return cp.zeros(c.shape, c.dtype)
    u, s, vt = cp.linalg.svd(c.astype(cp.float64))
    return cp.matmul(u * cp.sqrt(s)[..., None, :], vt).astype(c.dtype)



_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_HALVES = (np.dtype(np.float16), _BF16)
_BOOL = np.dtype(np.bool_)
_U32 = np.dtype(np.uint32)


def _floating(d) -> bool:
    return d.kind in "fc" or d == _BF16  # ml_dtypes' bfloat16 has kind "V"


def _astype(p, ins):
    x = ins[0]
    to = p.dtype.np
    if x.dtype.kind == "c" and to.kind != "c":
        x = x.real
    if to.kind in "iu" and _floating(x.dtype):
        # NumPy (and the CPU backends) convert through int64, so -3.0 wraps to 2**bits - 3
        # and 300.0 to 44 in int8; a CUDA conversion would saturate them.
        if x.dtype == _BF16:
            x = x.astype(_F32)
        if to.kind == "i" and to.itemsize == 8:
            return x.astype(to)
        if to.itemsize == 8:
            big = x >= 2.0 ** 63
            return cp.where(big, x.astype(to), x.astype(cp.int64).astype(to))
        return x.astype(cp.int64).astype(to)
    return x.astype(to, copy=False)


def _as_bool(x):
    return x if x.dtype == _BOOL else x != 0


# -- element-wise ------------------------------------------------------------------
def _special(name):
    def kernel(p, ins):
        from cupyx.scipy import special
        x = ins[0]
        return getattr(special, name)(x.astype(np.float64)).astype(x.dtype)
    return kernel


def _is_inf(sign):
    def kernel(p, ins):
        x = ins[0]
        if x.dtype.kind in "biu":
            return cp.zeros(x.shape, _BOOL)
        return x == sign * np.inf
    return kernel


def _nan_to_num(p, ins):
    x = ins[0]
    out = x.copy()
    if _floating(x.dtype):
        for value, mask in ((p.nan, cp.isnan(x)), (p.posinf, x == np.inf),
                            (p.neginf, x == -np.inf)):
            cp.copyto(out, cp.asarray(value).astype(x.dtype), where=mask)
    return out


def _floor_divide(p, ins):
    x, y = ins
    if x.dtype.kind == "c":
        return cp.divide(x, y)
    if x.dtype.kind in "iu":
        q = cp.floor_divide(x, y)
        return cp.where(y == 0, 0, q).astype(x.dtype)  # MLX: x // 0 == 0 for integers
    return cp.floor_divide(x, y)


def _remainder_of(x, y):
    r = cp.remainder(x, y)
    if x.dtype.kind in "iu":
        r = cp.where(y == 0, x, r).astype(x.dtype)  # MLX: x % 0 == x for integers
    return r


def _divmod(p, ins):
    x, y = ins
    return _floor_divide(p, ins), _remainder_of(x, y)


def _power(p, ins):
    x, y = ins
    if x.dtype.kind == "i":
        neg = y < 0
        return cp.where(neg, 0, cp.power(x, cp.where(neg, 0, y))).astype(x.dtype)
    return cp.power(x, y)


def _isclose(p, ins):
    return cp.isclose(ins[0], ins[1], rtol=p.rtol, atol=p.atol, equal_nan=p.equal_nan)


def _allclose(p, ins):
    return cp.all(_isclose(p, ins)).reshape(())


def _array_equal(p, ins):
    x, y = ins
    if x.shape != y.shape:
        return cp.asarray(False)
    eq = x == y
    if p.equal_nan and _floating(x.dtype):
        eq |= cp.isnan(x) & cp.isnan(y)
    return cp.all(eq).reshape(())


def _select(p, ins):
    c, x, y = ins
    return cp.where(c, x, y).astype(x.dtype, copy=False)


# -- products ------------------------------------------------------------------------
def _matmul_of(a, b):
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        # One matrix for every row of a batch (a Linear layer on sequences): one GEMM over
        # the rows, not a batched GEMM of the batch's slices against the same matrix.
        lead = a.shape[:-1]
        return _matmul_of(a.reshape(-1, a.shape[-1]), b).reshape(lead + b.shape[-1:])
    if _gemm.capturing or _gemm.native() is not None:
        # cuBLAS directly: CuPy refuses cuBLAS calls under capture, and from C++ (the native
        # module) a product costs a few µs of host time where cupy.matmul costs ~30.
        out = _gemm.matmul(a, b)
        if out is not None:
            return out
    try:
        return cp.matmul(a, b)
    except (TypeError, ValueError, NotImplementedError):
        if a.dtype not in _HALVES:
            raise
        return cp.matmul(a.astype(_F32), b.astype(_F32)).astype(a.dtype)


def _matmul(p, ins):
    return _matmul_of(ins[0], ins[1])


# out = alpha * out + beta * c in place, c a row repeated over out's rows (a bias) or out's
# shape, both C-contiguous: one launch where CuPy's broadcast add costs several.
_BIAS_SOURCE = r"""
template <typename T>
__global__ void lx_add_rows(typename T::S* __restrict__ out, const typename T::S* __restrict__ c,
                            long long total, long long cn, double alpha, double beta) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    typename T::C v = T::load(out[i]);
    if (alpha != 1.0) v = v * (typename T::C)alpha;
    out[i] = T::store(v + (typename T::C)beta * T::load(c[i % cn]));
  }
}
"""
_BIAS = CudaKernel(_rt.DTYPE_STRUCTS + _BIAS_SOURCE, "lazyx.backends.cuda.kernels add_rows",
                   name_expressions=tuple(f"lx_add_rows<{t}>" for t, _ in
                                          _rt.DTYPE_STRUCT_OF.values()))


def _add_rows(out, c, alpha, beta) -> bool:
    """``out = alpha * out + beta * c`` in place where one kernel can (see above)."""
    types = _rt.DTYPE_STRUCT_OF.get(out.dtype.name)
    if types is None or c.dtype != out.dtype or not out.size or not c.size or \
            not (out.flags.c_contiguous and c.flags.c_contiguous) or \
            (c.size != out.size and (c.ndim > 1 and c.shape[:-1] != (1,) * (c.ndim - 1)
                                     or c.shape[-1:] != out.shape[-1:])):
        return False
    tag, view = types
    grid, block = launch_config(out.size)
    _BIAS.function(f"lx_add_rows<{tag}>")(grid, block, (
        out if view is None else out.view(view), c if view is None else c.view(view),
        np.int64(out.size), np.int64(c.size), np.float64(alpha), np.float64(beta)))
    return True


def _addmm(p, ins):
    c, a, b = ins
    d = a.dtype
    out = _matmul_of(a, b)
    if p.beta != 0.0 and out.shape == tuple(np.broadcast_shapes(out.shape, c.shape)) and \
            _add_rows(out, c, p.alpha, p.beta):
        return out
    if out.dtype in _HALVES:
        out = out.astype(_F32)
    if p.alpha != 1.0:
        out *= p.alpha
    if p.beta != 0.0:  # beta == 0 ignores c (its NaNs do not leak), as gemm does
        out = out + (c.astype(out.dtype) if p.beta == 1.0 else p.beta * c.astype(out.dtype))
    return out.astype(d, copy=False)


# -- reductions ------------------------------------------------------------------------
def _arg_reduce(p, ins):
    x = ins[0]
    if x.dtype == _BF16:
        x = x.astype(_F32)
    r = (cp.argmax if p.op == "argmax" else cp.argmin)(x, axis=p.axis)
    return r.astype(_U32).reshape(p.output_shapes([_Shaped(ins[0].shape)])[0])


class _Shaped:
    """Stands for an input in ``output_shapes`` (which reads ``.shape`` only)."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)


def _median(p, ins):
    x = ins[0]
    d = x.dtype
    if d in _HALVES:
        x = x.astype(_F32)
    axes = tuple(a % x.ndim for a in p.axes) if x.ndim else ()
    rest = [a for a in range(x.ndim) if a not in axes]
    moved = x.transpose(rest + list(axes)).reshape(tuple(x.shape[a] for a in rest) + (-1,))
    r = cp.median(moved, axis=-1)
    return r.reshape(p.output_shapes([_Shaped(ins[0].shape)])[0]).astype(d, copy=False)


def _doubling_scan(op, x, axis):
    """An inclusive scan by an associative element-wise ``op`` in log2(n) passes
    (CuPy has accumulate for add and multiply only)."""
    r = x.copy()
    n = r.shape[axis]
    head = (slice(None),) * axis
    step = 1
    while step < n:
        # r[i] = op(r[i - step], r[i]) for i >= step, from the previous pass's values
        r[head + (slice(step, None),)] = op(r[head + (slice(0, n - step),)],
                                            r[head + (slice(step, None),)])
        step *= 2
    return r


def _cumsum(x, axis):
    d = x.dtype
    if d in _HALVES:
        return cp.cumsum(x.astype(_F32), axis=axis).astype(d)
    return cp.cumsum(x, axis=axis, dtype=np_reductions._SUM_NP.get(d, d)).astype(d, copy=False)


def _cumprod(x, axis):
    d = x.dtype
    if d.kind == "b":
        return _doubling_scan(cp.logical_and, x, axis)
    if d in _HALVES:
        return cp.cumprod(x.astype(_F32), axis=axis).astype(d)
    return cp.cumprod(x, axis=axis, dtype=d)


def _logcumsumexp(x, axis):
    d = x.dtype
    if d in _HALVES:
        x = x.astype(_F32)
    if x.dtype.kind == "c":
        m = x.real.max(axis=axis, keepdims=True)
        m = cp.where(cp.isfinite(m), m, 0).astype(m.dtype)
        r = cp.log(cp.cumsum(cp.exp(x - m), axis=axis)) + m
    else:
        r = _doubling_scan(cp.logaddexp, x, axis)
    return r.astype(d, copy=False)


def _minmax_scan(op):
    def scan(x, axis):
        if x.dtype == _BF16:
            return _doubling_scan(op, x.astype(_F32), axis).astype(_BF16)
        return _doubling_scan(op, x, axis)
    return scan


_SCANS = {"sum": _cumsum, "prod": _cumprod, "max": _minmax_scan(cp.maximum),
          "min": _minmax_scan(cp.minimum), "logaddexp": _logcumsumexp}


_scan_views = np_reductions.scan_kernel(_SCANS)


def _scan(p, ins):
    return cp.ascontiguousarray(_scan_views(p, ins))


# -- shapes ---------------------------------------------------------------------------------
def _host_input(fn, *positions):
    """Run NumPy kernel ``fn`` with the inputs at ``positions`` (a few start indices,
    read to decide which block to take) copied to the host; the data stays on the device."""
    def kernel(p, ins):
        ins = list(ins)
        _rt.host_sync(f"{p.name}: reads its start indices")
        for i in positions:
            ins[i] = ins[i].get()
        return fn(p, ins)
    return kernel


_as_strided = np_shapes.as_strided_kernel(
    lambda a, shape, strides: cp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides))


def _view(p, ins):
    x = ins[0]
    return (x if x.ndim == 0 else cp.ascontiguousarray(x)).view(p.dtype.np)


def _contiguous(p, ins):
    x = ins[0]
    if p.allow_col_major and x.flags.f_contiguous:
        return x
    return cp.ascontiguousarray(x)


# -- indexing: CuPy wraps out-of-range indices silently, so they are checked first ----
def _dummy(shape):
    """A zero-stride host array of ``shape``: indexing it checks bounds for free."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape,
                                           strides=(0,) * len(shape))


class _Shapes:
    """What an index error's message reads of the inputs (their shapes), without
    keeping their device buffers alive until the check runs."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = shape


# -- index bounds: checked without making the host wait ---------------------------------
# CuPy wraps an out-of-range index silently. lazyx checks every index array's extremes:
# a min and a max per array are computed on the device (a few small kernels) and queued
# with a host-side check; the checks run, all together and after one transfer, the next
# time a value is read to the host or the GPU is synchronised (flush_index_checks, called
# by the backend there), and raise the op's IndexOutOfRangeError then. So indexing never
# stalls the GPU queue (a training step stays asynchronous; a compiled call stays one
# CUDA graph: backends/cuda/graphs.py re-queues the checks a replay computed), and a bad
# index is still never silent: it is reported at the first value read after it.
_pending: list = []      # (check(host extremes), device extremes (k, 2) int64)
#: Checks queued before they are run anyway (one synchronisation per this many).
MAX_PENDING = 256


def _defer(check, ext) -> None:
    _pending.append((check, ext))
    if len(_pending) >= MAX_PENDING:
        flush_index_checks()


def flush_index_checks() -> None:
    """Run the queued index checks (one transfer); raise the first failure."""
    if not _pending:
        return
    items = _pending[:]
    _pending.clear()
    _rt.host_sync("index bounds checks")
    host = cp.concatenate([e.reshape(-1) for _, e in items]).get()
    off = 0
    for check, e in items:
        vals = host[off:off + e.size].reshape(e.shape)
        off += e.size
        check(vals)


def pending_checks() -> list:
    """The queued checks (for a CUDA graph's capture: they are re-queued per replay)."""
    return _pending


def _extremes(live):
    """A (k, 2) int64 device array: the min and max of each non-empty integer array."""
    return cp.stack([cp.stack([a.min().astype(cp.int64), a.max().astype(cp.int64)])
                     for a in live])


def _check_key(p, ins, key):
    live = [k for k in key if isinstance(k, cp.ndarray) and k.dtype.kind in "iu" and k.size]
    if not live:
        return
    shape = ins[0].shape
    where = {id(a): i for i, a in enumerate(live)}
    # The key for the probe, without device buffers: ("at", i) stands for live[i].
    spec = tuple(("at", where[id(k)]) if id(k) in where else
                 (np.zeros(0, np.int64) if isinstance(k, cp.ndarray) and k.dtype.kind in "iu"
                  else (k.get() if isinstance(k, cp.ndarray) else k)) for k in key)
    shapes = [_Shapes(x.shape) for x in ins]

    def check(ext):
        for pick in (0, 1):
            probe = tuple(np.asarray([ext[k[1]][pick]]) if type(k) is tuple and k[:1] == ("at",)
                          else k for k in spec)
            try:
                _dummy(shape)[probe]
            except IndexError as e:
                raise np_indexing._out_of_range(p, shapes, e) from None
    _defer(check, _extremes(live))


def _check_axis(p, ins, idx, n):
    if not idx.size:
        return
    shapes = [_Shapes(x.shape) for x in ins]

    def check(ext):
        lo, hi = ext[0]
        if lo < -n or hi >= n:
            raise _axis_error(p, shapes, lo if lo < -n else hi, n)
    _defer(check, _extremes([idx]))


def _axis_error(p, shapes, bad, n):
    """The error of index ``bad`` along ``p.axis`` (of size ``n``)."""
    return np_indexing._out_of_range(
        p, shapes, f"index {bad} is out of bounds for axis {p.axis} with size {n}")


def _gather(p, ins):
    x = ins[0]
    key = np_indexing._key(p, ins)
    _check_key(p, ins, key)
    ax = p._take_axis
    if ax >= 0 and p._take_rest == x.shape[:ax] + x.shape[ax + 1:]:
        return cp.take(x, ins[1], axis=ax)
    return x[key]


def _last(a, b):
    return b


def _scatter_into(out, key, values, reduce):
    """``out[key] (reduce)= values`` with repeated positions combined, in place; for an
    assignment the last update of a position wins, as on the CPU (a plain CuPy
    assignment leaves the winner to the hardware)."""
    if reduce is None and not any(isinstance(k, cp.ndarray) for k in key):
        out[key] = values  # slices and integers: no position repeats
        return
    target_shape = out[key].shape
    values = cp.broadcast_to(cp.asarray(values, dtype=out.dtype), target_shape).reshape(-1)
    pos = cp.arange(out.size, dtype=cp.int64).reshape(out.shape)[key].reshape(-1)
    flat = out.reshape(-1)
    if reduce == "add" and out.dtype in (_F32, np.dtype(np.float64), np.dtype(np.int32),
                                         np.dtype(np.uint32), np.dtype(np.uint64)):
        import cupyx
        cupyx.scatter_add(flat, pos, values)  # atomics
        return
    op = {"add": cp.add, "prod": cp.multiply, "max": cp.maximum, "min": cp.minimum,
          None: _last}[reduce]
    _segmented_at(op, flat, pos, values)


def _segmented_at(op, flat, pos, values):
    """``flat[pos] = op(flat[pos], values)`` with repeated positions combined by ``op``:
    the updates are sorted by position (stable) and each run of equal positions is
    reduced by a segmented doubling scan; any dtype, any associative op."""
    if pos.size == 0:
        return
    order = cp.argsort(pos, kind="stable")
    pos, acc = pos[order], values[order]
    starts = cp.concatenate([cp.ones(1, cp.bool_), pos[1:] != pos[:-1]])
    seg = cp.cumsum(starts)
    n = acc.size
    step = 1 if op is not _last else n  # the last of a run needs no scan
    while step < n:
        same = seg[step:] == seg[:-step]
        acc[step:] = cp.where(same, op(acc[:-step], acc[step:]), acc[step:])
        step *= 2
    last = cp.concatenate([starts[1:], cp.ones(1, cp.bool_)])
    where = pos[last]
    flat[where] = op(flat[where], acc[last])


def _scatter(p, ins):
    x = ins[0]
    out = x.copy()
    key = np_indexing._key(p, ins)
    _check_key(p, ins, key)
    _scatter_into(out, key, ins[1], p.reduce)
    return out


def _slice_update(p, ins):
    out = ins[0].copy()
    out[p._key] = ins[1]
    return out


# take_along_axis on C-contiguous inputs whose shapes agree off the axis: one launch that
# reads each index, wraps a negative one, and records an out-of-range one (flag, value) in
# a device pair the deferred check reads (an out-of-range position gives 0 meanwhile).
_GATHER_SOURCE = r"""
template <typename T, typename I>
__global__ void lx_gather_axis(const T* __restrict__ x, const I* __restrict__ idx,
                               T* __restrict__ out, long long total, long long n,
                               long long k, long long post, long long* bad) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long p = i % post, r = i / post, q = r / k;
    long long v = (long long)idx[i];
    if (v < 0 && (I)(-1) < (I)0) v += n;  // a signed index counts from the end
    if (v < 0 || v >= n) {
      bad[1] = (long long)idx[i];
      bad[0] = 1;
      out[i] = T(0);
    } else {
      out[i] = x[(q * n + v) * post + p];
    }
  }
}
"""
_GATHER_ITEMS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int",
                 8: "unsigned long long"}
_GATHER_INDEX = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
                 "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
                 "uint64": "unsigned long long"}
_GATHER_NAMES = tuple(f"lx_gather_axis<{t}, {i}>" for t in _GATHER_ITEMS.values()
                      for i in _GATHER_INDEX.values())
_GATHER = CudaKernel(_GATHER_SOURCE, "lazyx.backends.cuda.kernels gather_axis",
                     name_expressions=_GATHER_NAMES)


def _gather_axis(p, ins):
    x, idx = ins
    ax = p.axis % x.ndim if x.ndim else 0
    n = x.shape[ax]
    item = _GATHER_ITEMS.get(x.itemsize)
    index = _GATHER_INDEX.get(idx.dtype.name)
    if item is not None and index is not None and idx.ndim == x.ndim and idx.size and n and \
            idx.shape[:ax] == x.shape[:ax] and idx.shape[ax + 1:] == x.shape[ax + 1:] and \
            x.flags.c_contiguous and idx.flags.c_contiguous:
        out = cp.empty(idx.shape, x.dtype)
        bad = cp.zeros(2, cp.int64)
        post = 1
        for d in x.shape[ax + 1:]:
            post *= d
        grid, block = launch_config(idx.size)
        _GATHER.function(f"lx_gather_axis<{item}, {index}>")(
            grid, block, (x, idx, out, np.int64(idx.size), np.int64(n), np.int64(idx.shape[ax]),
                          np.int64(post), bad))
        shapes = [_Shapes(a.shape) for a in ins]

        def check(flag):
            if flag[0]:
                raise _axis_error(p, shapes, flag[1], n)
        _defer(check, bad)
        return out
    _check_axis(p, ins, idx, n)
    return cp.take_along_axis(x, idx, axis=p.axis)


def _scatter_axis(p, ins):
    x, idx, v = ins
    nd = x.ndim
    vs = (1,) * (nd - v.ndim) + v.shape
    ax = p.axis
    _check_axis(p, ins, idx, x.shape[ax])
    full = x.shape[:ax] + np.broadcast_shapes((idx.shape[ax],), (vs[ax],)) + x.shape[ax + 1:]
    idx = cp.broadcast_to(idx, full).astype(cp.int64)
    idx = cp.where(idx < 0, idx + x.shape[ax], idx)
    v = cp.broadcast_to(v, full)
    # The positions along every other axis are their own coordinates.
    grids = list(cp.indices(full, dtype=cp.int64))
    grids[ax] = idx
    out = x.copy()
    pos = cp.ravel_multi_index(tuple(grids), x.shape).reshape(-1)
    _segmented_at(_last, out.reshape(-1), pos, cp.ascontiguousarray(v).reshape(-1))
    return out


# -- sorting ----------------------------------------------------------------------------------
def _searchsorted(p, ins):
    return cp.searchsorted(ins[0], ins[1], side=p.side).astype(_U32)


KERNELS = {
    Compiled: compiled_kernel,  # compile's fused element-wise runs: generated CUDA C++
    cr.Fill: _fill,
    cr.Arange: _arange,
    cr.Linspace: _from_parameters(np_creation._linspace),
    cr.Eye: lambda p, ins: cp.eye(p.n, p.m, p.k, dtype=p.dtype.np),
    cr.Tri: lambda p, ins: cp.tri(p.n, p.m, p.k, dtype=p.dtype.np),
    cr.Window: _from_parameters(np_creation._window),
    rd.RandomBits: _random_bits,
    rd.MatrixSqrt: _matrix_sqrt,
    ew.AsType: _astype,
    ew.Erf: _special("erf"),
    ew.ErfInv: _special("erfinv"),
    ew.IsPosInf: _is_inf(1),
    ew.IsNegInf: _is_inf(-1),
    ew.NanToNum: _nan_to_num,
    ew.FloorDivide: bool_as_uint8(bf16_as_float32(_floor_divide)),
    ew.Remainder: bool_as_uint8(bf16_as_float32(lambda p, ins: _remainder_of(*ins))),
    ew.DivMod: bool_as_uint8(bf16_as_float32(_divmod)),
    ew.Power: bool_as_uint8(_power),
    ew.LogicalNot: lambda p, ins: cp.logical_not(_as_bool(ins[0])),
    ew.LogicalAnd: lambda p, ins: cp.logical_and(_as_bool(ins[0]), _as_bool(ins[1])),
    ew.LogicalOr: lambda p, ins: cp.logical_or(_as_bool(ins[0]), _as_bool(ins[1])),
    ew.LogicalXor: lambda p, ins: cp.logical_xor(_as_bool(ins[0]), _as_bool(ins[1])),
    ew.IsClose: bf16_as_float32(_isclose),
    ew.AllClose: bf16_as_float32(_allclose),
    ew.ArrayEqual: _array_equal,
    ew.Select: _select,
    pr.Matmul: _matmul,
    pr.AddMM: _addmm,
    pr.Softmax: rowwise.softmax,
    red.LogSumExp: rowwise.logsumexp,
    red.Reduce: rowwise.reduce,
    red.ArgReduce: _arg_reduce,
    red.Median: _median,
    # The count is made on the host from the input's shape, then copied over.
    red.NumberOfElements: lambda p, ins: cp.asarray(np_reductions._number_of_elements(p, ins)),
    red.Scan: _scan,
    sh.Pad: np_shapes._pad,  # written with np.empty_like: runs on CuPy arrays
    sh.DynamicSlice: _host_input(np_shapes._dynamic_slice, 1),
    sh.DynamicSliceUpdate: _host_input(np_shapes._dynamic_slice_update, 2),
    sh.AsStrided: _as_strided,
    sh.View: _view,
    sh.Contiguous: _contiguous,
    ix.Gather: _gather,
    ix.Scatter: _scatter,
    ix.SliceUpdate: _slice_update,
    ix.GatherAxis: _gather_axis,
    ix.ScatterAxis: _scatter_axis,
    # np.sort and np.partition dispatch to CuPy; the NumPy kernels already sort bfloat16
    # as float32.
    so.Sort: np_sorting.KERNELS[so.Sort],
    so.ArgSort: bf16_as_float32(lambda p, ins: cp.argsort(ins[0], axis=p.axis,
                                                           kind="stable").astype(_U32)),
    so.Partition: np_sorting.KERNELS[so.Partition],
    so.ArgPartition: bf16_as_float32(
        lambda p, ins: cp.argpartition(ins[0], p.kth, axis=p.axis).astype(_U32)),
    so.TopK: np_sorting.KERNELS[so.TopK],
    so.SearchSorted: bf16_as_float32(_searchsorted),
}

from . import fft as _fft  # noqa: E402 - each op pack's CuPy kernels live in its own module
KERNELS.update(_fft.KERNELS)
from . import linalg as _linalg  # noqa: E402
KERNELS.update(_linalg.KERNELS)
from . import conv as _conv, fast as _fast, matmuls as _matmuls, quantized as _quantized  # noqa: E402
for _pack in (_conv, _fast, _matmuls, _quantized):
    KERNELS.update(_pack.KERNELS)
