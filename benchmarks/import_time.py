"""What ``import lazyx.core`` costs, side by side with ``import numpy`` (and the peers).

    python benchmarks/import_time.py [--repeats N]

Each import runs in a fresh interpreter, alternating between the modules so that
they see the same machine; the figure is the median time of the ``import``
statement itself, read with ``time.perf_counter`` inside that interpreter (Python's
start-up and shutdown are the same for every module and left out). lazyx's target is at most twice NumPy's, on the same machine in one
run. ``lazyx.core (no plugins)`` sets ``LAZYX_DISABLE_PLUGIN_AUTOLOAD=1``: the
built-in packs only, whatever else is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys

CASES = {
    "numpy": "import numpy",
    "lazyx.core": "import lazyx.core",
    "lazyx.core (no plugins)": "import lazyx.core",
    "mlx.core": "import mlx.core",
    "torch": "import torch",
    "jax": "import jax",
}


def _available(name: str) -> bool:
    module = CASES[name].split()[-1]
    return importlib.util.find_spec(module.split(".")[0]) is not None


def _once(name: str) -> float:
    # An installed package has its bytecode compiled (pip does it at install time); let
    # the warm-up write it here too, so the figure is the import, not the compiler.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if name.endswith("(no plugins)"):
        env["LAZYX_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    code = (f"import time; t = time.perf_counter(); {CASES[name]}; "
            f"print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, env=env,
                         capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def measure(repeats: int = 15) -> dict:
    names = [n for n in CASES if _available(n)]
    for n in names:  # warm the file cache and the bytecode caches
        _once(n)
    times = {n: [] for n in names}
    for _ in range(repeats):
        for n in names:
            times[n].append(_once(n))
    return {n: statistics.median(ts) for n, ts in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    got = measure(args.repeats)
    numpy_s = got["numpy"]
    print(f"{'import':<26}{'ms':>9}{'/ numpy':>10}")
    for name, s in got.items():
        print(f"{name:<26}{s * 1e3:>9.1f}{s / numpy_s:>9.2f}x")
    ratio = got["lazyx.core"] / numpy_s
    print(f"\nimport lazyx.core = {ratio:.2f}x import numpy (target: at most 2x)")


if __name__ == "__main__":
    main()
