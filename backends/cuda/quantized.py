"""CUDA kernels of the ``quantized`` op pack.

``quantized_matmul`` and ``gather_qmm`` multiply from the packed words in one CUDA
C++ kernel per layout, over the layout the CPU native kernel takes
(``lazyx.backends.cpu.native_packs.quantized``): ``out[p] = x[xi[p]] @ W(wi[p])`` with
``x`` ``(nx, M, K)``, packed ``w`` ``(nw, R, C)``, scales and biases, and int64 index
pairs. ``x`` and the output are read and written in x's own type (float32, float16,
bfloat16: templates over runtime.DTYPE_STRUCTS), and affine scales and biases of x's
type as they are (E8M0 / E4M3 codes are decoded to float32 with CuPy, 1/group_size of
the weights), so that a decode step is one launch and no conversions; accumulation is
float32.

* ``qmm_t`` (``transpose``: rows of W are outputs; the decode-shaped matrix-vector
  product): one warp per output ``(p, m, n)``; the lanes read consecutive packed words
  of row ``n`` (coalesced), decode them in registers, multiply with ``x`` and reduce
  with shuffles. For 3-, 5- and 6-bit values (which straddle words) the lanes walk
  values instead.
* ``qmm_dec`` (``transpose``, affine, 2/4/8 bits, at most 16 rows of x): the decode
  step's kernel. A block takes 4 output rows and its threads split K in 16-byte chunks,
  so that x is read once per block and many loads are in flight; values are decoded by
  moving their bits into the mantissa of 1.0 (no conversion instruction).
* ``qmm_t4`` (``transpose``, the other fast widths and modes): x staged in shared memory.
* ``qmm_n`` (rows of W are the K axis): one thread per output ``(p, m, n)``; a warp's
  adjacent ``n`` read the same packed words of each row ``k``.

Element decoding is the CPU kernels': affine ``scale * q + bias``; E2M1 by a 16-entry
table; E4M3 decoded arithmetically. ``quantize``/``dequantize`` run the NumPy kernels
on the host (they are off the hot path and must match MLX bit for bit).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from lazyx.backends.cpu.kernels import quantized as ref
from lazyx.dtypes import numpy_name
from lazyx.plugins import quantized as q

from .runtime import DTYPE_STRUCT_OF, DTYPE_STRUCTS, CudaKernel, as_view, on_host

_SOURCE = r"""
__device__ __constant__ float kFp4[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                          -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

__device__ __forceinline__ float e4m3(unsigned int c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  float v = (e == 0xf && m == 7) ? __int_as_float(0x7fc00000)
            : (e == 0 ? ldexpf((float)m, -9) : ldexpf(1.f + m * 0.125f, e - 7));
  return (c & 0x80) ? -v : v;
}

// mode 0 affine, 1 E2M1, 2 E4M3
__device__ __forceinline__ float value(unsigned int code, float s, float b, int mode) {
  return mode == 0 ? fmaf(s, (float)code, b) : (mode == 1 ? s * kFp4[code] : s * e4m3(code));
}

// Value k of a packed row (any width; a value may straddle two words).
__device__ __forceinline__ unsigned int code_at(const unsigned int* row, long long k, int bits) {
  const long long bit = k * bits;
  const long long wi = bit >> 5;
  const int sh = (int)(bit & 31);
  unsigned int v = row[wi] >> sh;
  if (sh + bits > 32) v |= row[wi + 1] << (32 - sh);
  return v & ((1u << bits) - 1u);
}

template <typename X, typename SC>
__global__ void qmm_t(const typename X::S* x, const unsigned int* w, const typename SC::S* scales,
                                 const typename SC::S* biases, const long long* xi, const long long* wi,
                                 typename X::S* out, long long P, long long M, long long K, long long N,
                                 long long C, long long G, int bits, int gs, int mode,
                                 long long nx, long long nw, int has_b) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int gshift = __ffs(gs) - 1;  // group sizes are powers of two: no 64-bit division
  if (warp >= P * M * N) return;
  const long long n = warp % N, m = (warp / N) % M, p = warp / (N * M);
  const typename X::S* xr = x + (xi[p] * M + m) * K;
  const unsigned int* row = w + (wi[p] * N + n) * C;
  const typename SC::S* sr = scales + (wi[p] * N + n) * G;
  const typename SC::S* br = has_b ? biases + (wi[p] * N + n) * G : nullptr;
  float acc = 0.f;
  if ((32 % bits) == 0) {  // (2/4/8 bits with rows not 16-byte aligned: qmm_t4 otherwise)
    const int per = 32 / bits;
    const unsigned int mask = (1u << bits) - 1u;
    for (long long c = lane; c < C; c += 32) {
      const unsigned int word = row[c];
      const long long k0 = c * per;
      const long long g = k0 >> gshift;  // a word never spans two groups
      const float s = SC::load(sr[g]), b = br ? SC::load(br[g]) : 0.f;
      for (int j = 0; j < per; ++j)
        acc = fmaf(X::load(xr[k0 + j]), value((word >> (j * bits)) & mask, s, b, mode), acc);
    }
  } else {
    for (long long k = lane; k < K; k += 32) {
      const long long g = k >> gshift;
      acc = fmaf(X::load(xr[k]), value(code_at(row, k, bits), SC::load(sr[g]), br ? SC::load(br[g]) : 0.f, mode), acc);
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[(p * M + m) * N + n] = X::store(acc);
}

template <typename X, typename SC>
__global__ void qmm_n(const typename X::S* x, const unsigned int* w, const typename SC::S* scales,
                                 const typename SC::S* biases, const long long* xi, const long long* wi,
                                 typename X::S* out, long long P, long long M, long long K, long long N,
                                 long long C, long long G, int bits, int gs, int mode,
                                 long long nx, long long nw, int has_b) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= P * M * N) return;
  const long long n = t % N, m = (t / N) % M, p = t / (N * M);
  const typename X::S* xr = x + (xi[p] * M + m) * K;
  const unsigned int* mat = w + wi[p] * K * C;
  const typename SC::S* sm = scales + wi[p] * K * G;
  const typename SC::S* bm = has_b ? biases + wi[p] * K * G : nullptr;
  const long long g = n / gs;
  float acc = 0.f;
  for (long long k = 0; k < K; ++k) {
    const float b = bm ? SC::load(bm[k * G + g]) : 0.f;
    acc = fmaf(X::load(xr[k]), value(code_at(mat + k * C, n, bits), SC::load(sm[k * G + g]), b, mode), acc);
  }
  out[t] = X::store(acc);
}

