"""Max and average pooling (1-3 d) and Upsample: against NumPy float64 window loops and
MLX (same arguments), gradients by finite differences, MLX's padding semantics (padded
zeros count in an average), and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError

from layer_checks import assert_matches_mlx, check_layer_grads, mlx_core, mlx_nn, requires_mlx


def np_pool(x, kernel, stride, padding, reduce, pad_value):
    x = np.pad(x.astype(np.float64), [(0, 0)] + [(p, p) for p in padding] + [(0, 0)],
               constant_values=pad_value)
    out = [(x.shape[1 + i] - kernel[i]) // stride[i] + 1 for i in range(len(kernel))]
    y = np.zeros((x.shape[0], *out, x.shape[-1]))
    for pos in itertools.product(*[range(o) for o in out]):
        window = x[(slice(None), *[slice(p * s, p * s + k) for p, s, k in zip(pos, stride, kernel)])]
        y[(slice(None), *pos)] = reduce(window.reshape(x.shape[0], -1, x.shape[-1]), axis=1)
    return y


POOLS = [  # name, input shape, kernel, stride, padding
    ("MaxPool1d", (2, 9, 3), (3,), (2,), (1,)),
    ("AvgPool1d", (2, 7, 2), (2,), (2,), (0,)),
    ("MaxPool2d", (2, 5, 6, 3), (2, 3), (1, 2), (1, 1)),
    ("AvgPool2d", (2, 7, 6, 3), (3, 2), (3, 2), (1, 1)),
    ("MaxPool3d", (1, 4, 5, 4, 2), (2, 2, 2), (2, 2, 2), (0, 0, 0)),
    ("AvgPool3d", (1, 3, 4, 4, 2), (2, 2, 3), (1, 2, 1), (1, 0, 1)),
]


@pytest.mark.parametrize("name,shape,k,s,p", POOLS, ids=[c[0] for c in POOLS])
def test_pool_matches_numpy(name, shape, k, s, p):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    layer = getattr(nn, name)(k, s, p)
    is_max = name.startswith("Max")
    ref = np_pool(x, k, s, p, np.max if is_max else np.mean, -np.inf if is_max else 0.0)
    np.testing.assert_allclose(np.array(layer(mx.array(x))), ref, rtol=1e-6, atol=1e-6)


@requires_mlx
@pytest.mark.parametrize("name,shape,k,s,p", POOLS, ids=[c[0] for c in POOLS])
def test_pool_matches_mlx(name, shape, k, s, p):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ours, ref = getattr(nn, name)(k, s, p), getattr(mlx_nn, name)(k, s, p)
    assert repr(ours) == repr(ref)
    assert_matches_mlx(ours(mx.array(x)), ref(mlx_core.array(x)))


def test_stride_defaults_to_kernel_and_repr():
    assert repr(nn.MaxPool2d(2)) == "MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))"
    assert nn.AvgPool1d(3)(mx.zeros((1, 10, 2))).shape == (1, 3, 2)
    assert nn.MaxPool2d(2).parameters() == {}


@pytest.mark.parametrize("name", ["MaxPool2d", "AvgPool2d"])
def test_pool_gradients(name):
    # Distinct values so the max is unique and finite differences are smooth.
    x = np.random.default_rng(2).permutation(2 * 5 * 4 * 2).reshape(2, 5, 4, 2) / 10.0
    check_layer_grads(getattr(nn, name)(2, 1, 1), x, max_elements=0)


def test_pool_bad_input():
    with pytest.raises(ShapeError, match="at least 1 spatial dimension"):
        nn.MaxPool1d(2)(mx.zeros((4, 5)))
    with pytest.raises(ShapeError, match=r"\[MaxPool2d\] kernel_size \(3, 3\).*\(1, 2, 2, 1\)"):
        nn.MaxPool2d(3)(mx.zeros((1, 2, 2, 1)))
    with pytest.raises(ArgumentError, match=r"\[AvgPool2d\] kernel_size"):
        nn.AvgPool2d((2, 2, 2))


# -- Upsample -------------------------------------------------------------------------

def np_interp_axis(x, axis, scale, mode, align_corners):
    """One axis of MLX's linear/cubic interpolation in float64."""
    n = x.shape[axis]
    m = int(scale * n)
    if align_corners:
        c = np.arange(m) * ((n - 1) / max(m - 1, 1))
    else:
        step = 1 / scale
        c = np.arange(m) * step - ((m - 1) * step - n + 1) / 2
    weights = np.zeros((m, n))
    if mode == "linear":
        c = np.clip(c, 0, n - 1)
        lo = np.floor(c).astype(int)
        hi = np.ceil(c).astype(int)
        np.add.at(weights, (np.arange(m), lo), 1 - (c - lo))
        np.add.at(weights, (np.arange(m), hi), c - lo)
    else:
        a = -0.75
        for off in (-1, 0, 1, 2):
            t = np.floor(c) + off
            d = np.abs(c - t)
            w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, (((d - 5) * d + 8) * d - 4) * a)
            np.add.at(weights, (np.arange(m), np.clip(t, 0, n - 1).astype(int)), w)
    return np.moveaxis(np.tensordot(weights, np.moveaxis(x, axis, 0), axes=1), 0, axis)


