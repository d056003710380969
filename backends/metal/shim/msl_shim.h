// lazyx's MSL-on-the-CPU shim: lets a Metal Shading Language kernel compile as C++17
// with the system compiler, so that lazyx's Metal kernels are checked on machines
// without a Metal GPU (lazyx.backends.metal.msl_cpu builds and runs them).
//
// What it maps:
//   * function qualifiers and attributes: `kernel`, `[[kernel]]`, `[[buffer(n)]]`,
//     `[[threadgroup(n)]]`, `[[host_name("...")]]`, the thread-position attributes
//     (`[[thread_position_in_grid]]`, `[[threadgroup_position_in_grid]]`, ...: see
//     `attr` below), `[[max_total_threads_per_threadgroup(n)]]` (all vanish: the
//     generated entry point binds the arguments itself);
//   * address spaces `device`, `constant`, `thread`, `threadgroup` (vanish: one flat
//     address space; msl_cpu rewrites a `threadgroup` *declaration* into a
//     `static thread_local` one, so a threadgroup's threads share it);
//   * scalar types `uint`, `ushort`, `uchar`, `ulong`, `half`, `bfloat` (the 16-bit
//     floats are stored as their bits and computed in float, rounded to nearest even
//     after each operation, as a GPU does), and `uint2`/`uint3` for thread positions;
//   * `metal::` math (float, half and bfloat overloads), `as_type`, `select`, `clamp`,
//     `numeric_limits`;
//   * cooperation: `threadgroup_barrier`, `simdgroup_barrier`, the SIMD-group functions
//     (`simd_sum` ... `simd_shuffle_down`, 32 lanes) and atomics (`atomic_int`,
//     `atomic_uint`, `atomic_float` with the `atomic_*_explicit` functions).
//
// How threads cooperate here: the threads of one threadgroup run as fibers (ucontext)
// on one CPU thread, each until it reaches a barrier or a SIMD-group function, then
// the next. A `threadgroup_barrier` releases its threads once every thread of the
// threadgroup that has not returned waits at it; a SIMD-group function once every
// such thread of the simdgroup has called it, and then each lane reads the others'
// values. Threadgroups run one after another. Since a fiber switches only there,
// atomics are trivially atomic. A kernel that never synchronises runs as a plain loop.
//
// What it does not: textures and samplers, SIMD-group matrices, quad-group functions,
// vector arithmetic (`float4`), function constants; a barrier or SIMD-group function
// some threads skip (divergent control flow) is reported, not emulated.
#ifndef LAZYX_MSL_SHIM_H
#define LAZYX_MSL_SHIM_H

// Every standard header first: the macros below would rewrite words inside them.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <limits>
#include <type_traits>

#include <ucontext.h>

