"""examples/mlp_digits.py: a short run learns the digits, and --resume continues with the
losses of an uninterrupted run."""

import os
import runpy

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
pytest.importorskip("tqdm", reason="the digits example needs tqdm")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mlp_digits.py")


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(EXAMPLE)


def test_short_run_learns_and_resume_matches_an_uninterrupted_run(example, tmp_path):
    main = example["main"]
    whole = main(epochs=4, checkpoint=str(tmp_path / "whole.safetensors"), progress=False)
    # 4 epochs of 22 batches: already well past chance (10 %) and the untrained loss.
    assert len(whole["losses"]) == 4 * 22
    assert np.mean(whole["losses"][-22:]) < 0.2 * whole["losses"][0]
    assert whole["test_accuracy"] >= 0.95

    path = str(tmp_path / "split.safetensors")
    first = main(epochs=2, checkpoint=path, progress=False)
    resumed = main(epochs=4, checkpoint=path, resume=True, progress=False)
    assert first["losses"] == whole["losses"][:44]
    # The history comes back from the checkpoint; the new epochs repeat the same numbers.
    np.testing.assert_array_equal(np.float32(resumed["losses"]), np.float32(whole["losses"]))
    assert resumed["test_accuracy"] == whole["test_accuracy"]


def test_eager_step_gives_the_compiled_losses(example):
    main = example["main"]
    eager = main(epochs=1, checkpoint=None, compile=False, progress=False)
    compiled = main(epochs=1, checkpoint=None, progress=False)
    # The first steps: eager and compiled steps differ by float32 rounding (fused kernels,
    # BLAS variants for transposed operands), and Adam's first updates, lr * sign(g) for
    # gradients near zero, amplify that over an epoch (1e-7 at step 5, 1e-3 by step 20);
    # tests/optimizers compares compiled and eager updates step by step.
    np.testing.assert_allclose(eager["losses"][:5], compiled["losses"][:5], rtol=1e-4, atol=1e-6)
    assert abs(eager["test_accuracy"] - compiled["test_accuracy"]) <= 0.02


def test_resume_without_a_checkpoint_says_what_to_do(example, tmp_path):
    with pytest.raises(SystemExit, match="train without --resume"):
        example["main"](epochs=1, checkpoint=str(tmp_path / "none.safetensors"), resume=True,
                        progress=False)


def test_plot_writes_a_png_or_says_matplotlib_is_missing(example, tmp_path, capsys):
    path = str(tmp_path / "loss.png")
    example["plot_losses"]([1.0, 0.5, 0.25], path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in capsys.readouterr().out
        assert not os.path.exists(path)
    else:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
