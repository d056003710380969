"""The ``nccl`` backend on one GPU (world size 1): the communicator against NumPy over
dtypes and shapes, and the collective primitives evaluated on the GPU through it.
Skips without CuPy's NCCL or a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.distributed.nccl import NCCLBackend
from lazyx.plugins import distributed as pack
from nccl_checks import check_communicator

pytestmark = pytest.mark.skipif(not NCCLBackend().is_available(),
                                reason=f"nccl: {NCCLBackend().unavailable_reason()}")


@pytest.fixture
def group(monkeypatch):
    monkeypatch.setattr(pack, "_groups", {})
    for name in ("LAZYX_RANK", "LAZYX_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    g = mx.distributed.init(strict=True, backend="nccl")
    assert (g.rank(), g.size(), g.backend) == (0, 1, "nccl")
    return g


def test_the_communicator(group):
    import cupy as cp  # present: the module is skipped otherwise
    assert check_communicator(group._comm, cp) > 30


def test_collective_nodes_run_on_the_gpu(group):
    gpu = mx.default_stream(mx.gpu)
    x = mx.array(np.arange(12.0, dtype=np.float32).reshape(4, 3))
    y = mx.exp(x * 0.1, stream=gpu)  # computed on the GPU, consumed there
    outs = [pack._all_reduce(y, "sum", group, gpu), pack._all_reduce(y, "max", group, gpu),
            pack._all_gather(y, group, gpu), pack._sum_scatter(y, group, gpu)]
    mx.eval(outs)
    want = np.exp(np.arange(12.0).reshape(4, 3) * 0.1)
    for o in outs:
        np.testing.assert_allclose(np.asarray(o), want, rtol=1e-6)
    # A compiled step holding one, on the GPU.
    f = mx.compile(lambda a: pack._all_reduce(a * 2, "sum", group, gpu) + 1)
    np.testing.assert_allclose(np.asarray(f(x)), np.arange(12.0).reshape(4, 3) * 2 + 1)
    # The public ops on a group of one return their input (as MLX).
    assert mx.distributed.all_sum(x, group=group) is x
