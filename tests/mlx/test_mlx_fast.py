"""``lazyx.core.fast`` against ``mlx.core.fast`` 0.32.2: values, dtypes, gradients and
the bad-input exception types of the same calls on both."""

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

GEN = np.random.default_rng(15)
X = GEN.standard_normal((2, 3, 5, 16)).astype(np.float32)
W, B = GEN.standard_normal(16).astype(np.float32), GEN.standard_normal(16).astype(np.float32)
Q = GEN.standard_normal((2, 4, 6, 8)).astype(np.float32)
K = GEN.standard_normal((2, 2, 7, 8)).astype(np.float32)
V = GEN.standard_normal((2, 2, 7, 5)).astype(np.float32)
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ["rms", "rms_none", "ln", "ln_bias", "ln_none"])
def test_norms(dtype, case):
    def fn(m):
        x, w, b = (m.array(a).astype(getattr(m, dtype)) for a in (X, W, B))
        return {"rms": lambda: m.fast.rms_norm(x, w, 1e-5),
                "rms_none": lambda: m.fast.rms_norm(x, None, 1e-5),
                "ln": lambda: m.fast.layer_norm(x, w, b, 1e-5),
                "ln_bias": lambda: m.fast.layer_norm(x, None, m.array(B), 1e-5),
                "ln_none": lambda: m.fast.layer_norm(x, None, None, 1e-5)}[case]()
    # MLX's CPU rounds some intermediate steps to the half type; lazyx rounds once from
    # float32: a few outputs near zero differ by an ulp of the half type.
    same(fn, **{"float32": TOL, "float16": {"atol": 4e-3}, "bfloat16": {"atol": 4e-2}}[dtype])


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("kw", [{"dims": 16, "offset": 2}, {"dims": 8, "offset": "vec"},
                                {"dims": 6, "offset": 1, "freqs": True}], ids=str)
def test_rope(traditional, kw):
    def fn(m):
        off = m.array([1, 4]) if kw["offset"] == "vec" else kw["offset"]
        freqs = m.array(GEN_F[: kw["dims"] // 2]) if kw.get("freqs") else None
        return m.fast.rope(m.array(X), kw["dims"], traditional=traditional,
                           base=None if freqs is not None else 1000.0, scale=0.8, offset=off,
                           freqs=freqs)
    same(fn, **TOL)


GEN_F = np.linspace(0.5, 3.0, 8).astype(np.float32)


@pytest.mark.parametrize("mask", [None, "causal", "add", "bool"])
@pytest.mark.parametrize("sinks", [False, True])
def test_attention(mask, sinks):
    def fn(m):
        mm = {"add": m.array(GEN.standard_normal((6, 7)).astype(np.float32) * 0 + 0.5),
              "bool": m.array(np.tril(np.ones((6, 7), bool)))}.get(mask, mask)
        sk = m.array(np.linspace(-1, 1, 4).astype(np.float32)) if sinks else None
        return m.fast.scaled_dot_product_attention(m.array(Q), m.array(K), m.array(V), scale=0.3,
                                                   mask=mm, sinks=sk)
    same(fn, **TOL)


def test_gradients():
    def fn(m):
        def loss(x, w, q, k, v):
            y = m.fast.rms_norm(x, w, 1e-5) + m.fast.layer_norm(x, w, None, 1e-5)
            r = m.fast.rope(y, 8, traditional=False, base=100.0, scale=1.0, offset=3)
            a = m.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal")
            return (r * r).sum() + (a * a).sum()
        return m.grad(loss, argnums=(0, 1, 2, 3, 4))(*(m.array(a) for a in (X, W, Q, K, V)))
    same(fn, rtol=1e-4, atol=1e-4)


def test_cross_entropy():
    t = GEN.integers(0, 16, (2, 3, 5)).astype(np.int32)
    same(lambda m: m.fast.cross_entropy(m.array(X), m.array(t)), **TOL)
    same(lambda m: m.grad(lambda x: m.fast.cross_entropy(x, m.array(t)).sum())(m.array(X)), **TOL)


BAD = [
    lambda m: m.fast.rms_norm(m.array(X), m.ones((5,)), 1e-5),
    lambda m: m.fast.rms_norm(m.array(X).astype(m.int32), None, 1e-5),
    lambda m: m.fast.layer_norm(m.array(X), None, m.ones((1, 16)), 1e-5),
    lambda m: m.fast.rope(m.array(X), 7, traditional=False, base=1.0, scale=1.0, offset=0),
    lambda m: m.fast.rope(m.array(X), 18, traditional=False, base=1.0, scale=1.0, offset=0),
    lambda m: m.fast.rope(m.ones((4, 4)), 4, traditional=False, base=1.0, scale=1.0, offset=0),
    lambda m: m.fast.rope(m.array(X), 4, traditional=False, base=None, scale=1.0, offset=0),
    lambda m: m.fast.scaled_dot_product_attention(m.array(Q), m.ones((2, 3, 7, 8)),
                                                  m.ones((2, 3, 7, 5)), scale=1.0),
    lambda m: m.fast.scaled_dot_product_attention(m.array(Q), m.array(K), m.array(V), scale=1.0,
                                                  mask=m.zeros((6, 6))),
    lambda m: m.fast.scaled_dot_product_attention(m.array(Q), m.array(K), m.array(V), scale=1.0,
                                                  mask="upper"),
    lambda m: m.fast.scaled_dot_product_attention(m.array(Q), m.array(K), m.array(V), scale=1.0,
                                                  sinks=m.zeros((3,))),
    lambda m: m.fast.cross_entropy(m.array(X), m.zeros((2, 3), m.int32)),
    lambda m: m.fast.cross_entropy(m.array(X), m.zeros((2, 3, 5))),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_input(k):
    assert same(BAD[k]) is None
