"""One rank of the collectives test job (tests/distributed/test_collectives.py runs it
under ``mpirun -n 2`` and ``-n 3``).

Every rank builds the inputs of every rank from one seed, so each can compute the
NumPy (float64) reference of a collective locally. A failed check raises (mpirun
then ends the job with a non-zero status); a rank that finishes prints
``rank R of N: K checks passed``.
"""

import os
import sys

import ml_dtypes
import numpy as np

import lazyx.core as mx
from lazyx.errors import ArgumentError, DtypeError, ShapeError
from rank_inputs import rank_inputs  # beside this script (sys.path[0])

d = mx.distributed
group = d.init(strict=True)
rank, size = group.rank(), group.size()
assert group.backend == "mpi", group
assert d.init() is group and d.init(backend="mpi") is group
checks = 0

DTYPES = [("float32", np.float32), ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
          ("float64", np.float64), ("int32", np.int32), ("int64", np.int64),
          ("int8", np.int8), ("uint8", np.uint8), ("bool_", np.bool_), ("complex64", np.complex64)]
SHAPES = [(), (1,), (5,), (3, 4), (2 * size, 3)]


def A(a):
    """A lazyx array of NumPy ``a``, keeping float64 (``mx.array`` makes it float32, as MLX)."""
    a = np.asarray(a)
    return mx.array(a, dtype=mx.float64) if a.dtype == np.float64 else mx.array(a)


def inputs(shape, npd, seed):
    """The input of every rank for one check, as NumPy arrays of dtype ``npd``."""
    return rank_inputs(shape, npd, seed, size)


def check(got, want, what, tol=0.0):
    global checks
    got = np.asarray(mx.array(got).astype(mx.float64) if got.dtype == mx.bfloat16 else got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if tol:
        ok = np.allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"rank {rank}: {what}: {got} != {want}"
    checks += 1


TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2, "float64": 1e-12, "complex64": 1e-5}

# -- every collective against NumPy, over dtypes and shapes ------------------------------
seed = 0
for name, npd in DTYPES:
    for shape in SHAPES:
        seed += 1
        xs = inputs(shape, npd, seed)
        x = A(xs[rank])
        assert x.dtype == getattr(mx, name), (x.dtype, name)
        wide = [a.astype(np.complex128 if name == "complex64" else np.float64) for a in xs]
        tol = TOL.get(name, 0.0)
        total = np.sum(wide, axis=0)
        if name == "bool_":
            total = total > 0
        s = d.all_sum(x)
        assert s.dtype == x.dtype and s.shape == x.shape
        check(s, total, f"all_sum {name} {shape}", tol * size)
        gathered = d.all_gather(x)
        check(gathered, np.stack(xs) if shape == () else np.concatenate(xs), f"all_gather {name} {shape}")
        if name != "complex64":
            check(d.all_max(x), np.max(np.stack(xs), axis=0), f"all_max {name} {shape}")
            check(d.all_min(x), np.min(np.stack(xs), axis=0), f"all_min {name} {shape}")
        if shape and shape[0] % size == 0:
            k = shape[0] // size
            check(d.sum_scatter(x), total[rank * k:(rank + 1) * k], f"sum_scatter {name} {shape}",
                  tol * size)

# Non-contiguous input (a transposed view) and a lazy one.
xs = inputs((3, 4), np.float32, 999)
x = A(xs[rank])
check(d.all_sum(x.T * 2), 2 * np.sum(xs, axis=0).T, "all_sum of a lazy transposed input", 1e-5)

# -- gradients (MLX's rules) ---------------------------------------------------------
xs = inputs((2 * size, 3), np.float64, 77)
x = A(xs[rank])
w = A(np.arange(6.0).reshape(2, 3))
# vjp of all_sum passes the cotangent through (the result enters the loss once).
check(mx.grad(lambda a: (d.all_sum(a) * A(np.arange(6.0 * size).reshape(2 * size, 3))).sum())(x),
      np.arange(6.0 * size).reshape(2 * size, 3), "grad all_sum")
