"""Data-parallel training of the digits MLP (``examples/mlp_digits.py``) on N processes.

    python -m lazyx.launch -n 2 examples/distributed_mlp.py            # 2 ranks over MPI
    python -m lazyx.launch -n 2 examples/distributed_mlp.py --check    # and compare with 1
    python examples/distributed_mlp.py                                 # 1 process: plain run

The flow, as an MLX program writes it (only the imports say lazyx):

1. ``mx.distributed.init()`` gives the group of the launched processes (rank ``r`` of
   ``N``; a plain ``python`` run is a group of one);
2. every rank builds the same model (the same seed) and reads the same batches (the
   order is a function of the seed and the epoch, ``training.batches``); each rank
   takes its ``1/N`` slice of every batch of ``batch_size`` rows;
3. the step: the gradient of the mean loss on the rank's slice, then
   ``nn.average_gradients`` (a batched ``all_sum`` divided by N) — the mean over equal
   slices is the gradient of the mean loss on the whole batch — and the same Adam
   update on every rank, so the replicas stay identical. The loss reported is the
   ``all_sum`` of the ranks' losses over N: the whole batch's loss;
4. ``--check``: rank 0 also trains a second copy of the model alone on the whole batches
   (no communication) and compares the two loss curves, which must agree to float
   tolerance (:data:`TOLERANCE`); it exits with status 1 if they do not.

The step is compiled (``--no-compile``: eager) with the model's and the optimizer's state
as ``inputs=``/``outputs=``, the collectives inside the compiled function.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also under runpy
from mlp_digits import MLP  # noqa: E402
from training import batches, command_line, cross_entropy_loss, load_digits  # noqa: E402

#: ``--check``: the largest difference allowed between the two loss curves, relative to
#: the loss, and how many steps are compared, by optimizer. The two runs differ only in
#: rounding (a mean of slice means against one mean; matrix products of 32 rows against
#: 64). SGD keeps that at the float epsilon for the whole run. Adam divides each update by
#: the root of the gradient's second moment, which magnifies the rounding of near-zero
#: gradient entries: the curves agree to ~1e-4 for the first steps, then separate as any
#: two Adam runs whose gradients differ in the last bit do (measured: 6e-2 after 110
#: steps, while SGD stays at 2e-7), so only those first steps are compared.
TOLERANCE = {"sgd": (1e-5, None), "adam": (1e-3, 10)}
OPTIMIZERS = {"sgd": optim.SGD, "adam": optim.Adam}


def train(model, x_train, y_train, *, group, epochs: int, batch_size: int, steps: int,
          optimizer: str, learning_rate: float, seed: int, compile: bool) -> list:
    """Train ``model`` with its ``1/N`` slice of every batch, gradients averaged over
    ``group`` (None: alone, on the whole batches); returns the whole batch's loss per step."""
    n, r = (1, 0) if group is None else (group.size(), group.rank())
    part = batch_size // n
    optimizer = OPTIMIZERS[optimizer](learning_rate=learning_rate)
    optimizer.init(model.trainable_parameters())
    loss_and_grad = nn.value_and_grad(model, cross_entropy_loss)
    state = [model.state, optimizer.state]

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        if group is not None:
            grads = nn.average_gradients(grads, group=group)
            loss = mx.distributed.all_sum(loss, group=group) / n
        optimizer.update(model, grads)
        return loss

    if compile:
        step = mx.compile(step, inputs=state, outputs=state)
    losses = []
    for epoch in range(epochs):
        for idx in batches(len(x_train), batch_size, seed, epoch):
            mine = idx[r * part:(r + 1) * part]
            loss = step(mx.array(x_train[mine]), mx.array(y_train[mine]))
            mx.eval(loss, state)
            losses.append(loss.item())
            if len(losses) == steps:
                return losses
    return losses


def main(epochs: int = 5, batch_size: int = 64, hidden_dims: int = 128, num_layers: int = 2,
         optimizer: str = "adam", learning_rate: float = 2e-3, seed: int = 0, steps: int = 0,
         compile: bool = True, check: bool = False, print_every: int = 10) -> dict:
    """Train data-parallel; returns ``{"losses", "test_accuracy"}`` (and ``"reference"``
    with ``--check``). ``optimizer`` is ``adam`` or ``sgd``; ``steps`` > 0 stops after that
    many steps."""
    if optimizer not in OPTIMIZERS:
        raise SystemExit(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")
    group = mx.distributed.init()
    n, rank = group.size(), group.rank()
    if batch_size % n:
        raise SystemExit(f"--batch-size {batch_size} must be a multiple of the {n} processes")
    x_train, y_train, x_test, y_test = load_digits()
    settings = dict(epochs=epochs, batch_size=batch_size, steps=steps, optimizer=optimizer,
                    learning_rate=learning_rate, seed=seed, compile=compile)

    mx.random.seed(seed)
    model = MLP(num_layers, 64, hidden_dims, 10)
    losses = train(model, x_train, y_train, group=group if n > 1 else None, **settings)
    accuracy = mx.mean(mx.argmax(model(mx.array(x_test)), axis=-1) == mx.array(y_test)).item()
    result = {"losses": losses, "test_accuracy": accuracy}
    if rank == 0:
        for i in range(0, len(losses), max(print_every, 1)):
            print(f"step {i + 1} loss {losses[i]:.6f}")
        print(f"{n} process(es), {len(losses)} steps of {batch_size} samples "
              f"({batch_size // n} per process): final loss {losses[-1]:.6f}, "
              f"test accuracy {accuracy:.2%}")

    if check and rank == 0:
        mx.random.seed(seed)
        reference = MLP(num_layers, 64, hidden_dims, 10)
        result["reference"] = train(reference, x_train, y_train, group=None, **settings)
        tolerance, steps_compared = TOLERANCE[optimizer]
        gaps = np.abs(np.subtract(losses, result["reference"])) / np.abs(result["reference"])
        gap = float(np.max(gaps[:steps_compared]))
        print(f"check: the largest relative loss difference from one process on the whole "
              f"batches is {gap:.2e} over {len(gaps[:steps_compared])} steps (tolerance "
              f"{tolerance:g} with {optimizer}; {float(np.max(gaps)):.2e} over all steps)")
        if not gap <= tolerance:
            raise SystemExit(1)
        print("check passed")
    return result


if __name__ == "__main__":
    command_line(main, __doc__)
