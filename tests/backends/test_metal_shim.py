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


def test_features_the_shim_cannot_run_are_refused_by_name(compiler):
    source = SCALE.replace("uint i [[thread_position_in_grid]]",
                           "uint i [[thread_position_in_grid]], uint g [[threadgroup_position_in_grid]]")
    with pytest.raises(MSLShimError, match=r"\[\[threadgroup_position_in_grid\]\].*one thread at a time"):
        run_msl_on_cpu(scale_kernel(source), [np.ones(2, np.float32)], (2,), mx.float32, factor=1.0)
    with pytest.raises(MSLShimError, match="reads buffer 2, but only 2 are bound"):
        kernel = MetalKernel(SCALE, "scale_{dtype}", inputs=("x",), buffers=("x", "out"))
        run_msl_on_cpu(kernel, [np.ones(2, np.float32)], (2,), mx.float32)


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
