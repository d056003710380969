"""CUDA kernels of the fft op pack: cuFFT through ``cupy.fft``.

The CPU kernel's function (:func:`lazyx.backends.cpu.kernels.fft.transform_kernel`)
over ``cupy.fft`` instead of ``scipy.fft``: CuPy plans each transform with cuFFT
(caching the plan) and, like pocketfft, keeps complex64 and float32 in single
precision and applies ``norm`` in the same call.
"""

import cupy as cp

from lazyx.backends.cpu.kernels.fft import transform_kernel
from lazyx.plugins import fft as ff

KERNELS = {
    ff.FFT: transform_kernel(lambda: cp.fft),
}
