"""Loss functions (``mlx.nn.losses``).

The flow of every loss: check the argument shapes MLX checks (a mismatch is a
:class:`~lazyx.errors.ShapeError`, a ``ValueError``, naming the loss and both
shapes), compute the per-element (or per-row) loss with ``lazyx.core`` ops in the
same formula as MLX, so that numbers and result dtypes match, then apply the
``reduction``: ``"none"`` returns the loss as is, ``"mean"`` and ``"sum"`` reduce
over every element. The default reduction of each loss is MLX's (``"mean"`` for
``binary_cross_entropy``, ``l1_loss``, ``mse_loss``, ``smooth_l1_loss`` and
``gaussian_nll_loss``; ``"none"`` for the others).

Everything here is differentiable: the losses are plain compositions of ops.
"""

from __future__ import annotations

import math
from typing import Literal

import lazyx.core as mx
from lazyx.errors import ArgumentError, AxisError, ShapeError

__all__ = [
    "binary_cross_entropy", "cosine_similarity_loss", "cross_entropy", "gaussian_nll_loss",
    "hinge_loss", "huber_loss", "kl_div_loss", "l1_loss", "log_cosh_loss",
    "margin_ranking_loss", "mse_loss", "nll_loss", "smooth_l1_loss", "triplet_loss",
]

Reduction = Literal["none", "mean", "sum"]

# reduction argument -> what it does to the per-element loss.
_REDUCTIONS = {"none": lambda loss: loss, "mean": mx.mean, "sum": mx.sum}


def _reduce(loss, reduction: str, op: str):
    try:
        fn = _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ArgumentError(f"[{op}] Invalid reduction {reduction!r}. Must be one of "
                            f"{tuple(_REDUCTIONS)}.") from None
    return fn(loss)


def _same_shape(op: str, a, a_name: str, b, b_name: str) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"[{op}] {a_name} shape {tuple(a.shape)} does not match {b_name} "
                         f"shape {tuple(b.shape)}; pass arrays of the same shape.")


def _weighted(op: str, loss, weights):
    if weights is None:
        return loss
    if weights.shape != loss.shape:
        raise ShapeError(f"[{op}] Weights with shape {tuple(weights.shape)} is not the same as "
                         f"output loss with shape {tuple(loss.shape)}.")
    return loss * weights


