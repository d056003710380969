// Row kernels of the cpu backend. Each takes `rows` contiguous rows of `n`
// elements; they run with the GIL released and split rows over threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazyx {

enum class Dtype { float32, float16, bfloat16 };

// out[r, :] = softmax(x[r, :]); x and out hold rows * n elements of `dt`.
void softmax_rows(Dtype dt, const void* x, void* out, size_t rows, size_t n);

// out[r] = log(sum(exp(x[r, :]))).
void logsumexp_rows(Dtype dt, const void* x, void* out, size_t rows, size_t n);

enum class ReduceOp { sum, max, min };

// out[r] = op(x[r, :]) for float32. Sums accumulate in blocks of float32 lanes
// whose totals are added in double; max and min propagate NaN (NumPy, MLX).
void reduce_rows_f32(ReduceOp op, const float* x, float* out, size_t rows, size_t n);
// out (M, N) = a (M, K) @ b (K, N) in float32 when a side is at most 16 and the layout
// suits one of the skinny loops (strides in elements; out C-contiguous); false when not.
bool skinny_matmul_f32(const float* a, ptrdiff_t as0, ptrdiff_t as1, const float* b, ptrdiff_t bs0, ptrdiff_t bs1,
                       float* out, size_t M, size_t N, size_t K);
// Op over the rows of x (rows, cols): out[c] = op(x[0, c], x[1, c], ...).
void reduce_columns_f32(ReduceOp op, const float* x, float* out, size_t rows, size_t cols);

// The instruction-set extensions kernels.cpp was compiled with (it alone gets
// -march=native), as names __builtin_cpu_supports knows; NULL-terminated.
// Plain data, so reading it runs none of that code.
extern const char* const kernel_isa[];

}  // namespace lazyx
