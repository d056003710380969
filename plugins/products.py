"""Products op pack: matrix products and softmax.

``Matmul``, ``AddMM`` and ``Softmax`` are primitives; ``inner``, ``outer``,
``tensordot`` and ``kron`` are compositions of ``matmul``/``multiply`` with
reshapes and transposes, as in MLX. Matrix products accept only inexact
dtypes (MLX refuses integer and boolean ``matmul``); ``outer`` and ``kron``
multiply element-wise and so accept every dtype. Kernels live in
``lazyx.backends.cpu.kernels.products``.

Transform rules sit beside each primitive and are written with ``lazyx.core``
ops, so they compose. The matmul cotangents are summed back over broadcast
batch dimensions and conjugate the other operand for complex dtypes, as in
MLX; 1-D operands are handled by the rules themselves (the primitive takes
them as they are). A vmapped product moves the batch axis to the front and
stays one batched ``matmul``.
"""

from __future__ import annotations

import functools
import math

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast, normalize_axes, normalize_axis
from lazyx.codegen import ir
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, AxisError, DtypeError, ShapeError
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axes, Primitive, SameShape
from lazyx.examples import example, uniform
from lazyx.rules import add_tangents, batch_first, batched_axes, sum_to_shape

_PROMOTE = dt._PROMOTE


# -- shape and dtype rules -----------------------------------------------------
def matmul_shape(sa: tuple, sb: tuple, op: str = "matmul") -> tuple:
    """The output shape of ``matmul`` for operand shapes ``sa`` and ``sb``.

    A 1-D first operand acts as a row vector and a 1-D second operand as a
    column vector; the added dimension is removed from the result. Batch
    dimensions (all but the last two) broadcast.
    """
    na, nb = len(sa), len(sb)
    if na == 0 or nb == 0:
        raise ShapeError(f"[{op}] Got a 0-dimensional input (shapes {sa} and {sb}); "
                         f"inputs must have at least one dimension.")
    k_a = sa[-1]
    k_b = sb[-2] if nb > 1 else sb[0]
    if k_a != k_b:
        raise ShapeError(f"[{op}] The last dimension of the first input (shape {sa}) must "
                         f"match the second to last dimension of the second input "
                         f"(shape {sb}).")
    if na <= 2 and nb <= 2:
        batch = ()
    else:
        ba, bb = sa[:-2], sb[:-2]
        if ba == bb or not bb:
            batch = ba
        elif not ba:
            batch = bb
        else:
            try:
                batch = broadcast_shapes(ba, bb)
            except ShapeError:
                raise ShapeError(f"[{op}] The batch dimensions of shapes {sa} and {sb} "
                                 f"cannot be broadcast.") from None
    return batch + sa[-2:-1] + sb[-1:] if nb > 1 else batch + sa[-2:-1]


def _inexact(d: dt.Dtype, op: str, *dtypes) -> None:
    if d.kind not in "fc":
        names = ", ".join(x.name for x in dtypes)
        raise DtypeError(f"[{op}] Only floating point and complex types are supported, "
                         f"but inputs of dtypes {names} give {d.name}.")


def _operands(a, b, op: str):
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    da, db = a._dtype, b._dtype
    d = da if da is db else _PROMOTE[(da, db)]
    if d.kind not in "fc":
        _inexact(d, op, da, db)
    return a, b, d


# -- transform helpers -----------------------------------------------------------
def _as_matrices(a: array, b: array, ax, bx, stream):
    """Operands of a vmapped matmul as stacks of matrices whose product has the
    batch at axis 0: ``(a2, b2, vec_a, vec_b)``, where ``vec_a`` / ``vec_b``
    say that the per-example ``a`` / ``b`` was a vector (its matrix dimension
    must be dropped from the product)."""
    if ax is not None:
        a = batch_first(a, ax, stream=stream)
    if bx is not None:
        b = batch_first(b, bx, stream=stream)
    ra = len(a._shape) - (ax is not None)
    rb = len(b._shape) - (bx is not None)
    vec_a, vec_b = ra == 1, rb == 1
    if vec_a:  # a row vector: (..., k) -> (..., 1, k)
        a = mx.expand_dims(a, -2, stream=stream)
    if vec_b:  # a column vector: (..., k) -> (..., k, 1)
        b = mx.expand_dims(b, -1, stream=stream)
    rank = max(ra, rb, 2)
    if ax is not None:
        a = batch_first(a, 0, rank, stream)
    if bx is not None:
        b = batch_first(b, 0, rank, stream)
    return a, b, vec_a, vec_b


def _drop_vector_dims(x: array, vec_a: bool, vec_b: bool, stream) -> array:
    if not (vec_a or vec_b):
        return x
    s = x._shape
    tail = (() if vec_a else s[-2:-1]) + (() if vec_b else s[-1:])
    return mx.reshape(x, s[:-2] + tail, stream=stream)


