"""Learning-rate schedules: functions of the optimizer's step (``mlx.optimizers``).

A schedule is a callable ``schedule(step) -> scalar``. Give one to an optimizer in
place of a number (``Adam(learning_rate=cosine_decay(1e-3, 1000))``): the optimizer
calls it with its step counter (a ``uint64`` scalar array) before every update and
keeps the value in its state, so the value is an array computed inside the graph and a
compiled training step follows the schedule without retracing. Each factory below
checks its arguments once and returns a closure of plain ``lazyx.core`` arithmetic.
"""

from __future__ import annotations

import math
from typing import Callable, List

import lazyx.core as mx

__all__ = ["exponential_decay", "step_decay", "cosine_decay", "linear_schedule",
           "join_schedules"]


def _positive(name: str, value) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be greater than 0, but got {value}.")


def exponential_decay(init: float, decay_rate: float) -> Callable:
    r"""Decay the value by ``decay_rate`` every step.

    .. math:: \text{value}(t) = \text{init} \cdot \text{decay\_rate}^{t}

    Args:
        init (float): The value at step 0.
        decay_rate (float): The factor applied per step.

    Example:
        >>> lr = exponential_decay(0.1, 0.9)
        >>> optimizer = SGD(learning_rate=lr)
    """
    def schedule(step):
        return init * decay_rate ** step

    return schedule


def step_decay(init: float, decay_rate: float, step_size: int) -> Callable:
    r"""Decay the value by ``decay_rate`` once every ``step_size`` steps.

    .. math:: \text{value}(t) = \text{init} \cdot \text{decay\_rate}^{\lfloor t / \text{step\_size} \rfloor}

    Args:
        init (float): The value at step 0.
        decay_rate (float): The factor applied every ``step_size`` steps.
        step_size (int): Steps between two decays (positive).
    """
    _positive("step_size", step_size)

    def schedule(step):
        return init * decay_rate ** (step // step_size)

    return schedule


def cosine_decay(init: float, decay_steps: int, end: float = 0.0) -> Callable:
    r"""Half a cosine from ``init`` down to ``end`` over ``decay_steps`` steps, then ``end``.

    .. math:: \text{value}(t) = \text{end} + \tfrac12\left(1 + \cos\left(\pi
              \tfrac{\min(t, T)}{T}\right)\right)(\text{init} - \text{end})

    Args:
        init (float): The value at step 0.
        decay_steps (int): ``T``, the steps to reach ``end`` (positive).
        end (float): The final value. Default: ``0.0``.
    """
    _positive("decay_steps", decay_steps)

    def schedule(step):
        t = mx.minimum(step, decay_steps)
        decay = 0.5 * (1.0 + mx.cos((math.pi / decay_steps) * t))
        return end + decay * (init - end)

    return schedule


def linear_schedule(init: float, end: float, steps: int) -> Callable:
    r"""A straight line from ``init`` to ``end`` over ``steps`` steps, then ``end``
    (a warm-up when ``init < end``).

    .. math:: \text{value}(t) = \text{init} + \min(t, S) \, \tfrac{\text{end} - \text{init}}{S}

    Args:
        init (float): The value at step 0.
        end (float): The value from step ``steps`` on.
        steps (int): ``S``, the length of the ramp (positive).
    """
    _positive("steps", steps)

    def schedule(step):
        return mx.minimum(step, steps) * ((end - init) / steps) + init

    return schedule


def join_schedules(schedules: List[Callable], boundaries: List[int]) -> Callable:
    """Run ``schedules`` one after the other, switching at the step ``boundaries``.

    Schedule ``i + 1`` takes over at step ``boundaries[i]`` and sees the steps counted
    from there (``step - boundaries[i]``).

    Args:
        schedules (list(callable)): The schedules, in order.
        boundaries (list(int)): ``len(schedules) - 1`` increasing steps.

    Example:
        >>> warmup = linear_schedule(0, 1e-3, steps=100)
        >>> decay = cosine_decay(1e-3, 1000)
        >>> lr = join_schedules([warmup, decay], [100])
    """
    if len(schedules) == 0:
        raise ValueError("Must provide at least 1 schedule to join.")
    if len(schedules) != len(boundaries) + 1:
        raise ValueError(f"Received {len(boundaries)} boundaries but expected "
                         f"{len(schedules) - 1}.")
    schedules, boundaries = list(schedules), list(boundaries)

    def schedule(step):
        value = schedules[0](step)
        for boundary, later in zip(boundaries, schedules[1:]):
            value = mx.where(step < boundary, value, later(step - boundary))
        return value

    return schedule