def _normalize_axis(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise AxisError(f"[{op}] axis {axis} is out of range for logits with {ndim} dimensions.")
    return axis % ndim


def cross_entropy(logits, targets, weights=None, axis: int = -1, label_smoothing: float = 0.0,
                  reduction: Reduction = "none"):
    r"""The cross entropy between ``softmax(logits)`` and the targets.

    .. math::
        \ell = \log \sum_j e^{z_j} - (1 - s)\, z_y - s\, \overline{z}

    with :math:`z` the logits along ``axis``, :math:`z_y` the target's logit (or
    :math:`\sum_j t_j z_j` for probability targets), :math:`s` the label smoothing and
    :math:`\overline{z}` the mean logit.

    Args:
        logits (array): The unnormalized logits.
        targets (array): Class indices (the logits' shape without ``axis``) or
            probabilities (the logits' shape).
        weights (array, optional): Per-element weights, the shape of the loss.
        axis (int): The class axis. Default: ``-1``.
        label_smoothing (float): In ``[0, 1)``. Default: ``0``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.

    Returns:
        array: The loss.

    Example:
        >>> cross_entropy(mx.array([[2.0, -1.0], [-1.0, 2.0]]), mx.array([0, 1]))
        array([0.0485873, 0.0485873], dtype=float32)
    """
    if label_smoothing < 0 or label_smoothing >= 1:
        raise ArgumentError(f"[cross_entropy] Label smoothing must be in [0, 1), got "
                            f"{label_smoothing}.")
    probabilities = targets.ndim == logits.ndim
    ax = _normalize_axis("cross_entropy", axis, logits.ndim)
    expected = logits.shape if probabilities else logits.shape[:ax] + logits.shape[ax + 1:]
    if targets.shape != expected:
        raise ShapeError(f"[cross_entropy] Targets shape {tuple(targets.shape)} does not match "
                         f"logits shape {tuple(logits.shape)}: class indices need shape "
                         f"{tuple(logits.shape[:ax] + logits.shape[ax + 1:])}, probabilities "
                         f"shape {tuple(logits.shape)}.")

    if probabilities:
        score = mx.sum(logits * targets, axis=axis)
    else:
        score = mx.take_along_axis(logits, mx.expand_dims(targets, axis), axis).squeeze(axis)
    logsumexp = mx.logsumexp(logits, axis=axis)
    if label_smoothing > 0:
        # The smoothed target puts (1 - s) on the label and s spread evenly on all classes.
        loss = (logsumexp - (1 - label_smoothing) * score
                - label_smoothing * logits.mean(axis=axis))
    else:
        loss = logsumexp - score
    return _reduce(_weighted("cross_entropy", loss, weights), reduction, "cross_entropy")


def binary_cross_entropy(inputs, targets, weights=None, with_logits: bool = True,
                         reduction: Reduction = "mean"):
    r"""The binary cross entropy :math:`-(t \log p + (1 - t) \log(1 - p))`.

    With ``with_logits`` (the default) the inputs are logits and :math:`\log p` is
    computed stably as :math:`-\mathrm{softplus}(-x)`; otherwise they are
    probabilities and both logarithms are clipped below at ``-100``.

    Args:
        inputs (array): Logits, or probabilities when ``with_logits=False``.
        targets (array): Binary targets, the shape of ``inputs``.
        weights (array, optional): Per-element weights, the shape of the loss.
        with_logits (bool): Whether ``inputs`` are logits. Default: ``True``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"mean"``.

    Returns:
        array: The loss.
    """
    _same_shape("binary_cross_entropy", inputs, "Inputs", targets, "targets")
    if with_logits:
        loss = mx.logaddexp(0.0, inputs) - inputs * targets
    else:
        log_p = mx.maximum(mx.log(inputs), -100)
        log_not_p = mx.maximum(mx.log(1 - inputs), -100)
        loss = -(targets * log_p + (1 - targets) * log_not_p)
    return _reduce(_weighted("binary_cross_entropy", loss, weights), reduction,
                   "binary_cross_entropy")


def l1_loss(predictions, targets, reduction: Reduction = "mean"):
    r"""The L1 loss :math:`|p - t|`.

    Args:
        predictions (array): The predicted values.
        targets (array): The targets, the shape of ``predictions``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"mean"``.
    """
    _same_shape("l1_loss", predictions, "Predictions", targets, "targets")
    return _reduce(mx.abs(predictions - targets), reduction, "l1_loss")


def mse_loss(predictions, targets, reduction: Reduction = "mean"):
    r"""The squared error :math:`(p - t)^2`.

    Args:
        predictions (array): The predicted values.
        targets (array): The targets, the shape of ``predictions``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"mean"``.
    """
    _same_shape("mse_loss", predictions, "Predictions", targets, "targets")
    return _reduce(mx.square(predictions - targets), reduction, "mse_loss")


def nll_loss(inputs, targets, axis: int = -1, reduction: Reduction = "none"):
    r"""The negative log likelihood :math:`-\log p_y` of the target classes.

    Args:
        inputs (array): Log probabilities along ``axis``.
        targets (array): Class indices, the shape of ``inputs`` without ``axis``.
        axis (int): The class axis. Default: ``-1``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    loss = -mx.take_along_axis(inputs, mx.expand_dims(targets, axis), axis).squeeze(axis)
    return _reduce(loss, reduction, "nll_loss")


def gaussian_nll_loss(inputs, targets, vars, full: bool = False, eps: float = 1e-6,
                      reduction: Reduction = "mean"):
    r"""The negative log likelihood of the targets under :math:`N(\text{inputs}, \text{vars})`.

    .. math::
        \ell = \tfrac12 \left(\log v + \frac{(\text{inputs} - \text{targets})^2}{v}\right)
        \;(+\, \tfrac12 \log 2\pi \text{ with } \texttt{full}),
        \qquad v = \max(\text{vars}, \epsilon)

    Args:
        inputs (array): The predicted means.
        targets (array): The samples, the shape of ``inputs``.
        vars (array): The predicted variances, the shape of ``inputs``.
        full (bool): Whether to add the constant :math:`\tfrac12 \log 2\pi`. Default: ``False``.
        eps (float): The lower bound of the variance. Default: ``1e-6``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"mean"``.
    """
    _same_shape("gaussian_nll_loss", inputs, "Inputs", targets, "targets")
    _same_shape("gaussian_nll_loss", inputs, "Inputs", vars, "vars")
    vars = mx.maximum(vars, eps)
    loss = 0.5 * (mx.log(vars) + mx.square(targets - inputs) / vars)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction, "gaussian_nll_loss")


def kl_div_loss(inputs, targets, axis: int = -1, reduction: Reduction = "none"):
    r"""The Kullback-Leibler divergence :math:`\sum e^{t} (t - x)` along ``axis``, with
    ``inputs`` :math:`x` and ``targets`` :math:`t` both log probabilities.

    Args:
        inputs (array): Log probabilities of the predicted distribution.
        targets (array): Log probabilities of the target distribution.
        axis (int): The distribution axis. Default: ``-1``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    loss = mx.sum(mx.exp(targets) * (targets - inputs), axis)
    return _reduce(loss, reduction, "kl_div_loss")


def smooth_l1_loss(predictions, targets, beta: float = 1.0, reduction: Reduction = "mean"):
    r"""The smooth L1 loss: :math:`0.5 d^2 / \beta` where :math:`d = |p - t| < \beta`,
    else :math:`d - 0.5 \beta`.

    Args:
        predictions (array): The predicted values.
        targets (array): The targets, the shape of ``predictions``.
        beta (float): Where the loss turns from quadratic to linear. Default: ``1.0``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"mean"``.
    """
    _same_shape("smooth_l1_loss", predictions, "Predictions", targets, "targets")
    diff = mx.abs(predictions - targets)
    loss = mx.where(diff < beta, 0.5 * mx.square(diff) / beta, diff - 0.5 * beta)
    return _reduce(loss, reduction, "smooth_l1_loss")


def triplet_loss(anchors, positives, negatives, axis: int = -1, p: int = 2, margin: float = 1.0,
                 eps: float = 1e-6, reduction: Reduction = "none"):
    r"""The triplet loss :math:`\max(\|a - p\|_p - \|a - n\|_p + \text{margin}, 0)`, each
    norm taken along ``axis`` as :math:`(\sum |\cdot|^p + \epsilon)^{1/p}`.

    Args:
        anchors (array): The anchor samples.
        positives (array): The positive samples.
        negatives (array): The negative samples.
        axis (int): The feature axis. Default: ``-1``.
        p (int): The norm degree. Default: ``2``.
        margin (float): The margin. Default: ``1.0``.
        eps (float): Added inside the norm, which keeps its gradient finite. Default: ``1e-6``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.

    Returns:
        array: The loss, the inputs' shape without ``axis`` when ``reduction="none"``.
    """

    def distance(a, b):
        return mx.power(mx.power(mx.abs(a - b), p).sum(axis) + eps, 1.0 / p)

    loss = mx.maximum(distance(anchors, positives) - distance(anchors, negatives) + margin, 0)
    return _reduce(loss, reduction, "triplet_loss")


def hinge_loss(inputs, targets, reduction: Reduction = "none"):
    r"""The hinge loss :math:`\max(0, 1 - t\,x)` for targets :math:`t \in \{-1, 1\}`.

    Args:
        inputs (array): The predicted values.
        targets (array): The targets, -1 or 1.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    return _reduce(mx.maximum(1 - inputs * targets, 0), reduction, "hinge_loss")


def huber_loss(inputs, targets, delta: float = 1.0, reduction: Reduction = "none"):
    r"""The Huber loss: :math:`\tfrac12 a^2` for :math:`|a| \le \delta`, else
    :math:`\delta (|a| - \tfrac12 \delta)`, with :math:`a = x - t`.

    Args:
        inputs (array): The predicted values.
        targets (array): The targets.
        delta (float): Where the loss turns from quadratic to linear. Default: ``1.0``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    abs_errors = mx.abs(inputs - targets)
    quadratic = mx.minimum(abs_errors, delta)
    linear = abs_errors - quadratic
    return _reduce(0.5 * quadratic**2 + delta * linear, reduction, "huber_loss")


def log_cosh_loss(inputs, targets, reduction: Reduction = "none"):
    r"""The log-cosh loss :math:`\log\cosh(x - t)`, computed as
    :math:`\mathrm{logaddexp}(a, -a) - \log 2` so that large errors do not overflow.

    Args:
        inputs (array): The predicted values.
        targets (array): The targets.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    errors = inputs - targets
    return _reduce(mx.logaddexp(errors, -errors) - math.log(2), reduction, "log_cosh_loss")


def cosine_similarity_loss(x1, x2, axis: int = 1, eps: float = 1e-8,
                           reduction: Reduction = "none"):
    r"""The cosine similarity :math:`x_1 \cdot x_2 / \max(\|x_1\| \|x_2\|, \epsilon)`
    along ``axis``.

    Args:
        x1 (array): The first inputs.
        x2 (array): The second inputs.
        axis (int): The embedding axis. Default: ``1``.
        eps (float): The lower bound of the denominator. Default: ``1e-8``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    x1_norm = mx.linalg.norm(x1, axis=axis)
    x2_norm = mx.linalg.norm(x2, axis=axis)
    loss = mx.sum(x1 * x2, axis=axis) / mx.maximum(x1_norm * x2_norm, eps)
    return _reduce(loss, reduction, "cosine_similarity_loss")


def margin_ranking_loss(inputs1, inputs2, targets, margin: float = 0.0,
                        reduction: Reduction = "none"):
    r"""The margin ranking loss :math:`\max(0, -y (x_1 - x_2) + \text{margin})`, with
    labels :math:`y \in \{-1, 1\}` saying whether :math:`x_1` should rank higher.

    Args:
        inputs1 (array): Scores of the first inputs.
        inputs2 (array): Scores of the second inputs, the same shape.
        targets (array): Labels, -1 or 1, the same shape.
        margin (float): The margin. Default: ``0.0``.
        reduction (str): ``"none"``, ``"mean"`` or ``"sum"``. Default: ``"none"``.
    """
    if not (inputs1.shape == inputs2.shape == targets.shape):
        raise ShapeError(f"[margin_ranking_loss] The shapes of the arguments do not match. The "
                         f"provided shapes are inputs1.shape={tuple(inputs1.shape)}, "
                         f"inputs2.shape={tuple(inputs2.shape)}, and "
                         f"targets.shape={tuple(targets.shape)}.")
    loss = mx.maximum(-targets * (inputs1 - inputs2) + margin, 0)
    return _reduce(loss, reduction, "margin_ranking_loss")
