"""``all_sum`` of 1 MB and 64 MB of float32 on 2 local ranks: lazyx over MPI against
``torch.distributed`` with gloo, in one run.

    python benchmarks/distributed.py                 # 2 ranks, 3 rounds per framework
    python benchmarks/distributed.py --rounds 5 --ranks 2

The flow: the script is its own driver and its own rank program.

1. the driver starts the jobs in turns, lazyx then torch, ``--rounds`` times (so a
   passing disturbance of this shared machine is spread over both columns): lazyx's
   with ``python -m lazyx.launch -n 2`` (mpirun, the MPI backend), torch's with
   ``lazyx.launch --backend local`` (the local spawner: each rank gets ``LAZYX_RANK``,
   ``LAZYX_WORLD_SIZE`` and ``LAZYX_DIST_ADDR``, from which it makes gloo's
   ``tcp://`` rendezvous);
2. a rank (``--rank-of lazyx|torch``) times, for each size, ``--repeats`` all-reduces,
   each after a barrier (a small all-reduce), from the call until the result is there
   (``mx.eval`` for lazyx), and rank 0 prints one JSON line of the times;
3. the driver takes each size's fastest time over all rounds (the time the collective
   takes when nothing else disturbs it) and prints the time, the algorithm bandwidth
   (bytes / time, as nccl-tests' ``algbw``) and lazyx's time over torch's (the issue's
   target: at most 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SIZES = {"1 MB": 1 << 20, "64 MB": 64 << 20}
JOB_TIMEOUT = 300


def _lazyx_rank(repeats: int) -> dict:
    import lazyx.core as mx

    group = mx.distributed.init()
    token = mx.zeros((1,))
    times = {}
    for label, nbytes in SIZES.items():
        x = mx.ones((nbytes // 4,), mx.float32)
        mx.eval(x)
        samples = []
        for i in range(repeats + 2):  # two warm-ups
            mx.eval(mx.distributed.all_sum(token))  # barrier
            t0 = time.perf_counter()
            y = mx.distributed.all_sum(x)
            mx.eval(y)
            samples.append(time.perf_counter() - t0)
        assert float(y[0].item()) == group.size()
        times[label] = samples[2:]
    return {"rank": group.rank(), "size": group.size(), "times": times}


def _torch_rank(repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    rank, size = int(os.environ["LAZYX_RANK"]), int(os.environ["LAZYX_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['LAZYX_DIST_ADDR']}",
                            rank=rank, world_size=size)
    times = {}
    for label, nbytes in SIZES.items():
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        samples = []
        for i in range(repeats + 2):
            dist.barrier()
            y = x.clone()  # all_reduce works in place: each call sums fresh ones
            t0 = time.perf_counter()
            dist.all_reduce(y)
            samples.append(time.perf_counter() - t0)
        assert float(y[0]) == size
        times[label] = samples[2:]
    dist.destroy_process_group()
    return {"rank": rank, "size": size, "times": times}


def _job(framework: str, ranks: int, repeats: int) -> dict:
    backend = ["--backend", "local", "--no-prefix"] if framework == "torch" else []
    cmd = [sys.executable, "-m", "lazyx.launch", "-n", str(ranks), "--timeout",
           str(JOB_TIMEOUT), *backend, os.path.abspath(__file__), "--rank-of", framework,
           "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT + 30)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        raise SystemExit(f"the {framework} job failed (status {r.returncode}):\n"
                         f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(lines[0])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rank-of", choices=["lazyx", "torch"], default=None,
                   help=argparse.SUPPRESS)  # set by the driver for its ranks
    a = p.parse_args(argv)
    if a.rank_of:
        result = (_lazyx_rank if a.rank_of == "lazyx" else _torch_rank)(a.repeats)
        if result["rank"] == 0:
            print(json.dumps(result), flush=True)
        return

    try:
        import torch  # noqa: F401
        frameworks = ["lazyx", "torch"]
    except ImportError:
        frameworks = ["lazyx"]
        print("PyTorch is not installed: lazyx's column only.")
    best = {f: {label: float("inf") for label in SIZES} for f in frameworks}
    for _ in range(a.rounds):
        for f in frameworks:
            for label, samples in _job(f, a.ranks, a.repeats)["times"].items():
                best[f][label] = min(best[f][label], min(samples))

    print(f"all_sum of float32 on {a.ranks} local ranks: fastest of {a.rounds} rounds x "
          f"{a.repeats} repeats (lazyx: MPI via mpirun; torch: gloo)")
    print(f"{'size':>7} | {'lazyx ms':>9} {'GB/s':>6} | {'torch ms':>9} {'GB/s':>6} | "
          f"{'lazyx/torch':>11}")
    for label, nbytes in SIZES.items():
        row = f"{label:>7} |"
        for f in ("lazyx", "torch"):
            if f in best:
                t = best[f][label]
                row += f" {t * 1e3:9.3f} {nbytes / t / 1e9:6.2f} |"
            else:
                row += f" {'-':>9} {'-':>6} |"
        if "torch" in best:
            row += f" {best['lazyx'][label] / best['torch'][label]:11.2f}"
        print(row)


if __name__ == "__main__":
    main()
