"""The checks lazyx's own test suite runs, for plugin authors to run too.

* data: :func:`random_array` (random NumPy data of a lazyx dtype), :func:`to_lazyx`,
  the dtype lists (``ALL_DTYPES``, ``FLOAT_DTYPES`` ...) and ``TOLERANCES``;
* comparison with NumPy: :func:`assert_close`, :func:`check_op` (run an op on
  lazyx copies of NumPy inputs and compare with a NumPy reference in float64);
* transforms: :func:`check_vjp_fd` (``vjp`` against central finite
  differences), :func:`check_jvp_vjp` (``<u, J v> == <J^T u, v>``) and
  :func:`check_vmap_loop` (``vmap`` against a Python loop).

``tests/helpers.py`` re-exports these names for lazyx's own tests.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import lazyx.core as mx

__all__ = ["ALL_DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "SIGNED_DTYPES", "REAL_DTYPES",
           "NUMERIC_DTYPES", "TOLERANCES", "rng", "random_array", "reference_dtype", "to_lazyx",
           "assert_close", "check_op", "check_vjp_fd", "check_jvp_vjp", "check_vmap_loop",
           "has_rules"]

ALL_DTYPES = [mx.bool_, mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16,
              mx.int32, mx.int64, mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.complex64]
FLOAT_DTYPES = [mx.float16, mx.bfloat16, mx.float32, mx.float64]
INT_DTYPES = [mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16, mx.int32, mx.int64]
SIGNED_DTYPES = [mx.int8, mx.int16, mx.int32, mx.int64]
REAL_DTYPES = [mx.bool_] + INT_DTYPES + FLOAT_DTYPES
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES

# (rtol, atol) by result dtype.
TOLERANCES = {
    "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (2e-5, 1e-6),
    "float64": (1e-12, 1e-12), "complex64": (2e-5, 1e-6),
}


def rng(seed: int = 0) -> np.random.Generator:
    """A NumPy random generator seeded with ``seed``, so a test's data is the same every run."""
    return np.random.default_rng(seed)


def random_array(shape, dtype, gen=None, low=-4.0, high=4.0) -> np.ndarray:
    """Random NumPy data of lazyx dtype ``dtype`` (bool, ints in a safe range, floats in [low, high))."""
    gen = gen if gen is not None else rng()
    npd = dtype.np
    if dtype.kind == "b":
        return gen.random(shape) < 0.5
    if dtype.kind == "u":
        hi = max(1, min(int(high), 100)) if high > 0 else 10
        return gen.integers(0, hi + 1, size=shape).astype(npd)
    if dtype.kind == "i":
        lo, hi = int(np.floor(low)), int(np.ceil(high))
        return gen.integers(max(lo, -100), min(hi, 100) + 1, size=shape).astype(npd)
    if dtype.kind == "c":
        return (gen.uniform(low, high, size=shape) + 1j * gen.uniform(low, high, size=shape)).astype(npd)
    return gen.uniform(low, high, size=shape).astype(npd)


def reference_dtype(npd: np.dtype) -> np.dtype:
    """The dtype NumPy references are computed in for inputs of ``npd``."""
    if npd.kind == "f" or npd == np.dtype(ml_dtypes.bfloat16):
        return np.dtype(np.float64)
    if npd.kind == "c":
        return np.dtype(np.complex128)
    return npd


def to_lazyx(x: np.ndarray) -> mx.array:
    """A lazyx array with exactly ``x``'s dtype (float64 stays float64)."""
    from lazyx.dtypes import from_numpy
    return mx.array(x, dtype=from_numpy(x.dtype))


