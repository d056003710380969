"""Timing: median of repeats after warm-ups, within a time budget per measurement."""

from __future__ import annotations

import statistics
import time


def median_time(fn, *, warmup: int = 3, budget_s: float = 0.4, min_repeats: int = 7,
                max_repeats: int = 200) -> float:
    """The median wall time of ``fn()`` in seconds.

    ``fn`` runs ``warmup`` times unmeasured, then at least ``min_repeats`` times
    and until ``budget_s`` seconds have been spent (at most ``max_repeats``).
    ``fn`` must itself wait for its result (evaluate, block until ready).
    """
    for _ in range(warmup):
        fn()
    times = []
    clock = time.perf_counter
    end = clock() + budget_s
    while len(times) < max_repeats and (len(times) < min_repeats or clock() < end):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def machine_load(seconds: float = 0.3) -> float:
    """The fraction of all CPUs busy (user + system + steal) over ``seconds``, from
    /proc/stat; NaN where it cannot be read. Other processes make timings noisy."""
    def snapshot():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v), idle
    try:
        t0, i0 = snapshot()
        time.sleep(seconds)
        t1, i1 = snapshot()
    except (OSError, ValueError, IndexError):
        return float("nan")
    return 1.0 - (i1 - i0) / max(1, t1 - t0)
