"""What the example tests share (tests/examples/test_*.py): loading an example, and the
checks that a run stopped and resumed from its checkpoint repeats an uninterrupted run's
losses exactly and that the eager training step gives the compiled step's first losses."""

from __future__ import annotations

import os
import runpy

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def load_example(name: str, *needs: str) -> dict:
    """The namespace of ``examples/<name>.py`` (run as a module, not as ``__main__``); the
    test is skipped when a package the example ``needs`` is not installed."""
    for package in needs:
        pytest.importorskip(package, reason=f"examples/{name}.py needs {package}")
    return runpy.run_path(os.path.join(EXAMPLES, f"{name}.py"))


def run_whole_and_resumed(main, tmp_path, epochs: int, stop: int, **options):
    """``main`` for ``epochs`` epochs in one go, and stopped after ``stop`` epochs then resumed
    to ``epochs``; asserts that both give the same losses (float32 bit for bit: the batches,
    the weights and the optimizer state are the same). Returns ``(whole, resumed)``."""
    whole = main(epochs=epochs, checkpoint=str(tmp_path / "whole.safetensors"), progress=False,
                 **options)
    path = str(tmp_path / "split.safetensors")
    first = main(epochs=stop, checkpoint=path, progress=False, **options)
    resumed = main(epochs=epochs, checkpoint=path, resume=True, progress=False, **options)
    steps = len(whole["losses"]) // epochs
    assert len(whole["losses"]) == epochs * steps and steps > 0
    assert first["losses"] == whole["losses"][:stop * steps]
    # The history comes back from the checkpoint; the new epochs repeat the same numbers.
    np.testing.assert_array_equal(np.float32(resumed["losses"]), np.float32(whole["losses"]))
    return whole, resumed


def run_eager_and_compiled(main, **options):
    """One epoch with the eager and one with the compiled step; asserts that their first
    losses agree. Returns ``(eager, compiled)``.

    Only the first steps: eager and compiled steps differ by float32 rounding (fused
    kernels, BLAS variants for transposed operands), and Adam's first updates, lr * sign(g)
    for gradients near zero, amplify that over an epoch (1e-7 at step 5, 1e-3 by step 20);
    tests/optimizers compares compiled and eager updates step by step."""
    eager = main(epochs=1, checkpoint=None, compile=False, progress=False, **options)
    compiled = main(epochs=1, checkpoint=None, progress=False, **options)
    np.testing.assert_allclose(eager["losses"][:5], compiled["losses"][:5], rtol=1e-4, atol=1e-6)
    return eager, compiled
