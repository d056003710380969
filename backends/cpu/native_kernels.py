"""Kernels of the ``cpu`` backend served by the nanobind module ``_native``.

A native kernel covers the common layout (a C-contiguous input reduced or
normalised over its trailing axes, in a dtype the module supports) and hands
every other case to the NumPy kernel of the ``cpu-reference`` backend, so the
two backends always agree. Outputs are allocated here with NumPy, inside the
evaluation, so lazyx's allocation handler counts them like any other buffer.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from lazyx.array import array
from lazyx.dtypes import numpy_name

_f32 = np.dtype(np.float32)
_u16 = np.dtype(np.uint16)
_empty = np.empty


#: Why the native module did not load (shown by ``lazyx info``), or None.
load_error: str | None = None


def load():
    """The native module, or None when it cannot load (the NumPy kernels then serve,
    and ``load_error`` says why; ``lazyx info`` shows it).

    A portable build (backends/cpu/native/CMakeLists.txt) holds two modules: ``_native``
    compiled for x86-64-v3 and ``_native_base`` for the baseline. The CPU's features
    (NumPy's table of them) pick one before either is imported: a module for newer
    instructions must not even load on a CPU without them."""
    global _loaded
    if _loaded is not _UNTRIED:  # once per process: callers sit on hot paths (compiled.py)
        return _loaded
    _loaded = _load()
    return _loaded


_UNTRIED = object()
_loaded = _UNTRIED


def _load():
    global load_error
    import importlib
    errors = []
    for name in _candidates():
        try:
            native = importlib.import_module(f"{__package__}.{name}")
        except ImportError as exc:  # the compiled module is optional (a build may lack it)
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if sys.version_info < (3, 12):
            _backport_buffer_protocol(native)
        load_error = None
        return native
    load_error = "; ".join(errors)
    return None


def _candidates() -> tuple:
    """The native modules to try, best first."""
    import importlib.util
    try:
        portable = importlib.util.find_spec(f"{__package__}._native_base") is not None
    except (ImportError, ValueError):
        portable = False
    if not portable:
        return ("_native",)
    return ("_native", "_native_base") if has_x86_64_v3() else ("_native_base",)


def has_x86_64_v3() -> bool:
    """Whether this CPU runs x86-64-v3 code (AVX2, FMA, F16C; the CPUs that have them
    have its other instructions too), by NumPy's run-time CPU feature table."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return all(features.get(f) for f in ("AVX", "AVX2", "FMA3", "F16C"))


def _backport_buffer_protocol(native) -> None:
    """``memoryview(a)`` on Python 3.11: ``array.__buffer__`` (lazyx.interop) is wired
    to the C buffer slot by the native module, as Python 3.12 does by itself (PEP 688)."""
    todo = [array]
    while todo:
        cls = todo.pop()
        native.backport_buffer_protocol(cls)
        todo.extend(cls.__subclasses__())


_layouts: dict = {}


def _layout(shape: tuple, axes: tuple) -> tuple:
    """``(row length, leading rows)`` of reducing ``shape`` over ``axes`` (in any order,
    negative allowed): the elements per row when ``axes`` are the trailing axes, and the
    number of rows when they are the leading axes and at least one axis is kept; 0 for a
    layout that is not. Cached: the same layouts recur."""
    key = (shape, axes)
    got = _layouts.get(key)
    if got is None:
        ndim = len(shape)
        k = len(axes)
        sorted_axes = sorted(a % ndim for a in axes) if ndim else []
        trailing = 0 < k <= ndim and sorted_axes == list(range(ndim - k, ndim))
        leading = 0 < k < ndim and sorted_axes == list(range(k))
        got = (math.prod(shape[ndim - k:]) if trailing else 0,
               math.prod(shape[:k]) if leading else 0)
        if len(_layouts) > 4096:
            _layouts.clear()
        _layouts[key] = got
    return got


def _row_length(shape: tuple, axes: tuple) -> int:
    """The number of elements per row when ``axes`` are the trailing axes of ``shape``, else 0."""
    return _layout(shape, axes)[0]


def _row_kernel(by_dtype: dict, reference, reduces: bool):
    """A kernel running ``by_dtype[x.dtype.name](x, out, n)`` on C-contiguous rows.

    ``by_dtype`` maps a NumPy dtype's name to (native function, view dtype or None).
    ``reduces``: the output has one element per row (shape from keepdims).
    """
    def kernel(prim, inputs):
        x = inputs[0]
        entry = by_dtype.get(numpy_name(x.dtype))
        if entry is None or not x.flags.c_contiguous or x.size == 0:
            return reference(prim, inputs)
        shape = x.shape
        axes = prim.axes
        n = _row_length(shape, axes)
        if n == 0:
            return reference(prim, inputs)
        fn, view = entry
        if reduces:
            kept = shape[:len(shape) - len(axes)]
            out = _empty(kept + (1,) * len(axes) if prim.keepdims else kept, x.dtype)
        else:
            out = _empty(shape, x.dtype)
        if view is None:
            fn(x, out, n)
        else:
            fn(x.view(view), out.view(view), n)
        return out
    kernel.reference = reference
    return kernel


def _reduce_kernel(native_by_op: dict, reference, by_column: dict | None = None):
    """float32 ``Reduce`` for the ops in ``native_by_op`` ({"sum": fn, "max": fn, "min":
    fn}) over contiguous trailing axes (one result per row) or, with ``by_column``'s
    functions, over leading axes (one per column: a bias gradient's sum over the batch),
    threaded; other ops and layouts go to ``reference``.

    Measured faster than the NumPy kernel at every size, from 256 elements
    (no keyword-argument dispatch) to 4M (two threads, one pass, at the speed of
    the cache or memory holding the input); over the leading axes, 15 against NumPy's
    31 µs for (256, 512) and 55 against 144 µs for (8, 128, 1024) in a training step.
    max and min propagate NaN, as NumPy's.
    """
    rows = {op: _row_kernel({"float32": (fn, None)}, reference, reduces=True)
            for op, fn in native_by_op.items()}
    by_column = by_column or {}

    def kernel(prim, inputs):
        k = rows.get(prim.op)
        if k is None:
            return reference(prim, inputs)
        x = inputs[0]
        columns = by_column.get(prim.op)
        if columns is not None and x.dtype == _f32 and x.flags.c_contiguous and x.size:
            n = _layout(x.shape, prim.axes)[1]
            if n:
                kept = x.shape[len(prim.axes):]
                out = _empty((1,) * len(prim.axes) + kept if prim.keepdims else kept, _f32)
                columns(x, out, x.size // n)
                return out
        return k(prim, inputs)
    kernel.reference = reference
    return kernel


def _primitive(module: str, name: str):
    """The primitive class ``lazyx.plugins.<module>.<name>``, or None while its pack lacks it."""
    import importlib
    try:
        return getattr(importlib.import_module(f"lazyx.plugins.{module}"), name, None)
    except ImportError:
        return None


def kernels(native) -> dict:
    """{primitive_class: kernel} that replace NumPy kernels on the ``cpu`` backend.

    A primitive is only covered when its pack defines it and a NumPy kernel
    exists to fall back on.
    """
    if native is None:
        return {}
    from .kernels import numpy_kernels  # the kernel modules are large: on first use
    reference = numpy_kernels()

    def per_dtype(prefix):
        # By dtype name: ml_dtypes (bfloat16's NumPy dtype) loads only once a bfloat16
        # array exists, not with the kernel tables.
        return {"float32": (getattr(native, f"{prefix}_float32"), None),
                "float16": (getattr(native, f"{prefix}_float16"), _u16),
                "bfloat16": (getattr(native, f"{prefix}_bfloat16"), _u16)}

    table = {}
    softmax = _primitive("products", "Softmax")
    if softmax is not None and softmax in reference:
        table[softmax] = _row_kernel(per_dtype("softmax"), reference[softmax], reduces=False)
    logsumexp = _primitive("reductions", "LogSumExp")
    if logsumexp is not None and logsumexp in reference:
        table[logsumexp] = _row_kernel(per_dtype("logsumexp"), reference[logsumexp], reduces=True)
    reduce = _primitive("reductions", "Reduce")
    if reduce is not None and reduce in reference:
        ops = ("sum", "max", "min")
        table[reduce] = _reduce_kernel({op: getattr(native, f"{op}_float32") for op in ops},
                                       reference[reduce],
                                       {op: getattr(native, f"{op}_columns_float32", None)
                                        for op in ops})
    from . import native_packs  # the op packs' native kernels: with the table, on first use
    for pack in native_packs.PACKS:
        for cls, fn in pack.kernels(native, reference).items():
            if getattr(fn, "reference", None) is None:
                fn.reference = reference[cls]  # the NumPy kernel it stands in for (lazyx info, tests)
            table[cls] = fn
    return table
