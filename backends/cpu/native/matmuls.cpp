// Native kernels of the `matmuls` op pack: the Walsh-Hadamard transform.
//
// hadamard_<dtype>(x, out, n, hm, scale) transforms each row of n = m * p
// elements (p a power of two) as the NumPy reference does: a Sylvester butterfly
// over each of the row's m pieces of p elements, then out = hm @ pieces (hm the
// m x m matrix H_m, or its transpose, given by the Python side; absent for
// m = 1), times scale. A row is read once into a float32 buffer (in L1/L2), the
// butterfly runs there, and the result is written once (streaming stores for
// outputs larger than the cache), the next row prefetched meanwhile; rows split
// over the thread pool. float16/bfloat16 come as uint16 views and compute in
// float32.
//
// The stages within one vector (pair distance h < L) are lane swaps and one FMA
// each; the stages across vectors (h >= L) go two at a time (radix 4: half the
// buffer's loads and stores).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lanes.h"
#include "packs.h"
#include "parallel.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lazyx {
namespace {

using lanes::L, lanes::vn, lanes::splat;

// Lanes i and i ^ H swapped.
template <size_t H, size_t... I>
inline vn swap_lanes(vn v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I ^ H)...);
}

// sign[h][c] = -1 where bit h of lane c is set: the stage of pair distance h
// within a vector is v' = swap(v) + v * sign (a + b in the lower lane, a - b in
// the upper).
struct LaneSigns {
  vn sign[8];
  LaneSigns() {
    for (int k = 0; (1 << k) < L; ++k)
      for (int c = 0; c < L; ++c) sign[k][c] = (c >> k) & 1 ? -1.0f : 1.0f;
  }
};

template <size_t H = 1>
inline vn small_stages(vn v, const LaneSigns& S) {
  if constexpr (H >= size_t(L)) {
    return v;
  } else {
    constexpr int k = __builtin_ctz(H);
    v = swap_lanes<H>(v, std::make_index_sequence<L>{}) + v * S.sign[k];
    return small_stages<2 * H>(v, S);
  }
}

// In place Walsh-Hadamard transform (Sylvester order) of p floats, p >= L.
inline void butterfly(float* y, size_t p, const LaneSigns& S) {
  using F = lanes::F32;
  for (size_t c = 0; c < p; c += L) F::store(y + c, small_stages(F::load(y + c), S));
  size_t h = L;
  for (; 4 * h <= p; h *= 4)  // stages h and 2h at once
    for (size_t b = 0; b < p; b += 4 * h)
      for (size_t j = b; j < b + h; j += L) {
        const vn a0 = F::load(y + j), a1 = F::load(y + j + h), a2 = F::load(y + j + 2 * h),
                 a3 = F::load(y + j + 3 * h);
        const vn s01 = a0 + a1, d01 = a0 - a1, s23 = a2 + a3, d23 = a2 - a3;
        F::store(y + j, s01 + s23);
        F::store(y + j + h, d01 + d23);
        F::store(y + j + 2 * h, s01 - s23);
        F::store(y + j + 3 * h, d01 - d23);
      }
  if (2 * h <= p)  // a last single stage
    for (size_t b = 0; b < p; b += 2 * h)
      for (size_t j = b; j < b + h; j += L) {
        const vn a0 = F::load(y + j), a1 = F::load(y + j + h);
        F::store(y + j, a0 + a1);
        F::store(y + j + h, a0 - a1);
      }
}

// The same for p < L (small rows), one element at a time.
inline void butterfly_scalar(float* y, size_t p) {
  for (size_t h = 1; h < p; h *= 2)
    for (size_t b = 0; b < p; b += 2 * h)
      for (size_t j = b; j < b + h; ++j) {
        const float a0 = y[j], a1 = y[j + h];
        y[j] = a0 + a1;
        y[j + h] = a0 - a1;
      }
}

