"""The conv pack against float64 references written from the definitions (a sum over
kernel taps for convolutions, a scatter for transposed ones, ``np.convolve``): strides,
asymmetric and negative padding, kernel and input dilation, groups, flip, 1-D to 3-D,
float32/float16/bfloat16, on the native and the NumPy kernels; gradients (finite
differences), jvp, vmap (input, weight, both batched), compile beside element-wise
code, and the errors of bad input."""

import itertools

import lazyx.core as mx
import numpy as np
import pytest
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, to_lazyx
from lazyx.errors import ArgumentError, DtypeError, LazyxError, ShapeError

BACKENDS = ["cpu", "cpu-reference"]
# Products of up to ~100 terms of values in [-1, 1): float16/bfloat16 results round
# to 2^-11 / 2^-8 of values up to ~10.
TOL = {"float32": (1e-5, 1e-5), "float16": (4e-3, 2e-2), "bfloat16": (3e-2, 1.5e-1)}


def _data(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def reference(x, w, stride, lo, hi, kdil, idil, groups=1, flip=False):
    """The general convolution in float64, tap by tap, from its definition."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    dil = [(s - 1) * d + 1 for s, d in zip(x.shape[1:-1], idil)]
    full = np.zeros([x.shape[0]] + [d + max(a, 0) + max(b, 0) for d, a, b in zip(dil, lo, hi)]
                    + [x.shape[-1]])
    full[(slice(None),) + tuple(slice(max(a, 0), max(a, 0) + d, i) for a, d, i in
                                zip(lo, dil, idil))] = x
    xp = full[(slice(None),) + tuple(slice(max(-a, 0), full.shape[i + 1] - max(-b, 0))
                                     for i, (a, b) in enumerate(zip(lo, hi)))]
    kernel = w.shape[1:-1]
    out = [(xp.shape[i + 1] - (kernel[i] - 1) * kdil[i] - 1) // stride[i] + 1 for i in range(nd)]
    if flip:
        w = w[(slice(None),) + (slice(None, None, -1),) * nd]
    cg, og = w.shape[-1], w.shape[0] // groups
    y = np.zeros([x.shape[0]] + out + [w.shape[0]])
    for k in itertools.product(*[range(n) for n in kernel]):
        view = xp[(slice(None),) + tuple(slice(k[i] * kdil[i], k[i] * kdil[i] + (out[i] - 1) * stride[i] + 1,
                                               stride[i]) for i in range(nd))]
        for g in range(groups):
            y[..., g * og:(g + 1) * og] += view[..., g * cg:(g + 1) * cg] @ w[(slice(g * og, (g + 1) * og),) + k].T
    return y


def transpose_reference(x, w, stride, pad, dil, out_pad, groups=1):
    """The transposed convolution in float64 as a scatter: input position t spreads to
    output t * stride + k * dilation - padding (PyTorch's definition, MLX's weight layout)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    kernel = w.shape[1:-1]
    size = [(n - 1) * s - 2 * p + d * (k - 1) + o + 1
            for n, s, p, d, k, o in zip(x.shape[1:-1], stride, pad, dil, kernel, out_pad)]
    y = np.zeros([x.shape[0]] + size + [w.shape[0]])
    cg, og = w.shape[-1], w.shape[0] // groups
    for t in itertools.product(*[range(n) for n in x.shape[1:-1]]):
        for k in itertools.product(*[range(n) for n in kernel]):
            pos = tuple(t[i] * stride[i] + k[i] * dil[i] - pad[i] for i in range(nd))
            if all(0 <= p < s for p, s in zip(pos, size)):
                for g in range(groups):
                    y[(slice(None),) + pos + (slice(g * og, (g + 1) * og),)] += \
                        x[(slice(None),) + t + (slice(g * cg, (g + 1) * cg),)] @ w[(slice(g * og, (g + 1) * og),) + k].T
    return y


def _compare(got, want, dtype):
    r, a = TOL[dtype.name]
    assert_close(got, want, dtype=dtype, rtol=r, atol=a)


# (input shape, weight shape, conv_general keywords)
GENERAL = [
    ((2, 9, 3), (4, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 8, 4), (6, 2, 2), {"padding": ([2], [0]), "kernel_dilation": 3, "groups": 2}),
    ((1, 7, 6), (3, 3, 6), {"input_dilation": 2, "padding": ([-1], [2]), "flip": True}),
    ((2, 6, 5, 4), (6, 3, 2, 2), {"stride": [2, 1], "padding": ([1, 0], [2, 1]), "groups": 2}),
    ((1, 5, 7, 3), (2, 2, 3, 3), {"kernel_dilation": [2, 1], "input_dilation": [1, 2], "flip": True}),
    ((2, 6, 6, 4), (4, 3, 3, 1), {"padding": 1, "groups": 4}),  # depthwise
    ((1, 4, 5, 6, 2), (3, 2, 3, 2, 2), {"stride": [1, 2, 2], "padding": ([1, 0, 2], [0, 1, 1]),
                                       "kernel_dilation": [2, 1, 1]}),
    ((1, 3, 4, 3, 2), (2, 2, 2, 2, 2), {"input_dilation": [2, 1, 2], "flip": True}),
    ((3, 4, 4, 8), (5, 1, 1, 8), {}),  # pointwise: the native kernel skips im2col
]


def _full(kw, nd):
    """conv_general's keywords as the reference's per-axis lists."""
    def per_axis(v, default):
        v = kw.get(v, default)
        return list(v) * (nd if len(v) == 1 else 1) if isinstance(v, list) else [v] * nd
    pad = kw.get("padding", 0)
    if isinstance(pad, tuple):
        lo = pad[0] * (nd if len(pad[0]) == 1 else 1)
        hi = pad[1] * (nd if len(pad[1]) == 1 else 1)
    else:
        lo = hi = per_axis("padding", 0)
    return dict(stride=per_axis("stride", 1), lo=lo, hi=hi, kdil=per_axis("kernel_dilation", 1),
                idil=per_axis("input_dilation", 1), groups=kw.get("groups", 1), flip=kw.get("flip", False))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(GENERAL)))
