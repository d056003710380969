"""The inputs of every rank for one collective check, shared by the job scripts
(collectives_job.py, nccl_checks.py): rank r's array comes from seed 1000 * seed + r, so
every process can compute every other's and the NumPy reference."""

import numpy as np


def rank_inputs(shape, npd, seed, size):
    """The input of each of ``size`` ranks, as NumPy arrays of dtype ``npd``."""
    out = []
    for r in range(size):
        g = np.random.default_rng(1000 * seed + r)
        if npd == np.bool_:
            out.append(g.random(shape) < 0.5)
        elif np.dtype(npd).kind in "iu":
            out.append(g.integers(0, 20, shape).astype(npd))
        elif np.dtype(npd).kind == "c":
            out.append((g.normal(size=shape) + 1j * g.normal(size=shape)).astype(npd))
        else:
            out.append(g.normal(size=shape).astype(npd))
    return out
