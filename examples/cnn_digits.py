"""Train a small convolutional network on scikit-learn's bundled digits (8x8 images, no download).

    python examples/cnn_digits.py                  # ~98 % test accuracy in well under a minute
    python examples/cnn_digits.py --plot           # also write the loss curve (matplotlib)
    python examples/cnn_digits.py --epochs 4       # stop early (a checkpoint is saved) ...
    python examples/cnn_digits.py --resume         # ... and continue where it stopped

The flow, as an MLX program writes it (only the imports say lazyx):

1. the data: the digits of ``mlp_digits.py`` (same split), as images of shape
   ``(n, 8, 8, 1)``: channels last, as MLX's convolutions take them;
2. the model: two 3x3 convolutions (16 and 32 channels, padding 1) with ReLU, a 2x2 max
   pool to ``4 x 4 x 32``, then ``Linear -> relu -> Linear`` on the flattened features;
3. ``classify_digits`` and ``fit`` (``examples/training.py``, shared with the MLP): a
   cross-entropy Adam step compiled into one replayed node, a tqdm bar with the loss and the
   samples per second, a safetensors checkpoint after each epoch that ``--resume``
   continues from with the losses of an uninterrupted run, the test accuracy.
"""

from __future__ import annotations

import os
import sys

import lazyx.core as mx
import lazyx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # training.py, also under runpy
from training import classify_digits, command_line  # noqa: E402


class CNN(nn.Module):
    """``conv3x3(16) -> relu -> conv3x3(32) -> relu -> maxpool 2x2 -> flatten -> Linear(hidden)
    -> relu -> Linear(classes)`` on ``(n, 8, 8, 1)`` images."""

    def __init__(self, hidden_dims: int = 64, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.fc1 = nn.Linear(4 * 4 * 32, hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, num_classes)

    def __call__(self, x):
        x = self.pool(nn.relu(self.conv2(nn.relu(self.conv1(x)))))
        x = x.reshape(x.shape[0], -1)
        return self.fc2(nn.relu(self.fc1(x)))


def main(epochs: int = 8, batch_size: int = 64, hidden_dims: int = 64,
         learning_rate: float = 2e-3, seed: int = 0,
         checkpoint: str | None = "cnn_digits.safetensors", resume: bool = False,
         plot: str | None = None, compile: bool = True, progress: bool = True) -> dict:
    """Train, checkpoint, evaluate. Returns ``{"losses", "test_accuracy"}``."""
    mx.random.seed(seed)
    model = CNN(hidden_dims)
    return classify_digits(model, "CNN on digits", (8, 8, 1), epochs=epochs,
                           batch_size=batch_size, learning_rate=learning_rate, seed=seed,
                           checkpoint=checkpoint, resume=resume, plot=plot, compile=compile,
                           progress=progress)


if __name__ == "__main__":
    command_line(main, __doc__)
