// Native kernels of the `fast` op pack: norms (forward and fused backward), rotary
// embeddings, attention, and cross entropy.
//
// The row kernels work on contiguous rows of the last axis, one pass per row over
// data that stays in L1/L2 between its two sweeps (a statistic, then the output),
// rows split over the thread pool (parallel.h). float16 and bfloat16 arrive as
// uint16 views and compute in float32 (simd.h's and lanes.h's typed loads); the
// Python side (backends/cpu/native_packs/fast.py) allocates outputs and serves
// float64 and other layouts with the NumPy kernels. The norms' forward kernels
// use lanes.h's native-width vectors and write outputs larger than the cache
// with streaming stores.
//
// Attention (namespace attn) is one flash-style kernel: packed K/V panels,
// register-blocked micro-GEMMs and an online softmax over key blocks, tasks of
// query blocks over both cores; it reads q, k, v through their strides. Its
// backward (attention_vjp) is FlashAttention-2's on the same micro-GEMMs: the
// scores recomputed per block from each row's softmax statistics, tasks of
// (batch, kv head, chunk of keys).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lanes.h"
#include "packs.h"
#include "parallel.h"
#include "simd.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lazyx {
namespace {


constexpr float kMasked = -3.4028234663852886e+38f;  // finfo(float32).min, MLX's masked score

template <class A>
size_t rows_of(const A& x, size_t n, const char* name) {
  if (n == 0 || x.size() % n != 0)
    throw nb::value_error((std::string("[") + name + "] Row length " + std::to_string(n) +
                           " does not divide the input size " + std::to_string(x.size()) + ".").c_str());
  return x.size() / n;
}

template <class A>
void need(const A& a, size_t size, const char* name, const char* what) {
  if (a.size() != size)
    throw nb::value_error((std::string("[") + name + "] " + what + " has " + std::to_string(a.size()) +
                           " elements, expected " + std::to_string(size) + ".").c_str());
}


// The norms' forward kernels on native-width vectors (lanes.h); IO is simd.h's
// element type, Lanes<IO> its lanes.h twin.
template <class IO> struct Lanes;
template <> struct Lanes<F32> { using type = lanes::F32; };
template <> struct Lanes<F16> { using type = lanes::F16; };
template <> struct Lanes<BF16> { using type = lanes::BF16; };

// out[i] = f(x, w, b) over a row, L elements at a time; missing weights read 1/0.
// `stream`: write with store_stream where the row is aligned for it.
template <class IO, class F>
void row_apply(const typename IO::T* x, const typename IO::T* w, const typename IO::T* b,
               typename IO::T* out, size_t n, bool stream, F f) {
  using lanes::L, lanes::vn, lanes::splat;
  size_t i = 0;
  if (stream && reinterpret_cast<uintptr_t>(out) % (L * sizeof(typename IO::T)) == 0) {
    for (; i + L <= n; i += L)
      lanes::store_stream<IO>(out + i, f(IO::load(x + i), w ? IO::load(w + i) : splat(1.0f),
                                         b ? IO::load(b + i) : splat(0.0f)));
  }
  for (; i + L <= n; i += L)
    IO::store(out + i, f(IO::load(x + i), w ? IO::load(w + i) : splat(1.0f), b ? IO::load(b + i) : splat(0.0f)));
  if (i < n) {
    const size_t k = n - i;
    const vn v = f(lanes::load_partial<IO>(x + i, k, 0.0f), w ? lanes::load_partial<IO>(w + i, k, 1.0f) : splat(1.0f),
                   b ? lanes::load_partial<IO>(b + i, k, 0.0f) : splat(0.0f));
    lanes::store_partial<IO>(out + i, v, k);
  }
}

// Sums of d = x - k and of d^2 over a row, in four pairs of float32 lane
// accumulators whose totals are added in double.
template <class IO>
void row_shifted_sums(const typename IO::T* x, size_t n, float k, double& s, double& q) {
  using lanes::L, lanes::vn, lanes::splat;
  const vn kv = splat(k);
  vn s0 = splat(0.0f), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    const vn a = IO::load(x + i) - kv, b = IO::load(x + i + L) - kv;
    const vn c = IO::load(x + i + 2 * L) - kv, d = IO::load(x + i + 3 * L) - kv;
    s0 += a, s1 += b, s2 += c, s3 += d;
    q0 += a * a, q1 += b * b, q2 += c * c, q3 += d * d;
  }
  for (; i + L <= n; i += L) {
    const vn a = IO::load(x + i) - kv;
    s0 += a, q0 += a * a;
  }
  if (i < n) {
    const vn a = lanes::load_partial<IO>(x + i, n - i, k) - kv;  // missing lanes read k: d = 0
    s1 += a, q1 += a * a;
  }
  const vn sv = (s0 + s1) + (s2 + s3), qv = (q0 + q1) + (q2 + q3);
  s = q = 0.0;
  for (int j = 0; j < L; ++j) s += sv[j], q += qv[j];
}

// One read of a row for its statistic and one (from cache) for the output.
template <class IO>
void rms_norm(const typename IO::T* x, const typename IO::T* w, typename IO::T* out, size_t rows, size_t n,
              float eps) {
  using LIO = typename Lanes<IO>::type;
  const bool stream = rows * n * sizeof(typename IO::T) >= lanes::kStreamBytes;
  parallel_for(rows, n, [=](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const typename IO::T* xr = x + r * n;
      double sum, sq;
      row_shifted_sums<LIO>(xr, n, 0.0f, sum, sq);
      const float s = 1.0f / std::sqrt(float(sq / double(n)) + eps);
      row_apply<LIO>(xr, w, nullptr, out + r * n, n, stream, [s](lanes::vn v, lanes::vn wv, lanes::vn) { return v * s * wv; });
    }
    if (stream) lanes::stream_fence();
  });
}

// Mean and variance in the one sweep of row_shifted_sums: shifting by a sample
// of the row (its first element) keeps E[d^2] - E[d]^2 free of the cancellation
// that a mean large beside the spread would cause.
template <class IO>
void layer_norm(const typename IO::T* x, const typename IO::T* w, const typename IO::T* b, typename IO::T* out,
                size_t rows, size_t n, float eps) {
  using LIO = typename Lanes<IO>::type;
  const bool stream = rows * n * sizeof(typename IO::T) >= lanes::kStreamBytes;
  parallel_for(rows, n, [=](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const typename IO::T* xr = x + r * n;
      const float k = LIO::scalar(xr[0]);
      double sum, sq;
      row_shifted_sums<LIO>(xr, n, k, sum, sq);
      const double md = sum / double(n);
      const float mu = float(double(k) + md);
      const float var = float(std::max(0.0, sq / double(n) - md * md));
      const float s = 1.0f / std::sqrt(var + eps);
      row_apply<LIO>(xr, w, b, out + r * n, n, stream,
                     [mu, s](lanes::vn v, lanes::vn wv, lanes::vn bv) { return (v - mu) * s * wv + bv; });
    }
    if (stream) lanes::stream_fence();
  });
}

