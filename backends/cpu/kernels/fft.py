"""CPU kernels of the fft op pack: Intel MKL through ``mkl_fft`` where it is installed,
else pocketfft through ``scipy.fft``.

One kernel serves every :class:`~lazyx.plugins.fft.FFT` node: the node's flags pick
``fftn``, ``ifftn``, ``rfftn`` or ``irfftn`` of a ``scipy.fft``-like module, and
its ``norm`` goes to that call, so the scaling costs no second pass. SciPy's
pocketfft keeps complex64 and float32 in single precision (``numpy.fft`` would
compute in double and need a cast back) and runs the transforms of a batch on
``workers`` threads. The CUDA backend builds its kernel from the same function
over ``cupy.fft`` (cuFFT).

Which library runs is :data:`LIBRARY` (``LAZYX_CPU_FFT``; ``"auto"``: MKL when
``mkl_fft`` imports, the optional extra ``lazyx[mkl]``). MKL is PyTorch's CPU FFT: it runs even a single long
transform on every core with kernels for the machine's vector width, 2-3.5x faster than
pocketfft on a 1M-point transform and 1.5x on a 2048x2048 ``rfft2`` (benchmarks/fft.py).
Both keep complex64 and float32 in single precision and take ``s``, ``axes`` and
``norm`` in one call. MKL is a 700 MB install, so it stays optional: without it the
transforms run on pocketfft, as below.

pocketfft runs one transform on one thread, however long, so the CPU kernel splits
a single long 1-D complex transform itself (:func:`_split`): one radix-``r`` step of
the Cooley-Tukey recursion turns it into ``r`` transforms of ``n / r`` points, which
pocketfft runs on ``r`` threads, and the step's twiddle factors and ``r``-point
transforms are one pass over the result, also split between the threads.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lazyx.environment import read_variable
from lazyx.plugins import fft as ff

#: Threads for the transforms of one node (pocketfft splits a batch of 1-D
#: transforms between them; :func:`_split` a single long one).
WORKERS = os.cpu_count() or 1

#: The shortest single transform :func:`_split` splits: below it, the threads'
#: wake-ups and the extra pass cost more than they save.
SPLIT_MIN = 1 << 16

#: Columns of the recombining pass a thread handles at a time (its temporary stays in cache).
_BLOCK = 1 << 13

#: ``"auto"`` (MKL if ``mkl_fft`` imports, else pocketfft), ``"mkl"`` or ``"pocketfft"``:
#: ``LAZYX_CPU_FFT`` (read once, here); consulted at each transform, so a test may switch it.
LIBRARY = read_variable("LAZYX_CPU_FFT") or "auto"

_scipy_fft = []
_mkl_fft = []
_pool = []
_twiddles: dict = {}


def transform_kernel(load, norm=None, **options):
    """The kernel of :class:`FFT` over the module ``load()`` returns (``scipy.fft``,
    ``cupy.fft``), which must offer ``fftn``/``ifftn``/``rfftn``/``irfftn`` with
    ``s``, ``axes`` and ``norm``; ``options`` go to every call. ``norm``, when given,
    replaces the node's normalisation (the caller then scales the result itself)."""
    def kernel(p, ins):
        x, axes, m = ins[0], p.axes, load()
        scale = p.norm if norm is None else norm
        if not p.real:
            return (m.ifftn if p.inverse else m.fftn)(x, axes=axes, norm=scale, **options)
        if not p.inverse:
            return m.rfftn(x, axes=axes, norm=scale, **options)
        s = [x.shape[k] for k in axes]
        s[-1] = 2 * (s[-1] - 1) + p.odd
        return m.irfftn(x, s=s, axes=axes, norm=scale, **options)
    return kernel


def _scipy():
    if not _scipy_fft:
        import scipy.fft  # half a second to import: only once a transform runs
        _scipy_fft.append(scipy.fft)
    return _scipy_fft[0]


def _mkl():
    """``mkl_fft`` (its ``fftn``/``ifftn``/``rfftn``/``irfftn`` take ``s``, ``axes`` and
    ``norm``, as scipy.fft's), or None where it is not installed."""
    if not _mkl_fft:
        try:
            import mkl_fft  # MKL's libraries load only once a transform runs
        except ImportError:
            mkl_fft = None
        _mkl_fft.append(mkl_fft)
    return _mkl_fft[0]


def library() -> str:
    """The library the next CPU transform runs on: ``"mkl"`` or ``"pocketfft"``."""
    if LIBRARY == "pocketfft" or (LIBRARY == "auto" and _mkl() is None):
        return "pocketfft"
    if LIBRARY not in ("auto", "mkl"):
        raise ValueError(f"lazyx.backends.cpu.kernels.fft.LIBRARY: {LIBRARY!r} is not one of "
                         f"'auto', 'mkl', 'pocketfft'")
    if _mkl() is None:
        raise ImportError("The CPU FFT library is 'mkl' (LAZYX_CPU_FFT) but mkl_fft is not "
                          "installed: pip install 'lazyx[mkl]', or unset LAZYX_CPU_FFT")
    return "mkl"


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


def _mkl_kernel():
    """The kernel over ``mkl_fft``, which always transforms with ``norm="backward"``:
    mkl_fft 2.3 scales ``ortho`` and ``forward`` by the size of every axis, not only the
    transformed ones, so any other normalisation is one in-place multiply here."""
    unscaled = transform_kernel(_mkl, norm="backward")

    def kernel(p, ins):
        out = unscaled(p, ins)
        if p.norm == "backward":
            return out
        n = math.prod(out.shape[k] if p.real and p.inverse else ins[0].shape[k] for k in p.axes)
        # The scale asked for over the one ``backward`` applied (1, or 1 / n on the inverse).
        want = n ** -0.5 if p.norm == "ortho" else 1.0 if p.inverse else 1 / n
        scale = want * n if p.inverse else want
        out *= out.dtype.type(scale)
        return out
    return kernel


def _cpu_kernel():
    """MKL's kernel (:func:`library`), else SciPy's with a single long 1-D complex
    transform split (see :func:`_split`). An empty array goes to SciPy's either way
    (MKL takes no zero-length batch)."""
    batched = transform_kernel(_scipy, workers=WORKERS)
    mkl = _mkl_kernel()

    def kernel(p, ins):
        x = ins[0]
        if x.size and library() == "mkl":
            return mkl(p, ins)
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
