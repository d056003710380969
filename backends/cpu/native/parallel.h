// Splitting a kernel's rows over threads.
//
// A small pool of helper threads waits on a condition variable (after spinning
// for 1 ms, so back-to-back kernels find them awake). A parallel
// kernel cuts its rows into a few chunks per thread; the calling thread and
// whichever helpers wake up claim chunks from an atomic counter, and the
// caller returns once every claimed chunk is done. A helper that wakes late
// (its core busy with another process: common on small shared machines)
// finds no chunk left and costs nothing, so a parallel kernel is never much
// slower than a serial one. Kernels only go parallel when each thread gets
// kMinWorkPerThread elements, enough to hide a wake-up.
// Helpers compute in the caller's floating-point mode: each job carries the
// caller's control register (flush-to-zero or not, see fpmode.h).
#pragma once

#include <algorithm>
#include <cstddef>

namespace lazyx {

constexpr size_t kMinWorkPerThread = 1 << 17;

int default_num_threads();
int num_threads();
int set_num_threads(int n);  // returns the previous value
// Helpers spinning for the next kernel sleep at once: called before work that runs on
// threads of its own (BLAS), so that the spinning does not take their cores.
void park_threads();

namespace detail {
using ChunkFn = void (*)(void* ctx, size_t begin, size_t end);
// Run fn over [0, n) in chunks of `chunk` items on up to `threads` threads.
void run_parallel(ChunkFn fn, void* ctx, size_t n, size_t chunk, size_t threads);
// Run fn(ctx, i, i + 1) for every i in [0, n) at the same time, each on a thread of its own
// (jobs that wait for one another, as a threaded BLAS product's do): on the pool's helpers
// when the pool is free, else on threads started for the call.
void run_concurrently(ChunkFn fn, void* ctx, size_t n);
}  // namespace detail

// OpenBLAS's caller-managed threading (openblas_set_threads_callback_function, OpenBLAS
// 0.3.27 and later): OpenBLAS hands a threaded call's jobs to this function, which runs
// dojob(i, jobdata + i * elsize, dojob_data) for each job i on the pool, so that BLAS and
// lazyx's kernels share one set of threads instead of two sets spinning on the same cores.
extern "C" void lazyx_blas_threads(int sync, void (*dojob)(int, void*, int), int numjobs, size_t elsize,
                                   void* jobdata, int dojob_data);

// Run fn(begin, end) over [0, n) items, each worth `cost` elements of work.
template <class F>
void parallel_for(size_t n, size_t cost, F&& fn) {
  if (n == 0) return;
  const size_t by_work = std::max<size_t>(1, (n * std::max<size_t>(cost, 1)) / kMinWorkPerThread);
  const size_t t = std::min({static_cast<size_t>(num_threads()), by_work, n});
  if (t <= 1) {
    fn(size_t(0), n);
    return;
  }
  const size_t chunks = std::min(n, 4 * t);
  const size_t chunk = (n + chunks - 1) / chunks;
  using Fn = std::remove_reference_t<F>;
  detail::run_parallel(
      [](void* ctx, size_t b, size_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&fn)), n, chunk, t);
}

}  // namespace lazyx
