// out = alpha * x + beta * y for every dtype the package supports.
//
// Two paths: when x and y are both C-contiguous with out's shape, one flat
// loop the compiler vectorises; otherwise the operands' broadcast strides are
// collapsed (adjacent dimensions that are contiguous for x, y and out merge)
// and the innermost remaining dimension runs as a strided loop, with its own
// flat loop when both inner strides are 1.
#include "axpby.h"

#include <cstring>
#include <vector>

namespace axpby {
namespace {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// -- float16 <-> float32, rounding to nearest even ----------------------------
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u)  // inf and nan keep their payload
    return float_of(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u)  // normal: rebias the exponent from 15 to 127
    return float_of(sign | ((em << 13) + (112u << 23)));
  const float v = static_cast<float>(em) * 5.9604644775390625e-8f;  // subnormal: em * 2^-24
  return sign ? -v : v;
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf, or nan kept quiet
    return sign | 0x7c00u | (a > 0x7f800000u ? (0x0200u | ((a >> 13) & 0x3ffu)) : 0u);
  if (a >= 0x477ff000u)  // 65520 and above round to inf
    return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Below the smallest normal half: adding 0.5 puts the value where a float's
    // last place is 2^-24, the spacing of half subnormals, so the float adder
    // does the rounding to nearest even.
    const uint32_t r = bits_of(float_of(a) + 0.5f) - bits_of(0.5f);
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias, then round the 13 dropped bits to nearest even.
  const uint32_t odd = (a >> 13) & 1u;
  const uint32_t r = a - (112u << 23) + 0x0fffu + odd;
  return sign | static_cast<uint16_t>(r >> 13);
}

// -- bfloat16 <-> float32 -----------------------------------------------------
inline float bfloat_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bfloat(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// How each dtype is stored, computed in, loaded and stored: one table, so the
// loops below are written once.
template <class Storage, class Compute>
struct Plain {
  using S = Storage;
  using C = Compute;
  static C load(S v) { return v; }
  static S store(C v) { return v; }
};

struct Half {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return half_to_float(v); }
  static S store(C v) { return float_to_half(v); }
};

struct BFloat {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return bfloat_to_float(v); }
  static S store(C v) { return float_to_bfloat(v); }
};

// The scalar alpha and beta are taken in the computing type's precision (a
// float32 array scales by float32(alpha), as in NumPy and MLX).
template <class C>
struct Real {
  using type = C;
};
template <>
struct Real<std::complex<float>> {
  using type = float;
};

template <class T>
void run(const Operand& x, const Operand& y, void* out_data, const int64_t* shape, size_t ndim,
         double alpha_d, double beta_d) {
  using S = typename T::S;
  using R = typename Real<typename T::C>::type;
  const R alpha = static_cast<R>(alpha_d), beta = static_cast<R>(beta_d);
  const S* xp = static_cast<const S*>(x.data);
  const S* yp = static_cast<const S*>(y.data);
  S* out = static_cast<S*>(out_data);

  int64_t size = 1;
  for (size_t d = 0; d < ndim; ++d) size *= shape[d];
  if (size == 0) return;

  // Fast path: both operands contiguous with out's shape.
  bool contiguous = true;
  for (int64_t d = static_cast<int64_t>(ndim) - 1, expect = 1; d >= 0 && contiguous; --d) {
    if (shape[d] != 1 && (x.strides[d] != expect || y.strides[d] != expect)) contiguous = false;
    expect *= shape[d];
  }
  if (contiguous) {
    for (int64_t i = 0; i < size; ++i) out[i] = T::store(alpha * T::load(xp[i]) + beta * T::load(yp[i]));
    return;
  }

  // General path. Drop size-1 dimensions and merge neighbours that are
  // contiguous for both operands; what remains is usually one or two loops.
  std::vector<int64_t> n, sx, sy;
  for (size_t d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    if (!n.empty() && sx.back() == x.strides[d] * shape[d] && sy.back() == y.strides[d] * shape[d]) {
      n.back() *= shape[d];
      sx.back() = x.strides[d];
      sy.back() = y.strides[d];
    } else {
      n.push_back(shape[d]);
      sx.push_back(x.strides[d]);
      sy.push_back(y.strides[d]);
    }
  }
  const size_t rank = n.size();  // >= 1: the contiguous path took the all-ones shapes
  const int64_t inner = n[rank - 1], ix = sx[rank - 1], iy = sy[rank - 1];
  const int64_t rows = size / inner;
  std::vector<int64_t> index(rank, 0);
  const S* xr = xp;
  const S* yr = yp;
  for (int64_t r = 0; r < rows; ++r) {
    S* o = out + r * inner;
    if (ix == 1 && iy == 1) {
      for (int64_t i = 0; i < inner; ++i) o[i] = T::store(alpha * T::load(xr[i]) + beta * T::load(yr[i]));
    } else if (ix == 1 && iy == 0) {
      const auto b = beta * T::load(*yr);
      for (int64_t i = 0; i < inner; ++i) o[i] = T::store(alpha * T::load(xr[i]) + b);
    } else if (ix == 0 && iy == 1) {
      const auto a = alpha * T::load(*xr);
      for (int64_t i = 0; i < inner; ++i) o[i] = T::store(a + beta * T::load(yr[i]));
    } else {
      for (int64_t i = 0; i < inner; ++i)
        o[i] = T::store(alpha * T::load(xr[i * ix]) + beta * T::load(yr[i * iy]));
    }
    // Advance the outer index (an odometer over dimensions 0 .. rank-2).
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      xr += sx[d];
      yr += sy[d];
      if (++index[d] < n[d]) break;
      xr -= sx[d] * n[d];
      yr -= sy[d] * n[d];
      index[d] = 0;
    }
  }
}

}  // namespace

void axpby(Dtype dtype, Operand x, Operand y, void* out, const int64_t* shape, size_t ndim,
           double alpha, double beta) {
  switch (dtype) {
    case Dtype::float32: return run<Plain<float, float>>(x, y, out, shape, ndim, alpha, beta);
    case Dtype::float64: return run<Plain<double, double>>(x, y, out, shape, ndim, alpha, beta);
    case Dtype::float16: return run<Half>(x, y, out, shape, ndim, alpha, beta);
    case Dtype::bfloat16: return run<BFloat>(x, y, out, shape, ndim, alpha, beta);
    case Dtype::complex64:
      return run<Plain<std::complex<float>, std::complex<float>>>(x, y, out, shape, ndim, alpha, beta);
  }
}

}  // namespace axpby
