"""NumPy kernels of the reductions op pack.

float16 and bfloat16 accumulate in float32 (sums, products, log-sum-exp and the
scans that add or multiply), then round once to the output dtype.
"""

import numpy as np

from lazyx.dtypes import numpy_name
from lazyx.plugins import reductions as rd

_f32 = np.dtype(np.float32)
#: The half-precision dtypes by name (ml_dtypes, bfloat16's NumPy dtype, loads only once a
#: bfloat16 array exists).
_HALF = ("float16", "bfloat16")
_bool = np.dtype(np.bool_)
_uint32 = np.dtype(np.uint32)
_SUM_NP = {k.np: v.np for k, v in rd.SUM_DTYPE.items()}


# -- Reduce ----------------------------------------------------------------------
def _accumulating(fn):
    def k(x, axes, keepdims):
        d = x.dtype
        if numpy_name(d) in _HALF:
            return fn(x, axis=axes, dtype=_f32, keepdims=keepdims).astype(d)
        return fn(x, axis=axes, dtype=_SUM_NP.get(d, d), keepdims=keepdims)
    return k


def _plain(fn):
    def k(x, axes, keepdims):
        return fn(x, axis=axes, keepdims=keepdims)
    return k


_REDUCERS = {"sum": _accumulating(np.sum), "prod": _accumulating(np.prod),
             "max": _plain(np.max), "min": _plain(np.min),
             "all": _plain(np.all), "any": _plain(np.any)}


def _reduce(p, ins):
    return _REDUCERS[p.op](ins[0], p.axes, p.keepdims)


# -- ArgReduce -------------------------------------------------------------------
_ARG = {"argmax": np.argmax, "argmin": np.argmin}


def _arg_reduce(p, ins):
    return np.asarray(_ARG[p.op](ins[0], axis=p.axis, keepdims=p.keepdims)).astype(_uint32)


# -- NumberOfElements ------------------------------------------------------------
def _number_of_elements(p, ins):
    return np.array(p.constant_at([ins[0].shape]), p.dtype.np)


# -- LogSumExp, Median -----------------------------------------------------------
def _finite_max(x, axes):
    """The max (of the real part) over ``axes``, kept as size-1 dims; non-finite maxima become 0
    so that subtracting it never makes ``inf - inf``."""
    m = np.max(x.real if x.dtype.kind == "c" else x, axis=axes, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(m.dtype, copy=False)


def _logsumexp(p, ins):
    x = ins[0]
    d = x.dtype
    if numpy_name(d) in _HALF:
        x = x.astype(_f32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = _finite_max(x, p.axes)
        r = np.log(np.sum(np.exp(x - m), axis=p.axes, keepdims=True)) + m
    if not p.keepdims:
        r = r.reshape(rd.reduced_shape(x.shape, p.axes, False))
    return r.astype(d, copy=False)


def _median(p, ins):
    x = ins[0]
    d = x.dtype
    if numpy_name(d) in _HALF:
        x = x.astype(_f32)
    return np.asarray(np.median(x, axis=p.axes, keepdims=p.keepdims)).astype(d, copy=False)


# -- Scan ------------------------------------------------------------------------
def _cumsum(x, axis):
    d = x.dtype
    if numpy_name(d) in _HALF:
        return np.cumsum(x, axis=axis, dtype=_f32).astype(d)
    return np.cumsum(x, axis=axis, dtype=d)


def _cumprod(x, axis):
    d = x.dtype
    if d.kind == "b":
        return np.logical_and.accumulate(x, axis=axis)
    if numpy_name(d) in _HALF:
        return np.cumprod(x, axis=axis, dtype=_f32).astype(d)
    return np.cumprod(x, axis=axis, dtype=d)


def _logcumsumexp(x, axis):
    d = x.dtype
    if numpy_name(d) in _HALF:
        x = x.astype(_f32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if x.dtype.kind == "c":
            # np.logaddexp has no complex loop: shift by the largest real part instead.
            m = _finite_max(x, axis)
            r = np.log(np.cumsum(np.exp(x - m), axis=axis)) + m
        else:
            r = np.logaddexp.accumulate(x, axis=axis)
    return r.astype(d, copy=False)


_SCANS = {"sum": _cumsum, "prod": _cumprod,
          "max": lambda x, axis: np.maximum.accumulate(x, axis=axis),
          "min": lambda x, axis: np.minimum.accumulate(x, axis=axis),
          "logaddexp": _logcumsumexp}


def _identity(op, d):
    """The value an exclusive scan starts from."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if op == "logaddexp":
        return -np.inf
    low = op == "max"
    if d.kind == "b":
        return not low
    if d.kind in "iu":
        info = np.iinfo(d)
        return info.min if low else info.max
    inf = -np.inf if low else np.inf
    return complex(inf, inf) if d.kind == "c" else inf


def scan_kernel(scans: dict):
    """The Scan kernel over the inclusive scans ``scans`` (``{op: fn(x, axis)}``): reverse
    and exclusive scans are built around them. Array-agnostic (``np.flip`` and
    ``np.empty_like`` dispatch to CuPy), so the CUDA backend reuses it with its own scans."""
    def scan(p, ins):
        x = ins[0]
        axis = p.axis
        if p.reverse:
            x = np.flip(x, axis)
        r = scans[p.op](x, axis)
        if not p.inclusive and r.shape[axis]:
            out = np.empty_like(r)
            head = (slice(None),) * axis
            out[head + (slice(0, 1),)] = _identity(p.op, r.dtype)
            out[head + (slice(1, None),)] = r[head + (slice(0, -1),)]
            r = out
        if p.reverse:
            r = np.flip(r, axis)
        return r
    return scan


KERNELS = {
    rd.Reduce: _reduce,
    rd.ArgReduce: _arg_reduce,
    rd.LogSumExp: _logsumexp,
    rd.NumberOfElements: _number_of_elements,
    rd.Median: _median,
    rd.Scan: scan_kernel(_SCANS),
}
