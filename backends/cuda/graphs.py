"""CUDA graphs: a compiled call replays its whole plan as one graph launch.

A call of a ``compile``\\ d function is one ``CompiledCall`` node whose plan launches
every kernel of the traced function: generated element-wise kernels, cuBLAS and
cuDNN calls, lazyx's own CUDA kernels. Each launch costs host time (CuPy's launch
path, 10–16 µs on the H200's host), and for a small model that host time *is* the
step. So the CUDA backend's kernel for ``CompiledCall`` records the plan once with
CUDA stream capture (CuPy's ``Stream.begin_capture``) and then replays it: per call,
one upload of a small copy table and one graph launch, whatever the number of arrays.

Per compiled function and input signature (shapes and dtypes; the device):

1. **First call**: the plan runs as usual. It builds what a capture must not build:
   NVRTC kernels, cuBLAS and cuDNN plans, workspaces. (An eager graph replayed by
   ``lazyx.transforms.replay`` skips this: its nodes ran one by one just before, which
   built all of it; its entry says ``prebuilt``.)
2. **Second call**: capture. Static input buffers are allocated; the graph is a copy
   kernel (the call's inputs into the static inputs), the plan, and a copy kernel
   (the static outputs into the call's fresh buffers), both copy kernels reading
   their rows from a device table (:class:`_Graph`). The plan runs on a capture
   stream, its allocations served by a memory pool that belongs to the graph (so no
   buffer the graph writes is ever handed to anyone else, and the pool's
   stream-ordered reuse inside the plan is the same on every replay). The graph is
   then launched for this call.
3. **Later calls**: fill the table's row addresses (the inputs' buffers, fresh
   output buffers: the caller owns its results, the next replay writes other ones),
   upload it, launch the graph.

All of it is queued on the current stream: nothing waits for the GPU. A plan that
cannot be captured (a kernel that reads a value back to the host, a library call
that synchronises) fails its capture; that signature is then marked and runs its
plan as before, never a wrong result. A plan of fewer than :data:`MIN_NODES` nodes
is not worth a graph (its copies would cost more than its launches). While a
transform retains the graph (``grad`` through a compiled call evaluates inside a
trace), calls run their plan. ``LAZYX_CUDA_GRAPHS=0`` turns graphs off.

``stats`` counts captures, replays and plans that could not be captured.
"""

from __future__ import annotations

import numpy as np

from lazyx import backend as _backend
from lazyx import scheduler as _scheduler
from lazyx.environment import read_variable
from lazyx.transforms.compile import CompiledCall
from lazyx.transforms.compile import _donors as _compile_donors

from . import gemm as _gemm
from . import runtime as _rt

__all__ = ["KERNELS", "ENABLED", "MIN_NODES", "MAX_GRAPHS", "stats"]

#: Whether compiled calls replay CUDA graphs (``LAZYX_CUDA_GRAPHS=0``: no).
ENABLED = read_variable("LAZYX_CUDA_GRAPHS") != "0"  # (checked: 0 or 1)
#: Plans with fewer nodes run as they are.
MIN_NODES = 3
#: Graphs kept per compiled function (one per input signature; the oldest goes first).
MAX_GRAPHS = 8

stats = {"captures": 0, "replays": 0, "uncapturable": 0, "donated": 0}
#: Why the last plan that could not be captured failed (for ``lazyx info`` and tests).
last_failure = ""


