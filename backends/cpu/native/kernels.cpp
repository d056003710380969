// Softmax, logsumexp and float32 reductions (sum, max, min) over contiguous rows.
//
// Every loop runs on lanes.h's native-width vectors (8 float32 lanes with
// AVX2, 16 with AVX-512): simd.h's fixed 16-lane type is split by GCC into
// halves through stack memory on AVX2, and its selects into scalar code,
// which made these kernels 5-10x slower than the memory allows there.
//
// Softmax and logsumexp make one pass over the input with an online max and
// sum, block by block: a block of 1024 elements (in L1) is scanned for its
// maximum, the running sum is rescaled when the maximum grows, then the
// block's exponentials are added. One exp per element, one read of the input
// from memory. float32 softmax also keeps each block's exp(x - block max) in
// the output and finishes with a per-block rescale (a pass over data that is
// still in cache for rows up to L2 size); half types recompute the exp in a
// second pass so that their output is rounded once, from float32.
//
// The reductions cut a row into blocks of 4096 elements reduced in several
// vector accumulators (so the loop is not one chain of add latencies); sums
// add the block totals in double. Many rows split over threads by rows; a few
// long rows (a full reduction) split each row into block-aligned parts.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "lanes.h"
#include "parallel.h"

namespace lazyx {

namespace {

using lanes::L, lanes::vn, lanes::vni, lanes::splat, lanes::vmax, lanes::hsum, lanes::hmax;
using lanes::load_partial, lanes::store_partial;

constexpr size_t kBlock = 1024;  // 4 KiB of float32: the block is re-read from L1
static_assert(kBlock % L == 0, "a block holds whole vectors");

struct RowStats {
  float max;
  float sum;  // sum of exp(x - max); NaN when the row holds a NaN or max is +-inf
};

// The online max-and-sum pass over one row. With kStore, exp(x - m_block)
// goes to `out` and each block's running max m_block to `mblk`.
template <class IO, bool kStore>
RowStats row_stats(const typename IO::T* x, size_t n, typename IO::T* out, float* mblk) {
  float m = -kInf;
  vn s = splat(0.0f);
  for (size_t b0 = 0, blk = 0; b0 < n; b0 += kBlock, ++blk) {
    const size_t len = std::min(kBlock, n - b0);
    const size_t full = len / L, rem = len % L;
    const typename IO::T* xb = x + b0;
    // Four running maxima, so the loop is not one chain of max latencies.
    vn m0 = splat(-kInf), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 4 <= full; i += 4) {
      m0 = vmax(m0, IO::load(xb + i * L));
      m1 = vmax(m1, IO::load(xb + (i + 1) * L));
      m2 = vmax(m2, IO::load(xb + (i + 2) * L));
      m3 = vmax(m3, IO::load(xb + (i + 3) * L));
    }
    for (; i < full; ++i) m0 = vmax(m0, IO::load(xb + i * L));
    if (rem) m1 = vmax(m1, load_partial<IO>(xb + full * L, rem, -kInf));
    const float mb = hmax(vmax(vmax(m0, m1), vmax(m2, m3)));
    if (mb > m) {
      s = s * std::exp(m - mb);  // exp(-inf) = 0 while s is still 0
      m = mb;
    }
    // A NaN in x makes its exp, and so the sum, NaN; so does inf - inf.
    const vn mv = splat(m);
    vn s1 = splat(0.0f);
    for (i = 0; i + 2 <= full; i += 2) {
      const vn e0 = lanes::exp_nonpositive(IO::load(xb + i * L) - mv);
      const vn e1 = lanes::exp_nonpositive(IO::load(xb + (i + 1) * L) - mv);
      s += e0;
      s1 += e1;
      if constexpr (kStore) {
        IO::store(out + b0 + i * L, e0);
        IO::store(out + b0 + (i + 1) * L, e1);
      }
    }
    if (i < full) {
      const vn e = lanes::exp_nonpositive(IO::load(xb + i * L) - mv);
      s += e;
      if constexpr (kStore) IO::store(out + b0 + i * L, e);
    }
    if (rem) {
      const vn e = lanes::exp_nonpositive(load_partial<IO>(xb + full * L, rem, -kInf) - mv);
      s1 += e;
      if constexpr (kStore) store_partial<IO>(out + b0 + full * L, e, rem);
    }
    s += s1;
    if constexpr (kStore) mblk[blk] = m;
  }
  return {m, hsum(s)};
}

// A row whose max is +-inf or that holds a NaN: exp(x - max) is NaN somewhere
// (inf - inf), so softmax is NaN throughout, as the NumPy composition gives.
inline bool degenerate(const RowStats& st) { return !std::isfinite(st.max) || st.sum != st.sum; }

// logsumexp of a degenerate row: NaN if it holds a NaN, else its max (+-inf).
template <class IO>
float degenerate_logsumexp(const typename IO::T* x, size_t n) {
  float m = -kInf;
  for (size_t i = 0; i < n; ++i) {
    const float v = IO::scalar(x[i]);
    if (v != v) return v;
    m = v > m ? v : m;
  }
  return m;
}

template <class IO>
void fill_row(typename IO::T* out, size_t n, float value) {
  const typename IO::T v = IO::from_float(value);
  std::fill(out, out + n, v);
}

template <class IO>
void softmax_row(const typename IO::T* x, typename IO::T* out, size_t n, float* mblk) {
  using T = typename IO::T;
  constexpr bool kStore = std::is_same_v<T, float>;
  const RowStats st = row_stats<IO, kStore>(x, n, out, mblk);
  if (degenerate(st)) {
    fill_row<IO>(out, n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const float inv = 1.0f / st.sum;
  if constexpr (kStore) {
    for (size_t b0 = 0, blk = 0; b0 < n; b0 += kBlock, ++blk) {
      const vn scale = splat((mblk[blk] == st.max ? 1.0f : std::exp(mblk[blk] - st.max)) * inv);
      const size_t end = std::min(n, b0 + kBlock);
      size_t i = b0;
      for (; i + L <= end; i += L) IO::store(out + i, IO::load(out + i) * scale);
      for (; i < end; ++i) out[i] *= scale[0];
    }
  } else {
    const size_t full = n / L, rem = n % L;
    const vn mv = splat(st.max), iv = splat(inv);
    for (size_t i = 0; i < full; ++i) IO::store(out + i * L, lanes::exp_nonpositive(IO::load(x + i * L) - mv) * iv);
    if (rem) {
      const vn v = load_partial<IO>(x + full * L, rem, -kInf);
      store_partial<IO>(out + full * L, lanes::exp_nonpositive(v - mv) * iv, rem);
    }
  }
}

// Short rows (a classifier's logits): L rows at a time, one row per lane. The rows are
// copied into a column-major tile, so a row of 10 logits costs a share of 10 vector max
// and exp operations instead of a pass of partial vectors and the horizontal max and
// sum of its own (7x faster for 256 rows of 10).
// A row whose max is not finite or that holds a NaN is degenerate, as row_stats
// says, and is finished by the scalar code of the row path. The crossovers (AVX2, 256
// rows): logsumexp gains up to 32 elements a row; softmax, which scatters its output
// back into rows, up to 16.
constexpr size_t kShortRow = 32, kShortSoftmaxRow = 16;

struct ShortStats {
  vn max;
  vn sum;
};

template <class IO>
ShortStats short_stats(const typename IO::T* x, size_t n, float (*tile)[L]) {
  for (size_t j = 0; j < n; ++j)
    for (int k = 0; k < L; ++k) tile[j][k] = IO::scalar(x[k * n + j]);
  vn m = lanes::F32::load(tile[0]);
  for (size_t j = 1; j < n; ++j) m = vmax(m, lanes::F32::load(tile[j]));
  vn s = splat(0.0f);
  for (size_t j = 0; j < n; ++j) s += lanes::exp_nonpositive(lanes::F32::load(tile[j]) - m);
  return {m, s};
}

inline bool degenerate_lane(const ShortStats& st, int k) {
  return !std::isfinite(st.max[k]) || st.sum[k] != st.sum[k];
}

template <class IO>
void softmax_impl(const void* xv, void* outv, size_t rows, size_t n) {
  using T = typename IO::T;
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  parallel_for(rows, n, [=](size_t b, size_t e) {
    std::vector<float> mblk((n + kBlock - 1) / kBlock + 1);
    size_t r = b;
    if (n <= kShortSoftmaxRow) {
      alignas(64) float tile[kShortSoftmaxRow][L];
      for (; r + L <= e; r += L) {
        const ShortStats st = short_stats<IO>(x + r * n, n, tile);
        const vn inv = splat(1.0f) / st.sum;
        for (size_t j = 0; j < n; ++j) {
          const vn v = lanes::exp_nonpositive(lanes::F32::load(tile[j]) - st.max) * inv;
          for (int k = 0; k < L; ++k) out[(r + k) * n + j] = IO::from_float(v[k]);
        }
        for (int k = 0; k < L; ++k)
          if (degenerate_lane(st, k)) fill_row<IO>(out + (r + k) * n, n, std::numeric_limits<float>::quiet_NaN());
      }
    }
    for (; r < e; ++r) softmax_row<IO>(x + r * n, out + r * n, n, mblk.data());
  });
}

template <class IO>
void logsumexp_impl(const void* xv, void* outv, size_t rows, size_t n) {
  using T = typename IO::T;
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  parallel_for(rows, n, [=](size_t b, size_t e) {
    size_t r = b;
    if (n <= kShortRow) {
      alignas(64) float tile[kShortRow][L];
      for (; r + L <= e; r += L) {
        const ShortStats st = short_stats<IO>(x + r * n, n, tile);
        for (int k = 0; k < L; ++k) {
          const float v = degenerate_lane(st, k) ? degenerate_logsumexp<IO>(x + (r + k) * n, n)
                                                 : static_cast<float>(double(st.max[k]) + std::log(double(st.sum[k])));
          out[r + k] = IO::from_float(v);
        }
      }
    }
    for (; r < e; ++r) {
      const T* row = x + r * n;
      const RowStats st = row_stats<IO, false>(row, n, nullptr, nullptr);
      const float v = degenerate(st) ? degenerate_logsumexp<IO>(row, n)
                                     : static_cast<float>(double(st.max) + std::log(double(st.sum)));
      out[r] = IO::from_float(v);
    }
  });
}

// -- reductions of float32 ---------------------------------------------------
constexpr size_t kReduceBlock = 4096;  // elements per float32 partial (sums: then added in double)

// The reductions as data: the value of nothing, how a vector folds in, how
// partial results of blocks and parts combine. Partials are double (sums
// accumulate block totals in double; max/min are exact in any width).
struct SumOp {
  static constexpr float kIdentity = 0.0f;
  static vn fold(vn a, vn x) { return a + x; }
  static double finish(vn a) { return hsum(a); }
  static double combine(double a, double b) { return a + b; }
};

// max and min propagate NaN, as NumPy and MLX: the lanes skip NaN (a > b ? a : b
// keeps a NaN-free accumulator) and a separate mask remembers whether one was seen.
struct MaxOp {
  static constexpr float kIdentity = -kInf;
  static vn fold(vn a, vn x) { return x > a ? x : a; }
  static double finish(vn a) { return hmax(a); }
  static double combine(double a, double b) { return a != a || b != b ? a + b : std::max(a, b); }
};

struct MinOp {
  static constexpr float kIdentity = kInf;
  static vn fold(vn a, vn x) { return x < a ? x : a; }
  static double finish(vn a) { return -hmax(-a); }
  static double combine(double a, double b) { return a != a || b != b ? a + b : std::min(a, b); }
};

template <class Op>
constexpr bool kTracksNaN = !std::is_same_v<Op, SumOp>;  // a NaN already makes a sum NaN

// All-ones lanes where a or b is NaN: one unordered compare for two vectors on AVX.
inline vni unordered(vn a, vn b) {
#if defined(__AVX__) && !defined(__AVX512F__)
  return (vni)_mm256_cmp_ps((__m256)a, (__m256)b, _CMP_UNORD_Q);
#else
  return (a != a) | (b != b);
#endif
}

// Op over x[0:n]: vector accumulators within blocks of kReduceBlock, block results combined in double.
template <class Op>
double reduce_range(const float* x, size_t n) {
  using IO = lanes::F32;
  double total = Op::kIdentity;
  vni nan = vni{};  // lanes that saw a NaN (max and min only)
  for (size_t b0 = 0; b0 < n; b0 += kReduceBlock) {
    const size_t len = std::min(kReduceBlock, n - b0);
    const float* p = x + b0;
    vn a0 = splat(Op::kIdentity), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * L <= len; i += 4 * L) {
      const vn v0 = IO::load(p + i), v1 = IO::load(p + i + L), v2 = IO::load(p + i + 2 * L),
               v3 = IO::load(p + i + 3 * L);
      a0 = Op::fold(a0, v0);
      a1 = Op::fold(a1, v1);
      a2 = Op::fold(a2, v2);
      a3 = Op::fold(a3, v3);
      if constexpr (kTracksNaN<Op>) nan |= unordered(v0, v1) | unordered(v2, v3);
    }
    for (; i + L <= len; i += L) {
      const vn v = IO::load(p + i);
      a0 = Op::fold(a0, v);
      if constexpr (kTracksNaN<Op>) nan |= v != v;
    }
    if (i < len) {
      const vn v = load_partial<IO>(p + i, len - i, Op::kIdentity);
      a1 = Op::fold(a1, v);
      if constexpr (kTracksNaN<Op>) nan |= v != v;
    }
    total = Op::combine(total, Op::finish(Op::fold(Op::fold(a0, a1), Op::fold(a2, a3))));
  }
  if constexpr (kTracksNaN<Op>) {
    int32_t seen = 0;
    for (int j = 0; j < L; ++j) seen |= nan[j];
    if (seen) return std::numeric_limits<double>::quiet_NaN();
  }
  return total;
}

template <class Op>
void reduce_rows(const float* x, float* out, size_t rows, size_t n) {
  const size_t nt = static_cast<size_t>(num_threads());
  if (rows >= nt || n < 2 * kMinWorkPerThread) {
    parallel_for(rows, n, [=](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) out[r] = static_cast<float>(reduce_range<Op>(x + r * n, n));
    });
    return;
  }
  // Few long rows: split each row into block-aligned parts, a few per thread, so that
  // the caller takes over the parts of a helper that wakes late (a busy shared core).
  const size_t want = 4 * nt;
  const size_t part = ((n + want - 1) / want + kReduceBlock - 1) / kReduceBlock * kReduceBlock;
  const size_t parts = (n + part - 1) / part;
  std::vector<double> partial(parts);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    parallel_for(parts, part, [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) partial[k] = reduce_range<Op>(row + k * part, std::min(part, n - k * part));
    });
    double total = Op::kIdentity;
    for (double v : partial) total = Op::combine(total, v);
    out[r] = static_cast<float>(total);
  }
}

