// lazyx.backends.cpu._native: the cpu backend's native kernels and its NumPy
// allocation handler (memory accounting). The Python side
// (backends/cpu/native_kernels.py) decides when a kernel applies and
// allocates outputs with NumPy, so they are counted like every other buffer.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL lazyx_native_ARRAY_API  // shared with small.cpp
#include <numpy/arrayobject.h>

#include <cstdint>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "allocator.h"
#include "buffer.h"
#include "fpmode.h"
#include "kernels.h"
#include "packs.h"
#include "parallel.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using lazyx::In;
using lazyx::Out;

PyObject* g_handler = nullptr;  // lazyx's "mem_handler" capsule, alive for the process

// The first extension the kernels were compiled for that this CPU lacks, or
// nullptr. A module built on another machine must not run them (SIGILL).
const char* missing_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  for (const char* const* f = lazyx::kernel_isa; *f != nullptr; ++f) {
    const std::string name = *f;
#define LAZYX_CHECK(feature) \
  if (name == feature && !__builtin_cpu_supports(feature)) return *f;
    LAZYX_CHECK("sse4.2") LAZYX_CHECK("avx") LAZYX_CHECK("avx2") LAZYX_CHECK("fma")
    LAZYX_CHECK("bmi2") LAZYX_CHECK("avx512f") LAZYX_CHECK("avx512bw") LAZYX_CHECK("avx512dq")
    LAZYX_CHECK("avx512vl") LAZYX_CHECK("avx512cd") LAZYX_CHECK("avx512vnni")
    LAZYX_CHECK("avx512vbmi") LAZYX_CHECK("avx512bf16")
#undef LAZYX_CHECK
  }
#endif
  return nullptr;
}

size_t checked_limit(int64_t limit, const char* what) {
  if (limit < 0) throw nb::value_error((std::string("[") + what + "] The limit must be >= 0, got " +
                                        std::to_string(limit) + ".").c_str());
  return static_cast<size_t>(limit);
}

// rows of `n` elements in x, with `out_per_row` outputs each in out.
template <class A, class B>
size_t rows_of(const A& x, const B& out, size_t n, size_t out_per_row, const char* name) {
  if (n == 0 || x.size() % n != 0)
    throw nb::value_error((std::string("[") + name + "] Row length " + std::to_string(n) +
                           " does not divide the input size " + std::to_string(x.size()) + ".").c_str());
  const size_t rows = x.size() / n;
  if (out.size() != rows * out_per_row)
    throw nb::value_error((std::string("[") + name + "] The output has " + std::to_string(out.size()) +
                           " elements, expected " + std::to_string(rows * out_per_row) + ".").c_str());
  return rows;
}

template <class T>
void bind_row_kernels(nb::module_& m, const char* suffix, lazyx::Dtype dt) {
  const std::string sm = std::string("softmax_") + suffix, lse = std::string("logsumexp_") + suffix;
  m.def(
      sm.c_str(),
      [dt](In<T> x, Out<T> out, size_t n) {
        const size_t rows = rows_of(x, out, n, n, "softmax");
        nb::gil_scoped_release release;
        lazyx::softmax_rows(dt, x.data(), out.data(), rows, n);
      },
      "x"_a.noconvert(), "out"_a.noconvert(), "n"_a,
      "Softmax of each row of n contiguous elements of x, written to out.");
  m.def(
      lse.c_str(),
      [dt](In<T> x, Out<T> out, size_t n) {
        const size_t rows = rows_of(x, out, n, 1, "logsumexp");
        nb::gil_scoped_release release;
        lazyx::logsumexp_rows(dt, x.data(), out.data(), rows, n);
      },
      "x"_a.noconvert(), "out"_a.noconvert(), "n"_a,
      "log(sum(exp(row))) of each row of n contiguous elements of x, written to out.");
}

}  // namespace

// The module's name: _native, or _native_base for the baseline twin of a portable build
// (backends/cpu/native/CMakeLists.txt); the Python loader picks one for the CPU.
#ifndef LAZYX_MODULE_NAME
#define LAZYX_MODULE_NAME _native
#endif
#ifndef LAZYX_ARCH_NAME
#define LAZYX_ARCH_NAME "baseline"
#endif

