// lazyx_axpby._ext: the package's own nanobind module. The Python side
// (lazyx_axpby/kernels.py) allocates `out` with NumPy, so the buffer is
// counted by lazyx's memory figures like any other, and calls this to fill it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "axpby.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Input = nb::ndarray<nb::ro, nb::device::cpu>;
using Output = nb::ndarray<nb::c_contig, nb::device::cpu>;

struct Kind {
  const char* name;
  axpby::Dtype dtype;
  nb::dlpack::dtype storage;
};

// float16 and bfloat16 arrive as uint16 views of their bits (NumPy's buffer
// protocol does not describe bfloat16).
const Kind kinds[] = {
    {"float32", axpby::Dtype::float32, nb::dtype<float>()},
    {"float64", axpby::Dtype::float64, nb::dtype<double>()},
    {"float16", axpby::Dtype::float16, nb::dtype<uint16_t>()},
    {"bfloat16", axpby::Dtype::bfloat16, nb::dtype<uint16_t>()},
    {"complex64", axpby::Dtype::complex64, nb::dtype<std::complex<float>>()},
};

std::string shape_of(size_t ndim, const int64_t* shape) {
  std::string s = "(";
  for (size_t d = 0; d < ndim; ++d) s += std::to_string(shape[d]) + (ndim == 1 || d + 1 < ndim ? "," : "");
  return s + ")";
}

// The strides, in elements, with which `a` is read at each dimension of the
// output: 0 where `a` lacks the dimension or broadcasts it.
std::vector<int64_t> broadcast_strides(const Input& a, const char* name, size_t ndim,
                                       const int64_t* shape) {
  const size_t an = a.ndim();
  std::vector<int64_t> a_shape(an);
  for (size_t d = 0; d < an; ++d) a_shape[d] = static_cast<int64_t>(a.shape(d));
  if (an > ndim)
    throw nb::value_error(("[axpby] " + std::string(name) + " of shape " + shape_of(an, a_shape.data()) +
                           " has more dimensions than the output " + shape_of(ndim, shape) + ".").c_str());
  std::vector<int64_t> strides(ndim, 0);
  for (size_t d = 0; d < an; ++d) {
    const size_t o = ndim - an + d;
    if (a_shape[d] == shape[o])
      strides[o] = shape[o] == 1 ? 0 : a.stride(d);
    else if (a_shape[d] != 1)
      throw nb::value_error(("[axpby] " + std::string(name) + " of shape " + shape_of(an, a_shape.data()) +
                             " does not broadcast to the output shape " + shape_of(ndim, shape) + ".").c_str());
  }
  return strides;
}

void axpby_into(const Input& x, const Input& y, Output& out, double alpha, double beta,
                const std::string& dtype) {
  const Kind* kind = nullptr;
  for (const Kind& k : kinds)
    if (dtype == k.name) kind = &k;
  if (kind == nullptr) throw nb::type_error(("[axpby] Unsupported dtype " + dtype + ".").c_str());
  if (x.dtype() != kind->storage || y.dtype() != kind->storage || out.dtype() != kind->storage)
    throw nb::type_error(("[axpby] x, y and out must all hold " + dtype +
                          " data (float16 and bfloat16 as uint16 views).").c_str());
  const size_t ndim = out.ndim();
  std::vector<int64_t> shape(ndim);
  for (size_t d = 0; d < ndim; ++d) shape[d] = static_cast<int64_t>(out.shape(d));
  const std::vector<int64_t> sx = broadcast_strides(x, "x", ndim, shape.data());
  const std::vector<int64_t> sy = broadcast_strides(y, "y", ndim, shape.data());
  // out is a fresh buffer, so it never overlaps x or y (lazyx kernels never write into inputs).
  nb::gil_scoped_release release;
  axpby::axpby(kind->dtype, {x.data(), sx.data()}, {y.data(), sy.data()}, out.data(), shape.data(),
               ndim, alpha, beta);
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "The CPU kernel of lazyx-axpby.";
  m.def("axpby", &axpby_into, "x"_a.noconvert(), "y"_a.noconvert(), "out"_a.noconvert(), "alpha"_a,
        "beta"_a, "dtype"_a,
        "Write alpha * x + beta * y into out (C-contiguous, of the broadcast shape). x and y may "
        "have any strides and broadcast against out; all three hold `dtype` data (float32, "
        "float64, complex64, or float16 / bfloat16 as uint16 views). Runs without the GIL.");
  m.attr("DTYPES") = nb::make_tuple("float32", "float64", "float16", "bfloat16", "complex64");
}
