"""Plugin overhead: a plugin's primitive against a built-in one, in one run.

    python benchmarks/plugin_overhead.py [--quick]

``lazyx.core.ext.axpby`` (the ``lazyx-axpby`` distribution: a primitive of
another package, found by entry point, its C++ kernel run through its own
``eval_cpu``) is timed beside the built-in ``lazyx.core.add`` (kernel from the
cpu backend's table) on small float32 arrays, where the time is the
framework's own cost. Per call, in microseconds (medians, the cases taking
turns):

* **create**: the op call alone, adding the node (nothing runs);
* **create + eval**: the op call and ``eval`` of its result;
* **kernel**: the kernel that ``eval`` dispatches to, called directly on the
  buffers (what the kernel itself costs);
* **framework**: create + eval minus kernel, the part a plugin could make dearer.

``alpha * x + beta * y`` written with three built-in ops is shown as well:
what a user without the plugin would run.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import compare, machine_load  # noqa: E402

SIZE = 16
CALLS = 200  # per timed sample, so a sample is long enough to time


def _per_call(step):
    def run():
        for _ in range(CALLS):
            step()
    return run


def cases(mx):
    """{row: {column: zero-argument callable making CALLS calls}}."""
    from lazyx.backend import dispatch_tables
    gen = np.random.default_rng(0)
    x = mx.array(gen.standard_normal(SIZE).astype(np.float32))
    y = mx.array(gen.standard_normal(SIZE).astype(np.float32))
    axpby, add, ev = mx.ext.axpby, mx.add, mx.eval
    tables = dispatch_tables()[0]

    def kernel_of(node):
        fn = tables[node._prim.stream.kind][type(node._prim)]
        prim, bufs = node._prim, [a._data for a in node._inputs]
        return lambda: fn(prim, bufs)

    rows = {
        "built-in  add(x, y)": (lambda: add(x, y), add(x, y)),
        "plugin    ext.axpby(x, y, 2, 3)": (lambda: axpby(x, y, 2.0, 3.0), axpby(x, y, 2.0, 3.0)),
    }
    out = {}
    for name, (make, node) in rows.items():
        out[name] = {"create": _per_call(make),
                     "create + eval": _per_call(lambda make=make: ev(make())),
                     "kernel": _per_call(kernel_of(node))}
    out["built-ins 2 * x + 3 * y (3 ops)"] = {
        "create": _per_call(lambda: 2.0 * x + 3.0 * y),
        "create + eval": _per_call(lambda: ev(2.0 * x + 3.0 * y)),
    }
    return out


def check(mx) -> None:
    """Both compute what NumPy does (a benchmark of a wrong result is void)."""
    a = np.linspace(-1, 1, SIZE, dtype=np.float32)
    b = np.linspace(2, 3, SIZE, dtype=np.float32)
    np.testing.assert_allclose(np.array(mx.ext.axpby(mx.array(a), mx.array(b), 2.0, 3.0)), 2 * a + 3 * b,
                               rtol=1e-6)
    np.testing.assert_allclose(np.array(mx.add(mx.array(a), mx.array(b))), a + b, rtol=1e-6)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="spend less time per figure")
    args = parser.parse_args(argv)

    import lazyx.core as mx
    try:
        mx.ext.axpby
    except AttributeError:
        print("lazyx-axpby is not installed: pip install ./extensions_example", file=sys.stderr)
        return 1
    from lazyx_axpby import kernels
    check(mx)

    grid = cases(mx)
    fns = {(row, col): fn for row, cols in grid.items() for col, fn in cols.items()}
    load = machine_load()
    times = compare(fns, budget_s=0.4 if args.quick else 2.0)
    us = {k: v / CALLS * 1e6 for k, v in times.items()}

    columns = ["create", "create + eval", "kernel", "framework"]
    width = max(len(r) for r in grid)
    print(f"Per call, µs (median of interleaved samples; float32[{SIZE}]; "
          f"machine load before: {load:.0%}; axpby kernel: "
          f"{'C++ (nanobind)' if kernels.NATIVE_ERROR is None else 'NumPy fallback'})")
    print(f"{'':{width}} | " + " | ".join(f"{c:>13}" for c in columns))
    print("-" * width + "-+-" + "-+-".join("-" * 13 for _ in columns))
    for row in grid:
        cells = [us.get((row, c)) for c in columns[:3]]
        if cells[1] is not None and cells[2] is not None:
            cells.append(cells[1] - cells[2])
        else:
            cells.append(None)
        print(f"{row:{width}} | " + " | ".join(f"{'—' if v is None else f'{v:.2f}':>13}" for v in cells))
    add_row, plugin_row = list(grid)[:2]
    for col in ("create", "create + eval"):
        print(f"plugin / built-in, {col}: {us[(plugin_row, col)] / us[(add_row, col)]:.2f}×")
    fw_add = us[(add_row, "create + eval")] - us[(add_row, "kernel")]
    fw_plugin = us[(plugin_row, "create + eval")] - us[(plugin_row, "kernel")]
    print(f"plugin / built-in, framework: {fw_plugin / fw_add:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