// Op over the rows of a (rows, cols) matrix, one result per column (a reduction over the
// leading axes, as a bias gradient sums over the batch). Strips of kStrip columns are
// the tasks: each folds row after row into float32 lanes (the strip's accumulators stay
// in L1 while each row's piece streams in), for kRowBlock rows at a time, and combines
// those block results in double as reduce_range does. max and min propagate NaN.
template <class Op>
inline float fold_column(float a, float x) {
  if constexpr (std::is_same_v<Op, SumOp>) {
    return a + x;
  } else if constexpr (std::is_same_v<Op, MaxOp>) {
    return (x > a || x != x) ? x : a;  // a NaN, once in, stays
  } else {
    return (x < a || x != x) ? x : a;
  }
}

template <class Op>
void reduce_columns(const float* x, float* out, size_t rows, size_t cols) {
  constexpr size_t kStrip = 256, kRowBlock = 64;
  const size_t strips = (cols + kStrip - 1) / kStrip;
  parallel_for(strips, rows * kStrip, [=](size_t b, size_t e) {
    alignas(64) float acc[kStrip];
    double total[kStrip];
    for (size_t s = b; s < e; ++s) {
      const size_t c0 = s * kStrip, w = std::min(kStrip, cols - c0);
      for (size_t c = 0; c < w; ++c) total[c] = Op::kIdentity;
      for (size_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        for (size_t c = 0; c < w; ++c) acc[c] = Op::kIdentity;
        const size_t r1 = std::min(rows, r0 + kRowBlock);
        for (size_t r = r0; r < r1; ++r) {
          const float* row = x + r * cols + c0;
          for (size_t c = 0; c < w; ++c) acc[c] = fold_column<Op>(acc[c], row[c]);
        }
        for (size_t c = 0; c < w; ++c) total[c] = Op::combine(total[c], acc[c]);
      }
      for (size_t c = 0; c < w; ++c) out[c0 + c] = static_cast<float>(total[c]);
    }
  });
}