// The fused backward of the norms. Rows are cut into parts, one partial weight
// (and bias) cotangent per part in float32, summed at the end in double. A row's
// statistic is the forward's (row_shifted_sums); one vector sweep forms xn = (x -
// mu) s and gw = g w (kept in float32 rows that stay in L1), the two row means the
// cotangent needs and the part's weight and bias sums; a second writes dx.
constexpr size_t kParts = 16;

template <class IO, bool kLayer>
void norm_vjp(const typename IO::T* x, const typename IO::T* w, const typename IO::T* g, typename IO::T* dx,
              float* dw, float* db, size_t rows, size_t n, float eps) {
  using LIO = typename Lanes<IO>::type;
  using lanes::L, lanes::vn, lanes::splat;
  const size_t parts = std::min(rows, kParts);
  const size_t np = (n + L - 1) / L * L;  // rows of the float32 buffers: whole vectors
  std::vector<float> pw(dw ? parts * np : 0, 0.0f), pb(db ? parts * np : 0, 0.0f);
  parallel_for(parts, (rows / std::max<size_t>(parts, 1) + 1) * n * 3, [&](size_t pbeg, size_t pend) {
    std::vector<float> xn(np), gw(np);
    for (size_t part = pbeg; part < pend; ++part) {
      const size_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
      float* accw = dw ? pw.data() + part * np : nullptr;
      float* accb = db ? pb.data() + part * np : nullptr;
      for (size_t r = r0; r < r1; ++r) {
        const typename IO::T* xr = x + r * n;
        const typename IO::T* gr = g + r * n;
        const float k = kLayer ? LIO::scalar(xr[0]) : 0.0f;
        double sum, sq;
        row_shifted_sums<LIO>(xr, n, k, sum, sq);
        const double md = kLayer ? sum / double(n) : 0.0;
        const float mu = float(double(k) + md);
        const float var = float(std::max(0.0, sq / double(n) - md * md));
        const float s = 1.0f / std::sqrt(var + eps);
        const vn muv = splat(mu), sv = splat(s);
        vn sg = splat(0.0f), sgx = sg;
        for (size_t i = 0; i < n; i += L) {
          const size_t kk = std::min<size_t>(L, n - i);
          vn xv, gv, wv = splat(1.0f);
          if (kk == size_t(L)) {
            xv = LIO::load(xr + i), gv = LIO::load(gr + i);
            if (w) wv = LIO::load(w + i);
          } else {  // the tail: missing lanes carry g = 0, so they add nothing
            xv = lanes::load_partial<LIO>(xr + i, kk, mu), gv = lanes::load_partial<LIO>(gr + i, kk, 0.0f);
            if (w) wv = lanes::load_partial<LIO>(w + i, kk, 1.0f);
          }
          const vn xnv = (xv - muv) * sv, gwv = gv * wv;
          lanes::F32::store(xn.data() + i, xnv);
          lanes::F32::store(gw.data() + i, gwv);
          sg += gwv;
          sgx += gwv * xnv;
          if (accw) lanes::F32::store(accw + i, lanes::F32::load(accw + i) + gv * xnv);
          if (accb) lanes::F32::store(accb + i, lanes::F32::load(accb + i) + gv);
        }
        double sum_gw = 0.0, sum_gwxn = 0.0;
        for (int j = 0; j < L; ++j) sum_gw += sg[j], sum_gwxn += sgx[j];
        const vn mg = splat(kLayer ? float(sum_gw / double(n)) : 0.0f), mgx = splat(float(sum_gwxn / double(n)));
        typename IO::T* dr = dx + r * n;
        size_t i = 0;
        for (; i + L <= n; i += L)
          LIO::store(dr + i, sv * (lanes::F32::load(gw.data() + i) - mg - lanes::F32::load(xn.data() + i) * mgx));
        if (i < n)
          lanes::store_partial<LIO>(
              dr + i, sv * (lanes::F32::load(gw.data() + i) - mg - lanes::F32::load(xn.data() + i) * mgx), n - i);
      }
    }
  });
  for (size_t i = 0; i < n; ++i) {
    double tw = 0.0, tb = 0.0;
    for (size_t part = 0; part < parts; ++part) {
      if (dw) tw += pw[part * np + i];
      if (db) tb += pb[part * np + i];
    }
    if (dw) dw[i] = float(tw);
    if (db) db[i] = float(tb);
  }
}

// Rotary embedding of rows of D features: row r is position t = r % T of batch
// b = r / per_batch; its angles are cos/sin[(b if tables > 1) * T + t, 0:dims/2].
template <class IO>
void rope(const typename IO::T* x, typename IO::T* out, const float* cs, const float* sn, size_t rows, size_t T,
          size_t per_batch, size_t tables, size_t D, size_t dims, bool traditional) {
  using Tp = typename IO::T;
  const size_t half = dims / 2;
  parallel_for(rows, D, [=](size_t rb, size_t re) {
    std::vector<float> buf(D);
    for (size_t r = rb; r < re; ++r) {
      const size_t tb = tables > 1 ? r / per_batch : 0;
      const size_t row = tb * T + r % T;
      const float* c = cs + row * half;
      const float* s = sn + row * half;
      const Tp* xr = x + r * D;
      Tp* yr = out + r * D;
      if (!traditional && half % W == 0) {
        for (size_t i = 0; i < half; i += W) {
          const vf x1 = IO::load(xr + i), x2 = IO::load(xr + half + i);
          const vf cv = F32::load(c + i), sv = F32::load(s + i);
          IO::store(yr + i, x1 * cv - x2 * sv);
          IO::store(yr + half + i, x1 * sv + x2 * cv);
        }
      } else {
        for (size_t i = 0; i < D; i += W) {
          const size_t k = std::min<size_t>(W, D - i);
          const vf v = IO::load_partial(xr + i, k, 0.0f);
          for (size_t j = 0; j < k; ++j) buf[i + j] = v[j];
        }
        for (size_t i = 0; i < half; ++i) {
          const size_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
          const float x1 = buf[a], x2 = buf[b];
          buf[a] = x1 * c[i] - x2 * s[i];
          buf[b] = x1 * s[i] + x2 * c[i];
        }
        for (size_t i = 0; i < D; i += W) {
          const size_t k = std::min<size_t>(W, D - i);
          IO::store_partial(yr + i, F32::load_partial(buf.data() + i, k, 0.0f), k);
        }
      }
      // features past dims pass through (the scalar path copied them with the row)
      if (!traditional && half % W == 0 && dims < D) std::copy(xr + dims, xr + D, yr + dims);
    }
  });
}

