// out = alpha * x + beta * y on NVIDIA GPUs, compiled at run time by NVRTC
// through lazyx's CUDA backend (lazyx.backends.cuda.CudaKernel).
//
// One template per path, instantiated per dtype by its storage/compute type:
//   axpby_contiguous<T>: x, y and out C-contiguous with out's shape: a flat
//                        grid-stride loop;
//   axpby_strided<T>:    x and y read through their broadcast strides (0 on
//                        broadcast dimensions), out contiguous.
// float16 and bfloat16 are stored as their 16-bit patterns and computed in
// float32 (no CUDA headers needed); complex64 is float2.

struct F32 {
  typedef float S; typedef float C;
  static __device__ C load(S v) { return v; }
  static __device__ S store(C v) { return v; }
};

struct F64 {
  typedef double S; typedef double C;
  static __device__ C load(S v) { return v; }
  static __device__ S store(C v) { return v; }
};

struct F16 {
  typedef unsigned short S; typedef float C;
  static __device__ C load(S v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ S store(C v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
};

struct BF16 {
  typedef unsigned short S; typedef float C;
  static __device__ C load(S v) { return __uint_as_float(((unsigned int)v) << 16); }
  static __device__ S store(C v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet nan
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
  }
};

struct C64 {
  typedef float2 S; typedef float2 C;
  static __device__ C load(S v) { return v; }
  static __device__ S store(C v) { return v; }
};

__device__ __forceinline__ float combine(float x, float y, double a, double b) {
  return (float)a * x + (float)b * y;
}
__device__ __forceinline__ double combine(double x, double y, double a, double b) {
  return a * x + b * y;
}
__device__ __forceinline__ float2 combine(float2 x, float2 y, double a, double b) {
  return make_float2((float)a * x.x + (float)b * y.x, (float)a * x.y + (float)b * y.y);
}

template <typename T>
__global__ void axpby_contiguous(const typename T::S* x, const typename T::S* y,
                                 typename T::S* out, double alpha, double beta, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = T::store(combine(T::load(x[i]), T::load(y[i]), alpha, beta));
}

template <typename T>
__global__ void axpby_strided(const typename T::S* x, const typename T::S* y,
                              typename T::S* out, double alpha, double beta, long long n,
                              int ndim, const long long* shape, const long long* xstrides,
                              const long long* ystrides) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long rem = i, xi = 0, yi = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      long long c = rem % shape[d];
      rem /= shape[d];
      xi += c * xstrides[d];
      yi += c * ystrides[d];
    }
    out[i] = T::store(combine(T::load(x[xi]), T::load(y[yi]), alpha, beta));
  }
}