// Skinny products out (M, N) = a (M, K) @ b (K, N) with a side of at most kSkinny, which
// BLAS runs at a fraction of its speed (packing and threading cost more than the
// arithmetic): the training step's last layer, its gradient and its input gradient,
// 256x512x10 in three orientations, took OpenBLAS 45-150 us each on 2 cores. Strides
// are in elements; out is C-contiguous. Three loops, by the small side:
//  * K small: each output row is a sum of K rows of b (b's rows contiguous), rows of
//    out split over the pool;
//  * M small: the same sums, k outermost so that b is read once, out's M rows of a strip
//    of columns kept in L1, strips split over the pool;
//  * N small: each output is a dot product of a row of a (contiguous) with a column of
//    b, read from bt (N, K) contiguous; rows of out split over the pool.
// float32 sums in vector lanes, as BLAS: the order of additions differs from BLAS's.
constexpr size_t kSkinny = 16;

// K small: out[i, n:n+2L] = sum_k a[i, k] b[k, n:n+2L] in two vector registers (the
// K coefficients of the row read once), so out is written once and b read from L1/L2.
void skinny_small_k(const float* a, ptrdiff_t as0, ptrdiff_t as1, const float* b, ptrdiff_t bs0, float* out,
                    size_t M, size_t N, size_t K) {
  parallel_for(M, N * K, [=](size_t r0, size_t r1) {
    float c[kSkinny];
    for (size_t i = r0; i < r1; ++i) {
      for (size_t k = 0; k < K; ++k) c[k] = a[i * as0 + k * as1];
      float* o = out + i * N;
      size_t n = 0;
      for (; n + 2 * L <= N; n += 2 * L) {
        vn s0 = splat(0.0f), s1 = s0;
        for (size_t k = 0; k < K; ++k) {
          const vn ck = splat(c[k]);
          s0 += ck * lanes::F32::load(b + k * bs0 + n);
          s1 += ck * lanes::F32::load(b + k * bs0 + n + L);
        }
        lanes::F32::store(o + n, s0);
        lanes::F32::store(o + n + L, s1);
      }
      for (; n < N; ++n) {
        float t = 0.0f;
        for (size_t k = 0; k < K; ++k) t += c[k] * b[k * bs0 + n];
        o[n] = t;
      }
    }
  });
}

