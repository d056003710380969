"""Run every benchmark, print the tables and write benchmarks/RESULTS.md.

    python benchmarks/run.py [--quick] [--wait-quiet SECONDS]

lazyx is measured side by side with NumPy, MLX (CPU build), PyTorch and JAX
in one process, so all see the same machine at the same time. Times are
medians of repeats after warm-ups. ``--quick`` spends less time per figure.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import overhead, peers as peer_mod, throughput  # noqa: E402
from benchmarks.timing import compare, machine_load  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# -- environment -------------------------------------------------------------------
def cpu_model() -> str:
    import lazyx.core as lx  # the benchmarks load it anyway
    return lx.device_info(lx.cpu)["device_name"]


def openblas_core() -> str:
    """The kernel family ("core") NumPy's OpenBLAS runs on this machine, or "unknown"."""
    import numpy  # noqa: F401  (loads OpenBLAS)
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return "unknown"
    for path in paths:
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return "unknown"


_MATMUL_CHILD = """
import json, sys, numpy as np
sys.path.insert(0, {root!r})
from benchmarks.run import openblas_core
from benchmarks.timing import median_time
p = np.random.default_rng(0).standard_normal(({n}, {n}), dtype=np.float32)
t = median_time(lambda: np.matmul(p, p), budget_s={budget})
print(json.dumps({{"seconds": t, "core": openblas_core()}}))
"""


def matmul_without_openblas_env(budget: float):
    """NumPy's matmul timed in a child with OPENBLAS_CORETYPE/L2_SIZE unset, when
    this process has either set: (seconds, core), or None when neither is set."""
    if not any(v in os.environ for v in OPENBLAS_VARS):
        return None
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARS}
    code = _MATMUL_CHILD.format(root=os.path.dirname(HERE), n=throughput.MATMUL_N, budget=budget)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["seconds"], d["core"]


# -- formatting --------------------------------------------------------------------
def fmt_time(t: float | None, unit: str) -> str:
    if t is None or not math.isfinite(t):
        return "—"
    scale = {"ms": 1e3, "µs": 1e6}[unit]
    v = t * scale
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None or not math.isfinite(r) else f"{r:.2f}×"


def best_peer(row: dict) -> tuple[str | None, float | None]:
    found = [(row[c], c) for c in peer_mod.PEERS if row.get(c) is not None]
    if not found:
        return None, None
    t, c = min(found)
    return c, t


