"""examples/training.py, the module the training examples share: the batch order that makes
--resume exact, the command line built from an example's ``main``, the loss plot."""

import os

import pytest
from example_runs import load_example


@pytest.fixture(scope="module")
def training():
    return load_example("training")


def test_batches_are_a_permutation_fixed_by_seed_and_epoch(training):
    def batches(seed, epoch):
        return [b.tolist() for b in training["batches"](10, 3, seed, epoch)]

    first = batches(0, 0)
    assert first == batches(0, 0)
    assert first != batches(0, 1) and first != batches(1, 0)
    # three full batches of distinct indices; the ragged tenth index is dropped
    assert [len(b) for b in first] == [3, 3, 3]
    indices = [i for batch in first for i in batch]
    assert len(set(indices)) == 9 and set(indices) <= set(range(10))


def test_command_line_gives_main_its_options_typed_and_defaulted_as_main(training):
    def main(epochs: int = 3, learning_rate: float = 1e-3, prompt: str = "the ",
             checkpoint: str = "x.safetensors", resume: bool = False, plot=None,
             compile: bool = True):
        return dict(epochs=epochs, learning_rate=learning_rate, prompt=prompt,
                    checkpoint=checkpoint, resume=resume, plot=plot, compile=compile)

    command_line = training["command_line"]
    assert command_line(main, "doc", argv=[]) == main()
    got = command_line(main, "doc", argv=["--epochs", "5", "--learning-rate", "0.5", "--prompt",
                                          "a b", "--checkpoint", "", "--resume", "--plot",
                                          "--no-compile"])
    assert got == dict(epochs=5, learning_rate=0.5, prompt="a b", checkpoint=None, resume=True,
                       plot="test_training_loss.png", compile=False)
    assert command_line(main, "doc", argv=["--plot", "p.png"])["plot"] == "p.png"
    with pytest.raises(SystemExit):
        command_line(main, "doc", argv=["--epochs", "many"])
    with pytest.raises(SystemExit):
        command_line(main, "doc", argv=["--compile"])


def test_plot_writes_a_png_or_says_matplotlib_is_missing(training, tmp_path, capsys):
    path = str(tmp_path / "loss.png")
    training["plot_losses"]([1.0, 0.5, 0.25], path, title="a test")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in capsys.readouterr().out
        assert not os.path.exists(path)
    else:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