def _matmul_vjp(a: array, b: array, g: array, argnums, out_pos: int, stream) -> list:
    """Cotangents of ``a @ b`` for cotangent ``g``, for the argnums that refer to
    ``a`` (``out_pos``) and ``b`` (``out_pos + 1``)."""
    na, nb = len(a._shape), len(b._shape)
    a2 = a if na > 1 else mx.expand_dims(a, 0, stream=stream)
    b2 = b if nb > 1 else mx.expand_dims(b, 1, stream=stream)
    if nb == 1:
        g = mx.expand_dims(g, -1, stream=stream)
    if na == 1:
        g = mx.expand_dims(g, -2, stream=stream)
    complex_ = g._dtype.kind == "c"
    out = []
    for i in argnums:
        if i == out_pos:
            bt = _transposed(b2, stream)
            if complex_:
                bt = mx.conjugate(bt, stream=stream)
            out.append(_reshape(sum_to_shape(mx.matmul(g, bt, stream=stream), a2._shape, stream),
                                 a._shape, stream))
        elif len(b2._shape) == 2:
            # One matrix b for all of a's rows (a Linear layer on a batch of sequences):
            # its cotangent is one product over every row, a.T @ g with a's and g's batch
            # dimensions folded into the rows (not a batched product then a sum over the
            # batch: a pass more and batch times the memory).
            rows = math.prod(a2._shape[:-1])  # not -1: a dimension may be 0
            af = _reshape(a2, (rows, a2._shape[-1]), stream)
            gf = _reshape(g, (rows, g._shape[-1]), stream)
            if complex_:
                af = mx.conjugate(af, stream=stream)
            if nb == 2 and _is_matrix_transpose(b):
                # b is W.T (x @ W.T): (g.T @ a).T, whose transpose (the cotangent W gets
                # through Transpose's vjp) is the contiguous g.T @ a, so an optimizer's
                # update of W reads it in order, not as a strided view.
                out.append(_transposed(mx.matmul(_transposed(gf, stream), af, stream=stream),
                                       stream))
            else:
                out.append(_reshape(mx.matmul(_transposed(af, stream), gf, stream=stream),
                                    b._shape, stream))
        else:
            at = _transposed(a2, stream)
            if complex_:
                at = mx.conjugate(at, stream=stream)
            out.append(_reshape(sum_to_shape(mx.matmul(at, g, stream=stream), b2._shape, stream),
                                 b._shape, stream))
    return out


def _is_matrix_transpose(x: array) -> bool:
    """Whether ``x`` is an unevaluated transpose of a matrix (the layout of its data is
    the transposed one)."""
    p = x._prim
    return p is not None and getattr(p, "axes", None) == (1, 0) and type(p).name == "Transpose"


def _transposed(x: array, stream) -> array:
    """``x`` with its last two axes swapped (a plain transpose of a matrix: cheaper)."""
    if len(x._shape) == 2:
        return mx.transpose(x, stream=stream)
    return mx.swapaxes(x, -1, -2, stream=stream)


def _matmul_jvp(a: array, b: array, tangents, argnums, a_pos: int, stream) -> array:
    out = None
    for t, i in zip(tangents, argnums):
        if i == a_pos:
            d = mx.matmul(t, b, stream=stream)
        elif i == a_pos + 1:
            d = mx.matmul(a, t, stream=stream)
        else:
            continue
        out = add_tangents(out, d, stream)
    return out


# -- primitives ----------------------------------------------------------------
class Matmul(Primitive):
    """Matrix product with NumPy's ``matmul`` semantics (1-D operands, batch broadcast)."""

    __slots__ = ()
    arity = 2

    def output_shapes(self, inputs):
        return [matmul_shape(inputs[0].shape, inputs[1].shape)]

    def vjp(self, primals, cotangents, argnums, outputs):
        return _matmul_vjp(primals[0], primals[1], cotangents[0], argnums, 0, self.stream)

    def jvp(self, primals, tangents, argnums):
        return [_matmul_jvp(primals[0], primals[1], tangents, argnums, 0, self.stream)]

    def vmap(self, inputs, axes):
        s = self.stream
        a, b, vec_a, vec_b = _as_matrices(inputs[0], inputs[1], axes[0], axes[1], s)
        out = mx.matmul(a, b, stream=s)
        return [_drop_vector_dims(out, vec_a, vec_b, s)], [0]