// M small (MM rows, a template parameter so that the MM accumulators live in registers):
// for each vector of columns, k runs over b's rows once.
template <size_t MM>
void skinny_small_m(const float* a, ptrdiff_t as0, ptrdiff_t as1, const float* b, ptrdiff_t bs0, float* out,
                    size_t N, size_t K) {
  const size_t vectors = (N + L - 1) / L;
  parallel_for(vectors, MM * K * L, [=](size_t v0, size_t v1) {
    for (size_t v = v0; v < v1; ++v) {
      const size_t n = v * L, w = std::min<size_t>(L, N - n);
      vn acc[MM];
      for (size_t i = 0; i < MM; ++i) acc[i] = splat(0.0f);
      for (size_t k = 0; k < K; ++k) {
        const vn bk = w == size_t(L) ? lanes::F32::load(b + k * bs0 + n) : load_partial<lanes::F32>(b + k * bs0 + n, w, 0.0f);
        for (size_t i = 0; i < MM; ++i) acc[i] += splat(a[i * as0 + k * as1]) * bk;
      }
      for (size_t i = 0; i < MM; ++i) {
        if (w == size_t(L)) lanes::F32::store(out + i * N + n, acc[i]);
        else store_partial<lanes::F32>(out + i * N + n, acc[i], w);
      }
    }
  });
}