# jvp of all_sum is the all_sum of the tangents.
_, t = mx.jvp(lambda a: d.all_sum(a), [x], [mx.ones_like(x) * (rank + 1)])
check(t[0], np.full(x.shape, sum(range(1, size + 1)), np.float64), "jvp all_sum")
# vjp of all_gather: this rank's slice of the cotangent.
cot = np.arange(6.0 * size * size).reshape(2 * size * size, 3)
check(mx.vjp(lambda a: d.all_gather(a), [x], [A(cot)])[1][0],
      cot[rank * 2 * size:(rank + 1) * 2 * size], "vjp all_gather")
_, t = mx.jvp(lambda a: d.all_gather(a), [x], [x * 0 + rank])
check(t[0], np.repeat(np.arange(size, dtype=np.float64), 2 * size)[:, None] * np.ones(3), "jvp all_gather")
# vjp of sum_scatter: the all_gather of the cotangents.
cots = [np.full((2, 3), r + 1.0) for r in range(size)]
check(mx.vjp(lambda a: d.sum_scatter(a), [x], [A(cots[rank])])[1][0],
      np.concatenate(cots), "vjp sum_scatter")
# vjp of all_max: the cotangent where this rank holds the maximum.
hit = np.stack(xs).argmax(axis=0) == rank
check(mx.grad(lambda a: d.all_max(a).sum())(x), hit.astype(np.float64), "grad all_max")
hit = np.stack(xs).argmin(axis=0) == rank
check(mx.grad(lambda a: d.all_min(a).sum())(x), hit.astype(np.float64), "grad all_min")
_, t = mx.jvp(lambda a: d.all_max(a), [x], [mx.ones_like(x) * (rank + 1)])
check(t[0], np.stack(xs).argmax(axis=0) + 1.0, "jvp all_max")
# vmap: the collective of the batch, batch at axis 0 and 1.
xb = A(np.stack([xs[rank], 2 * xs[rank]]))
check(mx.vmap(d.all_sum)(xb), np.stack([np.sum(xs, 0), 2 * np.sum(xs, 0)]), "vmap all_sum", 1e-12)
check(mx.vmap(d.all_gather, in_axes=1, out_axes=1)(A(xs[rank])), np.concatenate(xs),
      "vmap all_gather")
check(mx.vmap(d.all_gather)(xb), np.stack([np.concatenate(xs), 2 * np.concatenate(xs)]),
      "vmap all_gather at axis 0")
check(mx.vmap(d.sum_scatter)(xb), np.stack([np.sum(xs, 0)[2 * rank:2 * rank + 2],
                                            2 * np.sum(xs, 0)[2 * rank:2 * rank + 2]]),
      "vmap sum_scatter", 1e-12)
check(mx.vmap(d.all_gather)(A([1.0 * rank, 10.0 * rank])),
      np.array([[r * 1.0 for r in range(size)], [r * 10.0 for r in range(size)]]),
      "vmap all_gather of scalars")

# -- a compiled training step with an all_sum ----------------------------------------------
@mx.compile
def step(w, x):
    loss, g = mx.value_and_grad(lambda w: ((x @ w) ** 2).sum())(w)
    g = d.all_sum(g) / size + d.all_sum(g * 0)  # two collectives of one shape: never merged
    return loss, w - 0.1 * mx.tanh(g)


W = A(np.ones((3, 2)))
xs = inputs((4, 3), np.float64, 5)
loss, W1 = step(W, A(xs[rank]))
grads = [2 * a.T @ (a @ np.ones((3, 2))) for a in xs]
check(W1, np.ones((3, 2)) - 0.1 * np.tanh(np.mean(grads, axis=0)), "compiled step", 1e-12)
loss, W2 = step(W1, A(xs[rank]))  # the replay, not the trace
grads = [2 * a.T @ (a @ np.asarray(W1)) for a in xs]
check(W2, np.asarray(W1) - 0.1 * np.tanh(np.mean(grads, axis=0)), "compiled step replayed", 1e-12)

