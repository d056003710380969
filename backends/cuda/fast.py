"""CUDA kernels of the ``fast`` op pack.

* ``rms_norm`` / ``layer_norm``: one thread block per row (as ``rowwise.py``): a
  block-wide sum (and sum of squares about the mean), then the outputs; the row is
  read from memory once and re-read from cache. The fused backward kernels do the
  same for the input's cotangent and leave the weight's and bias's per-row terms to a
  column sum.
* ``rope``: one thread per rotated pair, angles in float32 as the CPU kernels.
* ``scaled_dot_product_attention``: float16/bfloat16 with head dimension 64 or 128
  and no mask or ``"causal"`` take the tensor-core flash kernel of
  :mod:`.flash_attention`. The rest (float32, mask arrays, sinks) runs in tiles of
  scores, in float32: per tile ``S = Q Kᵀ`` on cuBLAS, the scale, the mask, the
  sinks and the softmax in place in one kernel, ``O = P V`` on cuBLAS; a tile holds
  at most :data:`SCORES_BUDGET` bytes of scores, so the score matrix of a long
  sequence is never held whole (on an H200, the transformer LM of
  benchmarks/gpu_training.py spends 1.4 ms per step in its masked float32 attention
  this way, 20 ms with the one-warp-per-row kernel that still serves rows of scores
  longer than the budget).
* ``cross_entropy``: one block per row (max, sum of exp, the target's logit).
* attention's backward (``ScaledDotProductAttentionVJP``): over the forward's tiles of
  scores, ``P`` recomputed by the same softmax kernel, ``dS`` by one kernel, the four
  products on cuBLAS (float64: the NumPy kernel's formulas on CuPy arrays).

float16 and bfloat16 compute in float32; float64 runs the NumPy kernels on CuPy
arrays (``lazyx.backends.cpu.kernels.fast``). Written from CUDA's and CuPy's
documentation; the GPU test run covers them.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from lazyx.backends.cpu.kernels import fast as ref
from lazyx.dtypes import numpy_name
from lazyx.plugins import fast

from . import gemm as _gemm
from .flash_attention import flash_attention
from .rowwise import column_sum
from .runtime import DTYPE_STRUCT_OF, DTYPE_STRUCTS, CudaKernel, as_view, on_host

_SOURCE = r"""
// NVRTC has no <math.h>: the float infinity by its bits.
#define LAZYX_INF __int_as_float(0x7f800000)

#define MASKED (-3.4028234663852886e+38f)

// Block-wide sum or max; every thread gets the result. `sh` holds 33 floats.
template <bool MAX>
__device__ float block_reduce(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nw = (blockDim.x + 31) >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? sh[lane] : (MAX ? sh[0] : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      float u = __shfl_xor_sync(0xffffffffu, w, o);
      w = MAX ? fmaxf(w, u) : w + u;
    }
    if (lane == 0) sh[32] = w;
  }
  __syncthreads();
  float r = sh[32];
  __syncthreads();
  return r;
}

// LAYER: subtract the mean; w/b may be null.
// A row's mean (0 for rms_norm) and 1 / sqrt(mean((x - mean)^2) + eps), block-wide.
template <typename T, bool LAYER>
__device__ void row_stats(const typename T::S* xr, long long n, float eps, float* sh, float& mu,
                          float& inv) {
  mu = 0.0f;
  if (LAYER) {  // summed around the row's first value: no cancellation for far-off means
    const float shift = T::load(xr[0]);
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += T::load(xr[i]) - shift;
    mu = shift + block_reduce<false>(s, sh) / (float)n;
  }
  float q = 0.0f;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) { float d = T::load(xr[i]) - mu; q += d * d; }
  inv = rsqrtf(block_reduce<false>(q, sh) / (float)n + eps);
}

template <typename T, bool LAYER>
__global__ void norm_rows(const typename T::S* x, const typename T::S* w, const typename T::S* b,
                          typename T::S* out, long long rows, long long n, float eps) {
  __shared__ float sh[33];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename T::S* xr = x + r * n;
    float mu, inv;
    row_stats<T, LAYER>(xr, n, eps, sh, mu, inv);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      float y = (T::load(xr[i]) - mu) * inv;
      if (w) y *= T::load(w[i]);
      if (b) y += T::load(b[i]);
      out[r * n + i] = T::store(y);
    }
  }
}

