// Native kernels of the `quantized` op pack: quantized_matmul and gather_qmm from
// the packed words.
//
// One kernel serves both ops: out[p] = x[xi[p]] @ W(wi[p]) (or its transpose), where
// W(j) is matrix j of the packed weights; the dequantized matrix is never formed.
// Scales and biases come as stored (float32/float16/bfloat16, or E8M0/E4M3 codes:
// GroupValues reads them), so the Python side converts nothing per call; x is float32.
//
// transpose (x @ W.T, W rows are outputs), the decode-shaped case (M <= 8 rows of x;
// affine 2/4/8 bits, or E2M1 elements), on AVX2: a thread takes a block of output rows
// and reads each packed row once. It loads 8 bytes at a time, widens them to 8 int32
// lanes and splits each lane's 8/bits values with shifts and masks (vector t holds
// values j*P + t of the chunk), converts to float (E2M1: an 8-entry permute plus the
// sign bit) and FMAs them with x, whose chunks were permuted into that order once per
// call. Per group it multiplies the running sum by the scale and adds bias * (the
// group's sum of x, precomputed): sum_k x_k (s q_k + b) = s <x, q> + b sum(x).
// Everything else decodes row tiles into L1:
//   transpose, larger M: a thread decodes row n (K values: scale * q + bias, or
//   scale * fp(q)) into a tile and dots it with the rows of x (a register-blocked
//   micro-kernel: 2 tile rows by 4 x rows).
//   not transpose (x @ W, W rows are the K axis): a thread takes a block of output
//   columns, decodes row k's slice of it and adds x[m, k] * slice to every out row m.
//
// Element decoding in the tile paths: bits 2, 4, 8 shift and mask per word; 3, 5, 6 read
// the bit stream (a value may straddle two words); E2M1 via a 16-entry table, E4M3
// via a 256-entry table.
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "packs.h"
#include "parallel.h"
#include "lanes.h"
#include "simd.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lazyx {
namespace {


enum Mode { kAffine = 0, kFp4 = 1, kFp8 = 2 };
// How group scales (and biases) are stored.
enum ScaleKind { kF32 = 0, kF16 = 1, kBF16 = 2, kE8M0 = 3, kE4M3Codes = 4 };

const float kFp4Table[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                             -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// E4M3 (fn: no infinities, 0x7f/0xff NaN) to float, all 256 codes.
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) {
      const int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
      float x;
      if (e == 0xf && m == 7)
        x = NAN;
      else if (e == 0)
        x = std::ldexp(static_cast<float>(m), -9);
      else
        x = std::ldexp(1.f + m / 8.f, e - 7);
      v[c] = s ? -x : x;
    }
  }
};
const E4M3Table kE4M3;

// Per-group values (scales or biases) as stored, read as float32. E8M0 code s is
// 2^(s - 127), code 0 2^-127 (as MLX decodes it).
struct GroupValues {
  const uint8_t* p = nullptr;
  int kind = kF32;

  float at(size_t i) const {
    switch (kind) {
      case kF32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        return f;
      }
      case kF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        return f16_to_float(h);
      }
      case kBF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        return bf16_to_float(h);
      }
      case kE8M0:
        return bits_to_float(p[i] ? uint32_t(p[i]) << 23 : 0x00400000u);
      default:
        return kE4M3.v[p[i]];
    }
  }
  // Values [first, first + n) as float32: a pointer into the data (float32) or buf.
  const float* get(size_t first, size_t n, float* buf) const {
    if (!p) return nullptr;
    if (kind == kF32) return reinterpret_cast<const float*>(p) + first;
    for (size_t i = 0; i < n; ++i) buf[i] = at(first + i);
    return buf;
  }
};

