"""``lazyx.optimizers``: the optimizers and learning-rate schedules of ``mlx.optimizers``.

``optimizers.py`` holds the :class:`Optimizer` base (state tree, schedules, the update
loop) and one short class per update rule, plus :func:`clip_grad_norm`;
``schedulers.py`` holds the schedules, plain functions of the step. A training step::

    import lazyx.core as mx
    import lazyx.nn as nn
    import lazyx.optimizers as optim

    optimizer = optim.Adam(learning_rate=optim.cosine_decay(1e-3, 1000))
    loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
    optimizer.update(model, grads)
    mx.eval(model.parameters(), optimizer.state)
"""

from .optimizers import (AdaDelta, Adafactor, Adagrad, Adam, Adamax, AdamW, Lion, MultiOptimizer,
                         Muon, Optimizer, RMSprop, SGD, clip_grad_norm)
from .schedulers import (cosine_decay, exponential_decay, join_schedules, linear_schedule,
                         step_decay)

__all__ = ["Optimizer", "SGD", "RMSprop", "Adagrad", "AdaDelta", "Adam", "AdamW", "Adamax",
           "Lion", "Adafactor", "Muon", "MultiOptimizer", "clip_grad_norm", "step_decay",
           "exponential_decay", "cosine_decay", "linear_schedule", "join_schedules"]
