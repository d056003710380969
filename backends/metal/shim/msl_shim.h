// lazyx's MSL-on-the-CPU shim: lets a restricted Metal Shading Language kernel compile
// as C++17 with the system compiler, so that lazyx's Metal kernels are checked on
// machines without a Metal GPU (lazyx.backends.metal.msl_cpu builds and runs them).
//
// What it maps:
//   * function qualifiers and attributes: `kernel`, `[[kernel]]`, `[[buffer(n)]]`,
//     `[[host_name("...")]]`, `[[thread_position_in_grid]]`, `[[threads_per_grid]]`,
//     `[[max_total_threads_per_threadgroup(n)]]` (all vanish: the generated entry point
//     binds the arguments itself);
//   * address spaces `device`, `constant`, `thread` (vanish: one flat address space);
//   * scalar types `uint`, `ushort`, `uchar`, `ulong`, `half`, `bfloat` (the 16-bit
//     floats are stored as their bits and computed in float, rounded to nearest even
//     after each operation, as a GPU does), and `uint2`/`uint3` for thread positions;
//   * `metal::` math (float, half and bfloat overloads), `as_type`, `select`, `clamp`.
//
// What it does not: threadgroup memory and barriers, SIMD-group functions, atomics,
// textures, vector arithmetic. The grid runs one thread at a time, in order, so a
// kernel whose threads communicate cannot be checked here (it fails to compile: the
// names are undeclared).
#ifndef LAZYX_MSL_SHIM_H
#define LAZYX_MSL_SHIM_H

// Every standard header first: the macros below would rewrite words inside them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>

