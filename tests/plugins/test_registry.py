"""Registry-wide checks: every registered primitive has a shape rule and CPU kernels."""

import pytest

import lazyx.core  # noqa: F401  (loads the plugins)
from lazyx import registry
from lazyx.backend import backends, resolve_kernel
from lazyx.primitive import Primitive

PRIMITIVES = sorted(registry.primitives, key=lambda c: (registry.primitives[c].name, c.name))


def test_registry_is_populated():
    assert len(PRIMITIVES) > 50


@pytest.mark.parametrize("cls", PRIMITIVES, ids=lambda c: c.name)
def test_every_primitive_has_a_shape_rule(cls):
    assert cls.output_shapes is not Primitive.output_shapes, (
        f"{cls.name} ({registry.primitives[cls].label}) does not implement output_shapes")


@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_every_primitive_has_a_cpu_kernel(backend):
    b = backends()[backend]
    missing = [c.name for c in PRIMITIVES if getattr(resolve_kernel(b, c)[0], "missing", False)]
    assert not missing, f"{backend} lacks kernels for {missing}"


# MLX's own functions without a stream argument.
NO_STREAM = {"broadcast_shapes", "random.key", "random.seed", "random.state"}
# Writing files: MLX's savers take no stream either.
NO_STREAM |= {"save", "savez", "savez_compressed", "save_safetensors", "save_gguf"}
# Graph and path queries, and the device namespaces (queries of a backend, not ops).
NO_STREAM |= {"einsum_path", "depends"}
# Custom-kernel factories (MLX's): the kernel they return takes stream=.
NO_STREAM |= {"fast.cuda_kernel", "fast.metal_kernel"}
# Starting the distributed group (MLX's init and is_available take no stream either).
NO_STREAM |= {"distributed.init", "distributed.is_available"}
NO_STREAM |= {"cuda.is_available"} | {"metal." + n for n in (
    "is_available", "device_info", "start_capture", "stop_capture", "get_active_memory",
    "get_peak_memory", "reset_peak_memory", "get_cache_memory", "clear_cache",
    "set_memory_limit", "set_cache_limit", "set_wired_limit")}


def test_every_op_takes_a_stream_keyword():
    import inspect
    lacking = []
    for name, (fn, info) in registry.ops.items():
        if name.startswith("array.") or name in NO_STREAM or not callable(fn) or isinstance(fn, type):
            continue
        if "stream" not in inspect.signature(fn).parameters:
            lacking.append(f"{name} ({info.distribution})")
    assert not lacking, f"ops without stream=: {lacking}"
