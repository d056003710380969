"""Fusion never makes a cycle and never changes a value, on random graphs.

A program is a list of steps; each step applies one op of :data:`OPS` to two
earlier values (any of them: values fan out, so paths between element-wise nodes
run through non-fused ones — matmuls, reductions, reshapes, transposes, gathers,
splits, broadcasts — exactly what grouping must respect). Every value has the
shape ``S``; an op may build other shapes inside (a reduction's row, a
transpose) and comes back to ``S`` by broadcasting or the inverse reshape.

Each example runs the program and its ``value_and_grad`` (a training step's
graph: the backward pass reads forward values across the loss) compiled and
uncompiled, and compares. Most examples run on the ``cpu-reference`` backend with
fusion forced (fused nodes run by interpreting their program, so no C++ is
compiled); a few, fixed by ``derandomize``, compile C++ kernels (cached on disk
by source hash). :func:`fuse_arrays` is also driven directly with small bounds so
that splitting groups at the input, output and op bounds is exercised.
"""

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyx.core as mx
from lazyx.codegen import jit
from lazyx.scheduler import unevaluated_order
from lazyx.transforms import fusion
from lazyx.transforms.fusion import Compiled, fuse_arrays

S = (3, 4)
PERM = mx.array(np.array([3, 0, 2, 1], np.int32))

#: name -> (fusible?, fn(a, b, w)) with a, b of shape S and w of shape (4, 4).
OPS = {
    # fusible (element-wise)
    "tanh": (True, lambda a, b, w: mx.tanh(a)),
    "sin": (True, lambda a, b, w: mx.sin(a) * 0.5 + 0.25),
    "sigmoid": (True, lambda a, b, w: mx.sigmoid(a)),
    "add": (True, lambda a, b, w: a + b),
    "sub": (True, lambda a, b, w: a - b),
    "mul": (True, lambda a, b, w: a * b),
    "maximum": (True, lambda a, b, w: mx.maximum(a, b * 0.5)),
    "where": (True, lambda a, b, w: mx.where(a > b, a, b * 0.25)),
    "divmod": (True, lambda a, b, w: sum(mx.divmod(a * 3.0, 1.5))),  # two outputs
    # not fusible: every path through one of these splits a run
    "matmul": (False, lambda a, b, w: a @ w),
    "row_sum": (False, lambda a, b, w: a - mx.sum(b, axis=1, keepdims=True) * 0.25),
    "col_mean": (False, lambda a, b, w: a * mx.mean(b, axis=0)),
    "logsumexp": (False, lambda a, b, w: a - mx.logsumexp(a, axis=1, keepdims=True)),
    "softmax": (False, lambda a, b, w: mx.softmax(a + b, axis=-1)),
    "max": (False, lambda a, b, w: b - mx.max(a, axis=0, keepdims=True)),
    "transpose": (False, lambda a, b, w: mx.transpose(mx.tanh(mx.transpose(a)) * b.T)),
    "reshape": (False, lambda a, b, w: mx.reshape(mx.reshape(a, (12,)) * 0.5 + 1.0, S) + b),
    "take": (False, lambda a, b, w: mx.take(a, PERM, axis=1) + b),
    "split": (False, lambda a, b, w: mx.concatenate(
        [mx.tanh(p) if k else p * 2.0 for k, p in enumerate(mx.split(a, 2, axis=1))], axis=1)),
    "broadcast": (False, lambda a, b, w: mx.broadcast_to(mx.sum(a, axis=0), S) * 0.1 + b),
}
NAMES = sorted(OPS)

step_st = st.tuples(st.sampled_from(NAMES), st.integers(0, 63), st.integers(0, 63))
program_st = st.tuples(st.lists(step_st, min_size=1, max_size=12),   # the steps
                       st.lists(st.integers(0, 63), max_size=2))      # extra outputs


def run(program, a, b, w):
    """The program's outputs: the last value and the extra outputs named by index."""
    steps, extra = program
    pool = [a, b]
    for name, i, j in steps:
        pool.append(OPS[name][1](pool[i % len(pool)], pool[j % len(pool)], w))
    return [pool[-1]] + [pool[k % len(pool)] for k in extra]


def training_step(program):
    """``value_and_grad`` of a scalar loss of the program's outputs, in all arguments."""
    def loss(a, b, w):
        return sum(mx.mean(mx.square(o)) for o in run(program, a, b, w))
    return lambda a, b, w: mx.value_and_grad(loss, argnums=(0, 1, 2))(a, b, w)