NB_MODULE(LAZYX_MODULE_NAME, m) {
  m.doc() = "Native CPU kernels and the memory-accounting allocator of lazyx's cpu backend.";
  if (const char* isa = missing_isa())
    throw nb::import_error((std::string("lazyx's native kernels were compiled for ") + isa +
                            ", which this CPU lacks; reinstall lazyx on this machine to rebuild them.").c_str());
  if (_import_array() < 0) throw nb::python_error();
  g_handler = lazyx::memory::new_handler_capsule();
  if (g_handler == nullptr) throw nb::python_error();

  m.def("version", []() { return 2; });

  // -- the buffer protocol on Python 3.11 --------------------------------------
  m.def(
      "backport_buffer_protocol",
      [](nb::handle cls) {
        if (lazyx::buffer::backport(cls.ptr()) != 0) throw nb::python_error();
      },
      "cls"_a,
      "Give class cls the buffer protocol through its __buffer__ method, as Python 3.12 "
      "(PEP 688) does; for Python 3.11.");

  // -- memory ---------------------------------------------------------------
  m.def(
      "enter_eval",
      []() {
        PyObject* previous = PyDataMem_SetHandler(g_handler);
        if (previous == nullptr) throw nb::python_error();
        lazyx::fp::enter_eval();
        return nb::steal(previous);
      },
      "Install lazyx's allocation handler in the current context and, while the "
      "flush-denormal switch is on, flush subnormals to zero on this thread; returns the "
      "previous handler, to give to exit_eval.");
  m.def(
      "exit_eval",
      [](nb::handle token) {
        PyObject* t = token.is_none() ? nullptr : token.ptr();
        if (t != nullptr && !PyCapsule_IsValid(t, "mem_handler"))
          throw nb::type_error("[exit_eval] The token must be what enter_eval returned.");
        PyObject* previous = PyDataMem_SetHandler(t);
        if (previous == nullptr) throw nb::python_error();
        Py_DECREF(previous);
        // None installs NumPy's handler inside an evaluation (find_kernel): the
        // floating-point mode stays the evaluation's.
        if (t != nullptr) lazyx::fp::exit_eval();
      },
      "token"_a.none(), "Restore the allocation handler (and floating-point mode) enter_eval replaced.");
  m.def(
      "memory_stats",
      []() {
        const auto s = lazyx::memory::stats();
        nb::dict d;
        d["active"] = s.active;
        d["peak"] = s.peak;
        d["cache"] = s.cache;
        return d;
      },
      "{'active', 'peak', 'cache'} in bytes, for buffers lazyx's handler allocated.");
  m.def("reset_peak_memory", &lazyx::memory::reset_peak, "Set the peak to 0, as MLX does.");
  m.def("clear_cache", &lazyx::memory::clear_cache, "Return every cached block to the system.");
  m.def("get_memory_limit", &lazyx::memory::memory_limit);
  m.def("get_cache_limit", &lazyx::memory::cache_limit);
  m.def(
      "set_memory_limit",
      [](int64_t limit) { return lazyx::memory::set_memory_limit(checked_limit(limit, "set_memory_limit")); },
      "limit"_a, "Set the memory limit in bytes; returns the previous one.");
  m.def(
      "set_cache_limit",
      [](int64_t limit) { return lazyx::memory::set_cache_limit(checked_limit(limit, "set_cache_limit")); },
      "limit"_a, "Set the cache limit in bytes; returns the previous one.");

  // -- threads --------------------------------------------------------------
  m.def("get_num_threads", &lazyx::num_threads, "Threads a kernel may use.");
  m.def(
      "set_num_threads",
      [](int n) {
        if (n < 1) throw nb::value_error(("[set_num_threads] n must be >= 1, got " + std::to_string(n) + ".").c_str());
        return lazyx::set_num_threads(n);
      },
      "n"_a, "Set the threads a kernel may use; returns the previous number.");
  m.def("park_threads", &lazyx::park_threads,
        "Helpers spinning for the next kernel sleep now (before a BLAS call: its threads "
        "would share their cores).");
  // The generated kernels' call shim (lazyx/codegen/jit.py) splits their loops over this
  // pool too: one pool of helpers for every kernel, awake between back-to-back kernels.
  m.def(
      "parallel_runner",
      []() { return reinterpret_cast<uintptr_t>(&lazyx::detail::run_parallel); },
      "The address of run_parallel(fn, ctx, n, chunk, threads), the thread pool's C entry.");
  m.def(
      "blas_threads_callback",
      []() { return reinterpret_cast<uintptr_t>(&lazyx::lazyx_blas_threads); },
      "The address of the OpenBLAS threads callback that runs BLAS jobs on this pool "
      "(openblas_set_threads_callback_function).");
  // -- subnormal numbers (fpmode.h) -------------------------------------------
  m.def("set_flush_denormal", &lazyx::fp::set_flush_denormal, "on"_a,
        "Flush subnormal numbers to zero in the kernels of later evaluations (or not); "
        "returns whether this CPU supports it (when not, the switch stays off).");
  m.def("get_flush_denormal", &lazyx::fp::flush_denormal,
        "Whether evaluations flush subnormal numbers to zero.");
  m.def(
      "call_in_fp_mode",
      [](uintptr_t fn, bool flush) {
        // Threads inherit their creator's register: a library's thread-starting
        // function run here gives its new threads this mode (backends/cpu/blas_threads.py).
        const uint64_t saved = lazyx::fp::control();
        const uint64_t bits = lazyx::fp::kFlushBits;
        lazyx::fp::set_control(flush ? (saved | bits) : (saved & ~bits));
        const int rc = reinterpret_cast<int (*)()>(fn)();
        lazyx::fp::set_control(saved);
        return rc;
      },
      "fn"_a, "flush"_a,
      "Call the C function int fn(void) at address fn with subnormal flushing on or off "
      "on this thread; returns its result.");
  m.def(
      "fp_control", []() { return lazyx::fp::control(); },
      "The calling thread's floating-point control register (MXCSR, FPCR), for tests.");
  m.def(
      "parallel_fp_controls",
      [](size_t items) {
        // Each item of a parallel loop (about 20 us of work, so that helpers join in)
        // records the register of the thread that ran it and whether that was the caller.
        std::vector<uint64_t> seen(items);
        std::vector<char> by_caller(items);
        {
          nb::gil_scoped_release release;
          const auto caller = std::this_thread::get_id();
          lazyx::parallel_for(items, lazyx::kMinWorkPerThread, [&](size_t b, size_t e) {
            const uint64_t c = lazyx::fp::control();
            const bool mine = std::this_thread::get_id() == caller;
            for (size_t i = b; i < e; ++i) {
              const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
              while (std::chrono::steady_clock::now() < until) {}
              seen[i] = c;
              by_caller[i] = mine;
            }
          });
        }
        nb::list out;
        for (size_t i = 0; i < items; ++i) out.append(nb::make_tuple(seen[i], bool(by_caller[i])));
        return out;
      },
      "items"_a,
      "(control register, ran on the calling thread) of each item of a parallel loop, for tests.");
  m.def("build_info", []() {
    nb::dict d;
#if defined(LAZYX_MARCH_NATIVE)
    d["march_native"] = true;
#else
    d["march_native"] = false;
#endif
    nb::list isa;
    for (const char* const* f = lazyx::kernel_isa; *f != nullptr; ++f) isa.append(*f);
    d["isa"] = isa;
    std::string simd = "sse2";
    for (const char* const* f = lazyx::kernel_isa; *f != nullptr; ++f) {
      if (std::string(*f) == "avx2") simd = "avx2";
      if (std::string(*f) == "avx512f") { simd = "avx512"; break; }
    }
    d["simd"] = simd;
    d["arch"] = LAZYX_ARCH_NAME;  // "native", "x86-64-v3" or "baseline"
    return d;
  });

  // -- kernels --------------------------------------------------------------
  bind_row_kernels<float>(m, "float32", lazyx::Dtype::float32);
  // float16 and bfloat16 arrive as uint16 views of their bits.
  bind_row_kernels<uint16_t>(m, "float16", lazyx::Dtype::float16);
  bind_row_kernels<uint16_t>(m, "bfloat16", lazyx::Dtype::bfloat16);
  // Names and docstrings as literals: nanobind keeps the pointers. Each op reduces rows
  // (`<op>_float32`: one result per row of n contiguous elements) or columns
  // (`<op>_columns_float32`: over the rows of x (rows, cols), one result per column).
  struct Reduction { const char *rows_fn, *columns_fn, *name, *rows_doc, *columns_doc; lazyx::ReduceOp op; };
  for (const Reduction& r :
       {Reduction{"sum_float32", "sum_columns_float32", "sum",
                  "Sum of each row of n contiguous float32 elements of x, written to out.",
                  "Sum over the rows of x, float32 of shape (rows, cols): one result per column, written "
                  "to out (cols elements).", lazyx::ReduceOp::sum},
        Reduction{"max_float32", "max_columns_float32", "max",
                  "Max of each row of n contiguous float32 elements of x (NaN if it holds one), written to out.",
                  "Max over the rows of x (rows, cols), per column (NaN where one holds one), written to out.",
                  lazyx::ReduceOp::max},
        Reduction{"min_float32", "min_columns_float32", "min",
                  "Min of each row of n contiguous float32 elements of x (NaN if it holds one), written to out.",
                  "Min over the rows of x (rows, cols), per column (NaN where one holds one), written to out.",
                  lazyx::ReduceOp::min}}) {
    m.def(
        r.rows_fn,
        [name = r.name, op = r.op](In<float> x, Out<float> out, size_t n) {
          const size_t rows = rows_of(x, out, n, 1, name);
          nb::gil_scoped_release release;
          lazyx::reduce_rows_f32(op, x.data(), out.data(), rows, n);
        },
        "x"_a.noconvert(), "out"_a.noconvert(), "n"_a, r.rows_doc);
    m.def(
        r.columns_fn,
        [name = r.name, op = r.op](In<float> x, Out<float> out, size_t cols) {
          if (cols == 0 || x.size() % cols != 0 || out.size() != cols)
            throw nb::value_error((std::string("[") + name + "] " + std::to_string(x.size()) +
                                   " input elements and " + std::to_string(out.size()) +
                                   " outputs are not rows of " + std::to_string(cols) + " columns.")
                                      .c_str());
          nb::gil_scoped_release release;
          lazyx::reduce_columns_f32(op, x.data(), out.data(), x.size() / cols, cols);
        },
        "x"_a.noconvert(), "out"_a.noconvert(), "cols"_a, r.columns_doc);
  }

  m.def(
      "skinny_matmul_float32",
      [](nb::ndarray<const float, nb::ndim<2>, nb::device::cpu> a, nb::ndarray<const float, nb::ndim<2>, nb::device::cpu> b,
         nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> out) {
        const size_t M = a.shape(0), K = a.shape(1), N = b.shape(1);
        if (b.shape(0) != K || out.shape(0) != M || out.shape(1) != N)
          throw nb::value_error(("[skinny_matmul] Shapes (" + std::to_string(M) + ", " + std::to_string(K) +
                                 ") @ (" + std::to_string(b.shape(0)) + ", " + std::to_string(N) + ") -> (" +
                                 std::to_string(out.shape(0)) + ", " + std::to_string(out.shape(1)) +
                                 ") do not match.")
                                    .c_str());
        nb::gil_scoped_release release;
        return lazyx::skinny_matmul_f32(a.data(), a.stride(0), a.stride(1), b.data(), b.stride(0), b.stride(1),
                                        out.data(), M, N, K);
      },
      "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(),
      "out = a @ b for float32 matrices with a side of at most 16 (strided a and b); False "
      "(out untouched) when the layout suits none of the skinny loops.");

  // -- the op packs' kernels (packs.h) ----------------------------------------
  lazyx::bind_conv(m);
  lazyx::bind_fast(m);
  lazyx::bind_quantized(m);
  lazyx::bind_matmuls(m);
  lazyx::bind_small(m);
}