// The mask of attention, 4-d with element strides (0 on broadcast dimensions).
struct Mask {
  const uint8_t* boolean = nullptr;
  const float* additive = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

// -- attention: one flash-style kernel --------------------------------------
// Keys and values are first packed once per (batch, kv head) into float32
// panels: K transposed in panels of NC keys (Kp[key / NC][d][key % NC]) and V
// with rows padded to a multiple of NC, zeros in the padding. Then each task,
// one query head's block of QB query rows, walks the keys in blocks of KB:
// S = (scale q) K^T by register-blocked MR x NC tiles, the mask, an online
// softmax (running max m and sum l per row; the output rows rescaled when m
// grows), O += P V by MR x NC tiles; at the end out = O / l. Tasks split over
// the thread pool; only a task's S (QB x KB) is held. A causal row reads only
// the keys up to its diagonal (the rest weigh exp(MASKED - m) = 0 exactly),
// and a block of query rows skips the key blocks past its last diagonal; a row
// that sees no key at all (Tq > Tk) scores every key MASKED and so averages
// them, as MLX does.
namespace attn {

using lanes::L, lanes::vn;
constexpr size_t NC = 2 * L;  // columns of a micro-tile: two vectors
constexpr size_t MR = 6;      // rows of a micro-tile: 2 * MR accumulators + 3 registers <= 16
constexpr size_t QB = 48;     // query rows per task
constexpr size_t KB = 256;    // keys per block

inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// c[r, :NC] (+)= sum_i A[r, i] b[i, :NC] for R rows: the micro-GEMM of every
// product (S = Q K^T from the packed K panel, O += P V, and the backward's),
// 2R accumulators in registers; A is rows (A[r, i] = a[r lda + i]) or
// kTransposed (A[r, i] = a[r + i lda]: the backward's P^T and dS^T); lda, ldb,
// ldc are row strides.
template <size_t R, bool kAccumulate, bool kTransposed>
inline void strided_gemm(const float* a, size_t lda, const float* b, size_t ldb, size_t k, float* c, size_t ldc) {
  vn c0[R], c1[R];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    c0[r] = kAccumulate ? lanes::F32::load(c + r * ldc) : lanes::splat(0.0f);
    c1[r] = kAccumulate ? lanes::F32::load(c + r * ldc + L) : lanes::splat(0.0f);
  }
  for (size_t i = 0; i < k; ++i) {
    const vn b0 = lanes::F32::load(b + i * ldb), b1 = lanes::F32::load(b + i * ldb + L);
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      const vn av = lanes::splat(kTransposed ? a[i * lda + r] : a[r * lda + i]);
      c0[r] += av * b0;
      c1[r] += av * b1;
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    lanes::F32::store(c + r * ldc, c0[r]);
    lanes::F32::store(c + r * ldc + L, c1[r]);
  }
}

// The micro-GEMM for rows = 1 ... MR (the last tile of a block may be short).
template <bool kAccumulate, bool kTransposed = false>
inline void micro_gemm_rows(size_t rows, const float* a, size_t lda, const float* b, size_t ldb, size_t k,
                            float* c, size_t ldc) {
  switch (rows) {
    case 6: strided_gemm<6, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
    case 5: strided_gemm<5, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
    case 4: strided_gemm<4, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
    case 3: strided_gemm<3, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
    case 2: strided_gemm<2, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
    default: strided_gemm<1, kAccumulate, kTransposed>(a, lda, b, ldb, k, c, ldc); break;
  }
}
static_assert(MR == 6, "micro_gemm_rows dispatches 1 ... 6 rows");

// A 4-d operand: its data and element strides.
template <class T>
struct View {
  const T* data;
  int64_t s[4];
  const T* at(size_t b, size_t h, size_t t) const { return data + int64_t(b) * s[0] + int64_t(h) * s[1] + int64_t(t) * s[2]; }
};

struct Shape {
  size_t B, Hq, Hkv, Tq, Tk, D, Dv;
};

// Keys (or values) transposed into panels of NC rows, the micro-GEMMs' B
// operand for products with their rows: dst[bh][j / NC][d][j % NC] (Tn rows
// rounded up to NC, zeros past Tn), per (batch, head) bh of x[B, H, Tn, D].
template <class IO>
void pack_panels(View<typename IO::T> x, size_t B, size_t H, size_t Tn, size_t D, float* dst) {
  using T = typename IO::T;
  const size_t Tnp = round_up(Tn, NC);
  parallel_for(B * H, Tn * D, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / H, h = bh % H;
      float* xp = dst + bh * Tnp * D;
      for (size_t j0 = 0; j0 < Tnp; j0 += NC)
        for (size_t jj = 0; jj < NC; ++jj) {
          const size_t j = j0 + jj;
          float* out = xp + j0 * D + jj;
          if (j < Tn) {
            const T* src = x.at(b, h, j);
            for (size_t d = 0; d < D; ++d) out[d * NC] = IO::scalar(src[d * x.s[3]]);
          } else {
            for (size_t d = 0; d < D; ++d) out[d * NC] = 0.0f;
          }
        }
    }
  });
}

// Rows of x[B, H, Tn, D] as float32 rows padded with zeros to Dp = round_up(D, NC)
// columns (the B operand of products over them): dst[bh][j][d], times `mul`.
template <class IO>
inline void load_row(const typename IO::T* src, int64_t stride, size_t D, size_t Dp, float mul, float* dst) {
  size_t d = 0;
  if (stride == 1)
    for (; d + L <= D; d += L) lanes::F32::store(dst + d, IO::load(src + d) * mul);
  for (; d < D; ++d) dst[d] = IO::scalar(src[int64_t(d) * stride]) * mul;
  for (; d < Dp; ++d) dst[d] = 0.0f;
}

template <class IO>
void pack_rows(View<typename IO::T> x, size_t B, size_t H, size_t Tn, size_t D, float* dst) {
  const size_t Dp = round_up(D, NC);
  parallel_for(B * H, Tn * D, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh)
      for (size_t j = 0; j < Tn; ++j)
        load_row<IO>(x.at(bh / H, bh % H, j), x.s[3], D, Dp, 1.0f, dst + (bh * Tn + j) * Dp);
  });
}

