"""MLX's behaviour of the transforms, compared call for call (issue 13, item 7).

* ``compile(..., shapeless=True)`` through reshapes (a ``-1`` is inferred again at
  each call, other dimensions stay as traced), ``unflatten``, ``broadcast_to`` (the
  input broadcast with the traced shape), gathers (slice bounds as traced), slice
  updates, and MLX's refusal of a basic slice (a ``ValueError``);
* ``vmap`` with trees as ``in_axes`` / ``out_axes`` (one argument: the tree is matched
  against the argument itself, as MLX does);
* ``async_eval`` refused inside a transformed function; missing captured inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx


def _arange(m, shape):
    return m.arange(int(np.prod(shape)), dtype=m.float32).reshape(shape)


def _shapeless(fun, *shapes):
    """A shapeless compile of ``fun`` called at each input shape in turn."""
    def run(m):
        c = m.compile(fun(m), shapeless=True)
        return [c(_arange(m, s)) for s in shapes]
    return run


# -- shapeless compile ----------------------------------------------------------------
@pytest.mark.parametrize("name, fun, shapes", [
    ("reshape(-1)", lambda m: lambda x: x.reshape(-1) * 2, [(2, 3), (4, 5)]),
    ("reshape(2, -1)", lambda m: lambda x: x.reshape(2, -1) + 1, [(2, 3), (4, 5), (2, 2)]),
    ("reshape(-1, 3)", lambda m: lambda x: x.reshape(-1, 3), [(2, 3), (4, 3)]),
    ("reshape(-1, 1)", lambda m: lambda x: m.reshape(x, (-1, 1)), [(2, 3), (4, 3)]),
    ("reshape fixed", lambda m: lambda x: x.reshape(3, 2), [(2, 3), (3, 2)]),
    # Only the other axes change: MLX keeps the unflattened dimensions as traced even
    # where they were written -1 (lazyx infers a -1 again: tests/transforms/test_compile.py).
    ("unflatten", lambda m: lambda x: m.unflatten(x, 1, (-1, 1)), [(4, 3), (6, 3)]),
    # Alone: MLX fuses a broadcast_to followed by element-wise ops into a kernel whose
    # shapeless output takes the input's shape, (1, 3) here (lazyx gives (4, 3)).
    ("broadcast_to", lambda m: lambda x: m.broadcast_to(x, (4, 3)), [(1, 3), (4, 3), (4, 1),
                                                                     (1, 1)]),
    ("take", lambda m: lambda x: m.take(x, m.array([0, 1]), axis=1), [(4, 3), (6, 5)]),
    ("x[idx]", lambda m: lambda x: x[m.array([0, 2])], [(4, 3), (6, 3)]),
    ("flatten", lambda m: lambda x: m.flatten(x) + 1, [(4, 3), (6, 5)]),
    ("concatenate", lambda m: lambda x: m.concatenate([x, x]), [(4, 3), (6, 5)]),
])
def test_shapeless_compile_reinfers_shapes(name, fun, shapes):
    same(_shapeless(fun, *shapes))


def _slice_update(m):
    def f(x):
        x[1:3] = 0
        return x
    return f


def _index_update(m):
    def f(x):
        x[1] = m.array([7.0, 8.0, 9.0])
        return x * 2
    return f


@pytest.mark.parametrize("fun, shapes", [
    (_slice_update, [(4, 3), (6, 3)]),
    (_index_update, [(4, 3), (5, 3)]),
    (lambda m: lambda x: x.at[0].add(1.0), [(4, 3), (6, 3)]),
])
def test_shapeless_compile_slice_updates(fun, shapes):
    same(_shapeless(fun, *shapes))


@pytest.mark.parametrize("fun, shapes", [
    (lambda m: lambda x: x.reshape(-1, 3), [(2, 3), (2, 5)]),      # size no longer fits
    (lambda m: lambda x: x.reshape(3, 2), [(2, 3), (4, 5)]),
    (lambda m: lambda x: m.broadcast_to(x, (4, 3)), [(1, 3), (1, 5)]),
    (lambda m: lambda x: x[1:] + 1, [(4, 3)]),                        # a basic slice: refused
])
def test_shapeless_compile_errors(fun, shapes):
    same(_shapeless(fun, *shapes))


# -- vmap with trees --------------------------------------------------------------------
def _ones(m, *shape):
    return m.ones(shape)


@pytest.mark.parametrize("name, call", [
    ("dict, 2 args", lambda m: m.vmap(lambda d, y: d["a"] * d["b"] + y,
                                      in_axes=({"a": 0, "b": None}, 1))(
        {"a": _ones(m, 2, 3), "b": m.arange(3.0)}, _ones(m, 3, 2))),
    ("nested tuple, 2 args", lambda m: m.vmap(lambda t, y: t[0] + t[1][0] * y,
                                              in_axes=((0, (1,)), 0))(
        (_ones(m, 2, 3), (m.arange(6.0).reshape(3, 2),)), _ones(m, 2, 3))),
    ("bare dict, 1 arg", lambda m: m.vmap(lambda d: d["a"] - d["b"], in_axes={"a": 0, "b": 1})(
        {"a": m.arange(6.0).reshape(2, 3), "b": m.arange(6.0).reshape(3, 2)})),
    ("bare nested tuple, 1 arg", lambda m: m.vmap(lambda t: t[0] + t[1][0],
                                                  in_axes=(0, (1,)))(
        (m.arange(6.0).reshape(2, 3), (m.arange(6.0).reshape(3, 2),)))),
    ("(axis,) at 1 arg", lambda m: m.vmap(lambda t: t * 2, in_axes=(1,))(_ones(m, 2, 3))),
    ("out dict", lambda m: m.vmap(lambda a: {"x": a, "y": a * 2}, out_axes={"x": 0, "y": 1})(
        m.arange(6.0).reshape(2, 3))),
    ("out nested tuple", lambda m: m.vmap(lambda a: (a, (a * 2, a)), out_axes=(0, (1, 0)))(
        m.arange(6.0).reshape(2, 3))),
    ("out (axis,)", lambda m: m.vmap(lambda a: a + 1, out_axes=(1,))(
        m.arange(6.0).reshape(2, 3))),
    ("dict keys differ", lambda m: m.vmap(lambda d, y: d["a"] + y, in_axes=({"a": 0}, 0))(
        {"a": _ones(m, 2), "b": _ones(m, 2)}, _ones(m, 2))),
    ("tuple length differs", lambda m: m.vmap(lambda t, y: t[0] + y, in_axes=((0, 0), 0))(
        (_ones(m, 2),), _ones(m, 2))),
    ("out tree too long", lambda m: m.vmap(lambda a: (a, a), out_axes=(0, 1, 0))(_ones(m, 2, 3))),
    ("sizes differ", lambda m: m.vmap(lambda a, b: a + b.T)(_ones(m, 2, 3), _ones(m, 3, 2))),
    ("axis out of range", lambda m: m.vmap(lambda a: a, in_axes=2)(_ones(m, 2, 3))),
])
def test_vmap_trees(name, call):
    got = same(call)
    if isinstance(got, dict):
        got = list(got.values())
    del got


# -- async_eval inside transforms, captured inputs ----------------------------------------
def _async_in(m):
    def f(a):
        b = a * 2
        m.async_eval(b)
        return b
    return f


@pytest.mark.parametrize("transform", [
    lambda m, f: m.compile(f)(m.ones(3)),
    lambda m, f: m.grad(lambda a: f(a).sum())(m.ones(3)),
    lambda m, f: m.vjp(f, [m.ones(3)], [m.ones(3)]),
    lambda m, f: m.jvp(f, [m.ones(3)], [m.ones(3)]),
    lambda m, f: m.vmap(f)(m.ones((2, 3))),
])
def test_async_eval_inside_a_transform_raises(transform):
    same(lambda m: transform(m, _async_in(m)))


def test_async_eval_outside_a_transform_evaluates():
    same(lambda m: (lambda a: (m.async_eval(a), a)[1])(m.arange(3.0) * 2))


def test_eval_inside_grad_is_allowed():
    same(lambda m: m.grad(lambda a: (m.eval(a * 2), (a * a).sum())[1])(m.arange(3.0)))


def test_missing_captured_inputs_raise():
    def call(m):
        state = [m.array(1.0)]
        f = m.compile(lambda a: a + state[0], inputs=state)
        f(m.ones(2))
        state.pop()
        return f(m.ones(2))
    same(call)

    def call_dict(m):
        state = {"w": m.array(1.0)}
        f = m.compile(lambda a: a * state["w"], inputs=state)
        f(m.ones(2))
        del state["w"]
        return f(m.ones(2))
    same(call_dict)


# -- transforms already matching MLX, kept as differential tests ----------------------------
@pytest.mark.parametrize("name, call", [
    ("jvp, a constant output", lambda m: m.jvp(lambda a: (a * 2, m.ones(2)), [m.arange(3.0)],
                                               [m.ones(3)])),
    ("jvp, one tangent zero", lambda m: m.jvp(lambda a, b: a * b, [m.arange(3.0), m.arange(3.0)],
                                              [m.ones(3), m.zeros(3)])),
    ("value_and_grad argnums=None", lambda m: m.value_and_grad(
        lambda a, b: (a * b["k"]).sum(), argnums=None)(m.arange(3.0), {"k": m.arange(3.0)})),
    ("grad of a tree", lambda m: m.grad(lambda d: (d["a"] * d["b"][0]).sum())(
        {"a": m.arange(3.0), "b": [m.arange(3.0) + 1]})),
    ("grad through __setitem__", lambda m: m.grad(_setitem_loss(m))(m.array([1.0, 2.0, 3.0]))),
    ("hessian-vector of sort", lambda m: m.grad(lambda a: m.grad(
        lambda b: (m.sort(b) ** 3 * m.array([1.0, 2.0, 3.0])).sum())(a).sum())(
        m.array([3.0, 1.0, 2.0]))),
    ("hessian-vector of flip", lambda m: m.grad(lambda a: m.grad(
        lambda b: (b[::-1] ** 3 * m.array([1.0, 2.0, 3.0])).sum())(a).sum())(
        m.array([3.0, 1.0, 2.0]))),
    ("hessian-vector of transpose", lambda m: m.grad(lambda a: m.grad(
        lambda b: (b.T ** 3 * m.arange(4.0).reshape(2, 2)).sum())(a).sum())(
        m.arange(4.0).reshape(2, 2) + 1)),
])
def test_transforms_match(name, call):
    same(call)


def _setitem_loss(m):
    def f(a):
        b = a * 1
        b[1] = a[0] * 3
        b[1:] *= 2
        return (b * b).sum()
    return f