class AddMM(Primitive):
    """``alpha * (a @ b) + beta * c``; inputs are ``(c, a, b)``."""

    __slots__ = ("alpha", "beta")
    arity = 3
    alpha: float
    beta: float

    def __init__(self, stream, alpha: float, beta: float):
        super().__init__(stream)
        self.alpha = alpha
        self.beta = beta

    def output_shapes(self, inputs):
        return [matmul_shape(inputs[1].shape, inputs[2].shape, "addmm")]

    def split_epilogue(self, in_dtypes, out_dtype):
        """For compile's fusion: a ``Matmul`` of ``a`` and ``b``, then ``alpha * y +
        beta * c`` as an element-wise tail that fuses with what reads the result (a
        Linear layer's activation); floating dtypes whose product has the output's
        dtype, and beta != 0 (where ``c`` is not read at all)."""
        _, a, b = in_dtypes
        if out_dtype.kind not in "fc" or a is not out_dtype or b is not out_dtype \
                or self.beta == 0.0:
            return None
        alpha, beta = self.alpha, self.beta

        def build(y, c):
            if alpha != 1.0:
                y = ir.apply("mul", y, ir.constant(alpha, y.dtype))
            c = ir.cast(c, y.dtype)
            if beta != 1.0:
                c = ir.apply("mul", c, ir.constant(beta, y.dtype))
            return ir.apply("add", y, c)
        return Matmul(self.stream), (1, 2), build

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        c, a, b = primals
        g = cotangents[0]
        out = []
        if argnums[0] == 0:
            gc = g if self.beta == 1.0 else mx.multiply(g, self.beta, stream=s)
            out.append(sum_to_shape(gc, c._shape, s))
            argnums = argnums[1:]
        if argnums:
            if self.alpha != 1.0:
                g = mx.multiply(g, self.alpha, stream=s)
            out += _matmul_vjp(a, b, g, argnums, 1, s)
        return out

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        c, a, b = primals
        out = _matmul_jvp(a, b, tangents, argnums, 1, s)
        if out is not None and self.alpha != 1.0:
            out = mx.multiply(out, self.alpha, stream=s)
        if argnums[0] == 0:
            tc = tangents[0]
            if self.beta != 1.0:
                tc = mx.multiply(tc, self.beta, stream=s)
            if out is None:
                out = mx.broadcast_to(tc, matmul_shape(a._shape, b._shape, "addmm"), stream=s)
            else:
                out = mx.add(out, tc, stream=s)
        return [out]

    def vmap(self, inputs, axes):
        s = self.stream
        c, a, b = inputs
        cx, ax, bx = axes
        if ax is None and bx is None:
            # Only c is batched: the product is computed once.
            ab = mx.matmul(a, b, stream=s)
            if self.alpha != 1.0:
                ab = mx.multiply(ab, self.alpha, stream=s)
            c = batch_first(c, cx, len(ab._shape), s)
            if self.beta == 0.0:  # as the kernel, ignore c (its NaNs too)
                return [mx.broadcast_to(ab, c._shape[:1] + ab._shape, stream=s)], [0]
            if self.beta != 1.0:
                c = mx.multiply(c, self.beta, stream=s)
            return [mx.add(ab, c, stream=s)], [0]
        a, b, vec_a, vec_b = _as_matrices(a, b, ax, bx, s)
        if cx is not None:
            # Per-example c has at most the per-example output's dimensions.
            rank = max(len(a._shape), len(b._shape)) - 1 - vec_a - vec_b
            c = batch_first(c, cx, rank, s)
        # c lines up with the product's per-example dimensions, vector ones
        # removed; put them back (a 0-d c broadcasts as it is).
        if vec_b and c._shape:
            c = mx.expand_dims(c, -1, stream=s)
        if vec_a and c._shape:
            c = mx.expand_dims(c, -2, stream=s)
        out = mx.addmm(c, a, b, alpha=self.alpha, beta=self.beta, stream=s)
        return [_drop_vector_dims(out, vec_a, vec_b, s)], [0]