namespace lx_msl {

// -- 16-bit floats -------------------------------------------------------------------
inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct half_format {
  static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // rounds to infinity (>= 65520)
    if (ax < 0x38800000u) {
      // Below half's smallest normal: a multiple of 2**-24, rounded to nearest even by
      // the (exact) scaling and nearbyint in the default rounding mode.
      return uint16_t(sign | uint32_t(std::nearbyint(bits_float(ax) * 16777216.0f)));
    }
    uint32_t e = ax - 0x38000000u;                             // rebias 127 -> 15
    return uint16_t(sign | ((e + 0xfffu + ((e >> 13) & 1u)) >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      float f = float(m) * 5.9604644775390625e-8f;            // m * 2**-24, exact
      return sign ? -f : f;
    }
    return bits_float(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
  }
};

struct bfloat_format {
  static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  static float to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }
};

// A 16-bit float: its bits in memory (so that device buffers hold the GPU's format),
// float in arithmetic. Converts implicitly to and from the other scalar types, as MSL's do.
template <class Format>
struct float16_storage {
  uint16_t bits;
  float16_storage() = default;
  float16_storage(float f) : bits(Format::from_float(f)) {}
  float16_storage(double d) : bits(Format::from_float(float(d))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  float16_storage(I i) : bits(Format::from_float(float(i))) {}
  operator float() const { return Format::to_float(bits); }
  float16_storage& operator+=(float16_storage o) { return *this = float(*this) + float(o); }
  float16_storage& operator-=(float16_storage o) { return *this = float(*this) - float(o); }
  float16_storage& operator*=(float16_storage o) { return *this = float(*this) * float(o); }
  float16_storage& operator/=(float16_storage o) { return *this = float(*this) / float(o); }
  float16_storage operator-() const { float16_storage r; r.bits = uint16_t(bits ^ 0x8000u); return r; }
  float16_storage operator+() const { return *this; }
};

template <class T> struct is_float16 : std::false_type {};
template <class F> struct is_float16<float16_storage<F>> : std::true_type {};

// half op half -> half; half op float -> float; half op integer -> half (MSL's rules).
#define LX_MSL_ARITHMETIC(op)                                                              \
  template <class F>                                                                      \
  inline float16_storage<F> operator op(float16_storage<F> a, float16_storage<F> b) {     \
    return float16_storage<F>(float(a) op float(b));                                      \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>     \
  inline float operator op(float16_storage<F> a, T b) { return float(a) op float(b); }    \
  template <class F, class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>     \
  inline float operator op(T a, float16_storage<F> b) { return float(a) op float(b); }    \
  template <class F, class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>           \
  inline float16_storage<F> operator op(float16_storage<F> a, T b) {                      \
    return float16_storage<F>(float(a) op float(b));                                      \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>           \
  inline float16_storage<F> operator op(T a, float16_storage<F> b) {                      \
    return float16_storage<F>(float(a) op float(b));                                      \
  }
LX_MSL_ARITHMETIC(+)
LX_MSL_ARITHMETIC(-)
LX_MSL_ARITHMETIC(*)
LX_MSL_ARITHMETIC(/)
#undef LX_MSL_ARITHMETIC

#define LX_MSL_COMPARISON(op)                                                             \
  template <class F>                                                                      \
  inline bool operator op(float16_storage<F> a, float16_storage<F> b) {                   \
    return float(a) op float(b);                                                          \
  }                                                                                       \
  template <class F, class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>         \
  inline bool operator op(float16_storage<F> a, T b) { return float(a) op float(b); }     \
  template <class F, class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>         \
  inline bool operator op(T a, float16_storage<F> b) { return float(a) op float(b); }
LX_MSL_COMPARISON(==)
LX_MSL_COMPARISON(!=)
LX_MSL_COMPARISON(<)
LX_MSL_COMPARISON(<=)
LX_MSL_COMPARISON(>)
LX_MSL_COMPARISON(>=)
#undef LX_MSL_COMPARISON

// -- thread positions ------------------------------------------------------------------
struct uint2 { uint32_t x, y; };
struct uint3 { uint32_t x, y, z; };

// The thread-position attributes a kernel parameter may carry (msl_cpu names them by
// these enumerators: keep the two lists in step).
enum class attr : int {
  thread_position_in_grid, threads_per_grid, threadgroup_position_in_grid,
  thread_position_in_threadgroup, threads_per_threadgroup, dispatch_threads_per_threadgroup,
  threadgroups_per_grid, thread_index_in_threadgroup, thread_index_in_simdgroup,
  simdgroup_index_in_threadgroup, simdgroups_per_threadgroup, threads_per_simdgroup,
  thread_execution_width,
};

constexpr uint32_t simd_width = 32;
constexpr uint32_t max_threads = 1024;                 // per threadgroup, as on Apple GPUs
constexpr size_t stack_bytes = size_t(128) << 10;     // each fiber's stack

enum class lane_state : uint8_t { runnable, barrier, simd, done };

// Where a thread waits: the function and the MSL line it was called from.
struct site {
  const char* op;
  int line;
  bool operator!=(const site& o) const { return line != o.line || std::strcmp(op, o.op) != 0; }
};

struct lane {
  uint3 local;            // [[thread_position_in_threadgroup]]
  uint32_t index;         // [[thread_index_in_threadgroup]]
  lane_state state;
  site at;
  ucontext_t context;
};

using body_fn = void (*)(void* const* buffers);

// One launch, on the CPU thread that runs it (its threadgroups one after another).
struct launch_state {
  uint3 grid, size, groups;     // threads in the grid, per (full) threadgroup, threadgroups
  uint3 group, actual;          // this threadgroup's position and its (edge-clipped) size
  uint32_t count = 0;           // threads in this threadgroup
  bool fibers = false, reverse = false, failed = false;
  body_fn body = nullptr;
  void* const* buffers = nullptr;
  void* const* tg_buffers = nullptr;
  lane* current = nullptr;
  lane lanes[max_threads];
  char* stacks = nullptr;
  ucontext_t main;
  // SIMD-group exchange: each lane's value, double-buffered by the simdgroup's epoch
  // (a lane may write its next value before the others have read this one).
  uint32_t epoch[max_threads / simd_width];
  uint32_t active[max_threads / simd_width];    // lanes released together at the last epoch
  alignas(16) unsigned char slot[2][max_threads][16];
  site slot_site[2][max_threads];
  char error[1024];
};

inline thread_local launch_state* state = nullptr;

// Record the first error; a fiber then leaves for good (the launch is abandoned).
inline void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char* format, ...) {
  launch_state& s = *state;
  if (!s.failed) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(s.error, sizeof s.error, format, args);
    va_end(args);
    s.failed = true;
  }
  if (s.fibers && s.current) swapcontext(&s.current->context, &s.main);
}

inline void wait(lane_state how, site at) {
  launch_state& s = *state;
  lane& l = *s.current;
  l.state = how;
  l.at = at;
  swapcontext(&l.context, &s.main);
}

inline uint3 attribute_value(attr a) {
  const launch_state& s = *state;
  const lane& l = *s.current;
  switch (a) {
    case attr::thread_position_in_grid:
      return {s.group.x * s.size.x + l.local.x, s.group.y * s.size.y + l.local.y,
              s.group.z * s.size.z + l.local.z};
    case attr::threads_per_grid: return s.grid;
    case attr::threadgroup_position_in_grid: return s.group;
    case attr::thread_position_in_threadgroup: return l.local;
    case attr::threads_per_threadgroup: return s.actual;
    case attr::dispatch_threads_per_threadgroup: return s.size;
    case attr::threadgroups_per_grid: return s.groups;
    case attr::thread_index_in_threadgroup: return {l.index, 0u, 0u};
    case attr::thread_index_in_simdgroup: return {l.index % simd_width, 0u, 0u};
    case attr::simdgroup_index_in_threadgroup: return {l.index / simd_width, 0u, 0u};
    case attr::simdgroups_per_threadgroup: return {(s.count + simd_width - 1) / simd_width, 0u, 0u};
    case attr::threads_per_simdgroup:
    case attr::thread_execution_width: return {simd_width, 0u, 0u};
  }
  return {0u, 0u, 0u};
}

// The value of a thread-position parameter of type T (uint3, uint2 or a scalar: .x).
template <class T> T attribute(attr a) {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  uint3 v = attribute_value(a);
  if constexpr (std::is_same_v<U, uint3>) return v;
  else if constexpr (std::is_same_v<U, uint2>) return U{v.x, v.y};
  else return U(v.x);
}

inline void fiber_main() {
  launch_state& s = *state;
  s.body(s.buffers);
  s.current->state = lane_state::done;   // uc_link goes back to the scheduler
}

inline const char* state_name(lane_state st) {
  return st == lane_state::barrier ? "threadgroup_barrier" : "a SIMD-group function";
}

// Run the threads of the current threadgroup until all have returned.
inline void run_group(launch_state& s) {
  const uint32_t n = s.count, ax = s.actual.x, axy = s.actual.x * s.actual.y;
  for (uint32_t i = 0; i < n; ++i) {
    lane& l = s.lanes[i];
    l.index = i;
    l.local = {i % ax, (i / ax) % s.actual.y, i / axy};
    l.state = lane_state::runnable;
  }
  if (!s.fibers) {
    for (uint32_t k = 0; k < n && !s.failed; ++k) {
      s.current = &s.lanes[s.reverse ? n - 1 - k : k];
      s.body(s.buffers);
    }
    return;
  }
  for (uint32_t i = 0; i < n; ++i) {
    lane& l = s.lanes[i];
    getcontext(&l.context);
    l.context.uc_stack.ss_sp = s.stacks + size_t(i) * stack_bytes;
    l.context.uc_stack.ss_size = stack_bytes;
    l.context.uc_link = &s.main;
    makecontext(&l.context, fiber_main, 0);
  }
  const uint32_t n_simd = (n + simd_width - 1) / simd_width;
  for (uint32_t g = 0; g < n_simd; ++g) s.epoch[g] = 0;
  for (;;) {
    for (uint32_t k = 0; k < n; ++k) {
      lane& l = s.lanes[s.reverse ? n - 1 - k : k];
      if (l.state != lane_state::runnable) continue;
      s.current = &l;
      swapcontext(&s.main, &l.context);
      if (s.failed) return;
    }
    // Every thread now waits or has returned: release a simdgroup whose live lanes all
    // wait at a SIMD-group function, else the threadgroup if all wait at a barrier.
    bool released = false, live = false, all_barrier = true;
    const lane* at_barrier = nullptr;
    const lane* at_simd = nullptr;
    for (uint32_t g = 0; g < n_simd; ++g) {
      uint32_t mask = 0;
      bool all_simd = true;
      for (uint32_t j = 0; j < simd_width && g * simd_width + j < n; ++j) {
        const lane& l = s.lanes[g * simd_width + j];
        if (l.state == lane_state::done) continue;
        live = true;
        if (l.state == lane_state::simd) {
          mask |= 1u << j;
          all_barrier = false;
          if (!at_simd) at_simd = &l;
        } else {
          all_simd = false;
          if (!at_barrier) at_barrier = &l;
        }
      }
      if (mask && all_simd) {
        s.active[g] = mask;
        ++s.epoch[g];
        for (uint32_t j = 0; j < simd_width; ++j)
          if (mask >> j & 1u) s.lanes[g * simd_width + j].state = lane_state::runnable;
        released = true;
      }
    }
    if (!live) return;
    if (released) continue;
    if (all_barrier) {
      for (uint32_t i = 0; i < n; ++i) {
        lane& l = s.lanes[i];
        if (l.state != lane_state::barrier) continue;
        if (l.at != at_barrier->at) {
          s.current = nullptr;
          fail("threadgroup (%u, %u, %u): thread %u waits at %s (line %d) while thread %u "
               "waits at %s (line %d); every thread of a threadgroup must reach the same barrier",
               s.group.x, s.group.y, s.group.z, at_barrier->index, at_barrier->at.op,
               at_barrier->at.line, l.index, l.at.op, l.at.line);
          return;
        }
        l.state = lane_state::runnable;
      }
      continue;
    }
    s.current = nullptr;
    fail("threadgroup (%u, %u, %u): deadlock: thread %u waits at %s (line %d) while thread %u "
         "of a simdgroup not all of whose threads are there waits at %s (line %d); the shim "
         "runs barriers and SIMD-group functions only where all the threads (of the "
         "threadgroup, of the simdgroup) that have not returned reach them",
         s.group.x, s.group.y, s.group.z, at_barrier->index, at_barrier->at.op,
         at_barrier->at.line, at_simd->index, at_simd->at.op, at_simd->at.line);
    return;
  }
}

// Run a kernel body over a grid (dispatchThreads: edge threadgroups are clipped).
// dims: the grid's three sizes, then the threadgroup's. Returns 0, or 1 with `error` set.
inline int launch(body_fn body, void* const* buffers, void* const* tg_buffers,
                  const uint32_t* dims, int flags, char* error, size_t error_size) {
  launch_state* s = new launch_state;   // the tables are filled as they are used
  launch_state* outer = state;
  state = s;
  s->body = body;
  s->buffers = buffers;
  s->tg_buffers = tg_buffers;
  s->grid = {dims[0], dims[1], dims[2]};
  s->size = {dims[3], dims[4], dims[5]};
  s->groups = {(dims[0] + dims[3] - 1) / dims[3], (dims[1] + dims[4] - 1) / dims[4],
               (dims[2] + dims[5] - 1) / dims[5]};
  s->fibers = (flags & 1) != 0;
  s->reverse = (flags & 2) != 0;
  uint32_t per_group = dims[3] * dims[4] * dims[5];
  if (s->fibers && per_group > 1) {
    s->stacks = static_cast<char*>(std::malloc(size_t(per_group) * stack_bytes));
    if (!s->stacks) {
      std::snprintf(s->error, sizeof s->error, "no memory for %u fiber stacks", per_group);
      s->failed = true;
    }
  } else {
    s->fibers = false;        // one thread per threadgroup: nothing to wait for
  }
  for (uint32_t z = 0; z < s->groups.z && !s->failed; ++z)
    for (uint32_t y = 0; y < s->groups.y && !s->failed; ++y)
      for (uint32_t x = 0; x < s->groups.x && !s->failed; ++x) {
        s->group = {x, y, z};
        s->actual = {std::min(s->size.x, s->grid.x - x * s->size.x),
                     std::min(s->size.y, s->grid.y - y * s->size.y),
                     std::min(s->size.z, s->grid.z - z * s->size.z)};
        s->count = s->actual.x * s->actual.y * s->actual.z;
        run_group(*s);
      }
  int rc = s->failed ? 1 : 0;
  if (rc) std::snprintf(error, error_size, "%s", s->error);
  std::free(s->stacks);
  state = outer;
  delete s;
  return rc;
}

// -- SIMD-group exchange --------------------------------------------------------------
// What a lane sees after a SIMD-group function: the values of the lanes that called it
// together (`mask`, bit j = lane j).
template <class T> struct simd_values {
  const unsigned char (*slots)[16];
  uint32_t mask, lane;
  bool has(uint32_t j) const { return j < simd_width && (mask >> j & 1u); }
  T operator[](uint32_t j) const { T v; std::memcpy(&v, slots[j], sizeof(T)); return v; }
  uint32_t first() const { return uint32_t(__builtin_ctz(mask)); }
};

template <class T> simd_values<T> exchange(const T& value, site at) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>,
                "the shim's SIMD-group functions take scalars");
  launch_state& s = *state;
  lane& l = *s.current;
  const uint32_t g = l.index / simd_width, base = g * simd_width, me = l.index % simd_width;
  unsigned p = s.epoch[g] & 1u;
  std::memcpy(s.slot[p][l.index], &value, sizeof(T));
  s.slot_site[p][l.index] = at;
  if (!s.fibers) {
    if (s.count > 1)
      fail("%s (line %d) in a kernel run without fibers: msl_cpu did not see that the kernel "
           "synchronises", at.op, at.line);
    return {&s.slot[p][base], 1u << me, me};
  }
  wait(lane_state::simd, at);
  p = (s.epoch[g] - 1) & 1u;
  const uint32_t mask = s.active[g];
  for (uint32_t j = 0; j < simd_width; ++j) {
    if (!(mask >> j & 1u) || !(s.slot_site[p][base + j] != at)) continue;
    fail("threadgroup (%u, %u, %u), simdgroup %u: lane %u is at %s (line %d) while lane %u is "
         "at %s (line %d); the shim runs SIMD-group functions only where the simdgroup's "
         "threads call them together (uniform control flow)", s.group.x, s.group.y, s.group.z,
         g, me, at.op, at.line, j, s.slot_site[p][base + j].op, s.slot_site[p][base + j].line);
  }
  return {&s.slot[p][base], mask, me};
}

