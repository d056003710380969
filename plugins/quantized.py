"""Op pack ``quantized``: MLX 0.32's ``quantize``, ``dequantize``, ``quantized_matmul``,
``gather_qmm``, ``qqmm`` and ``gather_qqmm``, with MLX's packing bit for bit.

Formats (one table, :data:`MODES`): every ``group_size`` consecutive elements of a
row share a scale. ``affine`` (bits 2, 3, 4, 5, 6, 8; groups of 32, 64, 128) stores
``round((w - bias) / scale)`` in ``bits`` bits with a scale and a bias of ``w``'s dtype
per group; ``mxfp4``/``mxfp8`` (groups of 32) store E2M1 / E4M3 values with an E8M0
(power of two) scale; ``nvfp4`` (groups of 16) E2M1 values with an E4M3 scale. The
packed row is the little-endian bit stream of its values (value ``i`` in bits
``[i*bits, (i+1)*bits)``) held in uint32 words, which is how MLX lays out every width
(it writes 3-, 5- and 6-bit values byte-wise: the same stream).

The flow of a call:

1. :func:`_params` resolves ``group_size``/``bits`` (None: the mode's default) and checks
   them against the mode (an :class:`~lazyx.errors.ArgumentError`, MLX's ValueError).
2. The op checks shapes and dtypes with MLX's messages, naming the op, the argument
   and the shapes, and puts its operands in the one layout the primitive takes:
   :class:`QuantizedMatmul` ``(x, w, scales[, biases])`` with ``x`` at least 2-D
   (batch dims broadcast in the kernel); :class:`GatherQMM` ``(x, w, scales[, biases],
   lhs, rhs)`` with ``x`` ``(nx, M, K)``, ``w`` ``(nw, ...)`` and int32 flat indices
   broadcast to one shape ``I`` (the result is ``I + (M, N)``), as ``gather_mm``.
3. One node computes: the kernels multiply from the packed words (C++ on the
   ``cpu`` backend, ``lazyx.backends.cpu.native_packs.quantized``; CUDA C++ on ``cuda``).

``nvfp4`` takes an optional per-tensor ``global_scale`` (a float32 scalar array, MLX's
convention: the tensor's absolute maximum, so that the E4M3 group scales span their
whole range): :func:`quantize` stores the group scale ``e4m3(amax/6 * 2688/g)`` and the
elements ``fp4(w/scale * 2688/g)``; :func:`dequantize` multiplies by ``scale * (g/2688)``
and returns float32 (as MLX: the scalar's dtype wins). It travels as the last input
of :class:`Quantize`/:class:`Dequantize` (present or not: the input count says).

``qqmm``/``gather_qqmm`` quantize ``x`` on the fly (quantize then dequantize, with the
straight-through identity as gradient, as MLX's) and ``w`` too when it comes
unquantized, then multiply with ``quantized_matmul``/``gather_qmm``: no primitive of
their own.

Rules: ``quantized_matmul`` is linear in ``x``: its vjp is a quantized_matmul of the
cotangent with ``transpose`` flipped, its jvp that of the tangent. The packed
weights, scales and biases get no gradient (MLX raises for the packed weights; lazyx
raises for all three). ``quantize`` carries no gradient; ``dequantize`` is linear in
nothing differentiable (its input is integer), so it carries none either.
"""

from __future__ import annotations

import math
from typing import Literal

import lazyx.core as mx
import numpy as np
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast
from lazyx.array import array, from_buffer, lazy, lazy_multi
from lazyx.device import to_stream
from lazyx.errors import (ArgumentError, DtypeError, IndexOutOfRangeError, ShapeError,
                          TransformError)
from lazyx.examples import example, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive
from lazyx.rules import NoGradient, add_batch_axis, batch_first, sum_to_shape

#: Per mode: the group sizes and bits it takes, its defaults (MLX's table), and the
#: dtype of its scales (None: the input's dtype) and whether it has biases.
MODES = {
    "affine": {"group_sizes": (32, 64, 128), "bits": (2, 3, 4, 5, 6, 8),
               "group_size": 64, "default_bits": 4, "scale_dtype": None, "biases": True},
    "mxfp4": {"group_sizes": (32,), "bits": (4,), "group_size": 32, "default_bits": 4,
              "scale_dtype": dt.uint8, "biases": False},
    "mxfp8": {"group_sizes": (32,), "bits": (8,), "group_size": 32, "default_bits": 8,
              "scale_dtype": dt.uint8, "biases": False},
    "nvfp4": {"group_sizes": (16,), "bits": (4,), "group_size": 16, "default_bits": 4,
              "scale_dtype": dt.uint8, "biases": False},
}
_FLOATS = (dt.float32, dt.float16, dt.bfloat16)


