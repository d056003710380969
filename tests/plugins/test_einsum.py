"""einsum and einsum_path (plugins/products.py): values against ``np.einsum`` in float64
over many subscripts (ellipses, repeated indices and traces, broadcasting, implicit
output, chains the path optimiser reorders), gradients against finite differences,
vmap against a Python loop, compile, and the errors of bad subscripts."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lazyx.core as mx
from helpers import assert_close, check_vjp_fd, check_vmap_loop, random_array, rng

# (subscripts, operand shapes)
CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),                       # implicit output
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("ii", [(3, 3)]),                                  # trace
    ("ii->i", [(3, 3)]),                               # diagonal
    ("iji->j", [(2, 3, 2)]),
    ("ijij->ij", [(2, 3, 2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("i,i", [(4,), (4,)]),
    ("i,j->ij", [(2,), (3,)]),                         # outer product
    ("i,->i", [(3,), ()]),                             # a scalar operand
    ("...i,...i", [(2, 3), (5, 1, 3)]),                # ellipsis broadcasting
    ("...ij,...jk->...ik", [(4, 2, 3), (3, 5)]),
    ("i...,i...->...", [(3, 2, 2), (3, 2, 2)]),
    ("ij,ij->ij", [(2, 3), (1, 3)]),                   # size-1 broadcasting
    ("ij,jk", [(2, 1), (3, 4)]),                       # a contracted index of size 1
    ("bij,bjk->bik", [(1, 2, 3), (4, 3, 5)]),
    ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,bcd,cde,ea->", [(2, 3, 4), (3, 4, 5), (4, 5, 2), (2, 2)]),
    ("a,a,a->", [(3,), (3,), (3,)]),
    ("ab,bc,cd,de,ef,fa->", [(2, 3), (3, 2), (2, 3), (3, 2), (2, 3), (3, 2)]),
    ("ii,jj->ij", [(3, 3), (2, 2)]),
    ("AbC,Cb->A", [(2, 3, 4), (4, 3)]),                # upper-case letters
    (" ij , jk -> ik ", [(2, 3), (3, 4)]),             # spaces
]


def _operands(shapes, seed, dtype=mx.float32):
    g = rng(seed)
    return [random_array(s, dtype, g, -2.0, 2.0) for s in shapes]


@pytest.mark.parametrize("subscripts,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(subscripts, shapes):
    xs = _operands(shapes, 0)
    want = np.einsum(subscripts, *[x.astype(np.float64) for x in xs])
    assert_close(mx.einsum(subscripts, *[mx.array(x) for x in xs]), want, mx.float32,
                 msg=subscripts)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float64, mx.complex64],
                         ids=lambda d: d.name)
def test_einsum_dtypes(dtype):
    xs = _operands([(2, 3, 4), (2, 4, 5)], 1, dtype)
    want = np.einsum("bij,bjk->bik", *[x.astype(np.complex128 if dtype.kind == "c"
                                                 else np.float64) for x in xs])
    assert_close(mx.einsum("bij,bjk->bik", *[mx.array(x, dtype) for x in xs]), want, dtype)


def test_einsum_integers_follow_matmul():
    a = mx.array(np.arange(6, dtype=np.int32).reshape(2, 3))
    # No contraction: a broadcast product, so integers work (as in MLX) ...
    assert_close(mx.einsum("ij,k->ijk", a, mx.array([1, 2], mx.int32)),
                 np.einsum("ij,k->ijk", np.array(a), np.array([1, 2])), mx.int32)
    assert_close(mx.einsum("ii", mx.array(np.eye(3, dtype=np.int32))), np.array(3), mx.int32)
    # ... a contraction is a matmul, which takes only inexact dtypes (as in MLX).
    with pytest.raises(ValueError, match="matmul"):
        mx.einsum("ij,jk", a, mx.array(np.ones((3, 2), np.int32)))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_einsum_random_contractions(data):
    letters = "abcde"
    sizes = {c: data.draw(st.integers(1, 3), label=f"size {c}") for c in letters}
    n_ops = data.draw(st.integers(1, 4), label="operands")
    terms = [data.draw(st.text(letters, min_size=0, max_size=3), label=f"term {k}")
             for k in range(n_ops)]
    seen = sorted(set("".join(terms)))
    out = "".join(c for c in seen if data.draw(st.booleans(), label=f"keep {c}"))
    subscripts = ",".join(terms) + "->" + out
    xs = _operands([[sizes[c] for c in t] for t in terms], 2, mx.float64)
    want = np.einsum(subscripts, *xs)
    assert_close(mx.einsum(subscripts, *[mx.array(x, mx.float64) for x in xs]), want,
                 mx.float64, msg=subscripts)


def test_einsum_path_orders_a_chain():
    xs = [mx.zeros(s) for s in [(2, 3), (3, 4), (4, 5)]]
    path, info = mx.einsum_path("ij,jk,kl->il", *xs)
    assert path == [(1, 2), (0, 1)]
    assert "Naive FLOP count:  360" in info and "Optimized FLOP count:  180" in info
    assert mx.einsum_path("ij,jk", *xs[:2])[0] == [(0, 1)]
    assert mx.einsum_path("ii", mx.zeros((3, 3)))[0] == [(0,)]


@pytest.mark.parametrize("subscripts,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("...i,...i", [(2, 3), (1, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 2), (2, 2)]), ("i,j->ij", [(2,), (3,)]),
    ("ij,ij->", [(2, 3), (1, 3)])], ids=lambda v: v if isinstance(v, str) else "")
def test_einsum_gradients(subscripts, shapes):
    xs = _operands(shapes, 3, mx.float64)
    check_vjp_fd(lambda *a: mx.einsum(subscripts, *a), *xs, msg=subscripts)


def test_einsum_vmap():
    g = rng(4)
    q = random_array((3, 2, 4, 5), mx.float32, g)
    k = random_array((2, 6, 5, 3), mx.float32, g)
    check_vmap_loop(lambda a, b: mx.einsum("hqd,hkd->hqk", a, b), q, k, in_axes=(0, 3))
    check_vmap_loop(lambda a: mx.einsum("ii->i", a), random_array((4, 3, 3), mx.float32, g))


def test_einsum_compiles():
    g = rng(5)
    a, b = random_array((2, 3), mx.float32, g), random_array((3, 4), mx.float32, g)
    f = mx.compile(lambda x, y: mx.einsum("ij,jk->ki", x, y) * 2.0)
    assert_close(f(mx.array(a), mx.array(b)),
                 2 * np.einsum("ij,jk->ki", a.astype(np.float64), b), mx.float32)


@pytest.mark.parametrize("subscripts,shapes,match", [
    ("ij,jk", [(2, 3), (4, 4)], "broadcast dimension 0 of input 1"),
    ("ii", [(2, 3)], "repeated subscripts"),
    ("ijk", [(2, 3)], "Invalid number of subscripts 3 .* for input 0"),
    ("ij", [(2, 3), (3,)], "Number of operands, 2"),
    ("i1", [(2, 3)], "must be letters"),
    ("......", [(2, 3)], "Only one ellipsis"),
    ("ij...", [(2,)], "insufficient dimensions"),
    ("ij,jk->ii", [(2, 3), (3, 4)], "Repeat indices not allowed in output"),
    ("ij,jk->iz", [(2, 3), (3, 4)], "'z' does not appear"),
    ("ij", [], "At least one operand"),
])
@pytest.mark.parametrize("fn", ["einsum", "einsum_path"])
def test_einsum_bad_subscripts(fn, subscripts, shapes, match):
    with pytest.raises(ValueError, match=match) as info:
        getattr(mx, fn)(subscripts, *[mx.zeros(s) for s in shapes])
    assert f"[{fn}]" in str(info.value)
