"""axpby under grad, vjp, jvp, vmap and compile."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.testing import (assert_close, check_jvp_vjp, check_primitive, check_vjp_fd,
                           check_vmap_loop, random_array, rng, to_lazyx)

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")
from lazyx_axpby import Axpby, axpby  # noqa: E402

SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1), (1, 3)), ((), (2, 2)), ((2, 1, 3), (1, 2, 1))]


def _sum_to(g, shape):
    """NumPy: g summed back to an operand of ``shape`` that broadcast into it."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead)))
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def test_check_primitive_passes_every_check():
    # lazyx's own battery: shape rule, every backend, vjp, jvp, vmap and compile.
    gen = rng(9)
    report = check_primitive(lambda x, y: axpby(x, y, 0.5, -2.0), gen.standard_normal((2, 3)),
                             gen.standard_normal((3,)))
    assert not report.failed and {"vjp", "jvp", "vmap", "compile"} <= set(report.passed), report
    # The plugin's own examples (its lazyx_examples hook).
    assert not check_primitive(Axpby).failed


@pytest.mark.parametrize("xs, ys", SHAPES)
def test_vjp_against_finite_differences(xs, ys):
    gen = rng(10)
    check_vjp_fd(lambda x, y: axpby(x, y, 1.5, -0.25), gen.standard_normal(xs), gen.standard_normal(ys))
    # Composed with other ops, and with one array on both sides.
    check_vjp_fd(lambda x, y: mx.sin(axpby(mx.exp(x), x * y, -2.0, 0.5)),
                 gen.standard_normal(xs), gen.standard_normal(ys))
    check_vjp_fd(lambda x: axpby(x, x, 3.0, -1.0), gen.standard_normal(xs))


@pytest.mark.parametrize("xs, ys", SHAPES)
def test_jvp_against_vjp(xs, ys):
    gen = rng(11)
    check_jvp_vjp(lambda x, y: axpby(x, y, 1.5, -0.25), gen.standard_normal(xs), gen.standard_normal(ys))
    check_jvp_vjp(lambda x, y: mx.tanh(axpby(x * x, y, 0.75, 2.0)), gen.standard_normal(xs),
                  gen.standard_normal(ys))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32, mx.float64], ids=str)
def test_grad_of_both_arguments_against_numpy(dtype):
    gen = rng(12)
    x, y = random_array((3, 4), dtype, gen), random_array((4,), dtype, gen)
    a, b = 0.5, -1.25

    def loss(p, q):
        return mx.sum(mx.square(axpby(p, q, a, b)))

    gx, gy = mx.grad(loss, argnums=(0, 1))(to_lazyx(x), to_lazyx(y))
    out = a * x.astype(np.float64) + b * y.astype(np.float64)
    assert_close(gx, 2 * a * out, dtype)
    assert_close(gy, _sum_to(2 * b * out, y.shape), dtype, rtol=5e-2 if dtype.size == 2 else None)


def test_a_zero_scale_gives_a_zero_gradient():
    x, y = mx.array([1.0, 2.0]), mx.array([3.0, 4.0])
    gx, gy = mx.grad(lambda p, q: mx.sum(axpby(p, q, 0.0, 2.0)), argnums=(0, 1))(x, y)
    assert gx.tolist() == [0.0, 0.0] and gy.tolist() == [2.0, 2.0]


def test_jvp_of_one_argument_broadcasts_its_tangent():
    x, y = mx.array([[1.0], [2.0]]), mx.array([3.0, 4.0, 5.0])
    (out,), (tan,) = mx.jvp(lambda p: axpby(p, y, 2.0, 1.0), [x], [mx.array([[1.0], [10.0]])])
    assert out.shape == tan.shape == (2, 3)
    assert tan.tolist() == [[2.0] * 3, [20.0] * 3]
    (_,), (tan,) = mx.jvp(lambda q: axpby(x, q, 2.0, -1.0), [y], [mx.array([1.0, 2.0, 3.0])])
    assert tan.tolist() == [[-1.0, -2.0, -3.0]] * 2


@pytest.mark.parametrize("in_axes, xs, ys", [
    ((0, 0), (4, 2, 3), (4, 3)), ((1, None), (2, 4, 3), (3,)), ((None, 0), (2, 3), (4, 2, 1)),
    ((2, 0), (2, 3, 4), (4, 1, 3)), ((0, 1), (4,), (1, 4)), ((-1, -1), (2, 3, 4), (3, 4))])
def test_vmap_against_a_loop(in_axes, xs, ys):
    gen = rng(13)
    x, y = gen.standard_normal(xs).astype(np.float32), gen.standard_normal(ys).astype(np.float32)
    check_vmap_loop(lambda p, q: axpby(p, q, 1.5, -0.5), x, y, in_axes=in_axes)
    check_vmap_loop(lambda p, q: axpby(p, q, 1.5, -0.5), x, y, in_axes=in_axes, out_axes=-1)


