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
// over rows; with one group each tap is one memcpy of C elements. With a 1-tap
// geometry it materialises the virtual input (padded, dilated) the two direct
// kernels below read.
//
// float32 with one group skips the column matrix and the BLAS: two implicit-GEMM
// kernels read the (materialised) virtual input in place, with register-blocked
// MR x NR micro-tiles (MR output rows, NR = two vectors of output channels),
// all on lazyx's own thread pool (NumPy's OpenBLAS threads and this pool fought
// over the cores, block after block, when the two took turns):
// - conv_direct: out[n, t, o] = sum_{k, c} xp[n, t*s + k*d, c] w[k, c, o]. A tile
//   is MR consecutive outputs along the last spatial axis (rows s*C apart in xp)
//   by NR output channels of the weight, packed once into NR-wide panels; its
//   reduction walks the taps, each a contiguous run of C channels.
// - conv_swapped: out[b, t, o] = sum_{n, k} xp[n, k*d + t*s, b] g[n, k, o], the
//   same convolution with the batch of its input and its channels trading
//   places: the shape of a weight gradient (the vjp convolves the input, batch
//   and channels swapped, with the output cotangent as a kernel larger than its
//   output). Its operands are the untransposed arrays (the forward's input and
//   the cotangent, channels last), so a tile is MR channels b (adjacent) by NR
//   channels o, reduced over every batch element and kernel position; threads
//   take chunks (n, k0) of that reduction into their own partial sums.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "lanes.h"
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


// -- implicit GEMM (float32) ------------------------------------------------
namespace gemm {

using lanes::L, lanes::vn;
using F32 = lanes::F32;
constexpr int64_t NR = 2 * L;  // columns of a tile: two vectors
constexpr int64_t MR = 6;      // rows: 2 * MR accumulators + 2 B vectors + 1 broadcast <= 16 registers

// How a tile's reduction walks its operands: nseg segments of len steps; step i of
// segment s reads A at a + aoff[s] + i * a_step (row r a further r * a_row) and B's
// NR columns at b + s * b_seg + i * b_step (readable NR wide: padded).
struct Walk {
  const int64_t* aoff;
  int64_t nseg, len, a_row, a_step, b_seg, b_step;
};

// c[r, :ncols] (+)= sum over the walk of A[r, i] B[i, :ncols], r < R.
template <int R>
void tile(const float* a, const float* b, const Walk& w, float* c, int64_t ldc, int64_t ncols, bool acc) {
  vn c0[R], c1[R];
  for (int r = 0; r < R; ++r) {
    if (!acc) {
      c0[r] = c1[r] = lanes::splat(0.0f);
    } else if (ncols == NR) {
      c0[r] = F32::load(c + r * ldc), c1[r] = F32::load(c + r * ldc + L);
    } else {
      c0[r] = lanes::load_partial<F32>(c + r * ldc, std::min<int64_t>(ncols, L), 0.0f);
      c1[r] = ncols > L ? lanes::load_partial<F32>(c + r * ldc + L, ncols - L, 0.0f) : lanes::splat(0.0f);
    }
  }
  const int64_t a_row = w.a_row, a_step = w.a_step, b_step = w.b_step;
  for (int64_t s = 0; s < w.nseg; ++s) {
    const float* ap = a + w.aoff[s];
    const float* bp = b + s * w.b_seg;
    for (int64_t i = 0; i < w.len; ++i, ap += a_step, bp += b_step) {
      const vn b0 = F32::load(bp), b1 = F32::load(bp + L);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const vn av = lanes::splat(ap[r * a_row]);
        c0[r] += av * b0;
        c1[r] += av * b1;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    if (ncols == NR) {
      F32::store(c + r * ldc, c0[r]), F32::store(c + r * ldc + L, c1[r]);
    } else {
      lanes::store_partial<F32>(c + r * ldc, c0[r], std::min<int64_t>(ncols, L));
      if (ncols > L) lanes::store_partial<F32>(c + r * ldc + L, c1[r], ncols - L);
    }
  }
}

void tile_rows(int64_t rows, const float* a, const float* b, const Walk& w, float* c, int64_t ldc,
               int64_t ncols, bool acc) {
  switch (rows) {
    case 6: tile<6>(a, b, w, c, ldc, ncols, acc); break;
    case 5: tile<5>(a, b, w, c, ldc, ncols, acc); break;
    case 4: tile<4>(a, b, w, c, ldc, ncols, acc); break;
    case 3: tile<3>(a, b, w, c, ldc, ncols, acc); break;
    case 2: tile<2>(a, b, w, c, ldc, ncols, acc); break;
    default: tile<1>(a, b, w, c, ldc, ncols, acc); break;
  }
}
static_assert(MR == 6, "tile_rows dispatches 1 ... 6 rows");

// The direct kernels' geometry: three spatial axes (missing leading ones of size
// 1), the virtual input already materialised (no padding or input dilation left).
struct Direct {
  int64_t n, c, o;       // batch, reduced channels (C; swapped: kept channels b), outputs
  int64_t p[3], t[3], k[3], s[3], d[3];  // virtual input, output, kernel, strides, kernel dilation
};

Direct direct_geometry(const std::vector<int64_t>& v, const char* op) {
  if (v.size() != 3 + 5 * 3) throw nb::value_error((std::string("[") + op + "] Expected 18 geometry entries.").c_str());
  Direct g{};
  g.n = v[0], g.c = v[1], g.o = v[2];
  for (int i = 0; i < 3; ++i)
    g.p[i] = v[3 + i], g.t[i] = v[6 + i], g.k[i] = v[9 + i], g.s[i] = v[12 + i], g.d[i] = v[15 + i];
  for (int i = 0; i < 3; ++i)
    if (g.p[i] < 1 || g.t[i] < 1 || g.k[i] < 1 || g.s[i] < 1 || g.d[i] < 1 ||
        (g.t[i] - 1) * g.s[i] + (g.k[i] - 1) * g.d[i] >= g.p[i])
      throw nb::value_error((std::string("[") + op + "] Windows out of the input's range.").c_str());
  if (g.n < 1 || g.c < 1 || g.o < 1) throw nb::value_error((std::string("[") + op + "] Empty operands.").c_str());
  return g;
}

// out (n, t0, t1, t2, o) = conv(xp (n, p0, p1, p2, c), w (k0, k1, k2, c, o)).
void conv_direct(const float* xp, const float* w, float* out, const Direct& g) {
  const int64_t taps = g.k[0] * g.k[1] * g.k[2], red = taps * g.c;
  const int64_t panels = (g.o + NR - 1) / NR;
  // The weight in NR-wide panels (zeros past o): panel p row j = w[j, p*NR : p*NR + NR].
  std::vector<float> packed(size_t(panels * red * NR), 0.0f);
  parallel_for(size_t(panels), size_t(red * NR), [&](size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) {
      const int64_t cols = std::min<int64_t>(NR, g.o - int64_t(p) * NR);
      for (int64_t j = 0; j < red; ++j)
        std::memcpy(packed.data() + (int64_t(p) * red + j) * NR, w + j * g.o + int64_t(p) * NR, size_t(cols) * 4);
    }
  });
  const int64_t row = g.p[2] * g.c, plane = g.p[1] * row, image = g.p[0] * plane;
  std::vector<int64_t> aoff;
  aoff.reserve(size_t(taps));
  for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
    for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
      for (int64_t k2 = 0; k2 < g.k[2]; ++k2)
        aoff.push_back(k0 * g.d[0] * plane + k1 * g.d[1] * row + k2 * g.d[2] * g.c);
  const Walk walk{aoff.data(), taps, g.c, g.s[2] * g.c, 1, g.c * NR, NR};
  const int64_t lines = g.n * g.t[0] * g.t[1];  // output rows along the last axis
  parallel_for(size_t(lines), size_t(g.t[2] * g.o * red), [&](size_t b, size_t e) {
    for (size_t line = b; line < e; ++line) {
      const int64_t n = int64_t(line) / (g.t[0] * g.t[1]), t0 = int64_t(line) / g.t[1] % g.t[0],
                    t1 = int64_t(line) % g.t[1];
      const float* base = xp + n * image + t0 * g.s[0] * plane + t1 * g.s[1] * row;
      float* o = out + int64_t(line) * g.t[2] * g.o;
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t t2 = 0; t2 < g.t[2]; t2 += MR)
          tile_rows(std::min(MR, g.t[2] - t2), base + t2 * g.s[2] * g.c, packed.data() + p * red * NR, walk,
                    o + t2 * g.o + p * NR, g.o, std::min(NR, g.o - p * NR), false);
    }
  });
}

