"""The Metal backend's kernel mechanism: ``MetalKernel``, and MSL run on the CPU through
lazyx's C++ shim (``run_msl_on_cpu``), which is how Metal kernels are checked without Metal."""

import sys

import ml_dtypes
import numpy as np
import pytest

import lazyx
import lazyx.core as mx
from lazyx import hookimpl
from lazyx.backend import backends, kernel_provider
from lazyx.backends import metal
from lazyx.backends.metal import MetalKernel, MSLShimError, run_msl_on_cpu
from lazyx.backends.metal.msl_cpu import dispatch_on_cpu
from lazyx.codegen import jit
from lazyx.errors import ArgumentError, BackendError, DtypeError
from lazyx.testing import isolated_registry

from helpers import random_array, rng


@pytest.fixture
def compiler():
    if not jit.available():
        pytest.skip(f"no C++ compiler for the MSL shim: {jit.missing_compiler_message()}")


SCALE = """
#include <metal_stdlib>
using namespace metal;

// A plain kernel, named by itself, with MSL's other spelling of the qualifier.
kernel void scale_float32(device const float* x [[buffer(0)]],
                          device float* out [[buffer(1)]],
                          constant float& factor [[buffer(2)]],
                          uint i [[thread_position_in_grid]]) {
  out[i] = factor * x[i];
}
"""


def scale_kernel(source=SCALE, **options):
    return MetalKernel(source, "scale_{dtype}", inputs=("x",), constants={"factor": "float"},
                       buffers=("x", "out", "factor"), **options)


def test_a_tiny_kernel_runs_on_the_cpu(compiler):
    x = random_array((3, 5), mx.float32, rng(0))
    got = run_msl_on_cpu(scale_kernel(), [x], (3, 5), mx.float32, factor=-2.5)
    assert got.dtype == np.float32 and got.shape == (3, 5)
    np.testing.assert_array_equal(got, np.float32(-2.5) * x)
    assert run_msl_on_cpu(scale_kernel(), [x[:0]], (0, 5), mx.float32, factor=1.0).shape == (0, 5)


def test_the_library_is_built_once(compiler):
    kernel, x = scale_kernel(), np.ones(4, np.float32)
    run_msl_on_cpu(kernel, [x], (4,), mx.float32, factor=1.0)
    before = dict(jit.stats)
    run_msl_on_cpu(scale_kernel(), [x], (4,), mx.float32, factor=3.0)
    assert jit.stats == before


QUALIFIERS = """
#include <metal_stdlib>
using namespace metal;

constant float offset = 0.25f;                       // program-scope constant

static inline float twice(thread const float& v) { return 2.0f * v; }

template <typename T>
[[kernel]] void mixed(device const T* x [[buffer(0)]],
                      device const T* y [[buffer(1)]],
                      device T* out [[buffer(2)]],
                      constant uint& count [[buffer(3)]],
                      uint3 pos [[thread_position_in_grid]],
                      uint grid [[threads_per_grid]]) {
  thread float acc = twice(static_cast<float>(x[pos.x]));
  acc += metal::exp(static_cast<float>(y[pos.x])) - precise::sqrt(4.0f);
  acc = clamp(acc, -8.0f, 8.0f) + offset;
  acc = select(acc, acc + float(count), count > 5u) + float(grid) * 0.0f;
  out[pos.x] = static_cast<T>(max(acc, min(acc, 1.0f)));
}

template [[host_name("mixed_float32")]] [[kernel]] decltype(mixed<float>) mixed<float>;
template [[host_name("mixed_float16")]] [[kernel]] decltype(mixed<half>) mixed<half>;
template [[host_name("mixed_bfloat16")]] [[kernel]] decltype(mixed<bfloat>) mixed<bfloat>;
"""


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("count", [3, 7])
def test_qualifiers_attributes_and_math(compiler, dtype, count):
    kernel = MetalKernel(QUALIFIERS, "mixed_{dtype}", inputs=("x", "y"),
                         constants={"count": "uint"}, buffers=("x", "y", "out", "count"))
    gen = rng(1)
    x, y = random_array((7,), dtype, gen, -2, 2), random_array((7,), dtype, gen, -2, 2)
    got = run_msl_on_cpu(kernel, [x, y], (7,), dtype, count=count)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    acc = np.clip(2 * xf + np.exp(yf) - 2, -8, 8) + np.float32(0.25) + (count if count > 5 else 0)
    assert got.dtype == dtype.np
    np.testing.assert_allclose(got.astype(np.float32), acc.astype(dtype.np).astype(np.float32),
                               rtol=1e-6 if dtype == mx.float32 else 1e-2)


