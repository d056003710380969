// Float vectors of the machine's own width (8 lanes with AVX2, 16 with AVX-512,
// 4 elsewhere), for the hot loops of the fast and matmuls packs.
//
// simd.h's `vf` is always 16 lanes; where the ISA's registers are narrower
// (AVX2), GCC lowers every operation on it through stack memory, which makes a
// reduction loop several times slower than the same loop on native vectors
// (measured with GCC 12: a row's sum of squares 7x slower). Kernels that run
// at memory or FMA speed use `vn` instead: the same vector-extension style,
// one register per value. The scalar conversions and exp's constants come
// from simd.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simd.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace lazyx::lanes {

#if defined(__AVX512F__)
constexpr int L = 16;
#elif defined(__AVX__)
constexpr int L = 8;
#else
constexpr int L = 4;
#endif

typedef float vn __attribute__((vector_size(4 * L)));
typedef int32_t vni __attribute__((vector_size(4 * L)));
typedef uint32_t vnu __attribute__((vector_size(4 * L)));
typedef uint16_t vnh __attribute__((vector_size(2 * L)));

// A broadcast (not `vn{} + v`: adding +0 is no identity for -0, so the compiler
// keeps an add in front of every broadcast).
inline vn splat(float v) {
#if defined(__AVX512F__)
  return (vn)_mm512_set1_ps(v);
#elif defined(__AVX__)
  return (vn)_mm256_set1_ps(v);
#else
  vn r;
  for (int i = 0; i < L; ++i) r[i] = v;
  return r;
#endif
}
inline vn vmax(vn a, vn b) { return a > b ? a : b; }

inline float hsum(vn v) {
  float s = 0.0f;
  for (int i = 0; i < L; ++i) s += v[i];
  return s;
}

inline float hmax(vn v) {
  float m = v[0];
  for (int i = 1; i < L; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) as simd.h's vexp (same reduction and polynomial, same accuracy) on
// native vectors: exp_nonpositive for x <= 0 (or NaN), exp for any x.
namespace detail {
template <bool kAny>
inline vn exp_impl(vn x) {
  using namespace exp_detail;
  const vni keep = (x >= -87.3365447505531f) | (x != x);
  if constexpr (kAny) x = x > 88.7228391116729996f ? splat(88.7228391116729996f) : x;  // NaN stays NaN
  x = x < -87.3365447505531f ? splat(-87.3365447505531f) : x;
  const vn t = x * kLog2e + 12582912.0f;  // n = round(x log2 e) in t's low bits
  const vn n = t - 12582912.0f;
  const vn r = x - n * kLn2;
  const vni ni = (vni)t - 0x4B400000;
  vn p = splat(kC5);
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + kC2;
  p = p * r + kC1;
  p = p * r + 1.0f;
  if constexpr (kAny) {  // 2^n as two factors: n = 128 (x near 88.72) stays finite
    p = p * (vn)(((ni >> 1) + 127) << 23);
    return keep ? p * (vn)(((ni - (ni >> 1)) + 127) << 23) : splat(0.0f);
  } else {
    return keep ? p * (vn)((ni + 127) << 23) : splat(0.0f);
  }
}
}  // namespace detail

inline vn exp_nonpositive(vn x) { return detail::exp_impl<false>(x); }
inline vn exp(vn x) { return detail::exp_impl<true>(x); }

// -- typed loads and stores: L elements as float32 lanes --------------------
struct F32 {
  using T = float;
  static vn load(const T* p) { vn v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(T* p, vn v) { std::memcpy(p, &v, sizeof v); }
  static float scalar(T v) { return v; }
  static T from_float(float f) { return f; }
};

struct BF16 {
  using T = uint16_t;
  static vn load(const T* p) {
    vnh h;
    std::memcpy(&h, p, sizeof h);
    return (vn)(__builtin_convertvector(h, vnu) << 16);
  }
  static void store(T* p, vn v) {
    const vnu u = (vnu)v;
    const vni nan = v != v;
    const vnu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vnu quiet = (u >> 16) | 0x40u;
    const vnh h = __builtin_convertvector(nan ? quiet : rounded, vnh);
    std::memcpy(p, &h, sizeof h);
  }
  static float scalar(T v) { return bf16_to_float(v); }
  static T from_float(float f) { return float_to_bf16(f); }
};

struct F16 {
  using T = uint16_t;
  static vn load(const T* p) {
#if defined(__AVX512F__)
    return (vn)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX__) && defined(__F16C__)
    return (vn)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    vn v;
    for (int i = 0; i < L; ++i) v[i] = f16_to_float(p[i]);
    return v;
#endif
  }
  static void store(T* p, vn v) {
#if defined(__AVX512F__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX__) && defined(__F16C__)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    for (int i = 0; i < L; ++i) p[i] = float_to_f16(v[i]);
#endif
  }
  static float scalar(T v) { return f16_to_float(v); }
  static T from_float(float f) { return float_to_f16(f); }
};

// The first k < L elements (the rest read `fill`), and a store of the first k. float32
// uses masked loads and stores (which touch no memory past the k elements); a copy
// through a buffer of variable length k calls memcpy, which made a row of 10 floats
// cost as much as one of 100 in the row kernels (softmax, logsumexp).
#if defined(__AVX512F__)
inline __mmask16 first_lanes(size_t k) { return static_cast<__mmask16>((1u << k) - 1u); }
#elif defined(__AVX2__)
inline __m256i first_lanes(size_t k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

template <class IO>
inline vn load_partial(const typename IO::T* p, size_t k, float fill) {
#if defined(__AVX512F__) || defined(__AVX2__)
  if constexpr (std::is_same_v<IO, F32>) {
#if defined(__AVX512F__)
    return (vn)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), first_lanes(k), p);
#else
    const __m256i m = first_lanes(k);
    return (vn)_mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
#endif
  }
#endif
  typename IO::T buf[L];
  const typename IO::T f = IO::from_float(fill);
  for (int i = 0; i < L; ++i) buf[i] = f;
  std::memcpy(buf, p, k * sizeof(typename IO::T));
  return IO::load(buf);
}