inline void barrier(site at) {
  launch_state& s = *state;
  if (s.fibers) wait(lane_state::barrier, at);
  else if (s.count > 1)
    fail("%s (line %d) in a kernel run without fibers: msl_cpu did not see that the kernel "
         "synchronises", at.op, at.line);
}

// The argument of a [[buffer(n)]] parameter of type T: a pointer into the buffer, or a
// reference to its first element.
template <class T> T bind(void* buffer) {
  if constexpr (std::is_pointer_v<T>) return static_cast<T>(buffer);
  else return *static_cast<std::remove_reference_t<T>*>(buffer);
}

// The parameter types of a kernel function.
template <class Fn> struct parameters;
template <class R, class... A> struct parameters<R (*)(A...)> { using type = std::tuple<A...>; };
template <class Fn, size_t K>
using parameter = std::tuple_element_t<K, typename parameters<Fn>::type>;

}  // namespace lx_msl

// -- the MSL vocabulary ----------------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef lx_msl::float16_storage<lx_msl::half_format> half;
typedef lx_msl::float16_storage<lx_msl::bfloat_format> bfloat;
typedef bfloat bfloat16_t;
using lx_msl::uint2;
using lx_msl::uint3;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wliteral-suffix"
#pragma clang diagnostic ignored "-Wuser-defined-literals"
inline half operator""h(long double v) { return half(double(v)); }   // 1.5h
#pragma GCC diagnostic pop

