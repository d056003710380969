"""Activations, in function form (``nn.relu``) and layer form (``nn.ReLU()``), as ``mlx.nn``.

The flow: each function writes its formula with ``lazyx.core`` ops, the same
formula MLX uses (so the numbers, the result dtypes and the dtype promotion of
integer and boolean inputs match); the element-wise ones go through
``mx.compile(shapeless=True)``, so a call is one replayed node whose element-wise
run fuses into one kernel, traced once per dtype and number of dimensions. Python
scalars (``alpha``, ``threshold``) are constants of the trace: each value traces once.

Each layer is a parameterless :class:`~lazyx.nn.layers.base.Module` whose
``__call__`` is its function; ``PReLU`` has one parameter, ``weight``, shaped
``(num_parameters,)`` as MLX's.
"""

from __future__ import annotations

import inspect
import math
from functools import partial

import lazyx.core as mx
from lazyx.errors import ArgumentError

from .base import Module

__all__ = [
    # function form
    "celu", "elu", "gelu", "gelu_approx", "gelu_fast_approx", "glu", "hard_shrink", "hard_tanh",
    "hardswish", "leaky_relu", "log_sigmoid", "log_softmax", "mish", "prelu", "relu", "relu2",
    "relu6", "selu", "sigmoid", "silu", "softmax", "softmin", "softplus", "softshrink",
    "softsign", "step", "tanh",
    # layer form
    "CELU", "ELU", "GELU", "GLU", "HardShrink", "HardTanh", "Hardswish", "LeakyReLU",
    "LogSigmoid", "LogSoftmax", "Mish", "PReLU", "ReLU", "ReLU2", "ReLU6", "SELU", "SiLU",
    "Sigmoid", "Softmax", "Softmin", "Softplus", "Softshrink", "Softsign", "Step", "Tanh",
]

# One trace per dtype and rank; the fused kernel is reused for every shape.
_compiled = partial(mx.compile, shapeless=True)

# SELU's constants (Klambauer et al. 2017), rounded as MLX rounds them.
_SELU_ALPHA = 1.67326
_SELU_SCALE = 1.0507


# ----------------------------------------------------------------------------------------
# Function form
# ----------------------------------------------------------------------------------------

@_compiled
def sigmoid(x):
    r"""The logistic sigmoid :math:`\sigma(x) = 1 / (1 + e^{-x})`, element-wise."""
    return mx.sigmoid(x)


@_compiled
def relu(x):
    r"""The rectified linear unit :math:`\max(x, 0)`, element-wise."""
    return mx.maximum(x, 0)


@_compiled
def relu2(x):
    r"""The squared rectified linear unit :math:`\max(x, 0)^2`, element-wise."""
    return mx.square(mx.maximum(x, 0))


@_compiled
def relu6(x):
    r"""The rectified linear unit clipped at 6: :math:`\min(\max(x, 0), 6)`."""
    return mx.minimum(mx.maximum(x, 0), 6.0)


@_compiled
def leaky_relu(x, negative_slope=0.01):
    r"""The leaky rectified linear unit :math:`\max(\text{negative\_slope} \cdot x, x)`."""
    return mx.maximum(negative_slope * x, x)


@_compiled
def prelu(x, alpha):
    r"""The parametric ReLU :math:`\max(0, x) + \alpha \min(0, x)`, with ``alpha`` an
    array broadcast against ``x``."""
    return mx.maximum(0, x) + alpha * mx.minimum(0, x)


@_compiled
def elu(x, alpha=1.0):
    r"""The exponential linear unit: :math:`x` where :math:`x > 0`, else
    :math:`\alpha (e^x - 1)`."""
    return mx.where(x > 0, x, alpha * (mx.exp(x) - 1))


@_compiled
def selu(x):
    r"""The scaled exponential linear unit :math:`\lambda\,\mathrm{elu}(x, \alpha)` with
    :math:`\lambda = 1.0507` and :math:`\alpha = 1.67326`."""
    return elu(x, _SELU_ALPHA) * _SELU_SCALE


@_compiled
def celu(x, alpha=1.0):
    r"""The continuously differentiable ELU
    :math:`\max(0, x) + \min(0, \alpha (e^{x / \alpha} - 1))`."""
    return mx.maximum(x, 0.0) + alpha * (mx.exp(mx.minimum(x, 0.0) / alpha) - 1)


@_compiled
def gelu(x):
    r"""The Gaussian error linear unit :math:`x \Phi(x)`, with :math:`\Phi` the standard
    normal CDF (computed exactly through ``erf``). See :func:`gelu_approx` and
    :func:`gelu_fast_approx` for cheaper approximations."""
    return x * (1 + mx.erf(x / math.sqrt(2))) / 2


@_compiled
def gelu_approx(x):
    r"""The tanh approximation of :func:`gelu` (absolute error below 5e-4 on [-6, 6]):
    :math:`0.5 x (1 + \tanh(\sqrt{2/\pi} (x + 0.044715 x^3)))`."""
    return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@_compiled
