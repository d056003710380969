"""compile: values against eager, the cache, captured state, shapeless, simplification,
composition with the other transforms, and errors."""

import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapelessCompileError, TransformError
from lazyx.plugins.elementwise import AsType, Multiply, Sin
from lazyx.plugins.random import RandomBits
from lazyx.plugins.reductions import Reduce
from lazyx.plugins.shapes import Reshape, Transpose
from lazyx.transforms.compile import CompiledCall, Tape
from helpers import (assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop,
                     random_array, rng)

A = random_array((3, 4), mx.float32, rng(31), -2.0, 2.0)
B = random_array((3, 4), mx.float32, rng(32), -2.0, 2.0)
V = random_array((4,), mx.float32, rng(33), -2.0, 2.0)


def counted(fun):
    """``fun`` with a count of its calls (each trace calls it once)."""
    def f(*args, **kwargs):
        f.calls += 1
        return fun(*args, **kwargs)
    f.calls = 0
    return f


def only_tape(compiled) -> Tape:
    tapes = compiled.cache.tapes()
    assert len(tapes) == 1
    return tapes[0]


def prims(tape: Tape, cls) -> int:
    return sum(type(n.prim) is cls for n in tape.nodes)


def same_as_eager(fun, *args):
    """The compiled function gives the eager values, twice (trace, then a cache hit)."""
    expected = fun(*args)
    cf = mx.compile(fun)
    for _ in range(2):
        got = cf(*args)
        if isinstance(expected, (list, tuple)):
            assert type(got) is type(expected) and len(got) == len(expected)
            for g, e in zip(got, expected):
                assert_close(g, np.array(e), e.dtype)
        else:
            assert_close(got, np.array(expected), expected.dtype)
    assert cf.cache.traces == 1 and cf.cache.hits == 1
    return cf


# -- values ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.float64, mx.int32])
def test_elementwise_chain(dtype):
    a = mx.array(random_array((5, 4), dtype, rng(1), 0.5, 2.0))
    b = mx.array(random_array((4,), dtype, rng(2), 0.5, 2.0))

    def chain(x, y):
        z = x
        for _ in range(10):
            z = z * y + x
            z = mx.maximum(z - y, x)
        return z * 2 + 1

    same_as_eager(chain, a, b)


def test_transcendental_and_mixed_dtypes():
    def f(x, y, n):
        return mx.exp(mx.sin(x)) * mx.tanh(y) + mx.astype(n, mx.float32) / 3

    same_as_eager(f, mx.array(A), mx.array(B), mx.array(np.arange(12).reshape(3, 4)))


def test_reductions_and_shapes():
    def f(x):
        s = mx.sum(x, axis=1, keepdims=True)
        m = mx.max(x, axis=0)
        return (x - s) * m, mx.mean(x), mx.argmax(x, axis=1), mx.transpose(x).reshape(2, 6)

    same_as_eager(f, mx.array(A))


def test_matmul_mlp():
    g = rng(3)
    w1 = mx.array(g.standard_normal((4, 8)).astype(np.float32))
    b1 = mx.array(g.standard_normal((8,)).astype(np.float32))
    w2 = mx.array(g.standard_normal((8, 2)).astype(np.float32))

    def mlp(x, w1, b1, w2):
        h = mx.maximum(x @ w1 + b1, 0.0)
        return mx.softmax(h @ w2, axis=-1)

    same_as_eager(mlp, mx.array(A), w1, b1, w2)
    # Weights captured instead of passed: constants of the trace.
    same_as_eager(lambda x: mlp(x, w1, b1, w2), mx.array(A))


def test_indexing():
    idx = mx.array([2, 0, 1, 1])

    def f(x, i):
        return x[1:, ::2] * 2, x[i], mx.take(x, i, axis=1), x[..., -1]

    same_as_eager(f, mx.array(A), idx)


def test_assignment_to_an_argument():
    def f(x):
        x[0, 1] = 5.0
        x[1] = x[2]
        return x * 2

    expected = np.array(f(mx.array(A)))
    x = mx.array(A)
    cf = mx.compile(f)
    assert_close(cf(x), expected)
    assert_close(cf(x), expected)
    assert_close(x, A)  # the caller's array is untouched (its placeholder was updated)


def test_random_with_keys():
    def f(key, x):
        return mx.random.uniform(shape=(3, 4), key=key) + mx.random.normal((4,), key=key) * x

    cf = same_as_eager(f, mx.random.key(0), mx.array(A))
    a = np.array(cf(mx.random.key(0), mx.array(A)))
    b = np.array(cf(mx.random.key(1), mx.array(A)))
    assert not np.allclose(a, b)
    assert cf.cache.traces == 1