namespace metal {

#define LX_MSL_UNARY(name, expr)                                                          \
  inline float name(float x) { return expr; }                                            \
  template <class F>                                                                      \
  inline lx_msl::float16_storage<F> name(lx_msl::float16_storage<F> h) {                  \
    return lx_msl::float16_storage<F>(name(float(h)));                                    \
  }
LX_MSL_UNARY(abs, std::fabs(x))
LX_MSL_UNARY(fabs, std::fabs(x))
LX_MSL_UNARY(exp, std::exp(x))
LX_MSL_UNARY(exp2, std::exp2(x))
LX_MSL_UNARY(exp10, std::pow(10.0f, x))
LX_MSL_UNARY(log, std::log(x))
LX_MSL_UNARY(log2, std::log2(x))
LX_MSL_UNARY(log10, std::log10(x))
LX_MSL_UNARY(sqrt, std::sqrt(x))
LX_MSL_UNARY(rsqrt, 1.0f / std::sqrt(x))
LX_MSL_UNARY(sin, std::sin(x))
LX_MSL_UNARY(cos, std::cos(x))
LX_MSL_UNARY(tan, std::tan(x))
LX_MSL_UNARY(asin, std::asin(x))
LX_MSL_UNARY(acos, std::acos(x))
LX_MSL_UNARY(atan, std::atan(x))
LX_MSL_UNARY(sinh, std::sinh(x))
LX_MSL_UNARY(cosh, std::cosh(x))
LX_MSL_UNARY(tanh, std::tanh(x))
LX_MSL_UNARY(asinh, std::asinh(x))
LX_MSL_UNARY(acosh, std::acosh(x))
LX_MSL_UNARY(atanh, std::atanh(x))
LX_MSL_UNARY(floor, std::floor(x))
LX_MSL_UNARY(ceil, std::ceil(x))
LX_MSL_UNARY(round, std::round(x))
LX_MSL_UNARY(rint, std::nearbyint(x))
LX_MSL_UNARY(trunc, std::trunc(x))
LX_MSL_UNARY(fract, x - std::floor(x))
LX_MSL_UNARY(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? x : 0.0f)))
#undef LX_MSL_UNARY

