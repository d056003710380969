"""``lazyx.core.distributed``: collective communication between processes, as
``mlx.core.distributed``.

The flow of a program::

    import lazyx.core as mx
    group = mx.distributed.init()            # once per process
    g = mx.distributed.all_sum(grads) / group.size()
    mx.eval(g)                               # the all-reduce runs here

1. :func:`init` picks a communication backend (``lazyx.backends.distributed``):
   ``backend="any"`` tries, as MLX does, ``nccl`` first when the default device is
   a GPU, then the others (``mpi``); a named one is tried alone. The first backend
   that starts gives the *world* group, kept for later calls (``init`` returns the
   same :class:`Group`) and used by every collective whose ``group`` is None. A
   process started on its own (no launcher) gets a size-1 group with no MPI or
   NCCL behind it; ``strict=True`` asks for a real backend instead, and raises a
   :class:`~lazyx.backends.distributed.DistributedError` naming every backend
   tried and why it could not start.
2. A collective (``all_sum``, ``all_max``, ``all_min``, ``all_gather``,
   ``sum_scatter``, ``send``, ``recv``, ``recv_like``) checks its arguments and
   adds ONE lazy node (:class:`AllReduce`, :class:`AllGather`,
   :class:`ReduceScatter`, :class:`Send`, :class:`Recv`) whose ``group``
   parameter is the group. On a size-1 group the reductions and the gather return
   their input, as MLX does (no node). The node's stream is on the device the
   group's backend communicates (the CPU for ``mpi``, the GPU for ``nccl``);
   ``stream=`` on another device, or an input computed on the GPU for a CPU
   group, is a :class:`~lazyx.errors.DeviceError` naming the fix, never a silent
   copy between devices.
3. When the graph is evaluated, the node's kernel (its ``eval_cpu`` or
   ``eval_gpu``) hands the input buffer to the group's communicator, which
   returns the output buffer. The kernel is the primitive's own rather than a
   device backend's table entry because the *group* decides how the bytes move
   (one program may hold an MPI group and an NCCL group): the communicator is the
   backend here.

Ordering. Collectives must be issued by every process of a group in the same
order. The scheduler runs the nodes of an evaluation on one thread in a
deterministic topological order (a depth-first walk from the arrays asked for),
and ``compile`` replays its tape in the traced order, so identical programs issue
identical sequences. Two collectives are never merged by ``compile``'s
common-subexpression pass (:meth:`Collective.is_equivalent` is identity: if one
process merged two ``all_sum`` of the same array and another did not, they would
disagree on the number of messages), and none is fused: a collective is one node
beside the fused element-wise code.

Gradients follow MLX, whose convention is that a value every process holds (the
result of ``all_sum``, ``all_gather``, ``all_max``) enters the loss once: the vjp of
``all_sum`` passes the cotangent through (MLX's ``AllReduce::vjp``), of
``all_gather`` it is this rank's slice of the cotangent, of ``all_max`` and
``all_min`` the cotangent where the input equals the result (zero elsewhere), of
``sum_scatter`` (whose results differ per process) the ``all_gather`` of the
cotangents. jvps are the same collective of the tangents (for ``all_max``/``all_min``,
the ``all_sum`` of the tangents where each input equals the result). ``send`` and
``recv`` carry no gradient. Batching runs the same collective on the batched
array (the gathers with the batch moved off the first axis).

``recv`` inside ``compile``: a ``recv`` reads no input, so the trace takes it for a
constant, received once; call it outside compiled functions.
"""

from __future__ import annotations

import operator
from typing import Annotated, Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx import registry
from lazyx.arguments import as_array
from lazyx.backend import backend_for
from lazyx.array import array, lazy
from lazyx.backends.distributed import (CommunicationBackend, Communicator, DistributedError,
                                        LocalCommunicator, launcher_world)
from lazyx.device import current_stream, default_stream, to_stream
from lazyx.device_types import Device, DeviceType
from lazyx.errors import ArgumentError, DeviceError, DtypeError, ShapeError
from lazyx.examples import example, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive, Range, Shape

__all__ = ["Group", "init", "is_available", "all_sum", "all_max", "all_min", "all_gather",
           "sum_scatter", "send", "recv", "recv_like", "DistributedError"]

_DEVICE = {"cpu": DeviceType.cpu, "gpu": DeviceType.gpu}


