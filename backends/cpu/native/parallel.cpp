#include "parallel.h"

#include "fpmode.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace lazyx {

namespace {

std::atomic<int> g_threads{0};  // 0: not chosen yet
constexpr int kSpinMicros = 1000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct Job {
  detail::ChunkFn fn;
  void* ctx;
  size_t n, chunk, chunks;
  size_t max_helpers;
  uint64_t fp_control;  // the caller's floating-point control register (fpmode.h)
  std::atomic<size_t> next{0}, done{0}, helpers{0};

  void work() {
    for (;;) {
      const size_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const size_t b = c * chunk;
      fn(ctx, b, std::min(n, b + chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

class Pool {
 public:
  // Make sure `helpers` threads exist; how many do (fewer where starting one failed).
  size_t ensure(size_t helpers) {
    std::lock_guard<std::mutex> lock(mu_);
    while (workers_ < helpers) {
      try {
        std::thread(&Pool::loop, this).detach();
      } catch (...) {
        break;
      }
      ++workers_;
    }
    return workers_;
  }

  void post(const std::shared_ptr<Job>& job) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_all();
  }

  // Helpers spinning for the next kernel go to sleep now (the caller is about to run work
  // with threads of its own, e.g. BLAS, whose cores they would take).
  void park() { park_.fetch_add(1, std::memory_order_release); }

  void retire(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_ == job) job_.reset();
  }

  std::mutex run_mu;  // one parallel kernel at a time; others run serially
  std::mutex blas_mu;  // one BLAS call's jobs at a time (lazyx_blas_threads)

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin a little before sleeping: kernels often come back to back, and
      // waking a sleeping thread (its idle vCPU) can take far longer than the work.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      const uint64_t parked = park_.load(std::memory_order_acquire);
      while (generation_.load(std::memory_order_acquire) == seen && park_.load(std::memory_order_acquire) == parked &&
             std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 64; ++i) cpu_relax();
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        --sleepers_;
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
      }
      if (job && job->helpers.fetch_add(1, std::memory_order_relaxed) < job->max_helpers) {
        // Compute as the caller does: flush-to-zero or IEEE subnormals (fpmode.h).
        fp::load_control(job->fp_control);
        job->work();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> park_{0};
  size_t sleepers_ = 0;
  size_t workers_ = 0;
};

// Never destroyed (helpers block in it until the process ends); a fork()ed
// child, which has none of the parent's helpers, gets a new one.
Pool& pool() {
  static Pool* p = nullptr;
  static pid_t owner = 0;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const pid_t pid = getpid();
  if (p == nullptr || owner != pid) {
    p = new Pool();
    owner = pid;
  }
  return *p;
}

}  // namespace

int default_num_threads() {
#if defined(__linux__)
  // The CPUs this process may run on, which a container may set below
  // hardware_concurrency().
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_num_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void park_threads() { pool().park(); }

int set_num_threads(int n) {
  const int previous = num_threads();
  g_threads.store(n, std::memory_order_relaxed);
  return previous;
}

namespace detail {

// Run fn over [0, n) in chunks of `chunk` on the caller and up to `helpers` of the pool's
// helpers (the caller holds p.run_mu), in the caller's floating-point mode.
static void run_job(Pool& p, ChunkFn fn, void* ctx, size_t n, size_t chunk, size_t helpers) {
  auto job = std::make_shared<Job>();
  job->fn = fn;
  job->ctx = ctx;
  job->n = n;
  job->chunk = chunk;
  job->chunks = (n + chunk - 1) / chunk;
  job->max_helpers = helpers;
  job->fp_control = fp::control();
  p.post(job);
  job->work();
  // Chunks a helper claimed may still be running; fn and ctx must outlive them.
  while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  p.retire(job);
}

void run_parallel(ChunkFn fn, void* ctx, size_t n, size_t chunk, size_t threads) {
  Pool& p = pool();
  std::unique_lock<std::mutex> running(p.run_mu, std::try_to_lock);
  if (!running.owns_lock() || p.ensure(threads - 1) == 0) {
    fn(ctx, 0, n);
    return;
  }
  run_job(p, fn, ctx, n, chunk, threads - 1);
}

void run_concurrently(ChunkFn fn, void* ctx, size_t n) {
  if (n == 0) return;
  if (n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  Pool& p = pool();
  std::unique_lock<std::mutex> running(p.run_mu, std::try_to_lock);
  if (running.owns_lock() && p.ensure(n - 1) >= n - 1) {
    // One job per chunk: the caller claims the first and every helper one more. A job
    // that waits for another only ever waits for one claimed already (the caller's jobs
    // come in order, and a job ends only once the others it waits for have run), so
    // each runs on a thread of its own, whichever wakes first.
    run_job(p, fn, ctx, n, 1, n - 1);
    return;
  }
  // The pool is busy (another thread's kernel, or this very thread's: a call from inside
  // a parallel kernel): threads of the call's own, in the caller's floating-point mode.
  running = {};
  const uint64_t control = fp::control();
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (size_t i = 1; i < n; ++i)
    threads.emplace_back([=] {
      fp::load_control(control);
      fn(ctx, i, i + 1);
    });
  fn(ctx, 0, 1);
  for (auto& t : threads) t.join();
}

}  // namespace detail

extern "C" void lazyx_blas_threads(int /*sync: OpenBLAS waits for the jobs either way*/,
                                   void (*dojob)(int, void*, int), int numjobs, size_t elsize, void* jobdata,
                                   int dojob_data) {
  struct Ctx {
    void (*dojob)(int, void*, int);
    char* data;
    size_t elsize;
    int arg;
  } c{dojob, static_cast<char*>(jobdata), elsize, dojob_data};
  // OpenBLAS gives the jobs of every call the same numbers, and a job's number picks its
  // packing buffer: the jobs of two calls from two threads must not run at once (measured:
  // wrong products from four threads multiplying together). Its own workers serve one
  // call at a time too. The lock is the pool's: a fork()ed child, which gets a new pool,
  // gets a new lock with it.
  std::lock_guard<std::mutex> lock(pool().blas_mu);
  detail::run_concurrently(
      [](void* ctx, size_t b, size_t e) {
        const Ctx& c = *static_cast<const Ctx*>(ctx);
        for (size_t i = b; i < e; ++i) c.dojob(static_cast<int>(i), c.data + i * c.elsize, c.arg);
      },
      &c, numjobs > 0 ? static_cast<size_t>(numjobs) : 0);
}

}  // namespace lazyx
