"""Op pack ``conv``: convolutions, as ``mlx.core``'s ``conv*`` and ``convolve``.

Every function lowers to ONE primitive, :class:`Convolution` (MLX's ``Convolution``):

    out[n, t..., o] = sum_{k..., c} xp[n, t*stride + k*kernel_dilation ..., g*Cg + c]
                                   * w[o, k... (reversed when flip), c]

with channels last (input ``(N, spatial..., C_in)``, weight ``(C_out, K..., C_in /
groups)``), ``g = o // (C_out / groups)``, and ``xp`` the *virtual* input: ``x``
dilated by ``input_dilation`` (``input_dilation - 1`` zeros between neighbours), then
padded with ``padding_lo``/``padding_hi`` zeros (a negative padding crops). The flow:

1. The public function reads its arguments as MLX does (``conv2d``: an int or a pair;
   ``conv_general``: an int, a list, or a pair of lists ``(lo, hi)`` for asymmetric
   padding; a one-element list applies to every spatial axis) and checks them
   (:func:`_checked`): spatial rank 1-3, floating input, weight rank, channels and
   groups, positive strides and dilations, a kernel that fits the padded input. Each
   failure is a lazyx error (a ``ValueError``, as MLX raises) naming the function, the
   argument and the shapes.
2. ``conv_transpose*`` is the convolution whose weight is flipped and whose input is
   dilated by ``stride`` (padding ``K_d - 1 - padding`` low, that plus
   ``output_padding`` high); ``convolve`` a one-channel ``conv_general`` with ``flip``.
3. The inputs are cast to their promoted dtype and one :class:`Convolution` node is
   made.

Gradients are convolutions again (MLX's rules): the input's cotangent convolves the
output cotangent (dilated by ``stride``) with the channel-transposed weight, flipped
the other way; the weight's convolves the channel/batch-transposed input with the
batch-transposed cotangent as kernel (``stride`` and ``kernel_dilation`` trade places).
The primitive is linear in each input, so its jvp is two convolutions. ``vmap`` folds
a batched input into ``N`` and a batched weight into ``groups``.

Kernels: NumPy (``backends/cpu/kernels/conv.py``: windows + one matmul per group),
native im2col in C++ onto NumPy's BLAS (``backends/cpu/native_packs/conv.py``),
cuDNN or im2col on cuBLAS (``backends/cuda/conv.py``).
"""

from __future__ import annotations

import operator

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, cast
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, DtypeError, ShapeError
from lazyx.examples import example, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive


