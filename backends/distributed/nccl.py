"""The ``nccl`` communication backend: NCCL through CuPy (``cupy.cuda.nccl``), on GPU
buffers, one process per GPU.

Install CuPy with NCCL (``pip install cupy-cuda12x nvidia-nccl-cu12``). Each process
uses GPU ``rank % device count`` (ranks packed by machine, as ``mpirun`` and
``lazyx.launch`` place them). The processes meet through NCCL's *unique id*, made by
rank 0 and handed to the others:

* over MPI when they were started by ``mpirun`` and mpi4py is installed (a broadcast
  on ``COMM_WORLD``);
* else over TCP at ``LAZYX_DIST_ADDR`` (``host:port``, set by ``lazyx.launch``):
  rank 0 listens there and sends the id to each rank that connects; the others
  retry connecting until ``LAZYX_DIST_TIMEOUT`` seconds (300) have passed, then
  raise :class:`DistributedError`;
* a single process (no launcher, ``init(backend="nccl", strict=True)``) makes its
  own id: a world of one.

Collectives run on CuPy's current CUDA stream with the buffers' device pointers: no
host round trip. NCCL reduces ``float16``, ``bfloat16``, ``float32``, ``float64``,
``int8``, ``uint8``, ``int32``, ``uint32``, ``int64`` and ``uint64`` in their dtype;
booleans reduce as bytes (``sum`` and ``max``: or; ``min``: and); complex arrays sum
as pairs of floats. ``int16``/``uint16`` are a :class:`DistributedError` (NCCL has no
such type). ``send``/``recv`` move bytes. ``split`` needs no MPI: the processes
all-gather their (color, key) over NCCL, each new group's first process makes an id,
and the ids are all-gathered too.

Not checked across processes: shapes and dtypes (NCCL hangs or corrupts on a
mismatch; debug with the ``mpi`` backend and ``LAZYX_DIST_CHECK=1``). A process
that dies leaves the others waiting inside NCCL unless the launcher ends the job
(``mpirun`` and ``lazyx.launch`` do); NCCL's own ``NCCL_TIMEOUT``-style watchdogs
are not used.

This module has not run on a GPU at the time of writing: it follows CuPy's and
NCCL's documentation.
"""

from __future__ import annotations

import importlib.util
import socket
import time

import numpy as np

from lazyx.environment import read_variable
from lazyx.hookspecs import hookimpl

from . import CommunicationBackend, Communicator, DistributedError, launcher_world

__all__ = ["NCCLBackend", "NCCLCommunicator"]

# NCCL's ncclDataType_t and ncclRedOp_t values (nccl.h; stable since NCCL 2.10).
_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
_OPS = {"sum": 0, "max": 2, "min": 3}


def _cupy():
    import cupy  # the GPU library: only when the nccl backend is asked for
    return cupy


def _nccl():
    from cupy.cuda import nccl  # NCCL's bindings in CuPy: only when asked for
    return nccl


def _contiguous(cp, x):
    """``x`` itself when C-contiguous, else a C-contiguous copy keeping its shape (a 0-d
    array stays 0-d, which ``ascontiguousarray`` would not keep)."""
    return x if x.flags.c_contiguous else cp.ascontiguousarray(x).reshape(x.shape)


