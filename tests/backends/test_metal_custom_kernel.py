"""``fast.metal_kernel`` on the Metal backend (backends/metal/kernels/custom.py): a user's
MSL kernel launched as MLX launches it, with the backend emulated on the CPU (the MSL runs
through lazyx's C++ shim, the launch planning and binding are the GPU's).

MLX's documented examples (an element-wise exp with a template type, the strided version
through ``elem_to_loc`` and the ``_shape``/``_strides``/``_ndim`` helpers), several
outputs, an ``init_value`` with atomic outputs (a histogram), a 0-d input, and the
refusals: a CUDA kernel's node on a Metal stream, a kernel with a compile error.
"""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import rng
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import KernelNotFoundError, LazyxError
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

F64 = np.float64


def _gpu(x, dtype=mx.float32):
    return mx.array(np.asarray(x), dtype)


def test_mlx_exp_example_with_a_template_type(on_metal):
    source = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """
    kernel = mx.fast.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                                  source=source)
    x = rng(1).standard_normal((4, 16)).astype(np.float32)
    for dtype, rtol in ((mx.float32, 2e-6), (mx.float16, 2e-3)):
        a = _gpu(x, dtype)
        (out,) = kernel(inputs=[a], template=[("T", dtype)], grid=(a.size, 1, 1),
                        threadgroup=(32, 1, 1), output_shapes=[a.shape], output_dtypes=[dtype],
                        stream=mx.gpu)
        want = np.exp(np.asarray(a).astype(F64))
        assert out.dtype == dtype and out.shape == a.shape
        np.testing.assert_allclose(np.asarray(out).astype(F64), want, rtol=rtol)
    assert on_metal["builtin"] == 2 and on_metal["cpu_fallback"] == 0


def test_strided_input_through_elem_to_loc(on_metal):
    # ensure_row_contiguous=False: the transposed view is bound as it is and indexed
    # through its shape and strides (MLX's second documented example).
    source = """
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        out[elem] = metal::exp(tmp);
    """
    kernel = mx.fast.metal_kernel(name="myexp_strided", input_names=["inp"],
                                  output_names=["out"], source=source,
                                  ensure_row_contiguous=False)
    x = rng(2).standard_normal((6, 5)).astype(np.float32)
    with mx.stream(mx.gpu):
        a = mx.transpose(_gpu(x) * 1.0)            # a strided view of a GPU result
        (out,) = kernel(inputs=[a], template=[("T", mx.float32)], grid=(a.size, 1, 1),
                        threadgroup=(16, 1, 1), output_shapes=[a.shape],
                        output_dtypes=[mx.float32])
    np.testing.assert_allclose(np.asarray(out), np.exp(x.T.astype(F64)), rtol=2e-6)


def test_several_outputs_a_scalar_input_and_a_2d_grid(on_metal):
    source = """
        uint i = thread_position_in_grid.y * cols + thread_position_in_grid.x;
        plus[i] = a[i] + s;
        times[i] = a[i] * s;
    """
    kernel = mx.fast.metal_kernel(name="two", input_names=["a", "s"],
                                  output_names=["plus", "times"], source=source)
    x = rng(3).standard_normal((3, 7)).astype(np.float32)
    plus, times = kernel(inputs=[_gpu(x), mx.array(2.5)], template=[("cols", 7)],
                         grid=(7, 3, 1), threadgroup=(8, 2, 1), output_shapes=[(3, 7), (3, 7)],
                         output_dtypes=[mx.float32, mx.float32], stream=mx.gpu)
    np.testing.assert_allclose(np.asarray(plus), x + 2.5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(times), x * 2.5, rtol=1e-6)


def test_atomic_outputs_start_from_init_value(on_metal):
    source = """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&counts[bins[i]], 1.0f, memory_order_relaxed);
    """
    kernel = mx.fast.metal_kernel(name="hist", input_names=["bins"], output_names=["counts"],
                                  source=source, atomic_outputs=True)
    bins = rng(4).integers(0, 5, 200).astype(np.int32)
    (counts,) = kernel(inputs=[mx.array(bins)], grid=(200, 1, 1), threadgroup=(64, 1, 1),
                       output_shapes=[(5,)], output_dtypes=[mx.float32], init_value=10.0,
                       stream=mx.gpu)
    np.testing.assert_array_equal(np.asarray(counts), np.bincount(bins, minlength=5) + 10.0)


def test_a_cuda_kernel_node_and_a_compile_error_are_refused(on_metal):
    cuda = mx.fast.cuda_kernel(name="c", input_names=["x"], output_names=["y"],
                               source="y[0] = x[0];")
    out = cuda(inputs=[mx.ones((4,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(4,)], output_dtypes=[mx.float32], stream=mx.gpu)
    with pytest.raises(KernelNotFoundError, match="runs only on the cuda backend"):
        mx.eval(out)
    broken = mx.fast.metal_kernel(name="broken", input_names=["x"], output_names=["y"],
                                  source="y[0] = x[0] +;")
    out = broken(inputs=[mx.ones((4,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                 output_shapes=[(4,)], output_dtypes=[mx.float32], stream=mx.gpu)
    with pytest.raises(LazyxError, match="broken"):
        mx.eval(out)
    assert on_metal["cpu_fallback"] == 0