def test_conv_general_matches_reference(case, dtype, backend):
    xs, ws, kw = GENERAL[case]
    d = getattr(mx, dtype)
    x, w = _data(xs, case), _data(ws, case + 100)
    xl, wl = mx.array(x, dtype=d), mx.array(w, dtype=d)
    with mx.use_backend("cpu", backend):
        got = mx.conv_general(xl, wl, **kw)
        mx.eval(got)
    # the reference reads the inputs as rounded to the dtype
    xr, wr = (np.array(a.astype(mx.float32)) for a in (xl, wl))
    _compare(got, reference(xr, wr, **_full(kw, len(xs) - 2)), d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_float64_and_fixed_arity_functions(backend):
    x1, w1 = _data((2, 10, 4), 1), _data((4, 3, 2), 2)
    x2, w2 = _data((2, 7, 6, 3), 3), _data((4, 2, 3, 3), 4)
    x3, w3 = _data((1, 5, 4, 6, 2), 5), _data((3, 2, 2, 3, 2), 6)
    with mx.use_backend("cpu", backend):
        y1 = mx.conv1d(to_lazyx(x1), to_lazyx(w1), stride=3, padding=2, dilation=2, groups=2)
        y2 = mx.conv2d(to_lazyx(x2), to_lazyx(w2), stride=(1, 2), padding=(2, 1), dilation=(1, 2))
        y3 = mx.conv3d(to_lazyx(x3), to_lazyx(w3), stride=2, padding=1)
        mx.eval(y1, y2, y3)
    assert_close(y1, reference(x1, w1, [3], [2], [2], [2], [1], groups=2), dtype=mx.float64)
    assert_close(y2, reference(x2, w2, [1, 2], [2, 1], [2, 1], [1, 2], [1, 1]), dtype=mx.float64)
    assert_close(y3, reference(x3, w3, [2] * 3, [1] * 3, [1] * 3, [1] * 3, [1] * 3), dtype=mx.float64)


TRANSPOSED = [
    ((2, 5, 4), (3, 3, 4), dict(stride=2, padding=1, dilation=1, output_padding=1, groups=1)),
    ((1, 4, 4), (6, 2, 2), dict(stride=3, padding=0, dilation=2, output_padding=2, groups=2)),
    # padding beyond the dilated kernel: the input's dilated extent is cropped
    ((1, 5, 2), (2, 3, 2), dict(stride=2, padding=3, dilation=1, output_padding=0, groups=1)),
    ((2, 3, 4, 2), (3, 3, 2, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2),
                                      output_padding=(1, 0), groups=1)),
    ((1, 3, 3, 4), (4, 2, 2, 2), dict(stride=2, padding=0, dilation=1, output_padding=0, groups=2)),
    ((1, 2, 3, 2, 2), (2, 2, 2, 3, 2), dict(stride=(2, 1, 2), padding=(0, 1, 1), dilation=1,
                                            output_padding=(1, 0, 0), groups=1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", range(len(TRANSPOSED)))
def test_conv_transpose_matches_scatter(case, backend):
    xs, ws, kw = TRANSPOSED[case]
    nd = len(xs) - 2
    x, w = _data(xs, case), _data(ws, case + 50)
    fn = getattr(mx, f"conv_transpose{nd}d")
    with mx.use_backend("cpu", backend):
        got = fn(to_lazyx(x), to_lazyx(w), **kw)
        mx.eval(got)
    per_axis = {k: (list(v) if isinstance(v, tuple) else [v] * nd) for k, v in kw.items() if k != "groups"}
    want = transpose_reference(x, w, per_axis["stride"], per_axis["padding"], per_axis["dilation"],
                               per_axis["output_padding"], kw["groups"])
    assert_close(got, want, dtype=mx.float64)


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("n,m", [(10, 4), (4, 10), (7, 3), (5, 1), (6, 6)])
def test_convolve_matches_numpy(n, m, mode):
    a, v = _data((n,), n), _data((m,), m + 10)
    got = mx.convolve(to_lazyx(a), to_lazyx(v), mode=mode)
    want = np.convolve(a, v, mode=mode)
    if mode == "same" and m > n:
        # MLX (whose convention lazyx keeps) swaps the operands first: "same" is the
        # longer one's length, centred as for a kernel of the shorter length
        want = np.convolve(v, a, mode="same")
    assert_close(got, want, dtype=mx.float64)
    assert mx.convolve(mx.array(a.astype(np.float32)), v.astype(np.float32).tolist()).dtype == mx.float32


def test_dtype_promotion_and_empty_batch():
    x = mx.array(_data((2, 5, 3), 0), dtype=mx.float16)
    w = mx.array(_data((2, 2, 3), 1), dtype=mx.float32)
    assert mx.conv1d(x, w).dtype == mx.float32
    assert mx.conv1d(x, w.astype(mx.bfloat16)).dtype == mx.float32
    y = mx.conv2d(mx.zeros((0, 5, 5, 3)), mx.zeros((4, 2, 2, 3)))
    assert y.shape == (0, 4, 4, 4) and np.array(y).shape == (0, 4, 4, 4)


# -- transforms ---------------------------------------------------------------------------
GRAD_CASES = [
    (lambda x, w: mx.conv1d(x, w, stride=2, padding=2, dilation=2, groups=2), (2, 9, 4), (4, 3, 2)),
    (lambda x, w: mx.conv_general(x, w, stride=[2, 1], padding=([1, -1], [0, 2]), kernel_dilation=[1, 2],
                                  input_dilation=[2, 1], groups=2, flip=True), (1, 4, 7, 4), (4, 2, 2, 2)),
    (lambda x, w: mx.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1), (1, 3, 4, 2), (3, 3, 3, 2)),
    (lambda x, w: mx.conv3d(x, w, stride=(1, 2, 1), padding=(1, 0, 1)), (1, 3, 4, 3, 2), (2, 2, 2, 2, 2)),
]


@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
def test_gradients_finite_differences_and_jvp(case):
    fn, xs, ws = GRAD_CASES[case]
    x, w = _data(xs, case), _data(ws, case + 7)
    check_vjp_fd(fn, x, w, msg=f"case {case}")
    check_jvp_vjp(fn, x, w, msg=f"case {case}")


def test_weight_gradient_of_strided_conv_is_exact():
    # The gradient of sum(conv * g) with respect to w is the correlation of x and g.
    x, w, g = _data((2, 7, 6, 3), 0), _data((4, 3, 2, 3), 1), _data((2, 3, 5, 4), 2)
    gx, gw = mx.grad(lambda a, b: mx.sum(mx.conv2d(a, b, stride=(2, 1)) * to_lazyx(g)), argnums=(0, 1))(
        to_lazyx(x), to_lazyx(w))
    want_w = np.zeros(w.shape)
    want_x = np.zeros(x.shape)
    for i, j in itertools.product(range(3), range(2)):
        patch = x[:, i:i + 5:2, j:j + 5, :]
        want_w[:, i, j, :] = np.einsum("nhwc,nhwo->oc", patch, g)
        want_x[:, i:i + 5:2, j:j + 5, :] += np.einsum("nhwo,oc->nhwc", g, w[:, i, j, :])
    assert_close(gw, want_w, dtype=mx.float64)
    assert_close(gx, want_x, dtype=mx.float64)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (2, 1), (-1, -1)])
