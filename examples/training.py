"""What the training examples share: batches, checkpoints, the epoch loop, the loss plot.

An example imports it as a sibling module (``from training import fit``; run as
``python examples/<name>.py`` Python puts ``examples/`` on ``sys.path``, and the examples
insert their folder themselves for ``runpy``). Each example's flow:

1. ``command_line`` turns the options into the keyword arguments of the example's ``main``;
2. ``main`` builds its data, its model and an optimizer (the digits examples: in
   ``classify_digits``, with ``load_digits``);
3. ``fit``: the optimizer's state initialised on ``model.trainable_parameters()``, with
   ``resume`` the model and the optimizer restored from the checkpoint; then the training
   step of an MLX program (``nn.value_and_grad`` plus ``optimizer.update``), compiled with
   ``[model.state, optimizer.state]`` as ``inputs=``/``outputs=`` so that one call is one
   replayed node; then the epochs under a tqdm bar showing the loss and the throughput,
   writing a checkpoint (weights, optimizer state, loss history, epoch: one safetensors
   file) after each epoch;
4. the evaluation (``report_accuracy`` for the classifiers), ``plot_losses`` for ``--plot``.

Resuming gives the losses of an uninterrupted run because every source of order is a
function of ``(seed, epoch)`` (``batches``) and everything else the step reads is in the
checkpoint (the optimizer's state holds its step count, so schedules continue too).
"""

from __future__ import annotations

import argparse
import inspect
import os
import time
from functools import partial
from typing import Callable, Iterable, Iterator

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim
from lazyx.utils import tree_flatten, tree_unflatten


def load_digits(seed: int = 0):
    """scikit-learn's bundled 8x8 digits, split 80/20 by ``seed``:
    ``(x_train, y_train, x_test, y_test)``, pixels as float32 in [0, 1] of shape ``(n, 64)``."""
    from sklearn.datasets import load_digits as sklearn_digits  # only the digits examples need it

    digits = sklearn_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def report_accuracy(model, x_test: np.ndarray, y_test: np.ndarray, losses: list, *,
                    plot: str | None, title: str) -> dict:
    """Print the test accuracy of a classifier (the highest logit against the label) and
    write the loss plot with ``--plot``; returns ``{"losses", "test_accuracy"}``."""
    logits = model(mx.array(x_test))
    test_accuracy = mx.mean(mx.argmax(logits, axis=-1) == mx.array(y_test)).item()
    print(f"test accuracy {test_accuracy:.2%} after {len(losses)} steps, final loss "
          f"{losses[-1]:.4f}" if losses else f"test accuracy {test_accuracy:.2%}")
    if plot:
        plot_losses(losses, plot, title)
    return {"losses": losses, "test_accuracy": test_accuracy}


def shuffled_batches(arrays: tuple, batch_size: int, seed: int) -> Callable[[int], Iterator]:
    """``epoch -> batches``: for ``fit``, the rows of the NumPy ``arrays`` (one per argument
    of the loss) in the order of ``batches``, as lazyx arrays."""
    def epoch_batches(epoch: int):
        for idx in batches(len(arrays[0]), batch_size, seed, epoch):
            yield tuple(mx.array(a[idx]) for a in arrays)

    return epoch_batches


def batches(n: int, batch_size: int, seed: int, epoch: int):
    """The index batches of one epoch: a shuffle fixed by ``(seed, epoch)``, so a resumed
    run sees the same batches; the ragged remainder is dropped (one compiled shape)."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    for start in range(0, n - batch_size + 1, batch_size):
        yield order[start:start + batch_size]


def save_checkpoint(path: str, model, optimizer, epoch: int, losses: list) -> None:
    arrays = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    arrays.update({f"optimizer.{k}": v for k, v in tree_flatten(optimizer.state)})
    arrays["history.loss"] = mx.array(np.asarray(losses, np.float32))
    mx.save_safetensors(path, arrays, metadata={"epoch": str(epoch)})


def load_checkpoint(path: str, model, optimizer):
    """Restore ``model`` and ``optimizer`` in place; returns ``(epoch, losses)``."""
    arrays, metadata = mx.load(path, return_metadata=True)
    part = {"model": [], "optimizer": []}
    for key, value in arrays.items():
        head, _, rest = key.partition(".")
        if head in part:
            part[head].append((rest, value))
    model.load_weights(part["model"])
    optimizer.state = tree_unflatten(part["optimizer"])
    return int(metadata["epoch"]), [float(v) for v in np.asarray(arrays["history.loss"])]


def plot_losses(losses: list, path: str, title: str = "training loss") -> None:
    """Write the loss per step to the PNG ``path`` (log scale), or say matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); "
              "no plot written.")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(losses, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"loss curve written to {path}")


def training_step(model, optimizer, loss_fn: Callable, compile: bool = True,
                  max_grad_norm: float | None = None) -> Callable:
    """``step(*batch) -> loss``: one gradient step of ``loss_fn(model, *batch)``; the
    gradients clipped to the global norm ``max_grad_norm`` when given. Compiled, the model's
    and the optimizer's state are its implicit inputs and outputs (build it after any
    restore: it captures the state trees as they are then)."""
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step(*batch):
        loss, grads = loss_and_grad(model, *batch)
        if max_grad_norm is not None:
            grads, _ = optim.clip_grad_norm(grads, max_grad_norm)
        optimizer.update(model, grads)
        return loss

    return partial(mx.compile, inputs=state, outputs=state)(step) if compile else step