class Softmax(SameShape):
    """``exp(x - max) / sum(exp(x - max))`` over ``axes``; same shape and dtype as ``x``.

    ``precise`` asks a kernel for half-precision inputs to accumulate in float32.
    """

    __slots__ = ("axes", "precise")
    arity = 1
    axes: Axes
    precise: bool

    def __init__(self, stream, axes: tuple[int, ...], precise: bool):
        super().__init__(stream)
        self.axes = axes
        self.precise = precise

    def _backward(self, y: array, v: array) -> array:
        """The Jacobian of softmax at output ``y`` applied to ``v``: ``y * (v - sum(v * y))``.

        The Jacobian is symmetric, so this serves both the vjp and the jvp.
        """
        s = self.stream
        dot = mx.sum(mx.multiply(v, y, stream=s), axis=list(self.axes), keepdims=True,
                     stream=s)
        return mx.multiply(y, mx.subtract(v, dot, stream=s), stream=s)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [self._backward(outputs[0], cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        y = mx.softmax(primals[0], axis=list(self.axes), precise=self.precise,
                       stream=self.stream)
        return [self._backward(y, tangents[0])]

    def vmap(self, inputs, axes):
        ax = axes[0]
        # The batch axis stays where it is; the softmax axes behind it shift by one.
        return [mx.softmax(inputs[0], axis=list(batched_axes(self.axes, ax)),
                           precise=self.precise, stream=self.stream)], [ax]


# -- op functions --------------------------------------------------------------
def matmul(a, b, /, *, stream=None) -> array:
    """Matrix product of ``a`` and ``b``.

    A 1-D ``a`` is treated as a row vector and a 1-D ``b`` as a column vector
    (the extra dimension is removed from the result). With more than two
    dimensions the leading (batch) dimensions broadcast.

    Args:
        a (array): input array of at least one dimension.
        b (array): input array of at least one dimension.

    Returns:
        array: the product, of the promoted (floating point or complex) dtype.

    Example:
        >>> matmul(ones((2, 3)), ones((3,))).shape
        (2,)
    """
    a, b, d = _operands(a, b, "matmul")
    shape = matmul_shape(a._shape, b._shape)
    if a._dtype is not d:
        a = cast(a, d, stream)
    if b._dtype is not d:
        b = cast(b, d, stream)
    return lazy(shape, d, Matmul(to_stream(stream)), (a, b))


def addmm(c, a, b, /, alpha: float = 1.0, beta: float = 1.0, *, stream=None) -> array:
    """Matrix product with an added term: ``alpha * (a @ b) + beta * c``.

    Args:
        c (array): the added array; it must broadcast to the shape of ``a @ b``.
        a (array): first factor of the product.
        b (array): second factor of the product.
        alpha (float): scale of the product. Default: ``1.0``.
        beta (float): scale of ``c``. Default: ``1.0``.

    Returns:
        array: the result, of the promoted (floating point or complex) dtype.
    """
    c = c if type(c) is array else as_array(c)
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    d = _PROMOTE[(_PROMOTE[(c._dtype, a._dtype)], b._dtype)]
    _inexact(d, "addmm", c._dtype, a._dtype, b._dtype)
    shape = matmul_shape(a._shape, b._shape, "addmm")
    sc = c._shape
    if sc != shape:
        try:
            ok = broadcast_shapes(sc, shape) == shape
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"[addmm] c with shape {sc} must broadcast to the output shape "
                             f"{shape} of a @ b (shapes {a._shape} and {b._shape}).")
    inputs = (cast(c, d, stream), cast(a, d, stream), cast(b, d, stream))
    return lazy(shape, d, AddMM(to_stream(stream), float(alpha), float(beta)), inputs)


def softmax(a, /, axis=None, *, precise: bool = False, stream=None) -> array:
    """Softmax of ``a`` over the given axes: ``exp(a) / sum(exp(a), axis)``.

    The computation subtracts the maximum first, so large values do not
    overflow. Integer and boolean inputs give float32.

    Args:
        a (array): input array.
        axis (int or list(int), optional): axis or axes to normalise over;
            ``None`` (the default) uses all axes.
        precise (bool): for half-precision inputs, accumulate in float32.
            Default: ``False``.

    Returns:
        array: the softmax of ``a``, with ``a``'s shape.
    """
    a = a if type(a) is array else as_array(a)
    axes = normalize_axes(axis, len(a._shape), "[softmax] axis")
    if a._dtype.kind in "biu":
        a = cast(a, dt.float32, stream)
    return lazy(a._shape, a._dtype, Softmax(to_stream(stream), axes, bool(precise)), (a,))


def _prod(dims) -> int:
    n = 1
    for s in dims:
        n *= s
    return n


def _reshape(x: array, shape: tuple, stream) -> array:
    return x if x._shape == shape else mx.reshape(x, shape, stream=stream)


def _contract(a: array, b: array, axes_a: list, axes_b: list, op: str, stream) -> array:
    """``tensordot`` over already normalised axes: transpose, reshape, one matmul."""
    sa, sb = a._shape, b._shape
    for i, j in zip(axes_a, axes_b):
        if sa[i] != sb[j]:
            raise ShapeError(f"[{op}] a and b must have the same size on the contracted "
                             f"axes: axis {i} of shape {sa} and axis {j} of shape {sb}.")
    da, db = a._dtype, b._dtype
    d = da if da is db else _PROMOTE[(da, db)]
    _inexact(d, op, da, db)
    free_a = [i for i in range(len(sa)) if i not in axes_a]
    free_b = [j for j in range(len(sb)) if j not in axes_b]
    out_shape = tuple(sa[i] for i in free_a) + tuple(sb[j] for j in free_b)
    perm_a = free_a + list(axes_a)
    perm_b = list(axes_b) + free_b
    if perm_a != list(range(len(sa))):
        a = mx.transpose(a, perm_a, stream=stream)
    if perm_b != list(range(len(sb))):
        b = mx.transpose(b, perm_b, stream=stream)
    k = _prod(sa[i] for i in axes_a)
    a2 = _reshape(a, (_prod(sa[i] for i in free_a), k), stream)
    b2 = _reshape(b, (k, _prod(sb[j] for j in free_b)), stream)
    return _reshape(matmul(a2, b2, stream=stream), out_shape, stream)


def tensordot(a, b, /, axes=2, *, stream=None) -> array:
    """Tensor contraction of ``a`` and ``b`` over the given axes.

    Args:
        a (array): input array.
        b (array): input array.
        axes (int or list(list(int))): an integer ``n`` contracts the last ``n``
            axes of ``a`` with the first ``n`` axes of ``b``; a pair of lists
            names the axes of ``a`` and of ``b`` to contract. Default: ``2``.

    Returns:
        array: the contraction; its shape is the free axes of ``a`` followed
        by the free axes of ``b``.
    """
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    na, nb = len(a._shape), len(b._shape)
    if isinstance(axes, (list, tuple)):
        if len(axes) != 2 or not all(isinstance(x, (list, tuple)) for x in axes):
            raise AxisError(f"[tensordot] axes must be an int or a pair of lists of ints, "
                            f"got {axes!r}.")
        if len(axes[0]) != len(axes[1]):
            raise AxisError(f"[tensordot] The two lists of axes must have the same length, "
                            f"got {axes!r}.")
        axes_a = [normalize_axis(i, na, "[tensordot] axis of a") for i in axes[0]]
        axes_b = [normalize_axis(j, nb, "[tensordot] axis of b") for j in axes[1]]
        if len(set(axes_a)) != len(axes_a) or len(set(axes_b)) != len(axes_b):
            raise AxisError(f"[tensordot] Repeated axis in {axes!r}.")
    else:
        if isinstance(axes, bool) or not hasattr(axes, "__index__"):
            raise AxisError(f"[tensordot] axes must be an int or a pair of lists of ints, "
                            f"got {axes!r}.")
        n = axes.__index__()
        if n < 0:
            raise AxisError(f"[tensordot] axes must be non-negative, got {n}.")
        if n > na or n > nb:
            raise AxisError(f"[tensordot] Cannot contract {n} axes of arrays with shapes "
                            f"{a._shape} and {b._shape}.")
        axes_a = list(range(na - n, na))
        axes_b = list(range(n))
    return _contract(a, b, axes_a, axes_b, "tensordot", stream)


def inner(a, b, /, *, stream=None) -> array:
    """Inner product over the last axes of ``a`` and ``b``.

    For 1-D arrays this is the dot product; a 0-d input multiplies
    element-wise.

    Args:
        a (array): input array.
        b (array): input array.

    Returns:
        array: the inner product, of shape ``a.shape[:-1] + b.shape[:-1]``.
    """
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    na, nb = len(a._shape), len(b._shape)
    if na == 0 or nb == 0:
        return mx.multiply(a, b, stream=stream)
    if a._shape[-1] != b._shape[-1]:
        raise ShapeError(f"[inner] a and b must have the same last dimension, got shapes "
                         f"{a._shape} and {b._shape}.")
    return _contract(a, b, [na - 1], [nb - 1], "inner", stream)


def outer(a, b, /, *, stream=None) -> array:
    """Outer product of ``a`` and ``b``; inputs of several dimensions are flattened.

    Args:
        a (array): input array.
        b (array): input array.

    Returns:
        array: the products ``a[i] * b[j]``, of shape ``(a.size, b.size)``.
    """
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    return mx.multiply(_reshape(a, (a.size, 1), stream), _reshape(b, (b.size,), stream),
                       stream=stream)


def kron(a, b, *, stream=None) -> array:
    """Kronecker product of ``a`` and ``b``.

    The shapes are aligned on the right (the one with fewer dimensions gets
    leading ones); the result has shape ``a.shape[i] * b.shape[i]``.

    Args:
        a (array): input array.
        b (array): input array.

    Returns:
        array: the Kronecker product.
    """
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    if not a.size or not b.size:  # as MLX
        raise ShapeError(f"[kron] Input arrays cannot be empty, got shapes {a._shape} and "
                         f"{b._shape}.")
    n = max(len(a._shape), len(b._shape))
    sa = (1,) * (n - len(a._shape)) + a._shape
    sb = (1,) * (n - len(b._shape)) + b._shape
    # Interleave the axes: a varies on the even ones, b on the odd ones.
    a = _reshape(a, tuple(x for s in sa for x in (s, 1)), stream)
    b = _reshape(b, tuple(x for s in sb for x in (1, s)), stream)
    return _reshape(mx.multiply(a, b, stream=stream), tuple(x * y for x, y in zip(sa, sb)),
                    stream)


def vecdot(a, b, /, *, axis: int = -1, stream=None) -> array:
    """Compute the vector dot product of two arrays along an axis.

    ``sum(conj(a) * b, axis)``: ``a`` and ``b`` have the same number of dimensions
    and the same size along ``axis``; the other axes broadcast.

    Args:
        a (array): Input array.
        b (array): Input array.
        axis (int, optional): Axis over which to compute the dot product. Default: ``-1``.

    Returns:
        array: The vector dot product.
    """
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    na, nb = len(a._shape), len(b._shape)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise DtypeError(f"[vecdot] axis must be an integer, got {axis!r}.")
    axis = axis.__index__()
    if na != nb or not -na <= axis < na:
        raise AxisError(f"[vecdot] axis {axis} is out of bounds for a and b of shapes "
                        f"{a._shape} and {b._shape} (they need the same number of "
                        f"dimensions).")
    if a._shape[axis] != b._shape[axis]:
        raise ShapeError(f"[vecdot] a and b must have the same size along axis {axis}, got "
                         f"shapes {a._shape} and {b._shape}.")
    if a._dtype.kind == "c":
        a = mx.conj(a, stream=stream)
    return mx.sum(mx.multiply(a, b, stream=stream), axis, stream=stream)


# -- einsum ----------------------------------------------------------------------------
# MLX's einsum (mlx/einsum.cpp, after NumPy's and opt_einsum's): parse the subscripts
# (implicit output, ellipses), choose a contraction order with a greedy path optimiser,
# then lower each step of the path to lazyx ops: repeated indices become diagonals,
# indices only one operand has are summed, a pair with a contracted index is one batched
# matmul, anything else multiplies with broadcasting and sums. Every step is made of
# ops that have their own rules, so grad, vmap and compile need nothing more.
_EINSUM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum_parse(subscripts: str, shapes: list, op: str):
    """``(input subscripts, output subscript, size of each index, largest term)`` with
    ellipses expanded, checked against the operands' ``shapes`` as MLX checks them."""
    if not isinstance(subscripts, str):
        raise ArgumentError(f"[{op}] subscripts must be a string, got {subscripts!r}.")
    if not shapes:
        raise ArgumentError(f"[{op}] At least one operand is required.")
    subs = subscripts.replace(" ", "")
    if "->" in subs:
        lhs, rhs = subs.split("->", 1)
    else:
        # Implicit output: indices seen once, sorted; an ellipsis goes first.
        lhs, counts, rhs = subs, {}, ""
        for c in subs:
            if c == ",":
                continue
            if c == "." and not rhs:
                rhs = "..."
                continue
            counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(rhs + "".join(c for c, n in counts.items() if n == 1)))
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ArgumentError(f"[{op}] Number of operands, {len(shapes)}, does not match number "
                            f"of input subscripts, {len(terms)} (subscripts {subscripts!r}).")
    # Ellipsis axes take the last unused letters, so shorter operands broadcast on the left.
    free = "".join(c for c in _EINSUM_LETTERS if c not in subscripts)
    widest = 0

    def expand(term: str, ndim):
        nonlocal widest
        if any(not c.isalpha() for c in term.replace("...", "")) or term.count("...") > 1 \
                or term.replace("...", "").count("."):
            bad = [c for c in term.replace("...", "") if not c.isalpha()]
            if term.count("...") > 1:
                raise ArgumentError(f"[{op}] Only one ellipsis per subscript is allowed but "
                                    f"found more in {term!r}.")
            raise ArgumentError(f"[{op}] Subscripts must be letters, but got {bad[0]!r} in "
                                f"{subscripts!r}.")
        if "..." not in term:
            return term
        named = len(term) - 3
        if ndim is None:
            n = widest
        else:
            n = ndim - named
            if n < 0:
                raise ShapeError(f"[{op}] An operand of shape {shapes[len(done)]} has "
                                 f"insufficient dimensions for subscript {term!r}: the "
                                 f"ellipsis needs at least {named} dimensions.")
            widest = max(widest, n)
        return term.replace("...", free[len(free) - n:] if n else "")

    done: list = []
    for term, shape in zip(terms, shapes):
        done.append(expand(term, len(shape)))
    out = expand(rhs, None)
    if len(set(out)) != len(out):
        raise ArgumentError(f"[{op}] Repeat indices not allowed in output {rhs!r}.")
    sizes: dict = {}
    for k, (term, shape) in enumerate(zip(done, shapes)):
        if len(term) != len(shape):
            raise ShapeError(f"[{op}] Invalid number of subscripts {len(term)} ({terms[k]!r}) "
                             f"for input {k} with {len(shape)} dimensions (shape {shape}).")
        local: dict = {}
        for c, d in zip(term, shape):
            if local.setdefault(c, d) != d:
                raise ShapeError(f"[{op}] Dimensions of repeated subscripts do not have the "
                                 f"same size ({local[c]} != {d}) in {terms[k]!r} for input "
                                 f"{k} of shape {shape}.")
            have = sizes.setdefault(c, d)
            if d != 1 and have != 1 and have != d:
                raise ShapeError(f"[{op}] Cannot broadcast dimension {term.index(c)} of input "
                                 f"{k} with shape {shape} to size {have}.")
            sizes[c] = max(have, d)
    for c in out:
        if c not in sizes:
            raise ArgumentError(f"[{op}] Output subscript {c!r} does not appear in any input "
                                f"of {subscripts!r}.")
    largest = max(_prod(sizes[c] for c in t) for t in done + [out])
    return done, out, sizes, largest


