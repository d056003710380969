"""fft: a 1M-point complex64 FFT and a 2048x2048 float32 rfft2, side by side with NumPy,
SciPy, PyTorch and MLX.

lazyx runs Intel MKL through ``mkl_fft`` where ``lazyx[mkl]`` is installed (as
PyTorch's CPU build does), else pocketfft through ``scipy.fft`` (single precision,
``workers`` threads; see ``backends/cpu/kernels/fft.py``); the first line says which.
``--pocketfft`` measures lazyx on pocketfft even where MKL is installed. NumPy's ``numpy.fft`` is pocketfft in double
precision (its result is cast back to complex64, as a user keeping complex64 would);
SciPy runs the same call lazyx makes; PyTorch and MLX their own CPU FFTs. Prints the
fastest of the interleaved repeats in milliseconds (the machine may be shared) and
lazyx's time over each peer's (target: at most 1.2x the fastest peer).
Run: ``python -m benchmarks.fft [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load, side_by_side  # noqa: E402

WORKERS = os.cpu_count() or 1


def _fft_1m():
    rng = np.random.default_rng(0)
    n = 1 << 20
    return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)


def _image():
    return np.random.default_rng(1).standard_normal((2048, 2048)).astype(np.float32)


#: {title: (make the input, lazyx / NumPy / SciPy / PyTorch / MLX function name)}
CASES = {
    "fft 1M complex64": (_fft_1m, "fft"),
    "rfft2 2048x2048 float32": (_image, "rfft2"),
}


def callables(peers, x: np.ndarray, name: str) -> dict:
    """{column: zero-argument callable computing the transform and waiting for it}."""
    import scipy.fft

    out = {}
    lx = peers["lazyx"].module
    lx_x = lx.array(x)
    out["lazyx"] = lambda: lx.eval(getattr(lx.fft, name)(lx_x))
    out["NumPy"] = lambda: getattr(np.fft, name)(x).astype(np.complex64)
    out["SciPy"] = lambda: getattr(scipy.fft, name)(x, workers=WORKERS)
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        t_x = torch.from_numpy(x)

        def run_torch():
            with torch.inference_mode():
                getattr(torch.fft, name)(t_x)
        out["PyTorch"] = run_torch
    if "MLX" in peers:
        mx = peers["MLX"].module
        m_x = mx.array(x)
        out["MLX"] = lambda: mx.eval(getattr(mx.fft, name)(m_x))
    return out


def check(peers, x: np.ndarray, name: str) -> None:
    """lazyx computes what NumPy computes (a benchmark of a wrong result is void)."""
    lx = peers["lazyx"].module
    got = np.asarray(getattr(lx.fft, name)(lx.array(x)))
    want = getattr(np.fft, name)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    ap.add_argument("--pocketfft", action="store_true", help="lazyx on pocketfft, not MKL")
    args = ap.parse_args(argv)
    peers = load()
    from lazyx.backends.cpu.kernels import fft as cpu_fft
    if args.pocketfft:
        cpu_fft.LIBRARY = "pocketfft"
    print(f"machine load before: {machine_load():.0%}; lazyx's CPU FFT: {cpu_fft.library()}; "
          f"scipy.fft workers={WORKERS}")
    for title, (make, name) in CASES.items():
        x = make()
        check(peers, x, name)
        t = compare(callables(peers, x, name), budget_s=1.0 if args.quick else 4.0,
                    rounds=4, warmup=2, statistic=min)
        print(side_by_side(title, t, 26), flush=True)


if __name__ == "__main__":
    main()
