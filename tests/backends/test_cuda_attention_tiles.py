"""The CUDA backend's tiled attention, host side, on machines without a GPU: see
tests/backends/cuda_tiles_on_numpy.py (run in a subprocess: it fakes ``cupy``)."""

import os
import re
import subprocess
import sys


def test_tiles_match_the_cpu_kernels_forward_and_backward():
    script = os.path.join(os.path.dirname(__file__), "cuda_tiles_on_numpy.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = re.findall(r"^case .*: forward (\S+) backward (\S+)$", run.stdout, re.M)
    assert len(rows) == 7, run.stdout
    for forward, backward in rows:
        assert float(forward) < 1e-5 and float(backward) < 1e-4, run.stdout
