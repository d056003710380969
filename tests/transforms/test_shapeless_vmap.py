"""vmap of the reductions that count elements (mean, var, std) inside a shapeless
compile, and a shapeless compile inside vmap, replayed at a new batch size: the count
is an unbatched value that vmap keeps unbatched (broadcasting it to the traced batch
size would bake that size into the tape)."""

import numpy as np
import pytest

import lazyx.core as mx

SHAPES = [(4, 3), (6, 5), (1, 7)]


def data(shape):
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 0.37 - 1) % 3


CASES = [
    ("mean", lambda x: mx.mean(x), lambda a: a.mean(axis=1)),
    ("mean axis 0", lambda x: mx.mean(x, axis=0), lambda a: a.mean(axis=1)),
    ("var", lambda x: mx.var(x), lambda a: a.var(axis=1)),
    ("std ddof=1", lambda x: mx.std(x, ddof=1), lambda a: a.std(axis=1, ddof=1)),
    ("x - mean", lambda x: x - mx.mean(x), lambda a: a - a.mean(axis=1, keepdims=True)),
    ("mean keepdims * x", lambda x: mx.mean(x, keepdims=True) * x,
     lambda a: a.mean(axis=1, keepdims=True) * a),
]


@pytest.mark.parametrize("name, fun, ref", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("nesting", ["compile(vmap)", "vmap(compile)"])
def test_vmapped_counts_follow_each_calls_shapes(name, fun, ref, nesting):
    if nesting == "compile(vmap)":
        f = mx.compile(mx.vmap(fun), shapeless=True)
    else:
        f = mx.vmap(mx.compile(fun, shapeless=True))
    for s in SHAPES:
        a = data(s)
        got = np.asarray(f(mx.array(a.astype(np.float32))))
        np.testing.assert_allclose(got, ref(a), rtol=1e-5, atol=1e-5, err_msg=f"shape {s}")


def test_vmap_over_axis_1_at_a_new_size():
    f = mx.compile(mx.vmap(lambda x: mx.mean(x), in_axes=1), shapeless=True)
    for s in SHAPES:
        a = data(s)
        np.testing.assert_allclose(np.asarray(f(mx.array(a.astype(np.float32)))),
                                   a.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_an_unbatched_output_is_broadcast_and_out_axes_none_is_allowed():
    # The count does not depend on the examples: out_axes=None returns it as it is,
    # out_axes=0 repeats it once per example.
    count = lambda x: mx.mean(mx.zeros_like(x) + 1)  # noqa: E731
    f = mx.compile(mx.vmap(count, out_axes=0), shapeless=True)
    for s in SHAPES:
        np.testing.assert_allclose(np.asarray(f(mx.array(data(s).astype(np.float32)))),
                                   np.ones(s[0]))