// n floats of src times mul, written as T.
template <class IO>
inline void store_row(const float* src, size_t n, float mul, typename IO::T* dst) {
  size_t d = 0;
  for (; d + L <= n; d += L) IO::store(dst + d, lanes::F32::load(src + d) * mul);
  for (; d < n; ++d) dst[d] = IO::from_float(src[d] * mul);
}

// The forward's loop over tasks, from K packed by pack_panels and V by
// pack_rows. kStats (the backward's first pass): no output, only each row's
// softmax statistics, stats[2 row] = max m and stats[2 row + 1] = 1 / l, so
// that P = exp(S - m) / l (row = (b Hq + h) Tq + t).
template <class IO, bool kStats>
void attend(View<typename IO::T> q, const float* kpack, const float* vpack, typename IO::T* out, float* stats,
            const Shape& sh, float scale, bool causal, const Mask& mask, const float* sinks) {
  using T = typename IO::T;
  const size_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, Tq = sh.Tq, Tk = sh.Tk, D = sh.D, Dv = sh.Dv;
  const size_t G = Hq / Hkv;
  const int64_t off = int64_t(Tk) - int64_t(Tq);  // causal: query t sees keys j <= t + off
  const size_t Tkp = round_up(Tk, NC), Dvp = round_up(Dv, NC);
  const size_t nqb = (Tq + QB - 1) / QB;
  parallel_for(B * Hq * nqb, QB * Tk * (kStats ? D : D + Dv), [&](size_t begin, size_t end) {
    std::vector<float> qs(QB * D), s(QB * KB), o(kStats ? 0 : QB * Dvp), m(QB), l(QB);
    std::vector<size_t> lim(QB);
    for (size_t task = begin; task < end; ++task) {
      const size_t qb = task % nqb, h = (task / nqb) % Hq, b = task / (nqb * Hq), hk = h / G;
      const size_t t0 = qb * QB, rows = std::min(QB, Tq - t0);
      for (size_t i = 0; i < rows; ++i) {
        const T* src = q.at(b, h, t0 + i);
        for (size_t d = 0; d < D; ++d) qs[i * D + d] = IO::scalar(src[d * q.s[3]]) * scale;
      }
      // Rows that see no key (causal, t + off < 0) read every key, all MASKED.
      const bool blind = causal && int64_t(t0) + off < 0;
      size_t kend = Tk;
      if (causal && !blind) kend = size_t(std::min<int64_t>(int64_t(Tk), int64_t(t0 + rows) + off));
      const float sink = sinks ? sinks[h] : -kInf;
      for (size_t i = 0; i < rows; ++i) {
        m[i] = sink;
        l[i] = sink > -kInf ? 1.0f : 0.0f;  // exp(sink - m)
      }
      if constexpr (!kStats) std::fill(o.begin(), o.begin() + rows * Dvp, 0.0f);
      const float* kp = kpack + (b * Hkv + hk) * Tkp * D;
      for (size_t k0 = 0; k0 < kend; k0 += KB) {
        const size_t kn = std::min(KB, kend - k0);
        // keys of this block each row reads (the rest weigh 0)
        for (size_t i = 0; i < rows; ++i) {
          const int64_t t = int64_t(t0 + i);
          lim[i] = kn;
          if (causal && t + off >= 0) lim[i] = size_t(std::clamp<int64_t>(t + off + 1 - int64_t(k0), 0, int64_t(kn)));
        }
        for (size_t r0 = 0; r0 < rows; r0 += MR) {
          const size_t rr = std::min(MR, rows - r0);
          size_t need = 0;
          for (size_t i = r0; i < r0 + rr; ++i) need = std::max(need, lim[i]);
          for (size_t c = 0; c < need; c += NC)
            micro_gemm_rows<false>(rr, qs.data() + r0 * D, D, kp + (k0 + c) * D, NC, D, s.data() + r0 * KB + c, KB);
        }
        for (size_t i = 0; i < rows; ++i) {
          float* row = s.data() + i * KB;
          const size_t n = lim[i];
          const int64_t t = int64_t(t0 + i);
          if (causal && t + off < 0) {
            for (size_t j = 0; j < n; ++j) row[j] = kMasked;
          } else if (mask.boolean || mask.additive) {
            const int64_t base = int64_t(b) * mask.stride[0] + int64_t(h) * mask.stride[1] + t * mask.stride[2] +
                                 int64_t(k0) * mask.stride[3];
            const int64_t sj = mask.stride[3];
            if (mask.boolean) {
              for (size_t j = 0; j < n; ++j)
                if (!mask.boolean[base + int64_t(j) * sj]) row[j] = kMasked;
            } else {
              for (size_t j = 0; j < n; ++j) row[j] += mask.additive[base + int64_t(j) * sj];
            }
          }
          float mx = m[i];
          size_t j = 0;
          if (n >= L) {
            vn mv = lanes::splat(mx);
            for (; j + L <= n; j += L) mv = lanes::vmax(mv, lanes::F32::load(row + j));
            mx = lanes::hmax(mv);
          }
          for (; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
          if (n == 0 || mx == -kInf) {
            // nothing to add: a causal row past its diagonal, or scores all -inf so
            // far (an additive mask; a row that stays so ends 0 / 0 = NaN, as MLX)
            std::fill(row, row + kn, 0.0f);
            continue;
          }
          const float alpha = std::exp(m[i] - mx);  // 0 when m was -inf
          const vn mm = lanes::splat(mx);
          vn acc = lanes::splat(0.0f);
          for (j = 0; j + L <= n; j += L) {
            const vn e = lanes::exp_nonpositive(lanes::F32::load(row + j) - mm);
            acc += e;
            lanes::F32::store(row + j, e);
          }
          float sum = lanes::hsum(acc);
          for (; j < n; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          std::fill(row + n, row + kn, 0.0f);
          l[i] = l[i] * alpha + sum;
          m[i] = mx;
          if constexpr (!kStats) {
            if (alpha != 1.0f) {
              float* orow = o.data() + i * Dvp;
              for (size_t d = 0; d < Dvp; ++d) orow[d] *= alpha;
            }
          }
        }
        if constexpr (!kStats) {
          const float* vp = vpack + (b * Hkv + hk) * Tk * Dvp;
          for (size_t r0 = 0; r0 < rows; r0 += MR) {
            const size_t rr = std::min(MR, rows - r0);
            size_t need = 0;
            for (size_t i = r0; i < r0 + rr; ++i) need = std::max(need, lim[i]);
            if (need == 0) continue;
            for (size_t c = 0; c < Dvp; c += NC)
              micro_gemm_rows<true>(rr, s.data() + r0 * KB, KB, vp + k0 * Dvp + c, Dvp, need,
                                    o.data() + r0 * Dvp + c, Dvp);
          }
        }
      }
      for (size_t i = 0; i < rows; ++i) {
        const size_t row = (b * Hq + h) * Tq + t0 + i;
        if constexpr (kStats) {
          stats[2 * row] = m[i];
          stats[2 * row + 1] = 1.0f / l[i];
        } else {
          store_row<IO>(o.data() + i * Dvp, Dv, 1.0f / l[i], out + row * Dv);
        }
      }
    }
  });
}

template <class IO>
void attention(View<typename IO::T> q, View<typename IO::T> k, View<typename IO::T> v, typename IO::T* out,
               const Shape& sh, float scale, bool causal, const Mask& mask, const float* sinks) {
  std::vector<float> kpack(sh.B * sh.Hkv * round_up(sh.Tk, NC) * sh.D), vpack(sh.B * sh.Hkv * sh.Tk * round_up(sh.Dv, NC));
  pack_panels<IO>(k, sh.B, sh.Hkv, sh.Tk, sh.D, kpack.data());
  pack_rows<IO>(v, sh.B, sh.Hkv, sh.Tk, sh.Dv, vpack.data());
  attend<IO, false>(q, kpack.data(), vpack.data(), out, nullptr, sh, scale, causal, mask, sinks);
}

// -- attention's backward: FlashAttention-2's, on the CPU --------------------
// Given the forward's output O and its cotangent dO, with S = scale q k^T (+
// mask) and P = softmax(S): D_t = rowsum(dO_t * O_t), dP = dO V^T,
// dS = P * (dP - D), dq = scale dS K, dk = scale dS^T q, dv = P^T dO; the
// sinks' cotangent is -sum_t P_sink,t D_t. Three passes:
// 1. K and V packed as the micro-GEMMs read them (panels of K and V, rows of K);
// 2. the forward's loop in stats mode: each row's max m and 1 / l;
// 3. tasks (batch, kv head, chunk of keys): each converts its G query heads'
//    scaled q, dO and D once, then walks its keys in blocks of KC, keeping the
//    block's dk and dv in float32; for each query head and block of QB2 rows it
//    recomputes S and dP (MR x NC tiles), forms P = exp(S - m) / l and dS in
//    place, and adds dq += dS K (into the task's float32 dq rows), dv += P^T dO
//    and dk += dS^T (scale q) (tiles whose A operand is read transposed). A
//    task owns its keys' dk/dv rows (the G query heads of a kv head sum there,
//    grouped-query attention needs nothing more); with one chunk per (batch, kv
//    head) it owns its dq rows too and writes them, else each chunk adds into
//    its own dq copy and a last pass sums the copies. A causal block of rows
//    skips the key blocks past its diagonal; masked scores (causal or boolean)
//    carry no gradient to q and k (dS = 0 there), as the masked value is a
//    constant.
constexpr size_t QB2 = 48;  // query rows per block of the backward
constexpr size_t KC = 128;  // keys per block of the backward

// c[:rows, :cols] (+)= A B in MR-row tiles, cols a multiple of NC; B's column
// block j / NC starts at b + (j / NC) b_col (panels: NC D; rows: NC).
template <bool kAccumulate, bool kTransposed>
void tile_gemm(size_t rows, size_t cols, const float* a, size_t lda, const float* b, size_t ldb, size_t b_col,
               size_t k, float* c, size_t ldc) {
  for (size_t r0 = 0; r0 < rows; r0 += MR) {
    const size_t rr = std::min(MR, rows - r0);
    const float* ap = a + (kTransposed ? r0 : r0 * lda);
    for (size_t j = 0; j < cols; j += NC) {
      const float* bp = b + (j / NC) * b_col;
      float* cp = c + r0 * ldc + j;
      micro_gemm_rows<kAccumulate, kTransposed>(rr, ap, lda, bp, ldb, k, cp, ldc);
    }
  }
}

template <class IO>
void attention_vjp(View<typename IO::T> q, View<typename IO::T> k, View<typename IO::T> v,
                   View<typename IO::T> o, View<typename IO::T> g, typename IO::T* dq, typename IO::T* dk,
                   typename IO::T* dv, float* dsinks, const Shape& sh, float scale, bool causal, const Mask& mask,
                   const float* sinks) {
  using T = typename IO::T;
  const size_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, Tq = sh.Tq, Tk = sh.Tk, D = sh.D, Dv = sh.Dv;
  const size_t G = Hq / Hkv;
  const int64_t off = int64_t(Tk) - int64_t(Tq);
  const size_t Tkp = round_up(Tk, NC), Dp = round_up(D, NC), Dvp = round_up(Dv, NC);
  std::vector<float> kpanel(B * Hkv * Tkp * D), vpanel(B * Hkv * Tkp * Dv), krows(B * Hkv * Tk * Dp);
  std::vector<float> stats(2 * B * Hq * Tq);
  pack_panels<IO>(k, B, Hkv, Tk, D, kpanel.data());
  pack_panels<IO>(v, B, Hkv, Tk, Dv, vpanel.data());
  pack_rows<IO>(k, B, Hkv, Tk, D, krows.data());
  attend<IO, true>(q, kpanel.data(), nullptr, nullptr, stats.data(), sh, scale, causal, mask, sinks);

  // Chunks of keys per (batch, kv head): enough tasks for the threads, else one.
  const size_t nkb = (Tk + KC - 1) / KC, heads = B * Hkv, threads = size_t(num_threads());
  const size_t chunks = heads >= 4 * threads ? 1 : std::min(nkb, (4 * threads + heads - 1) / heads);
  const size_t per = G * Tq * Dp;  // a task's dq rows
  std::vector<float> dq_parts(chunks > 1 ? chunks * heads * per : 0);
  parallel_for(heads * chunks, G * Tq * (Tk / chunks + 1) * (D + Dv) * 3, [&](size_t begin, size_t end) {
    std::vector<float> qs(per), go(G * Tq * Dvp), dd(G * Tq), dq_own(chunks == 1 ? per : 0);
    std::vector<float> sp(QB2 * KC), sd(QB2 * KC), dka(KC * Dp), dva(KC * Dvp);
    std::vector<size_t> lim(QB2);
    for (size_t task = begin; task < end; ++task) {
      const size_t c = task % chunks, bh = task / chunks, b = bh / Hkv, hk = bh % Hkv;
      float* dqa = chunks == 1 ? dq_own.data() : dq_parts.data() + (c * heads + bh) * per;
      std::fill(dqa, dqa + per, 0.0f);
      for (size_t gi = 0; gi < G; ++gi) {
        const size_t h = hk * G + gi;
        for (size_t t = 0; t < Tq; ++t) {
          const size_t r = gi * Tq + t;
          load_row<IO>(q.at(b, h, t), q.s[3], D, Dp, scale, qs.data() + r * Dp);
          load_row<IO>(g.at(b, h, t), g.s[3], Dv, Dvp, 1.0f, go.data() + r * Dvp);
          const T* orow = o.at(b, h, t);
          float sum = 0.0f;
          for (size_t d = 0; d < Dv; ++d) sum += go[r * Dvp + d] * IO::scalar(orow[d * o.s[3]]);
          dd[r] = sum;
        }
        if (dsinks && c == 0) {
          double acc = 0.0;
          const float* st = stats.data() + 2 * (b * Hq + h) * Tq;
          for (size_t t = 0; t < Tq; ++t)
            acc += double(std::exp(sinks[h] - st[2 * t]) * st[2 * t + 1]) * dd[gi * Tq + t];
          dsinks[b * Hq + h] = float(-acc);
        }
      }
      const float* kpb = kpanel.data() + bh * Tkp * D;
      const float* vpb = vpanel.data() + bh * Tkp * Dv;
      const float* krb = krows.data() + bh * Tk * Dp;
      for (size_t kb = nkb * c / chunks; kb < nkb * (c + 1) / chunks; ++kb) {
        const size_t j0 = kb * KC, kn = std::min(KC, Tk - j0);
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (size_t gi = 0; gi < G; ++gi) {
          const size_t h = hk * G + gi;
          for (size_t t0 = 0; t0 < Tq; t0 += QB2) {
            const size_t rows = std::min(QB2, Tq - t0);
            // keys of this block each row sees (a causal row that sees none: all, MASKED)
            size_t most = 0;
            for (size_t i = 0; i < rows; ++i) {
              const int64_t t = int64_t(t0 + i);
              lim[i] = kn;
              if (causal && t + off >= 0) lim[i] = size_t(std::clamp<int64_t>(t + off + 1 - int64_t(j0), 0, int64_t(kn)));
              most = std::max(most, lim[i]);
            }
            if (most == 0) continue;
            const size_t cols = round_up(most, NC);
            const float* qb = qs.data() + (gi * Tq + t0) * Dp;
            const float* gb = go.data() + (gi * Tq + t0) * Dvp;
            // S = (scale q) K^T and dP = dO V^T over the keys seen
            tile_gemm<false, false>(rows, cols, qb, Dp, kpb + j0 * D, NC, NC * D, D, sp.data(), KC);
            tile_gemm<false, false>(rows, cols, gb, Dvp, vpb + j0 * Dv, NC, NC * Dv, Dv, sd.data(), KC);
            for (size_t i = 0; i < rows; ++i) {
              const size_t t = t0 + i;
              float* pr = sp.data() + i * KC;
              float* dr = sd.data() + i * KC;
              const size_t n = lim[i];
              const float* st = stats.data() + 2 * ((b * Hq + h) * Tq + t);
              const float m = st[0], il = st[1], di = dd[gi * Tq + t];
              const bool blind = causal && int64_t(t) + off < 0;
              const uint8_t* mb = nullptr;
              int64_t base = 0, sj = 0;
              if (mask.boolean || mask.additive) {
                base = int64_t(b) * mask.stride[0] + int64_t(h) * mask.stride[1] + int64_t(t) * mask.stride[2] +
                       int64_t(j0) * mask.stride[3];
                sj = mask.stride[3];
              }
              if (blind) {
                for (size_t j = 0; j < n; ++j) pr[j] = kMasked;
              } else if (mask.boolean) {
                mb = mask.boolean + base;
                for (size_t j = 0; j < n; ++j)
                  if (!mb[int64_t(j) * sj]) pr[j] = kMasked;
              } else if (mask.additive) {
                for (size_t j = 0; j < n; ++j) pr[j] += mask.additive[base + int64_t(j) * sj];
              }
              const vn mv = lanes::splat(m), lv = lanes::splat(il), dv_ = lanes::splat(di), zero = lanes::splat(0.0f);
              size_t j = 0;
              for (; j + L <= n; j += L) {
                vn x = lanes::F32::load(pr + j) - mv;
                x = x < zero ? x : zero;  // S <= m, but for the rounding of a recomputed S
                const vn p = lanes::exp_nonpositive(x) * lv;
                lanes::F32::store(pr + j, p);
                lanes::F32::store(dr + j, p * (lanes::F32::load(dr + j) - dv_));
              }
              for (; j < n; ++j) {
                const float p = std::exp(std::min(pr[j] - m, 0.0f)) * il;
                pr[j] = p;
                dr[j] = p * (dr[j] - di);
              }
              std::fill(pr + n, pr + cols, 0.0f);
              std::fill(dr + n, dr + cols, 0.0f);
              // a masked score is a constant: no gradient flows to q and k through it
              if (blind) std::fill(dr, dr + n, 0.0f);
              if (mb)
                for (size_t jj = 0; jj < n; ++jj)
                  if (!mb[int64_t(jj) * sj]) dr[jj] = 0.0f;
            }
            // dq += dS K; dv += P^T dO; dk += dS^T (scale q)
            tile_gemm<true, false>(rows, Dp, sd.data(), KC, krb + j0 * Dp, Dp, NC, most, dqa + (gi * Tq + t0) * Dp, Dp);
            tile_gemm<true, true>(most, Dvp, sp.data(), KC, gb, Dvp, NC, rows, dva.data(), Dvp);
            tile_gemm<true, true>(most, Dp, sd.data(), KC, qb, Dp, NC, rows, dka.data(), Dp);
          }
        }
        for (size_t j = 0; j < kn; ++j) {
          store_row<IO>(dka.data() + j * Dp, D, 1.0f, dk + (bh * Tk + j0 + j) * D);
          store_row<IO>(dva.data() + j * Dvp, Dv, 1.0f, dv + (bh * Tk + j0 + j) * Dv);
        }
      }
      if (chunks == 1)
        for (size_t r = 0; r < G * Tq; ++r) store_row<IO>(dqa + r * Dp, D, scale, dq + (bh * G * Tq + r) * D);
    }
  });
  if (chunks > 1) {
    const size_t rows = B * Hq * Tq;
    parallel_for(rows, chunks * D, [&](size_t begin, size_t end) {
      std::vector<float> sum(Dp);
      for (size_t r = begin; r < end; ++r) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (size_t c = 0; c < chunks; ++c) {
          const float* part = dq_parts.data() + c * heads * per + r * Dp;
          for (size_t d = 0; d < Dp; ++d) sum[d] += part[d];
        }
        store_row<IO>(sum.data(), D, scale, dq + r * D);
      }
    });
  }
}

}  // namespace attn

