"""cuDNN's forward convolution through ctypes, for the ``conv`` pack's CUDA kernel.

CuPy 14 dropped its cuDNN binding (``cupyx.cudnn``), but the cuDNN library itself ships
as a wheel (``nvidia-cudnn-cu13`` / ``-cu12``, what PyTorch and JAX load too). This
module loads it and calls its C API.

The flow of :func:`convolution_forward`:

1. ``library()`` finds ``libcudnn.so.9`` once (the wheel's folder, ``cuda.pathfinder``,
   the system loader) and preloads its sub-libraries from the same folder (the front
   library opens them by name); ``None`` when there is none;
2. a *plan* per (shapes, dtype, padding, strides, dilation, groups, mode), cached (a
   training step asks for the same few every step). Lazyx's channels-last arrays are
   cuDNN's NHWC layouts as they are (``(O, *k, C)`` weights are NHWC filters), so
   nothing is transposed. The plan is built with the backend ("graph") API: tensor and
   convolution descriptors, a forward-convolution operation graph, the engine
   configurations cuDNN's heuristics rank first, the first that finalizes into an
   execution plan. Float32 and float64 skip engines with the tensor-core note (no TF32:
   results match the CPU's to float32 rounding); float16 and bfloat16 take tensor cores,
   accumulating in float32. Where no such plan builds, the legacy API's descriptors and
   heuristic algorithm serve (its calls cost ~75 µs of CPU each in cuDNN 9);
3. the call on CuPy's current stream, the workspace from CuPy's memory pool: a variant
   pack of the three pointers and one execute.

A configuration cuDNN rejects raises :class:`CudnnError`, and the caller runs its
im2col kernel instead (on the same GPU).
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

from lazyx.environment import read_variable

#: The element types cuDNN convolves, by dtype name -> cudnnDataType_t.
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
_HALF, _BFLOAT16 = DATA_TYPES["float16"], DATA_TYPES["bfloat16"]
_NHWC = 1
_CONVOLUTION, _CROSS_CORRELATION = 0, 1
_TENSOR_OP_MATH, _FMA_MATH = 1, 3
_SUB_LIBRARIES = ("graph", "ops", "cnn", "adv", "engines_precompiled",
                  "engines_runtime_compiled", "heuristic")


class CudnnError(RuntimeError):
    """cuDNN refused a call (an unsupported configuration, or no library)."""


class _AlgoPerf(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("math_type", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


_state: dict = {}  # "lib": the CDLL or None; handles by device; plans by key


def _candidates():
    try:
        import nvidia.cudnn as wheel  # the pip wheel's namespace package, when installed

        for root in wheel.__path__:
            yield from sorted(glob.glob(os.path.join(root, "lib", "libcudnn.so*")))
    except ImportError:
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # CuPy 14's library finder

        yield load_nvidia_dynamic_lib("cudnn").abs_path
    except Exception:  # noqa: BLE001, S110 - absent, or no cuDNN where it looks
        pass
    yield "libcudnn.so.9"
    yield "libcudnn.so"


def library():
    """The loaded cuDNN library, or None where there is none."""
    if "lib" not in _state:
        _state["lib"] = None
        for path in _candidates():
            try:
                folder = os.path.dirname(path)
                for sub in _SUB_LIBRARIES if folder else ():
                    for part in glob.glob(os.path.join(folder, f"libcudnn_{sub}.so*")):
                        ctypes.CDLL(part, mode=ctypes.RTLD_GLOBAL)
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                lib.cudnnGetVersion.restype = ctypes.c_size_t
                if lib.cudnnGetVersion() >= 8000:
                    lib.cudnnGetErrorString.restype = ctypes.c_char_p
                    _state["lib"] = lib
                    break
            except OSError:
                continue
    return _state["lib"]


def _check(status: int, what: str) -> None:
    if status:
        text = _state["lib"].cudnnGetErrorString(status).decode()
        raise CudnnError(f"cuDNN {what}: {text} (status {status})")


def _handle(lib, device: int):
    handles = _state.setdefault("handles", {})
    h = handles.get(device)
    if h is None:
        h = ctypes.c_void_p()
        _check(lib.cudnnCreate(ctypes.byref(h)), "cudnnCreate")
        handles[device] = h
    return h


def _ints(values) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


def _descriptor(lib, create: str, set_fn, *args):  # a legacy API descriptor
    d = ctypes.c_void_p()
    _check(getattr(lib, create)(ctypes.byref(d)), create)
    _check(set_fn(d, *args), set_fn.__name__)
    return d


class _LegacyPlan:
    """The descriptors and algorithm of cuDNN's legacy convolution API (its calls cost
    ~75 µs of CPU each in cuDNN 9, which rebuilds a graph per call: the fallback)."""

    def __init__(self, lib, handle, key):
        xs, ws, ys, dtype, pad, stride, dil, groups, flip = key
        data = _data_type(dtype)
        nd = len(xs)
        # Descriptors list dimensions as N, C, spatial... whatever the memory layout.
        self.descs = [
            _descriptor(lib, "cudnnCreateTensorDescriptor", lib.cudnnSetTensorNdDescriptorEx,
                        _NHWC, data, nd, _ints((xs[0], xs[-1]) + xs[1:-1])),
            _descriptor(lib, "cudnnCreateFilterDescriptor", lib.cudnnSetFilterNdDescriptor,
                        data, _NHWC, nd, _ints((ws[0], ws[-1]) + ws[1:-1])),
            _descriptor(lib, "cudnnCreateConvolutionDescriptor",
                        lib.cudnnSetConvolutionNdDescriptor, nd - 2, _ints(pad), _ints(stride),
                        _ints(dil), _CONVOLUTION if flip else _CROSS_CORRELATION,
                        1 if data == 1 else 0),  # double accumulates in double, the rest float
            _descriptor(lib, "cudnnCreateTensorDescriptor", lib.cudnnSetTensorNdDescriptorEx,
                        _NHWC, data, nd, _ints((ys[0], ys[-1]) + ys[1:-1]))]
        x_desc, w_desc, c_desc, y_desc = self.descs
        _check(lib.cudnnSetConvolutionGroupCount(c_desc, int(groups)),
               "cudnnSetConvolutionGroupCount")
        math = _TENSOR_OP_MATH if data in (_HALF, _BFLOAT16) else _FMA_MATH
        _check(lib.cudnnSetConvolutionMathType(c_desc, math), "cudnnSetConvolutionMathType")
        perf = (_AlgoPerf * 8)()
        count = ctypes.c_int()
        _check(lib.cudnnGetConvolutionForwardAlgorithm_v7(handle, x_desc, w_desc, c_desc, y_desc,
                                                          8, ctypes.byref(count), perf),
               "cudnnGetConvolutionForwardAlgorithm_v7")
        for choice in perf[:count.value]:
            size = ctypes.c_size_t()
            if choice.status == 0 and lib.cudnnGetConvolutionForwardWorkspaceSize(
                    handle, x_desc, w_desc, c_desc, y_desc, choice.algo, ctypes.byref(size)) == 0:
                scale = ctypes.c_double if data == 1 else ctypes.c_float
                self.algo, self.size = choice.algo, size.value
                self.one, self.zero = ctypes.byref(scale(1.0)), ctypes.byref(scale(0.0))
                return
        self.release(lib)
        raise CudnnError("cuDNN has no forward algorithm for this convolution")

    def run(self, lib, handle, x, w, y, space):
        x_desc, w_desc, c_desc, y_desc = self.descs
        _check(lib.cudnnConvolutionForward(
            handle, self.one, x_desc, ctypes.c_void_p(x), w_desc, ctypes.c_void_p(w), c_desc,
            self.algo, ctypes.c_void_p(space), ctypes.c_size_t(self.size), self.zero, y_desc,
            ctypes.c_void_p(y)), "cudnnConvolutionForward")

    released = False

    def release(self, lib):
        self.released = True
        for d, kind in zip(self.descs, ("Tensor", "Filter", "Convolution", "Tensor")):
            getattr(lib, f"cudnnDestroy{kind}Descriptor")(d)


# The backend ("graph") API: descriptor types, attribute names and attribute types
# (cudnn_graph.h's values).
_B_TENSOR, _B_CONV, _B_CONV_FWD, _B_GRAPH, _B_HEUR, _B_CFG, _B_PLAN, _B_PACK, _B_ENGINE = (
    17, 1, 10, 15, 4, 3, 5, 16, 2)
_T_HANDLE, _T_DATA_TYPE, _T_INT64, _T_FLOAT, _T_DOUBLE, _T_VOID_PTR = 0, 1, 3, 4, 5, 6
_T_CONV_MODE, _T_HEUR_MODE, _T_NOTE, _T_DESC = 7, 8, 11, 15
_NOTE_TENSOR_CORE = 0


def _attr(lib, desc, name: int, kind: int, values, ctype) -> None:
    arr = (ctype * len(values))(*values)
    _check(lib.cudnnBackendSetAttribute(desc, name, kind, ctypes.c_int64(len(values)), arr),
           f"cudnnBackendSetAttribute({name})")


def _backend(lib, kind: int, attrs, owned: list):
    """A finalized backend descriptor of ``kind`` with ``attrs`` [(name, type, values,
    ctype)]; appended to ``owned`` (destroyed with the plan)."""
    d = ctypes.c_void_p()
    _check(lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(d)), "cudnnBackendCreateDescriptor")
    owned.append(d)
    for name, typ, values, ctype in attrs:
        _attr(lib, d, name, typ, values, ctype)
    _check(lib.cudnnBackendFinalize(d), f"cudnnBackendFinalize({kind})")
    return d


def _nhwc_strides(shape) -> list:
    """``(N, C, *spatial)`` strides of a channels-last ``(N, *spatial, C)`` array."""
    inner = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        inner[i] = inner[i + 1] * shape[i + 1]
    return [inner[0], inner[-1]] + inner[1:-1]


class _GraphPlan:
    """A finalized execution plan of cuDNN's backend API: built once per configuration;
    a call is a variant pack (the three pointers and the workspace) and one execute,
    a few µs of CPU."""

    _UIDS = (1, 2, 3)  # x, w, y

    def __init__(self, lib, handle, key):
        xs, ws, ys, dtype, pad, stride, dil, groups, flip = key
        data = _data_type(dtype)
        self.owned: list = []
        self.packs: dict = {}
        try:
            self._build(lib, handle, xs, ws, ys, data, pad, stride, dil, flip)
        except CudnnError:
            self.release(lib)
            raise

    def _build(self, lib, handle, xs, ws, ys, data, pad, stride, dil, flip):
        i64, own = ctypes.c_int64, self.owned

        def tensor(uid, shape):
            dims = [shape[0], shape[-1]] + list(shape[1:-1])
            return _backend(lib, _B_TENSOR, [
                (901, _T_DATA_TYPE, [data], ctypes.c_int), (902, _T_INT64, dims, i64),
                (903, _T_INT64, _nhwc_strides(shape), i64), (906, _T_INT64, [uid], i64),
                (900, _T_INT64, [16], i64)], own)

        x_d, w_d, y_d = (tensor(u, s) for u, s in zip(self._UIDS, (xs, ws, ys)))
        nd = len(xs) - 2
        compute = 1 if data == 1 else 0
        conv = _backend(lib, _B_CONV, [
            (100, _T_DATA_TYPE, [compute], ctypes.c_int),
            (101, _T_CONV_MODE, [_CONVOLUTION if flip else _CROSS_CORRELATION], ctypes.c_int),
            (106, _T_INT64, [nd], i64), (102, _T_INT64, list(dil), i64),
            (103, _T_INT64, list(stride), i64), (105, _T_INT64, list(pad), i64),
            (104, _T_INT64, list(pad), i64)], own)
        scale, scale_type = (ctypes.c_double, _T_DOUBLE) if data == 1 else (ctypes.c_float, _T_FLOAT)
        op = _backend(lib, _B_CONV_FWD, [
            (704, _T_DESC, [x_d.value], ctypes.c_void_p), (703, _T_DESC, [w_d.value], ctypes.c_void_p),
            (705, _T_DESC, [y_d.value], ctypes.c_void_p), (702, _T_DESC, [conv.value], ctypes.c_void_p),
            (700, scale_type, [1.0], scale), (701, scale_type, [0.0], scale)], own)
        graph = _backend(lib, _B_GRAPH, [(800, _T_HANDLE, [handle.value], ctypes.c_void_p),
                                         (801, _T_DESC, [op.value], ctypes.c_void_p)], own)
        heur = _backend(lib, _B_HEUR, [(201, _T_DESC, [graph.value], ctypes.c_void_p),
                                       (200, _T_HEUR_MODE, [0], ctypes.c_int)], own)  # INSTANT
        cfgs = []
        for _ in range(8):
            d = ctypes.c_void_p()
            _check(lib.cudnnBackendCreateDescriptor(_B_CFG, ctypes.byref(d)), "create engine config")
            own.append(d)
            cfgs.append(d.value)
        arr, count = (ctypes.c_void_p * 8)(*cfgs), ctypes.c_int64()
        _check(lib.cudnnBackendGetAttribute(heur, 202, _T_DESC, ctypes.c_int64(8),
                                            ctypes.byref(count), arr), "engine heuristics")
        for cfg in arr[:count.value]:
            if data in (0, 1) and self._tensor_cores(lib, cfg):
                continue  # float32/float64: no TF32 (results as the CPU's, to rounding)
            plan = ctypes.c_void_p()
            if lib.cudnnBackendCreateDescriptor(_B_PLAN, ctypes.byref(plan)):
                continue
            own.append(plan)
            if (_set_quiet(lib, plan, 400, _T_HANDLE, handle.value)
                    or _set_quiet(lib, plan, 401, _T_DESC, cfg)
                    or lib.cudnnBackendFinalize(plan)):
                continue
            size = ctypes.c_int64()
            n = ctypes.c_int64()
            _check(lib.cudnnBackendGetAttribute(plan, 402, _T_INT64, ctypes.c_int64(1),
                                                ctypes.byref(n), ctypes.byref(size)),
                   "workspace size")
            self.plan, self.size = plan, size.value
            self.uids = (ctypes.c_int64 * 3)(*self._UIDS)
            return
        raise CudnnError("cuDNN's heuristics gave no engine that builds for this convolution")

    @staticmethod
    def _tensor_cores(lib, cfg) -> bool:
        engine = ctypes.c_void_p()
        if lib.cudnnBackendCreateDescriptor(_B_ENGINE, ctypes.byref(engine)):
            return True
        try:
            n = ctypes.c_int64()
            if lib.cudnnBackendGetAttribute(ctypes.c_void_p(cfg), 300, _T_DESC, ctypes.c_int64(1),
                                            ctypes.byref(n), ctypes.byref(engine)):
                return True
            notes = (ctypes.c_int * 16)()
            if lib.cudnnBackendGetAttribute(engine, 1303, _T_NOTE, ctypes.c_int64(16),
                                            ctypes.byref(n), notes):
                return True
            return _NOTE_TENSOR_CORE in notes[:n.value]
        finally:
            lib.cudnnBackendDestroyDescriptor(engine)

    #: Variant packs kept per plan: a training loop's buffers come back from the memory
    #: pool at the same addresses, so a call usually finds its pack (one execute, where a
    #: new pack is five more calls into cuDNN).
    PACKS = 8

    def run(self, lib, handle, x, w, y, space):
        packs = self.packs
        key = (x, w, y, space)
        pack = packs.get(key)
        if pack is None:
            pack = self._pack(lib, x, w, y, space)
            if len(packs) >= self.PACKS:  # the oldest goes
                lib.cudnnBackendDestroyDescriptor(packs.pop(next(iter(packs))))
            packs[key] = pack
        _check(lib.cudnnBackendExecute(handle, self.plan, pack), "cudnnBackendExecute")

    def _pack(self, lib, x, w, y, space):
        pack = ctypes.c_void_p()
        _check(lib.cudnnBackendCreateDescriptor(_B_PACK, ctypes.byref(pack)), "variant pack")
        try:
            ptrs = (ctypes.c_void_p * 3)(x, w, y)
            _check(lib.cudnnBackendSetAttribute(pack, 1001, _T_VOID_PTR, ctypes.c_int64(3), ptrs),
                   "variant pack pointers")
            _check(lib.cudnnBackendSetAttribute(pack, 1000, _T_INT64, ctypes.c_int64(3), self.uids),
                   "variant pack ids")
            ws = ctypes.c_void_p(space)
            _check(lib.cudnnBackendSetAttribute(pack, 1003, _T_VOID_PTR, ctypes.c_int64(1),
                                                ctypes.byref(ws)), "variant pack workspace")
            _check(lib.cudnnBackendFinalize(pack), "variant pack")
        except CudnnError:
            lib.cudnnBackendDestroyDescriptor(pack)
            raise
        return pack

    released = False

    def release(self, lib):
        self.released = True
        for pack in self.packs.values():
            lib.cudnnBackendDestroyDescriptor(pack)
        self.packs = {}
        for d in reversed(self.owned):
            lib.cudnnBackendDestroyDescriptor(d)
        self.owned = []


def _set_quiet(lib, desc, name, kind, value) -> int:
    v = ctypes.c_void_p(value)
    return lib.cudnnBackendSetAttribute(desc, name, kind, ctypes.c_int64(1), ctypes.byref(v))


def _data_type(dtype) -> int:
    return DATA_TYPES[np.dtype(dtype).name]


def _new_plan(lib, handle, key):
    """The backend API's plan, or the legacy API's where that one does not build
    (``LAZYX_CUDNN_LEGACY=1`` asks for the legacy one)."""
    if read_variable("LAZYX_CUDNN_LEGACY") != "1":
        try:
            return _GraphPlan(lib, handle, key)
        except CudnnError:
            pass
    return _LegacyPlan(lib, handle, key)


def forward_call(x_shape, w_shape, y_shape, dtype, pad, stride, dil, groups: int, flip: bool):
    """A function ``run(x_ptr, w_ptr, y_ptr)`` that computes ``y = conv(x, w)`` in place
    with cuDNN on the current device, for contiguous buffers of these shapes (the
    arguments of :func:`convolution_forward`); the plan is built now. A call costs the
    stream check, the workspace lookup and the plan's execute.

    Raises:
        CudnnError: no cuDNN, or a configuration it does not support.
    """
    import cupy as cp  # this module is imported only on machines with CuPy

    lib = library()
    if lib is None:
        raise CudnnError("no cuDNN library")
    device = cp.cuda.runtime.getDevice()
    handle = _handle(lib, device)
    key = (device, tuple(x_shape), tuple(w_shape), tuple(y_shape), np.dtype(dtype), tuple(pad),
           tuple(stride), tuple(dil), groups, bool(flip))
    plans = _state.setdefault("plans", {})
    plan = plans.get(key)
    if plan is None:
        plan = _new_plan(lib, handle, key[1:])
        if len(plans) >= 512:  # the oldest plan goes, with its descriptors
            plans.pop(next(iter(plans))).release(lib)
        plans[key] = plan
    streams = _state.setdefault("streams", {})
    current = cp.cuda.get_current_stream
    size, run_plan = plan.size, plan.run

    def run(x: int, w: int, y: int) -> None:
        if plan.released:  # evicted from the cache since: its descriptors are gone
            return forward_call(x_shape, w_shape, y_shape, dtype, pad, stride, dil, groups,
                                flip)(x, w, y)
        stream = current().ptr
        if streams.get(device) != stream:  # the handle keeps the stream it was last given
            _check(lib.cudnnSetStream(handle, ctypes.c_void_p(stream)), "cudnnSetStream")
            streams[device] = stream
        run_plan(lib, handle, x, w, y, _workspace(device, stream, size) if size else 0)
    return run


def convolution_forward(x, w, y, dtype, pad, stride, dil, groups: int, flip: bool) -> None:
    """``y = conv(x, w)`` in place with cuDNN.

    Args:
        x: ``(N, *spatial, C)`` contiguous CuPy array (2 or 3 spatial axes).
        w: ``(O, *kernel, C // groups)`` contiguous, x's dtype.
        y: ``(N, *out, O)`` contiguous output.
        dtype: the element type of all three (which may be views of other types).
        pad, stride, dil: per spatial axis (symmetric padding).
        groups (int): channel groups.
        flip (bool): convolve (kernel reversed) rather than correlate.

    Raises:
        CudnnError: no cuDNN, or a configuration it does not support.
    """
    forward_call(x.shape, w.shape, y.shape, dtype, pad, stride, dil, groups, flip)(
        x.data.ptr, w.data.ptr, y.data.ptr)


def _workspace(device: int, stream: int, size: int) -> int:
    """The address of a workspace of ``size`` bytes for ``stream``: one buffer per stream,
    grown as needed and reused by every call on it (work on one stream runs in order, so
    a call never finds the buffer still in use by an earlier one)."""
    import cupy as cp  # imported by the caller already

    spaces = _state.setdefault("workspaces", {})
    buf = spaces.get((device, stream))
    if buf is None or buf.size < size:
        buf = spaces[(device, stream)] = cp.empty(size, cp.uint8)
    return buf.data.ptr
