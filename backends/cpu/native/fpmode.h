// Flushing subnormal numbers to zero while lazyx's kernels run.
//
// A floating-point result below the smallest normal number (float32: 1.18e-38)
// is subnormal; many CPUs compute with subnormals through microcode: on Intel,
// OpenBLAS's sgemm ran 25x slower when its products underflow (issue 16: 17 ms
// instead of 0.7 ms for 256x512x512; AMD Zen 3 shows no penalty). Setting the control register's flush-to-zero bits (x86-64: MXCSR's FTZ,
// bit 15, and DAZ, bit 6; aarch64: FPCR's FZ, bit 24) makes the hardware treat
// subnormal inputs and results as zero at full speed, as JAX and TensorFlow do
// on the CPU and as `torch.set_flush_denormal(True)` does.
//
// The register belongs to each thread, so the mode travels with the work:
//   * enter_eval()/exit_eval() (module.cpp) set the bits on the calling thread
//     for the length of one evaluation when the switch is on (flush_denormal()),
//     and put the caller's own register back afterwards: NumPy code outside
//     lazyx keeps IEEE semantics;
//   * the thread pool (parallel.cpp) hands each job the caller's register and
//     every helper loads it before its chunks;
//   * the generated kernels' threads (lazyx/codegen/cpp.py) are created per call
//     and inherit the caller's register (POSIX: a new thread starts with the
//     floating-point environment of the thread that created it);
//   * OpenBLAS's workers keep the register they were started with (NumPy's
//     build lacks CONSISTENT_FPCSR): backends/cpu/blas_threads.py restarts them
//     in the switch's mode (call_in_fp_mode in module.cpp).
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace lazyx::fp {

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
constexpr bool kSupported = true;
constexpr uint64_t kFlushBits = (1u << 15) | (1u << 6);  // FTZ | DAZ
inline uint64_t control() { return _mm_getcsr(); }
inline void set_control(uint64_t v) { _mm_setcsr(static_cast<unsigned>(v)); }
#elif defined(__aarch64__)
constexpr bool kSupported = true;
constexpr uint64_t kFlushBits = uint64_t(1) << 24;  // FZ: inputs and results
inline uint64_t control() {
  uint64_t v;
  asm volatile("mrs %0, fpcr" : "=r"(v));
  return v;
}
inline void set_control(uint64_t v) { asm volatile("msr fpcr, %0" : : "r"(v)); }
#else
constexpr bool kSupported = false;
constexpr uint64_t kFlushBits = 0;
inline uint64_t control() { return 0; }
inline void set_control(uint64_t) {}
#endif

// The switch (mx.set_flush_denormal): process-wide, read when an evaluation starts.
inline std::atomic<bool> g_flush{kSupported};

inline bool flush_denormal() { return g_flush.load(std::memory_order_relaxed); }

// Returns whether flushing is supported here; unsupported leaves the switch off.
inline bool set_flush_denormal(bool on) {
  g_flush.store(on && kSupported, std::memory_order_relaxed);
  return kSupported;
}

// Load `v` unless the register holds it already (writing it stalls the pipeline).
inline void load_control(uint64_t v) {
  if (kSupported && control() != v) set_control(v);
}

// One evaluation on the calling thread. Evaluations nest (a kernel may evaluate);
// the outermost one saves the caller's register and restores it.
struct EvalScope {
  uint64_t saved = 0;
  int depth = 0;
  bool changed = false;
};
inline thread_local EvalScope t_scope;

inline void enter_eval() {
  if (!kSupported) return;
  EvalScope& s = t_scope;
  if (s.depth++ > 0) return;
  s.changed = false;
  if (flush_denormal()) {
    s.saved = control();
    if ((s.saved & kFlushBits) != kFlushBits) {
      set_control(s.saved | kFlushBits);
      s.changed = true;
    }
  }
}

inline void exit_eval() {
  if (!kSupported) return;
  EvalScope& s = t_scope;
  if (s.depth == 0) return;  // unbalanced: nothing of ours to undo
  if (--s.depth == 0 && s.changed) {
    // Keep the status flags the kernels raised; put back only the mode bits.
    set_control((control() & ~kFlushBits) | (s.saved & kFlushBits));
    s.changed = false;
  }
}

}  // namespace lazyx::fp
