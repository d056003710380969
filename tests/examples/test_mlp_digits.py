"""examples/mlp_digits.py: a short run learns the digits, and --resume continues with the
losses of an uninterrupted run."""

import numpy as np
import pytest
from example_runs import load_example, run_eager_and_compiled, run_whole_and_resumed


@pytest.fixture(scope="module")
def example():
    return load_example("mlp_digits", "sklearn", "tqdm")


def test_short_run_learns_and_resume_matches_an_uninterrupted_run(example, tmp_path):
    whole, resumed = run_whole_and_resumed(example["main"], tmp_path, epochs=4, stop=2)
    # 4 epochs of 22 batches: already well past chance (10 %) and the untrained loss.
    assert len(whole["losses"]) == 4 * 22
    assert np.mean(whole["losses"][-22:]) < 0.2 * whole["losses"][0]
    assert whole["test_accuracy"] >= 0.95
    assert resumed["test_accuracy"] == whole["test_accuracy"]


def test_eager_step_gives_the_compiled_losses(example):
    eager, compiled = run_eager_and_compiled(example["main"])
    assert abs(eager["test_accuracy"] - compiled["test_accuracy"]) <= 0.02


def test_resume_without_a_checkpoint_says_what_to_do(example, tmp_path):
    with pytest.raises(SystemExit, match="train without --resume"):
        example["main"](epochs=1, checkpoint=str(tmp_path / "none.safetensors"), resume=True,
                        progress=False)
