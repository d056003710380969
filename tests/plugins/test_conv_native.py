"""The conv pack's implicit-GEMM kernels (backends/cpu/native/conv.cpp: conv_direct and
conv_swapped) against float64 references written from the definition, forward and both
gradients of ``sum(conv(x, w) * g)`` in float32 (and the half types, computed in float32):
output tiles with ragged edges (rows not a multiple of 6, channels not a multiple of the
16-wide panels), strides, padding, both dilations, flip, 1-D to 3-D, and convolutions whose
kernel is larger than their output (the weight-gradient shape, computed with batch and
channels swapped) given directly, on both CPU backends."""

import itertools

import lazyx.core as mx
import numpy as np
import pytest
from helpers import assert_close

# float32 sums of up to a few thousand products of values in [-1, 1)
TOL = {"float32": (2e-5, 2e-4), "float16": (4e-3, 5e-2), "bfloat16": (3e-2, 3e-1)}


def _data(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _virtual(x, lo, hi, idil):
    """x dilated and padded (non-negative padding), and the slices of x's elements in it."""
    nd = x.ndim - 2
    dil = [(s - 1) * d + 1 for s, d in zip(x.shape[1:-1], idil)]
    full = np.zeros([x.shape[0]] + [d + a + b for d, a, b in zip(dil, lo, hi)] + [x.shape[-1]])
    where = (slice(None),) + tuple(slice(lo[i], lo[i] + dil[i], idil[i]) for i in range(nd))
    full[where] = x
    return full, where


def _taps(xp, w, stride, kdil):
    """(tap, slices of xp it reads) for each kernel tap, and the output's spatial shape."""
    nd = xp.ndim - 2
    kernel = w.shape[1:-1]
    out = [(xp.shape[i + 1] - (kernel[i] - 1) * kdil[i] - 1) // stride[i] + 1 for i in range(nd)]
    taps = []
    for k in itertools.product(*[range(n) for n in kernel]):
        taps.append((k, (slice(None),) + tuple(
            slice(k[i] * kdil[i], k[i] * kdil[i] + (out[i] - 1) * stride[i] + 1, stride[i]) for i in range(nd))))
    return taps, out


def reference(x, w, g, stride, lo, hi, kdil, idil, flip):
    """Forward, input gradient and weight gradient of sum(conv(x, w) * g), float64, tap by tap."""
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    nd = x.ndim - 2
    wf = w[(slice(None),) + (slice(None, None, -1),) * nd] if flip else w
    xp, where = _virtual(x, lo, hi, idil)
    taps, out = _taps(xp, wf, stride, kdil)
    y = np.zeros([x.shape[0]] + out + [w.shape[0]])
    dxp, dwf = np.zeros_like(xp), np.zeros_like(wf)
    for k, view in taps:
        y += xp[view] @ wf[(slice(None),) + k].T
        dwf[(slice(None),) + k] = g.reshape(-1, g.shape[-1]).T @ xp[view].reshape(-1, xp.shape[-1])
        dxp[view] += g @ wf[(slice(None),) + k]
    dw = dwf[(slice(None),) + (slice(None, None, -1),) * nd] if flip else dwf
    return y, dxp[where], dw


# (input shape, weight shape, conv_general keywords): spatial rows of 7 and 13 (tiles of
# 6 and a ragged one), channels 5/17/33 (panels of 16 and a ragged one), kernels larger
# than the output (the swapped kernel) with 1, 7 and 9 batch rows.
CASES = [
    ((2, 7, 7, 5), (17, 3, 3, 5), {"padding": 1}),
    ((3, 9, 13, 8), (33, 3, 2, 8), {"stride": [2, 1], "padding": ([1, 0], [0, 1])}),
    ((1, 10, 9, 3), (16, 2, 3, 3), {"kernel_dilation": [2, 3], "padding": 2, "flip": True}),
    ((2, 5, 6, 4), (6, 3, 3, 4), {"input_dilation": [2, 1], "stride": 2, "padding": 1}),
    ((2, 19, 7), (9, 4, 7), {"stride": 3, "padding": ([2], [1]), "kernel_dilation": 2}),
    ((1, 4, 5, 6, 3), (4, 2, 3, 2, 3), {"stride": [1, 2, 1], "padding": 1, "kernel_dilation": [1, 1, 2]}),
    ((7, 8, 9, 6), (20, 6, 8, 6), {"padding": 1}),           # kernel > output: swapped
    ((9, 12, 5), (3, 10, 5), {"kernel_dilation": 1}),          # swapped, 1-D, batch 9
    ((1, 6, 6, 2), (18, 5, 4, 2), {"stride": 2, "padding": ([1, 0], [2, 1]), "flip": True}),  # swapped
]


def _kw_lists(kw, nd):
    def per_axis(name, default):
        v = kw.get(name, default)
        return (list(v) * (nd if len(v) == 1 else 1)) if isinstance(v, list) else [v] * nd
    pad = kw.get("padding", 0)
    if isinstance(pad, tuple):
        lo, hi = (p * (nd if len(p) == 1 else 1) for p in pad)
    else:
        lo = hi = [pad] * nd
    return {"stride": per_axis("stride", 1), "lo": lo, "hi": hi, "kdil": per_axis("kernel_dilation", 1),
            "idil": per_axis("input_dilation", 1), "flip": kw.get("flip", False)}


@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_and_gradients_float32(case, backend):
    xs, ws, kw = CASES[case]
    x, w = _data(xs, case), _data(ws, case + 50)
    out_shape = mx.conv_general(mx.array(x, dtype=mx.float32), mx.array(w, dtype=mx.float32), **kw).shape
    g = _data(out_shape, case + 99)
    y_want, dx_want, dw_want = reference(x.astype(np.float32), w.astype(np.float32), g.astype(np.float32),
                                         **_kw_lists(kw, len(xs) - 2))
    gl = mx.array(g, dtype=mx.float32)
    with mx.use_backend("cpu", backend):
        y, (dx, dw) = mx.value_and_grad(lambda a, b: mx.sum(mx.conv_general(a, b, **kw) * gl), argnums=(0, 1))(
            mx.array(x, dtype=mx.float32), mx.array(w, dtype=mx.float32))
        fwd = mx.conv_general(mx.array(x, dtype=mx.float32), mx.array(w, dtype=mx.float32), **kw)
        mx.eval(y, dx, dw, fwd)
    r, a = TOL["float32"]
    assert_close(fwd, y_want, dtype=mx.float32, rtol=r, atol=a)
    assert_close(dx, dx_want, dtype=mx.float32, rtol=r, atol=a)
    assert_close(dw, dw_want, dtype=mx.float32, rtol=r, atol=a)
    np.testing.assert_allclose(float(y), np.sum(y_want * g), rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [0, 6])
def test_half_types_compute_in_float32(case, dtype):
    # float16/bfloat16 take the float32 kernels on converted copies: the result is the
    # float32 result rounded once.
    xs, ws, kw = CASES[case]
    d = getattr(mx, dtype)
    xl, wl = mx.array(_data(xs, case), dtype=d), mx.array(_data(ws, case + 50), dtype=d)
    got = mx.conv_general(xl, wl, **kw)
    assert got.dtype == d
    xr, wr = (np.array(a.astype(mx.float32)) for a in (xl, wl))
    want = reference(xr, wr, np.zeros(got.shape), **_kw_lists(kw, len(xs) - 2))[0]
    r, a = TOL[dtype]
    assert_close(got, want, dtype=d, rtol=r, atol=a)


def test_swapped_operands_in_any_layout():
    # A convolution of the weight-gradient shape whose operands are not transposed views
    # of contiguous arrays: the kernel copies them into its layout.
    x, w = _data((5, 11, 7, 6), 3), _data((4, 9, 6, 6), 4)
    xl = mx.transpose(mx.array(np.ascontiguousarray(x.transpose(1, 0, 2, 3)), dtype=mx.float32), (1, 0, 2, 3))
    got = mx.conv2d(xl, mx.array(w, dtype=mx.float32), padding=(0, 1))
    want = reference(x, w, np.zeros(got.shape), [1, 1], [0, 1], [0, 1], [1, 1], [1, 1], False)[0]
    assert_close(got, want, dtype=mx.float32, rtol=2e-5, atol=2e-4)
