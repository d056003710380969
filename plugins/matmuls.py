"""Op pack ``matmuls``: gathered, block-masked and segmented matrix products, and the
Walsh-Hadamard transform (MLX 0.32's ``gather_mm``, ``block_masked_mm``,
``segmented_mm``, ``hadamard_transform``).

Each op function checks and promotes its arguments, then puts its operands into the
one layout its primitive takes, so that kernels see no broadcasting:

* :class:`GatherMM` ``(a, b, lhs, rhs)``: ``a`` is ``(*A, M, K)`` and ``b`` is
  ``(*B, K, N)`` (a 1-D operand gets its matrix dimension here and loses it in the
  result); ``lhs`` and ``rhs`` are int32 flat positions into ``A`` and ``B``, broadcast
  to one shape ``I``; the result is ``I + (M, N)``, ``out[i] = a[lhs[i]] @ b[rhs[i]]``.
  An absent index array is ``arange`` over the operand's batch, as in MLX.
* :class:`BlockMaskedMM` ``(a, b, [mask_out], [mask_lhs], [mask_rhs])``: every input
  broadcast to one batch; ``(a * up(mask_lhs)) @ (b * up(mask_rhs)) * up(mask_out)``
  where ``up`` repeats each mask entry over its ``block_size x block_size`` tile (the
  last tiles may be partial). A boolean mask zeroes its tiles (NaNs there do not leak);
  a floating one scales them.
* :class:`SegmentedMM` ``(a, b, segments)``: ``a`` is ``(M, K)``, ``b`` is ``(K, N)``,
  ``segments`` is ``(*S, 2)`` int32; ``out[s] = a[:, s0:s1] @ b[s0:s1]``.
* :class:`Hadamard` ``(x,)``: ``n = x.shape[-1] = m * 2**k`` with ``m`` in 1, 12, 20,
  28; the transform is ``kron(H_m, H_{2^k}) @ x`` times ``scale`` along the last axis,
  with MLX's ``H_m`` (N. J. A. Sloane's library of Hadamard matrices) so the numbers
  are MLX's.

Rules sit beside each primitive, written with ``lazyx.core`` ops. MLX gives GatherMM a
vjp only, BlockMaskedMM a vjp only, SegmentedMM none; lazyx gives every one a vjp, jvp
and vmap (the products are linear in each operand). Hadamard's vjp is the *transposed*
transform (``H_12``, ``H_20``, ``H_28`` are not symmetric; MLX reuses the forward one).
Index arrays get no gradient. Kernels: ``lazyx.backends.cpu.kernels.matmuls`` (NumPy),
``lazyx.backends.cpu.native_packs.matmuls`` (C++ Hadamard, grouped gathers),
``lazyx.backends.cuda.matmuls``.
"""

from __future__ import annotations

import math

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, DtypeError, ShapeError
from lazyx.examples import booleans, example, integers, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive, Size
from lazyx.rules import add_tangents, batch_first

_PROMOTE = dt._PROMOTE


# -- shared argument checks ----------------------------------------------------------
def _arr(x) -> array:
    return x if type(x) is array else as_array(x)


def _floating(a: array, b: array, op: str) -> dt.Dtype:
    """The promoted dtype of ``a`` and ``b``, which must be real floating (MLX)."""
    d = a._dtype if a._dtype is b._dtype else _PROMOTE[(a._dtype, b._dtype)]
    if d.kind != "f":
        raise DtypeError(f"[{op}] Only real floating point types are supported but "
                         f"{a._dtype.name} and {b._dtype.name} were provided which results "
                         f"in {d.name}, which is not a real floating point type.")
    return d


def _integral(x, what: str, op: str) -> array:
    x = _arr(x)
    if x._dtype.kind not in "iu":
        raise DtypeError(f"[{op}] Got {what} with invalid dtype {x._dtype.name} (shape "
                         f"{x._shape}). {what.capitalize()} must be integral.")
    return x


def _prod(dims) -> int:
    n = 1
    for s in dims:
        n *= s
    return n