#define LX_MSL_BINARY(name, expr)                                                         \
  inline float name(float x, float y) { return expr; }                                   \
  template <class F>                                                                      \
  inline lx_msl::float16_storage<F> name(lx_msl::float16_storage<F> a,                    \
                                         lx_msl::float16_storage<F> b) {                  \
    return lx_msl::float16_storage<F>(name(float(a), float(b)));                          \
  }
LX_MSL_BINARY(pow, std::pow(x, y))
LX_MSL_BINARY(powr, std::pow(x, y))
LX_MSL_BINARY(atan2, std::atan2(x, y))
LX_MSL_BINARY(fmod, std::fmod(x, y))
LX_MSL_BINARY(fmin, std::fmin(x, y))
LX_MSL_BINARY(fmax, std::fmax(x, y))
LX_MSL_BINARY(copysign, std::copysign(x, y))
LX_MSL_BINARY(step, y < x ? 0.0f : 1.0f)
#undef LX_MSL_BINARY

using ::abs;   // abs(int) from <cstdlib>: one function, so `using namespace metal` is unambiguous
inline long abs(long x) { return x < 0 ? -x : x; }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
template <class T> inline T mix(T x, T y, T a) { return x + (y - x) * a; }
template <class T> inline bool isnan(T x) { return std::isnan(float(x)); }
template <class T> inline bool isinf(T x) { return std::isinf(float(x)); }
template <class T> inline bool isfinite(T x) { return std::isfinite(float(x)); }
template <class T> inline bool signbit(T x) { return std::signbit(float(x)); }