@functools.cache
def _greedy_optimizer():
    """MLX's greedy contraction order as an ``opt_einsum`` path optimiser (a class
    built on first use: opt_einsum costs ~10 ms to import)."""
    from opt_einsum.helpers import compute_size_by_dict, flop_count  # start-up: see above
    from opt_einsum.paths import PathOptimizer  # start-up: see above

    class MLXGreedy(PathOptimizer):
        """Pairwise greedy: contract the pair that removes the most elements (then the
        cheapest), outer products only when no pair shares an index; a candidate whose
        result outgrows ``memory_limit`` or whose cost passes ``cost_limit`` is dropped.
        This is MLX's rule (and NumPy's), so ``einsum_path`` gives MLX's paths."""

        def __init__(self, cost_limit: int | None = None):
            self.cost_limit = cost_limit

        def __call__(self, inputs, output, size_dict, memory_limit=None):
            sets = [frozenset(s) for s in inputs]
            output = frozenset(output)
            if len(sets) <= 2:
                return [tuple(range(len(sets)))]
            def size(indices):
                return compute_size_by_dict(indices, size_dict)

            mem = float("inf") if memory_limit is None else memory_limit
            cost_limit = float("inf") if self.cost_limit is None else self.cost_limit
            pairs = [(i, j) for i in range(len(sets)) for j in range(i + 1, len(sets))]
            path, spent, found = [], 0, []

            def consider(i, j):
                both = sets[i] | sets[j]
                keep = frozenset(c for k, s in enumerate(sets) if k not in (i, j)
                                 for c in s if c in both) | (output & both)
                new_size = size(keep)
                if new_size > mem:
                    return
                cost = flop_count(both, len(both) > len(keep), 2, size_dict)
                if spent + cost > cost_limit:
                    return
                found.append((size(sets[i]) + size(sets[j]) - new_size, cost, keep, i, j))

            for _ in range(len(sets) - 1):
                for i, j in pairs:
                    if sets[i] & sets[j]:
                        consider(i, j)
                if not found:  # outer products only when nothing shares an index
                    for i, j in pairs:
                        consider(i, j)
                if not found:
                    path.append(tuple(range(len(sets))))
                    break
                best = found[0]
                for cand in found[1:]:
                    if cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                        best = cand
                _, cost, keep, x, y = best
                path.append((x, y))
                spent += cost
                del sets[y], sets[x]
                sets.append(keep)
                found[:] = [(r, c, k, i - (i > x) - (i > y), j - (j > x) - (j > y))
                            for r, c, k, i, j in found if not {i, j} & {x, y}]
                pairs = [(i, len(sets) - 1) for i in range(len(sets) - 1)]
            return path

    return MLXGreedy, flop_count


