"""``lazyx.testing.check_primitive``: every check runs, and every failure is named."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.array import lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError
from lazyx.primitive import Primitive
from lazyx.testing import CheckReport, check_primitive, isolated_registry

GEN = np.random.default_rng(0)
X = GEN.uniform(0.5, 1.5, (2, 3))
Y = GEN.uniform(0.5, 1.5, (3,))


@mx.custom_primitive(elementwise=True)
def scale(x, *, by=2.0):
    return x * by


@scale.vjp
def _scale_vjp(primals, cotangent, output, *, by):
    return cotangent * by


@scale.jvp
def _scale_jvp(primals, tangents, *, by):
    return tangents[0] * by


def test_a_correct_primitive_passes_every_check():
    report = check_primitive(scale, X)
    assert isinstance(report, CheckReport) and not report.failed
    for name in ("graph", "shape rule", "vjp", "jvp", "vmap"):
        assert name in report.passed
    from lazyx.testing import available_backends
    assert all(f"kernel on {b}" in report.passed for b in available_backends())
    if hasattr(mx, "compile"):
        assert "compile" in report.passed
    assert "passed: graph, shape rule" in str(report)


def test_a_registered_primitive_is_checked_on_its_plugins_examples():
    cube = registry.plugins["testpack"].primitives[0]
    report = check_primitive(cube)
    assert "vjp" in report.passed and "vmap" in report.passed


def test_every_failure_is_reported_by_name():
    @mx.custom_primitive(elementwise=True)
    def wrong(x, y):
        return x * y

    @wrong.vjp
    def _wrong_vjp(primals, cotangent, output):
        x, y = primals
        return cotangent * y, cotangent * y  # the second should be cotangent * x

    with pytest.raises(AssertionError) as e:
        check_primitive(wrong, X, Y)
    text = str(e.value)
    assert text.startswith("check_primitive(wrong): ")
    assert "FAILED vjp:" in text and "finite differences" in text
    assert "FAILED jvp: TransformError: [Wrong.jvp] Not implemented" in text
    assert "FAILED vmap" not in text and "FAILED shape rule" not in text
    assert "passed: graph, shape rule, kernel on cpu" in text


class _WrongShapeRule(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape + (1,)]

    def eval_cpu(self, inputs):
        return inputs[0] + 1


def _wrong_shape_rule(x):
    return lazy(x.shape, x.dtype, _WrongShapeRule(to_stream(None)), (x,))


def test_a_wrong_shape_rule_and_missing_rules_are_named():
    with pytest.raises(AssertionError) as e:
        check_primitive(_wrong_shape_rule, X)
    text = str(e.value)
    assert "FAILED shape rule: _WrongShapeRule().output_shapes gave [(2, 3, 1)], its op " \
           "promised [(2, 3)]" in text
    assert "FAILED kernel on cpu: KernelOutputError" in text
    for rule in ("vjp", "jvp", "vmap"):
        assert f"FAILED {rule}: " in text
    assert "FAILED vmap: TransformError: [_WrongShapeRule.vmap] Not implemented" in text


def test_a_kernel_that_differs_on_one_backend_is_named():
    class Overrides:
        from lazyx import hookimpl

        @hookimpl
        def lazyx_kernels(self):
            return [("cpu-reference", scale.primitive, lambda prim, ins: ins[0] * 3.0)]

    with isolated_registry():
        registry.register_plugin(Overrides(), "wrong-kernel", "lazyx-wrong-kernel", "1")
        with pytest.raises(AssertionError) as e:
            check_primitive(scale, X)
    text = str(e.value)
    assert "FAILED kernel on cpu-reference: " in text
    assert "output 0 differs from backend 'cpu'" in text
    assert "FAILED kernel on cpu:" not in text
    check_primitive(scale, X)  # the override is gone


def test_compile_is_skipped_with_a_note_when_it_does_not_exist(monkeypatch):
    monkeypatch.delattr(mx, "compile", raising=False)
    report = check_primitive(scale, X)
    assert report.skipped == {"compile": "lazyx.core.compile does not exist yet"}
    assert "skipped compile: lazyx.core.compile does not exist yet" in str(report)


def test_non_differentiable_primitives_must_have_zero_gradients():
    @mx.custom_primitive(elementwise=True, differentiable=False)
    def floor(x):
        return np.floor(x)

    @floor.vjp
    def _floor_vjp(primals, cotangent, output):
        return None

    @floor.jvp
    def _floor_jvp(primals, tangents):
        return None

    report = check_primitive(floor, X * 3)
    assert "zero gradients" in report.passed and "vjp" not in report.passed

    @mx.custom_primitive(elementwise=True, differentiable=False)
    def not_really(x):
        return x * 2

    @not_really.vjp
    def _not_really_vjp(primals, cotangent, output):
        return cotangent * 2

    with pytest.raises(AssertionError, match="FAILED zero gradients: nonzero cotangent"):
        check_primitive(not_really, X)


@mx.custom_primitive(promote=False, shape=lambda s, i: i, dtype=lambda d, di: d)
def take(x, idx):
    """``x[idx]`` for a vector ``x``."""
    return np.take(x, idx)


@take.vjp
def _take_vjp(primals, cotangent, output):
    x, idx = primals
    onehot = mx.equal(mx.expand_dims(idx, -1), mx.arange(x.shape[0]))
    spread = mx.where(onehot, mx.expand_dims(cotangent, -1), 0.0)
    return mx.sum(spread, axis=tuple(range(idx.ndim))), None


@take.jvp
def _take_jvp(primals, tangents):
    return take(tangents[0], primals[1])


@take.vmap
def _take_vmap(inputs, axes):
    (x, idx), (ax, ai) = inputs, axes
    size = x.shape[ax] if ax is not None else idx.shape[ai]
    x = mx.moveaxis(x, ax, 0) if ax is not None else mx.broadcast_to(x, (size,) + x.shape)
    idx = mx.moveaxis(idx, ai, 0) if ai is not None else mx.broadcast_to(idx, (size,) + idx.shape)
    out = mx.take_along_axis(x, mx.reshape(idx, (size, -1)), axis=-1)
    return mx.reshape(out, idx.shape), 0


def test_integer_inputs_are_held_fixed():
    idx = np.array([[2, 0], [1, 2]], dtype=np.int32)
    report = check_primitive(take, np.array([1.0, 2.0, 3.0]), idx)
    assert {"vjp", "jvp", "vmap"} <= set(report.passed)
    # Batching the indices by reversing them keeps them valid here; repeating does too.
    check_primitive(take, np.array([1.0, 2.0, 3.0]), idx, batch_ints=False)


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="pass the op function"):
        check_primitive(scale.primitive, X)
    with pytest.raises(ArgumentError, match="expects an op function"):
        check_primitive(3)
    with pytest.raises(AssertionError, match="FAILED examples: Scale has no example"):
        check_primitive(scale.primitive)
    with pytest.raises(AssertionError, match=r"FAILED graph: ValueError: boom"):
        check_primitive(lambda x: (_ for _ in ()).throw(ValueError("boom")), X)


# -- skip: rules left out on purpose ------------------------------------------------------
@mx.custom_primitive(elementwise=True)
def scale_no_jvp(x, *, by=2.0):
    return x * by


@scale_no_jvp.vjp
def _scale_no_jvp_vjp(primals, cotangent, output, *, by):
    return cotangent * by


@mx.custom_primitive(elementwise=True)
def cube_no_vjp(x):
    return x ** 3


@cube_no_vjp.jvp
def _cube_no_vjp_jvp(primals, tangents):
    return 3.0 * primals[0] ** 2 * tangents[0]


def test_skip_leaves_a_rule_out_and_reports_it_as_skipped_not_passed():
    with pytest.raises(AssertionError, match="FAILED jvp: TransformError"):
        check_primitive(scale_no_jvp, X)
    report = check_primitive(scale_no_jvp, X, skip={"jvp"})
    assert not report.failed
    assert report.skipped == {"jvp": "left out on purpose (skip=...)"}
    assert "jvp" not in report.passed
    assert {"graph", "shape rule", "vjp", "vmap", "compile"} <= set(report.passed)
    text = str(report)
    assert text.splitlines()[0].endswith(" passed, 0 failed, 1 skipped")
    assert "skipped jvp: left out on purpose (skip=...)" in text
    # A single name as a string, and several at once.
    assert "jvp" in check_primitive(scale_no_jvp, X, skip="jvp").skipped
    both = check_primitive(scale_no_jvp, X, skip={"jvp", "vmap", "kernels"})
    assert {"jvp", "vmap", "kernels"} <= set(both.skipped)
    assert not any(n.startswith("kernel on") or n == "vmap" for n in both.passed)


def test_skip_hides_nothing_else():
    @mx.custom_primitive(elementwise=True)
    def wrong_no_jvp(x):
        return x * 2.0

    @wrong_no_jvp.vjp
    def _vjp(primals, cotangent, output):
        return cotangent * 3.0  # should be * 2

    with pytest.raises(AssertionError) as e:
        check_primitive(wrong_no_jvp, X, skip={"jvp"})
    text = str(e.value)
    assert "FAILED vjp:" in text and "finite differences" in text
    assert "FAILED jvp" not in text and "skipped jvp: left out on purpose" in text


def test_without_vjp_jvp_is_checked_against_finite_differences():
    report = check_primitive(cube_no_vjp, X, skip={"vjp"})
    assert "jvp" in report.passed and report.skipped["vjp"] == "left out on purpose (skip=...)"

    @mx.custom_primitive(elementwise=True)
    def bad_jvp(x):
        return x ** 3

    @bad_jvp.jvp
    def _bad(primals, tangents):
        return 2.0 * primals[0] ** 2 * tangents[0]  # should be 3 x^2

    with pytest.raises(AssertionError,
                       match="(?s)FAILED jvp: .*jvp: tangent 0 vs finite differences"):
        check_primitive(bad_jvp, X, skip={"vjp"})


def test_skip_on_a_non_differentiable_primitive_checks_the_other_rule():
    @mx.custom_primitive(elementwise=True, differentiable=False)
    def step(x):
        return np.floor(x)

    @step.vjp
    def _step_vjp(primals, cotangent, output):
        return None

    report = check_primitive(step, X * 3, skip={"jvp"})
    assert "zero gradients" in report.passed and report.skipped["jvp"].startswith("left out")

    @mx.custom_primitive(elementwise=True, differentiable=False)
    def leaky(x):
        return x * 2

    @leaky.vjp
    def _leaky_vjp(primals, cotangent, output):
        return cotangent * 2

    with pytest.raises(AssertionError, match="FAILED zero gradients: nonzero cotangent"):
        check_primitive(leaky, X, skip={"jvp"})
    report = check_primitive(leaky, X, skip={"jvp", "vjp"})
    assert "zero gradients" not in report.passed and {"vjp", "jvp"} <= set(report.skipped)


def test_skip_rejects_unknown_checks_naming_the_valid_ones():
    from lazyx.testing import SKIPPABLE
    with pytest.raises(ArgumentError) as e:
        check_primitive(scale, X, skip={"jpv", "vmap"})
    text = str(e.value)
    assert "unknown check 'jpv'" in text
    for name in SKIPPABLE:
        assert repr(name) in text
    with pytest.raises(ArgumentError, match="unknown check 'graph'"):
        check_primitive(scale, X, skip=["graph"])
