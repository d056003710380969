"""Checks of an ``nccl`` communicator on CuPy arrays against NumPy, for any world size
(every rank builds every rank's input from one seed). Used by test_nccl.py (world
size 1 on one GPU); needs only NumPy, CuPy and ml_dtypes, so it also runs where
lazyx is not installed, on the communicator alone."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from rank_inputs import rank_inputs  # beside this script (sys.path[0])

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int64, np.int8,
          np.uint8, np.bool_, np.complex64]
SHAPES = [(), (5,), (3, 4)]


def _host(x) -> np.ndarray:
    a = x.get()
    return a.astype(np.float64) if a.dtype == np.dtype(ml_dtypes.bfloat16) else a


def check_communicator(comm, cp) -> int:
    """Run every collective of ``comm`` over dtypes and shapes; returns the count."""
    rank, size = comm.rank, comm.size
    n = 0
    seed = 0
    for npd in DTYPES:
        for shape in SHAPES + [(2 * size, 3)]:
            seed += 1
            xs = rank_inputs(shape, npd, seed, size)
            x = cp.asarray(xs[rank])
            wide = [a.astype(np.complex128 if a.dtype.kind == "c" else np.float64) for a in xs]
            total = np.sum(wide, axis=0)
            if npd == np.bool_:
                total = total > 0
            tol = 5e-2 if npd in (np.float16, ml_dtypes.bfloat16) else 1e-5
            out = comm.all_reduce(x, "sum")
            assert isinstance(out, cp.ndarray) and out.shape == x.shape and out.dtype == x.dtype
            np.testing.assert_allclose(_host(out).astype(total.dtype), total, rtol=tol, atol=tol)
            if np.dtype(npd).kind != "c":
                for op, f in (("max", np.max), ("min", np.min)):
                    got = _host(comm.all_reduce(x, op))
                    np.testing.assert_array_equal(got, f(np.stack(xs), axis=0).astype(got.dtype))
            gathered = _host(comm.all_gather(x))
            want = np.stack(xs) if shape == () else np.concatenate(xs)
            np.testing.assert_array_equal(gathered, want.astype(gathered.dtype))
            if shape and shape[0] % size == 0:
                k = shape[0] // size
                got = _host(comm.reduce_scatter(x))
                np.testing.assert_allclose(got.astype(total.dtype), total[rank * k:(rank + 1) * k],
                                           rtol=tol, atol=tol)
            n += 1
    # A transposed (not contiguous) input.
    x = cp.arange(12, dtype=cp.float32).reshape(3, 4).T
    np.testing.assert_array_equal(comm.all_reduce(x, "sum").get(), size * np.arange(12.0).reshape(3, 4).T)
    # split: everyone in one group, ranks reversed by the key.
    sub = comm.split(0, size - 1 - rank)
    assert (sub.rank, sub.size) == (size - 1 - rank, size)
    got = sub.all_gather(cp.asarray(np.array([rank], np.int32))).get()
    np.testing.assert_array_equal(got, np.arange(size)[::-1])
    return n + 2
