"""Conv1d/2d/3d and ConvTranspose1d/2d/3d: MLX's parameter names, shapes, initial
ranges and repr; outputs against a NumPy float64 convolution and against MLX on the
same weights; gradients by finite differences; a wrong channel count names the layer,
the weight and the shapes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError

from layer_checks import (assert_matches_mlx, check_layer_grads, mlx_core, mlx_nn,
                          requires_mlx, same_weights)


def np_conv(x, w, b, stride, padding, dilation, groups):
    """Channels-last N-d convolution in float64 (cross-correlation, as MLX)."""
    nd = x.ndim - 2
    x = np.pad(x.astype(np.float64), [(0, 0)] + [(p, p) for p in padding] + [(0, 0)])
    cout, ks, cin_g = w.shape[0], w.shape[1:-1], w.shape[-1]
    out_sp = [(x.shape[1 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1
              for i in range(nd)]
    y = np.zeros((x.shape[0], *out_sp, cout))
    cout_g = cout // groups
    for pos in itertools.product(*[range(o) for o in out_sp]):
        for k in itertools.product(*[range(kk) for kk in ks]):
            idx = tuple(pos[i] * stride[i] + k[i] * dilation[i] for i in range(nd))
            patch = x[(slice(None), *idx)]  # (N, Cin)
            for g in range(groups):
                wk = w[(slice(g * cout_g, (g + 1) * cout_g), *k)]  # (cout_g, cin_g)
                y[(slice(None), *pos, slice(g * cout_g, (g + 1) * cout_g))] += \
                    patch[:, g * cin_g:(g + 1) * cin_g] @ wk.T
    return y + (0 if b is None else b)


def np_conv_transpose(x, w, b, stride, padding, dilation, output_padding):
    """Channels-last transposed convolution in float64: scatter every input element."""
    nd = x.ndim - 2
    ks = w.shape[1:-1]
    full = [(x.shape[1 + i] - 1) * stride[i] + dilation[i] * (ks[i] - 1) + 1 + output_padding[i]
            for i in range(nd)]
    y = np.zeros((x.shape[0], *full, w.shape[0]))
    for pos in itertools.product(*[range(s) for s in x.shape[1:-1]]):
        for k in itertools.product(*[range(kk) for kk in ks]):
            idx = tuple(pos[i] * stride[i] + k[i] * dilation[i] for i in range(nd))
            y[(slice(None), *idx)] += x[(slice(None), *pos)].astype(np.float64) @ w[(slice(None), *k)].T
    y = y[(slice(None), *[slice(p, f - p) for p, f in zip(padding, full)])]
    return y + (0 if b is None else b)


def _t(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


CONV = [  # layer, input shape, args, kwargs
    (nn.Conv1d, (2, 9, 4), (4, 6, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    (nn.Conv2d, (2, 6, 5, 3), (3, 4, (3, 2)), dict(stride=(2, 1), padding=1)),
    (nn.Conv3d, (1, 4, 4, 4, 2), (2, 3, 2), dict(padding=1, bias=False)),
]
CONVT = [
    (nn.ConvTranspose1d, (2, 5, 4), (4, 6, 3), dict(stride=2, padding=1, output_padding=1)),
    (nn.ConvTranspose2d, (2, 3, 4, 3), (3, 2, (3, 2)), dict(stride=2, dilation=2)),
    (nn.ConvTranspose3d, (1, 2, 3, 2, 2), (2, 3, 2), dict(bias=False)),
]


@pytest.mark.parametrize("cls,shape,args,kw", CONV, ids=lambda v: getattr(v, "__name__", ""))
def test_conv_matches_numpy(cls, shape, args, kw):
    layer = cls(*args, **kw)
    nd = len(shape) - 2
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    b = np.array(layer.bias) if "bias" in layer else None
    ref = np_conv(x, np.array(layer.weight, dtype=np.float64), b, _t(kw.get("stride", 1), nd),
                  _t(kw.get("padding", 0), nd), _t(kw.get("dilation", 1), nd), kw.get("groups", 1))
    np.testing.assert_allclose(np.array(layer(mx.array(x))), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls,shape,args,kw", CONVT, ids=lambda v: getattr(v, "__name__", ""))
def test_conv_transpose_matches_numpy(cls, shape, args, kw):
    layer = cls(*args, **kw)
    nd = len(shape) - 2
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    b = np.array(layer.bias) if "bias" in layer else None
    ref = np_conv_transpose(x, np.array(layer.weight, dtype=np.float64), b,
                            _t(kw.get("stride", 1), nd), _t(kw.get("padding", 0), nd),
                            _t(kw.get("dilation", 1), nd), _t(kw.get("output_padding", 0), nd))
    np.testing.assert_allclose(np.array(layer(mx.array(x))), ref, rtol=1e-5, atol=1e-5)


@requires_mlx
@pytest.mark.parametrize("cls,shape,args,kw", CONV + CONVT,
                         ids=lambda v: getattr(v, "__name__", ""))
def test_matches_mlx_with_its_weights(cls, shape, args, kw):
    ref = getattr(mlx_nn, cls.__name__)(*args, **kw)
    layer = same_weights(ref, cls(*args, **kw))
    assert repr(layer) == repr(ref)
    assert sorted(layer.parameters()) == sorted(ref.parameters())
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    assert_matches_mlx(layer(mx.array(x)), ref(mlx_core.array(x)))


def test_parameters_and_initial_range():
    mx.random.seed(3)
    layer = nn.Conv2d(4, 6, 3, groups=2)
    assert layer.weight.shape == (6, 3, 3, 2) and layer.bias.shape == (6,)
    bound = (1 / (4 * 9)) ** 0.5
    w = np.array(layer.weight)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert not np.array(layer.bias).any()
    assert nn.ConvTranspose1d(4, 6, 3).weight.shape == (6, 3, 4)
    assert "bias" not in nn.Conv1d(2, 3, 1, bias=False)


@pytest.mark.parametrize("cls,shape,args,kw", [CONV[0], CONV[1], CONVT[0]],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_gradients_by_finite_differences(cls, shape, args, kw):
    layer = cls(*args, **kw)
    x = np.random.default_rng(4).standard_normal(shape)
    check_layer_grads(layer, x, max_elements=0)


@pytest.mark.parametrize("cls,shape,args", [(nn.Conv2d, (1, 5, 5, 3), (4, 2, 3)),
                                            (nn.ConvTranspose1d, (1, 5, 3), (4, 2, 3))])
def test_wrong_channel_count_names_layer_weight_and_shapes(cls, shape, args):
    layer = cls(*args)
    with pytest.raises(ShapeError, match=rf"\[{cls.__name__}\].*{shape}.*weight of shape "
                                         rf"\({layer.weight.shape[0]}, "):
        layer(mx.zeros(shape))


def test_groups_must_divide_in_channels():
    with pytest.raises(ArgumentError, match=r"\[Conv1d\] in_channels \(5\).*groups \(2\)"):
        nn.Conv1d(5, 4, 3, groups=2)
