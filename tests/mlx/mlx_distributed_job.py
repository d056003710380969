"""One rank of the same distributed program on MLX or on lazyx (``python
mlx_distributed_job.py mlx|lazyx OUT_PREFIX`` under ``mpirun``): each rank saves its
results to ``OUT_PREFIX.<rank>.npz`` and test_mlx_distributed.py compares the two
libraries' files. MLX's MPI backend and mpi4py cannot share a process (each calls
MPI_Init), hence two jobs."""

import sys

import numpy as np

lib, prefix = sys.argv[1], sys.argv[2]
if lib == "mlx":
    import mlx.core as m
    group = m.distributed.init(strict=True, backend="mpi")
else:
    import lazyx.core as m
    group = m.distributed.init(strict=True)
d = m.distributed
rank, size = group.rank(), group.size()
results = {}


def put(key, a):
    a = a.astype(m.float32) if a.dtype == m.bfloat16 else a
    results[key] = np.array(a)


base = (np.arange(12).reshape(4, 3) * (rank + 2)) % 7 - 3.0
for name in ("float32", "float16", "bfloat16", "int32", "bool_"):
    x = m.array(base).astype(getattr(m, name))
    # MLX's MPI backend aborts the job on reductions of bool (MPI_SUM is not defined on
    # MPI_C_BOOL); lazyx reduces them with logical or / and (docs/mlx-differences.md).
    for op in ("all_gather",) if name == "bool_" else ("all_sum", "all_max", "all_min", "all_gather"):
        put(f"{op}.{name}", getattr(d, op)(x))
put("all_gather.scalar", d.all_gather(m.array(float(rank))))

x = m.array(base)
w = m.array(np.arange(12.0).reshape(4, 3))
put("grad.all_sum", m.grad(lambda a: (d.all_sum(a) * w).sum())(x))
put("vjp.all_gather", m.vjp(lambda a: d.all_gather(a), [x],
                            [m.array(np.arange(12.0 * size).reshape(4 * size, 3))])[1][0])
put("jvp.all_sum", m.jvp(lambda a: d.all_sum(a), [x], [m.ones_like(x) * (rank + 1)])[1][0])
put("jvp.all_gather", m.jvp(lambda a: d.all_gather(a), [x], [x * 2])[1][0])
put("vmap.all_sum", m.vmap(d.all_sum)(m.stack([x, 2 * x])))
put("compile.all_sum", m.compile(lambda a: d.all_sum(m.exp(a)) * 2)(x))

# send / recv around the ring (even ranks send first).
right, left = (rank + 1) % size, (rank - 1) % size
if rank % 2 == 0:
    m.eval(d.send(x, right))
    got = d.recv_like(x, left)
else:
    got = d.recv(x.shape, x.dtype, left)
    m.eval(got)
    m.eval(d.send(x, right))
put("recv", got)

backwards = group.split(0, size - rank)
results["split.rank"] = np.array(backwards.rank())
put("split.all_gather", d.all_gather(m.array([rank]), group=backwards))

np.savez(f"{prefix}.{rank}.npz", **results)
print(f"rank {rank}: {len(results)} results saved", flush=True)