# -- groups ----------------------------------------------------------------------------
class Group:
    """A group of processes that communicate: this process is ``rank()`` of ``size()``.

    Made by :func:`init` (the world) and :meth:`split`; not constructed directly.
    """

    __slots__ = ("_comm", "_device")

    def __init__(self, comm: Communicator):
        if not isinstance(comm, Communicator):
            raise DtypeError(f"[Group] Groups come from lazyx.core.distributed.init() and "
                             f"Group.split(), not from {comm!r}.")
        self._comm = comm
        device = _DEVICE.get(comm.device)
        if device is None:
            raise DistributedError(f"[Group] The {comm.backend} communicator serves device "
                                   f"{comm.device!r}; a communicator serves 'cpu' or 'gpu'.")
        self._device = device

    def rank(self) -> int:
        """The rank of this process in the group."""
        return self._comm.rank

    def size(self) -> int:
        """The number of processes in the group."""
        return self._comm.size

    @property
    def backend(self) -> str:
        """The communication backend's name (``"mpi"``, ``"nccl"``, ``"local"``)."""
        return self._comm.backend

    def split(self, color: int, key: int = -1) -> "Group":
        """Split the group into subgroups by ``color``: the processes that give the
        same color form one group, ranked by ``key`` (a negative key keeps the order
        of the ranks in this group). Every process of the group must call it.

        Args:
            color (int): A value to group processes into subgroups (>= 0).
            key (int, optional): The order of this process in its subgroup.

        Returns:
            Group: This process's subgroup.
        """
        color = _int(color, "color", "split")
        key = _int(key, "key", "split")
        if color < 0:
            raise ArgumentError(f"[split] color must be >= 0, got {color}.")
        if self._comm.size == 1:
            raise DistributedError("Cannot split the distributed group further.")
        return Group(self._comm.split(color, self._comm.rank if key < 0 else key))

    def __repr__(self) -> str:
        return (f"<lazyx.core.distributed.Group rank {self._comm.rank} of {self._comm.size} "
                f"({self._comm.backend})>")


#: The groups :func:`init` made, by backend name ("any": the world group).
_groups: dict = {}


def _backends() -> list[CommunicationBackend]:
    """Every plugin's communication backends, in registration order."""
    out = []
    for got in registry.plugin_manager.hook.lazyx_distributed_backends():
        for b in got or ():
            if not isinstance(b, CommunicationBackend):
                raise DistributedError(f"A lazyx_distributed_backends hook returned {b!r}, "
                                       f"which is not a CommunicationBackend.")
            out.append(b)
    # pluggy calls the most recently registered plugin first: back to loading order.
    return out[::-1]


def _by_name(op: str, backend) -> list[CommunicationBackend]:
    known = _backends()
    if backend == "any":
        gpu_first = mx.default_device() == mx.gpu
        return sorted(known, key=lambda b: (b.device != "gpu") if gpu_first else 0)
    found = [b for b in known if b.name == backend]
    if not found:
        raise ArgumentError(f"[{op}] Unknown backend {backend!r}: the valid values are 'any' "
                            f"and " + ", ".join(repr(b.name) for b in known) + ".")
    return found


def is_available(backend: str = "any") -> bool:
    """Whether a communication backend is available: its library is installed (not
    whether processes were launched; ``init(strict=True)`` says that).

    Args:
        backend (str, optional): A backend's name, or ``"any"``. Default: ``"any"``.
    """
    return any(b.is_available() for b in _by_name("is_available", backend))


def init(strict: bool = False, backend: str = "any") -> Group:
    """Start the communication backend and return the group of all the launched
    processes (the same group on every later call).

    Args:
        strict (bool, optional): When False, a process no backend can serve gets a
            group of size 1; when True that is an error. Default: ``False``.
        backend (str, optional): ``"mpi"``, ``"nccl"`` (or a plugin's backend), or
            ``"any"``: the first that starts, NCCL first when the default device is a
            GPU. Default: ``"any"``.

    Returns:
        Group: The group of every launched process.

    Raises:
        DistributedError: ``strict`` and no backend could start (the message says why
            for each), or the launcher started several processes that no backend
            can join.
    """
    if not isinstance(backend, str):
        raise DtypeError(f"[init] backend must be a string, got {backend!r}.")
    got = _groups.get(backend)
    if got is not None:
        return got
    tried = []
    for b in _by_name("init", backend):
        if not b.is_available():
            tried.append(f"{b.name}: {b.unavailable_reason()}")
            continue
        cached = _groups.get(b.name)
        if cached is not None:
            group = cached
            break
        try:
            comm = b.init(bool(strict))
        except DistributedError as e:
            tried.append(f"{b.name}: {e}")
            continue
        if comm is None:
            tried.append(f"{b.name}: this process was not started by a launcher")
            continue
        group = _groups[b.name] = Group(comm)
        break
    else:
        world = launcher_world()
        if strict or (world is not None and world[1] > 1):
            why = (f"the launcher ({world[2]}) started {world[1]} processes, and "
                   if world is not None and world[1] > 1 else "strict=True, and ")
            raise DistributedError(
                f"[init] No communication backend could start: {why}no backend could join "
                f"them ({'; '.join(tried) or 'no backend is registered'}). Install mpi4py "
                f"and launch with mpirun (or lazyx.launch), or use init(strict=False) in a "
                f"single process.")
        group = Group(LocalCommunicator())
    _groups.setdefault("any", group)
    _groups[backend] = group
    return group