def arguments(seed):
    gen = np.random.default_rng(seed)
    return [mx.array(gen.uniform(-1.5, 1.5, s).astype(np.float32)) for s in (S, S, (4, 4))]


def flat_arrays(tree):
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in flat_arrays(t)]
    return [tree]


def flat(tree):
    return [np.asarray(x) for x in flat_arrays(tree)]


def assert_same(got, want):
    got, want = flat(got), flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


@contextlib.contextmanager
def fused_by_reference():
    """compile fuses CPU streams on the cpu-reference backend (its fused nodes run by
    interpreting their program: the grouping is tested, no C++ is compiled)."""
    with mx.use_backend("cpu", "cpu-reference"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(fusion, "_can_fuse", lambda: True)
        # Small arrays: recomputing outputs in their readers is tested too.
        mp.setattr(fusion, "RECOMPUTE_MIN_SIZE", 0)
        yield


def compiled_prims(fn):
    return [n.prim for e in fn.cache.entries.values() for n in e.run_tape.nodes]


PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(program=program_st, seed=st.integers(0, 3))
def test_compile_of_random_graphs_and_their_gradients_matches_eager(program, seed):
    args = arguments(seed)
    with fused_by_reference():
        for fn in (lambda a, b, w: run(program, a, b, w), training_step(program)):
            assert_same(mx.compile(fn)(*args), fn(*args))


@PROPERTY
@given(program=program_st, seed=st.integers(0, 3), max_inputs=st.integers(1, 4),
       max_outputs=st.integers(1, 3), max_ops=st.integers(2, 5), grad=st.booleans())
def test_fusion_with_small_bounds_splits_groups_and_keeps_values(
        program, seed, max_inputs, max_outputs, max_ops, grad):
    args = arguments(seed)
    fn = training_step(program) if grad else (lambda a, b, w: run(program, a, b, w))
    with mx.use_backend("cpu", "cpu-reference"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(fusion, "RECOMPUTE_MIN_SIZE", 0)
        want = fn(*args)
        outs = [x for x in flat_arrays(want) if x._prim is not None and x._data is None]
        fused = fuse_arrays(outs, args, force=True, max_inputs=max_inputs,
                            max_outputs=max_outputs, max_ops=max_ops)
        for a in unevaluated_order(fused):
            if isinstance(a._prim, Compiled):
                program_ = a._prim.program
                assert len(program_.inputs) <= max_inputs
                assert len(program_.outputs) <= max_outputs
        mx.eval(fused)
        assert_same([np.asarray(x) for x in fused], [np.asarray(x) for x in outs])


@pytest.mark.skipif(not jit.available(), reason="no C++ compiler")
@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=program_st)
def test_compiled_cpp_kernels_of_random_training_steps_match_eager(program):
    args = arguments(0)
    step = training_step(program)
    with mx.use_backend("cpu", "cpu"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(fusion, "RECOMPUTE_MIN_SIZE", 0)
        assert_same(mx.compile(step)(*args), step(*args))


def test_a_path_through_a_non_fused_node_keeps_two_runs_apart():
    # The forward tanh and the backward (1 - tanh^2) are element-wise and joined
    # directly, but also through the matmul, the loss and the backward matmul: one
    # group would read its own output. The reproduction, a two-layer MLP step.
    x, y = mx.ones((4, 3)), mx.ones((4, 1))

    def loss(w1, b1, w2):
        return mx.mean(mx.square(mx.tanh(x @ w1 + b1) @ w2 - y))
    step = lambda w1, b1, w2: mx.value_and_grad(loss, argnums=(0, 1, 2))(w1, b1, w2)  # noqa: E731
    args = (mx.ones((3, 5)) * 0.1, mx.zeros((5,)), mx.ones((5, 1)) * 0.1)
    with fused_by_reference():
        cstep = mx.compile(step)
        assert_same(cstep(*args), step(*args))
    assert any(isinstance(p, Compiled) for p in compiled_prims(cstep))
    # NumPy float64: d/dw of mean((tanh(x w1 + b1) w2 - y)^2).
    x64, w1, b1, w2 = np.ones((4, 3)), np.full((3, 5), 0.1), np.zeros(5), np.full((5, 1), 0.1)
    h = np.tanh(x64 @ w1 + b1)
    r = h @ w2 - 1.0
    dr = 2 * r / r.size
    dz = (dr @ w2.T) * (1 - h ** 2)
    loss_v, (g1, gb, g2) = cstep(*args)
    for got, ref in ((loss_v, np.mean(r ** 2)), (g1, x64.T @ dz), (gb, dz.sum(0)), (g2, h.T @ dr)):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-7)