// N small (NN columns, a template parameter): each row of a is read once against the NN
// rows of bt (N, K) held in L1, NN dot products in registers.
template <size_t NN>
void skinny_small_n(const float* a, ptrdiff_t as0, const float* bt, float* out, size_t M, size_t K) {
  parallel_for(M, NN * K, [=](size_t r0, size_t r1) {
    for (size_t i = r0; i < r1; ++i) {
      const float* ai = a + i * as0;
      vn acc[NN];
      for (size_t j = 0; j < NN; ++j) acc[j] = splat(0.0f);
      size_t k = 0;
      for (; k + L <= K; k += L) {
        const vn av = lanes::F32::load(ai + k);
        for (size_t j = 0; j < NN; ++j) acc[j] += av * lanes::F32::load(bt + j * K + k);
      }
      for (size_t j = 0; j < NN; ++j) {
        float t = hsum(acc[j]);
        for (size_t q = k; q < K; ++q) t += ai[q] * bt[j * K + q];
        out[i * NN + j] = t;
      }
    }
  });
}

template <size_t... I>
bool small_m_dispatch(size_t M, std::index_sequence<I...>, const float* a, ptrdiff_t as0, ptrdiff_t as1,
                      const float* b, ptrdiff_t bs0, float* out, size_t N, size_t K) {
  return ((M == I + 1 ? (skinny_small_m<I + 1>(a, as0, as1, b, bs0, out, N, K), true) : false) || ...);
}

