"""Timing: medians (or minima) of repeats after warm-ups, interleaved across the frameworks
compared, and the two-line table row that prints them with lazyx's ratios."""

from __future__ import annotations

import statistics
import time


def samples(fn, *, budget_s: float, min_repeats: int = 1, max_repeats: int = 200) -> list[float]:
    """Wall times of ``fn()`` in seconds: at least ``min_repeats`` and until ``budget_s``
    seconds have been spent (at most ``max_repeats``). ``fn`` must wait for its result."""
    times = []
    clock = time.perf_counter
    end = clock() + budget_s
    while len(times) < max_repeats and (len(times) < min_repeats or clock() < end):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def compare(fns: dict, *, budget_s: float, rounds: int = 8, warmup: int = 2,
            gap_s: float = 0.02, statistic=statistics.median) -> dict:
    """{name: median seconds} for zero-argument callables measured side by side.

    Each callable is warmed up, then the callables take turns for ``rounds``
    rounds, each round spending ``budget_s / rounds`` per callable; the median
    is over all of a callable's samples. Taking turns spreads a passing
    disturbance (another process, a core waking up) over every column; the
    order rotates each round and each turn starts after ``gap_s`` of idleness,
    so that no column always runs while the previous one's thread pool (OpenMP,
    OpenBLAS, XLA) is still spinning on the other core. ``statistic=min`` reports
    the fastest sample instead: on a machine shared with other work, the time a
    kernel takes when nothing disturbs it.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    got = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(gap_s)
            got[name] += samples(fns[name], budget_s=budget_s / rounds)
    return {name: statistic(ts) for name, ts in got.items()}


def side_by_side(title: str, times: dict, width: int = 26) -> str:
    """Two lines of a benchmark table: ``title`` and each column's milliseconds, then
    lazyx's time over each peer's and over the fastest peer's (``times`` is what
    :func:`compare` returns, with a ``"lazyx"`` column)."""
    ours = times["lazyx"]
    cells = "  ".join(f"{col} {sec * 1e3:8.2f} ms" for col, sec in times.items())
    ratios = "  ".join(f"lazyx/{col} {ours / sec:5.2f}x"
                       for col, sec in times.items() if col != "lazyx")
    best = min(sec for col, sec in times.items() if col != "lazyx")
    return (f"{title:{width}} {cells}\n{'':{width}} {ratios}  "
            f"(lazyx / fastest peer {ours / best:4.2f}x)")


def median_time(fn, *, budget_s: float = 0.4, warmup: int = 2) -> float:
    """The median wall time of ``fn()`` in seconds (one callable, see :func:`compare`)."""
    return compare({"fn": fn}, budget_s=budget_s, rounds=1, warmup=warmup)["fn"]


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


def waiting(fn, sync):
    """``fn`` followed by ``sync()`` (a GPU's synchronize): a timed call that waits for
    its work to finish."""
    def run():
        fn()
        sync()
    return run


class Table:
    """Rows of ``lazyx`` against its peers, each measured by :func:`compare` (medians of
    interleaved repeats), printed with the work rate of each column and lazyx's time
    over the best peer's. A row whose measurement raises is printed as failed."""

    def __init__(self, budget_s: float, rounds: int = 4):
        self.budget_s, self.rounds, self.rows = budget_s, rounds, []

    def row(self, label: str, fns: dict, work=None, unit: str = "", timer=None) -> None:
        """``fns``: ``{"lazyx": fn, peer: fn or None, ...}``; ``work / seconds / 1e9`` is
        printed in ``unit`` when ``work`` is given. ``timer(fns)`` replaces the wall-clock
        :func:`compare` where a row is timed otherwise (a GPU's events) and returns
        ``{name: seconds}`` the same way."""
        fns = {k: v for k, v in fns.items() if v is not None}
        try:
            t = (timer(fns) if timer is not None
                 else compare(fns, budget_s=self.budget_s, rounds=self.rounds))
        except Exception as exc:  # noqa: BLE001 - report and keep measuring the other rows
            self.rows.append((label, [f"failed: {type(exc).__name__}: {str(exc)[:160]}"],
                              float("nan"), ""))
            return
        best = min((v, k) for k, v in t.items() if k != "lazyx")
        cells = [f"{k} {v * 1e6:9.1f} µs" + (f" ({work / v / 1e9:7.1f} {unit})" if work else "")
                 for k, v in t.items()]
        self.rows.append((label, cells, t["lazyx"] / best[0], best[1]))

    def print(self, width: int) -> None:
        print()
        print(f"{'case':{width}s} | timings | lazyx / best peer")
        for label, cells, ratio, best in self.rows:
            print(f"{label:{width}s} | {' | '.join(cells)} | {ratio:.2f}x ({best})")
