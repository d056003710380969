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

Steps 1, 3 and 4, shared with the other examples, are ``classify_digits`` and ``fit`` in
``examples/training.py``; the options of the command line are ``main``'s arguments.
"""

from __future__ import annotations

import os
import sys

import lazyx.core as mx
import lazyx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # training.py, also under runpy
from training import classify_digits, command_line  # noqa: E402


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


def main(epochs: int = 20, batch_size: int = 64, hidden_dims: int = 128, num_layers: int = 2,
         learning_rate: float = 2e-3, seed: int = 0, checkpoint: str | None = "mlp_digits.safetensors",
         resume: bool = False, plot: str | None = None, compile: bool = True,
         progress: bool = True) -> dict:
    """Train, checkpoint, evaluate. Returns ``{"losses", "test_accuracy"}``."""
    mx.random.seed(seed)
    model = MLP(num_layers, 64, hidden_dims, 10)
    return classify_digits(model, "MLP on digits", epochs=epochs, batch_size=batch_size,
                           learning_rate=learning_rate, seed=seed, checkpoint=checkpoint,
                           resume=resume, plot=plot, compile=compile, progress=progress)


if __name__ == "__main__":
    command_line(main, __doc__)
