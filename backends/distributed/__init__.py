"""Communication backends of ``lazyx.core.distributed``: what moves bytes between processes.

``lazyx.core.distributed`` (``lazyx.plugins.distributed``) is a pack of collective
primitives; their kernels call a :class:`Communicator`, which a
:class:`CommunicationBackend` makes. The flow:

1. every plugin's ``lazyx_distributed_backends`` hook (see :mod:`lazyx.hookspecs`)
   returns :class:`CommunicationBackend` objects; lazyx's own are ``mpi``
   (:mod:`.mpi`, mpi4py on NumPy buffers) and ``nccl`` (:mod:`.nccl`, NCCL through
   CuPy on GPU buffers). A third party adds one the same way;
2. ``distributed.init(strict, backend)`` asks them, in order, for a communicator:
   :meth:`CommunicationBackend.init` returns one, returns None when the process was
   not started for that backend and ``strict`` is False (a plain ``python x.py``:
   lazyx then gives a size-1 :class:`LocalCommunicator`, with no MPI start-up), or
   raises :class:`DistributedError` saying why it cannot;
3. a collective's kernel calls the communicator of its group with the input buffer
   (a NumPy array for a ``cpu`` communicator, a CuPy array for a ``gpu`` one) and
   returns the output buffer. The op functions check, when the node is built, that
   the input lives on the communicator's device, so a kernel never copies between
   devices.

How many processes there are and which one this is comes from the launcher's
environment (:func:`launcher_world`): ``LAZYX_RANK``/``LAZYX_WORLD_SIZE``
(``lazyx.launch``), ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (Open MPI's
``mpirun``), ``PMI_RANK``/``PMI_SIZE`` (MPICH, Intel MPI, Slurm) and
``RANK``/``WORLD_SIZE`` (``torchrun``), first pair found wins.

This package imports no communication library: each backend imports its own
(mpi4py, CuPy) only when it is asked to start.
"""

from __future__ import annotations

from lazyx.environment import read_variable
from lazyx.errors import LazyxError

__all__ = ["DistributedError", "Communicator", "LocalCommunicator", "CommunicationBackend",
           "launcher_world", "LAUNCHER_VARIABLES"]


class DistributedError(LazyxError, RuntimeError):
    """A communication backend cannot start, or a collective failed between processes."""


#: The launchers whose (rank, world size) variables lazyx reads, in the order it looks.
LAUNCHER_VARIABLES = (
    ("LAZYX_RANK", "LAZYX_WORLD_SIZE", "lazyx.launch"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_RANK", "PMI_SIZE", "a PMI launcher (MPICH, Intel MPI, Slurm)"),
    ("RANK", "WORLD_SIZE", "torchrun"),
)


def launcher_world(environ=None):
    """``(rank, size, launcher)`` from the first launcher variable pair set in the
    environment, or None when none is (a process started on its own). A pair with a
    rank outside ``[0, size)`` is a :class:`DistributedError` naming the variables."""
    err = DistributedError
    # Each read names its variable literally (tests/test_environment_variables.py scans them).
    values = [
        (read_variable("LAZYX_RANK", err, environ),
         read_variable("LAZYX_WORLD_SIZE", err, environ)),
        (read_variable("OMPI_COMM_WORLD_RANK", err, environ),
         read_variable("OMPI_COMM_WORLD_SIZE", err, environ)),
        (read_variable("PMI_RANK", err, environ), read_variable("PMI_SIZE", err, environ)),
        (read_variable("RANK", err, environ), read_variable("WORLD_SIZE", err, environ)),
    ]
    for (rank_name, size_name, who), (rank, size) in zip(LAUNCHER_VARIABLES, values):
        if size is None:
            continue
        size = int(size)
        if rank is None or int(rank) != rank or not 0 <= rank < size:
            raise DistributedError(
                f"{size_name}={size} is set (by {who}), but {rank_name}={rank!r} is not a rank "
                f"in [0, {size}): set both, or neither.")
        return int(rank), size, who
    return None


class Communicator:
    """One process's end of a group of processes: its ``rank`` among ``size``.

    A backend subclasses it. Buffers are the ``device``'s (NumPy arrays for
    ``"cpu"``, CuPy arrays for ``"gpu"``), C-contiguous or not; every method returns
    a new buffer and leaves its input as it is. ``op`` is ``"sum"``, ``"max"`` or
    ``"min"``. Collectives must be called by every process of the group in the same
    order, with the same shapes and dtypes (the scheduler guarantees the order for
    identical programs; see ``lazyx.plugins.distributed``).
    """

    #: The backend's name (``"mpi"``), shown in errors and ``repr(group)``.
    backend: str = "?"
    #: The device type whose buffers it communicates: ``"cpu"`` or ``"gpu"``.
    device: str = "cpu"
    rank: int = 0
    size: int = 1

    def all_reduce(self, x, op: str):
        """The element-wise ``op`` of ``x`` over the group, on every process."""
        raise NotImplementedError

    def all_gather(self, x):
        """The ``x`` of every process concatenated along axis 0, in rank order (a 0-d
        ``x`` gives shape ``(size,)``)."""
        raise NotImplementedError

    def reduce_scatter(self, x):
        """The sum of ``x`` over the group, split in ``size`` equal parts along axis 0;
        process ``r`` gets part ``r``."""
        raise NotImplementedError

    def send(self, x, dst: int) -> None:
        """Send ``x`` to process ``dst`` (returns once ``x`` may be reused)."""
        raise NotImplementedError

    def recv(self, shape: tuple, dtype, src: int):
        """Receive an array of ``shape`` and NumPy ``dtype`` from process ``src``."""
        raise NotImplementedError

    def split(self, color: int, key: int) -> "Communicator":
        """The communicator of the processes that gave the same ``color``, ranked by
        ``key`` (then by rank here). Collective over this group."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.backend} communicator: rank {self.rank} of {self.size}>"


class LocalCommunicator(Communicator):
    """The group of one process (``init()`` in a process started on its own): every
    collective returns its input's values."""

    backend = "local"

    def all_reduce(self, x, op):
        return x.copy()

    def all_gather(self, x):
        return x.reshape(1) if x.ndim == 0 else x.copy()

    def reduce_scatter(self, x):
        return x.copy()

    def send(self, x, dst):
        raise DistributedError("Cannot send to a singleton group.")

    def recv(self, shape, dtype, src):
        raise DistributedError("Cannot recv from a singleton group.")

    def split(self, color, key):
        raise DistributedError("Cannot split the distributed group further.")


class CommunicationBackend:
    """A way of making communicators, returned by a plugin's
    ``lazyx_distributed_backends`` hook.

    Attributes:
        name: what ``init(backend=...)`` calls it (``"mpi"``).
        device: the device type its communicators serve: ``"cpu"`` or ``"gpu"``.
    """

    name: str = "?"
    device: str = "cpu"

    def is_available(self) -> bool:
        """Whether its library is installed (cheap: imports nothing heavy)."""
        return False

    def unavailable_reason(self) -> str:
        """Why :meth:`is_available` is False, with the fix, in words."""
        return ""

    def init(self, strict: bool) -> Communicator | None:
        """This process's communicator of the launched world.

        Returns None when the process was not started for this backend and
        ``strict`` is False; raises :class:`DistributedError` saying why when it
        cannot start (``strict`` or not)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<CommunicationBackend {self.name!r} ({self.device})>"
