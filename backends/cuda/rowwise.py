"""One-kernel softmax and log-sum-exp over trailing axes on the GPU, and column sums.

One thread block per row: a block-wide max (NaN-propagating, as ``np.max``),
a block-wide sum of ``exp(x - max)``, then the outputs, so a row is read
from memory once and re-read from cache. The arithmetic is the CPU kernels'
(``backends/cpu/kernels``): softmax is ``exp(x - m) / sum(exp(x - m))`` with
``m`` the row's maximum; log-sum-exp shifts by the maximum only when it is
finite. float16 and bfloat16 compute in float32, float64 in double.

Other layouts (reduced axes that are not the trailing ones, complex inputs)
run the NumPy kernel on CuPy arrays.

Sums over *leading* axes (a bias's gradient: ``(batch, tokens, n) -> (n,)``; a norm's
weight gradient) are column sums of a ``(rows, n)`` matrix, which CuPy's reduction runs
at a few percent of the memory's bandwidth. :func:`column_sum` runs them in two
passes: fixed chunks of rows summed per column by consecutive threads (coalesced
loads), then the chunks' partial sums per column. The order of the additions is fixed
by the shape alone, so results repeat bit for bit.
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from lazyx.backends.cpu.kernels import products as np_products
from lazyx.backends.cpu.kernels import reductions as np_reductions
from lazyx.dtypes import numpy_name

from .runtime import DTYPE_STRUCT_OF, DTYPE_STRUCTS, CudaKernel

_SOURCE = r"""

__device__ __forceinline__ float lx_exp(float x) { return expf(x); }
__device__ __forceinline__ double lx_exp(double x) { return exp(x); }
__device__ __forceinline__ float lx_log(float x) { return logf(x); }
__device__ __forceinline__ double lx_log(double x) { return log(x); }
__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000ULL); }
__device__ __forceinline__ bool finite(float x) { return isfinite(x); }
__device__ __forceinline__ bool finite(double x) { return isfinite(x); }

// NaN-propagating maximum, as np.max.
template <class C> __device__ __forceinline__ C nan_max(C a, C b) {
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}

// Block-wide reduction; every thread gets the result. `sh` holds 33 values.
template <class C, bool MAX>
__device__ C block_reduce(C v, C* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    C w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? nan_max(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nw = (blockDim.x + 31) >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    C w = lane < nw ? sh[lane] : (MAX ? sh[0] : (C)0);
    for (int o = 16; o > 0; o >>= 1) {
      C u = __shfl_xor_sync(0xffffffffu, w, o);
      w = MAX ? nan_max(w, u) : w + u;
    }
    if (lane == 0) sh[32] = w;
  }
  __syncthreads();
  C r = sh[32];
  __syncthreads();
  return r;
}

template <typename T>
__global__ void softmax_rows(const typename T::S* x, typename T::S* out, long long rows,
                             long long n) {
  typedef typename T::C C;
  __shared__ C sh[33];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename T::S* xr = x + r * n;
    typename T::S* yr = out + r * n;
    C m = neg_inf(C());
    for (long long i = threadIdx.x; i < n; i += blockDim.x) m = nan_max(m, T::load(xr[i]));
    m = block_reduce<C, true>(m, sh);
    C s = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += lx_exp(T::load(xr[i]) - m);
    s = block_reduce<C, false>(s, sh);
    for (long long i = threadIdx.x; i < n; i += blockDim.x)
      yr[i] = T::store(lx_exp(T::load(xr[i]) - m) / s);
  }
}

template <typename T>
__global__ void logsumexp_rows(const typename T::S* x, typename T::S* out, long long rows,
                               long long n) {
  typedef typename T::C C;
  __shared__ C sh[33];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename T::S* xr = x + r * n;
    C m = neg_inf(C());
    for (long long i = threadIdx.x; i < n; i += blockDim.x) m = nan_max(m, T::load(xr[i]));
    m = block_reduce<C, true>(m, sh);
    if (!finite(m)) m = 0;  // no inf - inf: shift only by a finite maximum
    C s = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += lx_exp(T::load(xr[i]) - m);
    s = block_reduce<C, false>(s, sh);
    if (threadIdx.x == 0) out[r] = T::store(lx_log(s) + m);
  }
}

// Column sums of x (rows x n), pass 1: part[c][j] = the sum of column j over the rows of
// chunk c (blockIdx.y), `chunk` rows each; four loads in flight per thread.
template <typename T>
__global__ void column_partials(const typename T::S* x, typename T::C* part, long long rows,
                                long long n, long long chunk) {
  typedef typename T::C C;
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= n) return;
  const long long r0 = blockIdx.y * chunk;
  const long long r1 = min(rows, r0 + chunk);
  C s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  long long r = r0;
  for (; r + 4 <= r1; r += 4) {
    s0 += T::load(x[r * n + j]);
    s1 += T::load(x[(r + 1) * n + j]);
    s2 += T::load(x[(r + 2) * n + j]);
    s3 += T::load(x[(r + 3) * n + j]);
  }
  for (; r < r1; ++r) s0 += T::load(x[r * n + j]);
  part[blockIdx.y * n + j] = (s0 + s1) + (s2 + s3);
}