// The same for rows of at most 256 * VEC 16-byte vectors whose start is 16-byte aligned
// (n a multiple of 16 / sizeof(S)): the row is read once, 16 bytes per load, into
// registers, and written 16 bytes per store, where norm_rows reads each element two or
// three times, 2 or 4 bytes per load. One block per row; the statistics are the same
// two-pass ones, in float32.
template <typename T, bool LAYER, int VEC>
__global__ void norm_rows_vec(const typename T::S* x, const typename T::S* w,
                              const typename T::S* b, typename T::S* out, long long rows,
                              long long n, float eps) {
  typedef typename T::S S;
  constexpr int E = 16 / sizeof(S);  // elements per 16-byte vector
  __shared__ float sh[33];
  const long long nv = n / E;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + r * n);
    float v[VEC][E];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const long long i = threadIdx.x + (long long)j * blockDim.x;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (i < nv) raw = xr[i];
      const S* e = reinterpret_cast<const S*>(&raw);
#pragma unroll
      for (int k = 0; k < E; ++k) v[j][k] = T::load(e[k]);
    }
    float mu = 0.0f;
    if (LAYER) {  // summed around the row's first value, as row_stats
      const float shift = T::load(x[r * n]);
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (threadIdx.x + (long long)j * blockDim.x < nv)
#pragma unroll
          for (int k = 0; k < E; ++k) s += v[j][k] - shift;
      mu = shift + block_reduce<false>(s, sh) / (float)n;
    }
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (threadIdx.x + (long long)j * blockDim.x < nv)
#pragma unroll
        for (int k = 0; k < E; ++k) { const float d = v[j][k] - mu; q += d * d; }
    const float inv = rsqrtf(block_reduce<false>(q, sh) / (float)n + eps);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const long long i = threadIdx.x + (long long)j * blockDim.x;
      if (i >= nv) continue;
      uint4 wr, br, o;
      if (w) wr = reinterpret_cast<const uint4*>(w)[i];
      if (b) br = reinterpret_cast<const uint4*>(b)[i];
      const S* we = reinterpret_cast<const S*>(&wr);
      const S* be = reinterpret_cast<const S*>(&br);
      S* oe = reinterpret_cast<S*>(&o);
#pragma unroll
      for (int k = 0; k < E; ++k) {
        float y = (v[j][k] - mu) * inv;
        if (w) y *= T::load(we[k]);
        if (b) y += T::load(be[k]);
        oe[k] = T::store(y);
      }
      reinterpret_cast<uint4*>(out + r * n)[i] = o;
    }
  }
}

// The input's cotangent of a norm; xn_g (rows x n, float32, may be null) gets g * xn
// for the weight's cotangent (a column sum on the host side).
template <typename T, bool LAYER>
__global__ void norm_vjp_rows(const typename T::S* x, const typename T::S* w, const typename T::S* g,
                              typename T::S* dx, float* xn_g, long long rows, long long n, float eps) {
  __shared__ float sh[33];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename T::S* xr = x + r * n;
    const typename T::S* gr = g + r * n;
    float mu, inv;
    row_stats<T, LAYER>(xr, n, eps, sh, mu, inv);
    float sg = 0.0f, sgx = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const float xn = (T::load(xr[i]) - mu) * inv;
      const float gw = T::load(gr[i]) * (w ? T::load(w[i]) : 1.0f);
      sg += gw;
      sgx += gw * xn;
      if (xn_g) xn_g[r * n + i] = T::load(gr[i]) * xn;
    }
    const float mg = LAYER ? block_reduce<false>(sg, sh) / (float)n : 0.0f;
    const float mgx = block_reduce<false>(sgx, sh) / (float)n;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const float xn = (T::load(xr[i]) - mu) * inv;
      const float gw = T::load(gr[i]) * (w ? T::load(w[i]) : 1.0f);
      dx[r * n + i] = T::store(inv * (gw - mg - xn * mgx));
    }
  }
}

