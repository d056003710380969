// Portable 16-lane float vectors (GCC/Clang vector extensions), a fast exp,
// and loads/stores that convert float16/bfloat16 to and from float32.
//
// Vector extensions compile to the widest ISA the build allows (AVX-512 with
// -march=native here, split into AVX2/SSE halves elsewhere) without relying on
// the auto-vectoriser, and need no per-ISA copies of the kernels.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lazyx {

constexpr int W = 16;  // lanes per vector

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

inline vf splat(float v) { return vf{} + v; }

constexpr float kInf = std::numeric_limits<float>::infinity();

inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vabs(vf a) { return (vf)((vi)a & 0x7fffffff); }

// Horizontal max and sum as trees of lane shuffles: 4 steps, not a 15-long chain.
inline vf swap_halves(vf v, int w) {
  switch (w) {
    case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
}

inline float hmax(vf v) {
  for (int w = W / 2; w > 0; w /= 2) v = vmax(v, swap_halves(v, w));
  return v[0];
}

inline float hsum(vf v) {
  for (int w = W / 2; w > 0; w /= 2) v += swap_halves(v, w);
  return v[0];
}

inline bool any(vi m) {
  int32_t r = 0;
  for (int i = 0; i < W; ++i) r |= m[i];
  return r != 0;
}

// exp(x) for float32 lanes: x = n ln2 + r with |r| <= ln2/2 (one FMA with ln 2
// rounded to float), a degree-5 minimax polynomial for e^r, then scaling by
// 2^n. Relative error: about 2.5 ulp (as NumPy's float32 exp) for |x| <= 16,
// growing to ~5.5 ulp near the ends of float range, where the reduction's error
// (n times ln 2's rounding) dominates; results are never off by more than a
// few 1e-7 of themselves. exp(-inf) = 0, exp(NaN) = NaN, results below float
// range flush to 0. vexp_nonpositive skips the clamp that keeps +inf and huge
// x finite-or-inf: the kernels only take exp of x - max <= 0.
namespace exp_detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147182464599609375f;  // ln 2 rounded to float
constexpr float kC5 = 0.008290315046906471f, kC4 = 0.04189793020486832f,
                kC3 = 0.1666763573884964f, kC2 = 0.4999915063381195f, kC1 = 0.9999997019767761f;

inline vf poly(vf r) {
  vf p = splat(kC5);
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + kC2;
  p = p * r + kC1;
  return p * r + 1.0f;
}
}  // namespace exp_detail

inline vf vexp_nonpositive(vf x) {
  using namespace exp_detail;
#if defined(__AVX512F__)
  // vscalefps computes p * 2^n with correct underflow.
  const __m512 xv = (__m512)x;
  const __mmask16 keep = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(-104.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xv, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2), xv);
  return (vf)_mm512_maskz_scalef_ps(keep, (__m512)poly((vf)r), n);
#else
  const vi keep = (x >= -87.3365447505531f) | (x != x);
  x = x > 88.7228391116729996f ? splat(88.7228391116729996f) : x;  // NaN stays NaN
  x = x < -87.3365447505531f ? splat(-87.3365447505531f) : x;
  // n = round(x log2 e) with the 1.5 * 2^23 trick; t's low bits hold n as an integer.
  const vf t = x * kLog2e + 12582912.0f;
  const vf n = t - 12582912.0f;
  const vf r = x - n * kLn2;
  const vi ni = (vi)t - 0x4B400000;
  // 2^n as two factors, so n = 128 (x near 88.72) does not overflow the exponent.
  const vf half = (vf)(((ni >> 1) + 127) << 23);
  const vf rest = (vf)(((ni - (ni >> 1)) + 127) << 23);
  return keep ? poly(r) * half * rest : splat(0.0f);
#endif
}

inline vf vexp(vf x) {
  return vexp_nonpositive(x > 100.0f ? splat(100.0f) : x);  // NaN stays NaN
}

// -- scalar conversions (round to nearest even, as ml_dtypes and NumPy) -----
inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if (f != f) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t em = h & 0x7fff;
  // Shifting exponent and mantissa into place and multiplying by 2^112 handles
  // normals and subnormals alike; inf/NaN get the all-ones exponent.
  float f = bits_to_float(em << 13) * bits_to_float(0x77800000);
  uint32_t u = float_to_bits(f);
  if (em >= 0x7c00) u |= 0x7f800000;
  return bits_to_float(u | sign);
}

inline uint16_t float_to_f16(float x) {
  uint32_t f = float_to_bits(x);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint32_t o;
  if (f >= 0x47800000u) {  // overflow to inf, or NaN
    o = f > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (f < 0x38800000u) {  // subnormal or zero: let the FPU round
    const float t = bits_to_float(f) + 0.5f;
    o = float_to_bits(t) - 0x3f000000u;
  } else {
    const uint32_t odd = (f >> 13) & 1;
    f += 0xc8000fffu;  // rebias the exponent ((15 - 127) << 23) and round
    f += odd;
    o = f >> 13;
  }
  return uint16_t(o | (sign >> 16));
}

// -- typed loads and stores -------------------------------------------------
// Each IO type reads and writes W elements at a time as a vf of float32; the
// partial forms handle a row's tail, filling missing lanes with `fill`.
struct F32 {
  using T = float;
  static vf load(const T* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
  static vf load_partial(const T* p, size_t k, float fill) {
    vf v = splat(fill);
    std::memcpy(&v, p, k * sizeof(T));
    return v;
  }
  static void store(T* p, vf v) { std::memcpy(p, &v, sizeof v); }
  static void store_partial(T* p, vf v, size_t k) { std::memcpy(p, &v, k * sizeof(T)); }
  static T from_float(float f) { return f; }
};

struct BF16 {
  using T = uint16_t;
  static vf load(const T* p) {
    vh h;
    std::memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
  }
  static vf load_partial(const T* p, size_t k, float fill) {
    T buf[W];
    const T f = float_to_bf16(fill);
    for (int i = 0; i < W; ++i) buf[i] = f;
    std::memcpy(buf, p, k * sizeof(T));
    return load(buf);
  }
  static void store(T* p, vf v) {
    const vu u = (vu)v;
    const vi nan = v != v;
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu quiet = (u >> 16) | 0x40u;
    const vh h = __builtin_convertvector(nan ? quiet : rounded, vh);
    std::memcpy(p, &h, sizeof h);
  }
  static void store_partial(T* p, vf v, size_t k) {
    T buf[W];
    store(buf, v);
    std::memcpy(p, buf, k * sizeof(T));
  }
  static T from_float(float f) { return float_to_bf16(f); }
};

struct F16 {
  using T = uint16_t;
  static vf load(const T* p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__)
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    vf v;
    std::memcpy(&v, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
    return v;
#else
    vf v;
    for (int i = 0; i < W; ++i) v[i] = f16_to_float(p[i]);
    return v;
#endif
  }
  static vf load_partial(const T* p, size_t k, float fill) {
    T buf[W];
    const T f = float_to_f16(fill);
    for (int i = 0; i < W; ++i) buf[i] = f;
    std::memcpy(buf, p, k * sizeof(T));
    return load(buf);
  }
  static void store(T* p, vf v) {
#if defined(__AVX512F__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    __m256 lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(lo, mode));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(hi, mode));
#else
    for (int i = 0; i < W; ++i) p[i] = float_to_f16(v[i]);
#endif
  }
  static void store_partial(T* p, vf v, size_t k) {
    T buf[W];
    store(buf, v);
    std::memcpy(p, buf, k * sizeof(T));
  }
  static T from_float(float f) { return float_to_f16(f); }
};

}  // namespace lazyx