class _Graph:
    """One captured plan: the graph, its static buffers, its private memory pool and
    the copy table of its calls.

    The graph begins and ends with one copy kernel each (:data:`_COPY`), which read
    their (source, destination, bytes) rows from ``table``, a device buffer: rows
    ``[0, n_in)`` copy the call's inputs into the static inputs, the rest copy the
    static outputs (and the static extremes of the plan's index checks) into the
    call's fresh buffers. A call fills a pinned host copy of the table (a ring of
    them, so that the host never writes one the GPU may still read) and queues one
    upload before the graph: two CUDA calls per call, whatever the number of arrays.
    """

    __slots__ = ("graph", "ins", "outs", "single", "pool", "stream", "tables", "checks",
                 "statics", "table", "n_in", "ring", "turn")

    def __init__(self, graph, ins, outs, single, pool, stream, tables, checks, table):
        self.graph, self.ins, self.outs, self.single = graph, ins, outs, single
        self.pool, self.stream, self.tables = pool, stream, tables
        # The index checks the plan queues (.kernels): (check, its static device extremes).
        self.checks = checks
        # What the last copy kernel copies out, in table order: outputs, then extremes.
        self.statics = outs + [ext for _, ext in checks]
        self.table = table
        self.n_in = len(ins)
        self.ring = []
        self.turn = 0
        # Every call copies every input: a buffer seen before need not hold the same
        # bytes (an eager kernel may have written its output into it: donation).

    def slot(self):
        """A pinned host table no queued upload still reads, its fixed columns filled."""
        cp = _rt.cp
        if len(self.ring) < RING:
            rows = self.table.shape[0]
            mem = cp.cuda.alloc_pinned_memory(max(rows * 24, 8))
            host = np.frombuffer(mem, np.int64, rows * 3).reshape(rows, 3)
            for r, x in enumerate(self.ins):
                host[r, 1] = x.data.ptr
            for j, o in enumerate(self.statics):
                host[self.n_in + j, 0], host[self.n_in + j, 2] = o.data.ptr, o.nbytes
            slot = [mem, host, cp.cuda.Event(block=False, disable_timing=True), False]
            self.ring.append(slot)
            return slot
        slot = self.ring[self.turn]
        self.turn = (self.turn + 1) % RING
        if slot[3] and not slot[2].done:  # the GPU is RING calls behind: wait for it
            _rt.host_sync("CUDA graph copy tables all in flight")
            slot[2].synchronize()
        return slot


#: Pinned copy tables per graph: calls the host may run ahead of the GPU before waiting.
RING = 16

_COPY_SOURCE = r"""
extern "C" __global__ void lx_copy_rows(const long long* table, int first) {
    // Row blockIdx.y of the table: (source, destination, bytes); 16-byte words when
    // everything is aligned for them, else bytes. A grid-stride loop per row.
    const long long* row = table + 3 * (long long)(first + blockIdx.y);
    const char* src = (const char*)row[0];
    char* dst = (char*)row[1];
    long long n = row[2];
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long step = (long long)gridDim.x * blockDim.x;
    if ((((unsigned long long)src | (unsigned long long)dst | (unsigned long long)n) & 15) == 0) {
        const uint4* s4 = (const uint4*)src;
        uint4* d4 = (uint4*)dst;
        for (long long k = i; k < (n >> 4); k += step) d4[k] = s4[k];
    } else {
        for (long long k = i; k < n; k += step) dst[k] = src[k];
    }
}
"""
_COPY = None


