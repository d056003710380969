"""One-kernel softmax and log-sum-exp over trailing axes on the GPU.

One thread block per row: a block-wide max (NaN-propagating, as ``np.max``),
a block-wide sum of ``exp(x - max)``, then the outputs, so a row is read
from memory once and re-read from cache. The arithmetic is the CPU kernels'
(``backends/cpu/kernels``): softmax is ``exp(x - m) / sum(exp(x - m))`` with
``m`` the row's maximum; log-sum-exp shifts by the maximum only when it is
finite. float16 and bfloat16 compute in float32, float64 in double.

Other layouts (reduced axes that are not the trailing ones, complex inputs)
run the NumPy kernel on CuPy arrays.
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from lazyx.backends.cpu.kernels import products as np_products
from lazyx.backends.cpu.kernels import reductions as np_reductions

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
"""

_TYPES = DTYPE_STRUCT_OF

_KERNEL = CudaKernel(DTYPE_STRUCTS + _SOURCE, "lazyx.backends.cuda.rowwise", name_expressions=[
    f"{k}_rows<{t}>" for k in ("softmax", "logsumexp") for t, _ in _TYPES.values()])


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
    kind = _TYPES.get(x.dtype.name)
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
    kind = _TYPES.get(x.dtype.name)
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