# -- split groups ------------------------------------------------------------------------
sub = group.split(rank % 2)
members = [r for r in range(size) if r % 2 == rank % 2]
assert sub.size() == len(members) and sub.rank() == members.index(rank), (sub, members)
got = d.all_sum(A([rank + 1.0]), group=sub)
check(got, np.array([sum(r + 1.0 for r in members)]), "all_sum on a split group")
backwards = group.split(0, key=size - rank)  # the key reverses the order
assert backwards.size() == size and backwards.rank() == size - 1 - rank
check(d.all_gather(A([rank]), group=backwards), np.arange(size)[::-1], "split with a key")

# -- send and recv -------------------------------------------------------------------------
right, left = (rank + 1) % size, (rank - 1) % size
payload = A(np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * rank)
if rank % 2 == 0:  # even ranks send first: no cycle of blocking sends
    mx.eval(d.send(payload, right))
    got = d.recv((2, 3), mx.float32, left)
else:
    got = d.recv_like(payload, left)
    mx.eval(got)
    mx.eval(d.send(payload, right))
check(got, np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * left, "send/recv ring")
if size > 1:
    b = A(np.array([1.5, -2.0], ml_dtypes.bfloat16))
    if rank == 0:
        out = d.send(b, 1)
        check(out, np.array([1.5, -2.0]), "send returns its input")
    elif rank == 1:
        check(d.recv((2,), mx.bfloat16, 0), np.array([1.5, -2.0]), "recv of bfloat16")

# A message of the wrong size is an error naming both sizes.
if rank == 0:
    mx.eval(d.send(mx.zeros((3,)), 1))
elif rank == 1:
    try:
        mx.eval(d.recv((5,), mx.float32, 0))
        raise AssertionError("a short message was accepted")
    except d.DistributedError as e:
        assert "12 bytes" in str(e) and "20" in str(e), e
    checks += 1

# -- bad input ---------------------------------------------------------------------------
def raises(kind, fn, *words):
    global checks
    try:
        fn()
    except kind as e:
        for w in words:
            assert w in str(e), (w, str(e))
        checks += 1
        return
    raise AssertionError(f"no {kind.__name__} from {fn}")


raises(ArgumentError, lambda: d.send(payload, size), "send", f"dst={size}", f"of {size}")
raises(ArgumentError, lambda: d.send(payload, -1), "dst=-1")
raises(ArgumentError, lambda: d.send(payload, rank), "own rank")
raises(ArgumentError, lambda: d.recv((2,), mx.float32, size + 3), "recv", f"src={size + 3}")
raises(ShapeError, lambda: d.sum_scatter(mx.zeros((size + 1, 2))), "sum_scatter",
       f"({size + 1}, 2)", f"group size {size}")
raises(ShapeError, lambda: d.sum_scatter(mx.zeros(())), "sum_scatter")
raises(DtypeError, lambda: d.all_sum(payload, group="world"), "all_sum", "group")
raises(DtypeError, lambda: d.all_max(mx.zeros((2,), mx.complex64)), "all_max", "complex64")

if os.environ.get("LAZYX_DIST_CHECK") == "1":
    # Mismatched shapes across ranks: with the check on, every rank raises, naming each.
    try:
        mx.eval(d.all_sum(mx.zeros((rank + 1,))))
        raise AssertionError("mismatched shapes passed")
    except d.DistributedError as e:
        assert all(f"rank {r}: all_sum of shape ({r + 1},)" in str(e) for r in range(size)), e
    checks += 1

mx.eval(d.all_sum(mx.zeros(1)))  # everyone is still in step
print(f"rank {rank} of {size}: {checks} checks passed", flush=True)
sys.stdout.flush()
