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