def _as_matrices(a: array, b: array, op: str, stream):
    """1-D operands as matrices (a row, a column), the inner sizes checked."""
    if not a._shape or not b._shape:
        raise ShapeError(f"[{op}] Got a 0-dimensional input (shapes {a._shape} and "
                         f"{b._shape}); inputs must have at least one dimension.")
    vec_a, vec_b = len(a._shape) == 1, len(b._shape) == 1
    if vec_a:
        a = mx.expand_dims(a, 0, stream=stream)
    if vec_b:
        b = mx.expand_dims(b, 1, stream=stream)
    if a._shape[-1] != b._shape[-2]:
        raise ShapeError(f"[{op}] Last dimension of first input with shape {a._shape} must "
                         f"match second to last dimension of second input with shape "
                         f"{b._shape}.")
    return a, b, vec_a, vec_b


def _drop_vector_dims(x: array, vec_a: bool, vec_b: bool, stream) -> array:
    if not (vec_a or vec_b):
        return x
    s = x._shape
    return mx.reshape(x, s[:-2] + (() if vec_a else s[-2:-1]) + (() if vec_b else s[-1:]),
                      stream=stream)


def _swap(x: array, stream) -> array:
    return mx.swapaxes(x, -1, -2, stream=stream)


# -- gather_mm -----------------------------------------------------------------------
class GatherMM(Primitive):
    """``out[i] = a[lhs[i]] @ b[rhs[i]]`` over flat batch positions; inputs
    ``(a, b, lhs, rhs)`` as the module docstring lays them out.

    ``sorted_indices`` says the caller promises sorted indices: a kernel may group
    equal consecutive indices into one product (it must stay correct without it).
    """

    __slots__ = ("sorted_indices",)
    arity = 4
    sorted_indices: bool

    def output_shapes(self, inputs):
        a, b, lhs = inputs[0], inputs[1], inputs[2]
        return [tuple(lhs.shape) + (a.shape[-2], b.shape[-1])]

    def vjp(self, primals, cotangents, argnums, outputs):
        # MLX's rule: the product for every index, then a scatter-add back into the
        # operand's stack of matrices at that index.
        s = self.stream
        a, b, lhs, rhs = primals
        g = cotangents[0]
        out = []
        for i in argnums:
            if i == 0:
                part = gather_mm(g, _swap(b, s), None, rhs, stream=s)
                out.append(_scatter_add(part, lhs, a, s))
            elif i == 1:
                part = gather_mm(_swap(a, s), g, lhs, None, stream=s)
                out.append(_scatter_add(part, rhs, b, s))
            else:
                out.append(None)
        return out

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, b, lhs, rhs = primals
        out = None
        for t, i in zip(tangents, argnums):
            if i == 0:
                out = add_tangents(out, gather_mm(t, b, lhs, rhs, stream=s), s)
            elif i == 1:
                out = add_tangents(out, gather_mm(a, t, lhs, rhs, stream=s), s)
        return [out]

    def vmap(self, inputs, axes):
        # One gather_mm over the examples' operands stacked into one batch: example e's
        # matrix j sits at e * count + j, so its indices are offset by e * count.
        s = self.stream
        a, b, lhs, rhs = inputs
        size = next(x._shape[ax] for x, ax in zip(inputs, axes) if ax is not None)
        ops, idx = [a, b], [lhs, rhs]
        for k in (0, 1):
            x, ax = ops[k], axes[k]
            i, iax = idx[k], axes[k + 2]
            if iax is not None:
                i = batch_first(i, iax, stream=s)
            if ax is not None:
                x = batch_first(x, ax, stream=s)
                count = _prod(x._shape[1:-2])
                ops[k] = mx.reshape(x, (size * count,) + x._shape[-2:], stream=s)
                base = mx.arange(0, size * count, count, dtype=dt.int32, stream=s)
                base = mx.reshape(base, (size,) + (1,) * (len(i._shape) - (iax is not None)),
                                  stream=s)
                i = mx.add(i, base, stream=s)
            idx[k] = i
        # A batched operand or index array puts the batch in front of its index array,
        # so the broadcast index shape, and the result, start with it.
        return [gather_mm(ops[0], ops[1], idx[0], idx[1], stream=s)], [0]


def _scatter_add(part: array, index: array, like: array, stream) -> array:
    """``zeros_like(like)`` with the matrices of ``part`` (index shape + matrix) added at
    the flat batch positions ``index``."""
    count = _prod(like._shape[:-2])
    mat = like._shape[-2:]
    flat = mx.reshape(part, (-1,) + mat, stream=stream)
    base = mx.zeros((count,) + mat, dtype=like._dtype, stream=stream)
    acc = base.at[mx.reshape(index, (-1,), stream=stream)].add(flat)
    return mx.reshape(acc, like._shape, stream=stream)