inline float dot(const float* a, const float* b, size_t n) {
  using lanes::vn;
  constexpr int L = lanes::L;
  vn acc0 = lanes::splat(0.f), acc1 = lanes::splat(0.f);
  size_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    acc0 += lanes::F32::load(a + i) * lanes::F32::load(b + i);
    acc1 += lanes::F32::load(a + i + L) * lanes::F32::load(b + i + L);
  }
  float s = lanes::hsum(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kFastPath = true;

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Codes (int32 lanes, < 16) to floats: affine integers, or E2M1 values (the magnitude
// from the low 3 bits by a permute, the sign from bit 3).
template <int Mode>
inline __m256 code_values(__m256i q) {
  if constexpr (Mode == kAffine) {
    return _mm256_cvtepi32_ps(q);
  } else {
    const __m256 mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f), q);
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(q, 28), _mm256_set1_epi32(INT32_MIN));
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
  }
}

// The 64/Bits values of the 8 packed bytes at src as P = 8/Bits vectors: vector t holds
// values j*P + t (j < 8), lane j from byte j.
template <int Bits, int Mode>
inline void decode_chunk(const uint8_t* src, __m256* v) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  if constexpr (Bits == 8) {
    v[0] = code_values<Mode>(b);
  } else if constexpr (Bits == 4) {
    v[0] = code_values<Mode>(_mm256_and_si256(b, _mm256_set1_epi32(0xf)));
    v[1] = code_values<Mode>(_mm256_srli_epi32(b, 4));
  } else {
    const __m256i m = _mm256_set1_epi32(0x3);
    v[0] = code_values<Mode>(_mm256_and_si256(b, m));
    v[1] = code_values<Mode>(_mm256_and_si256(_mm256_srli_epi32(b, 2), m));
    v[2] = code_values<Mode>(_mm256_and_si256(_mm256_srli_epi32(b, 4), m));
    v[3] = code_values<Mode>(_mm256_srli_epi32(b, 6));
  }
}

// x rows in decode_chunk's order: within each chunk of V = 64/Bits values, position
// t*8 + j holds value j*P + t.
void permute_rows(const float* x, size_t rows, size_t K, int bits, float* xp) {
  const size_t P = 8 / bits, V = 8 * P;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < K; c += V)
      for (size_t t = 0; t < P; ++t)
        for (size_t j = 0; j < 8; ++j) xp[r * K + c + t * 8 + j] = x[r * K + c + j * P + t];
}