// One thread per rotated pair: row r (position r % T of batch r / per_batch), pair i.
template <typename T>
__global__ void rope_pairs(const typename T::S* x, typename T::S* out, const float* cs, const float* sn,
                           long long rows, long long T_, long long per_batch, int tables, int D, int dims,
                           int traditional) {
  const int half = dims / 2;
  const long long total = rows * half;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const long long r = k / half;
    const int i = (int)(k % half);
    const long long tb = tables > 1 ? r / per_batch : 0;
    const long long a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    const float c = cs[(tb * T_ + r % T_) * half + i], s = sn[(tb * T_ + r % T_) * half + i];
    const float x1 = T::load(x[r * D + a]), x2 = T::load(x[r * D + b]);
    out[r * D + a] = T::store(x1 * c - x2 * s);
    out[r * D + b] = T::store(x1 * s + x2 * c);
    if (i == 0)
      for (int j = dims; j < D; ++j) out[r * D + j] = x[r * D + j];
  }
}

// Flash-style attention, one warp per query row. q (B, Hq, Tq, D), k (B, Hkv, Tk, D),
// v (B, Hkv, Tk, Dv), out (B, Hq, Tq, Dv); D, Dv <= 32 * MAXD.
// mask_kind 0 none, 1 causal, 2 boolean, 3 additive (float32), with element strides.
#define MAXD 8
template <typename T>
__global__ void attention_rows(const typename T::S* q, const typename T::S* k, const typename T::S* v,
                               typename T::S* out, int B, int Hq, int Hkv, int Tq, int Tk, int D, int Dv,
                               float scale, int mask_kind, const void* mask, long long ms0, long long ms1,
                               long long ms2, long long ms3, const float* sinks) {
  const int lane = threadIdx.x & 31;
  const long long row = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= (long long)B * Hq * Tq) return;
  const int t = (int)(row % Tq), h = (int)((row / Tq) % Hq), b = (int)(row / ((long long)Tq * Hq));
  const int hk = h / (Hq / Hkv);
  const typename T::S* qr = q + row * D;
  const typename T::S* kb = k + ((long long)b * Hkv + hk) * Tk * D;
  const typename T::S* vb = v + ((long long)b * Hkv + hk) * Tk * Dv;
  float qv[MAXD], acc[MAXD];
  for (int j = 0; j < MAXD; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? T::load(qr[d]) * scale : 0.0f;
    acc[j] = 0.0f;
  }
  const int off = Tk - Tq;
  int kend = Tk;
  // keys past the diagonal are masked; a row that sees none averages them all (MLX)
  if (mask_kind == 1 && t + off >= 0) kend = min(Tk, t + off + 1);
  float m = sinks ? sinks[h] : -LAZYX_INF, l = sinks ? 1.0f : 0.0f;
  for (int j = 0; j < kend; ++j) {
    float part = 0.0f;
    for (int i = 0; i < MAXD; ++i) {
      const int d = lane + 32 * i;
      if (d < D) part += qv[i] * T::load(kb[(long long)j * D + d]);
    }
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    float s = part;
    if (mask_kind == 1 && j > t + off) s = MASKED;
    if (mask_kind >= 2) {
      const long long mi = b * ms0 + h * ms1 + t * ms2 + j * ms3;
      if (mask_kind == 2) { if (!((const unsigned char*)mask)[mi]) s = MASKED; }
      else s += ((const float*)mask)[mi];
    }
    const float mn = fmaxf(m, s);
    const float corr = (m == -LAZYX_INF) ? 0.0f : __expf(m - mn);
    const float p = (s == -LAZYX_INF) ? 0.0f : __expf(s - mn);  // -inf - -inf is NaN
    l = l * corr + p;
    for (int i = 0; i < MAXD; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < Dv ? p * T::load(vb[(long long)j * Dv + d]) : 0.0f);
    }
    m = mn;
  }
  typename T::S* orow = out + row * Dv;
  for (int i = 0; i < MAXD; ++i) {
    const int d = lane + 32 * i;
    if (d < Dv) orow[d] = T::store(acc[i] / l);
  }
}