UPS = [((2, 3, 4, 2), (2.0, 1.5), "nearest", False), ((1, 5, 2), (0.6,), "nearest", False),
       ((2, 3, 4, 2), (1.7, 2.0), "linear", False), ((2, 3, 4, 2), (2.0, 1.5), "linear", True),
       ((1, 4, 3, 1), (1.5, 2.0), "cubic", False), ((1, 4, 3, 1), (2.0, 1.7), "cubic", True)]


@pytest.mark.parametrize("shape,scale,mode,align", UPS)
def test_upsample_matches_numpy(shape, scale, mode, align):
    x = np.random.default_rng(3).standard_normal(shape)
    got = np.array(nn.Upsample(scale, mode, align)(mx.array(x.astype(np.float32))))
    if mode == "nearest":
        ref = x
        for axis, s in enumerate(scale, start=1):
            n, m = x.shape[axis], int(s * x.shape[axis])
            idx = np.round((np.arange(m) + 0.5) * n / m - 0.5) if m > n else np.floor(np.arange(m) * n / m)
            ref = np.take(ref, np.clip(idx, 0, n - 1).astype(int), axis=axis)
    else:
        ref = x
        for axis, s in enumerate(scale, start=1):
            ref = np_interp_axis(ref, axis, s, mode, align)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@requires_mlx
@pytest.mark.parametrize("shape,scale,mode,align,aa", [u + (False,) for u in UPS] + [
    ((1, 8, 6, 2), 0.5, "linear", False, True), ((1, 9, 7, 2), (0.6, 1.5), "cubic", False, True),
    ((1, 6, 2), 2.0, "cubic", False, True), ((1, 3, 2), 3, "nearest", False, False)])
def test_upsample_matches_mlx(shape, scale, mode, align, aa):
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    ours, ref = nn.Upsample(scale, mode, align, aa), mlx_nn.Upsample(scale, mode, align, aa)
    assert repr(ours) == repr(ref)
    assert_matches_mlx(ours(mx.array(x)), ref(mlx_core.array(x)))


def test_upsample_integer_input_and_functions():
    x = mx.arange(1, 5).reshape(1, 2, 2, 1)
    y = nn.Upsample(2)(x)
    assert y.dtype == mx.int32
    assert np.array(y).squeeze().tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]
    assert nn.Upsample(2, "linear")(x).dtype == mx.float32
    np.testing.assert_allclose(np.array(nn.upsample_linear(mx.array([[[0.0], [1.0]]]), (2.0,))).ravel(),
                               [0, 0.25, 0.75, 1])


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_upsample_gradients(mode):
    check_layer_grads(nn.Upsample((1.5, 2.0), mode), np.random.default_rng(5).standard_normal((1, 3, 2, 2)))


def test_upsample_bad_input():
    with pytest.raises(ShapeError, match=r"\[Upsample\] One scale per spatial dimension.*\(2.0, 3.0\)"):
        nn.Upsample((2.0, 3.0))(mx.zeros((1, 3, 1)))
    with pytest.raises(ShapeError, match=r"\[Upsample\].*at least 3D"):
        nn.Upsample(2.0)(mx.zeros((3, 1)))
    with pytest.raises(ArgumentError, match="unsupported upsampling algorithm: bad"):
        nn.Upsample(2.0, "bad")
    with pytest.raises(ArgumentError, match="align_corners"):
        nn.Upsample(2.0, "linear", True, antialias=True)
    with pytest.raises(ArgumentError, match="nearest"):
        nn.Upsample(2.0, antialias=True)
