"""The ``quantized`` op pack against NumPy float64 references of MLX's formulas.

* ``dequantize(quantize(w))`` against the formula evaluated in float64 from the
  packed values (the error is at most one step per group);
* ``quantized_matmul``/``gather_qmm`` against ``dequantize`` then ``matmul`` in
  float64, both transposes, batched and broadcast, every width and mode, on the
  native ``cpu`` backend and the NumPy ``cpu-reference`` one;
* gradients with respect to ``x`` (finite differences), jvp, vmap (against a loop),
  under ``compile``; ``qqmm``'s straight-through gradient;
* bad input: lazyx errors naming the op, the argument and the shapes.
"""

import lazyx.core as mx
import numpy as np
import pytest
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop
from lazyx.backends.cpu.kernels import quantized as ref
from lazyx.errors import (
    ArgumentError,
    DtypeError,
    IndexOutOfRangeError,
    LazyxError,
    ShapeError,
)

GEN = np.random.default_rng(7)
BACKENDS = ["cpu", "cpu-reference"]
MODES = [("affine", 32, 2), ("affine", 64, 3), ("affine", 64, 4), ("affine", 128, 5),
         ("affine", 32, 6), ("affine", 64, 8), ("mxfp4", 32, 4), ("mxfp8", 32, 8),
         ("nvfp4", 16, 4)]


def _w(shape, scale=1.0):
    return (GEN.standard_normal(shape) * scale).astype(np.float32)


def _deq64(q, scales, biases, gs, bits, mode):
    """MLX's dequantization formula in float64 from the stored values."""
    codes = ref.unpack(np.asarray(q), bits)
    vals = ref.element_values(codes, mode).astype(np.float64)
    sc = ref.scale_values(np.asarray(scales), mode).astype(np.float64)
    out = vals.reshape(vals.shape[:-1] + (-1, gs)) * sc[..., None]
    if biases is not None:
        out = out + np.asarray(biases).astype(np.float64)[..., None]
    return out.reshape(vals.shape)


def _quantize(w, gs, bits, mode):
    out = mx.quantize(mx.array(w), gs, bits, mode)
    return out[0], out[1], (out[2] if mode == "affine" else None)