class Convolution(Primitive):
    """The general convolution of input 0 ``(N, spatial..., C_in)`` with the weight
    input 1 ``(C_out, K..., C_in / groups)`` (see the module docstring); one entry per
    spatial axis in each tuple. A negative padding crops the dilated input."""

    __slots__ = ("strides", "padding_lo", "padding_hi", "kernel_dilation", "input_dilation",
                 "groups", "flip")
    strides: tuple[int, ...]
    padding_lo: tuple[int, ...]
    padding_hi: tuple[int, ...]
    kernel_dilation: tuple[int, ...]
    input_dilation: tuple[int, ...]
    groups: int
    flip: bool
    arity = 2

    def output_shapes(self, inputs):
        x, w = inputs[0].shape, inputs[1].shape
        return [output_shape(x, w, self.strides, self.padding_lo, self.padding_hi,
                             self.kernel_dilation, self.input_dilation)]

    def output_dtypes(self, inputs):
        return [inputs[0].dtype]

    def _conv(self, x, w, strides=None, lo=None, hi=None, kdil=None, idil=None, groups=None,
              flip=None):
        """This convolution, or a relative of it, on this node's stream."""
        return _node(x, w, self.strides if strides is None else strides,
                     self.padding_lo if lo is None else lo, self.padding_hi if hi is None else hi,
                     self.kernel_dilation if kdil is None else kdil,
                     self.input_dilation if idil is None else idil,
                     self.groups if groups is None else groups,
                     self.flip if flip is None else flip, self.stream)

    def _group_transpose(self, x, group_dim: int, a: int, b: int):
        """``x`` with axes ``a`` and ``b`` swapped inside each group: the channels at
        ``group_dim`` split into ``(groups, channels / groups)`` around the swap."""
        s = self.stream
        if self.groups == 1:
            return mx.swapaxes(x, 0, -1, stream=s)
        shape = list(x._shape)
        group_dim %= len(shape)
        shape[group_dim:group_dim + 1] = [self.groups, shape[group_dim] // self.groups]
        x = mx.swapaxes(mx.reshape(x, shape, stream=s), a, b, stream=s)
        return mx.flatten(x, group_dim, group_dim + 1, stream=s)

    def vjp(self, primals, cotangents, argnums, outputs):
        x, w = primals
        cot = cotangents[0]
        s = self.stream
        sizes = _sizes(self, x._shape, w._shape, cot._shape)
        grads = []
        for arg in argnums:
            if arg == 0:
                # dx[j] = sum_k cot_dilated[lo + j*id - k*kd] w[k]: a convolution of the
                # cotangent dilated by the strides, with the kernel flipped the other way.
                lo = tuple(kd - 1 - p for (_, kd, _), p in zip(sizes, self.padding_lo))
                hi = tuple(i - o + p for (i, _, o), p in zip(sizes, self.padding_lo))
                grads.append(self._conv(cot, self._group_transpose(w, 0, 1, -1),
                                        strides=self.input_dilation, lo=lo, hi=hi,
                                        idil=self.strides, flip=not self.flip))
            else:
                # dw[o, k, c] = sum_{n, t} cot[n, t, o] xp[n, t*stride + k*kd, c]: the input
                # with batch and channels swapped, convolved with the cotangent as kernel.
                hi = tuple(o - i + kd - p - 1 for (i, kd, o), p in zip(sizes, self.padding_lo))
                g = self._conv(self._group_transpose(x, -1, 0, -1),
                               mx.swapaxes(cot, 0, -1, stream=s),
                               strides=self.kernel_dilation, hi=hi, kdil=self.strides,
                               flip=False)
                if self.flip:
                    nd = len(g._shape)
                    g = g[(slice(None),) + (slice(None, None, -1),) * (nd - 2) + (slice(None),)]
                grads.append(mx.swapaxes(g, 0, -1, stream=s))
        return grads

    def jvp(self, primals, tangents, argnums):
        out = None
        for arg, t in zip(argnums, tangents):
            term = self._conv(t, primals[1]) if arg == 0 else self._conv(primals[0], t)
            out = term if out is None else mx.add(out, term, stream=self.stream)
        return [out]

    def vmap(self, inputs, axes):
        s = self.stream
        x, w = inputs
        xa, wa = axes
        if wa is None:
            # Examples are more images: fold the batch into N.
            x = mx.moveaxis(x, xa, 0, stream=s) if xa else x
            b, n = x._shape[:2]
            out = self._conv(mx.reshape(x, (b * n,) + x._shape[2:], stream=s), w)
            return [mx.reshape(out, (b, n) + out._shape[1:], stream=s)], [0]
        # A batch of weights is a batch of groups: the input's channels become (B, C)
        # and the weights' output channels (B, C_out), `groups` times B.
        w = mx.moveaxis(w, wa, 0, stream=s) if wa else w
        b = w._shape[0]
        if xa is None:
            x = mx.broadcast_to(mx.expand_dims(x, -2, stream=s),
                                x._shape[:-1] + (b, x._shape[-1]), stream=s)
        else:
            x = mx.moveaxis(x, xa, -2, stream=s)
        x = mx.reshape(x, x._shape[:-2] + (b * x._shape[-1],), stream=s)
        w = mx.reshape(w, (b * w._shape[1],) + w._shape[2:], stream=s)
        out = self._conv(x, w, groups=self.groups * b)
        out = mx.reshape(out, out._shape[:-1] + (b, out._shape[-1] // b), stream=s)
        return [out], [len(out._shape) - 2]


PRIMITIVES = [Convolution]


def _sizes(p: Convolution, xs: tuple, ws: tuple, cs: tuple) -> list:
    """Per spatial axis: the dilated input's, the dilated kernel's and the dilated
    output's (the output spread by the strides) extents."""
    return [((xs[i + 1] - 1) * p.input_dilation[i] + 1, (ws[i + 1] - 1) * p.kernel_dilation[i] + 1,
             (cs[i + 1] - 1) * p.strides[i] + 1) for i in range(len(p.strides))]


def output_shape(x: tuple, w: tuple, strides, lo, hi, kdil, idil) -> tuple:
    """The convolution's output shape (its arguments already checked)."""
    out = [x[0]]
    for i in range(len(strides)):
        span = (x[i + 1] - 1) * idil[i] + 1 + lo[i] + hi[i] - ((w[i + 1] - 1) * kdil[i] + 1) + 1
        out.append((span - 1) // strides[i] + 1)
    return tuple(out) + (w[0],)


def _node(x, w, strides, lo, hi, kdil, idil, groups, flip, stream) -> array:
    p = Convolution(stream, tuple(strides), tuple(lo), tuple(hi), tuple(kdil), tuple(idil),
                    groups, bool(flip))
    return lazy(p.output_shapes((x, w))[0], x._dtype, p, (x, w))


# -- arguments -------------------------------------------------------------------------
def _int(value, what: str, op: str) -> int:
    """``value`` as a Python int (an int or a NumPy integer, as MLX takes them)."""
    if type(value) is int:
        return value
    if not isinstance(value, (array, float)) and hasattr(value, "__index__"):
        return operator.index(value)
    raise DtypeError(f"[{op}] {what} must be an integer, got {value!r} ({type(value).__name__}).")


def _per_axis(value, nd: int | None, what: str, op: str) -> list:
    """An int, or a sequence of ints (``nd`` of them when ``nd`` is given: the fixed
    arity of ``conv2d``'s tuples), as a list."""
    if isinstance(value, (list, tuple)):
        if nd is not None and len(value) != nd:
            raise DtypeError(f"[{op}] {what} must be an int or a tuple of {nd} ints, got {value!r}.")
        return [_int(v, f"{what} entry", op) for v in value]
    return [_int(value, what, op)]


def _padding(value, op: str) -> tuple[list, list]:
    """``conv_general``'s padding: an int, a list (symmetric), or ``(lo, hi)`` lists."""
    if (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, (list, tuple)) for v in value)):
        return _per_axis(value[0], None, "padding", op), _per_axis(value[1], None, "padding", op)
    p = _per_axis(value, None, "padding", op)
    return p, list(p)


def _spread(values: list, nd: int, default: int, what: str, op: str, x, w) -> tuple:
    """One entry per spatial axis: a single value (or none) applies to all of them."""
    if len(values) <= 1:
        return (values[0] if values else default,) * nd
    if len(values) != nd:
        raise ArgumentError(f"[{op}] Invalid {what} {tuple(values)} for a {nd}D convolution "
                            f"(input of shape {x._shape}, weight of shape {w._shape}): give one "
                            f"value or {nd}.")
    return tuple(values)


#: ``(op, shapes, dtypes, arguments) -> (dtype, strides, lo, hi, kdil, idil)`` of calls
#: that passed the checks: a training loop's convolutions are checked once per layout.
_CHECKED: dict = {}


def _checked(op, x, w, stride, lo, hi, kdil, idil, groups, flip, stream) -> array:
    """Check a general convolution's arguments as MLX does and make its node."""
    x, w = as_array(x), as_array(w)
    groups = _int(groups, "groups", op)
    key = (op, x._shape, x._dtype, w._shape, w._dtype, tuple(stride), tuple(lo), tuple(hi),
           tuple(kdil), tuple(idil), groups, flip)
    hit = _CHECKED.get(key)
    if hit is None:
        hit = _check(op, x, w, stride, lo, hi, kdil, idil, groups)
        if len(_CHECKED) >= 1024:
            _CHECKED.clear()
        _CHECKED[key] = hit
    dtype, stride, lo, hi, kdil, idil = hit
    s = to_stream(stream)
    return _node(cast(x, dtype, s), cast(w, dtype, s), stride, lo, hi, kdil, idil, groups, flip, s)


def _check(op, x, w, stride, lo, hi, kdil, idil, groups) -> tuple:
    """The checks of :func:`_checked` (MLX's, with shapes in the messages): the node's
    dtype and its per-axis arguments."""
    nd = x.ndim - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"[{op}] Only inputs with 1-3 spatial dimensions are supported: got "
                         f"input of shape {x._shape}; the layout is (N, ..., C_in).")
    if groups != 1 and nd == 3:
        raise ArgumentError(f"[{op}] groups={groups} is supported in 1D and 2D convolutions "
                            f"only (as MLX), got input of shape {x._shape}.")
    if x._dtype.kind not in "fc":
        raise DtypeError(f"[{op}] Invalid input array with type {x._dtype.name}: convolution "
                         f"supports floating point types only (input of shape {x._shape}).")
    dtype = dt.promote_types(x._dtype, w._dtype)
    if w.ndim != nd + 2:
        raise ShapeError(f"[{op}] Invalid weight of shape {w._shape} ({w.ndim} dimensions) for "
                         f"a {nd}D convolution of input of shape {x._shape}: expected "
                         f"{nd + 2} dimensions, (C_out, ..., C_in).")
    if groups < 1:
        raise ArgumentError(f"[{op}] groups must be positive, got {groups}.")
    c_in = x._shape[-1]
    if c_in % groups:
        raise ShapeError(f"[{op}] The input channels must be divisible by groups: got input of "
                         f"shape {x._shape} and groups={groups}.")
    if groups > 1 and w._shape[0] % groups:
        raise ShapeError(f"[{op}] The output channels must be divisible by groups: got weight "
                         f"of shape {w._shape} and groups={groups}.")
    if w._shape[-1] * groups != c_in:
        raise ShapeError(f"[{op}] Mismatched input channels: input of shape {x._shape} has "
                         f"{c_in} channels, so with groups={groups} the weight needs "
                         f"{c_in // groups} in its last axis; got weight of shape {w._shape}.")
    stride = _spread(stride, nd, 1, "stride", op, x, w)
    lo = _spread(lo, nd, 0, "padding", op, x, w)
    hi = _spread(hi, nd, 0, "padding", op, x, w)
    kdil = _spread(kdil, nd, 1, "kernel dilation", op, x, w)
    idil = _spread(idil, nd, 1, "input dilation", op, x, w)
    for name, values in (("stride", stride), ("kernel dilation", kdil), ("input dilation", idil)):
        if min(values) < 1:
            raise ArgumentError(f"[{op}] The {name} must be positive, got {values} (input of "
                                f"shape {x._shape}, weight of shape {w._shape}).")
    for i in range(nd):
        span = (x._shape[i + 1] - 1) * idil[i] + 1 + lo[i] + hi[i]
        kernel = (w._shape[i + 1] - 1) * kdil[i] + 1
        if span < kernel:
            raise ShapeError(f"[{op}] The kernel is larger than the padded input along spatial "
                             f"axis {i}: input of shape {x._shape} (padding low {lo}, high {hi}, "
                             f"input dilation {idil}) against weight of shape {w._shape} "
                             f"(kernel dilation {kdil}).")
    return dtype, stride, lo, hi, kdil, idil


# -- the public functions ---------------------------------------------------------------
def conv_general(input, weight, /, stride=1, padding=0, kernel_dilation=1, input_dilation=1,
                 groups: int = 1, flip: bool = False, *, stream=None) -> array:
    """General convolution over an input with several channels.

    Args:
        input (array): Input of shape ``(N, ..., C_in)``.
        weight (array): Weight of shape ``(C_out, ..., C_in / groups)``.
        stride (int or list(int), optional): Kernel strides. Default: ``1``.
        padding (int, list(int) or tuple(list(int), list(int)), optional): Input
            padding, symmetric or as ``(low, high)`` lists. Default: ``0``.
        kernel_dilation (int or list(int), optional): Kernel dilation. Default: ``1``.
        input_dilation (int or list(int), optional): Input dilation. Default: ``1``.
        groups (int, optional): Input feature groups. Default: ``1``.
        flip (bool, optional): Flip the kernel (a true convolution rather than a
            cross-correlation). Default: ``False``.

    Returns:
        array: The convolved array, ``(N, ..., C_out)``.
    """
    op = "conv_general"
    lo, hi = _padding(padding, op)
    return _checked(op, input, weight, _per_axis(stride, None, "stride", op), lo, hi,
                    _per_axis(kernel_dilation, None, "kernel_dilation", op),
                    _per_axis(input_dilation, None, "input_dilation", op), groups, bool(flip),
                    stream)


def _conv_nd(nd: int):
    def conv(input, weight, /, stride=1, padding=0, dilation=1, groups: int = 1, *,
             stream=None) -> array:
        op = f"conv{nd}d"
        pad = _per_axis(padding, nd, "padding", op)
        return _checked(op, input, weight, _per_axis(stride, nd, "stride", op), pad, pad,
                        _per_axis(dilation, nd, "dilation", op), [1], groups, False, stream)
    conv.__name__ = conv.__qualname__ = f"conv{nd}d"
    layout = ("L", "H, W", "D, H, W")[nd - 1]
    kernel = ("K", "KH, KW", "KD, KH, KW")[nd - 1]
    conv.__doc__ = f"""{nd}D convolution over an input with several channels.

    Args:
        input (array): Input of shape ``(N, {layout}, C_in)``.
        weight (array): Weight of shape ``(C_out, {kernel}, C_in / groups)``.
        stride (int or tuple(int), optional): Kernel strides, one for every spatial
            axis or one per axis. Default: ``1``.
        padding (int or tuple(int), optional): Symmetric input padding. Default: ``0``.
        dilation (int or tuple(int), optional): Kernel dilation. Default: ``1``.
        groups (int, optional): Input feature groups. Default: ``1``.

    Returns:
        array: The convolved array, ``(N, ..., C_out)``.
    """
    return conv


conv1d, conv2d, conv3d = _conv_nd(1), _conv_nd(2), _conv_nd(3)


def _conv_transpose_nd(nd: int):
    def conv_transpose(input, weight, /, stride=1, padding=0, dilation=1, output_padding=0,
                       groups: int = 1, *, stream=None) -> array:
        op = f"conv_transpose{nd}d"
        x, w = as_array(input), as_array(weight)
        args = [_per_axis(v, nd, name, op) for v, name in
                ((stride, "stride"), (padding, "padding"), (dilation, "dilation"),
                 (output_padding, "output_padding"))]
        stride, pad, dil, opad = (_spread(v, nd, 0, name, op, x, w) for v, name in
                                  zip(args, ("stride", "padding", "dilation", "output_padding")))
        if w.ndim == nd + 2 and x.ndim == nd + 2:
            kernel = [(w._shape[i + 1] - 1) * dil[i] + 1 for i in range(nd)]
            lo = [k - 1 - p for k, p in zip(kernel, pad)]
            hi = [l + q for l, q in zip(lo, opad)]
        else:  # _checked names the rank at fault
            lo = hi = list(pad)
        return _checked(op, x, w, [1], lo, hi, list(dil), list(stride), groups, True, stream)
    conv_transpose.__name__ = conv_transpose.__qualname__ = f"conv_transpose{nd}d"
    conv_transpose.__doc__ = f"""{nd}D transposed convolution over an input with several channels.

    The gradient of ``conv{nd}d`` with respect to its input: the input is dilated by
    ``stride`` and convolved with the flipped kernel; ``padding`` crops the result
    and ``output_padding`` extends its high end.

    Args:
        input (array): Input of shape ``(N, ..., C_in)``.
        weight (array): Weight of shape ``(C_out, ..., C_in / groups)``.
        stride (int or tuple(int), optional): Kernel strides. Default: ``1``.
        padding (int or tuple(int), optional): Input padding. Default: ``0``.
        dilation (int or tuple(int), optional): Kernel dilation. Default: ``1``.
        output_padding (int or tuple(int), optional): Output padding. Default: ``0``.
        groups (int, optional): Input feature groups. Default: ``1``.

    Returns:
        array: The convolved array.
    """
    return conv_transpose


conv_transpose1d, conv_transpose2d, conv_transpose3d = (_conv_transpose_nd(1), _conv_transpose_nd(2),
                                                        _conv_transpose_nd(3))

#: ``convolve``'s modes: the padding (low, high) for a kernel of length k.
_MODES = {"full": lambda k: (k - 1, k - 1), "valid": lambda k: (0, 0),
          "same": lambda k: (k // 2, k // 2) if k % 2 else (k // 2, max(0, k // 2 - 1))}


def convolve(a, v, /, mode: str = "full", *, stream=None) -> array:
    """The discrete convolution of 1D arrays.

    If ``v`` is longer than ``a`` they are swapped. The kernel is flipped following
    the signal processing convention (``numpy.convolve``).

    Args:
        a (array): 1D input array.
        v (array): 1D input array.
        mode (str, optional): ``"full"``, ``"valid"`` or ``"same"``. Default: ``"full"``.

    Returns:
        array: The convolved array.
    """
    a, v = as_array(a), as_array(v)
    if a.ndim != 1 or v.ndim != 1:
        raise ShapeError(f"[convolve] Inputs must be 1D, got shapes {a._shape} and {v._shape}.")
    if a.size == 0 or v.size == 0:
        raise ShapeError(f"[convolve] Inputs cannot be empty, got shapes {a._shape} and {v._shape}.")
    if mode not in _MODES:
        raise ArgumentError(f"[convolve] Invalid mode {mode!r}: expected one of {', '.join(_MODES)}.")
    if a.size < v.size:
        a, v = v, a
    s = to_stream(stream)
    lo, hi = _MODES[mode](v.size)
    out = _checked("convolve", mx.reshape(a, (1, -1, 1), stream=s), mx.reshape(v, (1, -1, 1), stream=s),
                   [1], [lo], [hi], [1], [1], 1, True, s)
    return mx.reshape(out, (-1,), stream=s)


OPS = {"conv1d": conv1d, "conv2d": conv2d, "conv3d": conv3d, "conv_general": conv_general,
       "conv_transpose1d": conv_transpose1d, "conv_transpose2d": conv_transpose2d,
       "conv_transpose3d": conv_transpose3d, "convolve": convolve}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


@hookimpl
def lazyx_examples():
    c = Convolution
    return [
        (c, example(lambda x, w: conv1d(x, w, stride=2, padding=1, dilation=2),
                    uniform((2, 7, 3)), uniform((4, 2, 3)))),
        (c, example(lambda x, w: conv1d(x, w, groups=2), uniform((1, 5, 4)), uniform((6, 3, 2)))),
        (c, example(lambda x, w: conv2d(x, w, stride=(2, 1), padding=(1, 0)),
                    uniform((2, 5, 4, 2)), uniform((3, 3, 2, 2)))),
        # Asymmetric (and negative) padding, both dilations, flip, groups.
        (c, example(lambda x, w: conv_general(x, w, stride=[1, 2], padding=([2, -1], [0, 1]),
                                              kernel_dilation=[1, 2], input_dilation=[2, 1],
                                              groups=2, flip=True),
                    uniform((1, 4, 6, 4)), uniform((2, 2, 2, 2)))),
        (c, example(lambda x, w: conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
                    uniform((1, 3, 3, 2)), uniform((3, 3, 3, 2)))),
        (c, example(lambda x, w: conv3d(x, w, padding=1), uniform((1, 3, 3, 2, 2)),
                    uniform((2, 2, 2, 2, 2)))),
        (c, example(lambda a, v: convolve(a, v, mode="same"), uniform((6,)), uniform((4,)))),
    ]