def _world() -> Group:
    group = _groups.get("any")
    return group if group is not None else init()


# -- argument checks ------------------------------------------------------------------
def _int(value, what: str, op: str) -> int:
    if type(value) is int:
        return value
    if not isinstance(value, (array, bool)) and hasattr(value, "__index__"):
        return operator.index(value)
    raise DtypeError(f"[{op}] {what} must be an integer, got {value!r} ({type(value).__name__}).")


def _group(group, op: str) -> Group:
    if group is None:
        return _world()
    if type(group) is not Group:
        raise DtypeError(f"[{op}] group must be a lazyx.core.distributed.Group or None, got "
                         f"{group!r}.")
    return group


def _stream(g: Group, stream, op: str):
    """The stream of a collective on ``g``: ``stream``, which must be on the group's
    device, or the current stream if it is there, else that device's default one."""
    if stream is None:
        s = current_stream()
        return s if s.device.type is g._device else default_stream(Device(g._device))
    s = to_stream(stream)
    if s.device.type is not g._device:
        raise DeviceError(
            f"[{op}] The {g.backend} group communicates {g._device.name} buffers, and "
            f"stream={stream!r} is on the {s.device.type.name}: pass a {g._device.name} stream "
            f"(or none), or use a group of a backend for the {s.device.type.name} "
            f"(init(backend={'nccl' if s.device.type is DeviceType.gpu else 'mpi'!r})).")
    return s


def _on_device(x: array, g: Group, op: str) -> None:
    """Refuse an input that lives (or will be computed) on the GPU for a CPU group:
    the runtime would copy it to the host silently."""
    if g._device is not DeviceType.cpu:
        return
    d = x._data
    on_gpu = (not isinstance(d, np.ndarray)) if d is not None \
        else x._prim.stream.device.type is not DeviceType.cpu
    if on_gpu:
        raise DeviceError(
            f"[{op}] The input (shape {x._shape}, {x._dtype.name}) is on the gpu, and the "
            f"{g.backend} group communicates cpu buffers: compute it on the cpu "
            f"(with mx.stream(mx.cpu)), copy it there explicitly "
            f"(mx.contiguous(x, stream=mx.cpu)), "
            f"or use a GPU group (mx.distributed.init(backend='nccl')).")


def _prepare(x, group, stream, op: str):
    """``(x as an array, its group)``, or ``(x, None)`` when the group has one process."""
    x = as_array(x)
    g = _group(group, op)
    if g._comm.size == 1:
        return x, None, None
    _on_device(x, g, op)
    return x, g, _stream(g, stream, op)


def _peer(rank, g: Group, what: str, op: str) -> int:
    rank = _int(rank, what, op)
    n = g._comm.size
    if not 0 <= rank < n:
        raise ArgumentError(f"[{op}] {what}={rank} is not a rank of the group (rank "
                            f"{g._comm.rank} of {n}, {g.backend}): use a rank in [0, {n}).")
    if rank == g._comm.rank:
        raise ArgumentError(f"[{op}] {what}={rank} is this process's own rank in the group "
                            f"({g.backend}, size {n}): a process cannot {op} to itself.")
    return rank


# -- primitives -------------------------------------------------------------------------
class Collective(Primitive):
    """A communication node: its kernel hands the input buffers to ``group``'s
    communicator (on the CPU or the GPU, whichever the group serves)."""

    __slots__ = ("group",)
    group: Group

    def is_equivalent(self, other) -> bool:
        # Never merged: every process must issue the same collectives (module docstring).
        return other is self

    def eval_cpu(self, inputs):
        return self.run(self.group._comm, inputs)

    def eval_gpu(self, inputs):
        return self.run(self.group._comm, inputs)

    def run(self, comm: Communicator, inputs):
        raise NotImplementedError