template <class IO>
void hadamard(const typename IO::T* x, typename IO::T* out, size_t rows, size_t n, size_t m, const float* hm,
              float scale) {
  using T = typename IO::T;
  const size_t p = n / m;
  const bool stream = rows * n * sizeof(T) >= lanes::kStreamBytes;
  parallel_for(rows, n * 4, [=](size_t rb, size_t re) {
    const LaneSigns S;
    std::vector<float> buf(n + L), mix(m > 1 ? n + L : 0);
    for (size_t r = rb; r < re; ++r) {
      const T* xr = x + r * n;
      T* yr = out + r * n;
      // The next row is fetched from memory while this one is transformed in cache.
      if (r + 1 < re)
        for (size_t b = 0; b < n * sizeof(T); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(xr + n) + b);
      size_t i = 0;
      for (; i + L <= n; i += L) lanes::F32::store(buf.data() + i, IO::load(xr + i));
      if (i < n) lanes::F32::store(buf.data() + i, lanes::load_partial<IO>(xr + i, n - i, 0.0f));
      for (size_t b = 0; b < m; ++b) {
        if (p >= size_t(L)) butterfly(buf.data() + b * p, p, S);
        else butterfly_scalar(buf.data() + b * p, p);
      }
      const float* y = buf.data();
      if (m > 1) {  // mix[a] = sum_b hm[a, b] piece[b]: entries of H_m are +-1
        for (size_t a = 0; a < m; ++a) {
          float* dst = mix.data() + a * p;
          const float* row = hm + a * m;
          size_t j = 0;
          for (; j + L <= p; j += L) {
            vn acc = splat(0.0f);
            for (size_t b = 0; b < m; ++b) {
              const vn v = lanes::F32::load(y + b * p + j);
              acc = row[b] > 0 ? acc + v : acc - v;
            }
            lanes::F32::store(dst + j, acc);
          }
          for (; j < p; ++j) {
            float acc = 0.0f;
            for (size_t b = 0; b < m; ++b) acc = row[b] > 0 ? acc + y[b * p + j] : acc - y[b * p + j];
            dst[j] = acc;
          }
        }
        y = mix.data();
      }
      const vn s = splat(scale);
      i = 0;
      if (stream && reinterpret_cast<uintptr_t>(yr) % (L * sizeof(T)) == 0)
        for (; i + L <= n; i += L) lanes::store_stream<IO>(yr + i, lanes::F32::load(y + i) * s);
      for (; i + L <= n; i += L) IO::store(yr + i, lanes::F32::load(y + i) * s);
      if (i < n) lanes::store_partial<IO>(yr + i, lanes::load_partial<lanes::F32>(y + i, n - i, 0.0f) * s, n - i);
    }
    if (stream) lanes::stream_fence();
  });
}


template <class IO>
void bind_typed(nb::module_& mod, const std::string& suffix) {
  using T = typename IO::T;
  mod.def(
      ("hadamard_" + suffix).c_str(),
      [](In<T> x, Out<T> out, size_t n, In<float> hm, float scale) {
        const size_t m = hm.is_valid() ? size_t(std::lround(std::sqrt(double(hm.size())))) : 1;
        const size_t p = m ? n / m : 0;
        if (n == 0 || m == 0 || x.size() % n || out.size() != x.size() || (hm.is_valid() && hm.size() != m * m) ||
            p * m != n || (p & (p - 1)))
          throw nb::value_error(("[hadamard_transform] inconsistent sizes: " + std::to_string(x.size()) +
                                 " elements in rows of n = " + std::to_string(n) + ", H_m of " +
                                 std::to_string(hm.is_valid() ? hm.size() : 1) + " entries.").c_str());
        nb::gil_scoped_release release;
        hadamard<IO>(x.data(), out.data(), x.size() / n, n, m, hm.is_valid() ? hm.data() : nullptr, scale);
      },
      "x"_a.noconvert(), "out"_a.noconvert(), "n"_a, "hm"_a.noconvert().none(), "scale"_a,
      "The Walsh-Hadamard transform of rows of n = m * 2^k elements of x (hm: the m x m factor, None for "
      "m = 1), times scale, written to out.");
}

}  // namespace

void bind_matmuls(nb::module_& m) {
  bind_typed<lanes::F32>(m, "float32");
  bind_typed<lanes::F16>(m, "float16");
  bind_typed<lanes::BF16>(m, "bfloat16");
}

}  // namespace lazyx
