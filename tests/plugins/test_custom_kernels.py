"""``fast.cuda_kernel``, ``fast.precompiled_cuda_kernel`` and ``fast.metal_kernel``:
the generated sources (MLX's signatures), argument checks, and the errors on a machine
or backend that cannot run them. The launch itself runs only where CUDA is available."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import LazyxError, ArgumentError, DeviceError, DtypeError, KernelNotFoundError, TransformError
from lazyx.plugins import custom_kernels as ck

BODY_CUDA = """
  auto elem = cooperative_groups::this_grid().thread_rank();
  if (elem < inp_shape[0] * inp_shape[1]) out[elem] = exp(inp[elem]) * s[0];
"""
BODY_METAL = """
  uint elem = thread_position_in_grid.x;
  out[elem] = metal::exp(inp[elem]) * s + inp_strides[0] + threads_per_grid.x;
"""


def _cuda_available():
    from lazyx.backend import backend_for
    from lazyx.device import DeviceType
    try:
        b = backend_for(DeviceType.gpu)
        return b.name == "cuda" and b.is_available()
    except Exception:
        return False


def test_cuda_source_is_mlx_signature():
    k = mx.fast.cuda_kernel("myexp", ["inp", "s"], ["out", "aux"], BODY_CUDA, header="// mine\n")
    assert k.shape_infos == ((True, False, False), (False, False, False))
    name, src = k.source_for([mx.ones((4, 4), mx.float16), mx.array([2.0])],
                             [mx.float16, mx.int32], ck._template([("T", mx.float32), ("N", 3),
                                                                  ("B", False)], "t"))
    assert name == "custom_kernel_myexp_float32_3_f"
    assert "// mine" in src and "namespace lazyx::cu {" in src
    assert ("__global__ void custom_kernel_myexp_float32_3_f(\n    const __half* inp,\n"
            "    const int32_t* inp_shape,\n    const float* s,\n    __half* out,\n"
            "    int32_t* aux) {") in src
    assert "  using T = float;\n  constexpr int N = 3;\n  constexpr bool B = false;" in src
    assert src.index(BODY_CUDA) > src.index("constexpr bool B")


def test_metal_source_is_mlx_signature():
    k = mx.fast.metal_kernel("myexp", ["inp", "s"], ["out"], BODY_METAL, atomic_outputs=True)
    name, src = k.source_for([mx.ones((4, 4)), mx.array(2.0)], [mx.float32],
                             ck._template([("T", mx.float16)], "t"))
    assert name == "custom_kernel_myexp_float16"
    assert ("template <typename T>\n[[kernel]] void custom_kernel_myexp(\n"
            "  const device float* inp [[buffer(0)]],\n"
            "  const constant int64_t* inp_strides [[buffer(1)]],\n"
            "  const constant float& s [[buffer(2)]],\n"
            "  device atomic<float>* out [[buffer(3)]],\n"
            "  uint3 thread_position_in_grid [[thread_position_in_grid]],\n"
            "  uint3 threads_per_grid [[threads_per_grid]]) {") in src
    assert ('template [[host_name("custom_kernel_myexp_float16")]] [[kernel]] '
            'decltype(custom_kernel_myexp<float16_t>) custom_kernel_myexp<float16_t>;') in src


CALL = dict(inputs=[mx.ones((4, 4)), mx.ones((1,))], output_shapes=[(4, 4)],
            output_dtypes=[mx.float32], grid=(16, 1, 1), threadgroup=(16, 1, 1))


@pytest.mark.parametrize("make, error, words", [
    (lambda: mx.fast.cuda_kernel("my exp", ["x"], ["y"], ""), ArgumentError, "C identifier"),
    (lambda: mx.fast.cuda_kernel("k", "x", ["y"], ""), ArgumentError, "input_names"),
    (lambda: mx.fast.metal_kernel("k", ["x"], [], ""), ArgumentError, "at least one output"),
    (lambda: mx.fast.metal_kernel("k", ["x"], ["x"], ""), ArgumentError, "distinct"),
    (lambda: mx.fast.metal_kernel("k", ["x"], ["y"], "", compile_options={"math_mode": "x"}),
     ArgumentError, "math_mode"),
    (lambda: mx.fast.cuda_kernel("k", ["x"], ["y"], "", shared_memory=-1), ArgumentError,
     "shared_memory"),
])
def test_bad_kernel_definitions(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize("change, error, words", [
    ({"inputs": [mx.ones(2)]}, ArgumentError, "Expected `inputs` to have size 2 but got size 1"),
    ({"output_shapes": [(4, 4), (2,)]}, ArgumentError, "`output_shapes` to have size 1"),
    ({"output_dtypes": []}, ArgumentError, "`output_dtypes` to have size 1"),
    ({"output_dtypes": ["nope"]}, DtypeError, "not a dtype"),
    ({"grid": (16, 1)}, ArgumentError, "grid must be a tuple of 3"),
    ({"threadgroup": (0, 1, 1)}, ArgumentError, "threadgroup"),
    ({"template": [("T", 1.5)]}, ArgumentError, "template argument 'T'"),
    ({"template": [("T", mx.float64)]}, DtypeError, "no Metal type"),
    ({"stream": mx.cpu}, DeviceError, "Only supports the GPU"),
])
def test_bad_calls(change, error, words):
    k = mx.fast.metal_kernel("myexp", ["inp", "s"], ["out"], BODY_METAL)
    if change.get("template") == [("T", mx.float64)]:
        with pytest.raises(error, match=words):
            k.source_for(CALL["inputs"], [mx.float64], ())
        return
    with pytest.raises(error, match=words):
        k(**{**CALL, **change})


def test_precompiled_bad_input():
    base = dict(name="k", compiled_source=b".version 8.0", inputs=[mx.ones(4)],
                output_shapes=[(4,)], output_dtypes=[mx.float32], scalars=[1, 2.0, True],
                grid=(4, 1, 1), threadgroup=(4, 1, 1))
    for change, words in (({"compiled_source": "text"}, "bytes"), ({"scalars": ["x"]}, "scalars"),
                          ({"output_shapes": []}, "same size"), ({"stream": mx.cpu}, "GPU")):
        with pytest.raises((ArgumentError, DeviceError), match=words):
            mx.fast.precompiled_cuda_kernel(**{**base, **change})


def test_the_node_refuses_the_cpu_and_other_backends_and_transforms():
    k = mx.fast.cuda_kernel("myexp", ["inp", "s"], ["out"], BODY_CUDA)
    name, src = k.source_for(CALL["inputs"], [mx.float32], ())
    p = ck.CustomKernel(mx.default_stream(mx.cpu), "cuda", name, src, (16, 1, 1), (16, 1, 1),
                        ((4, 4),), (mx.float32,), k.shape_infos, None, True, (), 0, False)
    p.check_params(p.params())
    with pytest.raises(KernelNotFoundError, match="runs only on the cuda backend"):
        p.eval_cpu([np.ones((4, 4), np.float32), np.ones(1, np.float32)])
    metal = ck.CustomKernel(p.stream, "metal", *p.params()[1:])
    with pytest.raises(LazyxError, match="cannot run|not available"):
        metal.eval_gpu([])
    for rule, args in (("vjp", ([], [], [0], [])), ("jvp", ([], [], [0])), ("vmap", ([], [0]))):
        with pytest.raises(TransformError, match=f"no {rule} rule.*custom_function"):
            getattr(p, rule)(*args)


@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and CuPy")
def test_cuda_kernel_runs_on_the_gpu():  # pragma: no cover - run on the GPU machine
    k = mx.fast.cuda_kernel("myexp", ["inp", "s"], ["out"], BODY_CUDA)
    a = mx.array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))
    out, = k(inputs=[a, mx.array([2.0])], template=[("T", mx.float32)], grid=(16, 1, 1),
             threadgroup=(16, 1, 1), output_shapes=[(4, 4)], output_dtypes=[mx.float32],
             init_value=0.0, stream=mx.gpu)
    np.testing.assert_allclose(np.array(out), np.exp(np.array(a)) * 2, rtol=1e-6)
