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
// query blocks over both cores; it reads q, k, v through their strides.
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

// One element as float32.
template <class IO>
inline float scalar(typename IO::T v) {
  if constexpr (std::is_same_v<IO, F16>) return f16_to_float(v);
  else if constexpr (std::is_same_v<IO, BF16>) return bf16_to_float(v);
  else return v;
}

// Sum of f(load(x[i])) over a row, in four float32 accumulators.
template <class IO, class F>
float row_sum(const typename IO::T* x, size_t n, F f) {
  vf a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 += f(IO::load(x + i));
    a1 += f(IO::load(x + i + W));
    a2 += f(IO::load(x + i + 2 * W));
    a3 += f(IO::load(x + i + 3 * W));
  }
  for (; i + W <= n; i += W) a0 += f(IO::load(x + i));
  if (i < n) {
    const size_t k = n - i;
    vf v = f(IO::load_partial(x + i, k, 0.0f));
    for (size_t j = k; j < W; ++j) v[j] = 0.0f;
    a1 += v;
  }
  return hsum((a0 + a1) + (a2 + a3));
}

// out[i] = f(x[i], w[i], b[i], i) over a row, vector by vector; missing weights read 1/0.
template <class IO, class F>
void row_map(const typename IO::T* x, const typename IO::T* w, const typename IO::T* b,
             typename IO::T* out, size_t n, F f) {
  size_t i = 0;
  for (; i + W <= n; i += W)
    IO::store(out + i, f(IO::load(x + i), w ? IO::load(w + i) : splat(1.0f), b ? IO::load(b + i) : splat(0.0f)));
  if (i < n) {
    const size_t k = n - i;
    const vf v = f(IO::load_partial(x + i, k, 0.0f), w ? IO::load_partial(w + i, k, 1.0f) : splat(1.0f),
                   b ? IO::load_partial(b + i, k, 0.0f) : splat(0.0f));
    IO::store_partial(out + i, v, k);
  }
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
// (and bias) cotangent per part in float32, summed at the end in double.
constexpr size_t kParts = 16;

template <class IO, bool kLayer>
void norm_vjp(const typename IO::T* x, const typename IO::T* w, const typename IO::T* g, typename IO::T* dx,
              float* dw, float* db, size_t rows, size_t n, float eps) {
  using T = typename IO::T;
  const size_t parts = std::min(rows, kParts);
  std::vector<float> pw(dw ? parts * n : 0, 0.0f), pb(db ? parts * n : 0, 0.0f);
  parallel_for(parts, (rows / std::max<size_t>(parts, 1) + 1) * n * 3, [&](size_t pbeg, size_t pend) {
    std::vector<float> xn(n), gw(n);
    for (size_t part = pbeg; part < pend; ++part) {
      const size_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
      float* accw = dw ? pw.data() + part * n : nullptr;
      float* accb = db ? pb.data() + part * n : nullptr;
      for (size_t r = r0; r < r1; ++r) {
        const T* xr = x + r * n;
        const T* gr = g + r * n;
        float mu = 0.0f;
        if constexpr (kLayer) mu = row_sum<IO>(xr, n, [](vf v) { return v; }) / float(n);
        const float var = row_sum<IO>(xr, n, [mu](vf v) { v -= mu; return v * v; }) / float(n);
        const float s = 1.0f / std::sqrt(var + eps);
        // xn = (x - mu) s, gw = g w; then the two row means the cotangent needs.
        double sum_gw = 0.0, sum_gwxn = 0.0;
        for (size_t i = 0; i < n; ++i) {
          const float xi = scalar<IO>(xr[i]), gi = scalar<IO>(gr[i]);
          const float wi = w ? scalar<IO>(w[i]) : 1.0f;
          xn[i] = (xi - mu) * s;
          gw[i] = gi * wi;
          sum_gw += gw[i];
          sum_gwxn += gw[i] * xn[i];
          if (accw) accw[i] += gi * xn[i];
          if (accb) accb[i] += gi;
        }
        const float mg = kLayer ? float(sum_gw / n) : 0.0f, mgx = float(sum_gwxn / n);
        T* dr = dx + r * n;
        for (size_t i = 0; i < n; ++i) dr[i] = IO::from_float(s * (gw[i] - mg - xn[i] * mgx));
      }
    }
  });
  for (size_t i = 0; i < n; ++i) {
    double tw = 0.0, tb = 0.0;
    for (size_t part = 0; part < parts; ++part) {
      if (dw) tw += pw[part * n + i];
      if (db) tb += pb[part * n + i];
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

// c[r, :NC] (+)= sum_k a[r, k] b[k, :NC] for R rows: the micro-GEMM of both
// products (S = Q K^T from the packed K panel, O += P V), 2R accumulators in
// registers; lda, ldb, ldc are row strides.
template <size_t R, bool kAccumulate>
inline void micro_gemm(const float* a, size_t lda, const float* b, size_t ldb, size_t k, float* c, size_t ldc) {
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
      const vn av = lanes::splat(a[r * lda + i]);
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

// micro_gemm for rows = 1 ... MR (the last tile of a block may be short).
template <bool kAccumulate>
inline void micro_gemm_rows(size_t rows, const float* a, size_t lda, const float* b, size_t ldb, size_t k,
                            float* c, size_t ldc) {
  switch (rows) {
    case 6: micro_gemm<6, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
    case 5: micro_gemm<5, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
    case 4: micro_gemm<4, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
    case 3: micro_gemm<3, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
    case 2: micro_gemm<2, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
    default: micro_gemm<1, kAccumulate>(a, lda, b, ldb, k, c, ldc); break;
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

template <class IO>
void attention(View<typename IO::T> q, View<typename IO::T> k, View<typename IO::T> v, typename IO::T* out,
               const Shape& sh, float scale, bool causal, const Mask& mask, const float* sinks) {
  using T = typename IO::T;
  const size_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, Tq = sh.Tq, Tk = sh.Tk, D = sh.D, Dv = sh.Dv;
  const size_t G = Hq / Hkv;
  const int64_t off = int64_t(Tk) - int64_t(Tq);  // causal: query t sees keys j <= t + off
  const size_t Tkp = round_up(Tk, NC), Dvp = round_up(Dv, NC);
  std::vector<float> kpack(B * Hkv * Tkp * D), vpack(B * Hkv * Tk * Dvp);
  parallel_for(B * Hkv, Tk * (D + Dv), [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / Hkv, h = bh % Hkv;
      float* kp = kpack.data() + bh * Tkp * D;
      for (size_t j0 = 0; j0 < Tkp; j0 += NC)
        for (size_t jj = 0; jj < NC; ++jj) {
          const size_t j = j0 + jj;
          float* dst = kp + j0 * D + jj;
          if (j < Tk) {
            const T* src = k.at(b, h, j);
            for (size_t d = 0; d < D; ++d) dst[d * NC] = IO::scalar(src[d * k.s[3]]);
          } else {
            for (size_t d = 0; d < D; ++d) dst[d * NC] = 0.0f;
          }
        }
      float* vp = vpack.data() + bh * Tk * Dvp;
      for (size_t j = 0; j < Tk; ++j) {
        const T* src = v.at(b, h, j);
        float* dst = vp + j * Dvp;
        for (size_t d = 0; d < Dv; ++d) dst[d] = IO::scalar(src[d * v.s[3]]);
        for (size_t d = Dv; d < Dvp; ++d) dst[d] = 0.0f;
      }
    }
  });

  const size_t nqb = (Tq + QB - 1) / QB;
  parallel_for(B * Hq * nqb, QB * Tk * (D + Dv), [&](size_t begin, size_t end) {
    std::vector<float> qs(QB * D), s(QB * KB), o(QB * Dvp), m(QB), l(QB);
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
      std::fill(o.begin(), o.begin() + rows * Dvp, 0.0f);
      const float* kp = kpack.data() + (b * Hkv + hk) * Tkp * D;
      const float* vp = vpack.data() + (b * Hkv + hk) * Tk * Dvp;
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
          if (alpha != 1.0f) {
            float* orow = o.data() + i * Dvp;
            for (size_t d = 0; d < Dvp; ++d) orow[d] *= alpha;
          }
        }
        for (size_t r0 = 0; r0 < rows; r0 += MR) {
          const size_t rr = std::min(MR, rows - r0);
          size_t need = 0;
          for (size_t i = r0; i < r0 + rr; ++i) need = std::max(need, lim[i]);
          if (need == 0) continue;
          for (size_t c = 0; c < Dvp; c += NC)
            micro_gemm_rows<true>(rr, s.data() + r0 * KB, KB, vp + k0 * Dvp + c, Dvp, need, o.data() + r0 * Dvp + c,
                                  Dvp);
        }
      }
      for (size_t i = 0; i < rows; ++i) {
        T* dst = out + ((b * Hq + h) * Tq + t0 + i) * Dv;
        const float inv = 1.0f / l[i];
        const float* orow = o.data() + i * Dvp;
        for (size_t d = 0; d < Dv; ++d) dst[d] = IO::from_float(orow[d] * inv);
      }
    }
  });
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
      [](nb::ndarray<const T, nb::ndim<4>, nb::device::cpu> q, nb::ndarray<const T, nb::ndim<4>, nb::device::cpu> k,
         nb::ndarray<const T, nb::ndim<4>, nb::device::cpu> v, Out<T> out, float scale, bool causal,
         nb::ndarray<const uint8_t, nb::ndim<4>, nb::device::cpu> mbool,
         nb::ndarray<const float, nb::ndim<4>, nb::device::cpu> madd, In<float> sinks) {
        const char* op = "[attention]";
        attn::Shape sh{q.shape(0), q.shape(1), k.shape(1), q.shape(2), k.shape(2), q.shape(3), v.shape(3)};
        if (k.shape(0) != sh.B || v.shape(0) != sh.B || sh.Hkv == 0 || sh.Hq % sh.Hkv || v.shape(1) != sh.Hkv ||
            k.shape(3) != sh.D || v.shape(2) != sh.Tk)
          throw nb::value_error((std::string(op) + " q, k, v have inconsistent shapes.").c_str());
        need(out, sh.B * sh.Hq * sh.Tq * sh.Dv, "attention", "out");
        auto view = [](const auto& a) {
          attn::View<T> w{a.data(), {0, 0, 0, 0}};
          for (int d = 0; d < 4; ++d) w.s[d] = a.stride(d);
          return w;
        };
        Mask mk;
        const size_t full[4] = {sh.B, sh.Hq, sh.Tq, sh.Tk};
        auto strides = [&](const auto& a) {
          for (int d = 0; d < 4; ++d) {
            if (a.shape(d) != 1 && a.shape(d) != full[d])
              throw nb::value_error((std::string(op) + " The mask does not broadcast to the scores.").c_str());
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
        if (sinks.is_valid()) need(sinks, sh.Hq, "attention", "sinks");
        if (sh.B * sh.Hq * sh.Tq == 0) return;
        nb::gil_scoped_release release;
        attn::attention<typename Lanes<IO>::type>(view(q), view(k), view(v), out.data(), sh, scale, causal, mk,
                                                  data_or_null(sinks));
      },
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "scale"_a, "causal"_a,
      "mask_bool"_a.noconvert().none(), "mask_add"_a.noconvert().none(), "sinks"_a.noconvert().none(),
      "Attention softmax(scale q k^T + mask) v of q[B, Hq, Tq, D], k[B, Hkv, Tk, D], v[B, Hkv, Tk, Dv] "
      "(any strides) into out[B, Hq, Tq, Dv]: the causal mask (keys j > t + Tk - Tq), or a boolean or "
      "additive float32 4-d mask (broadcast dimensions of size 1), and the sinks' logits (one per query "
      "head), in one pass over key blocks with an online softmax.");
}

}  // namespace

void bind_fast(nb::module_& m) {
  bind_typed<F32>(m, "float32");
  bind_typed<F16>(m, "float16");
  bind_typed<BF16>(m, "bfloat16");
}

}  // namespace lazyx