def _einsum_plan(subscripts: str, operands: tuple, op: str):
    """The parsed subscripts, the path and the figures ``einsum_path`` prints."""
    shapes = [x._shape for x in operands]
    terms, out, sizes, largest = _einsum_parse(subscripts, shapes, op)
    optimizer, flop_count = _greedy_optimizer()
    every = set("".join(terms))
    naive_cost = flop_count(every, bool(every - set(out)), len(terms), sizes)
    path = optimizer(cost_limit=naive_cost)([set(t) for t in terms], set(out), sizes, largest)
    # Replay the path on index sets for the optimised cost and scaling.
    sets, cost, scaling = [set(t) for t in terms], 0, 0
    if len(terms) <= 2:
        cost, scaling = naive_cost, len(every)
    else:
        for step in path:
            both = set().union(*(sets[i] for i in step))
            rest = [s for k, s in enumerate(sets) if k not in step]
            keep = {c for c in both if c in out or any(c in s for s in rest)}
            cost += flop_count(both, len(both) > len(keep), len(step), sizes)
            scaling = max(scaling, len(both))
            sets = rest + [keep]
    info = (f"  Complete contraction:  {subscripts}\n"
            f"         Naive scaling:  {len(every)}\n"
            f"     Optimized scaling:  {scaling}\n"
            f"      Naive FLOP count:  {naive_cost}\n"
            f"  Optimized FLOP count:  {cost}\n")
    return terms, out, path, info