// out (b, t0, t1, t2, o) = sum_{n, k} xp[n, k*d + t*s, b] g[n, k, o] with xp
// (n, p0, p1, p2, b) and g (n, k0, k1, k2, o): Direct's c is b here.
void conv_swapped(const float* xp, const float* gin, float* out, const Direct& g) {
  const int64_t B = g.c, O = g.o;
  const int64_t ksize = g.k[0] * g.k[1] * g.k[2];
  const int64_t panels = (O + NR - 1) / NR, opad = panels * NR;
  // g with rows padded to whole panels (B reads NR wide), when they are not already.
  std::vector<float> padded;
  const float* gp = gin;
  if (O != opad) {
    padded.assign(size_t(g.n * ksize * opad), 0.0f);
    parallel_for(size_t(g.n * ksize), size_t(O), [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) std::memcpy(padded.data() + r * opad, gin + r * O, size_t(O) * 4);
    });
    gp = padded.data();
  }
  const int64_t row = g.p[2] * B, plane = g.p[1] * row, image = g.p[0] * plane;
  const int64_t taps = g.t[0] * g.t[1] * g.t[2], size = B * taps * O;
  // Threads reduce chunks (n, k0, a block of kb k1 rows) into parts of their own,
  // summed at the end; a chunk's slice of g (kb * k2 * opad floats, ~32 KB) stays in
  // cache while every tile of the output walks it.
  const int64_t kb = std::clamp<int64_t>(8192 / (g.k[2] * opad), 1, g.k[1]);
  const int64_t kblocks = (g.k[1] + kb - 1) / kb;
  std::vector<int64_t> aoff(static_cast<size_t>(kb));
  for (int64_t k1 = 0; k1 < kb; ++k1) aoff[k1] = k1 * g.d[1] * row;
  const int64_t chunks = g.n * g.k[0] * kblocks;
  const int64_t parts = std::min<int64_t>(chunks, 4 * num_threads());
  std::vector<float> partial(size_t((parts - 1) * size), 0.0f);
  std::memset(out, 0, size_t(size) * 4);
  const size_t cost = size_t(std::max<int64_t>(1, size * ksize * g.n / parts));
  parallel_for(size_t(parts), cost, [&](size_t pb, size_t pe) {
    for (size_t part = pb; part < pe; ++part) {
      float* acc = part ? partial.data() + (part - 1) * size : out;
      const int64_t c0 = chunks * int64_t(part) / parts, c1 = chunks * int64_t(part + 1) / parts;
      for (int64_t ch = c0; ch < c1; ++ch) {
        const int64_t n = ch / (g.k[0] * kblocks), k0 = ch / kblocks % g.k[0], k1 = ch % kblocks * kb;
        const Walk walk{aoff.data(), std::min(kb, g.k[1] - k1), g.k[2], 1, g.d[2] * B, g.k[2] * opad, opad};
        const float* bbase = gp + ((n * g.k[0] + k0) * g.k[1] + k1) * g.k[2] * opad;
        for (int64_t t0 = 0; t0 < g.t[0]; ++t0)
          for (int64_t t1 = 0; t1 < g.t[1]; ++t1)
            for (int64_t t2 = 0; t2 < g.t[2]; ++t2) {
              const float* abase = xp + n * image + (k0 * g.d[0] + t0 * g.s[0]) * plane +
                                   (k1 * g.d[1] + t1 * g.s[1]) * row + t2 * g.s[2] * B;
              const int64_t t = (t0 * g.t[1] + t1) * g.t[2] + t2;
              for (int64_t b0 = 0; b0 < B; b0 += MR)
                for (int64_t p = 0; p < panels; ++p)
                  tile_rows(std::min(MR, B - b0), abase + b0, bbase + p * NR, walk,
                            acc + (b0 * taps + t) * O + p * NR, taps * O, std::min(NR, O - p * NR), true);
            }
      }
    }
  });
  if (parts > 1)
    parallel_for(size_t(size), size_t(parts), [&](size_t b, size_t e) {
      for (int64_t part = 1; part < parts; ++part) {
        const float* src = partial.data() + (part - 1) * size;
        for (size_t i = b; i < e; ++i) out[i] += src[i];
      }
    });
}

}  // namespace gemm

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
  m.def(
      "conv_direct_float32",
      [](In<float> xp, In<float> w, Out<float> out, const std::vector<int64_t>& geo) {
        const gemm::Direct g = gemm::direct_geometry(geo, "conv_direct_float32");
        const int64_t taps = g.k[0] * g.k[1] * g.k[2];
        if (xp.size() != size_t(g.n * g.p[0] * g.p[1] * g.p[2] * g.c) || w.size() != size_t(taps * g.c * g.o) ||
            out.size() != size_t(g.n * g.t[0] * g.t[1] * g.t[2] * g.o))
          throw nb::value_error("[conv_direct_float32] Buffer sizes do not match the geometry.");
        nb::gil_scoped_release release;
        gemm::conv_direct(xp.data(), w.data(), out.data(), g);
      },
      nb::arg("xp"), nb::arg("w"), nb::arg("out"), nb::arg("geometry"),
      "out (N, T0, T1, T2, O) = the convolution of the virtual input xp (N, P0, P1, P2, C) with w "
      "(K0, K1, K2, C, O); geometry: N, C, O, then P, T, K, strides, kernel dilation (3 each).");
  m.def(
      "conv_swapped_float32",
      [](In<float> xp, In<float> g_, Out<float> out, const std::vector<int64_t>& geo) {
        const gemm::Direct g = gemm::direct_geometry(geo, "conv_swapped_float32");
        const int64_t taps = g.t[0] * g.t[1] * g.t[2];
        if (xp.size() != size_t(g.n * g.p[0] * g.p[1] * g.p[2] * g.c) ||
            g_.size() != size_t(g.n * g.k[0] * g.k[1] * g.k[2] * g.o) || out.size() != size_t(g.c * taps * g.o))
          throw nb::value_error("[conv_swapped_float32] Buffer sizes do not match the geometry.");
        nb::gil_scoped_release release;
        gemm::conv_swapped(xp.data(), g_.data(), out.data(), g);
      },
      nb::arg("xp"), nb::arg("g"), nb::arg("out"), nb::arg("geometry"),
      "out (B, T0, T1, T2, O) = sum over n, k of xp[n, k*d + t*s, b] g[n, k, o], xp (N, P0, P1, P2, B), "
      "g (N, K0, K1, K2, O); geometry: N, B, O, then P, T, K, strides s, kernel dilation d (3 each).");
}

}  // namespace lazyx
