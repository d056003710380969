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


# -- thread-local default streams -----------------------------------------------------
def _index(s) -> int:
    """A stream's index from its repr (MLX's Stream has no ``index`` attribute)."""
    return int(repr(s).rstrip(")").rsplit(",", 1)[1])


def _in_thread(fn):
    import threading
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def _thread_streams(m):
    """Stream indices relative to a stream made first: a new thread makes a default
    stream of its own; set_default_stream / with stream(s) stay in their thread."""
    base = _index(m.new_stream(m.cpu))
    main = m.default_stream(m.cpu)
    rel = lambda s: _index(s) - base  # noqa: E731

    def worker():
        first = m.default_stream(m.cpu)
        again = m.default_stream(m.cpu)
        s = m.new_stream(m.cpu)
        m.set_default_stream(s)
        return [rel(first), rel(again), rel(s), rel(m.default_stream(m.cpu)),
                repr(first).split(",")[0]]

    got = [_in_thread(worker), m.default_stream(m.cpu) == main]
    s = m.new_stream(m.cpu)
    with m.stream(s):
        got += [rel(m.default_stream(m.cpu)), str(m.default_device()),
                _in_thread(lambda: m.default_stream(m.cpu) == s)]
        with m.stream(m.cpu):  # a device means this thread's default stream of it: s
            got.append(rel(m.default_stream(m.cpu)))
    got.append(m.default_stream(m.cpu) == main)
    tl = m.new_thread_local_stream(m.cpu)
    with m.stream(tl):
        mine = m.default_stream(m.cpu)
        got.append(rel(mine))

    def other():
        with m.stream(tl):
            return rel(m.default_stream(m.cpu))
    got += [_in_thread(other), repr(tl).startswith("ThreadLocalStream(Device(cpu, 0), ")]
    with m.stream(tl):  # the same stream again in this thread
        got.append(m.default_stream(m.cpu) == mine)
    # (Not clear_streams: MLX's leaves this thread's default streams unusable.)
    return got


def test_thread_local_default_streams():
    same(_thread_streams)


# -- reshape beyond 32 bits -----------------------------------------------------------
@pytest.mark.parametrize("shape", [(2**31,), (2**32,), (-1, 2**31), (0, 2**31), (-2**31 - 1,),
                                   (1, 2**31 - 1), (-2,)])
def test_reshape_beyond_32_bits(shape):
    """An OverflowError (lazyx's IntegerRangeError), as MLX's 32-bit shapes. (MLX's
    ``a.reshape(n)`` with one int beyond 32 bits raises a RuntimeError, std::bad_cast,
    a quirk of its binding that lazyx does not copy.)"""
    same(lambda m: m.reshape(m.zeros((2,)), shape))
    same(lambda m: m.zeros((2,)).reshape(shape))


# -- shapeless compile: counts and *_like follow each call's shapes ------------------
@pytest.mark.parametrize("name, fun", [
    ("mean", lambda m: lambda x: m.mean(x)),
    ("mean axis keepdims", lambda m: lambda x: x.mean(axis=1, keepdims=True)),
    ("mean of ints", lambda m: lambda x: m.mean(x.astype(m.int32), axis=0)),
    ("mean of float16", lambda m: lambda x: m.mean(x.astype(m.float16), axis=-1)),
    ("var", lambda m: lambda x: m.var(x, axis=0)),
    ("std ddof", lambda m: lambda x: m.std(x, ddof=1)),
    ("var ddof beyond n", lambda m: lambda x: m.var(x, axis=0, ddof=3)),
    ("zeros_like", lambda m: lambda x: m.zeros_like(x) + x),
    ("ones_like", lambda m: lambda x: m.ones_like(x) * x),
    ("full_like", lambda m: lambda x: m.full_like(x, 3.0)),
    ("full_like int", lambda m: lambda x: m.full_like(x, 2, dtype=m.int32)),
    ("full_like of an array", lambda m: lambda x: m.full_like(x, m.array([1.0, 2.0, 3.0]))),
    ("grad of mean", lambda m: lambda x: m.grad(lambda y: m.mean(y * y))(x)),
    ("grad of sum over an axis", lambda m: lambda x: m.grad(lambda y: (y.sum(0) ** 2).sum())(x)),
])
def test_shapeless_counts_and_likes(name, fun):
    shapes = [(2, 3), (4, 3), (3, 3)] if "array" in name else [(2, 3), (4, 5), (3, 2)]
    same(_shapeless(fun, *shapes))