def _copy_rows(table, first: int, rows: int, most_bytes: int) -> None:
    """Queue the copy kernel over ``rows`` rows of ``table`` from row ``first``."""
    global _COPY
    if rows == 0:
        return
    if _COPY is None:
        _COPY = _rt.CudaKernel(_COPY_SOURCE, "graphs.py copy rows").function("lx_copy_rows")
    blocks = max(1, min(1024, (most_bytes // 16 + 255) // 256))
    _COPY((blocks, rows), (256,), (table, np.int32(first)))


_WARM = "warm"            # ran once: the next call captures
_NO = "uncapturable"      # capture failed: always run the plan


def _graphs_of(entry) -> dict:
    g = entry.__dict__.get("_cuda_graphs")
    if g is None:
        g = entry.__dict__["_cuda_graphs"] = {}
    return g


def _key(inputs, nd, shapeless: bool):
    """The inputs' part of a graph's key, or None when one is not a device buffer. A
    compiled function's entry fixes its inputs' shapes and dtypes unless it is
    shapeless, so only a shapeless entry's key names them."""
    if not shapeless:
        for x in inputs:
            if type(x) is not nd:
                return None
        return ()
    key = []
    for x in inputs:
        if type(x) is not nd:
            return None
        key.append((x.shape, x.dtype.char))
    return tuple(key)


def _capture(prim, inputs, tables):
    """Capture the plan of ``prim`` (already built for ``tables``) on ``inputs``'
    signature, between its two copy kernels; a :class:`_Graph`, or None when the plan
    cannot be captured."""
    cp = _rt.cp
    entry = prim.entry
    pool = cp.cuda.MemoryPool()
    n_in = len(inputs)
    with cp.cuda.using_allocator(pool.malloc):
        static_ins = [cp.empty(x.shape, x.dtype) for x in inputs]
        # The table's rows: inputs, outputs, and room for the index checks' extremes
        # (their number is known once the plan has run: at most one per node). Every
        # launch uploads all its rows, so nothing initialises it; and nothing may: the
        # capture stream is not ordered with the calls' stream, so a kernel queued on it
        # (a zero fill) could run between a launch's upload and its graph.
        table = cp.empty((n_in + len(entry.run_tape.outputs) + len(entry.run_tape.nodes), 3),
                         np.int64)
    # Only the capture itself is issued on this stream: it never runs any work.
    stream = cp.cuda.Stream(non_blocking=True)
    pending = _kernels().pending_checks()
    # Checks queued before this call are set aside (running them would wait for the GPU)
    # and put back ahead of the graph's own after the capture.
    earlier = pending[:]
    pending.clear()
    graph = None
    try:
        with cp.cuda.using_allocator(pool.malloc), stream:
            # Relaxed: the private pool's first allocations (cudaMalloc) happen inside.
            stream.begin_capture(getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", 2))
            _gemm.capturing = True
            try:
                _copy_rows(table, 0, n_in, max((x.nbytes for x in inputs), default=0))
                outs = entry._runner(list(static_ins), ())
                single = type(outs) not in (tuple, list)
                outs = [outs] if single else list(outs)
                ok = all(type(o) is cp.ndarray for o in outs)
                if ok:
                    # The copy kernel copies bytes: a strided output (a transpose, a
                    # reversed slice) is made contiguous, in the graph.
                    outs = [o if o.flags.c_contiguous else cp.ascontiguousarray(o)
                            for o in outs]
                checks = pending[:]
                if ok:
                    statics = outs + [ext for _, ext in checks]
                    _copy_rows(table, n_in, len(statics), max(o.nbytes for o in statics))
            finally:
                _gemm.capturing = False
                graph = stream.end_capture()
    except Exception as exc:  # a synchronising call inside: the capture was invalidated
        global last_failure
        import traceback  # the cold path only
        where = "".join(traceback.format_exception(exc)[-4:])
        last_failure = f"{entry.label}: {type(exc).__name__}: {exc}\n{where}"
        pending[:] = earlier
        stats["uncapturable"] += 1
        return None
    pending[:] = earlier  # the graph's: queued again, copied, at every launch
    if not ok:
        last_failure = f"{entry.label}: an output is not a device buffer"
        stats["uncapturable"] += 1
        return None
    stats["captures"] += 1
    return _Graph(graph, static_ins, outs, single, pool, stream, tables, checks,
                  table[:n_in + len(outs) + len(checks)])


def _donors(prim, inputs) -> dict:
    """``{(shape, dtype): [(input position, buffer), ...]}``: the call's inputs whose
    buffers may receive its outputs: the compiled entry's donor candidates (an optimizer's
    update reads a parameter and its moments once and last) that pass the CPU plan's test
    (``lazyx.transforms.compile._donors``: held by the node alone) as contiguous CuPy
    buffers owning their memory. Nothing else can read such a buffer again."""
    found: dict = {}
    ins = prim._ins
    if ins is None or _scheduler.retain_graph.depth:
        return found
    for k in _compile_donors(ins, inputs, prim.entry.donor_positions, _owns_cupy):
        buf = inputs[k]
        found.setdefault((buf.shape, buf.dtype), []).append((k, buf))
    return found


def _owns_cupy(buf) -> bool:
    return type(buf) is _rt.cp.ndarray and buf.base is None and buf.flags.c_contiguous


def _launch(g: _Graph, inputs, donors=None):
    """One call of ``g`` on ``inputs``: its results as the caller's own buffers, those of
    ``donors`` (:func:`_donors`) where one fits an output (its static input got its bytes
    first, in the graph's first copy), fresh ones otherwise."""
    cp = _rt.cp
    cur = cp.cuda.get_current_stream()
    slot = g.slot()
    host = slot[1]
    keep = []  # contiguous copies of strided inputs, alive until their row is queued
    sources, sizes = [], []  # the table's columns are written once each, not per row
    for x in inputs:
        if not x.flags.c_contiguous:
            x = cp.ascontiguousarray(x)
            keep.append(x)
        sources.append(x.data.ptr)
        sizes.append(x.nbytes)
    n_in = g.n_in
    if n_in:
        host[:n_in, 0] = sources
        host[:n_in, 2] = sizes
    empty = cp.empty
    if donors:
        fresh = []
        for o in g.statics:
            pool = donors.get((o.shape, o.dtype))
            if pool:
                f = pool.pop()[1]
                stats["donated"] += 1
            else:
                f = empty(o.shape, o.dtype)
            fresh.append(f)
    else:
        fresh = [empty(o.shape, o.dtype) for o in g.statics]
    n = n_in + len(fresh)
    host[n_in:n, 1] = [f.data.ptr for f in fresh]
    cp.cuda.runtime.memcpyAsync(g.table.data.ptr, slot[0].ptr, n * 24,
                                cp.cuda.runtime.memcpyHostToDevice, cur.ptr)
    slot[2].record(cur)
    slot[3] = True
    g.graph.launch(cur)
    outs = fresh[:len(g.outs)]
    if g.checks:
        k = _kernels()
        for (check, _), ext in zip(g.checks, fresh[len(g.outs):]):
            k._defer(check, ext)
    return outs[0] if g.single else tuple(outs)


def _kernels():
    from . import kernels  # loaded with the backend's tables, before any kernel runs
    return kernels


def compiled_call_kernel(prim, inputs):
    """The ``cuda`` kernel of ``CompiledCall``: the plan, replayed as a CUDA graph from
    the second call of a signature on (see the module docstring)."""
    entry = prim.entry
    if not ENABLED or _scheduler.retain_graph.depth or len(entry.run_tape.nodes) < MIN_NODES:
        return prim.eval_gpu(inputs)
    tables = (_backend._tables or _backend.dispatch_tables())[0]
    key = _key(inputs, _rt.cp.ndarray, entry.run_tape.shapeless)
    if key is None:  # a host buffer among the inputs: the plan uploads it
        return prim.eval_gpu(inputs)
    key = (key, _rt.cp.cuda.Device().id)
    graphs = _graphs_of(entry)
    if entry._tables is not tables or entry._checked is not _scheduler.check_shape_rules:
        graphs.clear()
        graphs[key] = _WARM
        if not entry.prebuilt:
            return prim.eval_gpu(inputs)  # (re)builds the plan and what it launches
        # An eager graph's entry (lazyx.transforms.replay): its nodes just ran one by one,
        # so their kernels and library plans exist; capture at once.
        entry.rebuild(tables)
    g = graphs.get(key)
    if g is None:
        if len(graphs) >= MAX_GRAPHS:
            graphs.pop(next(iter(graphs)))
        graphs[key] = _WARM
        return prim.eval_gpu(inputs)
    if g is _WARM:
        g = _capture(prim, inputs, tables)
        graphs[key] = _NO if g is None else g
        if g is None:
            return prim.eval_gpu(inputs)
        # The capture ran nothing: this call's results come from the first launch.
        return _launch(g, inputs)
    if g is _NO or g.tables is not tables:
        return prim.eval_gpu(inputs)
    stats["replays"] += 1
    return _launch(g, inputs, _donors(prim, inputs))


KERNELS = {CompiledCall: compiled_call_kernel}