namespace lx_msl {

// -- 16-bit floats -------------------------------------------------------------------
inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct half_format {
  static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // rounds to infinity (>= 65520)
    if (ax < 0x38800000u) {
      // Below half's smallest normal: a multiple of 2**-24, rounded to nearest even by
      // the (exact) scaling and nearbyint in the default rounding mode.
      return uint16_t(sign | uint32_t(std::nearbyint(bits_float(ax) * 16777216.0f)));
    }
    uint32_t e = ax - 0x38000000u;                             // rebias 127 -> 15
    return uint16_t(sign | ((e + 0xfffu + ((e >> 13) & 1u)) >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      float f = float(m) * 5.9604644775390625e-8f;            // m * 2**-24, exact
      return sign ? -f : f;
    }
    return bits_float(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
  }
};

struct bfloat_format {
  static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  static float to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }
};

// A 16-bit float: its bits in memory (so that device buffers hold the GPU's format),
// float in arithmetic. Converts implicitly to and from the other scalar types, as MSL's do.
template <class Format>
struct float16_storage {
  uint16_t bits;
  float16_storage() = default;
  float16_storage(float f) : bits(Format::from_float(f)) {}
  float16_storage(double d) : bits(Format::from_float(float(d))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  float16_storage(I i) : bits(Format::from_float(float(i))) {}
  operator float() const { return Format::to_float(bits); }
  float16_storage& operator+=(float16_storage o) { return *this = float(*this) + float(o); }
  float16_storage& operator-=(float16_storage o) { return *this = float(*this) - float(o); }
  float16_storage& operator*=(float16_storage o) { return *this = float(*this) * float(o); }
  float16_storage& operator/=(float16_storage o) { return *this = float(*this) / float(o); }
  float16_storage operator-() const { float16_storage r; r.bits = uint16_t(bits ^ 0x8000u); return r; }
  float16_storage operator+() const { return *this; }
};

template <class T> struct is_float16 : std::false_type {};
template <class F> struct is_float16<float16_storage<F>> : std::true_type {};

// half op half -> half; half op float -> float; half op integer -> half (MSL's rules).
#define LX_MSL_ARITHMETIC(op)                                                              \
  template <class F>                                                                      \
  inline float16_storage<F> operator op(float16_storage<F> a, float16_storage<F> b) {     \
    return float16_storage<F>(float(a) op float(b));                                      \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>     \
  inline float operator op(float16_storage<F> a, T b) { return float(a) op float(b); }    \
  template <class F, class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>     \
  inline float operator op(T a, float16_storage<F> b) { return float(a) op float(b); }    \
  template <class F, class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>           \
  inline float16_storage<F> operator op(float16_storage<F> a, T b) {                      \
    return float16_storage<F>(float(a) op float(b));                                      \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>           \
  inline float16_storage<F> operator op(T a, float16_storage<F> b) {                      \
    return float16_storage<F>(float(a) op float(b));                                      \
  }
LX_MSL_ARITHMETIC(+)
LX_MSL_ARITHMETIC(-)
LX_MSL_ARITHMETIC(*)
LX_MSL_ARITHMETIC(/)
#undef LX_MSL_ARITHMETIC

#define LX_MSL_COMPARISON(op)                                                             \
  template <class F>                                                                      \
  inline bool operator op(float16_storage<F> a, float16_storage<F> b) {                   \
    return float(a) op float(b);                                                          \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>         \
  inline bool operator op(float16_storage<F> a, T b) { return float(a) op float(b); }     \
  template <class F, class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>         \
  inline bool operator op(T a, float16_storage<F> b) { return float(a) op float(b); }
LX_MSL_COMPARISON(==)
LX_MSL_COMPARISON(!=)
LX_MSL_COMPARISON(<)
LX_MSL_COMPARISON(<=)
LX_MSL_COMPARISON(>)
LX_MSL_COMPARISON(>=)
#undef LX_MSL_COMPARISON

// -- thread positions ------------------------------------------------------------------
struct uint2 { uint32_t x, y; };
struct uint3 { uint32_t x, y, z; };

// The value of a [[thread_position_in_grid]] / [[threads_per_grid]] parameter of type T
// for position `i` of a one-dimensional grid.
template <class T> T position(uint64_t i) {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (std::is_same_v<U, uint3>) return U{uint32_t(i), 0u, 0u};
  else if constexpr (std::is_same_v<U, uint2>) return U{uint32_t(i), 0u};
  else return U(i);
}

// The argument of a [[buffer(n)]] parameter of type T: a pointer into the buffer, or a
// reference to its first element.
template <class T> T bind(void* buffer) {
  if constexpr (std::is_pointer_v<T>) return static_cast<T>(buffer);
  else return *static_cast<std::remove_reference_t<T>*>(buffer);
}

// The parameter types of a kernel function.
template <class Fn> struct parameters;
template <class R, class... A> struct parameters<R (*)(A...)> { using type = std::tuple<A...>; };
template <class Fn, size_t K>
using parameter = std::tuple_element_t<K, typename parameters<Fn>::type>;

}  // namespace lx_msl

// -- the MSL vocabulary ----------------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef lx_msl::float16_storage<lx_msl::half_format> half;
typedef lx_msl::float16_storage<lx_msl::bfloat_format> bfloat;
typedef bfloat bfloat16_t;
using lx_msl::uint2;
using lx_msl::uint3;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wliteral-suffix"
#pragma clang diagnostic ignored "-Wuser-defined-literals"
inline half operator""h(long double v) { return half(double(v)); }   // 1.5h
#pragma GCC diagnostic pop

namespace metal {

#define LX_MSL_UNARY(name, expr)                                                          \
  inline float name(float x) { return expr; }                                            \
  template <class F>                                                                      \
  inline lx_msl::float16_storage<F> name(lx_msl::float16_storage<F> h) {                  \
    return lx_msl::float16_storage<F>(name(float(h)));                                    \
  }
LX_MSL_UNARY(abs, std::fabs(x))
LX_MSL_UNARY(fabs, std::fabs(x))
LX_MSL_UNARY(exp, std::exp(x))
LX_MSL_UNARY(exp2, std::exp2(x))
LX_MSL_UNARY(exp10, std::pow(10.0f, x))
LX_MSL_UNARY(log, std::log(x))
LX_MSL_UNARY(log2, std::log2(x))
LX_MSL_UNARY(log10, std::log10(x))
LX_MSL_UNARY(sqrt, std::sqrt(x))
LX_MSL_UNARY(rsqrt, 1.0f / std::sqrt(x))
LX_MSL_UNARY(sin, std::sin(x))
LX_MSL_UNARY(cos, std::cos(x))
LX_MSL_UNARY(tan, std::tan(x))
LX_MSL_UNARY(asin, std::asin(x))
LX_MSL_UNARY(acos, std::acos(x))
LX_MSL_UNARY(atan, std::atan(x))
LX_MSL_UNARY(sinh, std::sinh(x))
LX_MSL_UNARY(cosh, std::cosh(x))
LX_MSL_UNARY(tanh, std::tanh(x))
LX_MSL_UNARY(asinh, std::asinh(x))
LX_MSL_UNARY(acosh, std::acosh(x))
LX_MSL_UNARY(atanh, std::atanh(x))
LX_MSL_UNARY(floor, std::floor(x))
LX_MSL_UNARY(ceil, std::ceil(x))
LX_MSL_UNARY(round, std::round(x))
LX_MSL_UNARY(rint, std::nearbyint(x))
LX_MSL_UNARY(trunc, std::trunc(x))
LX_MSL_UNARY(fract, x - std::floor(x))
LX_MSL_UNARY(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? x : 0.0f)))
#undef LX_MSL_UNARY

#define LX_MSL_BINARY(name, expr)                                                         \
  inline float name(float x, float y) { return expr; }                                   \
  template <class F>                                                                      \
  inline lx_msl::float16_storage<F> name(lx_msl::float16_storage<F> a,                    \
                                         lx_msl::float16_storage<F> b) {                  \
    return lx_msl::float16_storage<F>(name(float(a), float(b)));                          \
  }
LX_MSL_BINARY(pow, std::pow(x, y))
LX_MSL_BINARY(powr, std::pow(x, y))
LX_MSL_BINARY(atan2, std::atan2(x, y))
LX_MSL_BINARY(fmod, std::fmod(x, y))
LX_MSL_BINARY(fmin, std::fmin(x, y))
LX_MSL_BINARY(fmax, std::fmax(x, y))
LX_MSL_BINARY(copysign, std::copysign(x, y))
LX_MSL_BINARY(step, y < x ? 0.0f : 1.0f)
#undef LX_MSL_BINARY

using ::abs;   // abs(int) from <cstdlib>: one function, so `using namespace metal` is unambiguous
inline long abs(long x) { return x < 0 ? -x : x; }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
template <class T> inline T mix(T x, T y, T a) { return x + (y - x) * a; }
template <class T> inline bool isnan(T x) { return std::isnan(float(x)); }
template <class T> inline bool isinf(T x) { return std::isinf(float(x)); }
template <class T> inline bool isfinite(T x) { return std::isfinite(float(x)); }
template <class T> inline bool signbit(T x) { return std::signbit(float(x)); }

// Reinterpret the bits of a value as another type of the same size.
template <class To, class From> inline To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of one size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

namespace precise { using namespace ::metal; }
namespace fast { using namespace ::metal; }

}  // namespace metal

// Qualifiers and attributes last: from here on these words mean nothing to C++.
#define kernel
#define device
#define constant
#define thread
#define buffer(index)
#define host_name(name)
#define max_total_threads_per_threadgroup(count)
#define thread_position_in_grid
#define threads_per_grid

#endif  // LAZYX_MSL_SHIM_H