template <class IO>
void cross_entropy(const typename IO::T* x, const int64_t* t, float* out, size_t rows, size_t n) {
  using LIO = typename Lanes<IO>::type;
  using lanes::L, lanes::vn;
  parallel_for(rows, n, [=](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const typename IO::T* xr = x + r * n;
      vn m0 = lanes::splat(-kInf), m1 = m0;
      size_t i = 0;
      for (; i + 2 * L <= n; i += 2 * L) {
        m0 = lanes::vmax(m0, LIO::load(xr + i));
        m1 = lanes::vmax(m1, LIO::load(xr + i + L));
      }
      for (; i + L <= n; i += L) m0 = lanes::vmax(m0, LIO::load(xr + i));
      if (i < n) m1 = lanes::vmax(m1, lanes::load_partial<LIO>(xr + i, n - i, -kInf));
      float m = lanes::hmax(lanes::vmax(m0, m1));
      if (!std::isfinite(m)) m = 0.0f;  // shift only by a finite maximum (no inf - inf)
      const vn ms = lanes::splat(m);
      vn a0 = lanes::splat(0.0f), a1 = a0;
      for (i = 0; i + 2 * L <= n; i += 2 * L) {
        a0 += lanes::exp(LIO::load(xr + i) - ms);
        a1 += lanes::exp(LIO::load(xr + i + L) - ms);
      }
      for (; i + L <= n; i += L) a0 += lanes::exp(LIO::load(xr + i) - ms);
      if (i < n) a1 += lanes::exp(lanes::load_partial<LIO>(xr + i, n - i, -kInf) - ms);
      int64_t k = t[r] % int64_t(n);
      if (k < 0) k += int64_t(n);
      const float picked = LIO::scalar(xr[k]);
      out[r] = float(double(m) + std::log(double(lanes::hsum(a0 + a1)))) - picked;
    }
  });
}