// out[m * N] = <x_m, row> for MB rows of x (permuted, K apart) and one packed row, from
// the words: per group g, s_g * <x_g, q_g> (+ b_g * xsum[m * G + g]). With one or two
// rows of x, two accumulators per row keep two FMA chains in flight.
template <int Bits, int Mode, int MB>
inline void row_fast(const uint8_t* row, const float* xp, size_t K, const float* s,
                     const float* b, const float* xsum, size_t G, int gs, float* out,
                     size_t N) {
  // U: chunks per step (8-bit chunks are one vector: two per step feed two chains; a
  // group holds at least 4 of them)
  constexpr int P = 8 / Bits, V = 8 * P, CH = MB <= 2 ? 2 : 1, U = P == 1 ? 2 : 1;
  __m256 total[MB];
  float bsum[MB];
  for (int m = 0; m < MB; ++m) total[m] = _mm256_setzero_ps(), bsum[m] = 0.f;
  const int chunks = gs / V;
  for (size_t g = 0; g < G; ++g) {
    __m256 a0[MB], a1[MB];  // two chains per row of x (the second unused when CH == 1)
    for (int m = 0; m < MB; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    const uint8_t* wg = row + g * gs * Bits / 8;
    const float* xg = xp + g * gs;
    // U chunks per step so that every accumulator index is a compile-time constant
    // (a runtime index would keep the accumulators in memory)
    for (int c = 0; c < chunks; c += U) {
      for (int u = 0; u < U; ++u) {
        __m256 v[P];
        decode_chunk<Bits, Mode>(wg + 8 * (c + u), v);
        for (int t = 0; t < P; ++t)
          for (int m = 0; m < MB; ++m) {
            const __m256 xv = _mm256_loadu_ps(xg + m * K + (c + u) * V + 8 * t);
            if (CH == 2 && (u * P + t) % 2)
              a1[m] = _mm256_fmadd_ps(xv, v[t], a1[m]);
            else
              a0[m] = _mm256_fmadd_ps(xv, v[t], a0[m]);
          }
      }
    }
    const __m256 sg = _mm256_set1_ps(s[g]);
    for (int m = 0; m < MB; ++m) {
      const __m256 a = CH == 2 ? _mm256_add_ps(a0[m], a1[m]) : a0[m];
      total[m] = _mm256_fmadd_ps(a, sg, total[m]);
      if constexpr (Mode == kAffine) bsum[m] += b[g] * xsum[m * G + g];
    }
  }
  for (int m = 0; m < MB; ++m) out[m * N] = hsum8(total[m]) + bsum[m];
}

template <int Bits, int Mode>
inline void rows_fast(int mb, const uint8_t* row, const float* xp, size_t K, const float* s,
                      const float* b, const float* xsum, size_t G, int gs, float* out,
                      size_t N) {
  switch (mb) {
    case 1: row_fast<Bits, Mode, 1>(row, xp, K, s, b, xsum, G, gs, out, N); break;
    case 2: row_fast<Bits, Mode, 2>(row, xp, K, s, b, xsum, G, gs, out, N); break;
    case 3: row_fast<Bits, Mode, 3>(row, xp, K, s, b, xsum, G, gs, out, N); break;
    default: row_fast<Bits, Mode, 4>(row, xp, K, s, b, xsum, G, gs, out, N);
  }
}
#else
constexpr bool kFastPath = false;
#endif

// The `count` codes starting at value index `first` of a packed row (a whole number of
// words: groups start on word boundaries).
template <int Bits>
inline void codes_pow2(const uint32_t* row, size_t first, int count, float* out) {
  constexpr int per = 32 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  const uint32_t* w = row + first / per;
  int i = 0;
#if defined(__AVX2__)
  // 8 values at a time in natural order: the word(s) broadcast, shifted per lane, masked
  const __m256i sh = Bits == 8   ? _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24)
                     : Bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                                 : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i m = _mm256_set1_epi32(mask);
  for (; i + 8 <= count; i += 8) {
    const size_t wi = static_cast<size_t>(i) / per;
    __m256i v;
    if constexpr (Bits == 8)
      v = _mm256_setr_epi32(w[wi], w[wi], w[wi], w[wi], w[wi + 1], w[wi + 1], w[wi + 1], w[wi + 1]);
    else
      v = _mm256_set1_epi32(static_cast<int>(Bits == 4 ? w[wi] : w[wi] >> (i % per * 2)));
    _mm256_storeu_ps(out + i, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, sh), m)));
  }
#endif
  for (; i < count; ++i) out[i] = static_cast<float>((w[i / per] >> ((i % per) * Bits)) & mask);
}

inline void codes_stream(const uint32_t* row, size_t first, int count, int bits, float* out) {
  const uint32_t mask = (1u << bits) - 1;
  for (int i = 0; i < count; ++i) {
    const size_t bit = (first + i) * bits, wi = bit / 32, sh = bit % 32;
    uint32_t v = row[wi] >> sh;
    if (sh + bits > 32) v |= row[wi + 1] << (32 - sh);
    out[i] = static_cast<float>(v & mask);
  }
}

// Decode `count` (a multiple of gs) values of a packed row from value `first` into out,
// with the scales (and biases) of their groups: sc[g] is the scale of group g of the
// range.
struct Decoder {
  int bits, gs, mode;
  void operator()(const uint32_t* row, const float* sc, const float* bi, size_t first,
                  int count, float* out) const {
    switch (bits) {
      case 2: codes_pow2<2>(row, first, count, out); break;
      case 4: codes_pow2<4>(row, first, count, out); break;
      case 8: codes_pow2<8>(row, first, count, out); break;
      default: codes_stream(row, first, count, bits, out);
    }
    for (int g = 0; g < count / gs; ++g) {
      float* o = out + g * gs;
      const float s = sc[g];
      if (mode == kAffine) {
        const float b = bi[g];
        for (int j = 0; j < gs; ++j) o[j] = s * o[j] + b;
      } else if (mode == kFp4) {
        for (int j = 0; j < gs; ++j) o[j] = s * kFp4Table[static_cast<int>(o[j])];
      } else {
        for (int j = 0; j < gs; ++j) o[j] = s * kE4M3.v[static_cast<int>(o[j])];
      }
    }
  }
};

