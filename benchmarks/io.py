"""Save and load of a 1 GB safetensors file, against the disk and the peers.

    python benchmarks/io.py [--size-mb 1024] [--repeats 3]

One run writes a file of 16 float32 tensors (``--size-mb`` in all) under /tmp with
each of: lazyx (``mx.save_safetensors`` / ``mx.load``), safetensors' own NumPy API
(``safetensors.numpy.save_file`` / ``load_file``), PyTorch's (``safetensors.torch``)
and MLX, and measures the disk itself in the same run:

* **disk write**: one ``write`` of the same bytes from memory, then ``fsync``;
* **disk read**: ``readinto`` of the whole file into a preallocated buffer;
* **disk copy**: ``shutil.copyfile`` of the file (the plain copy speed).

Every save ends with ``fsync`` (so it is timed to the disk, not to the page cache).
Every load reads every byte it returns: a load is the call plus a touch of each page
of each tensor, because a memory-mapped load (lazyx, PyTorch) costs nothing until the
data is used. Loads are timed *cold* (the file's pages dropped from the page cache
with ``posix_fadvise(DONTNEED)``: the disk's speed) and *warm* (from the page cache:
a copying load pays a memory copy there, a mapping load does not). Ratios are to the
disk's own figure (``1.00x`` = at disk speed; below 1 is faster than a plain read,
as a mapping can be). Medians of ``--repeats`` runs. The files are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import lazyx.core as lx  # noqa: E402
from benchmarks.peers import _try  # noqa: E402

N_TENSORS = 16
_PAGE_FLOATS = 1024  # float32 per 4 KiB page


def _drop_cache(path: str) -> None:
    """Evict ``path``'s pages from the page cache (per file; no system setting touched)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _touch(host: np.ndarray) -> float:
    """Read one float of every page (what makes a mapped load read the file)."""
    return float(host.reshape(-1)[::_PAGE_FLOATS].sum())


def _median(fn, repeats: int, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cases(data: dict[str, np.ndarray]):
    """{name: (save(path), load(path) -> list of host arrays)} for each library present."""
    from safetensors import numpy as st_numpy

    cases = {}
    lx_data = {k: lx.array(v) for k, v in data.items()}
    lx.eval(*lx_data.values())
    cases["lazyx"] = (lambda p: lx.save_safetensors(p, lx_data),
                      lambda p: [np.asarray(a) for a in lx.load(p).values()])
    cases["safetensors.numpy"] = (lambda p: st_numpy.save_file(data, p),
                                  lambda p: list(st_numpy.load_file(p).values()))
    torch = _try("torch")
    if torch is not None:
        from safetensors import torch as st_torch
        t_data = {k: torch.from_numpy(v) for k, v in data.items()}
        cases["safetensors.torch"] = (lambda p: st_torch.save_file(t_data, p),
                                      lambda p: [t.numpy() for t in st_torch.load_file(p).values()])
    mlx = _try("mlx.core")
    if mlx is not None:
        m_data = {k: mlx.array(v) for k, v in data.items()}
        mlx.eval(*m_data.values())

        def mlx_load(p):
            out = mlx.load(p)
            mlx.eval(*out.values())
            return [np.array(a, copy=False) for a in out.values()]
        cases["MLX"] = (lambda p: mlx.save_safetensors(p, m_data), mlx_load)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    n = args.size_mb * 2**20 // 4 // N_TENSORS
    gen = np.random.default_rng(0)
    data = {f"layer{i}.weight": gen.standard_normal(n, dtype=np.float32).reshape(-1, 1024)
            for i in range(N_TENSORS)}
    nbytes = sum(v.nbytes for v in data.values())
    blob = np.concatenate([v.reshape(-1) for v in data.values()]).view(np.uint8)
    tmp = tempfile.mkdtemp(prefix="lazyx-io-bench-", dir="/tmp")
    try:
        plain = os.path.join(tmp, "plain.bin")

        def disk_write():
            with open(plain, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())

        buf = bytearray(nbytes)

        def disk_read():
            with open(plain, "rb", buffering=0) as f:
                f.readinto(buf)

        def disk_copy():
            shutil.copyfile(plain, plain + ".copy")
            _fsync(plain + ".copy")

        disk = {"save": _median(disk_write, args.repeats),
                "cold": _median(disk_read, args.repeats, lambda: _drop_cache(plain)),
                "warm": _median(disk_read, args.repeats)}
        copy_s = _median(disk_copy, args.repeats, lambda: _drop_cache(plain))
        os.remove(plain + ".copy")

        gb = nbytes / 1e9
        print(f"{N_TENSORS} float32 tensors, {nbytes / 2**20:.0f} MiB in all, under {tmp}; "
              f"medians of {args.repeats}; load = call + touch of every page")
        print(f"disk: write {gb / disk['save']:.2f} GB/s, read cold {gb / disk['cold']:.2f} GB/s, "
              f"read warm (page cache) {gb / disk['warm']:.2f} GB/s, "
              f"copy (shutil.copyfile) {gb / copy_s:.2f} GB/s")
        print(f"{'':20s} {'save s':>8s} {'x disk':>7s} {'load cold s':>12s} {'x disk':>7s} "
              f"{'load warm s':>12s} {'x disk':>7s}")
        print(f"{'disk (plain file)':20s} {disk['save']:8.3f} {1:7.2f} {disk['cold']:12.3f} "
              f"{1:7.2f} {disk['warm']:12.3f} {1:7.2f}")
        want = _touch(np.concatenate([v.reshape(-1) for v in data.values()]))
        for name, (save, load) in _cases(data).items():
            path = os.path.join(tmp, f"{name}.safetensors")

            def do_save(save=save, path=path):
                save(path)
                _fsync(path)

            def do_load(load=load, path=path, name=name):
                got = load(path)
                total = sum(_touch(h) for h in got)
                assert np.isclose(total, want, rtol=1e-4), (name, total, want)

            do_save()  # warm-up: imports, first-use costs
            s = _median(do_save, args.repeats)
            cold = _median(do_load, args.repeats, lambda path=path: _drop_cache(path))
            warm = _median(do_load, args.repeats)
            print(f"{name:20s} {s:8.3f} {s / disk['save']:7.2f} {cold:12.3f} "
                  f"{cold / disk['cold']:7.2f} {warm:12.3f} {warm / disk['warm']:7.2f}")
            os.remove(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