template <size_t... I>
bool small_n_dispatch(size_t N, std::index_sequence<I...>, const float* a, ptrdiff_t as0, const float* bt,
                      float* out, size_t M, size_t K) {
  return ((N == I + 1 ? (skinny_small_n<I + 1>(a, as0, bt, out, M, K), true) : false) || ...);
}

}  // namespace

bool skinny_matmul_f32(const float* a, ptrdiff_t as0, ptrdiff_t as1, const float* b, ptrdiff_t bs0, ptrdiff_t bs1,
                       float* out, size_t M, size_t N, size_t K) {
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    std::fill(out, out + M * N, 0.0f);
    return true;
  }
  constexpr auto upto = std::make_index_sequence<kSkinny>{};
  if (K <= kSkinny && bs1 == 1) {
    skinny_small_k(a, as0, as1, b, bs0, out, M, N, K);
    return true;
  }
  if (M <= kSkinny && bs1 == 1) return small_m_dispatch(M, upto, a, as0, as1, b, bs0, out, N, K);
  // b's columns contiguous (bs0 == 1, bs1 == K): b is bt (N, K) row-major.
  if (N <= kSkinny && as1 == 1 && bs0 == 1 && bs1 == static_cast<ptrdiff_t>(K))
    return small_n_dispatch(N, upto, a, as0, b, out, M, K);
  return false;
}

const char* const kernel_isa[] = {
#if defined(__SSE4_2__)
    "sse4.2",
#endif
#if defined(__AVX__)
    "avx",
#endif
#if defined(__AVX2__)
    "avx2",
#endif
#if defined(__FMA__)
    "fma",
#endif
#if defined(__BMI2__)
    "bmi2",
#endif
#if defined(__AVX512F__)
    "avx512f",
#endif
#if defined(__AVX512BW__)
    "avx512bw",
#endif
#if defined(__AVX512DQ__)
    "avx512dq",
#endif
#if defined(__AVX512VL__)
    "avx512vl",
#endif
#if defined(__AVX512CD__)
    "avx512cd",
#endif
#if defined(__AVX512VNNI__)
    "avx512vnni",
#endif
#if defined(__AVX512VBMI__)
    "avx512vbmi",
#endif
#if defined(__AVX512BF16__)
    "avx512bf16",
#endif
    nullptr};

void softmax_rows(Dtype dt, const void* x, void* out, size_t rows, size_t n) {
  switch (dt) {
    case Dtype::float32: return softmax_impl<lanes::F32>(x, out, rows, n);
    case Dtype::float16: return softmax_impl<lanes::F16>(x, out, rows, n);
    case Dtype::bfloat16: return softmax_impl<lanes::BF16>(x, out, rows, n);
  }
}

void logsumexp_rows(Dtype dt, const void* x, void* out, size_t rows, size_t n) {
  switch (dt) {
    case Dtype::float32: return logsumexp_impl<lanes::F32>(x, out, rows, n);
    case Dtype::float16: return logsumexp_impl<lanes::F16>(x, out, rows, n);
    case Dtype::bfloat16: return logsumexp_impl<lanes::BF16>(x, out, rows, n);
  }
}

void reduce_columns_f32(ReduceOp op, const float* x, float* out, size_t rows, size_t cols) {
  switch (op) {
    case ReduceOp::sum: return reduce_columns<SumOp>(x, out, rows, cols);
    case ReduceOp::max: return reduce_columns<MaxOp>(x, out, rows, cols);
    case ReduceOp::min: return reduce_columns<MinOp>(x, out, rows, cols);
  }
}

void reduce_rows_f32(ReduceOp op, const float* x, float* out, size_t rows, size_t n) {
  switch (op) {
    case ReduceOp::sum: return reduce_rows<SumOp>(x, out, rows, n);
    case ReduceOp::max: return reduce_rows<MaxOp>(x, out, rows, n);
    case ReduceOp::min: return reduce_rows<MinOp>(x, out, rows, n);
  }
}

}  // namespace lazyx