// The decode-shaped fast path of qmm_t for 2-, 4- and 8-bit values, specialised by
// width and mode. A block of 8 warps serves ROWS output rows of one (p, m) (8 when there
// are few (p, m): a block per 8 rows fills the GPU; 64 otherwise): it stages
// x[m] in shared memory once (x is read 8x more bytes than the 4-bit weights per row
// otherwise), then each warp walks its rows, each lane loading packed words
// and decoding them in registers. Needs (K + G) * 4 bytes of shared memory.
template <int BITS, int MODE, typename X, typename SC>
__global__ void qmm_t4(const typename X::S* x, const unsigned int* w, const typename SC::S* scales,
                       const typename SC::S* biases, const long long* xi, const long long* wi,
                       typename X::S* out, long long P, long long M, long long K, long long N,
                       long long C, long long G, int gs, int has_b, int ROWS) {
  constexpr int per = 32 / BITS;
  constexpr unsigned int mask = (1u << BITS) - 1u;
  extern __shared__ float xs_[];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int gshift = __ffs(gs) - 1;  // group sizes are powers of two: no division
  const long long pm = blockIdx.y, m = pm % M, p = pm / M;
  const typename X::S* xr = x + (xi[p] * M + m) * K;
  float* gsum = xs_ + K;  // per-group sums of x: the bias term is b_g * gsum_g
  for (long long k = threadIdx.x; k < K; k += blockDim.x) xs_[k] = X::load(xr[k]);
  __syncthreads();
  if (MODE == 0)
    for (long long g = wid; g < G; g += nwarps) {  // a warp per group, conflict-free reads
      float t = 0.f;
      for (int j = lane; j < gs; j += 32) t += xs_[g * gs + j];
      for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
      if (lane == 0) gsum[g] = t;
    }
  __syncthreads();
  const long long n_end = min(N, (long long)(blockIdx.x + 1) * ROWS);
  for (long long n = (long long)blockIdx.x * ROWS + wid; n < n_end; n += nwarps) {
    const unsigned int* row = w + (wi[p] * N + n) * C;
    const typename SC::S* sr = scales + (wi[p] * N + n) * G;
    const typename SC::S* br = has_b ? biases + (wi[p] * N + n) * G : nullptr;
    float acc = 0.f;
    // Lane l takes words l, l + 32, ...: a warp's loads are 128 contiguous bytes, and
    // its x reads (per * 4 bytes apart) stay clear of shared-memory bank conflicts.
#pragma unroll 4  // several loads in flight per lane
    for (int c = lane; c < (int)C; c += 32) {
      const unsigned int word = __ldg(row + c);
      const int k0 = c * per;
      const int g = k0 >> gshift;  // a word never spans two groups
      const float4* xv = reinterpret_cast<const float4*>(xs_ + k0);
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < per / 4; ++j) {
        const float4 xx = xv[j];
        const float xa[4] = {xx.x, xx.y, xx.z, xx.w};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const unsigned int code = (word >> ((4 * j + l) * BITS)) & mask;
          if (MODE == 0) {
            // code as a float without the quarter-rate I2F: 2^23 + code, minus 2^23
            const float q = __int_as_float(code | 0x4b000000u) - 8388608.f;
            part = fmaf(xa[l], q, part);
          } else {
            part = fmaf(xa[l], MODE == 1 ? kFp4[code] : e4m3(code), part);
          }
        }
      }
      acc = fmaf(SC::load(sr[g]), part, acc);
    }
    if (MODE == 0)
      for (int g = lane; g < (int)G; g += 32) acc = fmaf(SC::load(br[g]), gsum[g], acc);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[(p * M + m) * N + n] = X::store(acc);
  }
}