// Softmax in place of a tile of attention scores s (n x R x K, float32): the slabs
// [c0, c0 + n) (slab = b * Hkv + kv head) and, in each, the query rows [r0, r0 + R) of the
// slab's G query heads flattened (row = g * Tq + t); K = Tk keys. The scores are scaled,
// masked (1 causal, 2 boolean, 3 additive float32; element strides of the (B, Hq, Tq, Tk)
// broadcast), then exp(s - max) / sum, with the sinks' logits in the max and the sum.
// One warp per row; the row is re-read from cache.
__global__ void attention_softmax_tile(float* s, long long n, int R, int K, long long c0, int r0,
                                       int Hkv, int G, int Tq, int off, float scale, int mask_kind,
                                       const void* mask, long long ms0, long long ms1, long long ms2,
                                       long long ms3, const float* sinks, float* psink,
                                       int rows_total) {
  const int lane = threadIdx.x & 31;
  const long long step = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
       row < n * R; row += step) {
    const long long slab = c0 + row / R;
    const int fr = r0 + (int)(row % R);
    const int t = fr % Tq;
    const long long b = slab / Hkv;
    const int h = (int)(slab % Hkv) * G + fr / Tq;
    float* sr = s + row * K;
    const long long base = b * ms0 + h * ms1 + t * ms2;
    float m = -LAZYX_INF;
    for (int j = lane; j < K; j += 32) {
      float v = sr[j] * scale;
      if (mask_kind == 1) { if (j > t + off) v = MASKED; }
      else if (mask_kind == 2) { if (!((const unsigned char*)mask)[base + j * ms3]) v = MASKED; }
      else if (mask_kind == 3) v += ((const float*)mask)[base + j * ms3];
      sr[j] = v;
      m = fmaxf(m, v);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float sk = sinks ? sinks[h] : 0.0f;
    if (sinks) m = fmaxf(m, sk);
    float l = 0.0f;
    for (int j = lane; j < K; j += 32) {
      const float e = expf(sr[j] - m);
      sr[j] = e;
      l += e;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (sinks) l += expf(sk - m);
    for (int j = lane; j < K; j += 32) sr[j] = sr[j] / l;
    if (psink && lane == 0) psink[slab * rows_total + fr] = expf(sk - m) / l;
  }
}

// The scores' cotangent of a tile, in place of dP = dO Vᵀ (laid out as the scores of
// attention_softmax_tile): dS = scale * P * (dP - rows_d), zero where a causal or boolean
// mask holds the score constant. rows_d (slabs x rows_total) is rowsum(dO * O).
__global__ void attention_ds_tile(float* dp, const float* P, const float* rows_d, long long n,
                                  int R, int K, long long c0, int r0, int rows_total, int Hkv,
                                  int G, int Tq, int off, float scale, int mask_kind,
                                  const void* mask, long long ms0, long long ms1, long long ms2,
                                  long long ms3) {
  const int lane = threadIdx.x & 31;
  const long long step = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
       row < n * R; row += step) {
    const long long slab = c0 + row / R;
    const int fr = r0 + (int)(row % R);
    const int t = fr % Tq;
    const long long b = slab / Hkv;
    const int h = (int)(slab % Hkv) * G + fr / Tq;
    const long long base = b * ms0 + h * ms1 + t * ms2;
    const float rd = rows_d[slab * rows_total + fr];
    float* dr = dp + row * K;
    const float* pr = P + row * K;
    for (int j = lane; j < K; j += 32) {
      bool keep = true;
      if (mask_kind == 1) keep = j <= t + off;
      else if (mask_kind == 2) keep = ((const unsigned char*)mask)[base + j * ms3] != 0;
      dr[j] = keep ? scale * pr[j] * (dr[j] - rd) : 0.0f;
    }
  }
}

