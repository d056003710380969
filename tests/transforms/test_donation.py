"""Buffer donation in compiled calls (MLX's ``is_donatable``): an input that nothing else
references gives its buffer to the fused kernel's output; anything still referenced
(the user's array, a view, a NumPy array, a memoryview or DLPack capsule sharing the
buffer, a captured constant, a graph a transform retains) keeps its values."""

import gc

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu import native_kernels

N = 1 << 14  # float32 elements: 64 KiB


# Addresses and peak figures are the CPU's: the test runs there whatever the default.
pytestmark = pytest.mark.usefixtures("cpu_backend")


def assert_close(got, want, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


def address(a) -> int:
    return np.asarray(a).ctypes.data


def fresh(n=N, dtype=np.float32):
    x = mx.array(np.arange(n, dtype=dtype) % 7)
    mx.eval(x)
    return x


def expected(n=N):
    return (np.arange(n, dtype=np.float64) % 7) * 2 + 1


def test_an_unreferenced_input_donates_its_buffer():
    f = mx.compile(lambda x: x * 2 + 1)
    x = fresh()
    where = address(x)
    y = f(x)
    del x
    mx.eval(y)
    assert address(y) == where
    assert_close(np.asarray(y), expected())


@pytest.mark.skipif(native_kernels.load() is None, reason="the native module was not built")
def test_donation_keeps_the_peak_at_one_buffer():
    # MLX: y = f(x); del x; eval(y) holds one buffer at its peak.
    f = mx.compile(lambda x: x * 2 + 1)
    mx.eval(f(fresh()))  # trace and build outside the measurement
    x = fresh()
    gc.collect()
    mx.reset_peak_memory()
    y = f(x)
    del x
    mx.eval(y)
    assert mx.get_peak_memory() < 1.5 * 4 * N
    assert_close(np.asarray(y), expected())


def test_an_unevaluated_input_donates_too():
    f = mx.compile(lambda x: x * 2 + 1)
    y = f(mx.array(np.arange(N, dtype=np.float32) % 7) * 1)
    assert_close(np.asarray(y), expected())


def _kept(hold):
    """``f(x)`` with ``x`` deleted while ``hold(x)`` keeps something alive; returns
    (what was held, y)."""
    f = mx.compile(lambda x: x * 2 + 1)
    x = fresh()
    held = hold(x)
    y = f(x)
    del x
    mx.eval(y)
    assert_close(np.asarray(y), expected())
    return held, y


def test_the_users_array_is_never_donated():
    f = mx.compile(lambda x: x * 2 + 1)
    x = fresh()
    y = f(x)
    mx.eval(y)
    assert address(y) != address(x)
    assert_close(np.asarray(x), np.arange(N) % 7)


@pytest.mark.parametrize("hold", [
    lambda x: np.asarray(x),                            # NumPy array on the buffer
    lambda x: np.array(x, copy=False),
    lambda x: memoryview(x),                            # buffer protocol
    lambda x: np.from_dlpack(x),                        # DLPack
    lambda x: mx.eval(v := x[2:]) or v,                 # an evaluated view
    lambda x: x[2:],                                    # an unevaluated view
    lambda x: [x],                                      # another Python reference
], ids=["asarray", "copy-false", "memoryview", "dlpack", "evaluated-view", "lazy-view", "list"])
def test_shared_buffers_are_never_donated(hold):
    held, _ = _kept(hold)
    if isinstance(held, list):
        held = held[0]
    got = np.asarray(memoryview(held)) if isinstance(held, memoryview) else np.asarray(held)
    got = np.frombuffer(held, np.float32) if isinstance(held, memoryview) else got
    ref = np.arange(N) % 7
    assert_close(got, ref[-got.shape[0]:])


def test_numpy_memory_given_without_a_copy_is_never_overwritten():
    a = np.arange(N, dtype=np.float32) % 7
    f = mx.compile(lambda x: x * 2 + 1)
    x = mx.asarray(a)
    y = f(x)
    del x
    mx.eval(y)
    assert_close(a, np.arange(N) % 7)
    assert_close(np.asarray(y), expected())


def test_a_captured_constant_is_never_donated():
    c = fresh()
    g = mx.compile(lambda x: x + c)
    first = g(mx.ones((N,)))
    mx.eval(first)
    del c
    for _ in range(3):
        assert_close(np.asarray(g(mx.ones((N,)) * 1)), np.arange(N) % 7 + 1)


def test_an_input_used_after_the_fused_kernel_is_not_overwritten():
    # x feeds the fused x * 2 + 1 and, later, a reduction: it must keep its values.
    f = mx.compile(lambda x: (x * 2 + 1, mx.sum(x)))
    y, s = f(fresh())
    assert_close(np.asarray(y), expected())
    assert_close(np.asarray(s), (np.arange(N) % 7).sum())


def test_the_same_array_twice():
    f = mx.compile(lambda x, z: x * 2 + z)
    x = fresh()
    y = f(x, x)
    del x
    assert_close(np.asarray(y), (np.arange(N) % 7) * 3)


def test_an_intermediate_of_the_plan_donates():
    f = mx.compile(lambda x, w: mx.exp((x @ w) * 1e-3) * 2 + x)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    y = f(mx.array(a) * 1, mx.array(b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_close(np.asarray(y), np.exp((a64 @ b64) * 1e-3) * 2 + a64, rtol=1e-4, atol=1e-4)


def test_broadcast_and_dtype_changes_do_not_donate():
    f = mx.compile(lambda x, z: x + z)
    y = f(mx.array(np.ones((64, 1), np.float32)) * 1, mx.array(np.ones((64, 64), np.float32)))
    assert_close(np.asarray(y), np.full((64, 64), 2.0))
    g = mx.compile(lambda x: (x * 2).astype(mx.float32) + 0.5)
    z = g(mx.array(np.arange(100, dtype=np.int32)) * 1)
    assert_close(np.asarray(z), np.arange(100) * 2 + 0.5)


def test_shapeless_compile_donates_at_every_shape():
    f = mx.compile(lambda x: x * 2 + 1, shapeless=True)
    for n in (N, 2 * N, 3):
        x = fresh(n)
        where = address(x)
        y = f(x)
        del x
        mx.eval(y)
        assert address(y) == where
        assert_close(np.asarray(y), expected(n))


def test_gradients_see_the_inputs_values():
    # While a transform retains the graph, nothing donates: the backward pass reads x.
    f = mx.compile(lambda x: mx.exp(x) * 2 + 1)

    def loss(x):
        y = f(x * 1)
        mx.eval(y)
        return mx.sum(y * x)

    a = np.linspace(-1, 1, 64).astype(np.float32)
    g = mx.grad(loss)(mx.array(a))
    a64 = a.astype(np.float64)
    # d/dx sum((2 e^x + 1) x) = 2 e^x x + 2 e^x + 1
    assert_close(np.asarray(g), 2 * np.exp(a64) * a64 + 2 * np.exp(a64) + 1, rtol=1e-5)


def test_reference_backend_results_match():
    f = mx.compile(lambda x: mx.sin(x) * 2 + 1)
    with mx.use_backend("cpu", "cpu-reference"):
        y = f(fresh() * 1)
        assert_close(np.asarray(y), np.sin(np.arange(N) % 7) * 2 + 1, rtol=1e-5)


def test_a_multi_output_update_writes_each_output_into_a_donor():
    # An optimizer's update: the parameter and both moments replaced in place, as
    # `compile(step, inputs=state, outputs=state)` writes them back (state swapped out,
    # so the old arrays are held by the call alone).
    gen = np.random.default_rng(0)
    p0, g0 = (gen.standard_normal(N).astype(np.float32) for _ in range(2))
    state = {"p": mx.array(p0), "m": mx.zeros((N,)), "v": mx.zeros((N,))}
    mx.eval(state)

    @mx.compile
    def update(g, p, m, v):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        return p - 0.01 * m / (mx.sqrt(v) + 1e-8), m, v

    def step(g):
        old = (state.pop("p"), state.pop("m"), state.pop("v"))
        where = [address(a) for a in old]
        new = update(g, *old)
        del old
        state.update(zip("pmv", new))
        mx.eval(state)
        return where, [address(state[k]) for k in "pmv"]

    g = mx.array(g0)
    want_p, want_m, want_v = p0.astype(np.float64), np.zeros(N), np.zeros(N)
    for _ in range(3):
        before, after = step(g)
        want_m = 0.9 * want_m + 0.1 * g0
        want_v = 0.999 * want_v + 0.001 * g0.astype(np.float64) ** 2
        want_p = want_p - 0.01 * want_m / (np.sqrt(want_v) + 1e-8)
    assert sorted(after) == sorted(before)  # the three buffers were reused, none new
    assert_close(np.asarray(state["m"]), want_m, rtol=1e-5)
    assert_close(np.asarray(state["v"]), want_v, rtol=1e-5, atol=1e-9)
    assert_close(np.asarray(state["p"]), want_p, rtol=1e-4, atol=1e-5)


def test_a_buffer_that_is_not_the_arrays_own_never_donates():
    """A backend may hand a kernel a copy of an array's data (the CUDA backend's upload
    of a host buffer, shared by its cache): that copy is not the array's to give away."""
    from lazyx.transforms.compile import _donors
    own = mx.array(np.arange(8, dtype=np.float32))
    mx.eval(own)
    other = mx.array(np.arange(8, dtype=np.float32))
    mx.eval(other)
    copy = np.array(other._data)  # a buffer of the same kind, not other's data
    ins = (own, other)
    inputs = [own._data, copy]
    del own, other
    assert _donors(ins, inputs, (0, 1)) == (0,)