class NCCLCommunicator(Communicator):
    """A ``cupy.cuda.nccl.NcclCommunicator``."""

    backend = "nccl"
    device = "gpu"

    def __init__(self, comm, rank: int, size: int):
        self.comm = comm
        self.rank = rank
        self.size = size

    def _spec(self, x, op: str | None):
        """``(element count, NCCL datatype, NCCL op)`` for ``x`` (C-contiguous)."""
        name = "bfloat16" if x.dtype.kind == "V" and x.dtype.itemsize == 2 else x.dtype.name
        count = x.size
        if name == "bool":
            name = "uint8"
            op = "min" if op == "min" else "max"
        elif name in ("complex64", "complex128"):
            if op not in (None, "sum"):
                raise DistributedError(f"[all_{op}] Complex arrays have no order.")
            name, count = ("float32" if name == "complex64" else "float64"), 2 * count
        if name not in _TYPES:
            raise DistributedError(
                f"NCCL has no {name} type: cast the array to one of "
                f"{', '.join(_TYPES)} (or bool, complex) before the collective.")
        return count, _TYPES[name], _OPS[op] if op else None

    @staticmethod
    def _stream():
        return _cupy().cuda.get_current_stream().ptr

    def all_reduce(self, x, op):
        cp = _cupy()
        x = _contiguous(cp, x)
        out = cp.empty_like(x)
        count, dtype, nccl_op = self._spec(x, op)
        self.comm.allReduce(x.data.ptr, out.data.ptr, count, dtype, nccl_op, self._stream())
        return out

    def all_gather(self, x):
        cp = _cupy()
        x = _contiguous(cp, x)
        shape = (self.size,) if x.ndim == 0 else (self.size * x.shape[0],) + x.shape[1:]
        out = cp.empty(shape, x.dtype)
        # Bytes: every dtype gathers alike.
        self.comm.allGather(x.data.ptr, out.data.ptr, x.nbytes, _TYPES["uint8"], self._stream())
        return out

    def reduce_scatter(self, x):
        cp = _cupy()
        x = _contiguous(cp, x)
        out = cp.empty((x.shape[0] // self.size,) + x.shape[1:], x.dtype)
        count, dtype, nccl_op = self._spec(out, "sum")
        self.comm.reduceScatter(x.data.ptr, out.data.ptr, count, dtype, nccl_op, self._stream())
        return out

    def send(self, x, dst):
        x = _contiguous(_cupy(), x)
        self.comm.send(x.data.ptr, x.nbytes, _TYPES["uint8"], dst, self._stream())

    def recv(self, shape, dtype, src):
        out = _cupy().empty(shape, dtype)
        self.comm.recv(out.data.ptr, out.nbytes, _TYPES["uint8"], src, self._stream())
        return out

    def split(self, color, key):
        cp = _cupy()
        nccl = _nccl()
        mine = cp.asarray(np.array([color, key, self.rank], np.int64))
        every = self.all_gather(mine).get().reshape(self.size, 3)
        members = sorted((int(k), int(r)) for c, k, r in every if c == color)
        sub_rank = members.index((key, self.rank))
        # Each new group's first member makes its id; everyone gathers all ids (128 bytes).
        uid = np.zeros(_ID_BYTES, np.uint8)
        if sub_rank == 0:
            uid[:] = np.frombuffer(_id_bytes(nccl.get_unique_id()), np.uint8)
        ids = self.all_gather(cp.asarray(uid)).get().reshape(self.size, _ID_BYTES)
        leader = members[0][1]
        comm = _communicator(nccl, len(members), ids[leader].tobytes(), sub_rank)
        return NCCLCommunicator(comm, sub_rank, len(members))


# -- the unique id and its rendezvous --------------------------------------------------------
_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


def _id_bytes(uid) -> bytes:
    """NCCL's unique id as its 128 bytes (CuPy 13 and later give bytes, earlier CuPy a
    tuple of 128 signed chars)."""
    return bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(v & 0xFF for v in uid)


def _communicator(nccl, size: int, uid: bytes, rank: int):
    """``NcclCommunicator(size, uid, rank)`` with the id in the form this CuPy takes."""
    try:
        return nccl.NcclCommunicator(size, uid, rank)
    except TypeError:  # CuPy before 13: a tuple of 128 chars
        return nccl.NcclCommunicator(size, tuple(b - 256 if b > 127 else b for b in uid), rank)


def _over_mpi(uid, rank: int):
    from mpi4py import MPI  # the launcher was mpirun: its world carries the id
    return MPI.COMM_WORLD.bcast(uid, root=0)


def _over_tcp(uid, rank: int, size: int):
    addr = read_variable("LAZYX_DIST_ADDR", DistributedError)
    if addr is None:
        raise DistributedError(
            f"rank {rank} of {size} was not started by mpirun, so the processes meet over "
            f"TCP, and LAZYX_DIST_ADDR (host:port where rank 0 listens) is not set: launch "
            f"with lazyx.launch (it sets it), or set it on every process")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedError(f"LAZYX_DIST_ADDR={addr!r} is not host:port")
    timeout = read_variable("LAZYX_DIST_TIMEOUT", DistributedError)
    timeout = 300.0 if timeout is None else timeout
    deadline = time.monotonic() + timeout
    if rank == 0:
        with socket.create_server((host, int(port)), reuse_port=False) as server:
            server.settimeout(timeout)
            for _ in range(size - 1):
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    raise DistributedError(
                        f"rank 0 waited {timeout:g} s at {addr} (LAZYX_DIST_TIMEOUT) and not "
                        f"every rank of {size} connected") from None
                with conn:
                    conn.sendall(uid)
        return uid
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as conn:
                data = b""
                while len(data) < _ID_BYTES:
                    chunk = conn.recv(_ID_BYTES - len(data))
                    if not chunk:
                        raise ConnectionError("closed early")
                    data += chunk
            return data
        except OSError:
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"rank {rank} could not reach rank 0 at {addr} within {timeout:g} s "
                    f"(LAZYX_DIST_TIMEOUT)") from None
            time.sleep(0.2)


class NCCLBackend(CommunicationBackend):
    name = "nccl"
    device = "gpu"

    def _problem(self) -> str:
        if importlib.util.find_spec("cupy") is None:
            return "CuPy is not installed (pip install cupy-cuda12x nvidia-nccl-cu12)"
        try:
            cp = _cupy()
            nccl = _nccl()
            nccl.get_version()
            if cp.cuda.runtime.getDeviceCount() < 1:
                return "no CUDA GPU is visible"
        except Exception as e:  # CuPy without NCCL, no driver: say which
            return f"CuPy's NCCL cannot be used ({type(e).__name__}: {e})"
        return ""

    def is_available(self) -> bool:
        return not self._problem()

    def unavailable_reason(self) -> str:
        return self._problem()

    def init(self, strict: bool):
        problem = self._problem()
        if problem:
            raise DistributedError(problem)
        world = launcher_world()
        if world is None and not strict:
            return None
        rank, size, who = world if world is not None else (0, 1, None)
        cp, nccl = _cupy(), _nccl()
        cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
        uid = _id_bytes(nccl.get_unique_id()) if rank == 0 else None
        if size > 1:
            mpi = who not in ("lazyx.launch", "torchrun") and importlib.util.find_spec("mpi4py")
            uid = _over_mpi(uid, rank) if mpi else _over_tcp(uid, rank, size)
        return NCCLCommunicator(_communicator(nccl, size, uid, rank), rank, size)


@hookimpl
def lazyx_distributed_backends():
    return [NCCLBackend()]
