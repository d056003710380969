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

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast, normalize_axes, normalize_axis
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import AxisError, DtypeError, ShapeError
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
        else:
            at = _transposed(a2, stream)
            if complex_:
                at = mx.conjugate(at, stream=stream)
            out.append(_reshape(sum_to_shape(mx.matmul(at, g, stream=stream), b2._shape, stream),
                                 b._shape, stream))
    return out


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
    alpha: float
    beta: float

    def __init__(self, stream, alpha: float, beta: float):
        super().__init__(stream)
        self.alpha = alpha
        self.beta = beta

    def output_shapes(self, inputs):
        return [matmul_shape(inputs[1].shape, inputs[2].shape, "addmm")]

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
    n = max(len(a._shape), len(b._shape))
    sa = (1,) * (n - len(a._shape)) + a._shape
    sb = (1,) * (n - len(b._shape)) + b._shape
    # Interleave the axes: a varies on the even ones, b on the odd ones.
    a = _reshape(a, tuple(x for s in sa for x in (s, 1)), stream)
    b = _reshape(b, tuple(x for s in sb for x in (1, s)), stream)
    return _reshape(mx.multiply(a, b, stream=stream), tuple(x * y for x, y in zip(sa, sb)),
                    stream)


def _rmatmul(a, b):
    return matmul(b, a)


PRIMITIVES = [Matmul, AddMM, Softmax]

OPS = {
    "matmul": matmul, "addmm": addmm, "inner": inner, "outer": outer,
    "tensordot": tensordot, "kron": kron, "softmax": softmax,
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
