"""Memory figures side by side with MLX 0.32.2: the same sequence
(tests/core/memory_sequence.py) run in a fresh process on each."""

import pytest

from lazyx.backends.cpu import native_kernels
from tests.core.test_memory_figures import LOOSE, figures
from tests.mlx.mlx_compat import requires_mlx


@requires_mlx
@pytest.mark.skipif(native_kernels.load() is None, reason="the native module was not built")
def test_memory_figures_match_mlx():
    ours, theirs = figures("lazyx"), figures("mlx")
    assert [s[0] for s in ours] == [s[0] for s in theirs]
    for got, want in zip(ours, theirs):
        if got[0] in LOOSE:
            assert abs(got[1] - want[1]) <= 64, f"step {got[0]!r}: lazyx {got}, MLX {want}"
        else:
            assert got == want, f"step {got[0]!r}: lazyx {got[1:]}, MLX {want[1:]}"