def _batch_arange(x: array, stream) -> array:
    """Every flat batch position of ``x``, shaped as its batch (MLX's absent index)."""
    batch = x._shape[:-2]
    return mx.reshape(mx.arange(_prod(batch), dtype=dt.int32, stream=stream), batch,
                      stream=stream)


def gather_mm(a, b, /, lhs_indices=None, rhs_indices=None, *, sorted_indices: bool = False,
              stream=None) -> array:
    """Matrix multiplication with matrix-level gather.

    Gathers matrices of ``a`` and ``b`` at the given flat batch positions and
    multiplies them, without materialising the gathered operands.

    For ``a`` of shape ``(A1, ..., AS, M, K)``, ``lhs_indices`` holds positions in
    ``[0, A1 * ... * AS)``; likewise ``rhs_indices`` for ``b`` of shape
    ``(B1, ..., BS, K, N)``. The two index arrays broadcast together; an absent one
    is every position of its operand's batch, in order.

    Args:
        a (array): Input array.
        b (array): Input array.
        lhs_indices (array, optional): Integer indices for ``a``. Default: ``None``.
        rhs_indices (array, optional): Integer indices for ``b``. Default: ``None``.
        sorted_indices (bool, optional): The indices are sorted, which may allow a
            faster implementation. Default: ``False``.

    Returns:
        array: The products, of shape ``broadcast(lhs_indices, rhs_indices) + (M, N)``
        (a 1-D ``a`` or ``b`` drops its matrix dimension, as in ``matmul``).

    Example:
        >>> experts = mx.ones((8, 16, 32))        # 8 expert weight matrices
        >>> x = mx.ones((4, 1, 16))               # 4 tokens
        >>> mx.gather_mm(x, experts, None, mx.array([0, 3, 3, 7])).shape
        (4, 1, 32)
    """
    a, b = _arr(a), _arr(b)
    if lhs_indices is None and rhs_indices is None:
        return mx.matmul(a, b, stream=stream)
    op = "gather_mm"
    d = _floating(a, b, op)
    a, b = cast(a, d, stream), cast(b, d, stream)
    a, b, vec_a, vec_b = _as_matrices(a, b, op, stream)
    lhs = _batch_arange(a, stream) if lhs_indices is None else \
        _integral(lhs_indices, "indices", op)
    rhs = _batch_arange(b, stream) if rhs_indices is None else \
        _integral(rhs_indices, "indices", op)
    try:
        shape = broadcast_shapes(lhs._shape, rhs._shape)
    except ShapeError:
        raise ShapeError(f"[{op}] lhs_indices with shape {lhs._shape} and rhs_indices with "
                         f"shape {rhs._shape} cannot be broadcast (an absent index array "
                         f"is every batch position of its operand: a {a._shape}, b "
                         f"{b._shape}).") from None
    lhs, rhs = cast(lhs, dt.int32, stream), cast(rhs, dt.int32, stream)
    if lhs._shape != shape:
        lhs = mx.broadcast_to(lhs, shape, stream=stream)
    if rhs._shape != shape:
        rhs = mx.broadcast_to(rhs, shape, stream=stream)
    out = lazy(shape + (a._shape[-2], b._shape[-1]), d,
               GatherMM(to_stream(stream), bool(sorted_indices)), (a, b, lhs, rhs))
    return _drop_vector_dims(out, vec_a, vec_b, stream)