def test_counts_and_likes_outside_compile():
    """Eagerly the count is a constant and *_like a fill: the same numbers as MLX,
    and the empty mean is NaN."""
    same(lambda m: [m.mean(_arange(m, (3, 4)), axis=(0, 1)), m.mean(m.zeros((0,))),
                    m.var(_arange(m, (3, 4)), ddof=12), m.zeros_like(_arange(m, (2, 2)))])


# -- complex vjps: g * conj(f'(x)) --------------------------------------------------
def _cplx(m):
    return m.array([[1 + 2j, 2 - 1j], [0.5 + 0.3j, -1 + 0.2j]], dtype=m.complex64)


@pytest.mark.parametrize("name, fun", [
    ("prod", lambda m: lambda x: m.prod(x)),
    ("prod axis", lambda m: lambda x: m.prod(x, axis=1)),
    ("prod keepdims", lambda m: lambda x: m.prod(x * m.array([1 + 1j, 2j]), axis=0, keepdims=True)),
    ("cumprod", lambda m: lambda x: m.cumprod(x, axis=1)),
    ("multiply", lambda m: lambda x: x * m.array([3 + 1j, 1 + 1j])),
    ("sum of products", lambda m: lambda x: m.sum(x * x, axis=0)),
    ("exp", lambda m: m.exp),
    ("square", lambda m: m.square),
    ("divide", lambda m: lambda x: m.divide(1 + 0j, x)),
    ("matmul", lambda m: lambda x: x @ x),
    ("sin", lambda m: m.sin),
    ("log", lambda m: m.log),
])
def test_complex_vjps(name, fun):
    """MLX's vjp of a complex op is ``g * conj(f'(x))``; for prod as for the rest."""
    def run(m):
        f = fun(m)
        x = _cplx(m)
        out = f(x)
        g = m.full(out.shape, 1 + 0.5j, dtype=m.complex64)
        vjp = m.vjp(f, [x], [g])[1]
        if name == "cumprod":  # MLX has no jvp of cumprod (lazyx has)
            return vjp
        return vjp + m.jvp(f, [x], [m.full(x.shape, 0.3 - 0.7j, m.complex64)])[1]
    same(run, rtol=1e-5)


def test_complex_prod_vjp_value():
    """d prod / d x_i = the product of the others, conjugated: [2+1j, 1-2j] for
    prod([1+2j, 2-1j]) (NumPy reference)."""
    import lazyx.core as lx
    a = np.array([1 + 2j, 2 - 1j, 0.5 - 0.25j])
    (g,) = lx.vjp(lambda x: lx.prod(x), [lx.array(a.astype(np.complex64))],
                  [lx.array(1 + 0.5j, dtype=lx.complex64)])[1]
    others = np.array([a[1] * a[2], a[0] * a[2], a[0] * a[1]])
    np.testing.assert_allclose(np.array(g), (1 + 0.5j) * np.conj(others), rtol=1e-6)


# -- an index input that a transform reaches: ValueError, stop_gradient is the fix ---
_B = [3.0, 1.0, 2.0]


@pytest.mark.parametrize("name, fun", [
    ("gather of argsort", lambda m: lambda b: b[m.argsort(b)].sum()),
    ("gather of argmax", lambda m: lambda b: b[m.argmax(b)]),
    ("gather of float to int", lambda m: lambda b: b[(b - 1).astype(m.int32)].sum()),
    ("take", lambda m: lambda b: m.take(b, m.argsort(b)).sum()),
    ("take_along_axis", lambda m: lambda b: m.take_along_axis(b, m.argsort(b), axis=0).sum()),
    ("put_along_axis", lambda m: lambda b: (m.put_along_axis(
        b, m.argsort(b)[:1], m.array([5.0]), axis=0) ** 2).sum()),
    ("scatter add", lambda m: lambda b: (b.at[m.argsort(b)].add(1.0) ** 2).sum()),
    ("dynamic slice", lambda m: lambda b: m.slice(b, m.argmin(b)[None].astype(m.int32), (0,),
                                                  (1,)).sum()),
    ("dynamic slice update", lambda m: lambda b: m.slice_update(
        b, b[:1] * 2, m.argmin(b)[None].astype(m.int32), (0,)).sum()),
    ("a zero cotangent still reaches", lambda m: lambda b: (b[m.argsort(b)] * 0).sum() + b.sum()),
    ("stop_gradient on the indices", lambda m: lambda b: (
        b[m.stop_gradient(m.argsort(b))] * m.array([1.0, 2.0, 3.0])).sum()),
    ("stop_gradient on take_along_axis", lambda m: lambda b: m.take_along_axis(
        b ** 2, m.stop_gradient(m.argsort(b)), axis=0).sum()),
    ("sort", lambda m: lambda b: (m.sort(b) * m.array([1.0, 2.0, 3.0])).sum()),
    ("topk", lambda m: lambda b: m.topk(b, 2).sum()),
    ("median", lambda m: lambda b: m.median(b)),
    ("second order of sort", lambda m: lambda a: m.grad(
        lambda b: (m.sort(b) ** 3 * m.array([1.0, 2.0, 3.0])).sum())(a).sum()),
    ("second order of cummax", lambda m: lambda a: m.grad(
        lambda b: (m.cummax(b) ** 2).sum())(a).sum()),
])
def test_gradient_reaching_indices(name, fun):
    same(lambda m: m.grad(fun(m))(m.array(_B)))