// Reinterpret the bits of a value as another type of the same size.
template <class To, class From> inline To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of one size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// -- numeric_limits (std's, and half's and bfloat's) ------------------------------------
template <class T> struct numeric_limits : std::numeric_limits<T> {};
template <class F> struct float16_limits {
  using T = lx_msl::float16_storage<F>;
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false,
                        has_infinity = true, has_quiet_NaN = true;
  static T bits(uint16_t b) { T t; t.bits = b; return t; }
};
template <> struct numeric_limits<half> : float16_limits<lx_msl::half_format> {
  static half max() { return bits(0x7bffu); }
  static half lowest() { return bits(0xfbffu); }
  static half min() { return bits(0x0400u); }
  static half epsilon() { return bits(0x1400u); }
  static half infinity() { return bits(0x7c00u); }
  static half quiet_NaN() { return bits(0x7e00u); }
};
template <> struct numeric_limits<bfloat> : float16_limits<lx_msl::bfloat_format> {
  static bfloat max() { return bits(0x7f7fu); }
  static bfloat lowest() { return bits(0xff7fu); }
  static bfloat min() { return bits(0x0080u); }
  static bfloat epsilon() { return bits(0x3c00u); }
  static bfloat infinity() { return bits(0x7f80u); }
  static bfloat quiet_NaN() { return bits(0x7fc0u); }
};