// Eight values of x from 16-byte-aligned memory, as floats.
template <typename X>
__device__ __forceinline__ void load8(const typename X::S* p, float* f) {
  if (sizeof(typename X::S) == 2) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const typename X::S* e = reinterpret_cast<const typename X::S*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = X::load(e[i]);
  } else {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
  }
}

// A chunk of LW packed words loaded at once (16 or 8 bytes), and its word i (i a
// compile-time constant once unrolled).
template <int LW> struct Chunk;
template <> struct Chunk<4> {
  typedef uint4 T;
  static __device__ __forceinline__ unsigned int word(const uint4& u, int i) {
    return i == 0 ? u.x : (i == 1 ? u.y : (i == 2 ? u.z : u.w));
  }
  static __device__ __forceinline__ uint4 zero() { return make_uint4(0, 0, 0, 0); }
};
template <> struct Chunk<2> {
  typedef uint2 T;
  static __device__ __forceinline__ unsigned int word(const uint2& u, int i) { return i == 0 ? u.x : u.y; }
  static __device__ __forceinline__ uint2 zero() { return make_uint2(0, 0); }
};

// Decode-shaped affine products (few rows of x). A block serves R output rows of one
// (p, m) and its threads split K: thread t takes the chunks t, t + blockDim, ... (LW
// packed words each, 32 LW / BITS values within one group) of all R rows, so the block
// reads its x row once (into registers, eight values at a time) and a warp's weight
// loads are 32 LW * 4 contiguous bytes; the R loads of a chunk are issued together. A
// value q is decoded into the float f = 1 + q / 2^BITS by moving its bits into the
// mantissa of 1.0 (a shift and a LOP3: no integer-to-float conversion), and
//   s (q . x) + b sum(x) = (s 2^BITS) (f . x) + (b - s 2^BITS) sum(x)
// per chunk (16-bit x; float32 x decodes q exactly, see EXACT). The threads' partial sums meet through warp shuffles and shared memory.
// Needs w and x aligned to 16 bytes, C % LW == 0, K % 8 == 0 and 32 LW / BITS <= gs.
template <int BITS, int R, int LW, typename X, typename SC>
__global__ void __launch_bounds__(256) qmm_dec(
    const typename X::S* x, const unsigned int* w, const typename SC::S* scales,
    const typename SC::S* biases, const long long* xi, const long long* wi,
    typename X::S* out, long long P, long long M, long long K, long long N,
    long long C, long long G, int gs, int has_b) {
  typedef Chunk<LW> CH;
  constexpr int V = 32 * LW / BITS, PER = 32 / BITS;
  constexpr unsigned int FIELD = ((1u << BITS) - 1u) << (23 - BITS);  // q's place in f
  constexpr float UNIT = (float)(1 << BITS);
  // float32 x: q decoded exactly (one more instruction per value), as the float64-close
  // results of a float32 product want; the mantissa form's (f . x - sum x) cancels a
  // few bits, below what a 16-bit x and output keep.
  constexpr bool EXACT = sizeof(typename X::S) == 4;
  __shared__ float partial[8][R];  // [warp][row]: at most 256 threads
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const long long pm = blockIdx.y, m = pm % M, p = pm / M;
  const long long n0 = (long long)blockIdx.x * R;
  const int rows = (int)min((long long)R, N - n0);
  const typename X::S* xr = x + (xi[p] * M + m) * K;
  const long long chunks = C / LW, first = wi[p] * N + n0;
  const typename CH::T* wr = reinterpret_cast<const typename CH::T*>(w) + first * chunks;
  const typename SC::S* sr = scales + first * G;
  const typename SC::S* br = has_b ? biases + first * G : nullptr;
  const int gshift = __ffs(gs) - 1;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (long long c = threadIdx.x; c < chunks; c += blockDim.x) {
    typename CH::T u[R];
#pragma unroll
    for (int r = 0; r < R; ++r) u[r] = r < rows ? __ldg(wr + r * chunks + c) : CH::zero();
    const long long k0 = c * V;
    float d[R], sx = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) d[r] = 0.f;
#pragma unroll
    for (int q8 = 0; q8 < V / 8; ++q8) {
      float xv[8];
      load8<X>(xr + k0 + q8 * 8, xv);
#pragma unroll
      for (int i = 0; i < 8; ++i) sx += xv[i];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int v = q8 * 8 + i, at = (v % PER) * BITS, to = 23 - BITS;
          const unsigned int word = CH::word(u[r], v / PER);
          float f;
          if (EXACT) {  // q itself: 2^23 + q, minus 2^23
            f = __uint_as_float(((word >> at) & ((1u << BITS) - 1u)) | 0x4b000000u) - 8388608.f;
          } else {
            const unsigned int moved = to >= at ? word << (to - at) : word >> (at - to);
            f = __uint_as_float((moved & FIELD) | 0x3f800000u);
          }
          d[r] = fmaf(xv[i], f, d[r]);
        }
      }
    }
    const long long g = k0 >> gshift;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {
        const float sc = SC::load(sr[r * G + g]), su = EXACT ? sc : sc * UNIT;
        const float b = has_b ? SC::load(br[r * G + g]) : 0.f;
        acc[r] = fmaf(su, d[r], fmaf(EXACT ? b : b - su, sx, acc[r]));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float a = acc[r];
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) partial[wid][r] = a;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float t = 0.f;
    for (int j = 0; j < (int)(blockDim.x >> 5); ++j) t += partial[j][threadIdx.x];
    out[(p * M + m) * N + n0 + threadIdx.x] = X::store(t);
  }
}
"""

_FAST = [(2, 0), (4, 0), (8, 0), (4, 1), (8, 2)]
#: Output rows per block of qmm_t4 (its ROWS): 64, or 8 where 64 would leave the GPU's
#: multiprocessors idle (a decode-shaped product of 4096 rows is 64 blocks of 64 rows:
#: measured on an H200, the kernel then read its weights at ~160 GB/s).
_ROWS, _FEW_ROWS, _ENOUGH_BLOCKS = 64, 8, 1024
#: qmm_dec: the widths it takes, and the most rows of x (P * M) it serves (each row of x
#: reads the weights again, from L2 after the first; past a few rows qmm_t4 is cheaper).
_DEC_BITS, _DEC_ROWS = (2, 4, 8), 16
#: qmm_dec's variants, (output rows per block R, packed words per load LW), the first
#: launched where its chunk of 32 LW / BITS values fits in a group, else the second.
#: Many threads in flight matter most for a decode-shaped product: measured on an H200
#: (4096 x 4096 4-bit rows, 16 weights cycled, GPU time against a copy of the same
#: bytes), R = 4, LW = 4 read at 0.78 of the copy's bandwidth; (8, 4) 0.58, (8, 2)
#: 0.61, (4, 2) 0.68, (2, 2) 0.61, (16, 4) 0.45; qmm_t4 0.47.
_DEC_VARIANTS = ((4, 4), (4, 2))
_DEC = _DEC_VARIANTS[0]
#: x's (and the output's) element type -> its struct in DTYPE_STRUCTS and the view the
#: kernel takes; scales and biases are read in x's type when they have it, else float32.
_X = {n: k for n, k in DTYPE_STRUCT_OF.items() if n != "float64"}
_PAIRS_OF_TYPES = [(x, x) for x in ("F32", "F16", "BF16")] + [("F16", "F32"), ("BF16", "F32")]
_KERNEL = CudaKernel(
    DTYPE_STRUCTS + _SOURCE, "lazyx.backends.cuda.quantized",
    name_expressions=[f"{k}<{x}, {sc}>" for k in ("qmm_t", "qmm_n") for x, sc in _PAIRS_OF_TYPES]
    + [f"qmm_t4<{b}, {m}, {x}, {sc}>" for b, m in _FAST for x, sc in _PAIRS_OF_TYPES]
    + [f"qmm_dec<{b}, {r}, {lw}, {x}, {sc}>" for b in _DEC_BITS for r, lw in _DEC_VARIANTS
       for x, sc in _PAIRS_OF_TYPES])
_MODE = {"affine": 0, "mxfp4": 1, "nvfp4": 1, "mxfp8": 2}
_E4M3 = []


def _scales(scales, mode):
    """Scales the kernels read: affine ones as stored, E8M0 / E4M3 codes decoded to
    float32."""
    if mode == "affine":
        return cp.ascontiguousarray(scales)
    if mode == "nvfp4":
        if not _E4M3:
            _E4M3.append(cp.asarray(ref.scale_values(np.arange(256, dtype=np.uint8), "nvfp4")))
        return _E4M3[0][scales.astype(cp.int32)]
    e = scales.astype(cp.int32)
    return cp.ldexp(cp.ones(e.shape, cp.float32), cp.maximum(e, 1) - 127 - (e == 0))


#: Launches of :func:`_run` by the call's layout: ``key -> (function, grid, block, shared
#: memory, output shape, trailing scalar arguments)``, for calls whose operands the kernels
#: read as they are (a decode-shaped product costs a few µs of GPU time: the host's
#: per-call work is what a call costs, so it is done once per layout).
_LAUNCHES: dict = {}


def _run(p, x, weights, xi, wi):
    """``out[p] = x[xi[p]] @ W(wi[p])`` in x's dtype (float32, float16 or bfloat16 read and
    written as they are: a conversion per operand would cost a launch each per call)."""
    key = (p.bits, p.group_size, p.mode, p.transpose, x.shape, x.dtype, len(xi),
           *[(w.shape, w.dtype) for w in weights])
    plan = _LAUNCHES.get(key)
    if (plan is not None and x.flags.c_contiguous and all(w.flags.c_contiguous for w in weights)
            and not (x.data.ptr | weights[0].data.ptr) & 15):
        fn, grid, block, shared, shape, tail = plan
        out = cp.empty(shape, x.dtype)
        fn(grid, block, (x, weights[0], weights[1], weights[-1], xi, wi, out) + tail,
           shared_mem=shared)
        return out
    return _run_planned(p, x, weights, xi, wi, key)


def _run_planned(p, x, weights, xi, wi, key):
    xt = _X.get(numpy_name(x.dtype))
    if xt is None:  # float64 and the rest: through float32
        return _run(p, x.astype(cp.float32), weights, xi, wi).astype(x.dtype)
    w = weights[0] if weights[0].dtype == cp.uint32 else weights[0].astype(cp.uint32)
    w = cp.ascontiguousarray(w).reshape((-1,) + w.shape[-2:])
    sc = _scales(weights[1], p.mode)
    bi = cp.ascontiguousarray(weights[2]) if len(weights) > 2 else None
    if sc.dtype != x.dtype or (bi is not None and bi.dtype != x.dtype):
        sc = sc.astype(cp.float32)
        bi = None if bi is None else bi.astype(cp.float32)
    st = _X[numpy_name(sc.dtype)]
    # Operands the kernel reads as given (no conversion, no copy): later calls of this
    # layout launch from _LAUNCHES.
    as_given = (w.data.ptr == weights[0].data.ptr and sc.data.ptr == weights[1].data.ptr
                and (bi is None or bi.data.ptr == weights[2].data.ptr)
                and weights[0].dtype == cp.uint32 and x.flags.c_contiguous)
    sc = as_view(sc.reshape((-1,) + weights[1].shape[-2:]), st[1])
    bi = None if bi is None else as_view(bi.reshape(sc.shape), st[1])
    x = cp.ascontiguousarray(x)
    n = p.columns(w.shape)
    k = x.shape[-1]
    P, M = len(xi), x.shape[1]
    out = cp.empty((P, M, n), x.dtype)
    total = P * M * n
    if total:
        types = f"{xt[0]}, {st[0]}"
        tail = (np.int64(P), np.int64(M), np.int64(k), np.int64(n), np.int64(w.shape[-1]),
                np.int64(sc.shape[-1]), np.int32(p.bits), np.int32(p.group_size),
                np.int32(_MODE[p.mode]), np.int64(x.shape[0]), np.int64(w.shape[0]),
                np.int32(bi is not None))
        args = (as_view(x, xt[1]), w, sc, bi if bi is not None else sc, xi, wi, as_view(out, xt[1]))
        threads = total * 32 if p.transpose else total
        block = (256,)
        fast = (p.bits, _MODE[p.mode])
        rows, lw = _DEC if 32 * _DEC[1] // p.bits <= p.group_size else _DEC_VARIANTS[1]
        if (p.transpose and p.mode == "affine" and p.bits in _DEC_BITS and P * M <= _DEC_ROWS
                and 32 * lw // p.bits <= p.group_size and w.shape[-1] % lw == 0 and k % 8 == 0
                and not (w.data.ptr | x.data.ptr) & 15):
            fn = _KERNEL.function(f"qmm_dec<{p.bits}, {rows}, {lw}, {types}>")
            chunks = w.shape[-1] // lw
            grid, block, shared = (-(-n // rows), P * M), (min(256, -(-chunks // 32) * 32),), 0
            tail = tail[:6] + (np.int32(p.group_size), tail[-1])
        # x rows staged as float32 in shared memory (K + G floats)
        elif p.transpose and fast in _FAST and (k + sc.shape[-1]) * 4 <= 48 * 1024:
            fn = _KERNEL.function(f"qmm_t4<{fast[0]}, {fast[1]}, {types}>")
            rows = _ROWS if -(-n // _ROWS) * P * M >= _ENOUGH_BLOCKS else _FEW_ROWS
            grid, shared = ((n + rows - 1) // rows, P * M), (k + sc.shape[-1]) * 4
            tail = tail[:6] + (np.int32(p.group_size), tail[-1], np.int32(rows))
        else:
            fn = _KERNEL.function(f"{'qmm_t' if p.transpose else 'qmm_n'}<{types}>")
            grid, shared = ((threads + block[0] - 1) // block[0],), 0
        fn(grid, block, args + tail, shared_mem=shared)
        if as_given and len(_LAUNCHES) < 1024:
            _LAUNCHES[key] = (fn, grid, block, shared, out.shape, tail)
    return out


#: {(x's batch shape, w's batch shape): (batch, x indices, w indices) on the device}: the
#: same layouts recur every step, and a host-to-device copy per call costs more than
#: a decode-shaped product.
_PAIRS: dict = {}


def _batch_pairs(xlead: tuple, wlead: tuple):
    got = _PAIRS.get((xlead, wlead))
    if got is None:
        batch, xi, wi = q.batch_pairs(xlead, wlead)
        got = (batch, cp.asarray(xi), cp.asarray(wi))
        if len(_PAIRS) < 256:
            _PAIRS[(xlead, wlead)] = got
    return got


def quantized_matmul(p, ins):
    x = ins[0]
    batch, xi, wi = _batch_pairs(x.shape[:-2], ins[1].shape[:-2])
    out = _run(p, x.reshape((-1,) + x.shape[-2:]), ins[1:], xi, wi)
    return out.reshape(batch + out.shape[-2:])


def gather_qmm(p, ins):
    x, lhs, rhs = ins[0], ins[-2], ins[-1]
    xi, wi = lhs.astype(cp.int64).ravel(), rhs.astype(cp.int64).ravel()
    q.check_gather_pairs(xi, wi, x.shape[0], int(np.prod(ins[1].shape[:-2])))
    out = _run(p, x, ins[1:-2], xi, wi)
    return out.reshape(rhs.shape + out.shape[-2:])


KERNELS = {
    q.QuantizedMatmul: quantized_matmul,
    q.GatherQMM: gather_qmm,
    q.Quantize: on_host(ref.KERNELS[q.Quantize]),
    q.Dequantize: on_host(ref.KERNELS[q.Dequantize]),
}
