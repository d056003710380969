// lazyx-axpby's Metal kernels: out = alpha * x + beta * y, one thread per output element.
//
// Two layouts, as lazyx's Metal backend chooses them (MetalKernel's `{layout}`):
//   contiguous  x, y and out are row-contiguous with one shape: index them alike;
//   general     x and y are strided or broadcast: walk the output's shape to each
//               input's offset through its strides (0 along broadcast dimensions).
// Buffers, in lazyx's default order: x, y, out, alpha, beta, shape, x_strides,
// y_strides, ndim. float16 and bfloat16 are computed in float32 and rounded once,
// as the package's CPU kernel does. `bfloat` needs Metal 3.1 (macOS 14 or later).
#include <metal_stdlib>
using namespace metal;

template <typename T>
inline T scaled_sum(T x, T y, float alpha, float beta) {
  return static_cast<T>(alpha * static_cast<float>(x) + beta * static_cast<float>(y));
}

template <typename T>
[[kernel]] void axpby_contiguous(
    device const T* x [[buffer(0)]],
    device const T* y [[buffer(1)]],
    device T* out [[buffer(2)]],
    constant const float& alpha [[buffer(3)]],
    constant const float& beta [[buffer(4)]],
    uint index [[thread_position_in_grid]]) {
  out[index] = scaled_sum(x[index], y[index], alpha, beta);
}

template <typename T>
[[kernel]] void axpby_general(
    device const T* x [[buffer(0)]],
    device const T* y [[buffer(1)]],
    device T* out [[buffer(2)]],
    constant const float& alpha [[buffer(3)]],
    constant const float& beta [[buffer(4)]],
    constant const int* shape [[buffer(5)]],
    constant const int64_t* x_strides [[buffer(6)]],
    constant const int64_t* y_strides [[buffer(7)]],
    constant const int& ndim [[buffer(8)]],
    uint index [[thread_position_in_grid]]) {
  // The output is row-major: peel its coordinates off the flat index, last axis first,
  // and let both inputs follow them at once.
  int64_t x_at = 0;
  int64_t y_at = 0;
  uint rest = index;
  for (int d = ndim - 1; d >= 0; --d) {
    uint extent = static_cast<uint>(shape[d]);
    int64_t i = static_cast<int64_t>(rest % extent);
    rest /= extent;
    x_at += i * x_strides[d];
    y_at += i * y_strides[d];
  }
  out[index] = scaled_sum(x[x_at], y[y_at], alpha, beta);
}

// Host names: axpby_<layout>_<lazyx dtype>.
template [[host_name("axpby_contiguous_float32")]] [[kernel]] decltype(axpby_contiguous<float>) axpby_contiguous<float>;
template [[host_name("axpby_contiguous_float16")]] [[kernel]] decltype(axpby_contiguous<half>) axpby_contiguous<half>;
template [[host_name("axpby_contiguous_bfloat16")]] [[kernel]] decltype(axpby_contiguous<bfloat>) axpby_contiguous<bfloat>;
template [[host_name("axpby_general_float32")]] [[kernel]] decltype(axpby_general<float>) axpby_general<float>;
template [[host_name("axpby_general_float16")]] [[kernel]] decltype(axpby_general<half>) axpby_general<half>;
template [[host_name("axpby_general_bfloat16")]] [[kernel]] decltype(axpby_general<bfloat>) axpby_general<bfloat>;