template <class A>
auto data_or_null(const A& a) -> decltype(a.data()) {
  return a.is_valid() ? a.data() : nullptr;
}

// The arrays of attention: 4-d, any strides.
template <class T>
using Arr4 = nb::ndarray<const T, nb::ndim<4>, nb::device::cpu>;

template <class T>
attn::View<T> view_of(const Arr4<T>& a) {
  attn::View<T> w{a.data(), {0, 0, 0, 0}};
  for (int d = 0; d < 4; ++d) w.s[d] = a.stride(d);
  return w;
}

template <class T>
attn::Shape attention_shape(const Arr4<T>& q, const Arr4<T>& k, const Arr4<T>& v, const In<float>& sinks) {
  attn::Shape sh{q.shape(0), q.shape(1), k.shape(1), q.shape(2), k.shape(2), q.shape(3), v.shape(3)};
  if (k.shape(0) != sh.B || v.shape(0) != sh.B || sh.Hkv == 0 || sh.Hq % sh.Hkv || v.shape(1) != sh.Hkv ||
      k.shape(3) != sh.D || v.shape(2) != sh.Tk)
    throw nb::value_error("[attention] q, k, v have inconsistent shapes.");
  if (sinks.is_valid()) need(sinks, sh.Hq, "attention", "sinks");
  return sh;
}

