"""``lazyx.core.fft``: discrete Fourier transforms, as ``mlx.core.fft``.

The flow of a transform (``fft`` ... ``irfftn``):

1. :func:`_transform` reads the arguments as MLX does: ``n``/``axis`` for the
   one-dimensional functions, ``s``/``axes`` for the others (``fft2``'s family
   defaults to the last two axes, ``fftn``'s to all of them, and ``axes=()`` returns
   the input unchanged), and checks them: a non-integer size or axis is a
   :class:`~lazyx.errors.DtypeError` (``TypeError``), an axis out of range or
   repeated an :class:`~lazyx.errors.AxisError` (``IndexError`` and ``ValueError``,
   the types MLX raises), a size below 1 or an unknown ``norm`` an
   :class:`~lazyx.errors.ArgumentError` (``ValueError``).
2. The input is cast to the dtype the transform reads (complex64; float32 for the
   forward real transforms, which drop an imaginary part as MLX does) and truncated
   or zero-padded along the transformed axes to the sizes asked for.
3. One :class:`FFT` node does the transform: MLX's primitive (``axes``,
   ``inverse``, ``real``) plus the normalisation ``norm`` (applied by the kernel,
   not by a second pass) and, for an inverse real transform, whether its output
   length is odd (its complex input's length ``n // 2 + 1`` leaves that open).
   Results are complex64, or float32 for ``irfft*``, whatever the input dtype.

Kernels: Intel MKL through ``mkl_fft`` on the CPU where ``lazyx[mkl]`` is installed,
else pocketfft through ``scipy.fft`` (multi-threaded over the transforms of a batch;
``lazyx.backends.cpu.kernels.fft``), cuFFT through
``cupy.fft`` on the GPU (``lazyx.backends.cuda.fft``).

Gradients follow MLX's convention for complex arrays (the vjp is the adjoint, the
conjugate transpose, of the linear map; ``lazyx.core.vjp`` of ``x * a`` is
``cotangent * conj(a)``): the vjp of a complex transform is the opposite transform
with the dual normalisation (``backward`` <-> ``forward``), that of ``rfftn`` an
``irfftn`` of the cotangent with its bins weighted by the inverse of the Hermitian
multiplicities, and that of ``irfftn`` an ``rfftn`` weighted by them. A transform
is linear, so its jvp is the transform of the tangent; batching shifts ``axes``.

``fftshift``/``ifftshift`` are rolls and ``fftfreq``/``rfftfreq`` are ``arange``
arithmetic, so they add no primitive.
"""

from __future__ import annotations

import operator
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, cast, normalize_axis
from lazyx.array import array, from_buffer, lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, AxisError, DtypeError, ShapeError
from lazyx.examples import example, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axes, Primitive

_c64, _f32 = dt.complex64, dt.float32

#: The normalisations, as NumPy and MLX name them: the factor ``1 / n`` goes on the
#: inverse transform (``backward``), on the forward one (``forward``), or ``1 / sqrt(n)``
#: on both (``ortho``).
NORMS = ("backward", "ortho", "forward")
#: The normalisation of a transform's adjoint: the adjoint of the forward DFT matrix is
#: ``n`` times the inverse one, so the factor moves to the other side.
_DUAL = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