// res[i][r] = <x row i, tile row r> for i < mr (<= 4) rows of x (K apart) and r < nr (<= 2)
// rows of the tile (K apart).
inline void dots_block(const float* x, size_t mr, const float* t, size_t nr, size_t K,
                       float res[4][2]) {
#if defined(__AVX2__) && defined(__FMA__)
  if (mr == 4 && nr == 2 && K % 8 == 0) {
    __m256 a[4][2];
    for (int i = 0; i < 4; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (size_t k = 0; k < K; k += 8) {
      const __m256 t0 = _mm256_loadu_ps(t + k), t1 = _mm256_loadu_ps(t + K + k);
      for (int i = 0; i < 4; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * K + k);
        a[i][0] = _mm256_fmadd_ps(xv, t0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(xv, t1, a[i][1]);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < 2; ++r) res[i][r] = hsum8(a[i][r]);
    return;
  }
#endif
  for (size_t i = 0; i < mr; ++i)
    for (size_t r = 0; r < nr; ++r) res[i][r] = dot(x + i * K, t + r * K, K);
}

struct Problem {
  const float* x;        // (nx, M, K)
  const uint32_t* w;     // (nw, R, C) packed
  GroupValues scales;    // (nw, R, G)
  GroupValues biases;    // same, or p == nullptr
  const int64_t* xi;     // (P)
  const int64_t* wi;     // (P)
  float* out;            // (P, M, N)
  size_t nx, P, M, K, N, R, C, G;
  bool transpose;
  Decoder dec;
};

// The fast transposed path applies (see the top of the file).
bool fast_case(const Problem& q) {
  const int b = q.dec.bits;
  return kFastPath && q.transpose && q.M <= 8 &&
         ((q.dec.mode == kAffine && (b == 2 || b == 4 || b == 8)) ||
          (q.dec.mode == kFp4 && b == 4));
}

void run_fast(const Problem& q) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr size_t kRows = 8;
  const size_t mat_w = q.R * q.C, mat_s = q.R * q.G, gs = q.dec.gs;
  // x in decode order and its group sums, once per call (x is small beside the weights)
  std::vector<float> xp(q.nx * q.M * q.K), xsum(q.nx * q.M * q.G);
  permute_rows(q.x, q.nx * q.M, q.K, q.dec.bits, xp.data());
  for (size_t r = 0; r < q.nx * q.M; ++r)
    for (size_t g = 0; g < q.G; ++g) {
      float t = 0.f;
      for (size_t j = 0; j < gs; ++j) t += q.x[r * q.K + g * gs + j];
      xsum[r * q.G + g] = t;
    }
  const size_t blocks = (q.N + kRows - 1) / kRows;
  parallel_for(q.P * blocks, kRows * q.K * (q.M + 2) / 4, [&](size_t b0, size_t b1) {
    std::vector<float> sbuf(q.G), bbuf(q.G);
    for (size_t it = b0; it < b1; ++it) {
      const size_t p = it / blocks, n0 = (it % blocks) * kRows, n1 = std::min(q.N, n0 + kRows);
      const size_t xr = static_cast<size_t>(q.xi[p]) * q.M;
      const size_t wm = static_cast<size_t>(q.wi[p]);
      for (size_t n = n0; n < n1; ++n) {
        const float* s = q.scales.get(wm * mat_s + n * q.G, q.G, sbuf.data());
        const float* b = q.biases.get(wm * mat_s + n * q.G, q.G, bbuf.data());
        const uint8_t* row = reinterpret_cast<const uint8_t*>(q.w + wm * mat_w + n * q.C);
        for (size_t m0 = 0; m0 < q.M; m0 += 4) {
          const int mb = static_cast<int>(std::min<size_t>(4, q.M - m0));
          const float* xm = xp.data() + (xr + m0) * q.K;
          const float* xs = xsum.data() + (xr + m0) * q.G;
          float* o = q.out + (p * q.M + m0) * q.N + n;
          if (q.dec.mode == kFp4)
            rows_fast<4, kFp4>(mb, row, xm, q.K, s, b, xs, q.G, q.dec.gs, o, q.N);
          else if (q.dec.bits == 4)
            rows_fast<4, kAffine>(mb, row, xm, q.K, s, b, xs, q.G, q.dec.gs, o, q.N);
          else if (q.dec.bits == 8)
            rows_fast<8, kAffine>(mb, row, xm, q.K, s, b, xs, q.G, q.dec.gs, o, q.N);
          else
            rows_fast<2, kAffine>(mb, row, xm, q.K, s, b, xs, q.G, q.dec.gs, o, q.N);
        }
      }
    }
  });
#else
  (void)q;
#endif
}

void run(const Problem& q) {
  const size_t mat_w = q.R * q.C, mat_s = q.R * q.G;
  if (fast_case(q)) {
    run_fast(q);
  } else if (q.transpose) {
    // items: (p, block of 8 output rows); each row decoded once into the tile
    constexpr size_t kRows = 8;
    const size_t blocks = (q.N + kRows - 1) / kRows;
    parallel_for(q.P * blocks, kRows * q.K * (q.M + 2), [&](size_t b0, size_t b1) {
      std::vector<float> tile(2 * q.K), sbuf(q.G), bbuf(q.G);
      for (size_t it = b0; it < b1; ++it) {
        const size_t p = it / blocks, n0 = (it % blocks) * kRows, n1 = std::min(q.N, n0 + kRows);
        const float* x = q.x + q.xi[p] * q.M * q.K;
        const uint32_t* w = q.w + q.wi[p] * mat_w;
        const size_t s0 = q.wi[p] * mat_s;
        float* out = q.out + p * q.M * q.N;
        // Two decoded rows of W at a time against four rows of x: eight running dot
        // products share each load (a register-blocked GEMM micro-kernel).
        for (size_t n = n0; n < n1; n += 2) {
          const size_t nr = std::min<size_t>(2, n1 - n);
          for (size_t r = 0; r < nr; ++r) {
            const float* s = q.scales.get(s0 + (n + r) * q.G, q.G, sbuf.data());
            const float* b = q.biases.get(s0 + (n + r) * q.G, q.G, bbuf.data());
            q.dec(w + (n + r) * q.C, s, b, 0, static_cast<int>(q.K), tile.data() + r * q.K);
          }
          for (size_t m = 0; m < q.M; m += 4) {
            const size_t mr = std::min<size_t>(4, q.M - m);
            float res[4][2];
            dots_block(x + m * q.K, mr, tile.data(), nr, q.K, res);
            for (size_t i = 0; i < mr; ++i)
              for (size_t r = 0; r < nr; ++r) out[(m + i) * q.N + n + r] = res[i][r];
          }
        }
      }
    });
  } else {
    // items: (p, block of output columns, a multiple of the group size)
    const size_t gs = q.dec.gs;
    const size_t cols = std::max<size_t>(gs, (512 / gs) * gs);
    const size_t blocks = (q.N + cols - 1) / cols;
    parallel_for(q.P * blocks, cols * q.K * (q.M + 2), [&](size_t b0, size_t b1) {
      std::vector<float> tile(cols), sbuf(cols / gs), bbuf(cols / gs);
      for (size_t it = b0; it < b1; ++it) {
        const size_t p = it / blocks, c0 = (it % blocks) * cols, c1 = std::min(q.N, c0 + cols);
        const size_t width = c1 - c0;
        const float* x = q.x + q.xi[p] * q.M * q.K;
        const uint32_t* w = q.w + q.wi[p] * mat_w;
        const size_t s0 = q.wi[p] * mat_s;
        float* out = q.out + p * q.M * q.N;
        for (size_t m = 0; m < q.M; ++m) std::fill(out + m * q.N + c0, out + m * q.N + c1, 0.f);
        for (size_t k = 0; k < q.K; ++k) {
          const float* s = q.scales.get(s0 + k * q.G + c0 / gs, width / gs, sbuf.data());
          const float* b = q.biases.get(s0 + k * q.G + c0 / gs, width / gs, bbuf.data());
          q.dec(w + k * q.C, s, b, c0, static_cast<int>(width), tile.data());
          for (size_t m = 0; m < q.M; ++m) {
            const float xv = x[m * q.K + k];
            float* o = out + m * q.N + c0;
            for (size_t j = 0; j < width; ++j) o[j] += xv * tile[j];
          }
        }
      }
    });
  }
}

size_t scale_bytes(int kind) { return kind == kF32 ? 4 : (kind == kF16 || kind == kBF16) ? 2 : 1; }

}  // namespace