def assert_close(actual, expected, dtype=None, rtol=None, atol=None, msg=""):
    """Assert lazyx result ``actual`` equals NumPy ``expected`` in shape, dtype and value."""
    assert isinstance(actual, mx.array), f"{msg}: expected a lazyx array, got {type(actual)}"
    expected = np.asarray(expected)
    if dtype is not None:
        assert actual.dtype == dtype, f"{msg}: dtype {actual.dtype}, expected {dtype}"
    got = np.array(actual)
    assert got.shape == expected.shape, f"{msg}: shape {got.shape}, expected {expected.shape}"
    d = actual.dtype
    if d.kind in "fc":
        r, a = TOLERANCES[d.name]
        r = rtol if rtol is not None else r
        a = atol if atol is not None else a
        exp_cast = expected.astype(d.np).astype(np.complex128 if d.kind == "c" else np.float64)
        got64 = got.astype(np.complex128 if d.kind == "c" else np.float64)
        np.testing.assert_allclose(got64, exp_cast, rtol=r, atol=a, equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(got, expected.astype(d.np), err_msg=msg)


def check_op(lx_fn, np_fn, *inputs, dtype=None, rtol=None, atol=None, upcast=True, msg=""):
    """Run ``lx_fn`` on lazyx copies of NumPy ``inputs`` and compare with ``np_fn``.

    Args:
        lx_fn: the lazyx op (called with lazyx arrays).
        np_fn: the NumPy reference (called with NumPy arrays, upcast to float64
            for floating inputs when ``upcast``).
        inputs: NumPy arrays (or Python scalars, passed through unchanged).
        dtype: the lazyx dtype the result must have (None: not checked).
    Returns:
        the lazyx result.
    """
    lx_in = [to_lazyx(x) if isinstance(x, np.ndarray) else x for x in inputs]
    ref_in = [x.astype(reference_dtype(x.dtype)) if upcast and isinstance(x, np.ndarray) else x
              for x in inputs]
    with np.errstate(all="ignore"):
        expected = np_fn(*ref_in)
    out = lx_fn(*lx_in)
    if isinstance(out, (tuple, list)):
        for i, (o, e) in enumerate(zip(out, expected)):
            assert_close(o, e, None if dtype is None else (dtype[i] if isinstance(dtype, (list, tuple)) else dtype),
                         rtol, atol, f"{msg} output {i}")
    else:
        assert_close(out, expected, dtype, rtol, atol, msg)
    return out


# -- transform checks ------------------------------------------------------------------
def _as_outputs(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _inexact(a) -> bool:
    return a.dtype.kind in "fc"


def check_vjp_fd(fun, *inputs, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0, max_elements=64, msg=""):
    """Check ``mx.vjp`` of ``fun`` against central finite differences, in float64.

    ``fun`` takes lazyx arrays (one per NumPy array in ``inputs``, converted to
    float64) and returns an array or a list of arrays. With random cotangents
    ``u``, each element of each vjp must equal ``<u, (f(x + eps e) - f(x - eps e)) / 2 eps>``.
    Integer and bool outputs are left out. Inputs with more than ``max_elements``
    elements in all are checked along random directions instead of per element.
    """
    gen = rng(seed)
    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    outs = _as_outputs(fun(*[mx.array(x, dtype=mx.float64) for x in xs]))
    # Non-finite outputs (an exclusive cummax starts at -inf) get zero cotangents.
    us = [gen.standard_normal(o.shape) * np.isfinite(np.array(o)) if _inexact(o)
          else np.zeros(o.shape) for o in outs]
    cots = [mx.array(u, dtype=o.dtype) if _inexact(o) else mx.zeros_like(o)
            for u, o in zip(us, outs)]
    _, vjps = mx.vjp(fun, [mx.array(x, dtype=mx.float64) for x in xs], cots)
    got = [np.array(v, dtype=np.float64) for v in vjps]
    for k, (x, g) in enumerate(zip(xs, got)):
        assert g.shape == x.shape, f"{msg}: vjp {k} has shape {g.shape}, input {x.shape}"
        assert vjps[k].dtype == mx.float64, f"{msg}: vjp {k} has dtype {vjps[k].dtype}"

    def directional(d_list):
        def at(sign):
            ys = [mx.array(x + sign * eps * d, dtype=mx.float64) for x, d in zip(xs, d_list)]
            return [np.array(o, dtype=np.float64) for o in _as_outputs(fun(*ys))]
        plus, minus = at(1.0), at(-1.0)
        with np.errstate(invalid="ignore"):
            return sum(float(np.sum(np.where(u != 0, u * (p - m), 0.0))) / (2 * eps)
                       for u, p, m, o in zip(us, plus, minus, outs) if _inexact(o))

    total = sum(x.size for x in xs)
    if total <= max_elements:
        for k, x in enumerate(xs):
            fd = np.zeros(x.shape)
            for idx in np.ndindex(*x.shape):
                d_list = [np.zeros(y.shape) for y in xs]
                d_list[k][idx] = 1.0
                fd[idx] = directional(d_list)
            np.testing.assert_allclose(got[k], fd, rtol=rtol, atol=atol,
                                       err_msg=f"{msg}: vjp of input {k} vs finite differences")
    else:
        for _ in range(3):
            d_list = [gen.standard_normal(x.shape) for x in xs]
            expect = directional(d_list)
            actual = sum(float(np.sum(g * d)) for g, d in zip(got, d_list))
            np.testing.assert_allclose(actual, expect, rtol=rtol, atol=atol * total,
                                       err_msg=f"{msg}: <vjp, v> vs finite differences")


def check_jvp_vjp(fun, *inputs, rtol=1e-9, atol=1e-9, seed=0, msg=""):
    """Check ``mx.jvp`` against ``mx.vjp``: ``<u, J v> == <J^T u, v>`` in float64, for
    random ``u`` and ``v``; also the outputs of ``jvp`` must be those of ``fun``."""
    gen = rng(seed)
    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    arrays = [mx.array(x, dtype=mx.float64) for x in xs]
    vs = [gen.standard_normal(x.shape) for x in xs]
    outs, jv = mx.jvp(fun, arrays, [mx.array(v, dtype=mx.float64) for v in vs])
    direct = _as_outputs(fun(*arrays))
    assert len(outs) == len(direct) == len(jv), f"{msg}: output counts differ"
    us = [gen.standard_normal(o.shape) * np.isfinite(np.array(o)) if _inexact(o)
          else np.zeros(o.shape) for o in outs]
    cots = [mx.array(u, dtype=o.dtype) if _inexact(o) else mx.zeros_like(o)
            for u, o in zip(us, outs)]
    _, vj = mx.vjp(fun, arrays, cots)
    for o, d, t in zip(outs, direct, jv):
        assert t.shape == o.shape and t.dtype == o.dtype, f"{msg}: tangent {t.shape} {t.dtype}"
        np.testing.assert_array_equal(np.array(o), np.array(d), err_msg=f"{msg}: jvp outputs")
    with np.errstate(invalid="ignore"):
        lhs = sum(float(np.sum(np.where(u != 0, u * np.array(t, dtype=np.float64), 0.0)))
                  for u, t, o in zip(us, jv, outs) if _inexact(o))
    rhs = sum(float(np.sum(np.array(g, dtype=np.float64) * v)) for g, v in zip(vj, vs))
    np.testing.assert_allclose(lhs, rhs, rtol=rtol, atol=atol, err_msg=f"{msg}: <u, Jv> vs <J^T u, v>")


def check_vmap_loop(fun, *inputs, in_axes=0, out_axes=0, msg=""):
    """Check ``mx.vmap(fun, in_axes, out_axes)`` against a Python loop over the examples.

    ``inputs`` are NumPy arrays (converted with their dtypes); ``in_axes`` is an int,
    None, or one entry per input; ``out_axes`` an int or one entry per output.
    The loop's results are stacked along ``out_axes``; shapes, dtypes and values
    must match exactly (the same kernels run in both).
    """
    axes = list(in_axes) if isinstance(in_axes, (list, tuple)) else [in_axes] * len(inputs)
    sizes = {x.shape[a] for x, a in zip(inputs, axes) if a is not None}
    assert len(sizes) == 1, f"{msg}: the mapped axes of the inputs differ in size: {sizes}"
    n = sizes.pop()
    got = mx.vmap(fun, in_axes=in_axes, out_axes=out_axes)(*[to_lazyx(x) for x in inputs])
    got = _as_outputs(got)
    per = [_as_outputs(fun(*[to_lazyx(np.take(x, b, axis=a)) if a is not None else to_lazyx(x)
                             for x, a in zip(inputs, axes)]))
           for b in range(n)]
    oaxes = list(out_axes) if isinstance(out_axes, (list, tuple)) else [out_axes] * len(got)
    assert n > 0, f"{msg}: map over at least one example"
    assert len(got) == len(per[0]), f"{msg}: vmap gave {len(got)} outputs, the loop {len(per[0])}"
    for j, (g, oa) in enumerate(zip(got, oaxes)):
        want = np.stack([np.array(p[j]) for p in per], axis=oa)
        assert g.dtype == per[0][j].dtype, f"{msg}: output {j} dtype {g.dtype}, loop {per[0][j].dtype}"
        got_np = np.array(g)
        assert got_np.shape == want.shape, f"{msg}: output {j} shape {got_np.shape}, loop {want.shape}"
        if g.dtype.kind in "fc":
            r, a = TOLERANCES[g.dtype.name]
            wide = np.complex128 if g.dtype.kind == "c" else np.float64
            np.testing.assert_allclose(got_np.astype(wide), want.astype(wide), rtol=r, atol=a,
                                       equal_nan=True, err_msg=f"{msg}: output {j}")
        else:
            np.testing.assert_array_equal(got_np, want, err_msg=f"{msg}: output {j}")


def has_rules(*classes, rules=("vjp", "jvp", "vmap")) -> bool:
    """Whether every primitive class in ``classes`` implements the transform ``rules``
    (for tests whose functions go through another pack's primitives)."""
    from lazyx.primitive import Primitive
    return all(getattr(c, r) is not getattr(Primitive, r) for c in classes for r in rules)