// The mask's element strides (0 on its broadcast dimensions of size 1).
inline Mask attention_mask(const Arr4<uint8_t>& mbool, const Arr4<float>& madd, const attn::Shape& sh) {
  Mask mk;
  const size_t full[4] = {sh.B, sh.Hq, sh.Tq, sh.Tk};
  auto strides = [&](const auto& a) {
    for (int d = 0; d < 4; ++d) {
      if (a.shape(d) != 1 && a.shape(d) != full[d])
        throw nb::value_error("[attention] The mask does not broadcast to the scores.");
      mk.stride[d] = a.shape(d) == 1 ? 0 : a.stride(d);
    }
  };
  if (mbool.is_valid()) {
    strides(mbool);
    mk.boolean = mbool.data();
  } else if (madd.is_valid()) {
    strides(madd);
    mk.additive = madd.data();
  }
  return mk;
}

template <class IO>
void bind_typed(nb::module_& m, const std::string& suffix) {
  using T = typename IO::T;
  m.def(
      ("rms_norm_" + suffix).c_str(),
      [](In<T> x, In<T> w, Out<T> out, size_t n, float eps) {
        const size_t rows = rows_of(x, n, "rms_norm");
        need(out, x.size(), "rms_norm", "out");
        if (w.is_valid()) need(w, n, "rms_norm", "weight");
        nb::gil_scoped_release release;
        rms_norm<IO>(x.data(), data_or_null(w), out.data(), rows, n, eps);
      },
      "x"_a.noconvert(), "w"_a.noconvert().none(), "out"_a.noconvert(), "n"_a, "eps"_a,
      "RMS norm of rows of n elements of x (times w when given), written to out.");
  m.def(
      ("layer_norm_" + suffix).c_str(),
      [](In<T> x, In<T> w, In<T> b, Out<T> out, size_t n, float eps) {
        const size_t rows = rows_of(x, n, "layer_norm");
        need(out, x.size(), "layer_norm", "out");
        if (w.is_valid()) need(w, n, "layer_norm", "weight");
        if (b.is_valid()) need(b, n, "layer_norm", "bias");
        nb::gil_scoped_release release;
        layer_norm<IO>(x.data(), data_or_null(w), data_or_null(b), out.data(), rows, n, eps);
      },
      "x"_a.noconvert(), "w"_a.noconvert().none(), "b"_a.noconvert().none(), "out"_a.noconvert(), "n"_a,
      "eps"_a, "Layer norm of rows of n elements of x (times w, plus b, when given), written to out.");
  m.def(
      ("norm_vjp_" + suffix).c_str(),
      [](In<T> x, In<T> w, In<T> g, Out<T> dx, Out<float> dw, Out<float> db, size_t n, float eps, bool layer) {
        const size_t rows = rows_of(x, n, "norm_vjp");
        need(g, x.size(), "norm_vjp", "g");
        need(dx, x.size(), "norm_vjp", "dx");
        if (w.is_valid()) need(w, n, "norm_vjp", "w");
        if (dw.is_valid()) need(dw, n, "norm_vjp", "dw");
        if (db.is_valid()) need(db, n, "norm_vjp", "db");
        nb::gil_scoped_release release;
        (layer ? norm_vjp<IO, true> : norm_vjp<IO, false>)(x.data(), data_or_null(w), g.data(), dx.data(),
                                                          data_or_null(dw), data_or_null(db), rows, n, eps);
      },
      "x"_a.noconvert(), "w"_a.noconvert().none(), "g"_a.noconvert(), "dx"_a.noconvert(),
      "dw"_a.noconvert().none(), "db"_a.noconvert().none(), "n"_a, "eps"_a, "layer"_a,
      "The fused backward of rms_norm (layer=False) or layer_norm: dx, and the float32 sums over rows "
      "of the weight's (dw) and bias's (db) cotangents when given.");
  m.def(
      ("rope_" + suffix).c_str(),
      [](In<T> x, Out<T> out, In<float> cs, In<float> sn, size_t T_, size_t per_batch, size_t tables, size_t D,
         size_t dims, bool traditional) {
        const size_t rows = rows_of(x, D, "rope");
        need(out, x.size(), "rope", "out");
        need(cs, tables * T_ * (dims / 2), "rope", "cos");
        need(sn, tables * T_ * (dims / 2), "rope", "sin");
        if (dims > D || dims % 2 || T_ == 0 || per_batch % T_ || (tables > 1 && rows != tables * per_batch))
          throw nb::value_error("[rope] inconsistent sizes.");
        nb::gil_scoped_release release;
        rope<IO>(x.data(), out.data(), cs.data(), sn.data(), rows, T_, per_batch, tables, D, dims, traditional);
      },
      "x"_a.noconvert(), "out"_a.noconvert(), "cos"_a.noconvert(), "sin"_a.noconvert(), "T"_a, "per_batch"_a,
      "tables"_a, "D"_a, "dims"_a, "traditional"_a,
      "Rotary embedding of rows of D features of x by the angles' cos/sin tables, written to out.");
  m.def(
      ("cross_entropy_" + suffix).c_str(),
      [](In<T> x, In<int64_t> t, Out<float> out, size_t n) {
        const size_t rows = rows_of(x, n, "cross_entropy");
        need(t, rows, "cross_entropy", "targets");
        need(out, rows, "cross_entropy", "out");
        nb::gil_scoped_release release;
        cross_entropy<IO>(x.data(), t.data(), out.data(), rows, n);
      },
      "x"_a.noconvert(), "targets"_a.noconvert(), "out"_a.noconvert(), "n"_a,
      "logsumexp(row) - row[target] of rows of n logits, in float32.");
  m.def(
      ("attention_" + suffix).c_str(),
      [](Arr4<T> q, Arr4<T> k, Arr4<T> v, Out<T> out, float scale, bool causal, Arr4<uint8_t> mbool,
         Arr4<float> madd, In<float> sinks) {
        const attn::Shape sh = attention_shape(q, k, v, sinks);
        need(out, sh.B * sh.Hq * sh.Tq * sh.Dv, "attention", "out");
        const Mask mk = attention_mask(mbool, madd, sh);
        if (sh.B * sh.Hq * sh.Tq == 0) return;
        nb::gil_scoped_release release;
        attn::attention<typename Lanes<IO>::type>(view_of(q), view_of(k), view_of(v), out.data(), sh, scale, causal,
                                                  mk, data_or_null(sinks));
      },
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "scale"_a, "causal"_a,
      "mask_bool"_a.noconvert().none(), "mask_add"_a.noconvert().none(), "sinks"_a.noconvert().none(),
      "Attention softmax(scale q k^T + mask) v of q[B, Hq, Tq, D], k[B, Hkv, Tk, D], v[B, Hkv, Tk, Dv] "
      "(any strides) into out[B, Hq, Tq, Dv]: the causal mask (keys j > t + Tk - Tq), or a boolean or "
      "additive float32 4-d mask (broadcast dimensions of size 1), and the sinks' logits (one per query "
      "head), in one pass over key blocks with an online softmax.");
  m.def(
      ("attention_vjp_" + suffix).c_str(),
      [](Arr4<T> q, Arr4<T> k, Arr4<T> v, Arr4<T> o, Arr4<T> g, Out<T> dq, Out<T> dk, Out<T> dv,
         Out<float> dsinks, float scale, bool causal, Arr4<uint8_t> mbool, Arr4<float> madd, In<float> sinks) {
        const attn::Shape sh = attention_shape(q, k, v, sinks);
        for (const auto* a : {&o, &g})
          if (a->shape(0) != sh.B || a->shape(1) != sh.Hq || a->shape(2) != sh.Tq || a->shape(3) != sh.Dv)
            throw nb::value_error("[attention_vjp] the output or its cotangent does not have the shape [B, Hq, Tq, Dv].");
        need(dq, sh.B * sh.Hq * sh.Tq * sh.D, "attention_vjp", "dq");
        need(dk, sh.B * sh.Hkv * sh.Tk * sh.D, "attention_vjp", "dk");
        need(dv, sh.B * sh.Hkv * sh.Tk * sh.Dv, "attention_vjp", "dv");
        if (sinks.is_valid() != dsinks.is_valid())
          throw nb::value_error("[attention_vjp] dsinks is given exactly when sinks are.");
        if (dsinks.is_valid()) need(dsinks, sh.B * sh.Hq, "attention_vjp", "dsinks");
        const Mask mk = attention_mask(mbool, madd, sh);
        if (sh.B * sh.Hq * sh.Tq * sh.Tk == 0)
          throw nb::value_error("[attention_vjp] empty inputs: the caller handles them.");
        nb::gil_scoped_release release;
        attn::attention_vjp<typename Lanes<IO>::type>(view_of(q), view_of(k), view_of(v), view_of(o), view_of(g),
                                                      dq.data(), dk.data(), dv.data(), data_or_null(dsinks), sh,
                                                      scale, causal, mk, data_or_null(sinks));
      },
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "o"_a.noconvert(), "g"_a.noconvert(),
      "dq"_a.noconvert(), "dk"_a.noconvert(), "dv"_a.noconvert(), "dsinks"_a.noconvert().none(), "scale"_a,
      "causal"_a, "mask_bool"_a.noconvert().none(), "mask_add"_a.noconvert().none(), "sinks"_a.noconvert().none(),
      "The backward of attention (FlashAttention-2's): from q, k, v, the output o and its cotangent g "
      "(any strides; masks and sinks as attention_*), the cotangents dq, dk, dv (contiguous, of q's, k's "
      "and v's shapes; dk and dv summed over the query heads of a kv head) and, with sinks, dsinks[B, Hq] "
      "(float32, per batch), computing in float32.");
}

}  // namespace

void bind_fast(nb::module_& m) {
  bind_typed<F32>(m, "float32");
  bind_typed<F16>(m, "float16");
  bind_typed<BF16>(m, "bfloat16");
}

}  // namespace lazyx