template <class IO>
inline void store_partial(typename IO::T* p, vn v, size_t k) {
#if defined(__AVX512F__) || defined(__AVX2__)
  if constexpr (std::is_same_v<IO, F32>) {
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, first_lanes(k), (__m512)v);
#else
    _mm256_maskstore_ps(p, first_lanes(k), (__m256)v);
#endif
    return;
  }
#endif
  typename IO::T buf[L];
  IO::store(buf, v);
  std::memcpy(p, buf, k * sizeof(typename IO::T));
}

// A store that bypasses the caches (p aligned to L elements of T): a plain
// store of a line not in cache first reads it (write-allocate), a third memory
// transfer beside a streaming kernel's read and write. For outputs larger than
// the last-level cache, which the next kernel reads from memory anyway.
template <class IO>
inline void store_stream(typename IO::T* p, vn v) {
#if defined(__SSE2__)
  alignas(64) typename IO::T buf[L];
  IO::store(buf, v);
  char* d = reinterpret_cast<char*>(p);
  const char* s = reinterpret_cast<const char*>(buf);
#if defined(__AVX512F__)
  if constexpr (sizeof buf == 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_load_si512(s));
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof buf % 32 == 0) {
    for (size_t o = 0; o < sizeof buf; o += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o), _mm256_load_si256(reinterpret_cast<const __m256i*>(s + o)));
    return;
  }
#endif
  for (size_t o = 0; o < sizeof buf; o += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + o), _mm_load_si128(reinterpret_cast<const __m128i*>(s + o)));
#else
  IO::store(p, v);
#endif
}

// Orders a thread's streaming stores before whatever it does next (the
// thread pool's completion signal).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Outputs of at least this many bytes are written with store_stream: half the
// last-level cache of the small servers lazyx runs on (32 MiB).
constexpr size_t kStreamBytes = size_t(16) << 20;

}  // namespace lazyx::lanes
