// The CPU kernel of lazyx-axpby: out = alpha * x + beta * y, with x and y
// broadcast against out's shape (NumPy's rules) and read through any strides.
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>

namespace axpby {

// One operand as the kernel sees it: its data and, per dimension of the
// output, its shape and its stride in elements. Dimensions the operand lacks
// (leading ones) or broadcasts (size 1) get stride 0 from the caller.
struct Operand {
  const void* data;
  const int64_t* strides;  // out_ndim entries, in elements; may be 0 or negative
};

// Storage types. float16 and bfloat16 travel as the raw bits of their values
// (uint16_t) and are computed in float32.
enum class Dtype { float32, float64, float16, bfloat16, complex64 };

// out (C-contiguous, `ndim` dimensions of `shape`) = alpha * x + beta * y.
// Runs without the GIL; performs no allocation and no Python calls.
void axpby(Dtype dtype, Operand x, Operand y, void* out, const int64_t* shape, size_t ndim,
           double alpha, double beta);

}  // namespace axpby
