"""Property-based fuzzing of every op family (see ``op_fuzz.py`` for what an example
checks). Each property runs its hypothesis search in a child process, so a segfault or
an abort fails the test with the signal instead of killing the run.

``LAZYX_FUZZ_EXAMPLES=2000 python -m pytest tests/fuzz`` searches longer, with random
seeds; by default the search is derandomized and bounded (about a minute on one core).
"""

import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROPERTIES = ["unary", "binary", "binary_scalar", "reduce", "scan", "shapes", "getitem",
              "take", "matmul", "sort", "creation", "random"]
TIMEOUT_S = int(os.environ.get("LAZYX_FUZZ_TIMEOUT", "600"))


def run_child(name: str) -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {HERE!r}); import op_fuzz; op_fuzz.main({name!r})"
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("name", PROPERTIES)
def test_op_fuzz(name):
    r = run_child(name)
    out = (r.stdout + r.stderr)[-6000:]
    if r.returncode < 0:
        pytest.fail(f"the {name} fuzz crashed with {signal.Signals(-r.returncode).name}:\n{out}")
    assert r.returncode == 0, f"the {name} fuzz failed:\n{out}"