CONVERT = """
#include <metal_stdlib>
using namespace metal;

template <typename From, typename To>
[[kernel]] void convert(device const From* x [[buffer(0)]], device To* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<To>(x[i]);
}

template <typename T>
[[kernel]] void arithmetic(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                           device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  T product = x[i] * y[i];               // rounded to T, as the GPU does
  out[i] = product + y[i] - T(1) / x[i];
}

template [[host_name("to_half")]] [[kernel]] decltype(convert<float, half>) convert<float, half>;
template [[host_name("to_bfloat")]] [[kernel]] decltype(convert<float, bfloat>) convert<float, bfloat>;
template [[host_name("from_half")]] [[kernel]] decltype(convert<half, float>) convert<half, float>;
template [[host_name("from_bfloat")]] [[kernel]] decltype(convert<bfloat, float>) convert<bfloat, float>;
template [[host_name("arithmetic_float16")]] [[kernel]] decltype(arithmetic<half>) arithmetic<half>;
template [[host_name("arithmetic_bfloat16")]] [[kernel]] decltype(arithmetic<bfloat>) arithmetic<bfloat>;
"""

_HALVES = {"half": np.dtype(np.float16), "bfloat": np.dtype(ml_dtypes.bfloat16)}


def _special_floats():
    """Values where rounding to 16 bits is delicate: ties, overflow, subnormals, NaN."""
    f16, bf16 = np.finfo(np.float16), ml_dtypes.finfo(ml_dtypes.bfloat16)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 1e6, -1e6,
             float(f16.tiny), float(f16.tiny) / 3, float(f16.smallest_subnormal) / 2,
             float(f16.smallest_subnormal) * 0.51, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
             float(bf16.max) * 1.01, float(bf16.tiny) / 5, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
             3.4e38, 1e-40, -1e-45]
    random = rng(2).standard_normal(2000) * np.exp(rng(3).uniform(-30, 30, 2000))
    with np.errstate(over="ignore"):
        return np.array(edges + list(random), np.float32)


@pytest.mark.parametrize("msl", ["half", "bfloat"])
def test_sixteen_bit_floats_round_as_numpy_does(compiler, msl):
    npd = _HALVES[msl]
    kernel = MetalKernel(CONVERT, lambda dtype, layout: f"to_{msl}", inputs=("x",),
                         buffers=("x", "out"))
    x = _special_floats()
    got = run_msl_on_cpu(kernel, [x], x.shape, npd)
    with np.errstate(over="ignore"):
        expected = x.astype(npd)
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(x)],
                                  expected.view(np.uint16)[~np.isnan(x)])
    assert np.isnan(got[np.isnan(x)].astype(np.float32)).all()

    bits = np.arange(2 ** 16, dtype=np.uint16).view(npd)        # every 16-bit pattern
    back = MetalKernel(CONVERT, lambda dtype, layout: f"from_{msl}", inputs=("x",),
                       buffers=("x", "out"))
    widened = run_msl_on_cpu(back, [bits], bits.shape, mx.float32)
    expected = bits.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(widened), np.isnan(expected))
    keep = ~np.isnan(expected)
    np.testing.assert_array_equal(widened.view(np.uint32)[keep], expected.view(np.uint32)[keep])


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_sixteen_bit_arithmetic_rounds_each_operation(compiler, dtype):
    kernel = MetalKernel(CONVERT, "arithmetic_{dtype}", inputs=("x", "y"), buffers=("x", "y", "out"))
    gen = rng(4)
    x, y = random_array((50,), dtype, gen, 0.5, 3), random_array((50,), dtype, gen, -3, 3)
    got = run_msl_on_cpu(kernel, [x, y], (50,), dtype)
    f = np.float32
    product = (x.astype(f) * y.astype(f)).astype(dtype.np)
    total = (product.astype(f) + y.astype(f)).astype(dtype.np)
    inverse = (f(1) / x.astype(f)).astype(dtype.np)
    expected = (total.astype(f) - inverse.astype(f)).astype(dtype.np)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


