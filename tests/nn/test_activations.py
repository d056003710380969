"""Activations (lazyx/nn/layers/activations.py), function and layer form: NumPy float64
references over dtypes and options, MLX on the same inputs (values, result dtypes of
float/int/bool inputs, error types), gradients by finite differences, hypothesis over
wide input ranges for the numerically delicate ones, and the layers' parameters/repr."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import erf

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError

from helpers import FLOAT_DTYPES, assert_close, check_op, check_vjp_fd, random_array, rng

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
from mlx_compat import requires_mlx, same  # noqa: E402


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(x, 0)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(x))


# name -> (kwargs, NumPy float64 reference). Several option sets per function.
REFERENCES = [
    ("relu", {}, lambda x: np.maximum(x, 0)),
    ("relu2", {}, lambda x: np.maximum(x, 0) ** 2),
    ("relu6", {}, lambda x: np.clip(x, 0, 6)),
    ("leaky_relu", {}, lambda x: np.where(x > 0, x, 0.01 * x)),
    ("leaky_relu", {"negative_slope": 0.3}, lambda x: np.where(x > 0, x, 0.3 * x)),
    ("elu", {}, _elu),
    ("elu", {"alpha": 0.5}, lambda x: _elu(x, 0.5)),
    ("selu", {}, lambda x: 1.0507 * _elu(x, 1.67326)),
    ("celu", {}, lambda x: np.maximum(x, 0) + np.minimum(0, np.expm1(x))),
    ("celu", {"alpha": 2.0}, lambda x: np.maximum(x, 0) + np.minimum(0, 2 * np.expm1(x / 2))),
    ("gelu", {}, lambda x: x * 0.5 * (1 + erf(x / math.sqrt(2)))),
    ("gelu_approx", {}, lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                           * (x + 0.044715 * x**3)))),
    ("gelu_fast_approx", {}, lambda x: x * _sig(1.702 * x)),
    ("silu", {}, lambda x: x * _sig(x)),
    ("mish", {}, lambda x: x * np.tanh(_softplus(x))),
    ("sigmoid", {}, _sig),
    ("log_sigmoid", {}, lambda x: -_softplus(-x)),
    ("tanh", {}, np.tanh),
    ("hard_tanh", {}, lambda x: np.clip(x, -1, 1)),
    ("hard_tanh", {"min_val": -0.5, "max_val": 2.0}, lambda x: np.clip(x, -0.5, 2.0)),
    ("hardswish", {}, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    ("hard_shrink", {}, lambda x: np.where(np.abs(x) > 0.5, x, 0)),
    ("hard_shrink", {"lambd": 1.5}, lambda x: np.where(np.abs(x) > 1.5, x, 0)),
    ("softshrink", {}, lambda x: np.where(np.abs(x) > 0.5, x - np.sign(x) * 0.5, 0)),
    ("softshrink", {"lambd": 1.0}, lambda x: np.where(np.abs(x) > 1, x - np.sign(x), 0)),
    ("softplus", {}, _softplus),
    ("softsign", {}, lambda x: x / (1 + np.abs(x))),
    ("softmax", {}, _softmax),
    ("softmax", {"axis": 0}, lambda x: _softmax(x, 0)),
    ("softmin", {}, lambda x: _softmax(-x)),
    ("log_softmax", {}, lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
    ("log_softmax", {"axis": 1}, lambda x: x - np.log(np.exp(x).sum(1, keepdims=True))),
    ("glu", {}, lambda x: np.split(x, 2, -1)[0] * _sig(np.split(x, 2, -1)[1])),
    ("glu", {"axis": 0}, lambda x: np.split(x, 2, 0)[0] * _sig(np.split(x, 2, 0)[1])),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw, _ in REFERENCES]
FUNCTIONS = sorted({n for n, _, _ in REFERENCES} | {"step"})


# Each (function, dtype, rank, scalar option) compiles one fused C++ kernel the first time
# (cached on disk afterwards). The tests keep to rank-2 inputs and to the option values
# the layer tests reuse, and check the half-precision dtypes on the eager path (compile
# disabled): compile's own tests guarantee a compiled function computes what it traces.
@pytest.fixture
def eager():
    mx.disable_compile()
    try:
        yield
    finally:
        mx.enable_compile()


def _maybe_eager(request, dtype_name: str) -> None:
    if dtype_name not in ("float32", "float64"):
        request.getfixturevalue("eager")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name,kwargs,ref", REFERENCES, ids=IDS)
def test_matches_numpy(name, kwargs, ref, dtype, request):
    _maybe_eager(request, dtype.name)
    x = random_array((6, 8), dtype, rng(1), low=-5, high=5)
    # Composite formulas round several times in half precision.
    tol = {"float16": 1e-2, "bfloat16": 4e-2}.get(dtype.name)
    check_op(lambda a: getattr(nn, name)(a, **kwargs), ref, x, dtype=dtype, rtol=tol, atol=tol,
             msg=name)


@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_step_is_int32_and_inclusive(threshold):
    x = np.array([[-2.0, -1.0, 0.0, 0.5, 1.0, 2.0]], np.float32)
    assert_close(nn.step(mx.array(x), threshold), (x >= threshold).astype(np.int32), mx.int32)
    assert_close(nn.Step(threshold)(mx.array(x)), (x >= threshold).astype(np.int32), mx.int32)


def test_prelu_broadcasts_alpha_over_the_last_axis():
    x = random_array((3, 4), mx.float32, rng(2))
    alpha = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    check_op(nn.prelu, lambda x, a: np.maximum(x, 0) + a * np.minimum(x, 0), x, alpha,
             dtype=mx.float32)


def test_shapeless_compile_serves_every_shape_of_a_rank():
    # One trace per rank: a second shape must not reuse the first one's sizes.
    for shape in [(6, 8), (5, 7), (1, 1)]:
        x = random_array(shape, mx.float32, rng(3))
        check_op(nn.silu, lambda x: x * _sig(x), x)
        check_op(nn.log_softmax, lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True)), x)


def test_glu_needs_an_even_axis():
    with pytest.raises(ValueError, match="split"):
        nn.glu(mx.zeros((2, 3)))


# -- gradients ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,kwargs,ref", REFERENCES, ids=IDS)
def test_gradient_matches_finite_differences(name, kwargs, ref):
    x = rng(4).uniform(-3, 3, (4, 6))
    # Keep inputs off the kinks (0, +-lambda, +-1, -3, 3, 6) where the derivative jumps.
    x = np.where(np.abs(x - np.round(x * 2) / 2) < 1e-3, x + 0.01, x)
    check_vjp_fd(lambda a: getattr(nn, name)(a, **kwargs), x, rtol=1e-5, atol=1e-7, msg=name)


def test_prelu_gradient_reaches_alpha():
    x = rng(5).uniform(-2, 2, (3, 4))
    check_vjp_fd(nn.prelu, x, np.array([0.3, 0.1, 0.5, 0.2]))


# -- hypothesis: stability over wide ranges --------------------------------------------
_wide = hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6),
                   elements=st.floats(-700, 700))


@settings(max_examples=25, deadline=None)
@given(_wide)
def test_stable_on_wide_inputs(x):
    xl = mx.array(x, dtype=mx.float64)
    np.testing.assert_allclose(np.array(nn.softplus(xl)), _softplus(x), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(np.array(nn.log_sigmoid(xl)), -_softplus(-x), rtol=1e-12,
                               atol=1e-300)
    ref = x - (np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
               + x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.array(nn.log_softmax(xl)), ref, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(np.array(nn.softmax(xl)), _softmax(x), rtol=1e-12, atol=1e-300)
    assert np.all(np.isfinite(np.array(nn.mish(xl))))


# -- layers -------------------------------------------------------------------------------
LAYERS = [
    ("ReLU", (), "relu", {}), ("ReLU2", (), "relu2", {}), ("ReLU6", (), "relu6", {}),
    ("LeakyReLU", (0.3,), "leaky_relu", {"negative_slope": 0.3}), ("ELU", (0.5,), "elu", {"alpha": 0.5}),
    ("SELU", (), "selu", {}), ("CELU", (2.0,), "celu", {"alpha": 2.0}), ("GELU", (), "gelu", {}),
    ("GELU", ("precise",), "gelu_approx", {}), ("GELU", ("tanh",), "gelu_approx", {}),
    ("GELU", ("fast",), "gelu_fast_approx", {}), ("SiLU", (), "silu", {}), ("Mish", (), "mish", {}),
    ("Sigmoid", (), "sigmoid", {}), ("LogSigmoid", (), "log_sigmoid", {}), ("Tanh", (), "tanh", {}),
    ("HardTanh", (), "hard_tanh", {}), ("Hardswish", (), "hardswish", {}),
    ("HardShrink", (1.5,), "hard_shrink", {"lambd": 1.5}),
    ("Softshrink", (1.0,), "softshrink", {"lambd": 1.0}), ("Softplus", (), "softplus", {}),
    ("Softsign", (), "softsign", {}), ("Softmax", (), "softmax", {}), ("Softmin", (), "softmin", {}),
    ("LogSoftmax", (), "log_softmax", {}), ("GLU", (0,), "glu", {"axis": 0}),
    ("Step", (0.5,), "step", {"threshold": 0.5}),
]


@pytest.mark.parametrize("cls,args,fn,kwargs", LAYERS, ids=[f"{c}{a}" for c, a, _, _ in LAYERS])
def test_layer_applies_its_function(cls, args, fn, kwargs):
    layer = getattr(nn, cls)(*args)
    x = mx.array(random_array((6, 8), mx.float32, rng(6)))
    assert isinstance(layer, nn.Module)
    assert layer.parameters() == {}
    assert repr(layer) == f"{cls}()"
    np.testing.assert_array_equal(np.array(layer(x)), np.array(getattr(nn, fn)(x, **kwargs)))


def test_prelu_layer_has_mlx_parameter():
    layer = nn.PReLU(4, init=0.1)
    assert list(layer.parameters()) == ["weight"]
    assert_close(layer.weight, np.full(4, 0.1), mx.float32)
    x = rng(7).uniform(-2, 2, (2, 4)).astype(np.float32)
    assert_close(layer(mx.array(x)), np.maximum(x, 0) + 0.1 * np.minimum(x, 0), mx.float32)
    layer = nn.PReLU()
    assert layer.weight.shape == (1,) and float(layer.weight[0]) == 0.25


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ArgumentError, match=r"\[GELU\].*'erf'"):
        nn.GELU("erf")


# -- MLX ----------------------------------------------------------------------------------
def _nn(m):
    """The nn module beside core module ``m`` (lazyx's or MLX's)."""
    if m is mx:
        return nn
    import mlx.nn as mlx_nn
    return mlx_nn


_X = np.array([[-40.0, -3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 6.5, 40]], np.float32)


@requires_mlx
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool_"])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_matches_mlx(name, dtype, request):
    _maybe_eager(request, dtype)
    if name == "log_softmax" and dtype == "bool_":
        pytest.skip("MLX 0.32.2 computes log_softmax of a bool array inconsistently")
    half = dtype in ("float16", "bfloat16")
    x = _X.reshape(3, 4)
    same(lambda m: getattr(_nn(m), name)(m.array(x).astype(getattr(m, dtype))),
         rtol=1e-2 if half else 2e-5, atol=1e-2 if half else 1e-6)


@requires_mlx
@pytest.mark.parametrize("cls,args,fn,kwargs", LAYERS, ids=[f"{c}{a}" for c, a, _, _ in LAYERS])
def test_layer_matches_mlx(cls, args, fn, kwargs):
    import mlx.core as m
    import mlx.nn as mn

    x = random_array((6, 8), mx.float32, rng(8))
    want = getattr(mn, cls)(*args)(m.array(x))
    got = getattr(nn, cls)(*args)(mx.array(x))
    assert got.dtype.name == str(want.dtype).split(".")[-1]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=2e-5, atol=1e-6)
    assert repr(getattr(nn, cls)(*args)) == repr(getattr(mn, cls)(*args))


@requires_mlx
def test_prelu_and_gelu_errors_match_mlx():
    import mlx.nn as mn

    assert repr(nn.PReLU(3)) == repr(mn.PReLU(3))
    np.testing.assert_array_equal(np.array(nn.PReLU(3, 0.5).weight), np.array(mn.PReLU(3, 0.5).weight))
    with pytest.raises(ValueError):
        mn.GELU("erf")
    with pytest.raises(ValueError):
        nn.GELU("erf")
