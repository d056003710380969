// Softmax, logsumexp and float32 sum over contiguous rows.
//
// Softmax and logsumexp make one pass over the input with an online max and
// sum, block by block: a block of 1024 elements (in L1) is scanned for its
// maximum, the running sum is rescaled when the maximum grows, then the
// block's exponentials are added. One exp per element, one read of the input
// from memory. float32 softmax also keeps each block's exp(x - block max) in
// the output and finishes with a per-block rescale (a pass over data that is
// still in cache for rows up to L2 size); half types recompute the exp in a
// second pass so that their output is rounded once, from float32.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel.h"
#include "simd.h"

namespace lazyx {

namespace {

constexpr size_t kBlockVecs = 64;  // 4 KiB of float32: the block is re-read from L1
constexpr size_t kBlock = W * kBlockVecs;

struct RowStats {
  float max;
  float sum;  // sum of exp(x - max); NaN when the row holds a NaN or max is +-inf
};

// The online max-and-sum pass over one row. With kStore, exp(x - m_block)
// goes to `out` and each block's running max m_block to `mblk`.
template <class IO, bool kStore>
RowStats row_stats(const typename IO::T* x, size_t n, typename IO::T* out, float* mblk) {
  float m = -kInf;
  vf s = splat(0.0f);
  for (size_t b0 = 0, blk = 0; b0 < n; b0 += kBlock, ++blk) {
    const size_t len = std::min(kBlock, n - b0);
    const size_t full = len / W, rem = len % W;
    const typename IO::T* xb = x + b0;
    // Four running maxima, so the loop is not one chain of max latencies.
    vf m0 = splat(-kInf), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 4 <= full; i += 4) {
      m0 = vmax(m0, IO::load(xb + i * W));
      m1 = vmax(m1, IO::load(xb + (i + 1) * W));
      m2 = vmax(m2, IO::load(xb + (i + 2) * W));
      m3 = vmax(m3, IO::load(xb + (i + 3) * W));
    }
    for (; i < full; ++i) m0 = vmax(m0, IO::load(xb + i * W));
    if (rem) m1 = vmax(m1, IO::load_partial(xb + full * W, rem, -kInf));
    const float mb = hmax(vmax(vmax(m0, m1), vmax(m2, m3)));
    if (mb > m) {
      s = s * std::exp(m - mb);  // exp(-inf) = 0 while s is still 0
      m = mb;
    }
    // A NaN in x makes its exp, and so the sum, NaN; so does inf - inf.
    for (size_t i = 0; i < full; ++i) {
      const vf e = vexp_nonpositive(IO::load(xb + i * W) - m);
      s += e;
      if constexpr (kStore) IO::store(out + b0 + i * W, e);
    }
    if (rem) {
      const vf e = vexp_nonpositive(IO::load_partial(xb + full * W, rem, -kInf) - m);
      s += e;
      if constexpr (kStore) IO::store_partial(out + b0 + full * W, e, rem);
    }
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
  for (size_t i = 0; i < n; i += W) {
    const vf v = i + W <= n ? IO::load(x + i) : IO::load_partial(x + i, n - i, -kInf);
    for (int j = 0; j < W; ++j) {
      if (v[j] != v[j]) return v[j];
      m = v[j] > m ? v[j] : m;
    }
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
      const float scale = (mblk[blk] == st.max ? 1.0f : std::exp(mblk[blk] - st.max)) * inv;
      const size_t end = std::min(n, b0 + kBlock);
      size_t i = b0;
      for (; i + W <= end; i += W) IO::store(out + i, IO::load(out + i) * scale);
      if (i < end) IO::store_partial(out + i, IO::load_partial(out + i, end - i, 0.0f) * scale, end - i);
    }
  } else {
    const size_t full = n / W, rem = n % W;
    const vf mv = splat(st.max);
    for (size_t i = 0; i < full; ++i) IO::store(out + i * W, vexp_nonpositive(IO::load(x + i * W) - mv) * inv);
    if (rem) {
      const vf v = IO::load_partial(x + full * W, rem, -kInf);
      IO::store_partial(out + full * W, vexp_nonpositive(v - mv) * inv, rem);
    }
  }
}

template <class IO>
void softmax_impl(const void* xv, void* outv, size_t rows, size_t n) {
  using T = typename IO::T;
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  parallel_for(rows, n, [=](size_t b, size_t e) {
    std::vector<float> mblk((n + kBlock - 1) / kBlock + 1);
    for (size_t r = b; r < e; ++r) softmax_row<IO>(x + r * n, out + r * n, n, mblk.data());
  });
}

template <class IO>
void logsumexp_impl(const void* xv, void* outv, size_t rows, size_t n) {
  using T = typename IO::T;
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  parallel_for(rows, n, [=](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const T* row = x + r * n;
      const RowStats st = row_stats<IO, false>(row, n, nullptr, nullptr);
      const float v = degenerate(st) ? degenerate_logsumexp<IO>(row, n)
                                     : static_cast<float>(double(st.max) + std::log(double(st.sum)));
      out[r] = IO::from_float(v);
    }
  });
}

constexpr size_t kSumBlock = 4096;

// Sum of x[0:n]: float32 lanes within blocks of kSumBlock, block totals in double.
double sum_range(const float* x, size_t n) {
  double total = 0.0;
  for (size_t b0 = 0; b0 < n; b0 += kSumBlock) {
    const size_t len = std::min(kSumBlock, n - b0);
    const float* p = x + b0;
    vf a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * W <= len; i += 4 * W) {
      a0 += F32::load(p + i);
      a1 += F32::load(p + i + W);
      a2 += F32::load(p + i + 2 * W);
      a3 += F32::load(p + i + 3 * W);
    }
    for (; i + W <= len; i += W) a0 += F32::load(p + i);
    if (i < len) a1 += F32::load_partial(p + i, len - i, 0.0f);
    total += hsum((a0 + a1) + (a2 + a3));
  }
  return total;
}

}  // namespace

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
    case Dtype::float32: return softmax_impl<F32>(x, out, rows, n);
    case Dtype::float16: return softmax_impl<F16>(x, out, rows, n);
    case Dtype::bfloat16: return softmax_impl<BF16>(x, out, rows, n);
  }
}

void logsumexp_rows(Dtype dt, const void* x, void* out, size_t rows, size_t n) {
  switch (dt) {
    case Dtype::float32: return logsumexp_impl<F32>(x, out, rows, n);
    case Dtype::float16: return logsumexp_impl<F16>(x, out, rows, n);
    case Dtype::bfloat16: return logsumexp_impl<BF16>(x, out, rows, n);
  }
}

void sum_rows_f32(const float* x, float* out, size_t rows, size_t n) {
  const size_t nt = static_cast<size_t>(num_threads());
  if (rows >= nt || n < 2 * kMinWorkPerThread) {
    parallel_for(rows, n, [=](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) out[r] = static_cast<float>(sum_range(x + r * n, n));
    });
    return;
  }
  // Few long rows: split each row into block-aligned parts, a few per thread, so that
  // the caller takes over the parts of a helper that wakes late (a busy shared core).
  const size_t want = 4 * nt;
  const size_t part = ((n + want - 1) / want + kSumBlock - 1) / kSumBlock * kSumBlock;
  const size_t parts = (n + part - 1) / part;
  std::vector<double> partial(parts);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    parallel_for(parts, part, [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) partial[k] = sum_range(row + k * part, std::min(part, n - k * part));
    });
    double total = 0.0;
    for (double v : partial) total += v;
    out[r] = static_cast<float>(total);
  }
}

}  // namespace lazyx