def _collapse_repeats(x: array, term: str, stream):
    """``x`` with each repeated index replaced by its diagonal (``ii`` -> ``i``)."""
    while len(set(term)) < len(term):
        c = next(c for c in term if term.count(c) > 1)
        i = term.index(c)
        j = term.index(c, i + 1)
        x = mx.diagonal(x, 0, i, j, stream=stream)  # the diagonal axis goes last
        term = term[:i] + term[i + 1:j] + term[j + 1:] + c
    return x, term


def _einsum_dot(a: array, ta: str, b: array, tb: str, out: str, stream):
    """Contract ``a`` and ``b`` over their shared indices not in ``out`` with one batched
    matmul; the result's indices are batch, then a's free, then b's free ones."""
    contract = [c for c in ta if c not in out]
    batch = [c for c in ta if c in out and c in tb]
    free_a = [c for c in ta if c in out and c not in tb]
    free_b = [c for c in tb if c in out and c not in ta]
    sa = dict(zip(ta, a._shape))
    sb = dict(zip(tb, b._shape))

    def arrange(x, term, sizes, order, group1, group2):
        perm = [term.index(c) for c in order]
        if perm != list(range(len(term))):
            x = mx.transpose(x, perm, stream=stream)
        # A contracted index of size 1 on one side broadcasts to the other side's size.
        full = tuple(max(sa[c] if c in sa else 1, sb[c] if c in sb else 1)
                     if c in contract else sizes[c] for c in order)
        if full != x._shape:
            x = mx.broadcast_to(x, full, stream=stream)
        lead = full[:len(batch)]
        return _reshape(x, lead + (_prod(sizes_of(group1, full, order)),
                                   _prod(sizes_of(group2, full, order))), stream)

    def sizes_of(group, full, order):
        return [full[order.index(c)] for c in group]

    a2 = arrange(a, ta, sa, batch + free_a + contract, free_a, contract)
    b2 = arrange(b, tb, sb, batch + contract + free_b, contract, free_b)
    r = matmul(a2, b2, stream=stream)
    shape = r._shape[:len(batch)] + tuple(sa[c] for c in free_a) + tuple(sb[c] for c in free_b)
    return _reshape(r, shape, stream), "".join(batch + free_a + free_b)


