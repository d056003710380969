"""The differential harness: the same call on lazyx and on MLX itself, compared.

MLX 0.32.2 is the specification of lazyx's behaviour. ``mlx[cpu]==0.32.2`` is in the
test extra where a wheel exists; everywhere else these tests skip cleanly.

* :func:`same` calls ``fn(mx)`` with ``mx`` bound to ``lazyx.core`` and then to
  ``mlx.core`` and compares the results: the same exception type (both raise), or
  the same structure, shapes, dtype names and values (tolerance by dtype).
* :data:`mlx` is the MLX module (the tests that use it are skipped without it).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as lx

try:
    import mlx.core as mlx
except ImportError:  # pragma: no cover - platforms without an MLX wheel
    mlx = None

requires_mlx = pytest.mark.skipif(mlx is None, reason="mlx[cpu]==0.32.2 is not installed")

#: Relative tolerance by result dtype name.
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-5, "complex64": 2e-5,
        "float64": 1e-12}


def _numpy(x):
    """A result as NumPy data (an array of either library, a scalar, a list ...)."""
    if x is None or isinstance(x, (bool, int, float, complex, str)):
        return x
    if type(x).__module__.startswith("mlx") and hasattr(x, "dtype") and hasattr(x, "shape"):
        d = str(x.dtype).split(".")[-1]
        a = np.array(x.astype(mlx.float32) if d == "bfloat16" else x)
        return a, d
    if isinstance(x, lx.array):
        d = x.dtype.name.replace("bool_", "bool")
        a = np.array(x.astype(lx.float32) if d == "bfloat16" else x)
        return a, d
    if isinstance(x, (list, tuple)):
        return type(x)(_numpy(v) for v in x)
    if isinstance(x, dict):
        return {k: _numpy(v) for k, v in x.items()}
    return x


def assert_same(got, want, rtol: float | None = None, atol: float = 0.0, where: str = "result"):
    """``got`` (lazyx's) matches ``want`` (MLX's): structure, shape, dtype, values."""
    g, w = _numpy(got), _numpy(want)
    if isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], np.ndarray):
        assert isinstance(g, tuple) and len(g) == 2 and isinstance(g[0], np.ndarray), \
            f"{where}: lazyx gave {got!r}, MLX an array"
        (ga, gd), (wa, wd) = g, w
        assert gd == wd, f"{where}: dtype {gd} (lazyx) != {wd} (MLX)"
        assert ga.shape == wa.shape, f"{where}: shape {ga.shape} (lazyx) != {wa.shape} (MLX)"
        if wa.dtype.kind in "fc":
            tol = RTOL.get(wd, 1e-6) if rtol is None else rtol
            np.testing.assert_allclose(ga, wa, rtol=tol, atol=atol, equal_nan=True,
                                       err_msg=where)
        else:
            np.testing.assert_array_equal(ga, wa, err_msg=where)
        return
    if isinstance(w, (list, tuple)):
        assert isinstance(g, (list, tuple)) and len(g) == len(w), f"{where}: {got!r} vs {want!r}"
        for k, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, rtol, atol, f"{where}[{k}]")
        return
    if isinstance(w, dict):
        assert isinstance(g, dict) and set(g) == set(w), f"{where}: keys differ"
        for k in w:
            assert_same(got[k], want[k], rtol, atol, f"{where}[{k!r}]")
        return
    assert g == w or (isinstance(w, float) and np.isclose(g, w, rtol=rtol or 1e-6)), \
        f"{where}: {got!r} (lazyx) != {want!r} (MLX)"


def same(fn, rtol: float | None = None, atol: float = 0.0, same_error_type: bool = True):
    """Run ``fn(mx)`` on lazyx and on MLX; both raise an exception of the same built-in
    type (of any type with ``same_error_type=False``, for the error types
    docs/mlx-differences.md lists), or both return results that :func:`assert_same`
    accepts. Returns lazyx's."""
    if mlx is None:
        pytest.skip("mlx[cpu]==0.32.2 is not installed")
    try:
        want = fn(mlx)
        mlx.eval(*[v for v in (want if isinstance(want, (list, tuple)) else [want])
                   if type(v).__module__.startswith("mlx")])
        want_exc = None
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        want, want_exc = None, e
    try:
        got = fn(lx)
        if isinstance(got, (list, tuple)):
            lx.eval(*[v for v in got if isinstance(v, lx.array)])
        elif isinstance(got, lx.array):
            lx.eval(got)
        got_exc = None
    except Exception as e:  # noqa: BLE001
        got, got_exc = None, e
    if want_exc is not None or got_exc is not None:
        assert want_exc is not None, f"lazyx raised {got_exc!r}; MLX returned {want!r}"
        assert got_exc is not None, f"MLX raised {want_exc!r}; lazyx returned {got!r}"
        assert not same_error_type or isinstance(got_exc, type(want_exc)), \
            f"lazyx raised {type(got_exc).__name__}: {got_exc}; MLX {type(want_exc).__name__}: {want_exc}"
        return None
    assert_same(got, want, rtol, atol)
    return got
