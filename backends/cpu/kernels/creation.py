"""NumPy kernels of the creation op pack."""

import numpy as np

from lazyx.plugins import creation as cr


def _fill(p, ins):
    if p.value == 0:
        return np.zeros(p.shape, p.dtype.np)
    return np.full(p.shape, p.value, p.dtype.np)


def _full(p, ins):
    v = ins[0]
    if v.shape == p.shape:
        return v
    return np.broadcast_to(v, p.shape).copy()


def _full_like(p, ins):
    a, v = ins
    if v.shape == a.shape:
        return v
    return np.broadcast_to(v, a.shape).copy()


def _arange(p, ins):
    n = p.output_shapes(())[0][0]
    d = p.dtype
    if d.kind in "iu":
        # MLX truncates start and step to the integer dtype before stepping.
        i = np.arange(n, dtype=np.int64)
        return (int(p.start) + i * int(p.step)).astype(d.np)
    # start + i * step in float64 (no accumulated rounding), then rounded once.
    return (p.start + np.arange(n, dtype=np.float64) * p.step).astype(d.np)


def _linspace(p, ins):
    return np.linspace(p.start, p.stop, p.num, endpoint=p.endpoint,
                       dtype=np.float64).astype(p.dtype.np)


_WINDOWS = {"bartlett": np.bartlett, "blackman": np.blackman, "hamming": np.hamming,
            "hanning": np.hanning}


def _window(p, ins):
    # Computed in float64 and rounded once; clip Blackman's -1e-17 end points to zero as MLX.
    w = _WINDOWS[p.kind](p.m)
    return np.maximum(w, 0.0).astype(np.float32)


KERNELS = {
    cr.Fill: _fill,
    cr.Full: _full,
    cr.FullLike: _full_like,
    cr.Arange: _arange,
    cr.Linspace: _linspace,
    cr.Eye: lambda p, ins: np.eye(p.n, p.m, p.k, dtype=p.dtype.np),
    cr.Tri: lambda p, ins: np.tri(p.n, p.m, p.k, dtype=p.dtype.np),
    cr.Window: _window,
}