def table(title: str, unit: str, rows: dict, columns) -> list[str]:
    head = ["", *columns, "lazyx / NumPy", "lazyx / best peer"]
    lines = [f"**{title}** ({unit}, median; lower is better)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        peer, t = best_peer(row)
        lx = row.get("lazyx")
        cells = [name, *(fmt_time(row.get(c), unit) for c in columns),
                 fmt_ratio(lx / row["NumPy"] if lx and row.get("NumPy") else None),
                 fmt_ratio(lx / t if lx and t else None) + (f" ({peer})" if peer else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# -- the run -----------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure (noisier)")
    ap.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="first wait up to S seconds for the machine to be idle (other load < 10%%)")
    args = ap.parse_args(argv)
    deadline = time.perf_counter() + args.wait_quiet
    while time.perf_counter() < deadline and not machine_load(1.0) < 0.1:
        pass
    budget = 0.15 if args.quick else 0.4
    started = time.perf_counter()
    load_before = machine_load()

    peers = peer_mod.load()
    columns = [c for c in peer_mod.COLUMNS if c in peers]

    # (a) per-op overhead
    overhead.check(peers)
    over = {col: t / overhead.N_OPS
            for col, t in compare(overhead.cases(peers), budget_s=budget).items()}
    over_rows = {f"{overhead.N_OPS}-op chain, {overhead.SIZE} float32, per op": over}

    # (b) throughput
    thr_rows, wrong, torch_one_thread = {}, {}, []
    for case in throughput.cases(peers):
        bad = throughput.check(case)
        row = compare({c: f for c, f in case.runs.items() if c not in bad}, budget_s=budget)
        one = row.pop(throughput.TORCH_ONE_THREAD, None)
        if one is not None and row.get("PyTorch") is not None and one < row["PyTorch"]:
            row["PyTorch"] = one
            torch_one_thread.append(case.name)
        if bad:
            wrong[case.name] = bad
        thr_rows[case.name] = row
    copy_t, copy_gbs = throughput.copy_bandwidth()
    core = openblas_core()
    unset = matmul_without_openblas_env(budget)
    load_after = machine_load()
    elapsed = time.perf_counter() - started

    # -- report --
    lines = ["# lazyx benchmarks", "",
             f"`python benchmarks/run.py` on {cpu_model()}, {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}; run took {elapsed:.0f} s. "
             f"Other load on the machine while measuring: {load_before:.0%} before, "
             f"{load_after:.0%} after (CPU busy outside this process makes the figures noisier, "
             f"multi-threaded ones most).", ""]
    lines.append("Versions: " + "; ".join(
        f"{p.name} {p.version}" + (f" ({', '.join(p.notes)})" if p.notes else "")
        for p in peers.values() if p.name != "lazyx NumPy kernels") + ".")
    lines.append("")
    lines += table("(a) Per-op overhead", "µs", over_rows, columns)
    lines += ["", "lazyx and MLX build the graph and evaluate it; NumPy, PyTorch and JAX run each op "
              "eagerly. \"lazyx NumPy kernels\" is lazyx on its `cpu-reference` backend.", ""]
    lines += table("(b) Throughput, float32", "ms", thr_rows, columns)
    lines.append("")
    lines.append(f"Bandwidth reference: NumPy copy of {throughput.N // 2**20}M float32 "
                 f"({4 * throughput.N // 2**20} MiB): {copy_t * 1e3:.3g} ms, {copy_gbs:.1f} GB/s "
                 f"(read + write).")
    env_note = ", ".join(f"{v}={os.environ[v]}" for v in OPENBLAS_VARS if v in os.environ) or "neither set"
    lines.append(f"NumPy matmul: OpenBLAS core {core}; OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE: {env_note}.")
    if unset is not None:
        t, other = unset
        if other != core:
            lines.append(f"With both unset (in a child process) OpenBLAS runs core {other}: "
                         f"matmul {t * 1e3:.3g} ms.")
        else:
            lines.append(f"With both unset OpenBLAS runs the same core; matmul {t * 1e3:.3g} ms.")
    if torch_one_thread:
        lines.append(f"PyTorch is timed with its default threads and with one; its one-thread time "
                     f"was the faster, and is shown, for: {', '.join(torch_one_thread)}.")
    for name, cols in wrong.items():
        lines.append(f"**Wrong result, time not reported:** {name}: {', '.join(cols)}.")
    lines += ["", "## Targets", ""]
    lines += targets(over, thr_rows)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
            f.write(text)
    return 0


def targets(over: dict, thr: dict) -> list[str]:
    out = []
    ratios = {name: row["lazyx"] / row["NumPy"] for name, row in thr.items()
              if row.get("lazyx") and row.get("NumPy")}
    met = [n for n, r in ratios.items() if r <= 1.1]
    out.append(f"- ≥1M-element ops within 1.1× of NumPy's time: {len(met)} of {len(ratios)} "
               f"({', '.join(f'{n} {r:.2f}×' for n, r in ratios.items())}).")
    if over.get("MLX"):
        r = over["lazyx"] / over["MLX"]
        out.append(f"- Per-op overhead ≤ 3× MLX's: {over['lazyx'] * 1e6:.2f} µs vs "
                   f"{over['MLX'] * 1e6:.2f} µs per op, {r:.2f}× — {'met' if r <= 3 else 'not met'}.")
    for name, row in thr.items():
        if name.startswith("softmax") and row.get("PyTorch") and row.get("lazyx"):
            r = row["PyTorch"] / row["lazyx"]
            out.append(f"- Native softmax ≥ 2× PyTorch's throughput, {name}: {r:.2f}× — "
                       f"{'met' if r >= 2 else 'not met'}.")
    return out


if __name__ == "__main__":
    sys.exit(main())