# -- argument checks -----------------------------------------------------------------
def _params(group_size, bits, mode, op: str) -> tuple[int, int, str]:
    """``(group_size, bits, mode)`` with the mode's defaults filled in, checked."""
    if mode not in MODES:
        raise ArgumentError(f"[{op}] Invalid quantization mode {mode!r}: expected one of "
                            f"{', '.join(MODES)}.")
    m = MODES[mode]
    gs = m["group_size"] if group_size is None else group_size
    b = m["default_bits"] if bits is None else bits
    if type(gs) is not int or type(b) is not int:
        raise DtypeError(f"[{op}] group_size and bits must be integers, got "
                         f"group_size={group_size!r} and bits={bits!r}.")
    if mode == "affine":
        if gs not in m["group_sizes"]:
            raise ArgumentError(f"[{op}] The requested group size {gs} is not supported. The "
                                f"supported group sizes are 32, 64 and 128.")
        if b not in m["bits"]:
            raise ArgumentError(f"[{op}] The requested number of bits {b} is not supported. "
                                f"The supported bits are 2, 3, 4, 5, 6 and 8.")
    else:
        if gs != m["group_size"]:
            raise ArgumentError(f"[{op}] {mode} quantization requires group size "
                                f"{m['group_size']} but got {gs}.")
        if b != m["default_bits"]:
            raise ArgumentError(f"[{op}] {mode} quantization requires bits to be "
                                f"{m['default_bits']} but got {b}.")
    return gs, b, mode


def _packed(w: array, op: str) -> None:
    if w._dtype is not dt.uint32:
        raise DtypeError(f"[{op}] The weight matrix should be uint32 but received "
                         f"{w._dtype.name} (shape {w._shape}): pass the packed output of "
                         f"quantize.")
    if len(w._shape) < 2:
        raise ShapeError(f"[{op}] The quantized matrix must have at least 2 dimensions, got "
                         f"shape {w._shape}.")


