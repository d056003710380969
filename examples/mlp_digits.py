"""Train a multi-layer perceptron on scikit-learn's bundled digits (8x8 images, no download).

    python examples/mlp_digits.py                  # ~97 % test accuracy in a few seconds
    python examples/mlp_digits.py --plot           # also write the loss curve (matplotlib)
    python examples/mlp_digits.py --epochs 10      # stop early (a checkpoint is saved) ...
    python examples/mlp_digits.py --resume         # ... and continue where it stopped

The flow, as an MLX program writes it (only the imports say lazyx):

1. the data: 1797 images scaled to [0, 1], split 80/20 with a fixed seed;
2. the model: ``Linear -> relu -> Linear -> relu -> Linear`` from ``lazyx.nn``;
3. the training step: ``nn.value_and_grad`` plus ``Adam.update``, compiled with the
   model's and the optimizer's state as ``inputs=``/``outputs=`` so that one call is one
   replayed node;
4. the epochs: a tqdm progress bar with the loss and the throughput; after each epoch a
   checkpoint (weights, optimizer state, the loss history, the epoch) in one safetensors
   file. ``--resume`` loads it and continues; since the batch order of an epoch depends
   only on the seed and the epoch number, the losses are those of an uninterrupted run.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim
from lazyx.utils import tree_flatten, tree_unflatten


class MLP(nn.Module):
    """``num_layers`` hidden layers of ``hidden_dims`` units with ReLU, then a linear head."""

    def __init__(self, num_layers: int, input_dims: int, hidden_dims: int, output_dims: int):
        super().__init__()
        sizes = [input_dims] + [hidden_dims] * num_layers + [output_dims]
        self.layers = [nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:])]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = nn.relu(layer(x))
        return self.layers[-1](x)


def load_data(seed: int = 0):
    """``(x_train, y_train, x_test, y_test)`` as NumPy arrays (float32 pixels in [0, 1])."""
    from sklearn.datasets import load_digits  # only this example needs scikit-learn

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def loss_fn(model, x, y):
    return nn.losses.cross_entropy(model(x), y, reduction="mean")


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


def plot_losses(losses: list, path: str) -> None:
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
    ax.set_title("MLP on digits")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"loss curve written to {path}")


def main(epochs: int = 20, batch_size: int = 64, hidden_dims: int = 128, num_layers: int = 2,
         learning_rate: float = 2e-3, seed: int = 0, checkpoint: str | None = "mlp_digits.safetensors",
         resume: bool = False, plot: str | None = None, compile: bool = True,
         progress: bool = True) -> dict:
    """Train, evaluate, checkpoint. Returns ``{"losses", "test_accuracy", "epochs"}``."""
    from tqdm import tqdm  # only the examples need tqdm

    x_train, y_train, x_test, y_test = load_data()
    mx.random.seed(seed)
    model = MLP(num_layers, x_train.shape[1], hidden_dims, 10)
    optimizer = optim.Adam(learning_rate=learning_rate)
    optimizer.init(model.trainable_parameters())
    first_epoch, losses = 0, []
    if resume:
        if not checkpoint or not os.path.exists(checkpoint):
            raise SystemExit(f"--resume: no checkpoint at {checkpoint!r}; train without "
                             "--resume first")
        first_epoch, losses = load_checkpoint(checkpoint, model, optimizer)
        print(f"resumed from {checkpoint} after epoch {first_epoch}")
    mx.eval(model.parameters(), optimizer.state)

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]  # after loading: the state the step updates

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    if compile:
        step = partial(mx.compile, inputs=state, outputs=state)(step)

    steps_per_epoch = len(x_train) // batch_size
    bar = tqdm(total=(epochs - first_epoch) * steps_per_epoch, unit="step",
               disable=not progress, dynamic_ncols=True)
    for epoch in range(first_epoch, epochs):
        tic = time.perf_counter()
        for idx in batches(len(x_train), batch_size, seed, epoch):
            loss = step(mx.array(x_train[idx]), mx.array(y_train[idx]))
            mx.eval(loss, state)
            losses.append(loss.item())
            bar.update(1)
        rate = steps_per_epoch * batch_size / (time.perf_counter() - tic)
        bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}", samples_s=f"{rate:,.0f}")
        if checkpoint:
            save_checkpoint(checkpoint, model, optimizer, epoch + 1, losses)
    bar.close()

    logits = model(mx.array(x_test))
    accuracy = mx.mean(mx.argmax(logits, axis=1) == mx.array(y_test)).item()
    print(f"test accuracy {accuracy:.2%} after {epochs} epochs ({len(losses)} steps), "
          f"final loss {losses[-1]:.4f}" if losses else f"test accuracy {accuracy:.2%}")
    if plot:
        plot_losses(losses, plot)
    return {"losses": losses, "test_accuracy": accuracy, "epochs": epochs}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden-dims", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="mlp_digits.safetensors",
                   help="safetensors file written after every epoch ('' for none)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--plot", nargs="?", const="mlp_digits_loss.png", default=None,
                   help="write the loss curve to this PNG (default mlp_digits_loss.png)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="run the training step eagerly")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    main(epochs=args.epochs, batch_size=args.batch_size, hidden_dims=args.hidden_dims,
         num_layers=args.num_layers, learning_rate=args.learning_rate, seed=args.seed,
         checkpoint=args.checkpoint or None, resume=args.resume, plot=args.plot,
         compile=args.compile)