def test_multiple_outputs_and_trees():
    def f(x, d):
        q, r = mx.divmod(x, d["div"])
        return {"q": q, "r": [r, None], "x": x, "again": q}, x.sum()

    x = mx.array(np.abs(A) + 1)
    out, s = mx.compile(f)(x, {"div": mx.array(0.75)})
    ref, rs = f(x, {"div": mx.array(0.75)})
    for k in ("q", "x", "again"):
        assert_close(out[k], np.array(ref[k]))
    assert_close(out["r"][0], np.array(ref["r"][0]))
    assert out["r"][1] is None
    assert_close(s, np.array(rs))


def test_constant_outputs_and_no_arrays():
    c = mx.array([1.0, 2.0])
    assert_close(mx.compile(lambda: c * 2)(), [2.0, 4.0])
    assert_close(mx.compile(lambda x: c)(mx.array(A)), [1.0, 2.0])
    assert mx.compile(lambda x: None)(mx.array(A)) is None


def test_non_array_arguments_are_constants():
    f = counted(lambda x, s, mode=None: x * s if mode == "mul" else x + s)
    cf = mx.compile(f)
    x = mx.array(A)
    assert_close(cf(x, 2.0, mode="mul"), A * 2)
    assert_close(cf(x, 2.0, mode="mul"), A * 2)
    assert_close(cf(x, 3.0, mode="mul"), A * 3)
    assert_close(cf(x, 3, mode="add"), A + 3)
    assert f.calls == 3
    cf(x, float("nan"))
    cf(x, float("nan"))
    assert f.calls == 4


def test_the_active_backend_runs_the_plan():
    cf = mx.compile(lambda x: mx.exp(x).sum(1))
    expected = np.exp(A.astype(np.float64)).sum(1)
    assert_close(cf(mx.array(A)), expected)
    with mx.use_backend("cpu", "cpu-reference"):
        assert_close(cf(mx.array(A)), expected)
    assert cf.cache.traces == 1


# -- the cache ----------------------------------------------------------------------
def test_recompiles_on_a_new_signature():
    f = counted(lambda x, y: x * y)
    cf = mx.compile(f)
    x, y = mx.array(A), mx.array(B)
    cf(x, y)
    cf(mx.array(B), mx.array(A))                    # same shapes and dtypes: a hit
    assert (f.calls, cf.cache.hits) == (1, 1)
    cf(mx.array(V), y)                              # a new shape
    cf(mx.astype(x, mx.float16), y)                 # a new dtype
    cf(x, 2.0)                                      # an array became a constant
    assert f.calls == 4
    cf(mx.array(V), y)
    cf(x, 2.0)
    assert f.calls == 4 and cf.cache.traces == 4 and cf.cache.hits == 3


def test_recompiles_on_a_new_tree():
    f = counted(lambda t: t[0] + t[1] if not isinstance(t, dict) else t["a"] - t["b"])
    cf = mx.compile(f)
    x, y = mx.array(A), mx.array(B)
    assert_close(cf([x, y]), A + B)
    assert_close(cf((x, y)), A + B)
    assert_close(cf({"a": x, "b": y}), A - B)
    assert_close(cf({"b": y, "a": x}), A - B)
    assert f.calls == 4
    cf({"a": x, "b": y})
    assert f.calls == 4


def test_compiling_one_function_twice_shares_its_cache():
    f = counted(lambda x: x + 1)
    mx.compile(f)(mx.array(A))
    mx.compile(f)(mx.array(A))
    assert f.calls == 1
    mx.compile(f, shapeless=True)(mx.array(A))
    assert f.calls == 2


# -- shapeless ------------------------------------------------------------------------
def test_shapeless_reuses_the_trace():
    f = counted(lambda x, y: mx.sum(mx.exp(x) * y, axis=0) + mx.max(x))
    cf = mx.compile(f, shapeless=True)
    for shape in [(3, 4), (5, 2), (1, 7), (0, 3)]:
        x = random_array(shape, mx.float32, rng(4))
        y = random_array(shape[-1:], mx.float32, rng(5))
        if shape[0]:
            expected = (np.exp(x.astype(np.float64)) * y).sum(0) + x.max()
            assert_close(cf(mx.array(x), mx.array(y)), expected)
    assert f.calls == 1
    cf(mx.array(V), mx.array(V))        # another number of dimensions traces again
    cf(mx.array(np.ones((2, 2), np.float16)), mx.array(np.ones(2, np.float16)))  # a dtype
    assert f.calls == 3


def test_shapeless_matmul_and_broadcasting():
    cf = mx.compile(lambda x, w, b: mx.maximum(x @ w + b, 0.0), shapeless=True)
    for n, k, m in [(2, 3, 4), (5, 6, 1)]:
        g = rng(n)
        x, w, b = (g.standard_normal(s).astype(np.float32) for s in ((n, k), (k, m), (m,)))
        assert_close(cf(mx.array(x), mx.array(w), mx.array(b)),
                     np.maximum(x.astype(np.float64) @ w + b, 0))
    assert cf.cache.traces == 1


