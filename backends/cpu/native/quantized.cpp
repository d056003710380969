// Native kernels of the `quantized` op pack: quantized_matmul and gather_qmm from
// the packed words.
//
// One kernel serves both ops: out[p] = x[xi[p]] @ W(wi[p]) (or its transpose), where
// W(j) is matrix j of the packed weights. Per output tile it decodes one group of
// packed values at a time into a small float tile (scale * q + bias, or scale * fp(q)
// for the float modes) held in L1, and multiplies from it: the dequantized matrix is
// never formed, and each packed word is read once per tile. Scales come in as float32
// (the Python side decodes E8M0/E4M3 scale codes and widens float16 scales: they are
// 1/group_size of the weights); x is float32.
//
// transpose (x @ W.T, W rows are outputs): a thread takes a block of output rows n,
// decodes row n (K values) and dots it with every row of x. Decode-shaped products
// (M = 1) read the packed row once and do one FMA per weight.
// not transpose (x @ W, W rows are the K axis): a thread takes a block of output
// columns, decodes row k's slice of it and adds x[m, k] * slice to every out row m.
//
// Element decoding: bits 2, 4, 8 shift-and-mask 16 lanes at a time; 3, 5, 6 read the
// bit stream (a value may straddle two words); mode codes: affine integers, E2M1 via a
// 16-entry table, E4M3 via a 256-entry table.
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
#include "simd.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lazyx {
namespace {


enum Mode { kAffine = 0, kFp4 = 1, kFp8 = 2 };

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

// The `count` codes starting at value index `first` of a packed row.
// Lane l of a 16-lane vector of values starting at word `w`: its word and its shift.
template <int Bits>
inline vf lanes_pow2(const uint32_t* w) {
  constexpr int per = 32 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  vu v, sh;
  for (int l = 0; l < W; ++l) {
    v[l] = w[l / per];
    sh[l] = (l % per) * Bits;
  }
  return __builtin_convertvector((v >> sh) & mask, vf);
}

// The `count` codes starting at value index `first` of a packed row.
template <int Bits>
inline void codes_pow2(const uint32_t* row, size_t first, int count, float* out) {
  constexpr int per = 32 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  const uint32_t* w = row + first / per;  // groups start on word boundaries
  int i = 0;
  for (; i + W <= count; i += W) {
    const vf f = lanes_pow2<Bits>(w + i / per);
    std::memcpy(out + i, &f, sizeof(f));
  }
  for (; i < count; ++i) out[i] = static_cast<float>((w[i / per] >> ((i % per) * Bits)) & mask);
}

#if defined(__AVX2__) && defined(__FMA__)
// Values [8j, 8j + 8) of the packed words at w as floats (AVX2: shift, mask, convert).
template <int Bits>
inline __m256 lanes8(const uint32_t* w, int j) {
  if constexpr (Bits == 8) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 2 * j));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  } else if constexpr (Bits == 4) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[j])), sh);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xf)));
  } else {
    const __m256i sh = (j & 1) ? _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)
                               : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[j / 2])), sh);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x3)));
  }
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

