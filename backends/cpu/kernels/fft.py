"""CPU kernels of the fft op pack: pocketfft through ``scipy.fft``.

One kernel serves every :class:`~lazyx.plugins.fft.FFT` node: the node's flags pick
``fftn``, ``ifftn``, ``rfftn`` or ``irfftn`` of a ``scipy.fft``-like module, and
its ``norm`` goes to that call, so the scaling costs no second pass. SciPy's
pocketfft keeps complex64 and float32 in single precision (``numpy.fft`` would
compute in double and need a cast back) and runs the transforms of a batch on
``workers`` threads. The CUDA backend builds its kernel from the same function
over ``cupy.fft`` (cuFFT).
"""

import os

from lazyx.plugins import fft as ff

#: Threads for the transforms of one node (pocketfft splits a batch of 1-D
#: transforms between them; a single transform runs on one).
WORKERS = os.cpu_count() or 1

_scipy_fft = []


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


KERNELS = {
    ff.FFT: transform_kernel(_scipy, workers=WORKERS),
}