@pytest.mark.parametrize("fun, name", [
    (lambda x: x[1:] + 1, "Slice"),
    (lambda x: mx.split(x, [1], axis=1)[0] * 2, "Split"),
])
def test_shapeless_refuses_fixed_shapes(fun, name):
    # A ValueError as in MLX, and a TransformError (the transform cannot replay it).
    with pytest.raises(ShapelessCompileError, match=name) as info:
        mx.compile(fun, shapeless=True)(mx.array(A))
    assert isinstance(info.value, (TransformError, ValueError))
    # Without shapeless it compiles.
    assert_close(mx.compile(fun)(mx.array(A)), np.array(fun(mx.array(A))))


# Each case: the function, and its NumPy float64 reference at another shape.
_REINFERRED = [
    (lambda x: x.reshape(-1) * 2, lambda x: x.reshape(-1) * 2),
    (lambda x: x.reshape(2, -1) + 1, lambda x: x.reshape(2, -1) + 1),
    (lambda x: mx.reshape(x, (-1, 1)), lambda x: x.reshape(-1, 1)),
    (lambda x: mx.unflatten(x, 0, (2, -1)) * 3, lambda x: x.reshape((2, -1) + x.shape[1:]) * 3),
    (lambda x: mx.take(x, mx.array([0, 1]), axis=1) * 2, lambda x: x[:4, [0, 1]] * 2),
    (lambda x: x.reshape(-1, 2).sum(axis=1), lambda x: x.reshape(-1, 2).sum(axis=1)),
]


@pytest.mark.parametrize("k", range(len(_REINFERRED)))
def test_shapeless_reinfers_shapes_at_each_call(k):
    """A ``-1`` is inferred again, ``broadcast_to`` broadcasts the input with the traced
    shape, and a gather's slices keep their traced bounds (as MLX), one trace for all."""
    fun, ref = _REINFERRED[k]
    cf = mx.compile(fun, shapeless=True)
    for shape in [(4, 4), (6, 4), (4, 2)]:
        x = random_array(shape, mx.float32, rng(7))
        assert_close(cf(mx.array(x)), ref(x.astype(np.float64)))
    assert cf.cache.traces == 1


def test_shapeless_broadcast_to_broadcasts_with_the_traced_shape():
    # Traced at (1, 4) to (2, 1, 4); at (3, 4) the input and (2, 1, 4) broadcast to
    # (2, 3, 4), as MLX's shape rule says.
    cf = mx.compile(lambda x: mx.broadcast_to(x, (2, 1, 4)) - 1, shapeless=True)
    for shape in [(1, 4), (3, 4), (1, 1)]:
        x = random_array(shape, mx.float32, rng(12)).astype(np.float64)
        assert_close(cf(mx.array(x.astype(np.float32))),
                     np.broadcast_to(x, np.broadcast_shapes(x.shape, (2, 1, 4))) - 1)
    with pytest.raises(ArgumentError, match="BroadcastTo"):
        cf(mx.ones((3, 5)))
    assert cf.cache.traces == 1


def test_shapeless_reshape_keeps_traced_dimensions():
    # No -1: the traced shape stays (as MLX), so another size cannot reshape.
    cf = mx.compile(lambda x: x.reshape(4, 3) + 1, shapeless=True)
    assert_close(cf(mx.array(A)), np.array(A, np.float64).reshape(4, 3) + 1)
    x = random_array((2, 6), mx.float32, rng(8))
    assert_close(cf(mx.array(x)), x.astype(np.float64).reshape(4, 3) + 1)
    with pytest.raises(ArgumentError, match=r"reshape.*\(5, 2\)"):
        cf(mx.ones((5, 2)))
    # A reshape that is a no-op at the traced shape is kept for the other shapes.
    cf = mx.compile(lambda x: mx.reshape(x, (3, -1)) * 2, shapeless=True)
    assert_close(cf(mx.array(A)), np.array(A, np.float64) * 2)
    x = random_array((6, 2), mx.float32, rng(9))
    assert_close(cf(mx.array(x)), x.astype(np.float64).reshape(3, 4) * 2)


def test_shapeless_slice_updates_keep_traced_bounds():
    def f(x):
        x[1:3] = 0.0
        y = x.at[0].add(1.0)
        return y * 2

    cf = mx.compile(f, shapeless=True)
    for shape in [(4, 3), (6, 3), (5, 2)]:
        x = random_array(shape, mx.float32, rng(10)).astype(np.float64)
        want = x.copy()
        want[1:3, :3] = 0.0          # the traced block (columns 0..2), as MLX
        want[0, :3] += 1.0
        assert_close(cf(mx.array(x.astype(np.float32))), want * 2)
    assert cf.cache.traces == 1