class FFT(Primitive):
    """The discrete Fourier transform of input 0 over ``axes``: complex to complex,
    real to complex (``real``: the last of ``axes`` keeps its ``n // 2 + 1``
    non-negative frequencies), or complex to real (``real`` and ``inverse``: the last
    axis grows from ``m`` to ``2 * (m - 1) + odd``), scaled as ``norm`` says.
    The input is complex64, or float32 for the real-to-complex transform."""

    __slots__ = ("axes", "inverse", "real", "odd", "norm")
    axes: Axes
    inverse: bool
    real: bool
    odd: bool  # the inverse real transform's output length along axes[-1] is odd
    norm: Literal[NORMS]
    arity = 1

    def output_shapes(self, inputs):
        shape = list(inputs[0].shape)
        if self.real:
            k = self.axes[-1]
            shape[k] = 2 * (shape[k] - 1) + self.odd if self.inverse else shape[k] // 2 + 1
        return [tuple(shape)]

    def output_dtypes(self, inputs):
        return [_f32 if self.real and self.inverse else _c64]

    def _again(self, x, axes=None, inverse=None, real=None, odd=None, norm=None):
        """This transform, or a relative of it, applied to ``x`` on this node's stream."""
        return _node(x, self.axes if axes is None else axes,
                     self.inverse if inverse is None else inverse,
                     self.real if real is None else real,
                     self.odd if odd is None else odd,
                     self.norm if norm is None else norm, self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        cot, s, dual = cotangents[0], self.stream, _DUAL[self.norm]
        if not self.real:
            return [self._again(cot, inverse=not self.inverse, norm=dual)]
        last = self.axes[-1]
        if self.inverse:
            # irfftn counts each bin but the DC (and Nyquist) one twice: rfftn of the
            # cotangent, each bin times its multiplicity.
            spec = self._again(cot, inverse=False, odd=False, norm=dual)
            return [mx.multiply(spec, _multiplicities(spec._shape, last, self.odd, 2.0),
                                stream=s)]
        # rfftn keeps one bin of each conjugate pair: the adjoint is irfftn (which counts
        # them twice) of the cotangent with those bins halved.
        odd = primals[0]._shape[last] % 2 == 1
        weighted = mx.multiply(cot, _multiplicities(cot._shape, last, odd, 0.5), stream=s)
        return [self._again(weighted, inverse=True, odd=odd, norm=dual)]

    def jvp(self, primals, tangents, argnums):
        return [self._again(tangents[0])]

    def vmap(self, inputs, axes):
        b = axes[0]
        return [self._again(inputs[0], axes=tuple(a + 1 if a >= b else a for a in self.axes))], [b]


def _node(x: array, axes: tuple, inverse: bool, real: bool, odd: bool, norm: str,
          stream) -> array:
    """One :class:`FFT` node on ``x`` cast to the dtype the transform reads."""
    x = cast(x, _f32 if real and not inverse else _c64, stream)
    p = FFT(stream, axes, inverse, real, odd, norm)
    return lazy(p.output_shapes((x,))[0], p.output_dtypes(None)[0], p, (x,))


def _multiplicities(shape: tuple, axis: int, odd: bool, weight: float) -> array:
    """``weight`` for every bin along ``axis`` of a half spectrum but the DC bin and,
    for an even signal length, the Nyquist bin (1 for those), shaped to broadcast
    against an array of ``shape``."""
    m = shape[axis]
    w = np.full(m, weight, dtype=np.float32)
    w[:1] = 1.0
    if not odd and m > 1:
        w[-1] = 1.0
    return from_buffer(w.reshape((m,) + (1,) * (len(shape) - axis - 1)), _f32)


# -- argument checks ---------------------------------------------------------------
def _int(value, what: str, op: str) -> int:
    """``value`` as a Python int (an int, a NumPy integer, a bool as MLX takes it)."""
    if type(value) is int:
        return value
    if not isinstance(value, array) and hasattr(value, "__index__"):
        return operator.index(value)
    raise DtypeError(f"[{op}] {what} must be an integer, got {value!r} "
                     f"({type(value).__name__}).")


def _ints(values, what: str, op: str) -> tuple:
    if isinstance(values, (str, bytes, array)) or not hasattr(values, "__iter__"):
        raise DtypeError(f"[{op}] {what} must be a sequence of integers, got {values!r}.")
    return tuple(_int(v, f"{what} entry", op) for v in values)


def _check_norm(norm, op: str) -> str:
    if norm in NORMS:
        return norm
    if not isinstance(norm, str):
        raise DtypeError(f"[{op}] norm must be a string, one of {', '.join(NORMS)}; "
                         f"got {norm!r}.")
    raise ArgumentError(f"[{op}] Invalid norm {norm!r}: expected one of {', '.join(NORMS)}.")


def _axes(axes: tuple, shape: tuple, op: str) -> tuple:
    """``axes`` in ``[0, ndim)``, distinct."""
    nd = len(shape)
    out = tuple(normalize_axis(a, nd, f"[{op}] axes entry") for a in axes)
    if len(set(out)) != len(out):
        raise AxisError(f"[{op}] Duplicated axis in axes {axes} for an array of shape "
                        f"{shape}: transform each axis once.")
    return out


# -- the transforms ------------------------------------------------------------------
def _transform(a, s, axes, norm, stream, op: str, inverse: bool, real: bool,
               default_axes=None) -> array:
    """``a`` transformed over ``axes`` to the sizes ``s`` (see the module docstring)."""
    a = as_array(a)
    norm = _check_norm(norm, op)
    shape = a._shape
    if s is not None:
        s = _ints(s, "s", op)
    if axes is None:
        axes = default_axes
    if axes is None:
        if s is not None:
            raise ArgumentError(f"[{op}] axes must be given with s={s}: name the axes "
                                f"that s sizes (array of shape {shape}).")
        if not shape:
            raise ShapeError(f"[{op}] The input must have at least one dimension, got "
                             f"a 0-d array.")
        axes = tuple(range(len(shape)))
    else:
        axes = _ints(axes, "axes", op)
    if not axes:
        return a  # no axis to transform: MLX returns the input as it is
    axes = _axes(axes, shape, op)
    if s is None:
        s = tuple(shape[k] for k in axes)
        if real and inverse:
            s = s[:-1] + (2 * (s[-1] - 1),)
    elif len(s) != len(axes):
        raise ShapeError(f"[{op}] s={s} and axes={axes} must have the same length (array "
                         f"of shape {shape}).")
    return _sized(a, s, axes, norm, stream, op, inverse, real)


def _sized(a, s, axes, norm, stream, op, inverse, real) -> array:
    for k, n in zip(axes, s):
        if n < 1:
            what = f"n={n}" if len(s) == 1 and op in _ONE_AXIS_OPS else f"s={s}"
            raise ArgumentError(f"[{op}] Invalid FFT size {what} for axis {k} of an array of "
                                f"shape {a._shape}: every size must be at least 1.")
    # The sizes the input must have along axes: those of s, but an inverse real
    # transform reads n // 2 + 1 bins along its last axis.
    want = s[:-1] + (s[-1] // 2 + 1,) if real and inverse else s
    x = cast(a, _f32 if real and not inverse else _c64, stream)
    cut = [slice(None)] * len(x._shape)
    widths = [(0, 0)] * len(x._shape)
    cuts = pads = False
    for k, n in zip(axes, want):
        have = x._shape[k]
        if have > n:
            cut[k], cuts = slice(0, n), True
        elif have < n:
            widths[k], pads = (0, n - have), True
    if cuts:
        x = x[tuple(cut)]
    if pads:
        x = mx.pad(x, widths, stream=stream)
    return _node(x, axes, inverse, real, real and inverse and s[-1] % 2 == 1, norm,
                 to_stream(stream))


_ONE_AXIS_OPS = ("fft", "ifft", "rfft", "irfft")


def _one_axis(a, n, axis, norm, stream, op: str, inverse: bool, real: bool) -> array:
    a = as_array(a)
    norm = _check_norm(norm, op)
    axis = normalize_axis(_int(axis, "axis", op), len(a._shape), f"[{op}] axis")
    if n is None:
        m = a._shape[axis]
        n = 2 * (m - 1) if real and inverse else m
    else:
        n = _int(n, "n", op)
    return _sized(a, (n,), (axis,), norm, stream, op, inverse, real)


_ONE_AXIS_DOC = """{what}

    Args:
        a (array): The input array.{cast}
        n (int, optional): Size of the transformed axis. The corresponding axis in
          the input is truncated or padded with zeros to match {match}. The default
          value is {default}.
        axis (int, optional): Axis along which to perform the FFT. The default is
          ``-1``.
        norm (str, optional): One of ``"backward"``, ``"ortho"``, or ``"forward"``.
          Default is ``"backward"``.

    Returns:
        array: {returns}
    """

_MANY_AXES_DOC = """{what}

    Args:
        a (array): The input array.{cast}
        s (list(int), optional): Sizes of the transformed axes. The corresponding
          axes in the input are truncated or padded with zeros to match the sizes in
          ``s``{last}. The default value is the sizes of ``a`` along ``axes``{default}.
        axes (list(int), optional): Axes along which to perform the FFT. {axes}
        norm (str, optional): One of ``"backward"``, ``"ortho"``, or ``"forward"``.
          Default is ``"backward"``.

    Returns:
        array: {returns}
    """

_REAL_IN = ("\n          If the array is complex it will be silently cast to a real type.")
_LAST_REAL = (" except for the last axis, which has size ``s[-1] // 2 + 1``")
_AXES_2 = "The default is ``[-2, -1]``."
_AXES_N = ("The default is ``None``: all axes (``s`` must then be ``None`` too).")


def _documented(fn, template: str, **parts):
    fn.__doc__ = template.format(**parts)
    return fn


def fft(a, n=None, axis=-1, norm="backward", stream=None) -> array:
    return _one_axis(a, n, axis, norm, stream, "fft", False, False)


def ifft(a, n=None, axis=-1, norm="backward", stream=None) -> array:
    return _one_axis(a, n, axis, norm, stream, "ifft", True, False)


def rfft(a, n=None, axis=-1, norm="backward", stream=None) -> array:
    return _one_axis(a, n, axis, norm, stream, "rfft", False, True)


def irfft(a, n=None, axis=-1, norm="backward", stream=None) -> array:
    return _one_axis(a, n, axis, norm, stream, "irfft", True, True)


def fft2(a, s=None, axes=(-2, -1), norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "fft2", False, False)


def ifft2(a, s=None, axes=(-2, -1), norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "ifft2", True, False)


def rfft2(a, s=None, axes=(-2, -1), norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "rfft2", False, True)


def irfft2(a, s=None, axes=(-2, -1), norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "irfft2", True, True)


def fftn(a, s=None, axes=None, norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "fftn", False, False)


def ifftn(a, s=None, axes=None, norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "ifftn", True, False)


def rfftn(a, s=None, axes=None, norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "rfftn", False, True)


def irfftn(a, s=None, axes=None, norm="backward", stream=None) -> array:
    return _transform(a, s, axes, norm, stream, "irfftn", True, True)


for _fn, _what, _returns in (
        (fft, "One dimensional discrete Fourier Transform.",
         "The DFT of the input along the given axis (complex64)."),
        (ifft, "One dimensional inverse discrete Fourier Transform.",
         "The inverse DFT of the input along the given axis (complex64).")):
    _documented(_fn, _ONE_AXIS_DOC, what=_what, cast="", match="``n``",
                default="``a.shape[axis]``", returns=_returns)
_documented(rfft, _ONE_AXIS_DOC, what="One dimensional discrete Fourier Transform on a real "
            "input.\n\n    The output has the same shape as the input except along ``axis``, "
            "where it has size ``n // 2 + 1``.", cast=_REAL_IN, match="``n``",
            default="``a.shape[axis]``", returns="The DFT of the input along the given axis "
            "(complex64).")
_documented(irfft, _ONE_AXIS_DOC, what="The inverse of :func:`rfft`.\n\n    The output has "
            "the same shape as the input except along ``axis``, where it has size ``n``.",
            cast="", match="``n // 2 + 1``", default="``2 * (a.shape[axis] - 1)``",
            returns="The real array of the inverse of :func:`rfft` (float32).")
for _fn, _what, _axes_doc in (
        (fft2, "Two dimensional discrete Fourier Transform.", _AXES_2),
        (ifft2, "Two dimensional inverse discrete Fourier Transform.", _AXES_2),
        (fftn, "n-dimensional discrete Fourier Transform.", _AXES_N),
        (ifftn, "n-dimensional inverse discrete Fourier Transform.", _AXES_N)):
    _documented(_fn, _MANY_AXES_DOC, what=_what, cast="", last="", default="", axes=_axes_doc,
                returns="The (inverse) DFT of the input along the given axes (complex64).")
for _fn, _what, _axes_doc in (
        (rfft2, "Two dimensional real discrete Fourier Transform.", _AXES_2),
        (rfftn, "n-dimensional real discrete Fourier Transform.", _AXES_N)):
    _documented(_fn, _MANY_AXES_DOC, what=_what + "\n\n    The output has the same shape as "
                "the input except along ``axes``, where it has the sizes of ``s``; the last "
                "of ``axes`` is the real axis and has size ``s[-1] // 2 + 1``.",
                cast=_REAL_IN, last="", default="", axes=_axes_doc,
                returns="The real DFT of the input along the given axes (complex64).")
for _fn, _forward, _axes_doc in ((irfft2, "rfft2", _AXES_2), (irfftn, "rfftn", _AXES_N)):
    _documented(_fn, _MANY_AXES_DOC, what=f"The inverse of :func:`{_forward}`.\n\n    The "
                "last of ``axes`` is the real axis: the output has size ``s[-1]`` there.",
                cast="", last=_LAST_REAL,
                default=", with ``2 * (a.shape[axes[-1]] - 1)`` for the last one",
                axes=_axes_doc, returns="The real array of the inverse transform (float32).")


# -- shifts and frequencies ----------------------------------------------------------
def _shift(a, axes, stream, op: str, sign: int) -> array:
    a = as_array(a)
    nd = len(a._shape)
    if axes is None:
        axes = tuple(range(nd))
    elif isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    else:
        axes = _ints(axes, "axes", op)
    for k in axes:
        if not -nd <= k < nd:
            raise AxisError(f"[{op}] Invalid axis {k} for an array of shape {a._shape} "
                            f"({nd} dimensions).")
    if not axes:
        return a
    shifts = tuple(sign * (a._shape[k] // 2) for k in axes)
    return mx.roll(a, shifts, axes, stream=stream)


def fftshift(a, axes=None, stream=None) -> array:
    """Shift the zero-frequency component to the center of the spectrum.

    Args:
        a (array): The input array.
        axes (int or list(int), optional): Axis or axes over which to perform the
          shift. If ``None``, shift all axes.

    Returns:
        array: The shifted array with the same shape as the input.
    """
    return _shift(a, axes, stream, "fftshift", 1)


def ifftshift(a, axes=None, stream=None) -> array:
    """The inverse of :func:`fftshift`. While identical to :func:`fftshift` for
    even-length axes, the behavior differs for odd-length axes.

    Args:
        a (array): The input array.
        axes (int or list(int), optional): Axis or axes over which to perform the
          inverse shift. If ``None``, shift all axes.

    Returns:
        array: The inverse-shifted array with the same shape as the input.
    """
    return _shift(a, axes, stream, "ifftshift", -1)


def _frequencies(n, d, stream, op: str, real: bool) -> array:
    n = _int(n, "n", op)
    if isinstance(d, (str, bytes)) or d is None:
        raise DtypeError(f"[{op}] d must be a number, got {d!r}.")
    d = float(d)
    if n <= 0:
        raise ArgumentError(f"[{op}] n must be greater than 0, got {n}.")
    if d == 0:
        raise ArgumentError(f"[{op}] d must be non-zero.")
    # Sample k of n has frequency k / (n d); the second half of a full spectrum holds
    # the negative frequencies -(n // 2) ... -1.
    k = mx.arange(n // 2 + 1 if real else n, dtype=_f32, stream=stream)
    if not real and n > 1:
        k = mx.where(mx.less(k, (n + 1) // 2, stream=stream), k,
                     mx.subtract(k, float(n), stream=stream), stream=stream)
    return mx.divide(k, n * d, stream=stream)


def fftfreq(n, d=1.0, stream=None) -> array:
    """Return the discrete Fourier Transform sample frequencies.

    Args:
        n (int): Window length.
        d (float, optional): Sample spacing. The default is ``1.0``.

    Returns:
        array: The sample frequencies as a one-dimensional array of type ``float32``.

    Example:
        >>> mx.fft.fftfreq(4)
        array([0, 0.25, -0.5, -0.25], dtype=float32)
    """
    return _frequencies(n, d, stream, "fftfreq", False)


def rfftfreq(n, d=1.0, stream=None) -> array:
    """Return the discrete Fourier Transform sample frequencies for use with
    :func:`rfft` and :func:`irfft`.

    The returned array contains the non-negative frequency terms in the range
    ``[0, floor(n/2)]``.

    Args:
        n (int): Window length.
        d (float, optional): Sample spacing. The default is ``1.0``.

    Returns:
        array: The sample frequencies as a one-dimensional array of type ``float32``.
    """
    return _frequencies(n, d, stream, "rfftfreq", True)


PRIMITIVES = [FFT]

_FUNCTIONS = (fft, ifft, fft2, ifft2, fftn, ifftn, rfft, irfft, rfft2, irfft2, rfftn, irfftn,
              fftshift, ifftshift, fftfreq, rfftfreq)
OPS = {f"fft.{f.__name__}": f for f in _FUNCTIONS}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------------
def _parts(z: array) -> list:
    """A complex result as its real and imaginary parts (finite differences are real)."""
    return [mx.real(z), mx.imag(z)]


def _complex(x: array, y: array) -> array:
    return mx.add(x, mx.multiply(y, 1j))


@hookimpl
def lazyx_examples():
    return [
        (FFT, example(lambda x, y: _parts(fft(_complex(x, y))), uniform((2, 5)), uniform((2, 5)))),
        (FFT, example(lambda x, y: _parts(ifft2(_complex(x, y), axes=(0, 2), norm="ortho")),
                      uniform((3, 2, 4)), uniform((3, 2, 4)))),
        (FFT, example(lambda x: _parts(rfft(x, axis=0)), uniform((5, 2)))),
        (FFT, example(lambda x: _parts(rfftn(x, norm="forward")), uniform((3, 4)))),
        (FFT, example(lambda x, y: irfft(_complex(x, y), n=5), uniform((2, 3)), uniform((2, 3)))),
        (FFT, example(lambda x, y: irfft2(_complex(x, y), axes=(1, 0), norm="ortho"),
                      uniform((3, 2)), uniform((3, 2)))),
    ]