// out[r] = sum_k x[k] * (s_rg * q_r[k] + b_rg) for R affine packed rows (C words apart),
// straight from the words: per group, s_rg * <x_g, q_rg> + b_rg * sum(x_g) (the group sums
// of x come precomputed). R rows at once give 2R independent FMA chains sharing each x
// load (one row alone is bound by the FMA latency).
template <int Bits, int R>
inline void rows_dot_affine(const uint32_t* rows, size_t C, const float* x, const float* sc,
                            const float* bi, size_t G, const float* xsum, size_t K, int gs,
                            float* out) {
  constexpr int per = 32 / Bits;
  const size_t groups = K / gs;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 total[R];
  float bias_part[R];
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps(), bias_part[r] = 0.f;
  for (size_t g = 0; g < groups; ++g) {
    __m256 a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    const float* xg = x + g * gs;
    const size_t w0 = g * gs / per;
    for (int j = 0; j < gs / 8; j += 2) {
      const __m256 x0 = _mm256_loadu_ps(xg + 8 * j), x1 = _mm256_loadu_ps(xg + 8 * j + 8);
      for (int r = 0; r < R; ++r) {
        const uint32_t* wg = rows + r * C + w0;
        a0[r] = _mm256_fmadd_ps(x0, lanes8<Bits>(wg, j), a0[r]);
        a1[r] = _mm256_fmadd_ps(x1, lanes8<Bits>(wg, j + 1), a1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(a0[r], a1[r]), _mm256_set1_ps(sc[r * G + g]),
                                 total[r]);
      bias_part[r] += bi[r * G + g] * xsum[g];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(total[r]) + bias_part[r];
#else
  for (int r = 0; r < R; ++r) {
    vf total = splat(0.f);
    float bias_part = 0.f;
    for (size_t g = 0; g < groups; ++g) {
      vf acc = splat(0.f);
      const float* xg = x + g * gs;
      const uint32_t* wg = rows + r * C + g * gs / per;
      for (int i = 0; i < gs; i += W) {
        vf xv;
        std::memcpy(&xv, xg + i, sizeof(vf));
        acc += xv * lanes_pow2<Bits>(wg + i / per);
      }
      total += acc * sc[r * G + g];
      bias_part += bi[r * G + g] * xsum[g];
    }
    float sum = bias_part;
    for (int l = 0; l < W; ++l) sum += total[l];
    out[r] = sum;
  }
#endif
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

// Decode `count` (a multiple of gs) values of a packed row from value `first`, with
// their groups' scales (and biases), into out.
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
    const size_t g0 = first / gs;
    for (int g = 0; g < count / gs; ++g) {
      float* o = out + g * gs;
      const float s = sc[g0 + g];
      if (mode == kAffine) {
        const float b = bi[g0 + g];
        for (int j = 0; j < gs; ++j) o[j] = s * o[j] + b;
      } else if (mode == kFp4) {
        for (int j = 0; j < gs; ++j) o[j] = s * kFp4Table[static_cast<int>(o[j])];
      } else {
        for (int j = 0; j < gs; ++j) o[j] = s * kE4M3.v[static_cast<int>(o[j])];
      }
    }
  }
};

inline float dot(const float* a, const float* b, size_t n) {
  vf acc0 = splat(0.f), acc1 = splat(0.f);
  size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    vf a0, b0, a1, b1;
    std::memcpy(&a0, a + i, sizeof(vf));
    std::memcpy(&b0, b + i, sizeof(vf));
    std::memcpy(&a1, a + i + W, sizeof(vf));
    std::memcpy(&b1, b + i + W, sizeof(vf));
    acc0 += a0 * b0;
    acc1 += a1 * b1;
  }
  acc0 += acc1;
  float s = 0.f;
  for (int l = 0; l < W; ++l) s += acc0[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

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
  const float* scales;   // (nw, R, groups per row)
  const float* biases;   // same, or nullptr
  const int64_t* xi;     // (P)
  const int64_t* wi;     // (P)
  float* out;            // (P, M, N)
  size_t P, M, K, N, R, C, G;
  bool transpose;
  Decoder dec;
};

void run(const Problem& q) {
  const size_t mat_w = q.R * q.C, mat_s = q.R * q.G;
  if (q.transpose) {
    // items: (p, block of 8 output rows)
    constexpr size_t kRows = 8;
    // Small M: multiply straight from the words (decoding per row of x is cheaper than
    // a tile round trip); larger M: decode each row once into the tile.
    const int b = q.dec.bits;
    const bool fast = q.dec.mode == kAffine && (b == 2 || b == 4 || b == 8) && q.M <= 4;
    const size_t blocks = (q.N + kRows - 1) / kRows;
    parallel_for(q.P * blocks, kRows * q.K * (q.M + 2), [&](size_t b0, size_t b1) {
      std::vector<float> tile(2 * q.K), xsum(fast ? q.M * q.G : 0);
      for (size_t it = b0; it < b1; ++it) {
        const size_t p = it / blocks, n0 = (it % blocks) * kRows, n1 = std::min(q.N, n0 + kRows);
        const float* x = q.x + q.xi[p] * q.M * q.K;
        const uint32_t* w = q.w + q.wi[p] * mat_w;
        const float* sc = q.scales + q.wi[p] * mat_s;
        const float* bi = q.biases ? q.biases + q.wi[p] * mat_s : nullptr;
        float* out = q.out + p * q.M * q.N;
        if (fast) {
          for (size_t m = 0; m < q.M; ++m) {
            const float* xm = x + m * q.K;
            for (size_t g = 0; g < q.G; ++g) {
              float t = 0.f;
              for (int j = 0; j < q.dec.gs; ++j) t += xm[g * q.dec.gs + j];
              xsum[m * q.G + g] = t;
            }
          }
          for (size_t m = 0; m < q.M; ++m) {
            const float* xm = x + m * q.K;
            const float* xs = xsum.data() + m * q.G;
            for (size_t n = n0; n < n1;) {
              const uint32_t* row = w + n * q.C;
              const float *s = sc + n * q.G, *b = bi + n * q.G;
              float v[4];
              const bool four = n + 4 <= n1;
#define LAZYX_ROWS(B)                                                                        \
  if (four)                                                                                  \
    rows_dot_affine<B, 4>(row, q.C, xm, s, b, q.G, xs, q.K, q.dec.gs, v);                    \
  else                                                                                       \
    rows_dot_affine<B, 1>(row, q.C, xm, s, b, q.G, xs, q.K, q.dec.gs, v);
              switch (q.dec.bits) {
                case 2: LAZYX_ROWS(2) break;
                case 4: LAZYX_ROWS(4) break;
                default: LAZYX_ROWS(8)
              }
#undef LAZYX_ROWS
              const size_t done = four ? 4 : 1;
              for (size_t r = 0; r < done; ++r) out[m * q.N + n + r] = v[r];
              n += done;
            }
          }
          continue;
        }
        // Two decoded rows of W at a time against four rows of x: eight running dot
        // products share each load (a register-blocked GEMM micro-kernel).
        for (size_t n = n0; n < n1; n += 2) {
          const size_t nr = std::min<size_t>(2, n1 - n);
          for (size_t r = 0; r < nr; ++r)
            q.dec(w + (n + r) * q.C, sc + (n + r) * q.G, bi ? bi + (n + r) * q.G : nullptr, 0,
                  static_cast<int>(q.K), tile.data() + r * q.K);
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
    const size_t cols = std::max<size_t>(q.dec.gs, (512 / q.dec.gs) * q.dec.gs);
    const size_t blocks = (q.N + cols - 1) / cols;
    parallel_for(q.P * blocks, cols * q.K * (q.M + 2), [&](size_t b0, size_t b1) {
      std::vector<float> tile(cols);
      for (size_t it = b0; it < b1; ++it) {
        const size_t p = it / blocks, c0 = (it % blocks) * cols, c1 = std::min(q.N, c0 + cols);
        const size_t width = c1 - c0;
        const float* x = q.x + q.xi[p] * q.M * q.K;
        const uint32_t* w = q.w + q.wi[p] * mat_w;
        const float* sc = q.scales + q.wi[p] * mat_s;
        const float* bi = q.biases ? q.biases + q.wi[p] * mat_s : nullptr;
        float* out = q.out + p * q.M * q.N;
        for (size_t m = 0; m < q.M; ++m) std::fill(out + m * q.N + c0, out + m * q.N + c1, 0.f);
        for (size_t k = 0; k < q.K; ++k) {
          q.dec(w + k * q.C, sc + k * q.G, bi ? bi + k * q.G : nullptr, c0,
                static_cast<int>(width), tile.data());
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

}  // namespace

void bind_quantized(nb::module_& m) {
  m.def(
      "quantized_matmul",
      [](In<float> x, In<uint32_t> w, In<float> scales, In<float> biases, bool has_biases,
         In<int64_t> xi, In<int64_t> wi, Out<float> out, int bits, int group_size, int mode,
         bool transpose) {
        if (x.ndim() != 3 || w.ndim() != 3 || scales.ndim() != 3 || out.ndim() != 3)
          throw nb::value_error("[quantized_matmul] x, w, scales and out must be 3-D.");
        Problem q{};
        q.x = x.data();
        q.w = w.data();
        q.scales = scales.data();
        q.biases = has_biases ? biases.data() : nullptr;
        q.xi = xi.data();
        q.wi = wi.data();
        q.out = out.data();
        q.P = out.shape(0);
        q.M = x.shape(1);
        q.K = x.shape(2);
        q.N = out.shape(2);
        q.R = w.shape(1);
        q.C = w.shape(2);
        q.G = scales.shape(2);
        q.transpose = transpose;
        q.dec = Decoder{bits, group_size, mode};
        const size_t vals = q.C * 32 / bits;
        if (xi.shape(0) != q.P || wi.shape(0) != q.P || out.shape(1) != q.M ||
            (transpose ? (q.R != q.N || vals != q.K) : (q.R != q.K || vals != q.N)) ||
            q.G * group_size != vals || (has_biases && biases.size() != scales.size()))
          throw nb::value_error("[quantized_matmul] inconsistent shapes.");
        for (size_t p = 0; p < q.P; ++p)
          if (q.xi[p] < 0 || static_cast<size_t>(q.xi[p]) >= x.shape(0) || q.wi[p] < 0 ||
              static_cast<size_t>(q.wi[p]) >= w.shape(0))
            throw nb::index_error("[gather_qmm] index out of range.");
        nb::gil_scoped_release release;
        run(q);
      },
      "x"_a.noconvert(), "w"_a.noconvert(), "scales"_a.noconvert(), "biases"_a.noconvert(),
      "has_biases"_a, "xi"_a.noconvert(), "wi"_a.noconvert(), "out"_a.noconvert(), "bits"_a,
      "group_size"_a, "mode"_a, "transpose"_a,
      "out[p] = x[xi[p]] @ W(wi[p]) (.T with transpose) from packed uint32 weights; mode 0 "
      "affine (scale * q + bias), 1 E2M1, 2 E4M3 elements times float32 scales.");
}

}  // namespace lazyx