def test_shapeless_gradients_see_reinferred_shapes():
    cf = mx.compile(lambda x: (x.reshape(-1, 2) ** 2).sum(axis=1), shapeless=True)
    for shape in [(2, 4), (3, 2)]:
        x = random_array(shape, mx.float32, rng(11))
        assert_close(mx.grad(lambda a: (cf(a) * mx.arange(a.size // 2)).sum())(mx.array(x)),
                     2 * x.astype(np.float64) * np.arange(x.size // 2).repeat(2).reshape(shape))


def test_shapeless_primitive_without_a_shape_rule():
    from lazyx.array import lazy
    from lazyx.device import to_stream
    from lazyx.primitive import Primitive

    class NoShapeRule(Primitive):
        def eval_cpu(self, inputs):
            return inputs[0]

    def f(x):
        return lazy(x.shape, x.dtype, NoShapeRule(to_stream(None)), (x,)) + 1

    with pytest.raises(TransformError, match="NoShapeRule"):
        mx.compile(f, shapeless=True)(mx.array(A))


# -- captured state -------------------------------------------------------------------
def _training_setup():
    g = rng(7)
    model = {"w": mx.array(g.standard_normal((4, 3)).astype(np.float32)),
             "b": mx.array(np.zeros(3, np.float32))}
    opt = {"m": {k: mx.zeros_like(v) for k, v in model.items()}, "step": mx.array(0)}
    x = mx.array(g.standard_normal((8, 4)).astype(np.float32))
    y = mx.array(g.standard_normal((8, 3)).astype(np.float32))
    return model, opt, x, y


def _step(model, opt, x, y):
    def loss_fn(params):
        return mx.mean(mx.square(x @ params["w"] + params["b"] - y))

    loss, grads = mx.value_and_grad(loss_fn)(model)
    for k in model:
        opt["m"][k] = 0.9 * opt["m"][k] + grads[k]
        model[k] = model[k] - 0.1 * opt["m"][k]
    opt["step"] = opt["step"] + 1
    return loss


def test_training_step_with_captured_state():
    model, opt, x, y = _training_setup()
    state = [model, opt]
    traces = []

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        traces.append(1)
        return _step(model, opt, x, y)

    ref_model, ref_opt, _, _ = _training_setup()
    for _ in range(4):
        loss = step(x, y)
        ref_loss = _step(ref_model, ref_opt, x, y)
        assert_close(loss, np.array(ref_loss), rtol=1e-5)
    for k in model:
        assert_close(model[k], np.array(ref_model[k]), rtol=1e-5, atol=1e-6)
        assert_close(opt["m"][k], np.array(ref_opt["m"][k]), rtol=1e-5, atol=1e-6)
    assert opt["step"].item() == 4
    assert len(traces) == 1
    # A new value (not a new signature) is read on the next call.
    model["b"] = mx.ones_like(model["b"])
    ref_model["b"] = mx.ones_like(ref_model["b"])
    assert_close(step(x, y), np.array(_step(ref_model, ref_opt, x, y)), rtol=1e-5)
    assert len(traces) == 1


def test_state_initialised_by_the_first_call_traces_again_once():
    # An optimizer whose state appears at its first update (as MLX's does).
    params = {"w": mx.array(V)}
    opt: dict = {}
    state = [params, opt]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(g):
        if "v" not in opt:
            opt["v"] = mx.zeros_like(params["w"])
        opt["v"] = opt["v"] + g
        params["w"] = params["w"] - opt["v"]
        return params["w"].sum()

    g = mx.array(np.ones(4, np.float32))
    for _ in range(3):
        step(g)
    assert_close(params["w"], V - 6)
    assert step.cache.traces == 2


def test_inputs_are_read_and_restored():
    params = {"w": mx.array(V)}
    f = mx.compile(lambda x: x * params["w"], inputs=params)
    assert_close(f(mx.array(A)), A * V)
    assert params["w"]._data is not None  # the trace put the array back
    params["w"] = mx.array(V * 2)
    assert_close(f(mx.array(A)), A * V * 2)
    assert f.cache.traces == 1


def test_outputs_without_inputs_use_the_traced_value():
    # MLX's semantics: state not declared in inputs= is a constant of the trace.
    st = [mx.array(1.0)]

    @partial(mx.compile, outputs=st)
    def f(x):
        st[0] = st[0] + x
        return x

    f(mx.array(1.0))
    f(mx.array(1.0))
    assert st[0].item() == 2.0


def test_outputs_structure_change_is_an_error():
    st = {"a": mx.array(1.0)}

    @partial(mx.compile, outputs=st)
    def f(x):
        st["a"] = x * 2
        return x

    f(mx.array(1.0))
    st["b"] = mx.array(0.0)
    with pytest.raises(ArgumentError, match="structure of the outputs"):
        f(mx.array(1.0))


def test_outputs_inside_a_tuple_is_an_error():
    st = [(mx.array(1.0),)]

    def f(x):
        return x

    with pytest.raises(ArgumentError, match="tuple"):
        mx.compile(f, outputs=st)(mx.array(1.0))


def test_undeclared_side_effect_cannot_be_evaluated():
    leaked = []

    @mx.compile
    def f(x):
        leaked.append(x * 2)
        return x + 1

    assert_close(f(mx.array(A)), A + 1)
    with pytest.raises(TransformError, match="outputs="):
        mx.eval(leaked[0])


# -- enable / disable -----------------------------------------------------------------
def test_disable_and_enable_compile():
    f = counted(lambda x: x * 2)
    cf = mx.compile(f)
    mx.disable_compile()
    try:
        assert_close(cf(mx.array(A)), A * 2)
        cf(mx.array(A))
        assert f.calls == 2 and cf.cache.traces == 0
    finally:
        mx.enable_compile()
    cf(mx.array(A))
    cf(mx.array(A))
    assert f.calls == 3 and cf.cache.traces == 1


@pytest.mark.parametrize("value, traced", [("1", False), ("0", True)])
def test_environment_variable(value, traced):
    code = ("import lazyx.core as mx\n"
            "n = []\n"
            "f = mx.compile(lambda x: (n.append(1), x + 1)[1])\n"
            "f(mx.array(1.0)); f(mx.array(1.0))\n"
            "print(len(n), f.cache.traces)\n")
    env = dict(os.environ, LAZYX_DISABLE_COMPILE=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == (["1", "1"] if traced else ["2", "0"])


# -- simplification ---------------------------------------------------------------------
def test_common_subexpressions_merge():
    cf = mx.compile(lambda x: mx.sin(x) * mx.sin(x) + mx.sin(x) * mx.sin(x))
    assert_close(cf(mx.array(A)), 2 * np.sin(A.astype(np.float64)) ** 2)
    tape = only_tape(cf)
    assert prims(tape, Sin) == 1 and prims(tape, Multiply) == 1


def test_different_parameters_or_inputs_do_not_merge():
    cf = mx.compile(lambda x, y: (mx.sum(x, axis=0), mx.sum(x, axis=1), mx.sum(x, axis=0,
                                  keepdims=True), mx.sin(x), mx.sin(y)))
    cf(mx.array(A), mx.array(B))
    tape = only_tape(cf)
    assert prims(tape, Reduce) == 3 and prims(tape, Sin) == 2


def test_random_draws_merge_only_with_the_same_key():
    def f(k1, k2):
        return (mx.random.uniform(shape=(4,), key=k1), mx.random.uniform(shape=(4,), key=k2),
                mx.random.uniform(shape=(4,), key=k1))

    cf = mx.compile(f)
    a, b, c = cf(mx.random.key(1), mx.random.key(2))
    assert np.array_equal(np.array(a), np.array(c)) and not np.allclose(a, b)
    assert prims(only_tape(cf), RandomBits) == 2


def test_constants_merge_by_value():
    cf = mx.compile(lambda x: x * mx.array(2.0) + x * mx.array(2.0) + x * mx.array(3.0))
    assert_close(cf(mx.array(A)), A * 7)
    assert prims(only_tape(cf), Multiply) == 2
    # Equal values of different dtypes, and large constants, stay apart.
    big = np.ones(1000, np.float32)
    cg = mx.compile(lambda x: (x * mx.array(2.0) + mx.astype(x * mx.array(2.0, mx.float16),
                                                              mx.float32),
                               x[0] * mx.array(big) + x[0] * mx.array(big)))
    cg(mx.array(V))
    assert prims(only_tape(cg), Multiply) == 4


def test_noops_are_removed():
    def f(x):
        y = mx.astype(x, mx.float32)
        y = mx.reshape(y, x.shape)
        y = mx.transpose(mx.transpose(y, (0, 1)))
        return mx.astype(y, mx.float16)

    cf = mx.compile(f)
    assert_close(cf(mx.array(A)), A.T, mx.float16)
    tape = only_tape(cf)
    assert prims(tape, Reshape) == 0 and prims(tape, AsType) == 1
    assert prims(tape, Transpose) == 1 and tape.nodes[0].prim.axes == (1, 0)


def test_stop_gradient_is_kept():
    def f(x):
        return mx.sum(x * mx.stop_gradient(x))

    assert_close(mx.grad(mx.compile(f))(mx.array(A)), A)
    assert_close(mx.compile(mx.grad(f))(mx.array(A)), A)


def test_plan_is_one_node_per_call():
    x = mx.array(A)
    y = mx.compile(lambda a: mx.exp(mx.sin(a) * 2 + 1))(x)
    # The inputs: the argument, then the constants 2 and 1.
    assert type(y._prim) is CompiledCall and len(y._inputs) == 3 and y._inputs[0] is x


# -- composition --------------------------------------------------------------------------
def _loss(x, w):
    return mx.sum(mx.tanh(x @ w) * mx.sin(x[:, :3]))


W = random_array((4, 3), mx.float32, rng(34))


def test_grad_of_compiled():
    x, w = mx.array(A), mx.array(W)
    expected = mx.grad(_loss, argnums=(0, 1))(x, w)
    got = mx.grad(mx.compile(_loss), argnums=(0, 1))(x, w)
    for g, e in zip(got, expected):
        assert_close(g, np.array(e), rtol=1e-5, atol=1e-5)  # float32, values up to 3


def test_compiled_grad():
    x, w = mx.array(A), mx.array(W)
    expected = mx.value_and_grad(_loss, argnums=1)(x, w)
    cf = mx.compile(mx.value_and_grad(_loss, argnums=1))
    for _ in range(2):
        v, g = cf(x, w)
        assert_close(v, np.array(expected[0]), rtol=1e-5)
        assert_close(g, np.array(expected[1]), rtol=1e-5, atol=1e-5)


def test_second_derivatives_through_compile():
    f = lambda x: mx.sum(mx.sin(x) * x)  # noqa: E731
    x = mx.array(V)
    expected = mx.grad(lambda y: mx.sum(mx.grad(f)(y)))(x)
    assert_close(mx.grad(lambda y: mx.sum(mx.grad(mx.compile(f))(y)))(x), np.array(expected))
    assert_close(mx.grad(lambda y: mx.sum(mx.compile(mx.grad(f))(y)))(x), np.array(expected))


def test_gradient_flows_to_captured_arrays():
    x = mx.array(A)
    w = mx.array(W)
    got = mx.grad(lambda w_: mx.sum(mx.compile(lambda a: a @ w_)(x)))(w)
    assert_close(got, np.array(mx.grad(lambda w_: mx.sum(x @ w_))(w)))


def test_jvp_of_compiled():
    x, t = mx.array(A), mx.array(B)
    f = lambda a: mx.exp(a) * mx.sum(a, axis=0)  # noqa: E731
    assert_close(mx.jvp(mx.compile(f), [x], [t])[1][0], np.array(mx.jvp(f, [x], [t])[1][0]),
                 rtol=1e-5)


def test_vmap_of_compiled():
    f = lambda a, b: mx.sum(mx.sin(a) * b, axis=-1)  # noqa: E731
    x, y = mx.array(A), mx.array(V)
    expected = mx.vmap(f, in_axes=(1, None))(x, y[:3])
    assert_close(mx.vmap(mx.compile(f), in_axes=(1, None))(x, y[:3]), np.array(expected))
    assert_close(mx.compile(mx.vmap(f, in_axes=(1, None)))(x, y[:3]), np.array(expected))


def test_compiled_inside_compiled_is_inlined():
    inner = mx.compile(lambda a: mx.sin(a) * 2)
    outer = mx.compile(lambda a: inner(a) + inner(a))
    assert_close(outer(mx.array(A)), 4 * np.sin(A.astype(np.float64)))
    tape = only_tape(outer)
    assert prims(tape, CompiledCall) == 0 and prims(tape, Sin) == 1


def test_custom_function_inside_compile_keeps_its_rule():
    @mx.custom_function
    def f(x):
        return mx.sin(x)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        return cotangent * 10

    x = mx.array(V)
    assert_close(mx.compile(lambda a: f(a) * 2)(x), 2 * np.sin(V.astype(np.float64)))
    assert_close(mx.grad(mx.compile(lambda a: mx.sum(f(a))))(x), np.full(4, 10.0))
    assert_close(mx.compile(mx.grad(lambda a: mx.sum(f(a))))(x), np.full(4, 10.0))


def test_checkpoint_inside_compile():
    f = lambda a: mx.sum(mx.checkpoint(lambda b: mx.sin(b) * b)(a))  # noqa: E731
    x = mx.array(V)
    expected = mx.grad(f)(x)
    assert_close(mx.compile(mx.grad(f))(x), np.array(expected))


# -- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("fun", [lambda x: 3, lambda x: (x, "a"), lambda x: [x, {"k": 1.5}]])
def test_non_array_returns(fun):
    with pytest.raises(ArgumentError, match="must return arrays"):
        mx.compile(fun)(mx.array(A))


@pytest.mark.parametrize("evaluate", [lambda y: y.item(), lambda y: print(y), mx.eval,
                                      lambda y: np.array(y)])
def test_evaluating_inside_is_an_error(evaluate):
    def f(x):
        y = mx.sum(x)
        evaluate(y)
        return y

    with pytest.raises(TransformError, match="Attempting to eval an array during"):
        mx.compile(f)(mx.array(A))
    # Values that do not depend on the inputs can be evaluated while tracing.
    c = mx.array(2.0)
    assert_close(mx.compile(lambda x: x * (c * 2).item())(mx.array(A)), A * 4)


def test_unsupported_argument_types():
    with pytest.raises(ArgumentError, match="ndarray"):
        mx.compile(lambda x, y: x)(mx.array(A), np.ones(3))
    with pytest.raises(ArgumentError, match="callable"):
        mx.compile(3)
    with pytest.raises(ArgumentError, match="inputs"):
        mx.compile(lambda x: x, inputs=mx.array(1.0))


def test_failed_trace_restores_the_inputs():
    params = {"w": mx.array(V)}

    def f(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        mx.compile(f, inputs=params)(mx.array(A))
    assert params["w"]._data is not None


def test_transforms_of_a_compiled_call_are_compiled_calls():
    cf = mx.compile(lambda a: mx.sum(mx.sin(a) * a))
    x = mx.array(V)
    g = mx.grad(cf)(x)
    b = mx.vmap(cf)(mx.array(A))
    assert type(g._prim) is CompiledCall and type(b._prim) is CompiledCall
    assert_close(g, np.array(mx.grad(lambda a: mx.sum(mx.sin(a) * a))(x)))
    assert_close(b, (np.sin(A.astype(np.float64)) * A).sum(1))


def test_rules_against_finite_differences_and_loops():
    f = mx.compile(lambda x, y: [mx.tanh(x @ y) * mx.sum(x), mx.exp(y)[0]])
    x = random_array((3, 4), mx.float64, rng(41), -1.0, 1.0)
    y = random_array((4, 2), mx.float64, rng(42), -1.0, 1.0)
    check_vjp_fd(f, x, y)
    check_jvp_vjp(f, x, y)
    check_vmap_loop(f, x, y, in_axes=(0, None))
    check_vmap_loop(f, np.stack([x, x * 0.5], -1), np.stack([y, y * 2], -1), in_axes=-1)


def test_random_state_captured_as_in_mlx():
    state = mx.random.state

    @partial(mx.compile, inputs=state, outputs=state)
    def noisy(x):
        return x + mx.random.uniform(shape=(4,)) + mx.random.normal((4,))

    mx.random.seed(11)
    got = [np.array(noisy(mx.array(V))) for _ in range(3)]
    mx.random.seed(11)
    expected = [np.array(mx.array(V) + mx.random.uniform(shape=(4,)) + mx.random.normal((4,)))
                for _ in range(3)]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert noisy.cache.traces == 1
    # Without the state captured, the draw is a constant of the trace (MLX's behaviour).
    fixed = mx.compile(lambda x: x + mx.random.uniform(shape=(4,)))
    assert np.array_equal(np.array(fixed(mx.array(V))), np.array(fixed(mx.array(V))))


def test_the_plan_frees_intermediates(monkeypatch):
    from lazyx.transforms import compile as compile_mod
    monkeypatch.setattr(compile_mod, "FUSE", False)  # the plan itself, node by node

    def f(a):
        for _ in range(10):
            a = mx.sin(a) * 1.5
        return a

    x = mx.array(np.ones(1 << 18, np.float32))
    cf = mx.compile(f)
    mx.eval(x, cf(x))
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    y = cf(x)
    mx.eval(y)
    # 20 intermediates of 1 MB each, but at most two alive at once (plus the output).
    assert mx.get_peak_memory() - base <= 3 * x.nbytes
    assert_close(y, np.array(f(x)))


@pytest.mark.parametrize("shapeless", [False, True])
def test_full_like_fuses_into_its_consumers(shapeless):
    """``ones_like``/``full_like`` in a trace (FullLike) is an element-wise expression:
    with its consumers it is one fused node, whose loop takes the first input's shape
    (the values broadcast to it), at every shape of a shapeless compile."""
    from lazyx.transforms.fusion import Compiled
    f = mx.compile(lambda x: mx.ones_like(x) * 2 - mx.full_like(x, 0.5) * x,
                   shapeless=shapeless)
    for n in ((3, 4), (300, 700), (5, 1)) if shapeless else ((3, 4),):
        x = np.random.default_rng(n[0]).standard_normal(n).astype(np.float32)
        got = f(mx.array(x))
        assert got.shape == n
        assert_close(got, 2.0 - 0.5 * x.astype(np.float64))
    (entry,) = f.cache.entries.values()
    assert [type(n.prim) for n in entry.run_tape.nodes] == [Compiled]


@pytest.mark.parametrize("shapeless", [False, True])
def test_element_counts_are_constants_at_fixed_shapes(shapeless):
    """``mean``, ``var`` and ``std`` count elements with a NumberOfElements node. At
    fixed shapes (a new shape traces again) the plan holds the count as a constant,
    which fuses into its readers; a shapeless plan keeps the node, to count at each
    call's shapes. The unfused tape keeps it either way: it is what an outer shapeless
    trace inlines."""
    from lazyx.plugins.reductions import NumberOfElements

    def fun(x):
        return mx.mean(x, axis=1), mx.var(x), mx.std(x, axis=0, ddof=1), mx.mean(x * x)

    f = mx.compile(fun, shapeless=shapeless)
    for n in ((3, 4), (5, 7)):
        a = np.random.default_rng(n[0]).standard_normal(n)
        got = f(mx.array(a.astype(np.float32)))
        for g, want in zip(got, (a.mean(1), a.var(), a.std(0, ddof=1), (a * a).mean())):
            assert_close(g, want)
    entries = list(f.cache.entries.values())
    assert len(entries) == (1 if shapeless else 2)

    def counts(tape):
        return sum(type(n.prim) is NumberOfElements for n in tape.nodes)
    for e in entries:
        assert counts(e.tape) > 0
        assert (counts(e.run_tape) > 0) == shapeless


def test_a_fixed_shape_compile_inlined_into_a_shapeless_one_counts_at_each_shape():
    inner = mx.compile(lambda x: x - mx.mean(x))
    x3 = np.arange(3, dtype=np.float32)
    assert_close(inner(mx.array(x3)), x3 - 1.0)  # traced (and planned) at shape (3,)
    outer = mx.compile(lambda x: inner(x) * 2, shapeless=True)
    for n in (3, 5, 8):
        a = np.arange(n, dtype=np.float32)
        assert_close(outer(mx.array(a)), (a - a.mean()) * 2.0)


def test_nodes_of_constants_alone_are_computed_once_at_the_trace(monkeypatch):
    """Once an element count is a constant, an element-wise node whose inputs are then
    all constants and whose outputs are small is evaluated when the function is traced
    (``var``'s ``max(n - ddof, 0)``); a larger output stays a node (it would be held for
    good), and so does a node that is not element-wise (a broadcast)."""
    from lazyx.plugins.reductions import number_of_elements
    from lazyx.transforms import compile as C
    monkeypatch.setattr(C, "FUSE", False)  # the plan's nodes as traced

    def fun(x):
        n = number_of_elements(x, (0,), False, mx.float32)
        return mx.var(x, ddof=1), x * mx.broadcast_to(n, (3,)), (n + 1) * mx.ones((65,))

    def of_constants(t):
        return [t.shapes[n.outputs[0]] for n in t.nodes if all(i in t.constants for i in n.inputs)]

    x = np.array([2.0, -1.0, 4.0], np.float32)
    for bound, left in ((C.FOLD_MAX_ELEMENTS, [(3,), (65,)]), (0, [(), (), (3,)])):
        monkeypatch.setattr(C, "FOLD_MAX_ELEMENTS", bound)
        f = mx.compile(lambda x: fun(x))  # a new function: a trace of its own
        v, scaled, wide = f(mx.array(x))
        assert_close(v, x.astype(np.float64).var(ddof=1))
        assert_close(scaled, x * 3.0)
        assert_close(wide, np.full(65, 4.0))
        (entry,) = f.cache.entries.values()
        assert sorted(of_constants(entry.run_tape)) == left


def test_a_constant_node_whose_evaluation_raises_stays_in_the_plan(monkeypatch):
    from lazyx.errors import LazyxError
    from lazyx.plugins.reductions import number_of_elements
    from lazyx.transforms import compile as C
    monkeypatch.setattr(C, "FUSE", False)
    tried = []

    def failing(*arrays):
        tried.append(arrays)
        raise LazyxError("no kernel at the trace")
    f = mx.compile(lambda x: x * (number_of_elements(x, (0,), False, mx.float32) + 1))
    monkeypatch.setattr(C._scheduler, "eval", failing)
    y = f(mx.array(np.ones(4, np.float32)))  # traced: the fold tries n + 1 and fails
    monkeypatch.undo()
    monkeypatch.setattr(C, "FUSE", False)
    assert tried
    assert_close(y, np.full(4, 5.0))
    (entry,) = f.cache.entries.values()
    t = entry.run_tape
    assert any(all(i in t.constants for i in n.inputs) for n in t.nodes)