void bind_quantized(nb::module_& m) {
  m.def(
      "quantized_matmul",
      [](In<float> x, In<uint32_t> w, In<uint8_t> scales, In<uint8_t> biases, int scale_kind,
         bool has_biases, In<int64_t> xi, In<int64_t> wi, Out<float> out, int bits,
         int group_size, int mode, bool transpose) {
        if (x.ndim() != 3 || w.ndim() != 3 || out.ndim() != 3)
          throw nb::value_error("[quantized_matmul] x, w and out must be 3-D.");
        if (scale_kind < kF32 || scale_kind > kE4M3Codes || (has_biases && scale_kind > kBF16))
          throw nb::value_error("[quantized_matmul] bad scale kind.");
        Problem q{};
        q.x = x.data();
        q.w = w.data();
        q.scales = GroupValues{scales.data(), scale_kind};
        q.biases = GroupValues{has_biases ? biases.data() : nullptr, scale_kind};
        q.xi = xi.data();
        q.wi = wi.data();
        q.out = out.data();
        q.nx = x.shape(0);
        q.P = out.shape(0);
        q.M = x.shape(1);
        q.K = x.shape(2);
        q.N = out.shape(2);
        q.R = w.shape(1);
        q.C = w.shape(2);
        q.transpose = transpose;
        q.dec = Decoder{bits, group_size, mode};
        if (bits < 2 || bits > 8 || group_size <= 0)
          throw nb::value_error("[quantized_matmul] bad bits or group size.");
        const size_t vals = q.C * 32 / bits;
        q.G = vals / group_size;
        const size_t groups = w.shape(0) * q.R * q.G;
        if (xi.shape(0) != q.P || wi.shape(0) != q.P || out.shape(1) != q.M ||
            (transpose ? (q.R != q.N || vals != q.K) : (q.R != q.K || vals != q.N)) ||
            q.G * group_size != vals || (q.C * 32) % bits ||
            scales.size() != groups * scale_bytes(scale_kind) ||
            (has_biases && biases.size() != scales.size()))
          throw nb::value_error("[quantized_matmul] inconsistent shapes.");
        for (size_t p = 0; p < q.P; ++p)
          if (q.xi[p] < 0 || static_cast<size_t>(q.xi[p]) >= x.shape(0) || q.wi[p] < 0 ||
              static_cast<size_t>(q.wi[p]) >= w.shape(0))
            throw nb::index_error("[gather_qmm] index out of range.");
        nb::gil_scoped_release release;
        run(q);
      },
      "x"_a.noconvert(), "w"_a.noconvert(), "scales"_a.noconvert(), "biases"_a.noconvert(),
      "scale_kind"_a, "has_biases"_a, "xi"_a.noconvert(), "wi"_a.noconvert(),
      "out"_a.noconvert(), "bits"_a, "group_size"_a, "mode"_a, "transpose"_a,
      "out[p] = x[xi[p]] @ W(wi[p]) (.T with transpose) from packed uint32 weights; mode 0 "
      "affine (scale * q + bias), 1 E2M1, 2 E4M3 elements times the group scales. scales "
      "and biases are the stored bytes: scale_kind 0 float32, 1 float16, 2 bfloat16, "
      "3 E8M0, 4 E4M3 codes.");
}

}  // namespace lazyx