def gelu_fast_approx(x):
    r"""The sigmoid approximation of :func:`gelu` (absolute error below 0.015 on [-6, 6]):
    :math:`x \sigma(1.702 x)`."""
    return x * mx.sigmoid(1.702 * x)


@_compiled
def silu(x):
    r"""The sigmoid linear unit (swish) :math:`x \sigma(x)`."""
    return x * mx.sigmoid(x)


@_compiled
def softplus(x):
    r"""The softplus :math:`\log(1 + e^x)`, computed as ``logaddexp(x, 0)`` (no overflow)."""
    return mx.logaddexp(x, 0)


@_compiled
def log_sigmoid(x):
    r"""The log of the sigmoid :math:`\log \sigma(x) = -\log(1 + e^{-x})`."""
    return -softplus(-x)


@_compiled
def mish(x):
    r"""Mish (Misra 2019): :math:`x \tanh(\mathrm{softplus}(x))`."""
    return x * mx.tanh(softplus(x))


@_compiled
def softsign(x):
    r"""The softsign :math:`x / (1 + |x|)`."""
    return mx.divide(x, 1 + mx.abs(x))


@_compiled
def softshrink(x, lambd: float = 0.5):
    r"""Soft shrinkage: :math:`x - \lambda` above :math:`\lambda`, :math:`x + \lambda`
    below :math:`-\lambda`, 0 between."""
    return mx.where(mx.abs(x) > lambd, x - mx.sign(x) * lambd, 0)


@_compiled
def hard_shrink(x, lambd=0.5):
    r"""Hard shrinkage: :math:`x` where :math:`|x| > \lambda`, else 0."""
    return mx.where(mx.abs(x) > lambd, x, 0)


@_compiled
def hard_tanh(x, min_val=-1.0, max_val=1.0):
    r"""The hard tanh :math:`\max(\min(x, \text{max\_val}), \text{min\_val})`."""
    return mx.minimum(mx.maximum(x, min_val), max_val)


@_compiled
def hardswish(x):
    r"""The hard swish :math:`x \min(\max(x + 3, 0), 6) / 6`."""
    return x * mx.minimum(mx.maximum(x + 3, 0), 6) / 6


@_compiled
def step(x, threshold: float = 0.0):
    r"""The binary step: 1 (``int32``) where :math:`x \ge \text{threshold}`, else 0."""
    return mx.where(x >= threshold, 1, 0)


@_compiled
def softmax(x, axis=-1):
    r"""The softmax :math:`e^{x_i} / \sum_j e^{x_j}` along ``axis``."""
    return mx.softmax(x, axis=axis)


@_compiled
def softmin(x, axis=-1):
    r"""The softmin :math:`e^{-x_i} / \sum_j e^{-x_j}` along ``axis``."""
    return mx.softmax(-x, axis=axis)


@_compiled
def log_softmax(x, axis=-1):
    r"""The log of the softmax, :math:`x_i - \log \sum_j e^{x_j}`, along ``axis``."""
    return x - mx.logsumexp(x, axis=axis, keepdims=True)


def tanh(x):
    r"""The hyperbolic tangent, ``mx.tanh(x)``."""
    return mx.tanh(x)


def glu(x, axis: int = -1):
    r"""The gated linear unit: split ``axis`` into halves :math:`a, b` and return
    :math:`a \sigma(b)`. The axis must have an even size.

    Args:
        x (array): The input.
        axis (int): The axis to split. Default: ``-1``.
    """
    a, b = mx.split(x, indices_or_sections=2, axis=axis)
    return a * mx.sigmoid(b)


# ----------------------------------------------------------------------------------------
# Layer form
# ----------------------------------------------------------------------------------------

def _layer(fn, name: str, doc: str, option: tuple | None = None) -> type:
    """A layer class whose call is ``fn(x)``, or ``fn(x, option)`` for a layer with one
    scalar option. ``option`` is ``(argument, attribute, default)``: the constructor's
    argument name, the attribute it is stored in (MLX's), and its default."""
    if option is None:
        def __call__(self, x):
            return fn(x)

        return type(name, (Module,), {"__call__": __call__, "__doc__": doc,
                                      "__module__": __name__})

    argument, attribute, default = option
    signature = inspect.Signature([
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(argument, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)])

    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        setattr(self, attribute, bound.arguments[argument])

    def __call__(self, x):
        return fn(x, getattr(self, attribute))

    __init__.__signature__ = signature
    return type(name, (Module,), {"__init__": __init__, "__call__": __call__, "__doc__": doc,
                                  "__module__": __name__})


ReLU = _layer(relu, "ReLU", "The rectified linear unit as a layer; see :func:`relu`.")
ReLU2 = _layer(relu2, "ReLU2", "The squared ReLU as a layer; see :func:`relu2`.")
ReLU6 = _layer(relu6, "ReLU6", "The ReLU clipped at 6 as a layer; see :func:`relu6`.")
SELU = _layer(selu, "SELU", "The scaled ELU as a layer; see :func:`selu`.")
SiLU = _layer(silu, "SiLU", "The sigmoid linear unit (swish) as a layer; see :func:`silu`.")
Mish = _layer(mish, "Mish", "Mish as a layer: :math:`x \\tanh(\\mathrm{softplus}(x))`.")
Sigmoid = _layer(sigmoid, "Sigmoid", "The logistic sigmoid as a layer; see :func:`sigmoid`.")
LogSigmoid = _layer(log_sigmoid, "LogSigmoid",
                    "The log-sigmoid as a layer; see :func:`log_sigmoid`.")