def test_vmap_matches_loop(in_axes):
    x, w = _data((2, 3, 6, 4), 0), _data((3, 2, 2, 2), 1)
    def fn(a, b):
        return mx.conv1d(a, b, stride=2, padding=1, groups=2)

    def batch(a, axis):  # three different examples stacked at `axis`, or one
        return a[0] if axis is None else np.stack([a[0] * (i + 1) for i in range(3)], axis=axis % a.ndim)
    check_vmap_loop(fn, batch(x, in_axes[0]).astype(np.float32), batch(w, in_axes[1]).astype(np.float32),
                    in_axes=in_axes)


def test_compile_beside_elementwise():
    x, w = _data((2, 6, 6, 3), 0).astype(np.float32), _data((4, 3, 3, 3), 1).astype(np.float32)

    def f(a, b):
        return mx.maximum(mx.conv2d(a * 2.0 + 1.0, b, padding=1) * 0.5, 0.0) - 1.0
    want = f(mx.array(x), mx.array(w))
    got = mx.compile(f)(mx.array(x), mx.array(w))
    assert_close(got, np.array(want), dtype=mx.float32)
    g = mx.compile(mx.grad(lambda a, b: mx.sum(f(a, b)), argnums=1))(mx.array(x), mx.array(w))
    assert_close(g, np.array(mx.grad(lambda a, b: mx.sum(f(a, b)), argnums=1)(mx.array(x), mx.array(w))),
                 dtype=mx.float32)