@pytest.mark.parametrize("mode,gs,bits", MODES)
def test_round_trip_within_a_step(mode, gs, bits):
    w = _w((6, 256), 3.0)
    q, s, b = _quantize(w, gs, bits, mode)
    assert q.dtype == mx.uint32 and q.shape == (6, 256 * bits // 32)
    assert s.shape == (6, 256 // gs)
    d = mx.dequantize(q, s, b, gs, bits, mode, dtype=mx.float32)
    want = _deq64(q, s, b, gs, bits, mode)
    assert_close(d, want, rtol=1e-6, atol=1e-6)
    err = np.abs(want - w).reshape(6, -1, gs).max(-1)
    if mode == "affine":
        # MLX anchors the grid at the edge of larger magnitude (zero stays exact), so the
        # far end may clip by up to another half step: at most one step in all
        step = np.abs(np.asarray(s).astype(np.float64))
        assert np.all(err <= step * (1 + 1e-4) + 1e-6)
    else:
        # relative to the group's largest magnitude: E2M1 keeps 1 mantissa bit, E4M3 3
        amax = np.abs(w).reshape(6, -1, gs).max(-1)
        assert np.all(err <= amax * (0.25 if bits == 4 else 0.0625) + 1e-6)


def test_pack_is_the_little_endian_bit_stream():
    vals = GEN.integers(0, 8, (2, 64)).astype(np.uint8)
    words = ref.pack(vals, 3)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").reshape(2, 64, 3)
    assert np.array_equal((bits * [1, 2, 4]).sum(-1), vals)
    assert np.array_equal(ref.unpack(words, 3), vals)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("mode,gs,bits", MODES)
def test_quantized_matmul_matches_dequantized_product(mode, gs, bits, transpose, backend):
    w = _w((2, 128, 256) if transpose else (2, 256, 128))
    x = _w((3, 2, 5, 256))  # batch (3, 2) broadcast against w's (2,)
    q, s, b = _quantize(w, gs, bits, mode)
    deq = _deq64(q, s, b, gs, bits, mode)
    want = x.astype(np.float64) @ (np.swapaxes(deq, -1, -2) if transpose else deq)
    with mx.use_backend("cpu", backend):
        got = mx.quantized_matmul(mx.array(x), q, s, b, transpose, gs, bits, mode)
        assert got.shape == (3, 2, 5, 128) and got.dtype == mx.float32
        assert_close(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_quantized_matmul_vector_and_dtypes(backend):
    w = _w((64, 128))
    q, s, b = _quantize(w, 64, 4, "affine")
    deq = _deq64(q, s, b, 64, 4, "affine")
    x = _w((128,))
    with mx.use_backend("cpu", backend):
        got = mx.quantized_matmul(mx.array(x), q, s, b)
        assert got.shape == (64,)
        assert_close(got, deq @ x, rtol=1e-4, atol=1e-4)
        # float16 x with float32 scales: float32 (MLX's promotion); all float16: float16
        h = mx.quantized_matmul(mx.array(x).astype(mx.float16), q, s, b)
        assert h.dtype == mx.float32
        q16, s16, b16 = mx.quantize(mx.array(w).astype(mx.float16))
        h = mx.quantized_matmul(mx.array(x).astype(mx.float16), q16, s16, b16)
        assert h.dtype == mx.float16
        want = _deq64(q16, s16, b16, 64, 4, "affine") @ x.astype(np.float16).astype(np.float64)
        assert_close(h, want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [True, False])
def test_gather_qmm(backend, transpose):
    w = _w((3, 32, 64) if transpose else (3, 64, 32))
    q, s, b = _quantize(w, 32, 4, "affine")
    deq = _deq64(q, s, b, 32, 4, "affine")
    if transpose:
        deq = np.swapaxes(deq, -1, -2)
    x = _w((4, 2, 64))
    lhs = np.array([[0], [3], [1]], np.int32)
    rhs = np.array([2, 0, 1, 1], np.uint32)
    with mx.use_backend("cpu", backend):
        got = mx.gather_qmm(mx.array(x), q, s, b, mx.array(lhs), mx.array(rhs), transpose,
                            32, 4)
        assert got.shape == (3, 4, 2, 32)
        li, ri = np.broadcast_arrays(lhs, rhs)
        want = np.stack([x[i] @ deq[j] for i, j in zip(li.ravel(), ri.ravel())])
        assert_close(got, want.reshape(3, 4, 2, 32), rtol=1e-4, atol=1e-4)
        with pytest.raises(IndexOutOfRangeError, match="rhs_indices"):
            mx.eval(mx.gather_qmm(mx.array(x), q, s, b, mx.array([0, 1]), mx.array([0, 3]),
                                  transpose, 32))


def test_gradients_with_respect_to_x():
    w = _w((32, 64))
    q, s, b = _quantize(w, 32, 4, "affine")
    qt, st, bt = _quantize(_w((64, 32)), 32, 8, "affine")
    gq, gs_, gb = _quantize(_w((3, 32, 64)), 32, 4, "affine")
    idx = mx.array(np.array([2, 0, 2], np.int32))
    funcs = [
        lambda x: mx.quantized_matmul(x, q, s, b, True, 32, 4),
        lambda x: mx.quantized_matmul(x, qt, st, bt, False, 32, 8),
        lambda x: mx.gather_qmm(x, gq, gs_, gb, mx.array(np.array([0, 1, 0], np.int32)), idx,
                                True, 32, 4),
    ]
    for f in funcs:
        def of_f64(x, f=f):
            return f(mx.astype(x, mx.float32))
        check_vjp_fd(of_f64, _w((2, 1, 64)).astype(np.float64), eps=1e-3, rtol=2e-2, atol=2e-3)
        check_jvp_vjp(of_f64, _w((2, 1, 64)).astype(np.float64), rtol=1e-4, atol=1e-4)


def test_no_gradient_for_the_packed_weights():
    q, s, b = _quantize(_w((32, 64)), 32, 4, "affine")
    x = mx.array(_w((2, 64)))
    with pytest.raises(LazyxError, match="no gradient wrt the quantized weights"):
        mx.grad(lambda s_: mx.quantized_matmul(x, q, s_, b, True, 32, 4).sum())(s)


def test_vmap_against_a_loop():
    w = _w((4, 32, 64))
    q, s, b = (np.asarray(a) for a in _quantize(w, 32, 4, "affine"))
    x = _w((4, 3, 64))
    # x batched, weights unbatched; then the weights batched too
    check_vmap_loop(lambda v: mx.quantized_matmul(v, mx.array(q[0]), mx.array(s[0]),
                                                  mx.array(b[0]), True, 32, 4), x)
    check_vmap_loop(lambda v, qq, ss, bb: mx.quantized_matmul(v, qq, ss, bb, True, 32, 4),
                    x, q, s, b)
    check_vmap_loop(lambda qq, ss, bb: mx.quantized_matmul(mx.array(x[0]), qq, ss, bb, True,
                                                           32, 4), q, s, b)
    check_vmap_loop(lambda v: mx.gather_qmm(v, mx.array(q), mx.array(s), mx.array(b),
                                            rhs_indices=mx.array(np.array([3, 1, 0], np.int32)),
                                            group_size=32), x.reshape(4, 3, 1, 64))
    check_vmap_loop(lambda v: list(mx.quantize(v, 32, 4)), w)
    check_vmap_loop(lambda qq, ss, bb: mx.dequantize(qq, ss, bb, 32, 4), q, s, b)


def test_under_compile():
    q, s, b = _quantize(_w((32, 64)), 64, 4, "affine")
    x = mx.array(_w((3, 64)))

    def f(v):
        return mx.exp(mx.quantized_matmul(mx.tanh(v), q, s, b) * 0.1) + 1.0
    assert_close(mx.compile(f)(x), np.asarray(f(x)), rtol=1e-5, atol=1e-6)
    g = mx.compile(mx.grad(lambda v: f(v).sum()))
    assert_close(g(x), np.asarray(mx.grad(lambda v: f(v).sum())(x)), rtol=1e-5,
                 atol=1e-6)


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_qqmm_quantizes_x_and_passes_gradients_straight_through(mode):
    w = _w((16, 64))
    x = _w((3, 64))
    gs = 16 if mode == "nvfp4" else 32
    bits = 8 if mode == "mxfp8" else 4
    got = mx.qqmm(mx.array(x), mx.array(w), mode=mode)
    xq = ref.fake_quantize(x, gs, bits, mode).astype(np.float64)
    wq, ws = ref.quantize(w, gs, bits, mode)
    want = xq @ _deq64(wq, ws, None, gs, bits, mode).T
    assert_close(got, want, rtol=1e-4, atol=1e-4)
    packed = mx.quantize(mx.array(w), mode=mode)
    g = mx.grad(lambda v: mx.qqmm(v, *packed, mode=mode).sum())(mx.array(x))
    assert_close(g, np.broadcast_to(_deq64(wq, ws, None, gs, bits, mode).sum(0),
                                                x.shape), rtol=1e-4, atol=1e-4)
    lhs = mx.array(np.array([0, 2], np.int32))
    gg = mx.gather_qqmm(mx.array(x[:, None]), mx.array(w[None]), lhs_indices=lhs, mode=mode)
    assert_close(gg, want[[0, 2]][:, None], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: mx.quantize(mx.zeros((2, 64)), 48), ArgumentError, ["quantize", "group size 48"]),
    (lambda: mx.quantize(mx.zeros((2, 64)), 64, 7), ArgumentError, ["bits 7"]),
    (lambda: mx.quantize(mx.zeros((2, 64)), mode="int4"), ArgumentError, ["'int4'"]),
    (lambda: mx.quantize(mx.zeros((2, 48)), 32), ShapeError, ["(2, 48)", "group size 32"]),
    (lambda: mx.quantize(mx.zeros((2, 64), mx.int32)), DtypeError, ["int32", "(2, 64)"]),
    (lambda: mx.quantize(mx.zeros((2, 64)), 64, mode="nvfp4"), ArgumentError, ["nvfp4", "16"]),
    (lambda: mx.dequantize(mx.zeros((2, 8)), mx.zeros((2, 1)), mx.zeros((2, 1))), DtypeError,
     ["dequantize", "uint32", "(2, 8)"]),
    (lambda: mx.dequantize(mx.zeros((2, 8), mx.uint32), mx.zeros((2, 3)), mx.zeros((2, 3))),
     ShapeError, ["(2, 8)", "(2, 3)", "group_size=64"]),
    (lambda: mx.quantized_matmul(mx.zeros((2, 32)), mx.zeros((8, 8), mx.uint32),
                                 mx.zeros((8, 1)), mx.zeros((8, 1))),
     ShapeError, ["quantized_matmul", "(..., 32)", "(8, 8)"]),
    (lambda: mx.quantized_matmul(mx.zeros((2, 64)), mx.zeros((8, 8), mx.uint32),
                                 mx.zeros((8, 1)), mx.zeros((8, 2))),
     ShapeError, ["scales", "(8, 1)", "(8, 2)"]),
    (lambda: mx.quantized_matmul(mx.zeros((2, 64)), mx.zeros((8, 8), mx.int32),
                                 mx.zeros((8, 1)), mx.zeros((8, 1))), DtypeError, ["int32"]),
    (lambda: mx.quantized_matmul(mx.zeros((2, 64)), mx.zeros((8, 8), mx.uint32),
                                 mx.zeros((8, 1))), ArgumentError, ["Biases"]),
    (lambda: mx.gather_qmm(mx.zeros((2, 64)), mx.zeros((3, 8, 8), mx.uint32),
                           mx.zeros((3, 8, 1)), mx.zeros((3, 8, 1)),
                           rhs_indices=mx.array([0.0])), DtypeError, ["rhs_indices"]),
    (lambda: mx.qqmm(mx.zeros((2, 64)), mx.zeros((8, 64)), mode="affine"), ArgumentError,
     ["qqmm", "affine"]),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value)


# -- the decode-shaped fast path (transpose, M <= 8) ---------------------------------
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("mode,gs,bits,sdtype", [
    ("affine", 32, 2, np.float32), ("affine", 64, 4, np.float16), ("affine", 128, 8, np.float32),
    ("affine", 64, 4, "bfloat16"), ("affine", 64, 3, np.float32), ("mxfp4", 32, 4, None),
    ("nvfp4", 16, 4, None), ("mxfp8", 32, 8, None)])
def test_decode_rows_against_float64(rows, mode, gs, bits, sdtype):
    """1..8 rows of x by packed weights with scales (and biases) as stored: float16 and
    bfloat16 scales and E8M0/E4M3 codes are read by the kernel itself."""
    w = _w((24, 256), 2.0)
    x = _w((rows, 256))
    wm = mx.array(w) if sdtype is None else mx.array(w).astype(
        mx.bfloat16 if sdtype == "bfloat16" else mx.float16 if sdtype is np.float16 else mx.float32)
    q, s, *b = mx.quantize(wm, gs, bits, mode)
    b = b[0] if b else None
    want = x.astype(np.float64) @ _deq64(q, s, b, gs, bits, mode).T
    got = mx.quantized_matmul(mx.array(x), q, s, b, True, gs, bits, mode)
    assert_close(got.astype(mx.float32), want, rtol=2e-3 if sdtype not in (None, np.float32)
                 else 1e-4, atol=1e-3 * np.abs(want).max())


def test_gather_qmm_decode_rows_against_float64():
    w = _w((3, 16, 128))
    x = _w((2, 4, 128))
    q, s, b = _quantize(w, 64, 4, "affine")
    deq = _deq64(q, s, b, 64, 4, "affine")
    lhs, rhs = np.array([1, 0, 1]), np.array([2, 2, 0])
    got = mx.gather_qmm(mx.array(x), q, s, b, mx.array(lhs), mx.array(rhs), True, 64, 4)
    want = np.stack([x[i].astype(np.float64) @ deq[j].T for i, j in zip(lhs, rhs)])
    assert_close(got, want, rtol=1e-4, atol=1e-3)


# -- nvfp4 global scale -----------------------------------------------------------------
def _global_deq64(q, scales, g, bits=4):
    """fp(q) * scale * g / 2688 in float64."""
    vals = ref.element_values(ref.unpack(np.asarray(q), bits), "nvfp4").astype(np.float64)
    sc = ref.scale_values(np.asarray(scales), "nvfp4").astype(np.float64) * float(g) / 2688
    return (vals.reshape(vals.shape[:-1] + (-1, 16)) * sc[..., None]).reshape(vals.shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_scale_round_trip(backend):
    """With g the tensor's amax, the group scales use E4M3's range and dequantize
    recovers w within one E2M1 step of each group's scale."""
    w = _w((6, 64), 3.0)
    g = mx.array(np.abs(w).max(), dtype=mx.float32)
    with mx.use_backend("cpu", backend):
        q, s = mx.quantize(mx.array(w), mode="nvfp4", global_scale=g)
        d = mx.dequantize(q, s, mode="nvfp4", global_scale=g, dtype=mx.bfloat16)
    assert d.dtype == mx.float32  # as MLX: the float32 global scale decides
    want = _global_deq64(q, s, np.abs(w).max())
    assert_close(d, want, rtol=1e-6, atol=0)
    step = (np.abs(w).reshape(6, 4, 16).max(-1) / 6 * 2)[..., None]  # the widest E2M1 gap
    assert np.all(np.abs(np.asarray(d).reshape(6, 4, 16) - w.reshape(6, 4, 16)) <= step * 1.07)
    assert np.asarray(s).max() >= 0x78  # large codes: the scales span E4M3's range


def test_qqmm_with_global_scales_against_float64():
    x, w = _w((3, 64)), _w((5, 64), 2.0)
    gx = mx.array(np.abs(x).max(), dtype=mx.float32)
    gw = mx.array(np.abs(w).max(), dtype=mx.float32)
    got = mx.qqmm(mx.array(x), mx.array(w), global_scale_x=gx, global_scale_w=gw)
    xq = _global_deq64(*mx.quantize(mx.array(x), mode="nvfp4", global_scale=gx), np.asarray(gx))
    wq = _global_deq64(*mx.quantize(mx.array(w), mode="nvfp4", global_scale=gw), np.asarray(gw))
    assert_close(got, xq @ wq.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: mx.quantize(mx.zeros((2, 32)), mode="mxfp4", global_scale=mx.array(1.0)),
     ArgumentError, ["quantize", "nvfp4", "mxfp4"]),
    (lambda: mx.quantize(mx.zeros((2, 32)), mode="nvfp4", global_scale=mx.array([1.0, 2.0])),
     ShapeError, ["scalar", "(2,)"]),
    (lambda: mx.quantize(mx.zeros((2, 32)), mode="nvfp4",
                         global_scale=mx.array(1.0, dtype=mx.float16)), DtypeError, ["float16"]),
    (lambda: mx.quantize(mx.zeros((2, 32)), mode="nvfp4", global_scale=2.0), DtypeError,
     ["float32 array"]),
    (lambda: mx.dequantize(mx.zeros((2, 4), mx.uint32), mx.zeros((2, 1), mx.uint8),
                           mode="mxfp8", global_scale=mx.array(1.0)), ArgumentError,
     ["dequantize", "nvfp4"]),
    (lambda: mx.qqmm(mx.zeros((1, 32)), mx.zeros((4, 32)), global_scale_x=mx.array(1.0)),
     ArgumentError, ["qqmm", "both"]),
])
def test_global_scale_bad_input(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value)


def test_global_scale_vmap_unbatched():
    w = _w((3, 4, 32))
    g = mx.array(5.0, dtype=mx.float32)
    got = mx.vmap(lambda a: mx.dequantize(*mx.quantize(a, mode="nvfp4", global_scale=g),
                                          mode="nvfp4", global_scale=g))(mx.array(w))
    want = np.stack([np.asarray(mx.dequantize(*mx.quantize(mx.array(a), mode="nvfp4",
                                                            global_scale=g),
                                              mode="nvfp4", global_scale=g)) for a in w])
    assert_close(got, want, rtol=0, atol=0)