Tanh = _layer(tanh, "Tanh", "The hyperbolic tangent as a layer; see :func:`tanh`.")
HardTanh = _layer(hard_tanh, "HardTanh",
                  "The hard tanh (clipped to [-1, 1]) as a layer; see :func:`hard_tanh`.")
Hardswish = _layer(hardswish, "Hardswish", "The hard swish as a layer; see :func:`hardswish`.")
Softplus = _layer(softplus, "Softplus", "The softplus as a layer; see :func:`softplus`.")
Softsign = _layer(softsign, "Softsign", "The softsign as a layer; see :func:`softsign`.")
Softmax = _layer(softmax, "Softmax",
                 "The softmax over the last axis as a layer; see :func:`softmax`.")
Softmin = _layer(softmin, "Softmin",
                 "The softmin over the last axis as a layer; see :func:`softmin`.")
LogSoftmax = _layer(log_softmax, "LogSoftmax",
                    "The log-softmax over the last axis as a layer; see :func:`log_softmax`.")


LeakyReLU = _layer(leaky_relu, "LeakyReLU", r"""
    The leaky ReLU :math:`\max(\text{negative\_slope} \cdot x, x)` as a layer.

    Args:
        negative_slope (float): The slope for negative inputs. Default: ``0.01``.
    """, ("negative_slope", "_negative_slope", 1e-2))
ELU = _layer(elu, "ELU", r"""The exponential linear unit as a layer; see :func:`elu`.

    Args:
        alpha (float): The scale :math:`\alpha` of the negative part. Default: ``1.0``.
    """, ("alpha", "_alpha", 1.0))
CELU = _layer(celu, "CELU", r"""The continuously differentiable ELU
    :math:`\max(0, x) + \min(0, \alpha (e^{x / \alpha} - 1))` as a layer.

    Args:
        alpha (float): :math:`\alpha`. Default: ``1.0``.
    """, ("alpha", "_alpha", 1.0))
GLU = _layer(glu, "GLU", r"""
    The gated linear unit :math:`a \sigma(b)`, ``a`` and ``b`` the halves of ``axis``.

    Args:
        axis (int): The axis to split. Default: ``-1``.
    """, ("axis", "axis", -1))
HardShrink = _layer(hard_shrink, "HardShrink", r"""
    Hard shrinkage as a layer; see :func:`hard_shrink`.

    Args:
        lambd (float): The threshold :math:`\lambda`. Default: ``0.5``.
    """, ("lambd", "lambd", 0.5))
Softshrink = _layer(softshrink, "Softshrink", r"""
    Soft shrinkage as a layer; see :func:`softshrink`.

    Args:
        lambd (float): The threshold :math:`\lambda`. Default: ``0.5``.
    """, ("lambd", "lambd", 0.5))
Step = _layer(step, "Step", r"""
    The binary step as a layer: 1 where :math:`x \ge \text{threshold}`, else 0.

    Args:
        threshold (float): The threshold. Default: ``0.0``.
    """, ("threshold", "threshold", 0.0))


class PReLU(Module):
    r"""The parametric ReLU :math:`\max(0, x) + a \min(0, x)` with a learned slope ``a``.

    ``weight`` (shape ``(num_parameters,)``) broadcasts against the input's last axis.

    Args:
        num_parameters (int): The number of slopes to learn: 1, or the size of the
            input's last axis. Default: ``1``.
        init (float): The initial slope. Default: ``0.25``.
    """

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.weight = mx.full([num_parameters], init)

    def __call__(self, x):
        return prelu(x, self.weight)


# approx argument -> the function GELU applies ("tanh" is PyTorch's name for "precise").
_GELU_APPROX = {"none": gelu, "precise": gelu_approx, "tanh": gelu_approx,
                "fast": gelu_fast_approx}


class GELU(Module):
    r"""The Gaussian error linear unit :math:`x \Phi(x)` as a layer.

    With ``approx="precise"`` (or its PyTorch alias ``"tanh"``) it applies
    :func:`gelu_approx`, :math:`0.5 x (1 + \tanh(\sqrt{2/\pi}(x + 0.044715 x^3)))`;
    with ``approx="fast"``, :func:`gelu_fast_approx`, :math:`x \sigma(1.702 x)`.

    Args:
        approx (str): ``"none"``, ``"precise"``, ``"tanh"`` or ``"fast"``. Default: ``"none"``.
    """

    def __init__(self, approx="none"):
        super().__init__()
        if approx not in _GELU_APPROX:
            raise ArgumentError(f"[GELU] The approximation should be in {list(_GELU_APPROX)} "
                                f"but {approx!r} was given")
        self._approx = approx

    def __call__(self, x):
        return _GELU_APPROX[self._approx](x)