template <typename T>
__global__ void cross_entropy_rows(const typename T::S* x, const long long* t, float* out, long long rows,
                                   long long n) {
  __shared__ float sh[33];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename T::S* xr = x + r * n;
    float m = -LAZYX_INF;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, T::load(xr[i]));
    m = block_reduce<true>(m, sh);
    if (!isfinite(m)) m = 0.0f;
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += expf(T::load(xr[i]) - m);
    s = block_reduce<false>(s, sh);
    if (threadIdx.x == 0) {
      long long k = t[r] % n;
      if (k < 0) k += n;
      out[r] = logf(s) + m - T::load(xr[k]);
    }
  }
}
"""

_TYPES = {n: k for n, k in DTYPE_STRUCT_OF.items() if n != "float64"}  # float64: on the host
_TAGS = [t for t, _ in _TYPES.values()]
_VECS = (1, 2, 4, 8)  # 16-byte vectors per thread of norm_rows_vec (256 threads at most)
_NAMES = ([f"norm_rows<{t},{b}>" for t in _TAGS for b in ("true", "false")]
          + [f"norm_rows_vec<{t},{b},{v}>" for t in _TAGS for b in ("true", "false")
             for v in _VECS]
          + [f"norm_vjp_rows<{t},{b}>" for t in _TAGS for b in ("true", "false")]
          + [f"{k}<{t}>" for k in ("rope_pairs", "attention_rows", "cross_entropy_rows")
             for t in _TAGS] + ["attention_softmax_tile", "attention_ds_tile"])
_KERNEL = CudaKernel(DTYPE_STRUCTS + _SOURCE, "lazyx.backends.cuda.fast", name_expressions=_NAMES)
_MAXD = 8 * 32


def _block(n: int) -> int:
    return 256 if n >= 2048 else (128 if n >= 512 else 32)


def _norm(layer: bool):
    cls = fast.LayerNorm if layer else fast.RMSNorm
    host = on_host(ref.KERNELS[cls])  # float64 and empty inputs

    def kernel(p, ins):
        x = ins[0]
        kind = _TYPES.get(numpy_name(x.dtype))
        if kind is None or x.size == 0:
            return host(p, ins)
        tag, view = kind
        x = cp.ascontiguousarray(x)
        w = b = None
        if layer:
            k = 1
            if p.weighted:
                w, k = cp.ascontiguousarray(ins[1]), 2
            if p.biased:
                b = cp.ascontiguousarray(ins[k])
        elif len(ins) > 1:
            w = cp.ascontiguousarray(ins[1])
        n = x.shape[-1]
        rows = x.size // n
        out = cp.empty(x.shape, x.dtype)
        args = (as_view(x, view), as_view(w, view), as_view(b, view), as_view(out, view), np.int64(rows),
                np.int64(n), np.float32(p.eps))
        flag = "true" if layer else "false"
        per = 16 // x.dtype.itemsize  # elements per 16-byte vector
        nv = n // per
        if n % per == 0 and nv <= 256 * _VECS[-1] and all(
                a is None or a.data.ptr % 16 == 0 for a in (x, w, b, out)):
            # Eight 16-byte vectors per thread where the row has them (a 16 KB row: 128
            # threads; on an H200 0.95 of a memcpy's bandwidth against 0.87 with 256
            # threads of four), at least two warps per block.
            threads = min(256, max(64, (-(-nv // _VECS[-1]) + 31) // 32 * 32))
            vec = next(v for v in _VECS if v * threads >= nv)
            _KERNEL.function(f"norm_rows_vec<{tag},{flag},{vec}>")(
                (min(rows, 1 << 20),), (threads,), args)
        else:
            _KERNEL.function(f"norm_rows<{tag},{flag}>")((min(rows, 1 << 20),), (_block(n),), args)
        return out
    return kernel


def _norm_vjp(layer: bool):
    cls = fast.LayerNormVJP if layer else fast.RMSNormVJP
    host = on_host(ref.KERNELS[cls])

    def kernel(p, ins):
        x, g = ins[0], ins[-1]
        kind = _TYPES.get(numpy_name(x.dtype))
        if kind is None or x.size == 0:
            return host(p, ins)
        tag, view = kind
        x, g = cp.ascontiguousarray(x), cp.ascontiguousarray(g)
        weighted = p.weighted if layer else len(ins) > 2
        w = cp.ascontiguousarray(ins[1]) if weighted else None
        n = x.shape[-1]
        rows = x.size // n
        dx = cp.empty(x.shape, x.dtype)
        xng = cp.empty((rows, n), cp.float32) if weighted else None
        fn = _KERNEL.function(f"norm_vjp_rows<{tag},{'true' if layer else 'false'}>")
        fn((min(rows, 1 << 20),), (_block(n),),
           (as_view(x, view), as_view(w, view), as_view(g, view), as_view(dx, view), xng, np.int64(rows), np.int64(n),
            np.float32(p.eps)))
        outs = [dx]
        if weighted:
            outs.append(column_sum(xng).astype(x.dtype, copy=False))
        if layer and p.biased:
            outs.append(column_sum(g.reshape(rows, n)).astype(x.dtype, copy=False))
        return tuple(outs)
    return kernel


# What the CUDA kernels here leave to the NumPy kernels (float64, empty arrays, head dims
# past 256): known gap, these compute on the host.
_rope_on_host, _attention_on_host, _cross_entropy_on_host = (
    on_host(ref.rope), on_host(ref.attention), on_host(ref.cross_entropy))


def rope(p, ins):
    x, offset = ins[0], ins[1]
    kind = _TYPES.get(numpy_name(x.dtype))
    if kind is None or x.size == 0:
        return _rope_on_host(p, ins)
    tag, view = kind
    x = cp.ascontiguousarray(x)
    # the angle tables (B or 1, T, dims / 2) are small: made on the host, as the CPU's
    freqs = ins[2] if len(ins) > 2 else None
    cos, sin = ref.rope_tables(p, x.shape, offset, freqs, np.dtype(np.float32), xp=cp)
    cos, sin = cp.ascontiguousarray(cos, cp.float32), cp.ascontiguousarray(sin, cp.float32)
    t, d = x.shape[-2], x.shape[-1]
    rows = x.size // d
    out = cp.empty(x.shape, x.dtype)
    total = rows * (p.dims // 2)
    _KERNEL.function(f"rope_pairs<{tag}>")(
        (max(1, min((total + 255) // 256, 1 << 20)),), (256,),
        (as_view(x, view), as_view(out, view), cos, sin, np.int64(rows), np.int64(t),
         np.int64(x.size // (x.shape[0] * d)), np.int32(cos.shape[0]), np.int32(d),
         np.int32(p.dims), np.int32(p.traditional)))
    return out


#: Bytes of float32 scores one tile of :func:`_attention_tiled` may hold (its slabs and
#: query rows are chosen to stay under it).
SCORES_BUDGET = 1 << 27


def _mm(a, b):
    """``a @ b`` on cuBLAS, also while a CUDA graph is captured (CuPy refuses then)."""
    if _gemm.capturing:
        out = _gemm.matmul(a, b)
        if out is not None:
            return out
    return cp.matmul(a, b)


def _mask_args(p, ins):
    """``(kind, mask, element strides)`` of the attention's mask for the kernels: 0 none,
    1 causal, 2 boolean (as uint8), 3 additive (float32); broadcast axes stride 0."""
    if p.mask == "causal":
        return 1, None, (0, 0, 0, 0)
    if p.mask != "array":
        return 0, None, (0, 0, 0, 0)
    m = ins[3]
    if m.dtype == np.bool_:
        kind, m = 2, m.view(cp.uint8)
    else:
        kind, m = 3, m if m.dtype == np.float32 else m.astype(cp.float32)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    return kind, m, tuple(0 if m.shape[i] == 1 else m.strides[i] // m.itemsize for i in range(4))


def _tiles(rows: int, tk: int) -> tuple[int, int]:
    """``(slabs, query rows)`` per tile of :func:`_attention_tiled`: whole slabs while
    one fits :data:`SCORES_BUDGET`, else rows of one slab."""
    row_bytes = 4 * tk
    if rows * row_bytes <= SCORES_BUDGET:
        return max(1, SCORES_BUDGET // (rows * row_bytes)), rows
    return 1, max(1, SCORES_BUDGET // row_bytes)


def _launch_rows(total: int):
    """Grid and block of the tile kernels: a warp per row, 8 warps per block."""
    return (max(1, min(-(-total // 8), 1 << 20)),), (256,)


def _attention_tiled(p, ins):
    """Attention as tiles of scores: per tile of (batch, kv head) slabs and query rows,
    ``S = Q Kᵀ`` on cuBLAS, the masked softmax in place (one kernel), ``O = P V`` on
    cuBLAS, in float32. A tile's scores stay under :data:`SCORES_BUDGET` bytes, so long
    sequences never hold the whole score matrix. Grouped-query heads share their kv
    head's slab (its query heads' rows side by side)."""
    q, k, v = ins[:3]
    f32 = np.dtype(np.float32)
    b, hq, tq, d = q.shape
    hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    slabs, rows = b * hkv, g * tq
    qf = cp.ascontiguousarray(q, f32).reshape(slabs, rows, d)
    kt = cp.ascontiguousarray(k, f32).reshape(slabs, tk, d).transpose(0, 2, 1)
    vf = cp.ascontiguousarray(v, f32).reshape(slabs, tk, dv)
    kind, mask, ms = _mask_args(p, ins)
    sinks = cp.ascontiguousarray(ins[-1], f32) if p.sinks else None
    per, r_step = _tiles(rows, tk)
    out = None
    fn = _KERNEL.function("attention_softmax_tile")
    for c0 in range(0, slabs, per):
        c1 = min(slabs, c0 + per)
        for r0 in range(0, rows, r_step):
            r1 = min(rows, r0 + r_step)
            qt = qf[c0:c1] if r1 - r0 == rows else cp.ascontiguousarray(qf[c0:c1, r0:r1])
            s = _mm(qt, kt[c0:c1])
            n = c1 - c0
            fn(*_launch_rows(n * (r1 - r0)),
               (s, np.int64(n), np.int32(r1 - r0), np.int32(tk), np.int64(c0), np.int32(r0),
                np.int32(hkv), np.int32(g), np.int32(tq), np.int32(tk - tq), np.float32(p.scale),
                np.int32(kind), mask, *(np.int64(x) for x in ms), sinks, None, np.int32(rows)))
            o = _mm(s, vf[c0:c1])
            if c1 - c0 == slabs and r1 - r0 == rows:
                out = o
            else:
                if out is None:
                    out = cp.empty((slabs, rows, dv), f32)
                out[c0:c1, r0:r1] = o
    out = out.reshape(b, hq, tq, dv)
    return out if q.dtype == f32 else out.astype(q.dtype)


def attention(p, ins):
    q, k, v = ins[:3]
    kind = _TYPES.get(numpy_name(q.dtype))
    if kind is None or q.size == 0 or k.shape[2] == 0 or q.shape[3] > _MAXD or v.shape[3] > _MAXD:
        return _attention_on_host(p, ins)
    if p.mask != "array" and not p.sinks:
        out = flash_attention(q, k, v, p.scale, p.mask == "causal")
        if out is not None:
            return out
    if 4 * k.shape[2] <= SCORES_BUDGET:
        return _attention_tiled(p, ins)
    # Rows of scores past the budget: one warp per query row walks the keys.
    tag, view = kind
    q, k, v = (cp.ascontiguousarray(a) for a in (q, k, v))
    b, hq, tq, d = q.shape
    hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    kind_id, mask, strides = _mask_args(p, ins)
    sinks = cp.ascontiguousarray(ins[-1], cp.float32) if p.sinks else None
    out = cp.empty((b, hq, tq, dv), q.dtype)
    rows = b * hq * tq
    warps = 4
    _KERNEL.function(f"attention_rows<{tag}>")(
        ((rows + warps - 1) // warps,), (32 * warps,),
        (as_view(q, view), as_view(k, view), as_view(v, view), as_view(out, view), np.int32(b), np.int32(hq),
         np.int32(hkv), np.int32(tq), np.int32(tk), np.int32(d), np.int32(dv),
         np.float32(p.scale), np.int32(kind_id), mask, *(np.int64(s) for s in strides), sinks))
    return out


def cross_entropy(p, ins):
    logits, t = ins
    kind = _TYPES.get(numpy_name(logits.dtype))
    if kind is None or logits.size == 0:
        return _cross_entropy_on_host(p, ins)
    tag, view = kind
    x = cp.ascontiguousarray(logits)
    targets = cp.ascontiguousarray(t, cp.int64)
    n = x.shape[-1]
    rows = x.size // n
    out = cp.empty(t.shape, cp.float32)
    _KERNEL.function(f"cross_entropy_rows<{tag}>")(
        (max(1, min(rows, 1 << 20)),), (_block(n),),
        (as_view(x, view), targets, out, np.int64(rows), np.int64(n)))
    return out


def _attention_vjp_tiled(p, ins):
    """Attention's backward over the forward's tiles (:func:`_attention_tiled`), in float32:
    per tile ``P`` is recomputed (the softmax kernel), ``dP = dO Vᵀ``, ``dS = scale · P ·
    (dP − rowsum(dO·O))`` in place (one kernel, zero where a causal or boolean mask holds
    the score constant), then ``dQ = dS K``, ``dK += dSᵀ Q`` and ``dV += Pᵀ dO`` on cuBLAS.
    A slab's rows are its kv head's query heads side by side, so the products sum the
    grouped heads' contributions themselves."""
    q, k, v = ins[:3]
    out, cot = ins[-2], ins[-1]
    f32 = np.dtype(np.float32)
    b, hq, tq, d = q.shape
    hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    slabs, rows = b * hkv, g * tq
    qf = cp.ascontiguousarray(q, f32).reshape(slabs, rows, d)
    kf = cp.ascontiguousarray(k, f32).reshape(slabs, tk, d)
    vf = cp.ascontiguousarray(v, f32).reshape(slabs, tk, dv)
    gf = cp.ascontiguousarray(cot, f32).reshape(slabs, rows, dv)
    rows_d = cp.ascontiguousarray(
        (gf * cp.ascontiguousarray(out, f32).reshape(slabs, rows, dv)).sum(-1))
    kind, mask, ms = _mask_args(p, ins)
    sinks = cp.ascontiguousarray(ins[3 + (p.mask == "array")], f32) if p.sinks else None
    psink = cp.empty((slabs, rows), f32) if p.sinks else None
    per, r_step = _tiles(rows, tk)
    whole = per >= slabs and r_step >= rows
    if whole:
        dq = dk = dvv = None
    else:
        dq = cp.empty((slabs, rows, d), f32)
        dk, dvv = cp.zeros((slabs, tk, d), f32), cp.zeros((slabs, tk, dv), f32)
    softmax = _KERNEL.function("attention_softmax_tile")
    ds_of = _KERNEL.function("attention_ds_tile")
    scale, kt, vt = np.float32(p.scale), kf.transpose(0, 2, 1), vf.transpose(0, 2, 1)
    for c0 in range(0, slabs, per):
        c1 = min(slabs, c0 + per)
        n = c1 - c0
        for r0 in range(0, rows, r_step):
            r1 = min(rows, r0 + r_step)
            part = r1 - r0 != rows
            qt = cp.ascontiguousarray(qf[c0:c1, r0:r1]) if part else qf[c0:c1]
            gt = cp.ascontiguousarray(gf[c0:c1, r0:r1]) if part else gf[c0:c1]
            tile = (np.int64(n), np.int32(r1 - r0), np.int32(tk), np.int64(c0), np.int32(r0))
            where = (np.int32(hkv), np.int32(g), np.int32(tq), np.int32(tk - tq), scale,
                     np.int32(kind), mask, *(np.int64(x) for x in ms))
            s = _mm(qt, kt[c0:c1])
            softmax(*_launch_rows(n * (r1 - r0)), (s,) + tile + where + (sinks, psink, np.int32(rows)))
            ds = _mm(gt, vt[c0:c1])
            ds_of(*_launch_rows(n * (r1 - r0)),
                  (ds, s, rows_d) + tile[:5] + (np.int32(rows),) + where)
            if whole:
                dq, dk, dvv = _mm(ds, kf), _mm(ds.transpose(0, 2, 1), qt), _mm(s.transpose(0, 2, 1), gt)
            else:
                dq[c0:c1, r0:r1] = _mm(ds, kf[c0:c1])
                dk[c0:c1] += _mm(ds.transpose(0, 2, 1), qt)
                dvv[c0:c1] += _mm(s.transpose(0, 2, 1), gt)
    grads = (dq.reshape(q.shape).astype(q.dtype, copy=False),
             dk.reshape(k.shape).astype(k.dtype, copy=False),
             dvv.reshape(v.shape).astype(v.dtype, copy=False))
    if p.sinks:
        grads += (-(psink * rows_d).reshape(b, hkv, g, tq).sum(-1).reshape(b, hq),)
    return grads


def attention_vjp(p, ins):
    """Attention's backward: :func:`_attention_vjp_tiled` for the dtypes the tile kernels
    take (float32, float16, bfloat16) while a row of scores fits the budget; float64 and
    longer rows run the NumPy kernel's tiled formulas on CuPy arrays."""
    q, k = ins[0], ins[1]
    if (numpy_name(q.dtype) in _TYPES and q.size and k.shape[2] and 4 * k.shape[2] <= SCORES_BUDGET):
        return _attention_vjp_tiled(p, ins)
    return ref.attention_vjp(p, ins, cp)


KERNELS = {
    fast.RMSNorm: _norm(False),
    fast.LayerNorm: _norm(True),
    fast.RMSNormVJP: _norm_vjp(False),
    fast.LayerNormVJP: _norm_vjp(True),
    fast.RoPE: rope,
    fast.ScaledDotProductAttention: attention,
    fast.ScaledDotProductAttentionVJP: attention_vjp,
    fast.CrossEntropy: cross_entropy,
}
