// Native kernels of the `conv` op pack: the im2col half of a convolution.
//
// A Convolution (plugins/conv.py) is a matmul of a column matrix with the weight.
// conv_im2col writes rows [row0, row0 + rows) of that matrix for a channels-last
// input x (N, S0, S1, S2, C) (1-D and 2-D convolutions pass size-1 trailing spatial
// axes): row m = (n, t0, t1, t2) holds, for each group g and kernel tap k = (k0, k1,
// k2), the Cg channels of group g at the virtual input position
//   p_i = t_i * stride_i + k_i * kernel_dilation_i - padding_lo_i
// of the input dilated by input_dilation (zeros between elements and outside), so
// the layout is (rows, G, K0 * K1 * K2, Cg). The Python side
// (backends/cpu/native_packs/conv.py) fills the matrix in blocks of rows and hands
// each to NumPy's BLAS (np.matmul, threaded), which this module cannot link.
//
// The copy is element-size generic (float32 and float64 share it) and parallel
// over rows; with one group each tap is one memcpy of C elements.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "packs.h"
#include "parallel.h"

namespace nb = nanobind;

namespace lazyx {
namespace {

struct Geometry {
  int64_t n, in[3], c, out[3], k[3], stride[3], lo[3], kdil[3], idil[3], groups;
};

// The input index along one axis for virtual position p, or -1 for a zero.
inline int64_t source(int64_t p, int64_t idil, int64_t size) {
  if (p < 0) return -1;
  if (idil != 1) {
    if (p % idil) return -1;
    p /= idil;
  }
  return p < size ? p : -1;
}

template <size_t E>
void im2col(const uint8_t* x, uint8_t* cols, const Geometry& g, int64_t row0, int64_t rows) {
  const int64_t taps = g.k[0] * g.k[1] * g.k[2];
  const int64_t cg = g.c / g.groups;
  const size_t row_bytes = size_t(taps * g.c) * E;
  const size_t cg_bytes = size_t(cg) * E;
  const int64_t o12 = g.out[1] * g.out[2], o012 = g.out[0] * o12;
  parallel_for(size_t(rows), size_t(taps * g.c), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const int64_t m = row0 + int64_t(r);
      const int64_t n = m / o012, t0 = (m / o12) % g.out[0], t1 = (m / g.out[2]) % g.out[1],
                    t2 = m % g.out[2];
      uint8_t* row = cols + r * row_bytes;
      int64_t tap = 0;
      for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
        const int64_t j0 = source(t0 * g.stride[0] + k0 * g.kdil[0] - g.lo[0], g.idil[0], g.in[0]);
        for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
          const int64_t j1 = source(t1 * g.stride[1] + k1 * g.kdil[1] - g.lo[1], g.idil[1], g.in[1]);
          for (int64_t k2 = 0; k2 < g.k[2]; ++k2, ++tap) {
            const int64_t j2 = source(t2 * g.stride[2] + k2 * g.kdil[2] - g.lo[2], g.idil[2], g.in[2]);
            const bool zero = j0 < 0 || j1 < 0 || j2 < 0;
            const uint8_t* src =
                zero ? nullptr : x + size_t(((n * g.in[0] + j0) * g.in[1] + j1) * g.in[2] + j2) * g.c * E;
            if (g.groups == 1) {
              if (zero) std::memset(row + tap * cg_bytes, 0, cg_bytes);
              else std::memcpy(row + tap * cg_bytes, src, cg_bytes);
              continue;
            }
            for (int64_t grp = 0; grp < g.groups; ++grp) {
              uint8_t* dst = row + size_t(grp * taps + tap) * cg_bytes;
              if (zero) std::memset(dst, 0, cg_bytes);
              else std::memcpy(dst, src + grp * cg_bytes, cg_bytes);
            }
          }
        }
      }
    }
  });
}

using Bytes = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using BytesOut = nb::ndarray<uint8_t, nb::c_contig, nb::device::cpu>;

Geometry geometry(const std::vector<int64_t>& v) {
  // n, c, groups, then per axis (3): in, out, k, stride, lo, kdil, idil
  if (v.size() != 3 + 7 * 3) throw nb::value_error("[conv_im2col] Expected 24 geometry entries.");
  Geometry g{};
  g.n = v[0], g.c = v[1], g.groups = v[2];
  for (int i = 0; i < 3; ++i) {
    const int64_t* a = v.data() + 3 + 7 * i;
    g.in[i] = a[0], g.out[i] = a[1], g.k[i] = a[2], g.stride[i] = a[3], g.lo[i] = a[4],
    g.kdil[i] = a[5], g.idil[i] = a[6];
  }
  return g;
}

}  // namespace

void bind_conv(nb::module_& m) {
  m.def(
      "conv_im2col",
      [](Bytes x, BytesOut cols, const std::vector<int64_t>& geo, int64_t row0, int64_t rows,
         int64_t itemsize) {
        const Geometry g = geometry(geo);
        const int64_t taps = g.k[0] * g.k[1] * g.k[2];
        const int64_t total = g.n * g.out[0] * g.out[1] * g.out[2];
        if (row0 < 0 || rows < 0 || row0 + rows > total || g.groups < 1 || g.c % g.groups)
          throw nb::value_error("[conv_im2col] Rows or groups out of range.");
        if (x.size() != size_t(g.n * g.in[0] * g.in[1] * g.in[2] * g.c * itemsize) ||
            cols.size() < size_t(rows * taps * g.c * itemsize))
          throw nb::value_error("[conv_im2col] Buffer sizes do not match the geometry.");
        if (itemsize != 2 && itemsize != 4 && itemsize != 8)
          throw nb::value_error("[conv_im2col] Element size must be 2, 4 or 8 bytes.");
        nb::gil_scoped_release release;
        switch (itemsize) {
          case 2: im2col<2>(x.data(), cols.data(), g, row0, rows); break;
          case 4: im2col<4>(x.data(), cols.data(), g, row0, rows); break;
          default: im2col<8>(x.data(), cols.data(), g, row0, rows); break;
        }
      },
      nb::arg("x"), nb::arg("cols"), nb::arg("geometry"), nb::arg("row0"), nb::arg("rows"),
      nb::arg("itemsize"),
      "Rows [row0, row0 + rows) of a convolution's column matrix (layout (rows, G, K, Cg)), "
      "x and cols as byte views.");
}

}  // namespace lazyx
