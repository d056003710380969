"""The frameworks measured side by side, each imported only if installed.

Each entry of :func:`load` is a :class:`Peer`: a column name, a version, and
``module`` (the imported namespace the benchmark cases use).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

#: Column order of every table.
COLUMNS = ("lazyx", "lazyx NumPy kernels", "NumPy", "MLX", "PyTorch", "JAX")
#: The peers lazyx is compared with ("best peer" is the fastest of these).
PEERS = ("NumPy", "MLX", "PyTorch", "JAX")


@dataclass
class Peer:
    name: str
    version: str
    module: object
    notes: list = field(default_factory=list)


def _try(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # an installed but broken package counts as absent
        return None


def load() -> dict[str, Peer]:
    """{column name: Peer} for every framework that imports."""
    import numpy as np

    import lazyx
    import lazyx.core as lx
    from lazyx.backends.cpu import native_kernels

    out = {}
    native = native_kernels.load()
    note = (f"native module: {native.get_num_threads()} threads, {native.build_info()['simd']}"
            if native is not None else "native module not built")
    out["lazyx"] = Peer("lazyx", getattr(lazyx, "__version__", "dev"), lx, [note])
    out["lazyx NumPy kernels"] = Peer("lazyx NumPy kernels", "cpu-reference backend", lx)
    out["NumPy"] = Peer("NumPy", np.__version__, np)
    mlx = _try("mlx.core")
    if mlx is not None:
        out["MLX"] = Peer("MLX", getattr(mlx, "__version__", "?"), mlx, ["CPU build"])
    torch = _try("torch")
    if torch is not None:
        out["PyTorch"] = Peer("PyTorch", torch.__version__, torch,
                              [f"{torch.get_num_threads()} threads"])
    jax = _try("jax")
    if jax is not None:
        import jax.numpy  # noqa: F401
        import jax.nn  # noqa: F401
        out["JAX"] = Peer("JAX", jax.__version__, jax, ["jit for throughput, eager for overhead"])
    return out