def _einsum_naive(xs: list, terms: list, out: str, stream):
    """Multiply the operands with broadcasting and sum the indices not in ``out``."""
    order = []
    for t in terms:
        order += [c for c in t if c not in order]
    acc = None
    for x, t in zip(xs, terms):
        mine = [c for c in order if c in t]
        perm = [t.index(c) for c in mine]
        if perm != list(range(len(t))):
            x = mx.transpose(x, perm, stream=stream)
        dims = dict(zip(mine, x._shape))
        x = _reshape(x, tuple(dims.get(c, 1) for c in order), stream)
        acc = x if acc is None else mx.multiply(acc, x, stream=stream)
    summed = tuple(i for i, c in enumerate(order) if c not in out)
    if summed:
        acc = mx.sum(acc, summed, stream=stream)
    left = [c for c in order if c in out]
    return acc, "".join(left)


def einsum(subscripts: str, *operands, stream=None) -> array:
    """Perform the Einstein summation convention on the operands.

    The contraction order is MLX's greedy path (see :func:`einsum_path`); each step
    is a diagonal, a sum, a batched ``matmul`` or a broadcast product, so ``einsum``
    differentiates, vectorises and compiles like the ops it is made of.

    Args:
        subscripts (str): The Einstein summation convention equation, e.g.
            ``"ij,jk->ik"``; ``...`` stands for broadcast leading axes, and without
            ``->`` the output is the indices seen once, in alphabetical order.
        *operands (array): The input arrays.

    Returns:
        array: The output array.

    Example:
        >>> einsum("bhqd,bhkd->bhqk", q, k)  # attention scores
    """
    xs = [x if type(x) is array else as_array(x) for x in operands]
    terms, out, path, _ = _einsum_plan(subscripts, xs, "einsum")
    terms = list(terms)
    for step in path:
        inputs = [xs[i] for i in step]
        subs = [terms[i] for i in step]
        rest = [terms[i] for i in range(len(terms)) if i not in step]
        final = len(rest) == 0
        # The indices this step must keep: the output's and those later steps need.
        wanted = set(out).union(*rest) if not final else set(out)
        for k in range(len(inputs)):
            inputs[k], subs[k] = _collapse_repeats(inputs[k], subs[k], stream)
        for k in range(len(inputs)):
            others = set(wanted).union(*(s for m, s in enumerate(subs) if m != k))
            alone = tuple(i for i, c in enumerate(subs[k]) if c not in others)
            if alone:
                inputs[k] = mx.sum(inputs[k], alone, stream=stream)
                subs[k] = "".join(c for c in subs[k] if c in others)
        if len(inputs) == 2 and any(c not in wanted for c in subs[0]):
            r, rt = _einsum_dot(inputs[0], subs[0], inputs[1], subs[1], wanted, stream)
        else:
            r, rt = _einsum_naive(inputs, subs, wanted, stream)
        xs = [x for i, x in enumerate(xs) if i not in step] + [r]
        terms = rest + [rt]
    (r,), (rt,) = xs, terms
    if rt != out:
        r = mx.transpose(r, [rt.index(c) for c in out], stream=stream)
    return r


def einsum_path(subscripts: str, *operands):
    """Compute the contraction order for the given Einstein summation.

    Args:
        subscripts (str): The Einstein summation convention equation.
        *operands (array): The input arrays.

    Returns:
        tuple(list(tuple(int, int)), str): The einsum path (the positions contracted
        at each step, in the list of operands left at that step, results appended)
        and a string containing information about the chosen path.
    """
    xs = [x if type(x) is array else as_array(x) for x in operands]
    _, _, path, info = _einsum_plan(subscripts, xs, "einsum_path")
    return path, info


def _rmatmul(a, b):
    return matmul(b, a)


PRIMITIVES = [Matmul, AddMM, Softmax]

OPS = {
    "matmul": matmul, "addmm": addmm, "inner": inner, "outer": outer,
    "tensordot": tensordot, "kron": kron, "softmax": softmax,
    "einsum": einsum, "einsum_path": einsum_path, "vecdot": vecdot,
    "array.__matmul__": matmul, "array.__rmatmul__": _rmatmul,
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


@hookimpl
def lazyx_examples():
    return [
        (Matmul, example(matmul, uniform((2, 3)), uniform((3, 4)))),
        # A vector against a stack of matrices: the batch dimensions broadcast.
        (Matmul, example(matmul, uniform((3,)), uniform((2, 3, 2)))),
        (AddMM, example(lambda c, a, b: addmm(c, a, b, alpha=0.5, beta=2.0),
                        uniform((4,)), uniform((2, 3)), uniform((3, 4)))),
        (Softmax, example(lambda x: softmax(x, axis=-1), uniform((2, 3)))),
        (Softmax, example(lambda x: softmax(x, axis=(0, 2)), uniform((2, 2, 3)))),
    ]