def _scales_biases(w: array, scales, biases, gs: int, bits: int, mode: str, op: str):
    """``scales`` (and ``biases``) as arrays checked against packed ``w``."""
    scales = as_array(scales)
    if MODES[mode]["biases"]:
        if biases is None:
            raise ArgumentError(f"[{op}] Biases must be provided for affine quantization.")
        biases = as_array(biases)
        if biases._shape != scales._shape:
            raise ShapeError(f"[{op}] Scales and biases should have the same shape. Received "
                             f"scales with shape {scales._shape} and biases with "
                             f"{biases._shape}.")
        if scales._dtype.kind != "f" or biases._dtype.kind != "f":
            raise DtypeError(f"[{op}] scales and biases must be floating, got "
                             f"{scales._dtype.name} and {biases._dtype.name}.")
    else:
        biases = None
        if scales._dtype is not dt.uint8:
            raise DtypeError(f"[{op}] {mode} scales must be uint8, got {scales._dtype.name} "
                             f"(shape {scales._shape}).")
    n = w._shape[-1] * 32
    if n % bits or (n // bits) % gs or scales._shape != w._shape[:-1] + (n // bits // gs,):
        raise ShapeError(f"[{op}] Shape of scales and biases does not match the matrix given "
                         f"the quantization parameters. Provided matrix of shape {w._shape} "
                         f"and scales/biases of shape {scales._shape} with group_size={gs} "
                         f"and bits={bits}.")
    return scales, biases


#: E4M3's largest value times E2M1's: a group scale of amax/6 relative to a global
#: scale g (the tensor's amax) is stored as amax/6 * NVFP4_RANGE/g.
NVFP4_RANGE = 448.0 * 6.0


def _global_scale(g, mode: str, op: str):
    """``g`` checked as MLX checks an nvfp4 global scale (None passes)."""
    if g is None:
        return None
    if mode != "nvfp4":
        raise ArgumentError(f"[{op}] Global scale is only supported for 'nvfp4' quantization "
                            f"mode, got mode {mode!r}.")
    if not isinstance(g, array):
        raise DtypeError(f"[{op}] Global scale must be a float32 array, got "
                         f"{type(g).__name__}: pass mx.array(value, dtype=mx.float32).")
    if g._dtype is not dt.float32:
        raise DtypeError(f"[{op}] Global scale must have dtype float32 but got "
                         f"{g._dtype.name} (shape {g._shape}).")
    if math.prod(g._shape) != 1:
        raise ShapeError(f"[{op}] Global scale must be a scalar but got shape {g._shape}.")
    return g


def _scalar_unbatched(inputs, axes, has_global: bool, op: str):
    """vmap: the global scale (the last input) must not be batched (one per tensor)."""
    if has_global and axes[-1] is not None:
        raise TransformError(f"[{op}::vmap] the global scale (shape {inputs[-1]._shape}) "
                             f"cannot be batched: it is one scalar per tensor.")


# -- quantize ------------------------------------------------------------------------
class Quantize(NoGradient, Primitive):
    """``w`` (at least 2-D, last axis a multiple of ``group_size``) to its packed
    uint32 words, scales and (affine) biases, bit for bit as MLX. Inputs ``(w,)`` or
    ``(w, global_scale)`` (nvfp4)."""

    __slots__ = ("group_size", "bits", "mode")
    group_size: int
    bits: int
    mode: Literal[tuple(MODES)]

    def output_shapes(self, inputs):
        s = inputs[0].shape
        lead, n = s[:-1], s[-1]
        out = [lead + (n * self.bits // 32,), lead + (n // self.group_size,)]
        return out + out[1:] if MODES[self.mode]["biases"] else out

    def output_dtypes(self, inputs):
        sd = MODES[self.mode]["scale_dtype"] or inputs[0].dtype
        return [dt.uint32, sd] + ([sd] if MODES[self.mode]["biases"] else [])

    def vmap(self, inputs, axes):
        _scalar_unbatched(inputs, axes, len(inputs) > 1, "Quantize")
        x = batch_first(inputs[0], axes[0], stream=self.stream)
        outs = _quantize_node(x, self.group_size, self.bits, self.mode, self.stream,
                              inputs[1] if len(inputs) > 1 else None)
        return outs, [0] * len(outs)


def _quantize_node(w: array, gs: int, bits: int, mode: str, stream, global_scale=None) -> list:
    p = Quantize(stream, gs, bits, mode)
    ins = (w,) if global_scale is None else (w, global_scale)
    return lazy_multi(p.output_shapes(ins), p.output_dtypes(ins), p, ins)


def quantize(w, /, group_size: int | None = None, bits: int | None = None,
             mode: str = "affine", *, global_scale=None, stream=None) -> tuple:
    """Quantize ``w`` by groups of ``group_size`` elements of its last axis.

    Args:
        w (array): The matrix to quantize (at least 2-D, float32, float16 or bfloat16).
        group_size (int, optional): Elements sharing a scale (None: the mode's default:
            64 for ``affine``, 32 for ``mxfp4``/``mxfp8``, 16 for ``nvfp4``).
        bits (int, optional): Bits per element (None: 4, or 8 for ``mxfp8``).
        mode (str): ``"affine"``, ``"mxfp4"``, ``"mxfp8"`` or ``"nvfp4"``.
        global_scale (array, optional): ``nvfp4`` only: a float32 scalar, the tensor's
            absolute maximum as MLX expects it (see the module docstring).

    Returns:
        tuple: ``(w_q, scales, biases)`` for ``affine``, ``(w_q, scales)`` otherwise:
        ``w_q`` uint32 of shape ``(..., n * bits / 32)``; scales of ``w``'s dtype
        (affine) or uint8 (E8M0 / E4M3 codes).
    """
    op = "quantize"
    gs, bits, mode = _params(group_size, bits, mode, op)
    global_scale = _global_scale(global_scale, mode, op)
    w = as_array(w)
    if w._dtype.kind != "f" or w._dtype not in _FLOATS:
        raise DtypeError(f"[{op}] Only real floating types (float32, float16, bfloat16) can "
                         f"be quantized but w has type {w._dtype.name} (shape {w._shape}).")
    if len(w._shape) < 2:
        raise ShapeError(f"[{op}] The matrix to be quantized must have at least 2 dimension "
                         f"but it has only {len(w._shape)} (shape {w._shape}).")
    if w._shape[-1] % gs:
        raise ShapeError(f"[{op}] The last dimension of the matrix needs to be divisible by "
                         f"the quantization group size {gs}. However the provided matrix "
                         f"has shape {w._shape}.")
    return tuple(_quantize_node(w, gs, bits, mode, to_stream(stream), global_scale))


# -- dequantize ----------------------------------------------------------------------
class Dequantize(NoGradient, Primitive):
    """Packed ``w``, ``scales`` (and ``biases``) back to values of ``dtype``. Inputs
    ``(w, scales[, biases])``, or ``(w, scales, global_scale)`` for nvfp4 with a global
    scale (then ``dtype`` is float32)."""

    __slots__ = ("group_size", "bits", "mode", "dtype")
    group_size: int
    bits: int
    mode: Literal[tuple(MODES)]
    dtype: dt.Dtype

    def output_shapes(self, inputs):
        s = inputs[0].shape
        return [s[:-1] + (s[-1] * 32 // self.bits,)]

    def output_dtypes(self, inputs):
        return [self.dtype]

    def vmap(self, inputs, axes):
        has_global = len(inputs) == 3 and not MODES[self.mode]["biases"]
        _scalar_unbatched(inputs, axes, has_global, "Dequantize")
        packed = inputs[:2] if has_global else inputs
        n = next(x._shape[a] for x, a in zip(inputs, axes) if a is not None)
        ins = [add_batch_axis(x, 0, n, self.stream) if a is None
               else batch_first(x, a, stream=self.stream) for x, a in zip(packed, axes)]
        return [_dequantize_node(ins + list(inputs[2:] if has_global else []), self.group_size,
                                 self.bits, self.mode, self.dtype, self.stream)], [0]


def _dequantize_node(ins, gs, bits, mode, dtype, stream) -> array:
    p = Dequantize(stream, gs, bits, mode, dtype)
    return lazy(p.output_shapes(ins)[0], dtype, p, tuple(ins))


def dequantize(w, /, scales, biases=None, group_size: int | None = None,
               bits: int | None = None, mode: str = "affine", global_scale=None,
               dtype=None, *, stream=None) -> array:
    """Dequantize packed ``w`` with its ``scales`` (and ``biases`` for ``affine``):
    ``scale * q + bias`` per group, or ``scale * fp(q)`` for the float modes
    (``fp(q) * (scale * (global_scale / 2688))`` for nvfp4 with a global scale).

    Returns:
        array: The values, of ``dtype`` (None: the scales' dtype for ``affine``,
        bfloat16 for the float modes, as MLX); float32 whenever a global scale is given
        (as MLX, whatever ``dtype`` says).
    """
    op = "dequantize"
    gs, bits, mode = _params(group_size, bits, mode, op)
    global_scale = _global_scale(global_scale, mode, op)
    w = as_array(w)
    if w._dtype is not dt.uint32:
        raise DtypeError(f"[{op}] The matrix should be given as a uint32, got "
                         f"{w._dtype.name} (shape {w._shape}).")
    if len(w._shape) < 2:
        raise ShapeError(f"[{op}] The matrix to be dequantized must have at least 2 dimension "
                         f"but it has only {len(w._shape)} (shape {w._shape}).")
    scales, biases = _scales_biases(w, scales, biases, gs, bits, mode, op)
    if dtype is None:
        dtype = scales._dtype if MODES[mode]["biases"] else dt.bfloat16
    if dtype not in _FLOATS:
        raise DtypeError(f"[{op}] dtype must be float32, float16 or bfloat16, got {dtype}.")
    ins = [w, scales] + ([biases] if biases is not None else [])
    if global_scale is not None:
        ins, dtype = ins + [global_scale], dt.float32
    return _dequantize_node(ins, gs, bits, mode, dtype, to_stream(stream))


# -- quantized_matmul ----------------------------------------------------------------
def _no_weight_gradient(prim, argnums, first_weight: int):
    """MLX has no gradient for the packed weights; lazyx none for their scales and biases
    either (a derivative with respect to a group's scale is not what a user training
    through a quantized layer wants): a clear error instead of a silent zero."""
    if any(a >= first_weight for a in argnums):
        raise TransformError(f"[{type(prim).__name__}::vjp] no gradient wrt the quantized "
                             f"weights, scales or biases: differentiate with respect to x "
                             f"only (argnums {argnums}).")


class _QuantizedProduct(Primitive):
    """The parameters of the products with packed weights: how ``w`` is quantized, and
    whether it multiplies transposed."""

    __slots__ = ("group_size", "bits", "mode", "transpose")
    group_size: int
    bits: int
    mode: Literal[tuple(MODES)]
    transpose: bool

    def columns(self, w_shape: tuple) -> int:
        """N: the output columns of a product with packed weights of shape ``w_shape``."""
        return w_shape[-2] if self.transpose else w_shape[-1] * 32 // self.bits


# The kernels' common layout (CPU native, CUDA, Metal): ``out[p] = x[xi[p]] @ W(wi[p])`` over
# index pairs into the flat batches of x and w.
def batch_pairs(xlead: tuple, wlead: tuple) -> tuple:
    """``(batch, xi, wi)`` of ``quantized_matmul``: the broadcast batch of x's and w's
    batch shapes and, per position of it, the flat positions in each (int64 NumPy)."""
    batch = np.broadcast_shapes(xlead, wlead)
    xi = np.broadcast_to(np.arange(math.prod(xlead), dtype=np.int64).reshape(xlead), batch)
    wi = np.broadcast_to(np.arange(math.prod(wlead), dtype=np.int64).reshape(wlead), batch)
    return batch, xi.ravel(), wi.ravel()


def check_gather_pairs(xi, wi, nx: int, nw: int) -> None:
    """``gather_qmm``'s error when an index pair leaves x's (``nx``) or w's (``nw``) flat
    batch; ``xi``, ``wi`` NumPy or CuPy arrays of one size."""
    if xi.size and bool(((xi < 0) | (xi >= nx) | (wi < 0) | (wi >= nw)).any()):
        raise IndexOutOfRangeError(
            f"[gather_qmm] indices out of range: lhs_indices must lie in [0, {nx}) and "
            f"rhs_indices in [0, {nw}) (the flat batch sizes of x and w).")


class QuantizedMatmul(_QuantizedProduct):
    """``x @ dequantize(w).T`` (``transpose``) or ``x @ dequantize(w)``, computed from the
    packed words. ``x`` is at least 2-D; its batch dims broadcast with ``w``'s."""

    __slots__ = ()

    def output_shapes(self, inputs):
        x, w = inputs[0].shape, inputs[1].shape
        return [broadcast_shapes(x[:-2], w[:-2]) + (x[-2], self.columns(w))]

    def _again(self, x, inputs, transpose):
        return _qmm_node(x, list(inputs[1:]), self.group_size, self.bits, self.mode,
                         transpose, x._dtype, self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        _no_weight_gradient(self, argnums, 1)
        g = self._again(cotangents[0], primals, not self.transpose)
        x = primals[0]
        return [cast(sum_to_shape(g, x._shape, self.stream), x._dtype, self.stream)]

    def jvp(self, primals, tangents, argnums):
        _no_weight_gradient(self, argnums, 1)
        return [self._again(tangents[0], primals, self.transpose)]

    def vmap(self, inputs, axes):
        s = self.stream
        x, rest = inputs[0], list(inputs[1:])
        ax, rest_axes = axes[0], list(axes[1:])
        n = next(v._shape[a] for v, a in zip(inputs, axes) if a is not None)
        # Per-example ranks of x and of the weights: batch axes go first, padded with
        # ones so that broadcasting lines the per-example batch dims up.
        rx = len(x._shape) - (ax is not None)
        rw = len(rest[0]._shape) - (rest_axes[0] is not None)
        r = max(rx, rw)
        if any(a is not None for a in rest_axes):
            rest = [batch_first(v, a, r, s) if a is not None
                    else batch_first(add_batch_axis(v, 0, n, s), 0, r, s)
                    for v, a in zip(rest, rest_axes)]
        if ax is not None:
            x = batch_first(x, ax, r, s)
        elif any(a is not None for a in rest_axes):
            x = mx.reshape(x, (1,) * (r + 1 - rx) + x._shape, stream=s)
        return [self._again(x, [x] + rest, self.transpose)], [0]


def _qmm_node(x, rest, gs, bits, mode, transpose, out_dtype, stream) -> array:
    p = QuantizedMatmul(stream, gs, bits, mode, transpose)
    ins = (x, *rest)
    return lazy(p.output_shapes(ins)[0], out_dtype, p, ins)


def _operand_dtype(x: array, scales: array, biases, mode: str) -> dt.Dtype:
    """MLX's result dtype: ``x``'s promoted with the scales and biases (affine), or
    ``x``'s (the float modes; float32 for a non-floating ``x``)."""
    if biases is not None:
        return mx.result_type(x._dtype, scales._dtype, biases._dtype)
    return x._dtype if x._dtype in _FLOATS else dt.float32


def _check_qmm(x, w, scales, biases, transpose, gs, bits, mode, op):
    x = as_array(x)
    w = as_array(w)
    _packed(w, op)
    scales, biases = _scales_biases(w, scales, biases, gs, bits, mode, op)
    if not x._shape:
        raise ShapeError(f"[{op}] x must have at least 1 dimension, got a 0-d array.")
    rows, cols = w._shape[-2], w._shape[-1] * 32 // bits
    k = cols if transpose else rows
    if x._shape[-1] != k:
        full = (rows, cols)
        raise ShapeError(f"[{op}] Last dimension of first input with shape (..., "
                         f"{x._shape[-1]}) does not match the expanded quantized matrix "
                         f"{full} computed from shape {w._shape} with group_size={gs}, "
                         f"bits={bits} and transpose={str(transpose).lower()}.")
    d = _operand_dtype(x, scales, biases, mode)
    if d not in _FLOATS:
        raise DtypeError(f"[{op}] only floating types are supported, got {d.name}.")
    return cast(x, d), w, scales, biases, d


def quantized_matmul(x, w, /, scales, biases=None, transpose: bool = True,
                     group_size: int | None = None, bits: int | None = None,
                     mode: str = "affine", *, stream=None) -> array:
    """``x @ w.T`` (``transpose``) or ``x @ w`` with ``w`` quantized by :func:`quantize`,
    computed from the packed words (the dequantized matrix is never formed).

    Args:
        x (array): The input, ``(..., K)``.
        w (array): Packed uint32 words: ``(..., N, K * bits / 32)`` with ``transpose``,
            ``(..., K, N * bits / 32)`` without.
        scales, biases (array): ``w``'s scales and (affine) biases.
        transpose (bool): Multiply by ``w.T`` (True) or ``w``.

    Returns:
        array: ``(..., N)``, of ``x``'s dtype promoted with the scales'.
    """
    op = "quantized_matmul"
    gs, bits, mode = _params(group_size, bits, mode, op)
    x, w, scales, biases, d = _check_qmm(x, w, scales, biases, bool(transpose), gs, bits,
                                         mode, op)
    vector = len(x._shape) == 1
    s = to_stream(stream)
    if vector:
        x = mx.reshape(x, (1,) + x._shape, stream=s)
    rest = [w, scales] + ([biases] if biases is not None else [])
    out = _qmm_node(x, rest, gs, bits, mode, bool(transpose), d, s)
    return mx.squeeze(out, -2, stream=s) if vector else out


# -- gather_qmm ----------------------------------------------------------------------
class GatherQMM(_QuantizedProduct):
    """``out[i] = quantized_matmul(x[lhs[i]], w[rhs[i]])``: inputs ``(x, w, scales[,
    biases], lhs, rhs)`` with ``x`` ``(nx, M, K)``, ``w`` ``(nw, ...)`` and int32 index
    arrays of one shape ``I``; the result is ``I + (M, N)``."""

    __slots__ = ()

    def output_shapes(self, inputs):
        x, w, idx = inputs[0].shape, inputs[1].shape, inputs[-1].shape
        return [idx + (x[-2], self.columns(w))]

    def vjp(self, primals, cotangents, argnums, outputs):
        _no_weight_gradient(self, [a for a in argnums if a < len(primals) - 2], 1)
        s = self.stream
        x, lhs, rhs = primals[0], primals[-2], primals[-1]
        g = cotangents[0]
        m, n = g._shape[-2:]
        flat = mx.reshape(g, (-1, m, n), stream=s)
        count = flat._shape[0]
        ident = from_buffer(np.arange(count, dtype=np.int32), dt.int32)
        gx = _gqmm_node(flat, list(primals[1:-2]), ident, mx.reshape(rhs, (-1,), stream=s),
                        self, not self.transpose)
        zeros = mx.zeros(x._shape, dtype=x._dtype, stream=s)
        gx = zeros.at[mx.reshape(lhs, (-1,), stream=s)].add(cast(gx, x._dtype, s))
        return [gx if a == 0 else mx.zeros_like(primals[a], stream=s) for a in argnums]

    def jvp(self, primals, tangents, argnums):
        _no_weight_gradient(self, [a for a in argnums if a < len(primals) - 2], 1)
        return [_gqmm_node(tangents[0], list(primals[1:-2]), primals[-2], primals[-1], self,
                           self.transpose)]

    def vmap(self, inputs, axes):
        s = self.stream
        x, lhs, rhs = inputs[0], inputs[-2], inputs[-1]
        weights, waxes = list(inputs[1:-2]), list(axes[1:-2])
        n = next(v._shape[a] for v, a in zip(inputs, axes) if a is not None)
        # Fold the vmapped axis into the flat batch of x and of the weights: example b
        # reads x[b * nx + lhs] and w[b * nw + rhs].
        if axes[0] is not None:
            x = batch_first(x, axes[0], stream=s)
            nx = x._shape[1]
            x = mx.reshape(x, (-1,) + x._shape[2:], stream=s)
            lhs = _offset_indices(lhs, axes[-2], n, nx, s)
        if any(a is not None for a in waxes):
            weights = [batch_first(v, a, stream=s) if a is not None else
                       add_batch_axis(v, 0, n, s) for v, a in zip(weights, waxes)]
            nw = weights[0]._shape[1]
            weights = [mx.reshape(v, (-1,) + v._shape[2:], stream=s) for v in weights]
            rhs = _offset_indices(rhs, axes[-1], n, nw, s)
        lhs = _batched_index(lhs, axes[-2] if axes[0] is None else 0, n, s)
        rhs = _batched_index(rhs, 0 if any(a is not None for a in waxes) else axes[-1], n, s)
        shape = broadcast_shapes(lhs._shape, rhs._shape)
        lhs, rhs = mx.broadcast_to(lhs, shape, stream=s), mx.broadcast_to(rhs, shape, stream=s)
        return [_gqmm_node(x, weights, lhs, rhs, self, self.transpose)], [0]


def _batched_index(idx, axis, n, s):
    """Index array ``idx`` with its batch at the front (size ``n``, broadcast if absent)."""
    if axis is None:
        return add_batch_axis(idx, 0, n, s)
    return batch_first(idx, axis, stream=s)


def _offset_indices(idx, axis, n, size, s):
    """``b * size + idx`` for each example ``b``, batched at axis 0."""
    idx = _batched_index(idx, axis, n, s)
    offsets = np.arange(n, dtype=np.int32) * size
    base = from_buffer(offsets.reshape((n,) + (1,) * (len(idx._shape) - 1)), dt.int32)
    return mx.add(idx, base, stream=s)


def _gqmm_node(x, weights, lhs, rhs, like, transpose) -> array:
    p = GatherQMM(like.stream, like.group_size, like.bits, like.mode, transpose)
    ins = (x, *weights, lhs, rhs)
    return lazy(p.output_shapes(ins)[0], x._dtype, p, ins)


def _indices(idx, batch: tuple, what: str, op: str):
    """``idx`` as int32 (an arange over ``batch`` when None), checked."""
    size = math.prod(batch)
    if idx is None:
        return from_buffer(np.arange(size, dtype=np.int32).reshape(batch), dt.int32)
    idx = as_array(idx)
    if idx._dtype.kind not in "iu":
        raise DtypeError(f"[{op}] Got indices with invalid dtype {idx._dtype.name} for "
                         f"{what} (shape {idx._shape}). Indices must be integral.")
    return cast(idx, dt.int32)


def gather_qmm(x, w, /, scales, biases=None, lhs_indices=None, rhs_indices=None,
               transpose: bool = True, group_size: int | None = None,
               bits: int | None = None, mode: str = "affine", *,
               sorted_indices: bool = False, stream=None) -> array:
    """:func:`quantized_matmul` with matrix-level gather, as :func:`gather_mm`:
    ``lhs_indices``/``rhs_indices`` are flat indices into the batch dims (all but the
    last two) of ``x`` and ``w``; ``scales``/``biases`` have ``w``'s batch dims.

    Returns:
        array: ``broadcast(lhs_indices, rhs_indices).shape + (M, N)``.
    """
    op = "gather_qmm"
    gs, bits, mode = _params(group_size, bits, mode, op)
    x, w, scales, biases, d = _check_qmm(x, w, scales, biases, bool(transpose), gs, bits,
                                         mode, op)
    s = to_stream(stream)
    vector = len(x._shape) == 1
    if vector:
        x = mx.reshape(x, (1,) + x._shape, stream=s)
    xb, wb = x._shape[:-2], w._shape[:-2]
    lhs = _indices(lhs_indices, xb, "lhs_indices", op)
    rhs = _indices(rhs_indices, wb, "rhs_indices", op)
    shape = broadcast_shapes(lhs._shape, rhs._shape, op=op)
    # (indices of one shape already, the common case, take no broadcast node)
    if lhs._shape != shape:
        lhs = mx.broadcast_to(lhs, shape, stream=s)
    if rhs._shape != shape:
        rhs = mx.broadcast_to(rhs, shape, stream=s)
    x = mx.reshape(x, (-1,) + x._shape[-2:], stream=s)
    weights = [mx.reshape(v, (-1,) + v._shape[-2:], stream=s)
               for v in [w, scales] + ([biases] if biases is not None else [])]
    p = GatherQMM(s, gs, bits, mode, bool(transpose))
    ins = (x, *weights, lhs, rhs)
    out = lazy(p.output_shapes(ins)[0], d, p, ins)
    return mx.squeeze(out, -2, stream=s) if vector else out


# -- qqmm ----------------------------------------------------------------------------
def _fake_quantize(x, gs, bits, mode, stream, global_scale=None) -> array:
    """``dequantize(quantize(x))`` whose gradient is the straight-through identity (as
    MLX's ``qqmm``): ``x + stop_gradient(fq(x) - x)``, which is ``fq(x)`` exactly where
    the difference is exact (Sterbenz: ``fq(x)`` lies within a factor 2 of ``x`` or is 0)."""
    fq = dequantize(*quantize(x, gs, bits, mode, global_scale=global_scale, stream=stream),
                    group_size=gs, bits=bits, mode=mode, global_scale=global_scale,
                    dtype=x._dtype, stream=stream)
    fq = cast(fq, x._dtype, stream)
    return mx.add(x, mx.stop_gradient(mx.subtract(fq, x, stream=stream), stream=stream),
                  stream=stream)


def _qq_operands(x, w, scales, gs, bits, mode, op, s, gx=None, gw=None):
    x = as_array(x)
    if x._dtype not in _FLOATS:
        raise DtypeError(f"[{op}] x must be float32, float16 or bfloat16, got "
                         f"{x._dtype.name} (shape {x._shape}).")
    if x._shape[-1:] and x._shape[-1] % gs:
        raise ShapeError(f"[{op}] The last dimension of x with shape {x._shape} must be "
                         f"divisible by the group size {gs}.")
    w = as_array(w)
    if w._dtype is not dt.uint32:
        if scales is not None:
            raise ArgumentError(f"[{op}] scales are given for an unquantized w of dtype "
                                f"{w._dtype.name}: pass w packed, or no scales.")
        if w._dtype not in _FLOATS:
            raise DtypeError(f"[{op}] An unquantized w must be float32, float16 or "
                             f"bfloat16, got {w._dtype.name} (shape {w._shape}).")
        w, scales = quantize(w, gs, bits, mode, global_scale=gw, stream=s)[:2]
    elif scales is None:
        raise ArgumentError(f"[{op}] scales must be provided for a quantized w (shape "
                            f"{w._shape}).")
    if len(x._shape) < 2:
        raise ShapeError(f"[{op}] x must have at least 2 dimensions, got shape {x._shape}.")
    xq = _fake_quantize(x, gs, bits, mode, s, gx)
    return xq, w, scales


def _qq_global_scales(gx, gw, mode, op):
    """Both nvfp4 global scales or neither, each checked (MLX's rules)."""
    gx, gw = _global_scale(gx, mode, op), _global_scale(gw, mode, op)
    if (gx is None) != (gw is None):
        raise ArgumentError(f"[{op}] For nvfp4 mode, either both global_scale_x and "
                            f"global_scale_w must be provided, or neither.")
    return gx, gw


def _times_global_w(out, gw, s):
    """The product with weights quantized under global scale ``gw``: their values are
    ``fp(q) * scale * gw/2688``, so the product from the packed words times gw/2688."""
    if gw is None:
        return out
    factor = mx.divide(gw, mx.array(NVFP4_RANGE, dtype=mx.float32), stream=s)
    return cast(mx.multiply(out, mx.reshape(factor, (), stream=s), stream=s), out._dtype, s)


def _qq_params(group_size, bits, mode, op):
    gs, bits, mode = _params(group_size, bits, mode, op)
    if mode == "affine":
        raise ArgumentError(f"[{op}] Only the float modes (mxfp4, mxfp8, nvfp4) are "
                            f"supported, got mode 'affine'.")
    return gs, bits, mode


def qqmm(x, w, scales=None, group_size: int | None = None, bits: int | None = None,
         mode: str = "nvfp4", global_scale_x=None, global_scale_w=None, *,
         stream=None) -> array:
    """``x @ w.T`` with ``x`` quantized on the fly (and ``w``, when it comes
    unquantized) in a float ``mode``: ``quantized_matmul(fq(x), w_q, scales)`` where
    ``fq`` quantizes then dequantizes. Gradients pass straight through ``fq``. With
    nvfp4 global scales (both or neither), ``x`` is fake-quantized under
    ``global_scale_x`` and ``w``'s values are taken under ``global_scale_w``.

    Returns:
        array: ``(..., N)`` of ``x``'s dtype.
    """
    op = "qqmm"
    gs, bits, mode = _qq_params(group_size, bits, mode, op)
    gx, gw = _qq_global_scales(global_scale_x, global_scale_w, mode, op)
    s = to_stream(stream)
    xq, wq, sc = _qq_operands(x, w, scales, gs, bits, mode, op, s, gx, gw)
    return _times_global_w(quantized_matmul(xq, wq, sc, None, True, gs, bits, mode, stream=s),
                           gw, s)


def gather_qqmm(x, w, /, scales=None, lhs_indices=None, rhs_indices=None,
                group_size: int | None = None, bits: int | None = None, mode: str = "nvfp4",
                global_scale_x=None, global_scale_w=None, *, sorted_indices: bool = False,
                stream=None) -> array:
    """:func:`qqmm` with matrix-level gather (see :func:`gather_qmm`)."""
    op = "gather_qqmm"
    gs, bits, mode = _qq_params(group_size, bits, mode, op)
    gx, gw = _qq_global_scales(global_scale_x, global_scale_w, mode, op)
    s = to_stream(stream)
    xq, wq, sc = _qq_operands(x, w, scales, gs, bits, mode, op, s, gx, gw)
    return _times_global_w(gather_qmm(xq, wq, sc, None, lhs_indices, rhs_indices, True, gs,
                                      bits, mode, stream=s), gw, s)


PRIMITIVES = [Quantize, Dequantize, QuantizedMatmul, GatherQMM]
OPS = {
    "quantize": quantize,
    "dequantize": dequantize,
    "quantized_matmul": quantized_matmul,
    "gather_qmm": gather_qmm,
    "qqmm": qqmm,
    "gather_qqmm": gather_qqmm,
}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide rule test (differentiated w.r.t. x only) --------
def _f32(x):
    return mx.astype(x, mx.float32)


def _packed_example(shape, gs=32, bits=4, mode="affine"):
    """Constant quantized weights (NumPy), quantized by lazyx."""
    w = uniform(shape).astype(np.float32)
    return [np.asarray(a) for a in quantize(mx.array(w), gs, bits, mode)]


def _qmm_example(transpose, bits, mode="affine", gs=32):
    consts = _packed_example((3, 64) if transpose else (64, 96), gs, bits, mode)

    def fn(x):
        w, *sb = (mx.array(c) for c in consts)
        return quantized_matmul(_f32(x), w, *sb, transpose=transpose, group_size=gs,
                                bits=bits, mode=mode)
    return example(fn, uniform((2, 64)))


def _gqmm_example():
    consts = _packed_example((3, 2, 64), 32, 4)

    def fn(x):
        q, sc, b = (mx.array(c) for c in consts)
        return gather_qmm(_f32(x), q, sc, b, mx.array(np.array([[0], [1]], np.int32)),
                          mx.array(np.array([[2, 0], [1, 1]], np.int32)), True, 32, 4)
    return example(fn, uniform((2, 1, 64)))


@hookimpl
def lazyx_examples():
    return [
        (Quantize, example(lambda w: list(quantize(_f32(w), 32, 4)), uniform((2, 64)))),
        (Quantize, example(lambda w: list(quantize(_f32(w), mode="mxfp4")), uniform((2, 32)))),
        (Quantize, example(lambda w: list(quantize(_f32(w), mode="nvfp4",
                                                   global_scale=mx.array(3.0))),
                           uniform((2, 32)))),
        (Dequantize, example(lambda w: dequantize(
            *quantize(_f32(w), mode="nvfp4", global_scale=mx.array(3.0)), mode="nvfp4",
            global_scale=mx.array(3.0)), uniform((2, 32)))),
        (Dequantize, example(lambda w: dequantize(*quantize(_f32(w), 32, 8), 32, 8),
                             uniform((2, 64)))),
        (QuantizedMatmul, _qmm_example(True, 4)),
        (QuantizedMatmul, _qmm_example(False, 8)),
        (QuantizedMatmul, _qmm_example(True, 4, "mxfp4")),
        (GatherQMM, _gqmm_example()),
    ]