def fit(model, optimizer, loss_fn: Callable, epoch_batches: Callable[[int], Iterable[tuple]], *,
        epochs: int, steps_per_epoch: int, items_per_step: int, unit: str = "samples",
        checkpoint: str | None = None, resume: bool = False, compile: bool = True,
        max_grad_norm: float | None = None, progress: bool = True) -> list:
    """Train ``model`` up to epoch ``epochs``; returns the loss of every step (with
    ``resume``, those of the checkpoint first). The optimizer's state is initialised here on
    ``model.trainable_parameters()`` (then replaced by the checkpoint's with ``resume``).

    ``epoch_batches(epoch)`` yields the argument tuples of ``loss_fn(model, *batch)`` for
    one epoch, ``steps_per_epoch`` of them, each holding ``items_per_step`` ``unit``s (the
    throughput on the bar). ``checkpoint`` is written after every epoch and read first
    with ``resume``."""
    from tqdm import tqdm  # only the examples need tqdm

    optimizer.init(model.trainable_parameters())
    first_epoch, losses = 0, []
    if resume:
        if not checkpoint or not os.path.exists(checkpoint):
            raise SystemExit(f"--resume: no checkpoint at {checkpoint!r}; train without "
                             "--resume first")
        first_epoch, losses = load_checkpoint(checkpoint, model, optimizer)
        print(f"resumed from {checkpoint} after epoch {first_epoch}")
    mx.eval(model.parameters(), optimizer.state)
    step = training_step(model, optimizer, loss_fn, compile, max_grad_norm)
    state = [model.state, optimizer.state]

    bar = tqdm(total=max(epochs - first_epoch, 0) * steps_per_epoch, unit="step",
               disable=not progress, dynamic_ncols=True)
    for epoch in range(first_epoch, epochs):
        tic = time.perf_counter()
        for batch in epoch_batches(epoch):
            loss = step(*batch)
            mx.eval(loss, state)
            losses.append(loss.item())
            bar.update(1)
        rate = steps_per_epoch * items_per_step / (time.perf_counter() - tic)
        bar.set_postfix({"epoch": epoch + 1, "loss": f"{losses[-1]:.4f}",
                         f"{unit}/s": f"{rate:,.0f}"})
        if checkpoint:
            save_checkpoint(checkpoint, model, optimizer, epoch + 1, losses)
    bar.close()
    return losses


def classify_digits(model, title: str, image_shape: tuple = (64,), *, epochs: int,
                    batch_size: int, learning_rate: float, seed: int, checkpoint: str | None,
                    resume: bool, plot: str | None, compile: bool, progress: bool) -> dict:
    """The digits examples after their model: ``load_digits`` with each image reshaped to
    ``image_shape``, ``fit`` with Adam and cross-entropy, then ``report_accuracy``."""
    x_train, y_train, x_test, y_test = load_digits()
    x_train, x_test = (x.reshape((-1,) + tuple(image_shape)) for x in (x_train, x_test))
    optimizer = optim.Adam(learning_rate=learning_rate)
    losses = fit(model, optimizer, cross_entropy_loss,
                 shuffled_batches((x_train, y_train), batch_size, seed), epochs=epochs,
                 steps_per_epoch=len(x_train) // batch_size, items_per_step=batch_size,
                 checkpoint=checkpoint, resume=resume, compile=compile, progress=progress)
    return report_accuracy(model, x_test, y_test, losses, plot=plot, title=title)


def cross_entropy_loss(model, x, y):
    """The mean cross-entropy of ``model(x)``'s logits against the class indices ``y``."""
    return nn.losses.cross_entropy(model(x), y, reduction="mean")


#: Help for the options every example has; the others say their default.
HELP = {"checkpoint": "safetensors file written after every epoch ('' for none)",
        "resume": "continue from --checkpoint",
        "compile": "run the training step eagerly",
        "progress": "hide the progress bar"}


def command_line(main: Callable, doc: str, argv=None):
    """Run ``main`` with the options of the command line: one option per keyword argument
    of ``main`` (``batch_size`` is ``--batch-size``), typed and defaulted as ``main`` is, so
    the defaults live in one place. A flag that defaults to ``True`` becomes ``--no-<name>``;
    ``--plot`` takes an optional file name (default ``<example>_loss.png``); ``--checkpoint ''``
    means none."""
    name = os.path.splitext(os.path.basename(inspect.getsourcefile(main)))[0]
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    for param in inspect.signature(main).parameters.values():
        option, default = param.name.replace("_", "-"), param.default
        if param.name == "plot":
            parser.add_argument("--plot", nargs="?", const=f"{name}_loss.png", default=None,
                                help=f"write the loss curve to this PNG ({name}_loss.png)")
        elif param.name == "checkpoint":
            parser.add_argument("--checkpoint", type=lambda path: path or None, default=default,
                                help=f"{HELP['checkpoint']}; default {default}")
        elif isinstance(default, bool):
            parser.add_argument(f"--no-{option}" if default else f"--{option}", dest=param.name,
                                action="store_false" if default else "store_true",
                                help=HELP.get(param.name))
        else:
            parser.add_argument(f"--{option}", type=type(default), default=default,
                                help=f"default {default!r}" if isinstance(default, str)
                                else f"default {default}")
    return main(**vars(parser.parse_args(argv)))