# -- bad input ------------------------------------------------------------------------------
BAD = [
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 3))), ShapeError, "(6, 3, 3, 3)"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 4)), groups=3), ShapeError, "groups=3"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((5, 3, 3, 2)), groups=2), ShapeError, "(5, 3, 3, 2)"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 9, 9, 4))), ShapeError, "(1, 8, 8, 4)"),
    (lambda: mx.conv2d(mx.zeros((8, 8, 4)), mx.zeros((6, 3, 3, 4))), ShapeError, "(6, 3, 3, 4)"),
    (lambda: mx.conv_general(mx.zeros((1, 3)), mx.zeros((4, 3))), ShapeError, "(1, 3)"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 4)), stride=0), ArgumentError, "stride"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 4)), dilation=(1, 0)), ArgumentError,
     "kernel dilation"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 4)), stride=(1, 2, 3)), DtypeError, "stride"),
    (lambda: mx.conv1d(mx.zeros((1, 8, 4)), mx.zeros((6, 3, 4)), stride=1.5), DtypeError, "stride"),
    (lambda: mx.conv_general(mx.zeros((1, 8, 8, 4)), mx.zeros((6, 3, 3, 4)), padding=[1, 2, 3]),
     ArgumentError, "padding"),
    (lambda: mx.conv2d(mx.zeros((1, 8, 8, 4), dtype=mx.int32), mx.zeros((6, 3, 3, 4))), DtypeError, "int32"),
    (lambda: mx.conv3d(mx.zeros((1, 4, 4, 4, 4)), mx.zeros((4, 2, 2, 2, 2)), groups=2), ArgumentError, "groups"),
    (lambda: mx.conv_transpose1d(mx.zeros((2, 5, 3)), mx.zeros((4, 2, 3)), padding=3), ShapeError, "(4, 2, 3)"),
    (lambda: mx.convolve(mx.zeros((2, 3)), mx.zeros(3)), ShapeError, "(2, 3)"),
    (lambda: mx.convolve(mx.zeros(3), mx.zeros(0)), ShapeError, "(0,)"),
    (lambda: mx.convolve(mx.zeros(3), mx.zeros(2), mode="bad"), ArgumentError, "bad"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_names_the_argument_and_shapes(case):
    make, error, needle = BAD[case]
    with pytest.raises(error) as info:
        make()
    assert isinstance(info.value, (LazyxError, ValueError))
    assert needle in str(info.value)
    assert str(info.value).startswith("[conv") or str(info.value).startswith("[convolve]")


def test_checks_hold_after_a_layout_was_checked_once():
    # A call that passed the checks is remembered per layout and arguments: a later call
    # with the same shapes and other arguments is still checked, and the repeat of a good
    # call computes the same convolution.
    x = mx.array(np.arange(2 * 5 * 5 * 4, dtype=np.float32).reshape(2, 5, 5, 4) / 50)
    w = mx.array(np.ones((3, 3, 3, 4), np.float32))
    first = np.asarray(mx.conv2d(x, w, padding=1))
    assert np.array_equal(np.asarray(mx.conv2d(x, w, padding=1)), first)
    with pytest.raises(ShapeError, match="kernel is larger than the padded input"):
        mx.conv2d(x, w, padding=-2)
    with pytest.raises(ShapeError, match="divisible by groups"):
        mx.conv2d(x, w, padding=1, groups=3)
    with pytest.raises(DtypeError):
        mx.conv2d(x, w, padding=1.0)