class AllReduce(Collective):
    """The element-wise sum, max or min of input 0 over the group."""

    __slots__ = ("op",)
    op: Literal["sum", "max", "min"]
    arity = 1

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def run(self, comm, inputs):
        return comm.all_reduce(inputs[0], self.op)

    def vjp(self, primals, cotangents, argnums, outputs):
        cot = cotangents[0]
        if self.op == "sum":
            return [cot]
        s = self.stream
        hit = mx.equal(primals[0], outputs[0], stream=s)
        return [mx.where(hit, cot, mx.zeros_like(cot, stream=s), stream=s)]

    def jvp(self, primals, tangents, argnums):
        t = tangents[0]
        if self.op == "sum":
            return [_all_reduce(t, "sum", self.group, self.stream)]
        s = self.stream
        out = _all_reduce(primals[0], self.op, self.group, s)
        hit = mx.equal(primals[0], out, stream=s)
        return [_all_reduce(mx.where(hit, t, mx.zeros_like(t, stream=s), stream=s), "sum",
                            self.group, s)]

    def vmap(self, inputs, axes):
        return [_all_reduce(inputs[0], self.op, self.group, self.stream)], [axes[0]]


class AllGather(Collective):
    """Input 0 of every process concatenated along axis 0 in rank order (a 0-d input
    gives one entry per process)."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        shape = inputs[0].shape
        n = self.group._comm.size
        return [(n,) if not shape else (n * shape[0],) + tuple(shape[1:])]

    def run(self, comm, inputs):
        return comm.all_gather(inputs[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        comm = self.group._comm
        part = mx.split(cotangents[0], comm.size, axis=0, stream=self.stream)[comm.rank]
        if not primals[0]._shape:
            part = mx.reshape(part, (), stream=self.stream)
        return [part]

    def jvp(self, primals, tangents, argnums):
        return [_all_gather(tangents[0], self.group, self.stream)]

    def vmap(self, inputs, axes):
        return [_all_gather(_batch_second(inputs[0], axes[0], self.stream), self.group,
                            self.stream)], [1]


class ReduceScatter(Collective):
    """The sum of input 0 over the group, split along axis 0 into ``size`` parts:
    process ``r`` gets part ``r``."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        shape = inputs[0].shape
        return [(shape[0] // self.group._comm.size,) + tuple(shape[1:])]

    def run(self, comm, inputs):
        return comm.reduce_scatter(inputs[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        return [_all_gather(cotangents[0], self.group, self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [_sum_scatter(tangents[0], self.group, self.stream)]

    def vmap(self, inputs, axes):
        return [_sum_scatter(_batch_second(inputs[0], axes[0], self.stream), self.group,
                             self.stream)], [1]


class Send(Collective):
    """Sends input 0 to process ``dst``; its output is the input (evaluating it sends)."""

    __slots__ = ("dst",)
    dst: Annotated[int, Range(0)]
    arity = 1
    differentiable = False

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def run(self, comm, inputs):
        comm.send(inputs[0], self.dst)
        return inputs[0]

    def vjp(self, primals, cotangents, argnums, outputs):
        return [None]

    def jvp(self, primals, tangents, argnums):
        return [None]

    def vmap(self, inputs, axes):
        return [_send(inputs[0], self.dst, self.group, self.stream)], [axes[0]]


class Recv(Collective):
    """Receives an array of ``shape`` and ``dtype`` from process ``src`` (no inputs)."""

    __slots__ = ("shape", "dtype", "src")
    shape: Shape
    dtype: dt.Dtype
    src: Annotated[int, Range(0)]
    arity = 0
    differentiable = False
    shapeless = False

    def output_shapes(self, inputs):
        return [self.shape]

    def output_dtypes(self, inputs):
        return [self.dtype]

    def run(self, comm, inputs):
        return comm.recv(self.shape, self.dtype.np, self.src)


    def vjp(self, primals, cotangents, argnums, outputs):
        return [None] * len(argnums)

    def jvp(self, primals, tangents, argnums):
        return [None]

    def vmap(self, inputs, axes):  # no inputs, so never batched: the same message
        return [_recv(self.shape, self.dtype, self.src, self.group, self.stream)], [None]


def _batch_second(x: array, axis: int, stream) -> array:
    """A batched input of a gather or scatter with its batch axis at 1, so that axis 0
    stays the one the collective concatenates (a batch of 0-d inputs gets an axis 0
    of length 1, which the gather turns into one entry per process)."""
    if x.ndim == 1:
        return mx.expand_dims(x, 0, stream=stream)
    return x if axis == 1 else mx.moveaxis(x, axis, 1, stream=stream)


# -- node builders (no checks: the op functions and the rules call them) -----------------
def _all_reduce(x: array, op: str, g: Group, s) -> array:
    return lazy(x._shape, x._dtype, AllReduce(s, g, op), (x,))


def _all_gather(x: array, g: Group, s) -> array:
    p = AllGather(s, g)
    return lazy(p.output_shapes((x,))[0], x._dtype, p, (x,))


def _sum_scatter(x: array, g: Group, s) -> array:
    p = ReduceScatter(s, g)
    return lazy(p.output_shapes((x,))[0], x._dtype, p, (x,))


def _send(x: array, dst: int, g: Group, s) -> array:
    return lazy(x._shape, x._dtype, Send(s, g, dst), (x,))


def _recv(shape: tuple, dtype, src: int, g: Group, s) -> array:
    return lazy(shape, dtype, Recv(s, g, shape, dtype, src), ())


# -- the ops ---------------------------------------------------------------------------
def all_sum(x, *, group: Group | None = None, stream=None) -> array:
    """All reduce sum: the sum of the ``x`` arrays of every process in the group.

    Args:
        x (array): Input array (the same shape and dtype on every process).
        group (Group, optional): The processes that take part; None: the world group
            (:func:`init`). Default: ``None``.
        stream (Stream, optional): Stream or device, on the device the group's backend
            communicates (the CPU for ``mpi``, the GPU for ``nccl``). Default: ``None``.

    Returns:
        array: The sum of all ``x`` arrays (``x`` itself for a group of one).
    """
    x, g, s = _prepare(x, group, stream, "all_sum")
    return x if g is None else _all_reduce(x, "sum", g, s)


def all_max(x, *, group: Group | None = None, stream=None) -> array:
    """All reduce max: the element-wise maximum of the ``x`` arrays of every process.

    Args and result as :func:`all_sum`.
    """
    x, g, s = _prepare(x, group, stream, "all_max")
    if g is None:
        return x
    _ordered(x, "all_max")
    return _all_reduce(x, "max", g, s)


def all_min(x, *, group: Group | None = None, stream=None) -> array:
    """All reduce min: the element-wise minimum of the ``x`` arrays of every process.

    Args and result as :func:`all_sum`.
    """
    x, g, s = _prepare(x, group, stream, "all_min")
    if g is None:
        return x
    _ordered(x, "all_min")
    return _all_reduce(x, "min", g, s)


def _ordered(x: array, op: str) -> None:
    if x._dtype.kind == "c":
        raise DtypeError(f"[{op}] Complex arrays have no order: {op} takes real or integer "
                         f"arrays, got {x._dtype.name} of shape {x._shape}.")


def all_gather(x, *, group: Group | None = None, stream=None) -> array:
    """Gather the ``x`` arrays of every process, concatenated along the first axis in
    rank order (a 0-d ``x`` gives one entry per process).

    Args:
        x (array): Input array (the same shape and dtype on every process).
        group, stream: As :func:`all_sum`.

    Returns:
        array: Of shape ``(size * x.shape[0], *x.shape[1:])``.
    """
    x, g, s = _prepare(x, group, stream, "all_gather")
    return x if g is None else _all_gather(x, g, s)


def sum_scatter(x, *, group: Group | None = None, stream=None) -> array:
    """Sum ``x`` over the processes and give each its part of the first axis: the
    result is ``all_sum(x)[rank * k:(rank + 1) * k]`` with ``k = x.shape[0] //
    group.size()``, computed with one reduce-scatter.

    Args:
        x (array): Input array; ``x.shape[0]`` must be divisible by the group size.
        group, stream: As :func:`all_sum`.

    Returns:
        array: Of shape ``(x.shape[0] // size, *x.shape[1:])``.
    """
    x, g, s = _prepare(x, group, stream, "sum_scatter")
    if g is None:
        return x
    n = g._comm.size
    if not x._shape or x._shape[0] % n:
        raise ShapeError(f"[sum_scatter] The first axis of x (shape {x._shape}) must be "
                         f"divisible by the group size {n}: pad or reshape it.")
    return _sum_scatter(x, g, s)


def send(x, dst: int, *, group: Group | None = None, stream=None) -> array:
    """Send ``x`` to the process of rank ``dst`` in the group.

    Args:
        x (array): Input array.
        dst (int): The rank of the destination process in the group.
        group, stream: As :func:`all_sum`.

    Returns:
        array: An array equal to ``x``; evaluating it performs the send.
    """
    x = as_array(x)
    g = _group(group, "send")
    if g._comm.size == 1:
        raise ArgumentError("Cannot send to a singleton group.")
    dst = _peer(dst, g, "dst", "send")
    _on_device(x, g, "send")
    return _send(x, dst, g, _stream(g, stream, "send"))


def recv(shape, dtype, src: int, *, group: Group | None = None, stream=None) -> array:
    """Receive an array of ``shape`` and ``dtype`` from the process of rank ``src``.

    Args:
        shape (tuple(int)): The shape of the array sent.
        dtype (Dtype): Its dtype.
        src (int): The rank of the sending process in the group.
        group, stream: As :func:`all_sum`.

    Returns:
        array: The array received.
    """
    g = _group(group, "recv")
    if g._comm.size == 1:
        raise ArgumentError("Cannot recv from a singleton group.")
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(_int(n, "shape entry", "recv") for n in shape)
    except TypeError:
        raise DtypeError(f"[recv] shape must be a sequence of integers, got {shape!r}.") from None
    if any(n < 0 for n in shape):
        raise ShapeError(f"[recv] shape {shape} has a negative dimension.")
    dtype = dt.to_dtype(dtype)
    src = _peer(src, g, "src", "recv")
    return _recv(shape, dtype, src, g, _stream(g, stream, "recv"))


def recv_like(x, src: int, *, group: Group | None = None, stream=None) -> array:
    """Receive from the process of rank ``src`` an array of ``x``'s shape and dtype.

    Args:
        x (array): An array of the shape and dtype to receive (its values are not used).
        src (int): The rank of the sending process in the group.
        group, stream: As :func:`all_sum`.

    Returns:
        array: The array received.
    """
    x = as_array(x)
    return recv(x._shape, x._dtype, src, group=group, stream=stream)


PRIMITIVES = [AllReduce, AllGather, ReduceScatter, Send, Recv]

_FUNCTIONS = (init, is_available, all_sum, all_max, all_min, all_gather, sum_scatter, send,
              recv, recv_like)
OPS = {f"distributed.{f.__name__}": f for f in _FUNCTIONS}
OPS["distributed.Group"] = Group
OPS["distributed.DistributedError"] = DistributedError

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------------
class _Loopback(LocalCommunicator):
    """The examples' group of one process that receives what it sent: the
    registry-wide test runs in one process, where a real size-1 group can neither
    send nor receive (as in MLX). ``recv`` gives the last array sent (or primed)
    with that shape and dtype."""

    backend = "loopback"

    def __init__(self):
        self.sent: dict = {}

    def send(self, x, dst):
        self.sent[(x.shape, x.dtype)] = x.copy()

    def recv(self, shape, dtype, src):
        return self.sent[(tuple(shape), np.dtype(dtype))].copy()


def _local_examples():
    # Every node on the stream current when the example runs (the registry-wide test runs
    # them on the CPU, the CUDA tests under mx.stream(mx.gpu)): one-process groups serve
    # either device's buffers.
    one = Group(LocalCommunicator())
    loop = Group(_Loopback())
    here = current_stream
    primed = uniform((2, 3))

    def recv_example():
        def fn(x):
            # primed with a buffer of the device the node runs on, as a real group receives
            s = here()
            loop._comm.sent[(primed.shape, primed.dtype)] = (
                primed if s.device.type is DeviceType.cpu
                else backend_for(s.device.type).from_host(primed))
            return _recv(x.shape, x.dtype, 0, loop, s)
        return fn, [np.zeros((2, 3))]

    return [
        (AllReduce, example(lambda x: _all_reduce(x, "sum", one, here()), uniform((2, 3)))),
        (AllReduce, example(lambda x: _all_reduce(x, "max", one, here()), uniform((3,)))),
        (AllReduce, example(lambda x: _all_reduce(x, "min", one, here()), uniform((2, 2)))),
        (AllGather, example(lambda x: _all_gather(x, one, here()), uniform((2, 3)))),
        (AllGather, example(lambda x: _all_gather(x, one, here()), uniform(()))),
        (ReduceScatter, example(lambda x: _sum_scatter(x, one, here()), uniform((4, 2)))),
        (Send, example(lambda x: _send(x, 0, loop, here()), uniform((2, 3)))),
        (Recv, recv_example),
    ]


@hookimpl
def lazyx_examples():
    return _local_examples()
