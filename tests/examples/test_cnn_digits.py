"""examples/cnn_digits.py: a short run of the convolutional network learns the digits, and
--resume continues with the losses of an uninterrupted run."""

import numpy as np
import pytest
from example_runs import load_example, run_eager_and_compiled, run_whole_and_resumed

from lazyx.utils import tree_flatten


@pytest.fixture(scope="module")
def example():
    return load_example("cnn_digits", "sklearn", "tqdm")


def test_short_run_learns_and_resume_matches_an_uninterrupted_run(example, tmp_path):
    whole, resumed = run_whole_and_resumed(example["main"], tmp_path, epochs=3, stop=2)
    # 3 epochs of 22 batches: far below the untrained loss (about ln 10) and past 95 %.
    assert len(whole["losses"]) == 3 * 22
    assert whole["losses"][0] > 2.0
    assert np.mean(whole["losses"][-22:]) < 0.1 * whole["losses"][0]
    assert whole["test_accuracy"] >= 0.95
    assert resumed["test_accuracy"] == whole["test_accuracy"]


def test_eager_step_gives_the_compiled_losses(example):
    eager, compiled = run_eager_and_compiled(example["main"])
    assert np.mean(eager["losses"][-5:]) < 0.5 * eager["losses"][0]
    assert abs(eager["test_accuracy"] - compiled["test_accuracy"]) <= 0.03


def test_the_network_is_channels_last_with_mlx_parameter_shapes(example):
    model = example["CNN"](hidden_dims=64)
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    assert shapes == {"conv1.weight": (16, 3, 3, 1), "conv1.bias": (16,),
                      "conv2.weight": (32, 3, 3, 16), "conv2.bias": (32,),
                      "fc1.weight": (64, 512), "fc1.bias": (64,),
                      "fc2.weight": (10, 64), "fc2.bias": (10,)}