// -- barriers -----------------------------------------------------------------------------
enum class mem_flags : uint32_t {
  mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4,
  mem_threadgroup_imageblock = 8, mem_object_data = 16,
};
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint32_t(a) | uint32_t(b)); }

// Every thread of the threadgroup that has not returned waits here before any goes on.
inline void threadgroup_barrier(mem_flags, int line = __builtin_LINE()) {
  lx_msl::barrier({"threadgroup_barrier", line});
}
inline void simdgroup_barrier(mem_flags, int line = __builtin_LINE()) {
  lx_msl::exchange(0, {"simdgroup_barrier", line});
}

// -- SIMD-group functions (32 lanes; the lanes that call together take part) ---------------
#define LX_MSL_SIMD_FOLD(name, combine)                                                   \
  template <class T> inline T name(T value, int line = __builtin_LINE()) {                \
    auto v = lx_msl::exchange(value, {#name, line});                                      \
    T acc = v[v.first()];                                                                 \
    for (uint32_t j = v.first() + 1; j < lx_msl::simd_width; ++j)                         \
      if (v.has(j)) { T b = v[j]; acc = combine; }                                        \
    return acc;                                                                           \
  }
LX_MSL_SIMD_FOLD(simd_sum, acc + b)
LX_MSL_SIMD_FOLD(simd_prod, acc * b)
LX_MSL_SIMD_FOLD(simd_max, max(acc, b))
LX_MSL_SIMD_FOLD(simd_min, min(acc, b))
LX_MSL_SIMD_FOLD(simd_and, T(acc & b))
LX_MSL_SIMD_FOLD(simd_or, T(acc | b))
LX_MSL_SIMD_FOLD(simd_xor, T(acc ^ b))
#undef LX_MSL_SIMD_FOLD

inline bool simd_all(bool value, int line = __builtin_LINE()) {
  auto v = lx_msl::exchange(value, {"simd_all", line});
  for (uint32_t j = 0; j < lx_msl::simd_width; ++j) if (v.has(j) && !v[j]) return false;
  return true;
}
inline bool simd_any(bool value, int line = __builtin_LINE()) {
  auto v = lx_msl::exchange(value, {"simd_any", line});
  for (uint32_t j = 0; j < lx_msl::simd_width; ++j) if (v.has(j) && v[j]) return true;
  return false;
}

// Reading a lane outside the simdgroup, or one that did not call, gives the caller's own
// value (Metal's rule for simd_shuffle_down's upper lanes; undefined on a GPU otherwise).
#define LX_MSL_SIMD_READ(name, source)                                                    \
  template <class T, class I> inline T name(T value, I arg, int line = __builtin_LINE()) { \
    auto v = lx_msl::exchange(value, {#name, line});                                      \
    int64_t src = (source);                                                               \
    return src >= 0 && v.has(uint32_t(src)) ? v[uint32_t(src)] : value;                   \
  }
LX_MSL_SIMD_READ(simd_broadcast, int64_t(arg))
LX_MSL_SIMD_READ(simd_shuffle, int64_t(arg))
LX_MSL_SIMD_READ(simd_shuffle_xor, int64_t(v.lane ^ uint32_t(arg)))
LX_MSL_SIMD_READ(simd_shuffle_down, int64_t(v.lane) + int64_t(arg))
LX_MSL_SIMD_READ(simd_shuffle_up, int64_t(v.lane) - int64_t(arg))
#undef LX_MSL_SIMD_READ

template <class T> inline T simd_broadcast_first(T value, int line = __builtin_LINE()) {
  auto v = lx_msl::exchange(value, {"simd_broadcast_first", line});
  return v[v.first()];
}
inline bool simd_is_first(int line = __builtin_LINE()) {
  auto v = lx_msl::exchange(0, {"simd_is_first", line});
  return v.first() == v.lane;
}
#define LX_MSL_SIMD_PREFIX(name, start, combine, inclusive)                                \
  template <class T> inline T name(T value, int line = __builtin_LINE()) {                \
    auto v = lx_msl::exchange(value, {#name, line});                                      \
    T acc = T(start);                                                                     \
    for (uint32_t j = 0; j < v.lane + (inclusive); ++j)                                   \
      if (v.has(j)) { T b = v[j]; acc = combine; }                                        \
    return acc;                                                                           \
  }
LX_MSL_SIMD_PREFIX(simd_prefix_inclusive_sum, 0, acc + b, 1)
LX_MSL_SIMD_PREFIX(simd_prefix_exclusive_sum, 0, acc + b, 0)
LX_MSL_SIMD_PREFIX(simd_prefix_inclusive_product, 1, acc * b, 1)
LX_MSL_SIMD_PREFIX(simd_prefix_exclusive_product, 1, acc * b, 0)
#undef LX_MSL_SIMD_PREFIX

// -- atomics --------------------------------------------------------------------------------
// The GPU's layout (the value itself); fibers switch only at barriers and SIMD-group
// functions, so plain reads and writes are atomic here.
enum memory_order { memory_order_relaxed, memory_order_acquire, memory_order_release,
                    memory_order_acq_rel, memory_order_seq_cst };
template <class T> struct atomic { T value; };
using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_bool = atomic<bool>;
using atomic_float = atomic<float>;
using atomic_ulong = atomic<ulong>;

template <class T> inline T& lx_atomic_ref(volatile atomic<T>* a) {
  return const_cast<atomic<T>*>(a)->value;
}
template <class T, class U>
inline void atomic_store_explicit(volatile atomic<T>* a, U v, memory_order) { lx_atomic_ref(a) = T(v); }
template <class T>
inline T atomic_load_explicit(volatile atomic<T>* a, memory_order) { return lx_atomic_ref(a); }
template <class T, class U>
inline T atomic_exchange_explicit(volatile atomic<T>* a, U v, memory_order) {
  T old = lx_atomic_ref(a); lx_atomic_ref(a) = T(v); return old;
}
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* a, T* expected,
                                                  T desired, memory_order, memory_order) {
  T& r = lx_atomic_ref(a);
  if (r == *expected) { r = desired; return true; }
  *expected = r;
  return false;
}
#define LX_MSL_ATOMIC_FETCH(name, expr)                                                   \
  template <class T, class U>                                                             \
  inline T name(volatile atomic<T>* a, U arg, memory_order) {                             \
    T& r = lx_atomic_ref(a);                                                              \
    T old = r, v = T(arg);                                                                \
    r = (expr);                                                                           \
    return old;                                                                           \
  }
LX_MSL_ATOMIC_FETCH(atomic_fetch_add_explicit, T(old + v))
LX_MSL_ATOMIC_FETCH(atomic_fetch_sub_explicit, T(old - v))
LX_MSL_ATOMIC_FETCH(atomic_fetch_and_explicit, T(old & v))
LX_MSL_ATOMIC_FETCH(atomic_fetch_or_explicit, T(old | v))
LX_MSL_ATOMIC_FETCH(atomic_fetch_xor_explicit, T(old ^ v))
LX_MSL_ATOMIC_FETCH(atomic_fetch_min_explicit, T(v < old ? v : old))
LX_MSL_ATOMIC_FETCH(atomic_fetch_max_explicit, T(old < v ? v : old))
#undef LX_MSL_ATOMIC_FETCH

namespace precise { using namespace ::metal; }
namespace fast { using namespace ::metal; }

}  // namespace metal

// Qualifiers last: from here on these words mean nothing to C++. (msl_cpu turns the
// attributes the entry point binds into `[[]]`.)
#define kernel
#define device
#define constant
#define thread
#define host_name(name)
#define threadgroup

#endif  // LAZYX_MSL_SHIM_H