# -- errors ----------------------------------------------------------------------------
def test_a_compile_error_names_the_source_and_shows_the_compiler(compiler, tmp_path):
    path = tmp_path / "broken.metal"
    path.write_text(SCALE.replace("factor * x[i]", "factor * undeclared_thing[i]"))
    kernel = MetalKernel.from_file(path, "scale_{dtype}", inputs=("x",),
                                   constants={"factor": "float"}, buffers=("x", "out", "factor"))
    with pytest.raises(MSLShimError) as info:
        run_msl_on_cpu(kernel, [np.ones(2, np.float32)], (2,), mx.float32, factor=1.0)
    message = str(info.value)
    assert str(path) in message and "undeclared_thing" in message
    assert f"{path}:10:" in message         # the .metal file's own line numbers
    assert "scale_float32" in message


def test_a_missing_function_is_named(compiler):
    kernel = MetalKernel(SCALE, "scale_{dtype}", inputs=("x",), constants={"factor": "float"},
                         buffers=("x", "out", "factor"))
    with pytest.raises(MSLShimError, match="no kernel function 'scale_float16'"):
        run_msl_on_cpu(kernel, [np.ones(2, np.float16)], (2,), mx.float16, factor=1.0)


@pytest.mark.parametrize("feature, named", [
    ("texture2d<float> t [[texture(0)]], ", r"cannot emulate textures and samplers \(`texture2d<`, line 9\)"),
    ("uint s [[sample_id]], ", r"has \[\[sample_id\]\]; the CPU shim binds \[\[buffer\(n\)\]\]"),
    ("device float4* v [[buffer(3)]], ", "vector types"),
    ("device simdgroup_float8x8* m [[buffer(3)]], ", "SIMD-group matrices"),
])
def test_features_the_shim_cannot_run_are_refused_by_name(compiler, feature, named):
    source = SCALE.replace("uint i [[thread_position_in_grid]]",
                           feature + "uint i [[thread_position_in_grid]]")
    with pytest.raises(MSLShimError, match=named):
        run_msl_on_cpu(scale_kernel(source), [np.ones(2, np.float32)], (2,), mx.float32, factor=1.0)


def test_a_missing_buffer_is_named(compiler):
    with pytest.raises(MSLShimError, match="reads buffer 2, but only 2 are bound"):
        kernel = MetalKernel(SCALE, "scale_{dtype}", inputs=("x",), buffers=("x", "out"))
        run_msl_on_cpu(kernel, [np.ones(2, np.float32)], (2,), mx.float32)


