"""The transform rules of every registered primitive, built-in or from a plugin.

For each primitive in :data:`lazyx.registry.primitives` the test takes the
examples that plugins register with the ``lazyx_examples`` hook and checks, on
the example's inputs:

* ``vjp`` against central finite differences in float64 (along random
  directions), and ``jvp`` against ``vjp`` (``<u, J v> == <J^T u, v>``), with
  respect to the floating arguments;
* for a primitive with ``differentiable = False``: that the cotangents and
  tangents of every argument are zero;
* ``vmap`` against a Python loop, with the floating arguments batched at axis
  0 (the others unbatched), and with every argument batched at its last axis.

A primitive without a ``vjp``, ``jvp`` or ``vmap`` rule, or without an example,
fails with its name and its plugin's distribution, so a plugin that forgets a
rule is caught here.
"""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import check_jvp_vjp, check_vjp_fd, check_vmap_loop, to_lazyx
from lazyx import registry
from lazyx.testing.primitive_checks import batched_examples, check_zero_gradients
from lazyx.primitive import Primitive

PRIMITIVES = sorted(registry.primitives, key=lambda c: (registry.primitives[c].name, c.name))
EXAMPLES = registry.examples()
RULES = ("vjp", "jvp", "vmap")
# The examples of a batch: scaled copies keep signs, order and most domains.
# Finite differences by the least precise floating dtype in the example's graph.
PRECISE = {"eps": 1e-6, "rtol": 1e-5, "atol": 1e-7, "jvp_rtol": 1e-9}
IMPRECISE = {"eps": 1e-3, "rtol": 2e-2, "atol": 2e-3, "jvp_rtol": 1e-4}


def _who(cls) -> str:
    info = registry.primitives[cls]
    return f"{cls.name} (plugin {info.name!r} of distribution {info.distribution!r})"


def _outputs(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _graph(outputs):
    """The primitive classes and the floating dtypes of the unevaluated graph of ``outputs``."""
    classes, dtypes, seen = set(), set(), set()
    stack = list(outputs)
    while stack:
        a = stack.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        if a.dtype.kind in "fc":
            dtypes.add(a.dtype)
        if a._prim is not None:
            classes.add(type(a._prim))
            stack.extend(a._inputs)
    return classes, dtypes


def _check_example(cls, make, msg):
    made = make()
    fn, args = made[0], [np.asarray(a) for a in made[1]]
    options = made[2] if len(made) > 2 else {}
    classes, dtypes = _graph(_outputs(fn(*[to_lazyx(a) for a in args])))
    if cls.transient:
        assert cls not in classes, f"{msg}: a transient primitive is left in the graph"
    else:
        assert cls in classes, f"{msg}: the example's graph has no {cls.name} node"

    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    if cls.differentiable:
        assert floats, f"{msg}: a differentiable example needs a floating argument"

        def of_floats(*xs):
            full = [to_lazyx(a) for a in args]
            for i, x in zip(floats, xs):
                full[i] = x
            return fn(*full)

        tol = PRECISE if dtypes <= {mx.float64} else IMPRECISE
        xs = [args[i].astype(np.float64) for i in floats]
        check_vjp_fd(of_floats, *xs, eps=tol["eps"], rtol=tol["rtol"], atol=tol["atol"],
                     max_elements=0, msg=msg)
        check_jvp_vjp(of_floats, *xs, rtol=tol["jvp_rtol"], atol=tol["jvp_rtol"], msg=msg)
    else:
        check_zero_gradients(fn, args, msg)

    reverse = options.get("batch_ints", True)
    mapped = floats or range(len(args))
    axes = [0 if i in mapped else None for i in range(len(args))]
    inputs = [batched_examples(a, 0, reverse) if ax is not None else a for a, ax in zip(args, axes)]
    check_vmap_loop(fn, *inputs, in_axes=axes, msg=f"{msg}, vmap of {axes}")
    inputs = [batched_examples(a, -1, reverse) for a in args]
    check_vmap_loop(fn, *inputs, in_axes=[-1] * len(args), msg=f"{msg}, vmap at the last axes")


@pytest.mark.parametrize("cls", PRIMITIVES, ids=lambda c: f"{registry.primitives[c].name}.{c.name}")
def test_rules_against_finite_differences_and_loops(cls):
    who = _who(cls)
    if not cls.transient:
        missing = [r for r in RULES if getattr(cls, r) is getattr(Primitive, r)]
        assert not missing, f"{who} has no {' / '.join(missing)} rule"
    examples = EXAMPLES.get(cls)
    assert examples, (f"{who} has no example: register (cls, make) with the plugin's "
                      f"lazyx_examples hook")
    for k, (make, info) in enumerate(examples):
        _check_example(cls, make, f"{who}, example {k} from plugin {info.name!r}")


def test_every_primitive_is_walked():
    assert len(PRIMITIVES) > 100
    unknown = [c for c in EXAMPLES if c not in registry.primitives]
    assert not unknown, f"examples for unregistered primitives: {[c.name for c in unknown]}"


class _Forgetful(Primitive):
    """A plugin primitive with a shape rule and a kernel but no transform rules."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] * 2


def test_a_primitive_without_rules_or_examples_fails(monkeypatch):
    info = registry.PluginInfo("forgetful", "lazyx-forgetful", "1.0")
    monkeypatch.setitem(registry.primitives, _Forgetful, info)
    with pytest.raises(AssertionError,
                       match=r"_Forgetful .*'lazyx-forgetful'.* no vjp / jvp / vmap"):
        test_rules_against_finite_differences_and_loops(_Forgetful)
    # With rules but no example, the test fails too.
    for rule in RULES:
        monkeypatch.setattr(_Forgetful, rule, lambda self, *a: None, raising=False)
    with pytest.raises(AssertionError, match=r"_Forgetful .*'lazyx-forgetful'.* has no example"):
        test_rules_against_finite_differences_and_loops(_Forgetful)


def test_a_wrong_rule_fails(monkeypatch):
    from lazyx.plugins import elementwise
    monkeypatch.setattr(elementwise.ArcTan, "derivative",
                        lambda self, x, y: mx.multiply(mx.reciprocal(mx.add(mx.square(x), 1)), 1.01))
    with pytest.raises(AssertionError, match="finite differences"):
        test_rules_against_finite_differences_and_loops(elementwise.ArcTan)


def test_a_wrong_fused_derivative_fails(monkeypatch):
    from lazyx.plugins import elementwise
    monkeypatch.setattr(elementwise.TanhGrad, "partial",
                        lambda self, i, g, y, out: mx.multiply(g, y) if i else mx.square(y))
    with pytest.raises(AssertionError, match="finite differences"):
        test_rules_against_finite_differences_and_loops(elementwise.TanhGrad)
