"""The README's usage example runs as written."""

import os
import re

import numpy as np
import pytest

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")

README = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "README.md")


def test_readme_python_blocks_run(capsys):
    with open(README, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert blocks
    scope = {}
    for block in blocks:
        exec(compile(block, README, "exec"), scope)
    assert np.array(scope["z"]).tolist() == [[7.0, 14.0, 21.0], [13.0, 20.0, 27.0]]
    assert np.array(scope["dx"]).tolist() == [[2.0] * 3] * 2
    assert np.array(scope["batched"]).tolist() == np.array(scope["z"]).tolist()
    x, y = np.array(scope["x"]), np.array(scope["y"])
    np.testing.assert_allclose(np.array(scope["fused"]), np.exp(2.0 * np.sin(x) + 0.5 * y), rtol=1e-5)
