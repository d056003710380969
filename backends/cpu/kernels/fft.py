"""CPU kernels of the fft op pack: pocketfft through ``scipy.fft``.

One kernel serves every :class:`~lazyx.plugins.fft.FFT` node: the node's flags pick
``fftn``, ``ifftn``, ``rfftn`` or ``irfftn`` of a ``scipy.fft``-like module, and
its ``norm`` goes to that call, so the scaling costs no second pass. SciPy's
pocketfft keeps complex64 and float32 in single precision (``numpy.fft`` would
compute in double and need a cast back) and runs the transforms of a batch on
``workers`` threads. The CUDA backend builds its kernel from the same function
over ``cupy.fft`` (cuFFT).

pocketfft runs one transform on one thread, however long, so the CPU kernel splits
a single long 1-D complex transform itself (:func:`_split`): one radix-``r`` step of
the Cooley-Tukey recursion turns it into ``r`` transforms of ``n / r`` points, which
pocketfft runs on ``r`` threads, and the step's twiddle factors and ``r``-point
transforms are one pass over the result, also split between the threads.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lazyx.plugins import fft as ff

#: Threads for the transforms of one node (pocketfft splits a batch of 1-D
#: transforms between them; :func:`_split` a single long one).
WORKERS = os.cpu_count() or 1

#: The shortest single transform :func:`_split` splits: below it, the threads'
#: wake-ups and the extra pass cost more than they save.
SPLIT_MIN = 1 << 16

#: Columns of the recombining pass a thread handles at a time (its temporary stays in cache).
_BLOCK = 1 << 13

_scipy_fft = []
_pool = []
_twiddles: dict = {}


def transform_kernel(load, **options):
    """The kernel of :class:`FFT` over the module ``load()`` returns (``scipy.fft``,
    ``cupy.fft``), which must offer ``fftn``/``ifftn``/``rfftn``/``irfftn`` with
    ``s``, ``axes`` and ``norm``; ``options`` go to every call."""
    def kernel(p, ins):
        x, axes, m = ins[0], p.axes, load()
        if not p.real:
            return (m.ifftn if p.inverse else m.fftn)(x, axes=axes, norm=p.norm, **options)
        if not p.inverse:
            return m.rfftn(x, axes=axes, norm=p.norm, **options)
        s = [x.shape[k] for k in axes]
        s[-1] = 2 * (s[-1] - 1) + p.odd
        return m.irfftn(x, s=s, axes=axes, norm=p.norm, **options)
    return kernel


def _scipy():
    if not _scipy_fft:
        import scipy.fft  # half a second to import: only once a transform runs
        _scipy_fft.append(scipy.fft)
    return _scipy_fft[0]


def _radix(n: int) -> int:
    """The split of a single ``n``-point transform: the most threads (up to
    :data:`WORKERS`) that divide ``n``; 1 for no split."""
    if n < SPLIT_MIN:
        return 1
    return next((r for r in range(WORKERS, 1, -1) if n % r == 0), 1)


def _twiddle(n: int, r: int, inverse: bool, norm: str):
    """``T[q, k] = scale * exp(-+2 pi i q k / n)`` (``r`` by ``n / r``, complex64, kept
    for the last few sizes), the node's normalisation folded in; the angles are
    reduced modulo ``n`` in integers and computed in float64."""
    key = (n, r, inverse, norm)
    t = _twiddles.get(key)
    if t is None:
        k = np.arange(n // r, dtype=np.int64)
        q = np.arange(r, dtype=np.int64)[:, None]
        sign = 1.0 if inverse else -1.0
        scale = {"backward": 1 / n if inverse else 1.0, "ortho": n ** -0.5,
                 "forward": 1.0 if inverse else 1 / n}[norm]
        t = (scale * np.exp(sign * 2j * np.pi * ((q * k) % n) / n)).astype(np.complex64)
        if len(_twiddles) >= 4:
            _twiddles.clear()
        _twiddles[key] = t
    return t


def _split(p, x, m, r: int):
    """The transform of the single ``n``-point sequence ``x`` (complex) in two passes,
    each split over ``r`` threads: the ``r`` transforms ``Y_j`` of ``x[j::r]``
    (``n / r`` points, unscaled), one a thread (pocketfft's own ``workers`` do not
    split fewer transforms than its vector width), then
    ``X[q n/r + k] = sum_j T[j, k] Y_j[k] exp(-+2 pi i j q / r)`` over blocks of
    columns ``k`` (``T``: :func:`_twiddle`)."""
    n = x.size
    n2 = n // r
    fn = m.ifft if p.inverse else m.fft
    unscaled = "forward" if p.inverse else "backward"  # the scale is in the twiddles
    v = x.reshape(n)
    y = [None] * r

    def sub(j):
        y[j] = fn(v[j::r], norm=unscaled, workers=1)

    _on_threads(sub, [(j,) for j in range(r)])
    t = _twiddle(n, r, p.inverse, p.norm)
    out = np.empty((r, n2), y[0].dtype)
    unit = t[0, 0] == 1  # row 0 of the twiddles is the scale alone

    def columns(lo, hi):
        for a in range(lo, hi, _BLOCK):
            b = min(hi, a + _BLOCK)
            if r == 2:  # the 2-point transform: a sum and a difference
                z0 = y[0][a:b] if unit else y[0][a:b] * t[0, a:b]
                z1 = y[1][a:b] * t[1, a:b]
                np.add(z0, z1, out=out[0, a:b])
                np.subtract(z0, z1, out=out[1, a:b])
            else:
                out[:, a:b] = fn(np.stack([yj[a:b] for yj in y]) * t[:, a:b], axis=0,
                                 norm=unscaled)

    bounds = [n2 * i // r for i in range(r + 1)]
    _on_threads(columns, list(zip(bounds[:-1], bounds[1:])))
    return out.reshape(x.shape)


def _on_threads(fn, args: list) -> None:
    """``fn(*a)`` for each ``a`` of ``args`` at once: the first on the calling thread,
    the others on the pool's (``fn`` must let go of the GIL: NumPy and pocketfft do)."""
    if not _pool:
        _pool.append(ThreadPoolExecutor(WORKERS - 1, thread_name_prefix="lazyx-fft"))
    rest = [_pool[0].submit(fn, *a) for a in args[1:]]
    try:
        fn(*args[0])
    finally:
        for f in rest:  # every task done before the caller moves on ...
            f.exception()
    for f in rest:      # ... then the first error, if any
        f.result()


def _cpu_kernel():
    """SciPy's kernel, with a single long 1-D complex transform split (see
    :func:`_split`)."""
    batched = transform_kernel(_scipy, workers=WORKERS)

    def kernel(p, ins):
        x = ins[0]
        if not p.real and len(p.axes) == 1 and x.dtype.kind == "c":
            n = x.shape[p.axes[0]]
            r = _radix(n) if x.size == n else 1
            if r > 1:
                return _split(p, x, _scipy(), r)
        return batched(p, ins)
    return kernel


KERNELS = {
    ff.FFT: _cpu_kernel(),
}