def test_jvp_reaching_indices():
    """A tangent given for the index input raises as in MLX (a ValueError)."""
    same(lambda m: m.jvp(lambda a, i: a[i], [m.array(_B), m.array([0, 1])],
                         [m.array(_B), m.array([1, 1])]))
    same(lambda m: m.jvp(lambda a, i: m.take_along_axis(a, i, 0), [m.array(_B), m.array([0, 1])],
                         [m.array(_B), m.array([1, 1])]))


# -- jvp: a tangent keeps its dtype --------------------------------------------------
@pytest.mark.parametrize("name, fun, primal, tangent", [
    ("int primal, float tangent", lambda m: lambda x: x * 2, ("int32", [1, 2]), ("float32", [0.5, 1.5])),
    ("int primal squared", lambda m: lambda x: x * x, ("int32", [1, 2]), ("float32", [0.5, 1.5])),
    ("exp of int", lambda m: m.exp, ("int32", [1, 2]), ("float32", [0.5, 1.5])),
    ("float16 primal, float32 tangent", lambda m: m.sin, ("float16", [1, 2]), ("float32", [0.5, 1.5])),
    ("identity", lambda m: lambda x: x, ("float16", [1, 2]), ("float32", [0.5, 1.5])),
    ("sum", lambda m: lambda x: x.sum(), ("float16", [1, 2]), ("float32", [0.5, 1.5])),
    ("matmul", lambda m: lambda x: x[:, None] @ x[None], ("float16", [1, 2]), ("float32", [0.5, 1.5])),
    ("float32 primal, float16 tangent", lambda m: m.sin, ("float32", [1, 2]), ("float16", [0.5, 1.5])),
    ("float32 primal, int tangent", lambda m: lambda x: x * 3, ("float32", [1, 2]), ("int32", [1, 2])),
    ("bfloat16 tangent", lambda m: lambda x: x + 1, ("float32", [1, 2]), ("bfloat16", [0.5, 1.5])),
    ("complex tangent", lambda m: lambda x: x * 2, ("float32", [1, 2]), ("complex64", [0.5j, 1.5])),
])
def test_jvp_tangent_dtypes(name, fun, primal, tangent):
    def run(m):
        p = m.array(primal[1], dtype=getattr(m, primal[0]))
        t = m.array(tangent[1], dtype=getattr(m, tangent[0]))
        return m.jvp(fun(m), [p], [t])
    same(run, rtol=2e-3)


# -- vmap of reductions that count elements, in and around a shapeless compile -------------
@pytest.mark.parametrize("name, fun", [
    ("compile(vmap(mean))", lambda m: m.compile(m.vmap(lambda x: m.mean(x)), shapeless=True)),
    ("compile(vmap(mean axis 0))",
     lambda m: m.compile(m.vmap(lambda x: m.mean(x, axis=0)), shapeless=True)),
    ("compile(vmap(var))", lambda m: m.compile(m.vmap(lambda x: m.var(x)), shapeless=True)),
    ("compile(vmap(std ddof=1))",
     lambda m: m.compile(m.vmap(lambda x: m.std(x, ddof=1)), shapeless=True)),
    ("compile(vmap(mean), in_axes=1)",
     lambda m: m.compile(m.vmap(lambda x: m.mean(x), in_axes=1), shapeless=True)),
    ("vmap(compile(mean))", lambda m: m.vmap(m.compile(lambda x: m.mean(x), shapeless=True))),
    ("vmap(compile(var))", lambda m: m.vmap(m.compile(lambda x: m.var(x), shapeless=True))),
])
def test_vmap_of_counting_reductions_at_a_new_batch_size(name, fun):
    # (4, 3) traces; (6, 5) replays with another batch size and row length.
    def run(m):
        f = fun(m)
        return [f(_arange(m, s) * 0.37 - 1) for s in [(4, 3), (6, 5)]]
    same(run, rtol=1e-5, atol=1e-6)