def test_vmap_of_grad_and_grad_of_vmap():
    gen = rng(14)
    x, y = gen.standard_normal((3, 4)), gen.standard_normal((3, 4))

    def loss(p, q):
        return mx.sum(mx.sin(axpby(p, q, 2.0, -3.0)))

    check_vmap_loop(mx.grad(loss, argnums=(0, 1)), x, y)
    g = mx.grad(lambda p, q: mx.sum(mx.vmap(loss)(p, q)))(to_lazyx(x), to_lazyx(y))
    assert_close(g, 2.0 * np.cos(2.0 * x - 3.0 * y), mx.float64)


def test_second_derivative():
    # d2/dx2 of sum(axpby(x, y)^3) = 6 alpha^2 (alpha x + beta y).
    x, y = np.array([0.5, -1.0]), np.array([2.0, 0.25])
    f = lambda p: mx.sum(axpby(p, to_lazyx(y), 1.5, -2.0) ** 3)  # noqa: E731
    h = mx.grad(lambda p: mx.sum(mx.grad(f)(p)))(to_lazyx(x))
    assert_close(h, 6 * 1.5 ** 2 * (1.5 * x - 2.0 * y), mx.float64)


# -- compile ---------------------------------------------------------------------------
def _neighbours(p, q):
    # Element-wise ops on both sides of axpby, all of the loop's shape: one fused kernel.
    return mx.exp(axpby(mx.sin(p), p * q, 0.5, -1.5)) + 1.0


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32, mx.float64], ids=str)
def test_compiled_against_eager(lazyx_backend, dtype):
    gen = rng(15)
    x, y = to_lazyx(random_array((3, 5), dtype, gen, -1, 1)), to_lazyx(random_array((5,), dtype, gen, -1, 1))
    cf = mx.compile(lambda p, q: _neighbours(p, q))  # a new function: a cache of its own
    for _ in range(2):  # the trace, then the cached plan
        assert_close(cf(x, y), np.array(_neighbours(x, y)), dtype)
    assert cf.cache.traces == 1


def test_compile_fuses_axpby_with_its_neighbours():
    from lazyx.codegen import jit
    from lazyx.transforms.fusion import Compiled
    if not jit.available():
        pytest.skip("no C++ compiler: compile runs the graph unfused")
    x = to_lazyx(random_array((4, 6), mx.float32, rng(17)))
    y = to_lazyx(random_array((4, 6), mx.float32, rng(18)))
    with mx.use_backend("cpu", "cpu"):
        cf = mx.compile(lambda p, q: _neighbours(p, q))
        assert_close(cf(x, y), np.array(_neighbours(x, y)), mx.float32)
    (entry,) = cf.cache.entries.values()
    ran = [type(n.prim) for n in entry.run_tape.nodes]
    assert ran == [Compiled], f"the plan runs {[c.name for c in ran]}"
    program = entry.run_tape.nodes[0].prim.program
    ops = [e.op for e in program.nodes]
    assert ops.count("mul") == 3 and "sin" in ops and "exp" in ops, program.text()


def test_grad_and_vmap_of_compiled():
    gen = rng(19)
    x, y = gen.standard_normal((3, 5)), gen.standard_normal((3, 5))
    loss = lambda p, q: mx.sum(_neighbours(p, q))  # noqa: E731
    g = mx.grad(mx.compile(loss), argnums=(0, 1))(to_lazyx(x), to_lazyx(y))
    want = mx.grad(loss, argnums=(0, 1))(to_lazyx(x), to_lazyx(y))
    for a, b in zip(g, want):
        assert_close(a, np.array(b), mx.float64)
    check_vmap_loop(mx.compile(_neighbours), x, y.T.copy(), in_axes=(1, 0))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.complex64], ids=str)
def test_expression_computes_what_the_kernel_does(dtype):
    # The IR program, run through its reference lowering to lazyx ops, against the kernel.
    from lazyx.codegen import ir
    from lazyx.codegen.lower import to_graph
    gen = rng(16)
    x, y = random_array((3, 4), dtype, gen), random_array((4,), dtype, gen)
    prim = axpby(to_lazyx(x), to_lazyx(y), -0.3, 1.7)._prim
    expr = prim.to_expression([ir.input(0, dtype), ir.input(1, dtype)])
    assert expr.dtype is dtype
    program = ir.Program([dtype, dtype], [expr])
    (lowered,) = to_graph(program, [to_lazyx(x), to_lazyx(y)])
    got, want = np.array(lowered), np.array(axpby(to_lazyx(x), to_lazyx(y), -0.3, 1.7))
    # Bit for bit on the CPU; a GPU kernel may fuse a * x + b * y into one FMA (one rounding
    # fewer than the two products and the sum the expression lowers to): 2 ulps there.
    if mx.default_device() == mx.cpu:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2 * float(mx.finfo(dtype).eps), atol=0)