# -- block_masked_mm -------------------------------------------------------------------
def _tiles(n: int, block: int) -> int:
    return -(-n // block)


def _upsample(mask: array, block: int, rows: int, cols: int, stream) -> array:
    """Each entry of ``mask`` (``..., tr, tc``) repeated over its tile, cut to ``rows x cols``."""
    s = mask._shape
    tr, tc = s[-2], s[-1]
    x = mx.reshape(mask, s[:-2] + (tr, 1, tc, 1), stream=stream)
    x = mx.broadcast_to(x, s[:-2] + (tr, block, tc, block), stream=stream)
    x = mx.reshape(x, s[:-2] + (tr * block, tc * block), stream=stream)
    if tr * block != rows or tc * block != cols:
        x = x[..., :rows, :cols]
    return x


def _tile_sum(x: array, block: int, stream) -> array:
    """The sums of ``x`` (``..., R, C``) over its ``block x block`` tiles."""
    s = x._shape
    tr, tc = _tiles(s[-2], block), _tiles(s[-1], block)
    pad = [(0, 0)] * (len(s) - 2) + [(0, tr * block - s[-2]), (0, tc * block - s[-1])]
    if pad[-1][1] or pad[-2][1]:
        x = mx.pad(x, pad, stream=stream)
    x = mx.reshape(x, s[:-2] + (tr, block, tc, block), stream=stream)
    return mx.sum(x, axis=(-3, -1), stream=stream)


class BlockMaskedMM(Primitive):
    """``(a * up(mask_lhs)) @ (b * up(mask_rhs)) * up(mask_out)``; inputs ``(a, b)`` then
    the masks that are present, in the order out, lhs, rhs (``has_*`` say which)."""

    __slots__ = ("block_size", "has_out", "has_lhs", "has_rhs")
    block_size: Size
    has_out: bool
    has_lhs: bool
    has_rhs: bool

    def output_shapes(self, inputs):
        a, b = inputs[0].shape, inputs[1].shape
        return [tuple(a[:-2]) + (a[-2], b[-1])]

    def _masks(self, inputs):
        it = iter(inputs[2:])
        return [next(it) if h else None for h in (self.has_out, self.has_lhs, self.has_rhs)]

    def _positions(self):
        pos, k = {}, 2
        for name, h in zip(("out", "lhs", "rhs"), (self.has_out, self.has_lhs, self.has_rhs)):
            if h:
                pos[k] = name
                k += 1
        return pos

    def vjp(self, primals, cotangents, argnums, outputs):
        # With A = a*ML, B = b*MR, C = A @ B and out = C*MO:
        #   da = ((g*MO) @ B^T) * ML        = block_masked_mm(g, b^T; out=ML, lhs=MO, rhs=MR^T)
        #   db = (A^T @ (g*MO)) * MR        = block_masked_mm(a^T, g; out=MR, lhs=ML^T, rhs=MO)
        #   dMO = tile sums of g * C, dML = tile sums of a * da/ML, dMR likewise.
        s = self.stream
        bs = self.block_size
        a, b = primals[0], primals[1]
        mo, ml, mr = self._masks(primals)
        g = cotangents[0]
        mlt = None if ml is None else _swap(ml, s)
        mrt = None if mr is None else _swap(mr, s)
        pos = self._positions()
        out = []
        for i in argnums:
            if i == 0:
                out.append(block_masked_mm(g, _swap(b, s), bs, ml, mo, mrt, stream=s))
            elif i == 1:
                out.append(block_masked_mm(_swap(a, s), g, bs, mr, mlt, mo, stream=s))
            elif primals[i]._dtype is dt.bool_:
                out.append(None)
            elif pos[i] == "out":
                c = block_masked_mm(a, b, bs, None, ml, mr, stream=s)
                out.append(_tile_sum(mx.multiply(g, c, stream=s), bs, s))
            elif pos[i] == "lhs":
                ga = block_masked_mm(g, _swap(b, s), bs, None, mo, mrt, stream=s)
                out.append(_tile_sum(mx.multiply(ga, a, stream=s), bs, s))
            else:
                gb = block_masked_mm(_swap(a, s), g, bs, None, mlt, mo, stream=s)
                out.append(_tile_sum(mx.multiply(gb, b, stream=s), bs, s))
        return out

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        bs = self.block_size
        a, b = primals[0], primals[1]
        mo, ml, mr = self._masks(primals)
        pos = self._positions()
        M, K, N = a._shape[-2], a._shape[-1], b._shape[-1]
        out = None
        for t, i in zip(tangents, argnums):
            if i == 0:
                d = block_masked_mm(t, b, bs, mo, ml, mr, stream=s)
            elif i == 1:
                d = block_masked_mm(a, t, bs, mo, ml, mr, stream=s)
            elif primals[i]._dtype is dt.bool_:
                continue
            elif pos[i] == "out":
                c = block_masked_mm(a, b, bs, None, ml, mr, stream=s)
                d = mx.multiply(c, _upsample(t, bs, M, N, s), stream=s)
            elif pos[i] == "lhs":
                d = block_masked_mm(mx.multiply(a, _upsample(t, bs, M, K, s), stream=s), b, bs,
                                    mo, None, mr, stream=s)
            else:
                d = block_masked_mm(a, mx.multiply(b, _upsample(t, bs, K, N, s), stream=s), bs,
                                    mo, ml, None, stream=s)
            out = add_tangents(out, d, s)
        return [out]

    def vmap(self, inputs, axes):
        # Every input has the same rank, so batch-first inputs broadcast with the others.
        s = self.stream
        xs = [x if ax is None else batch_first(x, ax, stream=s) for x, ax in zip(inputs, axes)]
        mo, ml, mr = self._masks(xs)
        return [block_masked_mm(xs[0], xs[1], self.block_size, mo, ml, mr, stream=s)], [0]


def block_masked_mm(a, b, /, block_size: int = 64, mask_out=None, mask_lhs=None,
                    mask_rhs=None, *, stream=None) -> array:
    """Matrix multiplication with block masking.

    Multiplies ``a`` (``..., M, K``) by ``b`` (``..., K, N``) with tiles of size
    ``block_size x block_size`` of the operands and of the result masked: a boolean
    mask keeps or zeroes a tile, a floating mask scales it.

    * ``mask_lhs`` has shape ``(..., ceil(M / block_size), ceil(K / block_size))``
    * ``mask_rhs`` has shape ``(..., ceil(K / block_size), ceil(N / block_size))``
    * ``mask_out`` has shape ``(..., ceil(M / block_size), ceil(N / block_size))``

    The batch dimensions of the operands and the masks broadcast. MLX's GPU kernels
    take ``block_size`` 32 or 64 (without masks, any positive size: a plain product).

    Args:
        a (array): Input array.
        b (array): Input array.
        block_size (int): Size of blocks to be masked. Default: ``64``.
        mask_out (array, optional): Mask for the output. Default: ``None``.
        mask_lhs (array, optional): Mask for ``a``. Default: ``None``.
        mask_rhs (array, optional): Mask for ``b``. Default: ``None``.

    Returns:
        array: The output array.
    """
    op = "block_masked_mm"
    a, b = _arr(a), _arr(b)
    if isinstance(block_size, bool) or not hasattr(block_size, "__index__") \
            or block_size.__index__() <= 0:
        raise ArgumentError(f"[{op}] block_size must be a positive integer, got "
                            f"{block_size!r}.")
    bs = block_size.__index__()
    if mask_out is None and mask_lhs is None and mask_rhs is None:
        return mx.matmul(a, b, stream=stream)
    if bs not in (32, 64):  # MLX's kernels take these two only; so do lazyx's
        raise ArgumentError(f"[{op}] Only block_sizes 32, 64 are supported, got block size "
                            f"{bs}.")
    d = _floating(a, b, op)
    a, b = cast(a, d, stream), cast(b, d, stream)
    a, b, vec_a, vec_b = _as_matrices(a, b, op, stream)
    M, K, N = a._shape[-2], a._shape[-1], b._shape[-1]
    tm, tk, tn = _tiles(M, bs), _tiles(K, bs), _tiles(N, bs)
    masks = []
    for name, m, tiles in (("mask_out", mask_out, (tm, tn)), ("mask_lhs", mask_lhs, (tm, tk)),
                           ("mask_rhs", mask_rhs, (tk, tn))):
        if m is None:
            masks.append(None)
            continue
        m = _arr(m)
        if len(m._shape) < 2 or m._shape[-2:] != tiles:
            raise ShapeError(f"[{op}] {name} must have shape (..., {tiles[0]}, {tiles[1]}) for "
                             f"block_size {bs} and operands of shapes {a._shape} and "
                             f"{b._shape}, got {m._shape}.")
        if m._dtype is not dt.bool_:
            m = cast(m, d, stream)
        masks.append(m)
    present = [m for m in masks if m is not None]
    try:
        batch = broadcast_shapes(a._shape[:-2], b._shape[:-2], *(m._shape[:-2] for m in present))
    except ShapeError:
        raise ShapeError(f"[{op}] The batch dimensions of a {a._shape}, b {b._shape} and the "
                         f"masks {[m._shape for m in present]} cannot be broadcast.") from None

    def full(x):
        want = batch + x._shape[-2:]
        return x if x._shape == want else mx.broadcast_to(x, want, stream=stream)

    inputs = tuple(full(x) for x in [a, b] + present)
    prim = BlockMaskedMM(to_stream(stream), bs, *(m is not None for m in masks))
    out = lazy(batch + (M, N), d, prim, inputs)
    return _drop_vector_dims(out, vec_a, vec_b, stream)


# -- segmented_mm ----------------------------------------------------------------------
def _segment_weights(segments: array, k: int, dtype, stream) -> array:
    """``w[..., j] = 1`` where ``start <= j < end`` for each segment (``..., K``)."""
    j = mx.arange(k, dtype=dt.int32, stream=stream)
    start, end = segments[..., 0:1], segments[..., 1:2]
    inside = mx.logical_and(mx.greater_equal(j, start, stream=stream),
                            mx.less(j, end, stream=stream), stream=stream)
    return mx.astype(inside, dtype, stream=stream)


class SegmentedMM(Primitive):
    """``out[s] = a[:, s0:s1] @ b[s0:s1]`` for each segment ``(s0, s1)``; inputs
    ``(a (M, K), b (K, N), segments (*S, 2))``."""

    __slots__ = ()
    arity = 3

    def output_shapes(self, inputs):
        a, b, seg = inputs
        return [tuple(seg.shape[:-1]) + (a.shape[0], b.shape[1])]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a, b, seg = primals
        k = a._shape[1]
        w = mx.reshape(_segment_weights(seg, k, a._dtype, s), (-1, k), stream=s)   # (S, K)
        g = mx.reshape(cotangents[0], (-1,) + cotangents[0]._shape[-2:], stream=s)  # (S, M, N)
        out = []
        for i in argnums:
            if i == 0:
                ga = mx.matmul(g, mx.transpose(b, stream=s), stream=s)              # (S, M, K)
                out.append(mx.sum(mx.multiply(ga, mx.expand_dims(w, 1, stream=s), stream=s),
                                  axis=0, stream=s))
            elif i == 1:
                gb = mx.matmul(mx.transpose(a, stream=s), g, stream=s)              # (S, K, N)
                out.append(mx.sum(mx.multiply(gb, mx.expand_dims(w, 2, stream=s), stream=s),
                                  axis=0, stream=s))
            else:
                out.append(None)
        return out

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, b, seg = primals
        out = None
        for t, i in zip(tangents, argnums):
            if i == 0:
                out = add_tangents(out, segmented_mm(t, b, seg, stream=s), s)
            elif i == 1:
                out = add_tangents(out, segmented_mm(a, t, seg, stream=s), s)
        return [out]

    def vmap(self, inputs, axes):
        s = self.stream
        a, b, seg = inputs
        ax, bx, sx = axes
        if sx is not None:
            seg = batch_first(seg, sx, stream=s)
        if ax is None and bx is None:
            return [segmented_mm(a, b, seg, stream=s)], [0]
        # Batched operands: the product of a with each segment's columns kept (one
        # batched matmul over examples and segments).
        a = mx.expand_dims(a, 0, stream=s) if ax is None else batch_first(a, ax, stream=s)
        b = mx.expand_dims(b, 0, stream=s) if bx is None else batch_first(b, bx, stream=s)
        k = a._shape[-1]
        lead = seg._shape[:-1] if sx is not None else (1,) + seg._shape[:-1]
        w = mx.reshape(_segment_weights(seg, k, a._dtype, s), (lead[0], -1, 1, k), stream=s)
        prod = mx.matmul(mx.multiply(mx.expand_dims(a, 1, stream=s), w, stream=s),
                         mx.expand_dims(b, 1, stream=s), stream=s)               # (E, S, M, N)
        size = prod._shape[0]
        return [mx.reshape(prod, (size,) + lead[1:] + prod._shape[-2:], stream=s)], [0]


def segmented_mm(a, b, /, segments, *, stream=None) -> array:
    """Perform a matrix multiplication but segment the inner dimension and save the
    result for each segment separately.

    Args:
        a (array): Input array of shape ``MxK``.
        b (array): Input array of shape ``KxN``.
        segments (array): The offsets into the inner dimension for each segment, of
            shape ``(..., 2)``: ``(start, end)`` pairs. An empty segment gives zeros.

    Returns:
        array: The result per segment, of shape ``segments.shape[:-1] + (M, N)``.

    Example:
        >>> mx.segmented_mm(mx.ones((2, 6)), mx.ones((6, 3)), mx.array([[0, 2], [2, 6]]))[:, 0, 0]
        array([2, 4], dtype=float32)
    """
    op = "segmented_mm"
    a, b = _arr(a), _arr(b)
    seg = _arr(segments)
    if seg._dtype.kind not in "iu":
        raise DtypeError(f"[{op}] Got segments with invalid dtype {seg._dtype.name} (shape "
                         f"{seg._shape}). Segments must be integral.")
    if not seg._shape or seg._shape[-1] != 2:
        raise ShapeError(f"[{op}] The segments should have shape (..., 2) but {seg._shape} "
                         f"was provided.")
    if len(a._shape) != 2 or len(b._shape) != 2:
        raise ShapeError(f"[{op}] Batched matmul not supported: a and b must be matrices, "
                         f"got shapes {a._shape} and {b._shape}.")
    if a._shape[1] != b._shape[0]:
        raise ShapeError(f"[{op}] Last dimension of first input with shape {a._shape} must "
                         f"match first dimension of second input with shape {b._shape}.")
    d = _floating(a, b, op)
    a, b, seg = cast(a, d, stream), cast(b, d, stream), cast(seg, dt.int32, stream)
    return lazy(seg._shape[:-1] + (a._shape[0], b._shape[1]), d, SegmentedMM(to_stream(stream)),
                (a, b, seg))


# -- hadamard_transform ----------------------------------------------------------------
# The Hadamard matrices H_m of orders 12, 20 and 28 that MLX uses, from N. J. A.
# Sloane's library (http://neilsloane.com/hadamard/): one string per row, '+' for 1.
HADAMARD_MATRICES = {
    12: ("+-++++++++++ --+-+-+-+-+- +++-++----++ +---+--+-++- +++++-++---- +-+---+--+-+ "
         "++--+++-++-- +--++---+--+ ++----+++-++ +--+-++---+- ++++----+++- +-+--+-++---"),
    20: ("+----+----++--++-++- -+----+---+++---+-++ --+----+---+++-+-+-+ "
         "---+----+---+++++-+- ----+----++--++-++-+ -+++++-----+--+++--+ "
         "+-+++-+---+-+--+++-- ++-++--+---+-+--+++- +++-+---+---+-+--+++ "
         "++++-----++--+-+--++ --++-+-++-+-----++++ ---++-+-++-+---+-+++ "
         "+---++-+-+--+--++-++ ++---++-+----+-+++-+ -++---++-+----+++++- "
         "-+--+--++-+----+---- +-+-----++-+----+--- -+-+-+---+--+----+-- "
         "--+-+++------+----+- +--+--++------+----+"),
    28: ("+------++----++-+--+-+--++-- -+-----+++-----+-+--+-+--++- "
         "--+-----+++---+-+-+----+--++ ---+-----+++---+-+-+-+--+--+ "
         "----+-----+++---+-+-+++--+-- -----+-----++++--+-+--++--+- "
         "------++----++-+--+-+--++--+ --++++-+-------++--+++-+--+- "
         "---++++-+-----+-++--+-+-+--+ +---+++--+----++-++--+-+-+-- "
         "++---++---+----++-++--+-+-+- +++---+----+----++-++--+-+-+ "
         "++++--------+-+--++-++--+-+- -++++--------+++--++--+--+-+ "
         "-+-++-++--++--+--------++++- +-+-++--+--++--+--------++++ "
         "-+-+-++--+--++--+----+---+++ +-+-+-++--+--+---+---++---++ "
         "++-+-+-++--+------+--+++---+ -++-+-+-++--+------+-++++--- "
         "+-++-+---++--+------+-++++-- -++--++-+-++-+++----++------ "
         "+-++--++-+-++-+++-----+----- ++-++---+-+-++-+++-----+---- "
         "-++-++-+-+-+-+--+++-----+--- --++-++++-+-+----+++-----+-- "
         "+--++-+-++-+-+----+++-----+- ++--++-+-++-+-+----++------+"),
}


def hadamard_sign_rows(m: int) -> list[str]:
    """The rows of MLX's ``H_m`` as strings of ``+`` and ``-`` (``m`` in 12, 20, 28)."""
    return HADAMARD_MATRICES[m].split()


def hadamard_factors(n: int, op: str = "hadamard_transform") -> tuple[int, int]:
    """``(m, p)`` with ``n = m * p``, ``p`` a power of two and ``m`` in 1, 12, 20, 28."""
    for m in (1, 12, 20, 28):
        if n % m == 0:
            p = n // m
            if p & (p - 1) == 0:
                return m, p
    raise ArgumentError(f"[{op}] Only supports n = m*2^k where m in (1, 12, 20, 28), got "
                        f"n = {n} (the size of the last axis).")


class Hadamard(Primitive):
    """``scale * kron(H_m, H_p) @ x`` along the last axis (its transpose when
    ``transposed``: the vjp of the forward transform)."""

    __slots__ = ("scale", "transposed")
    arity = 1
    scale: float
    transposed: bool

    def output_shapes(self, inputs):
        return [tuple(inputs[0].shape)]

    def _again(self, x, transposed):
        return _hadamard(x, self.scale, transposed, self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [self._again(cotangents[0], not self.transposed)]

    def jvp(self, primals, tangents, argnums):
        return [self._again(tangents[0], self.transposed)]

    def vmap(self, inputs, axes):
        x, ax = inputs[0], axes[0]
        if ax == len(x._shape) - 1:
            x, ax = batch_first(x, ax, stream=self.stream), 0
        return [self._again(x, self.transposed)], [ax]


def _hadamard(x: array, scale: float, transposed: bool, stream) -> array:
    return lazy(x._shape, x._dtype, Hadamard(to_stream(stream), scale, transposed), (x,))


def hadamard_transform(a, scale: float | None = None, stream=None) -> array:
    """Perform the Walsh-Hadamard transform along the final axis.

    Equivalent to ``(scipy.linalg.hadamard(n) @ x) * scale`` for ``n`` a power of
    two. Supports sizes ``n = m * 2^k`` for ``m`` in ``(1, 12, 20, 28)`` (MLX's
    Hadamard matrices of those orders).

    Args:
        a (array): Input array or scalar.
        scale (float): Scale the output by this factor. Defaults to
            ``1 / sqrt(a.shape[-1])`` so that the Hadamard matrix is orthonormal.

    Returns:
        array: The transformed array (float32 for integer and boolean inputs).
    """
    op = "hadamard_transform"
    a = _arr(a)
    if a._dtype.kind == "c":
        raise DtypeError(f"[{op}] Complex inputs are not supported (got {a._dtype.name}, "
                         f"shape {a._shape}); transform the real and imaginary parts.")
    if a._dtype.kind != "f":
        a = cast(a, dt.float32, stream)
    if a.size == 0:
        raise ShapeError(f"[{op}] Does not support empty arrays (shape {a._shape}).")
    n = a._shape[-1] if a._shape else 1
    hadamard_factors(n, op)
    scale = 1.0 / math.sqrt(n) if scale is None else float(scale)
    return _hadamard(a, scale, False, stream)


PRIMITIVES = [GatherMM, BlockMaskedMM, SegmentedMM, Hadamard]

OPS = {
    "gather_mm": gather_mm,
    "block_masked_mm": block_masked_mm,
    "segmented_mm": segmented_mm,
    "hadamard_transform": hadamard_transform,
}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


@hookimpl
def lazyx_examples():
    def masked(a, b, mo, ml, mr):
        return block_masked_mm(a, b, 32, mo, ml, mr)

    return [
        (GatherMM, example(lambda a, b, i, j: gather_mm(a, b, i, j),
                           uniform((3, 2, 4)), uniform((2, 4, 3)),
                           integers((2, 2), 0, 3), integers((2,), 0, 2))),
        # One index absent, a vector operand, repeated (sorted) indices.
        (GatherMM, example(lambda a, b, j: gather_mm(a, b, None, j, sorted_indices=True),
                           uniform((4,)), uniform((3, 4, 2)),
                           integers((1,), 0, 3))),
        # Float masks on every side, partial tiles (33 x 3 by 3 x 4, blocks of 32).
        (BlockMaskedMM, example(masked, uniform((33, 3)), uniform((3, 4)),
                                uniform((2, 1)), uniform((2, 1)), uniform((1, 1)))),
        (BlockMaskedMM, example(lambda a, b, mo: block_masked_mm(a, b, 32, mo),
                                uniform((2, 33, 3)), uniform((3, 4)), booleans((2, 2, 1)))),
        (SegmentedMM, example(lambda a, b, s: segmented_mm(a, b, s),
                              uniform((2, 5)), uniform((5, 3)),
                              integers((3, 2), 0, 6))),
        (Hadamard, example(lambda x: hadamard_transform(x), uniform((2, 8)))),
        (Hadamard, example(lambda x: hadamard_transform(x, scale=0.5), uniform((2, 12)))),
    ]