# -- threads that cooperate --------------------------------------------------------------
COOPERATE = """
#include <metal_stdlib>
using namespace metal;

// Each threadgroup reverses its slice through threadgroup memory: a thread reads what
// another wrote, so it is right only if the barrier holds every thread until all wrote.
template <bool Barrier>
[[kernel]] void reverse(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]],
                        uint lid [[thread_position_in_threadgroup]],
                        uint n [[threads_per_threadgroup]]) {
  threadgroup float shared[1024];
  shared[lid] = x[i];
  if (Barrier) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = shared[n - 1 - lid];
}
template [[host_name("reverse")]] [[kernel]] decltype(reverse<true>) reverse<true>;
template [[host_name("reverse_racy")]] [[kernel]] decltype(reverse<false>) reverse<false>;

// Every SIMD-group function at once; threadgroups of 40 threads leave a simdgroup of 8.
kernel void lanes(device const int* x [[buffer(0)]], device int* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]],
                  uint lane [[thread_index_in_simdgroup]],
                  uint sg [[simdgroup_index_in_threadgroup]],
                  uint group [[threadgroup_position_in_grid]]) {
  int v = x[i];
  device int* o = out + 16 * i;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_min(v);
  o[3] = simd_prod(v % 3 == 0 ? 2 : 1);     // no overflow for this x
  o[4] = simd_shuffle_xor(v, 5u);
  o[5] = simd_shuffle_down(v, 3u);
  o[6] = simd_broadcast(v, 2u);
  o[7] = simd_prefix_exclusive_sum(v);
  o[8] = simd_prefix_inclusive_sum(v);
  o[9] = simd_shuffle_up(v, 1u);
  o[10] = simd_any(v == 7) ? 1 : 0;
  o[11] = simd_all(v >= 0) ? 1 : 0;
  o[12] = int(lane);
  o[13] = int(sg);
  o[14] = int(group);
  o[15] = simd_broadcast_first(v);
}

// Atomics: a histogram, a float total and a maximum over the whole grid.
kernel void histogram(device const uint* x [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                      device atomic_float* total [[buffer(2)]], device atomic_int* top [[buffer(3)]],
                      uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(&bins[x[i] % 7], 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(total, 0.5f * float(x[i]), memory_order_relaxed);
  atomic_fetch_max_explicit(top, int(x[i]), memory_order_relaxed);
}

// A threadgroup-local counter in threadgroup memory: a thread counts its group's threads.
kernel void count_group(device uint* out [[buffer(0)]], threadgroup atomic_uint* scratch [[threadgroup(0)]],
                        uint i [[thread_position_in_grid]], uint lid [[thread_index_in_threadgroup]]) {
  if (lid == 0) atomic_store_explicit(scratch, 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(scratch, 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = atomic_load_explicit(scratch, memory_order_relaxed);
}

// Every position attribute of a 2-d grid whose edge threadgroups are clipped.
kernel void positions(device uint* out [[buffer(0)]],
                      uint3 pos [[thread_position_in_grid]], uint2 grid [[threads_per_grid]],
                      uint3 group [[threadgroup_position_in_grid]],
                      uint3 local [[thread_position_in_threadgroup]],
                      uint3 size [[threads_per_threadgroup]],
                      uint3 asked [[dispatch_threads_per_threadgroup]],
                      uint3 groups [[threadgroups_per_grid]],
                      uint flat [[thread_index_in_threadgroup]],
                      uint simds [[simdgroups_per_threadgroup]]) {
  device uint* o = out + 16 * (pos.y * grid.x + pos.x);
  uint v[16] = {pos.x, pos.y, group.x, group.y, local.x, local.y, size.x, size.y,
                asked.x, asked.y, groups.x, groups.y, flat, simds, grid.x, grid.y};
  for (int k = 0; k < 16; ++k) o[k] = v[k];
}

// Threads that do not synchronise together: the shim reports where each one waits.
kernel void divergent(device float* out [[buffer(0)]], uint lid [[thread_index_in_threadgroup]],
                      constant int& how [[buffer(1)]]) {
  float v = float(lid);
  if (how == 0) {
    if (lid < 5) threadgroup_barrier(mem_flags::mem_threadgroup);
    else threadgroup_barrier(mem_flags::mem_device);
  } else if (how == 1) {
    v = lid < 16 ? simd_sum(v) : simd_max(v);
  } else {
    if (lid < 16) v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[lid] = v;
}
"""


class _Source:
    """What the shim needs of a kernel: its source and how messages name it."""

    def __init__(self, source, label):
        self.source, self.filename, self.label = source, None, label


COOP = _Source(COOPERATE, "the shim's cooperation test kernels")


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
def test_a_barrier_holds_every_thread_of_a_threadgroup(compiler, schedule):
    x = rng(6).standard_normal(300).astype(np.float32)
    out = np.empty_like(x)
    # 300 threads in threadgroups of 128: the last one is clipped to 44 threads.
    dispatch_on_cpu(COOP, "reverse", [x, out], 300, 128, schedule=schedule)
    expected = np.concatenate([x[:128][::-1], x[128:256][::-1], x[256:][::-1]])
    np.testing.assert_array_equal(out, expected)
    # Without the barrier the same kernel reads slots not yet written (or already
    # overwritten): the test above would catch a barrier that does not hold.
    racy = np.empty_like(x)
    dispatch_on_cpu(COOP, "reverse_racy", [x, racy], 300, 128, schedule=schedule)
    assert not np.array_equal(racy, expected)


def _read_lanes(v, src):
    """Lane ``src`` of ``v`` per lane, or the lane's own value outside the simdgroup."""
    return np.where((src >= 0) & (src < v.size), v[np.clip(src, 0, v.size - 1)], v)


def test_simd_group_functions(compiler):
    x = rng(7).integers(0, 9, 80).astype(np.int32)
    out = np.zeros((80, 16), np.int32)
    dispatch_on_cpu(COOP, "lanes", [x, out], 80, 40)       # simdgroups of 32, 8, 32, 8 lanes
    for start, size, group, sg in [(0, 32, 0, 0), (32, 8, 0, 1), (40, 32, 1, 0), (72, 8, 1, 1)]:
        v, o = x[start:start + size].astype(np.int64), out[start:start + size]
        lane = np.arange(size)
        expected = np.stack([
            np.full(size, v.sum()), np.full(size, v.max()), np.full(size, v.min()),
            np.full(size, np.prod(np.where(v % 3 == 0, 2, 1))), _read_lanes(v, lane ^ 5), _read_lanes(v, lane + 3),
            np.full(size, v[2] if size > 2 else 0), np.cumsum(v) - v, np.cumsum(v), _read_lanes(v, lane - 1),
            np.full(size, int((v == 7).any())), np.full(size, 1), lane, np.full(size, sg),
            np.full(size, group), np.full(size, v[0])], axis=1)
        np.testing.assert_array_equal(o, expected, err_msg=f"simdgroup at thread {start}")