// Pass 2: out[j] = the sum of the chunks' partial sums of column j, stored as T.
template <typename T>
__global__ void column_finish(const typename T::C* part, typename T::S* out, long long chunks,
                              long long n) {
  typedef typename T::C C;
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n;
       j += (long long)gridDim.x * blockDim.x) {
    C s = 0;
    for (long long c = 0; c < chunks; ++c) s += part[c * n + j];
    out[j] = T::store(s);
  }
}
"""

_TYPES = DTYPE_STRUCT_OF

_KERNEL = CudaKernel(DTYPE_STRUCTS + _SOURCE, "lazyx.backends.cuda.rowwise", name_expressions=[
    f"{k}_rows<{t}>" for k in ("softmax", "logsumexp") for t, _ in _TYPES.values()] + [
    f"column_{k}<{t}>" for k in ("partials", "finish") for t, _ in _TYPES.values()])


def _rows(x, axes):
    """``(rows, n)`` when ``axes`` are exactly the trailing axes of ``x``, else None."""
    nd = x.ndim
    if nd == 0 or x.size == 0:
        return None
    ax = sorted(a % nd for a in axes)
    if ax != list(range(nd - len(ax), nd)):
        return None
    n = math.prod(x.shape[a] for a in ax)
    return x.size // n, n


def _launch(name, tag, xs, out, rows, n):
    block = 256 if n >= 2048 else (128 if n >= 512 else 32)
    grid = min(rows, 1 << 20)
    _KERNEL.function(f"{name}_rows<{tag}>")((grid,), (block,),
                                            (xs, out, np.int64(rows), np.int64(n)))


def softmax(p, ins):
    x = ins[0]
    kind = _TYPES.get(numpy_name(x.dtype))
    shape = _rows(x, p.axes) if kind is not None else None
    if shape is None:
        return np_products._softmax(p, ins)  # runs on CuPy arrays
    tag, view = kind
    x = cp.ascontiguousarray(x)
    out = cp.empty(x.shape, x.dtype)
    _launch("softmax", tag, x if view is None else x.view(view),
            out if view is None else out.view(view), *shape)
    return out


def logsumexp(p, ins):
    x = ins[0]
    kind = _TYPES.get(numpy_name(x.dtype))
    shape = _rows(x, p.axes) if kind is not None else None
    if shape is None:
        return np_reductions._logsumexp(p, ins)
    tag, view = kind
    x = cp.ascontiguousarray(x)
    rows, n = shape
    out = cp.empty((rows,), x.dtype)
    _launch("logsumexp", tag, x if view is None else x.view(view),
            out if view is None else out.view(view), rows, n)
    return out.reshape(p.output_shapes([x])[0])


#: Column sums split their rows into chunks of at least this many rows, and into at most
#: :data:`_CHUNKS` chunks (the partial sums: ``chunks x n`` values of the computing type).
_CHUNK_ROWS, _CHUNKS = 32, 256


def column_sum(x, out_dtype=None):
    """The sums over the rows of the C-contiguous 2-d ``x`` (``(rows, n)``, a float type
    of :data:`_TYPES`): shape ``(n,)``, ``x``'s dtype unless ``out_dtype`` (float32 or
    ``x``'s) is given. float16 and bfloat16 accumulate in float32."""
    rows, n = x.shape
    tag, view = _TYPES[numpy_name(x.dtype)]
    compute = cp.float64 if x.dtype == np.float64 else cp.float32
    out_dtype = np.dtype(out_dtype or x.dtype)
    out = cp.empty((n,), out_dtype)
    if n == 0:
        return out
    if rows == 0:
        out.fill(0)
        return out
    # Enough chunks to fill the GPU (~2^18 threads in flight), each of at least
    # _CHUNK_ROWS rows; a column's chunks are summed in a fixed order.
    chunks = max(1, min(_CHUNKS, rows // _CHUNK_ROWS, -(-(1 << 18) // n)))
    chunk = -(-rows // chunks)
    chunks = -(-rows // chunk)
    part = cp.empty((chunks, n), compute)
    block = 256
    _KERNEL.function(f"column_partials<{tag}>")(
        (-(-n // block), chunks), (block,),
        (x if view is None else x.view(view), part, np.int64(rows), np.int64(n), np.int64(chunk)))
    final_tag, final_view = (tag, view) if out_dtype == x.dtype else ("F32", None)
    _KERNEL.function(f"column_finish<{final_tag}>")(
        (max(1, min(-(-n // block), 4096)),), (block,),
        (part, out if final_view is None else out.view(final_view), np.int64(chunks), np.int64(n)))
    return out


def reduce(p, ins):
    """The ``Reduce`` kernel: sums over leading axes of a contiguous float array as
    :func:`column_sum`; everything else the NumPy kernel on CuPy arrays."""
    x = ins[0]
    if p.op == "sum" and numpy_name(x.dtype) in _TYPES and x.size and x.flags.c_contiguous:
        nd, axes = x.ndim, p.axes
        k = len(axes)
        if 0 < k < nd and sorted(a % nd for a in axes) == list(range(k)):
            rows = math.prod(x.shape[:k])
            n = x.size // rows
            if rows > 1 and n >= 32:
                out = column_sum(x.reshape(rows, n))
                return out.reshape(p.output_shapes([x])[0])
    return np_reductions._reduce(p, ins)