def test_atomics(compiler):
    x = rng(8).integers(0, 100, 1000).astype(np.uint32)
    bins, total, top = np.zeros(7, np.uint32), np.zeros(1, np.float32), np.full(1, -1, np.int32)
    dispatch_on_cpu(COOP, "histogram", [x, bins, total, top], 1000, 64)
    np.testing.assert_array_equal(bins, np.bincount(x % 7, minlength=7))
    assert total[0] == np.float32(0.5 * x.sum()) and top[0] == x.max()
    counts = np.zeros(100, np.uint32)
    dispatch_on_cpu(COOP, "count_group", [counts], 100, 32, threadgroup_memory=[4])
    np.testing.assert_array_equal(counts, [32] * 96 + [4] * 4)
    with pytest.raises(MSLShimError, match=r"threadgroup memory \[\[threadgroup\(0\)\]\]"):
        dispatch_on_cpu(COOP, "count_group", [counts], 100, 32)


def test_thread_positions_of_a_clipped_two_dimensional_grid(compiler):
    gx, gy, tx, ty = 11, 5, 4, 3
    out = np.zeros((gy, gx, 16), np.uint32)
    dispatch_on_cpu(COOP, "positions", [out], (gx, gy), (tx, ty))
    for y in range(gy):
        for x in range(gx):
            size = (min(tx, gx - x // tx * tx), min(ty, gy - y // ty * ty))
            local = (x % tx, y % ty)
            expected = [x, y, x // tx, y // ty, *local, *size, tx, ty, -(-gx // tx), -(-gy // ty),
                        local[1] * size[0] + local[0], -(-size[0] * size[1] // 32), gx, gy]
            assert out[y, x].tolist() == expected, (x, y)


@pytest.mark.parametrize("how, message", [
    (0, (r"thread 0 waits at threadgroup_barrier \(line \d+\) while thread 5 waits at "
         r"threadgroup_barrier \(line \d+\); every thread .* same barrier")),
    (1, r"lane \d+ is at simd_\w+ \(line \d+\) while lane \d+ is at simd_\w+ .*uniform control flow"),
    (2, r"deadlock: thread 16 waits at threadgroup_barrier .* thread 0 .* waits at simd_sum"),
])
def test_threads_that_do_not_synchronise_together_are_reported(compiler, how, message):
    out = np.zeros(32, np.float32)
    with pytest.raises(MSLShimError, match="kernel function 'divergent'.*" + message):
        dispatch_on_cpu(COOP, "divergent", [out, np.array([how], np.int32)], 32, 32)


def test_bad_launches_are_argument_errors(compiler):
    out = np.zeros(32, np.float32)
    with pytest.raises(ArgumentError, match=r"threadgroup of \(2048, 1, 1\).*1 to 1024"):
        dispatch_on_cpu(COOP, "reverse", [out, out], 4096, 2048)
    with pytest.raises(ArgumentError, match="schedule 'random'"):
        dispatch_on_cpu(COOP, "reverse", [out, out], 32, 32, schedule="random")
    with pytest.raises(ArgumentError, match=r"grid \(1, 2, 3, 4\)"):
        dispatch_on_cpu(COOP, "reverse", [out, out], (1, 2, 3, 4))


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "lazyx-no-such-compiler")
    kernel = scale_kernel(SCALE + "// a source no test has built\n")
    with pytest.raises(MSLShimError, match="needs a C\\+\\+ compiler.*lazyx-no-such-compiler"):
        run_msl_on_cpu(kernel, [np.ones(2, np.float32)], (2,), mx.float32, factor=1.0)


def test_bad_bindings_are_argument_and_dtype_errors():
    with pytest.raises(ArgumentError, match="unknown buffer name.*'z'"):
        MetalKernel(SCALE, "k", inputs=("x",), buffers=("x", "out", "z"))
    with pytest.raises(ArgumentError, match="unknown MSL scalar type 'double'"):
        MetalKernel(SCALE, "k", inputs=("x",), constants={"factor": "double"})
    kernel = scale_kernel(dtypes=(mx.float32,))
    x = np.ones(2, np.float32)
    with pytest.raises(ArgumentError, match="missing constant.*factor"):
        run_msl_on_cpu(kernel, [x], (2,), mx.float32)
    with pytest.raises(ArgumentError, match="unknown constant.*bias"):
        run_msl_on_cpu(kernel, [x], (2,), mx.float32, factor=1.0, bias=2.0)
    with pytest.raises(ArgumentError, match="takes 1 inputs"):
        run_msl_on_cpu(kernel, [x, x], (2,), mx.float32, factor=1.0)
    with pytest.raises(ArgumentError, match=r"shape \(3,\) does not broadcast to.*\(2,\)"):
        run_msl_on_cpu(kernel, [np.ones(3, np.float32)], (2,), mx.float32, factor=1.0)
    with pytest.raises(DtypeError, match="no kernel for dtype float64; it supports float32"):
        run_msl_on_cpu(kernel, [x.astype(np.float64)], (2,), mx.float64, factor=1.0)


# -- the binding the GPU gets ----------------------------------------------------------
def test_layouts_and_strides():
    from lazyx.backends.metal.kernel import plan_launch
    kernel = MetalKernel("", "k_{layout}_{type}", inputs=("a", "b"))
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    launch = plan_launch(kernel, [base, base + 1], (4, 6), mx.float32, {})
    assert launch.function == "k_contiguous_float" and launch.grid == 24
    launch = plan_launch(kernel, [base.T, base[0, :4]], (6, 4), mx.float32, {})
    assert launch.function == "k_general_float"
    named = dict(zip(kernel.buffers, launch.buffers))
    assert named["shape"].tolist() == [6, 4] and named["ndim"].tolist() == [2]
    assert named["a_strides"].tolist() == [1, 6] and named["b_strides"].tolist() == [0, 1]
    reversed_view = plan_launch(kernel, [base[::-1], base], (4, 6), mx.float32, {})
    named = dict(zip(kernel.buffers, reversed_view.buffers))
    assert all(s >= 0 for s in named["a"].strides)      # copied: kernels index forwards


# -- the backend -------------------------------------------------------------------------
def test_off_a_mac_the_backend_says_why_and_kernels_refuse_to_run():
    b = backends()["metal"]
    if sys.platform == "darwin":
        pytest.skip("on macOS the backend's availability depends on the machine")
    assert not b.is_available() and "macOS" in b.unavailable_reason()
    assert not metal.is_available()
    with pytest.raises(BackendError, match="Cannot run .* on Metal: Metal needs macOS"):
        scale_kernel()(None, [np.ones(2, np.float32)])


def test_on_a_mac_without_pyobjc_it_says_what_to_install(monkeypatch):
    from lazyx.backends.metal import runtime
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    monkeypatch.setattr(runtime.platform, "machine", lambda: "arm64")
    monkeypatch.setitem(sys.modules, "Metal", None)      # import Metal fails
    ok, reason = runtime.availability()
    assert not ok and "pip install pyobjc-framework-Metal" in reason
    monkeypatch.setattr(runtime.platform, "machine", lambda: "x86_64")
    assert "Apple silicon" in runtime.availability()[1]


def test_a_plugin_registers_a_metal_kernel_for_its_primitive(compiler):
    @mx.custom_primitive(elementwise=True)
    def scaled(x, *, factor=1.0):
        return factor * x

    kernel = scale_kernel()

    class Plugin:
        @hookimpl
        def lazyx_kernels(self):
            return [("metal", scaled.primitive, kernel)]

    with isolated_registry():
        lazyx.registry.register_plugin(Plugin(), "scaled-metal", "lazyx-scaled-metal", "0.1")
        assert "lazyx-scaled-metal" in kernel_provider("metal", scaled.primitive)
        from lazyx.backend import resolve_kernel
        assert resolve_kernel(backends()["metal"], scaled.primitive)[0] is kernel
    # What the Metal backend would run for a node, on the CPU: constants from the primitive.
    x = random_array((2, 3), mx.float32, rng(5))
    prim = scaled.primitive(mx.default_stream(mx.cpu), factor=1.5)
    np.testing.assert_array_equal(kernel.run_on_cpu(prim, [x]), np.float32(1.5) * x)
