"""Zero-copy interop (lazyx.interop): the buffer protocol, ``__array__``, DLPack,
``asarray``/``from_dlpack`` copy semantics, construction from buffers, PyTorch and JAX.

Sharing is checked by writing on one side and reading on the other; values against
NumPy references; bad input against the lazyx error classes and their messages."""

from __future__ import annotations

import array as pyarray
import gc
import sys
import weakref

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import interop
from lazyx.backends.cpu import native_kernels
from lazyx.errors import ArgumentError, DeviceError, DtypeError

# Python 3.11 has no __buffer__: the buffer slot comes from the CPU backend's native module.
needs_buffer_slot = pytest.mark.skipif(
    sys.version_info < (3, 12) and native_kernels.load() is None,
    reason="Python 3.11 without lazyx's native module: memoryview(a) is unavailable")

DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64", "bfloat16", "complex64"]


def _values(name, n=6):
    d = getattr(mx, name)
    if name == "bool_":
        return mx.array([True, False, True, True, False, True][:n])
    return mx.array(np.arange(n) % 5, dtype=d)


# -- out of lazyx ------------------------------------------------------------------


def test_asarray_of_an_array_is_a_writable_view_that_writes_through():
    a = mx.array([1.0, 2.0, 3.0])
    n = np.asarray(a)
    assert n.flags.writeable and np.shares_memory(n, np.asarray(a))
    n[0] = 10
    np.array(a, copy=False)[1] = 20
    np.testing.assert_array_equal(np.asarray(a), [10, 20, 3])
    c = np.array(a)  # copy=True: independent
    c[2] = -1
    assert a.tolist() == [10, 20, 3]


def test_write_through_reaches_unevaluated_graphs_not_computed_results():
    a = mx.array([1.0, 2.0, 3.0])
    done = a * 2
    mx.eval(done)
    pending = a + 1
    np.asarray(a)[:] = [5, 6, 7]
    np.testing.assert_array_equal(np.asarray(pending), [6, 7, 8])
    np.testing.assert_array_equal(np.asarray(done), [2, 4, 6])


def test_export_evaluates_and_views_never_reshape_the_array():
    a = mx.arange(6, dtype=mx.float32) + 1       # unevaluated
    n = np.asarray(a)
    n.shape = (2, 3)                              # reshaping the view in place ...
    assert a.shape == (6,)                        # ... leaves the array alone
    np.testing.assert_array_equal(np.asarray(a), np.arange(6) + 1)


def test_array_dtype_and_copy_false():
    a = mx.array([1, 2], dtype=mx.int32)
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), [1.0, 2.0])
    with pytest.raises(ValueError):
        np.array(a, dtype=np.float64, copy=False)
    with pytest.raises(ValueError, match=r"\[__array__\].*int32.*float64 without a copy"):
        a.__array__(np.float64, copy=False)


def test_shared_constants_and_broadcasts_are_read_only():
    x = mx.add(mx.zeros((2,)), 2.5)               # 2.5 is a cached constant
    mx.eval(x)
    s = mx.reshape(mx.broadcast_to(mx.array(2.5), (3,)), (3,))
    assert not np.asarray(s).flags.writeable
    with pytest.raises(ValueError):
        np.asarray(s)[0] = 1
    assert (mx.zeros((2,)) + 2.5).tolist() == [2.5, 2.5]
    b = mx.broadcast_to(mx.array([1.0, 2.0]), (3, 2))
    assert memoryview(b).readonly


@needs_buffer_slot
@pytest.mark.parametrize("name", [d for d in DTYPES if d != "bfloat16"])
def test_memoryview_format_shape_and_write_through(name):
    a = _values(name).reshape(2, 3)
    m = memoryview(a)
    ref = np.asarray(a)
    assert (m.shape, m.strides, m.itemsize, m.readonly) == ((2, 3), ref.strides, ref.itemsize, False)
    assert m.format == memoryview(ref).format
    np.testing.assert_array_equal(np.asarray(m), ref)
    np.asarray(m)[0, 0] = ref[1, 2]               # (memoryview itself cannot set 'e', 'Zf')
    assert np.asarray(a)[0, 0] == ref[1, 2]


@needs_buffer_slot
def test_memoryview_of_views_and_bfloat16():
    t = mx.arange(6, dtype=mx.float32).reshape(2, 3).T
    m = memoryview(t)
    assert m.shape == (3, 2) and m.strides == (4, 12)
    np.testing.assert_array_equal(np.asarray(m), np.arange(6).reshape(2, 3).T)
    with pytest.raises(DtypeError, match=r"\[memoryview\].*bfloat16"):
        memoryview(mx.array([1.0], dtype=mx.bfloat16))


@pytest.mark.parametrize("name", DTYPES)
def test_dlpack_round_trip_shares_memory(name):
    a = _values(name)
    assert a.__dlpack_device__() == (1, 0)
    b = mx.from_dlpack(a.__dlpack__())            # a capsule, as a consumer gets it
    if name == "float64":                         # MLX's import rule: float64 arrives as float32
        assert b.dtype == mx.float32 and b.tolist() == a.tolist()
        return
    assert b.dtype == a.dtype
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    np.asarray(b)[0] = np.asarray(a)[1]
    assert np.asarray(a)[0] == np.asarray(a)[1]


def test_dlpack_to_numpy_and_versions():
    a = mx.arange(6, dtype=mx.float32).reshape(2, 3)[:, ::2]   # a strided view
    n = np.from_dlpack(a)
    np.testing.assert_array_equal(n, np.arange(6).reshape(2, 3)[:, ::2])
    n[0, 0] = 42
    assert a[0, 0].item() == 42
    legacy = a.__dlpack__()
    versioned = a.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    # Read-only memory: flagged in DLPack 1.0; a copy for a legacy consumer.
    ro = mx.broadcast_to(mx.array([1.0, 2.0]), (2, 2))
    got = mx.from_dlpack(ro.__dlpack__(max_version=(1, 0)))
    assert not np.asarray(got).flags.writeable
    np.testing.assert_array_equal(np.asarray(mx.from_dlpack(ro.__dlpack__())), [[1, 2], [1, 2]])


def test_from_dlpack_copy_semantics_and_mlx_narrowing():
    x = np.arange(4, dtype=np.float32)
    shared, copied = mx.from_dlpack(x), mx.from_dlpack(x, copy=True)
    x[0] = 9
    assert shared[0].item() == 9 and copied[0].item() == 0
    f64 = mx.from_dlpack(np.array([1.5, 2.5]))
    assert f64.dtype == mx.float32 and f64.tolist() == [1.5, 2.5]
    assert mx.from_dlpack(np.array([1j])).dtype == mx.complex64
    with pytest.raises(ValueError, match=r"\[from_dlpack\].*float64.*float32"):
        mx.from_dlpack(np.array([1.5]), copy=False)
    st = np.arange(10, dtype=np.int32)[::3]            # strides preserved, no copy
    v = mx.from_dlpack(st, copy=False)
    st[1] = -7
    assert v.tolist() == [0, -7, 6, 9]


def test_from_dlpack_frees_the_producer_with_the_array():
    x = np.arange(1000, dtype=np.float32)
    probe = weakref.ref(x)
    a = mx.from_dlpack(x)
    del x
    gc.collect()
    assert probe() is not None and a.sum().item() == pytest.approx(np.arange(1000).sum())
    del a
    gc.collect()
    assert probe() is None


def _capsule_tensor(capsule):
    ptr = interop._capsule_pointer(capsule, b"dltensor")
    return interop._DLManagedTensor.from_address(ptr).dl_tensor


def test_bad_dlpack_inputs_name_the_argument():
    cap = np.arange(3, dtype=np.float32).__dlpack__()
    _capsule_tensor(cap).device.device_type = 10                   # claim ROCm
    with pytest.raises(DeviceError, match=r"\[from_dlpack\] x: .*ROCm"):
        mx.from_dlpack(cap)
    cap = np.arange(3, dtype=np.float32).__dlpack__()
    _capsule_tensor(cap).dtype.code = 7                            # a float8
    with pytest.raises(DtypeError, match=r"\[from_dlpack\] x: .*float8_e3m4"):
        mx.from_dlpack(cap)
    cap = np.arange(3, dtype=np.int64).__dlpack__()
    assert mx.from_dlpack(cap).tolist() == [0, 1, 2]
    with pytest.raises(ArgumentError, match="already consumed"):
        mx.from_dlpack(cap)

    class Elsewhere:
        def __dlpack_device__(self):
            return (8, 0)

        def __dlpack__(self, **kw):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(DeviceError, match=r"\[asarray\] a: .*Metal"):
        mx.asarray(Elsewhere())
    with pytest.raises(DtypeError, match=r"\[from_dlpack\] x: a list"):
        mx.from_dlpack([1, 2])
    with pytest.raises(DtypeError, match=r"\[asarray\] a: .*no lazyx"):
        mx.asarray(np.array(["a"]))


# -- into lazyx --------------------------------------------------------------------


def test_asarray_copy_semantics():
    x = np.arange(4, dtype=np.int32)
    shared, nocopy, copied = mx.asarray(x), mx.asarray(x, copy=False), mx.asarray(x, copy=True)
    x[0] = 7
    assert (shared[0].item(), nocopy[0].item(), copied[0].item()) == (7, 7, 0)
    conv = mx.asarray(x, mx.float16)
    assert conv.dtype == mx.float16 and conv.tolist() == [7, 1, 2, 3]
    with pytest.raises(ValueError, match=r"\[asarray\].*int32.*float16"):
        mx.asarray(x, mx.float16, copy=False)
    with pytest.raises(ValueError, match="Unable to avoid copy"):
        mx.asarray([1, 2], copy=False)
    assert mx.asarray([1, 2.5]).dtype == mx.float32 and mx.asarray(3).dtype == mx.int32
    a = mx.array([1, 2])
    assert mx.asarray(a) is a and mx.asarray(a, copy=False) is a
    c = mx.asarray(a, copy=True)
    np.asarray(a)[0] = 5
    assert c.tolist() == [1, 2] and mx.asarray(a, "float32").dtype == mx.float32
    with pytest.raises(ValueError, match="without a copy"):
        mx.asarray(a, mx.float32, copy=False)


def test_unaligned_memory_is_copied_or_refused():
    raw = np.frombuffer(bytearray(17), dtype=np.uint8)[1:].view(np.float32)
    assert not raw.flags.aligned
    assert mx.asarray(raw).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="not aligned"):
        mx.asarray(raw, copy=False)


@pytest.mark.parametrize("make, want", [
    (lambda: b"\x01\x02\xff", np.array([1, 2, 255], np.uint8)),
    (lambda: bytearray(b"\x01\x02"), np.array([1, 2], np.uint8)),
    (lambda: memoryview(b"\x03\x04"), np.array([3, 4], np.uint8)),
    (lambda: pyarray.array("f", [1.5, 2]), np.array([1.5, 2], np.float32)),
    (lambda: pyarray.array("d", [1.5, 2]), np.array([1.5, 2], np.float32)),
    (lambda: pyarray.array("i", [-1, 2]), np.array([-1, 2], np.int32)),
    (lambda: pyarray.array("q", [1, 2 ** 40]), np.array([1, 2 ** 40], np.int64)),
])
def test_construction_from_buffers(make, want):
    for fn in (mx.array, mx.asarray):
        got = fn(make())
        assert got.dtype == mx.__dict__[want.dtype.name]
        np.testing.assert_array_equal(np.asarray(got), want)


def test_constructor_copies_asarray_shares_a_bytearray():
    buf = bytearray(b"\x01\x02")
    copied, shared = mx.array(buf), mx.asarray(buf)
    buf[0] = 9
    assert copied.tolist() == [1, 2] and shared.tolist() == [9, 2]
    frozen = mx.asarray(b"\x01")                   # bytes are immutable: a read-only view
    assert not np.asarray(frozen).flags.writeable


# -- PyTorch and JAX ------------------------------------------------------------------


def test_pytorch_hand_off_without_copies():
    torch = pytest.importorskip("torch")
    a = mx.array([1.0, 2.0, 3.0])
    t = torch.from_dlpack(a)
    t[0] = -1
    assert a[0].item() == -1
    src = torch.arange(4, dtype=torch.float32)
    shared, copied = mx.asarray(src), mx.array(src)
    src[1] = 50
    assert shared.tolist() == [0, 50, 2, 3] and copied.tolist() == [0, 1, 2, 3]
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    got = mx.from_dlpack(bf)
    assert got.dtype == mx.bfloat16 and got.tolist() == [1.5, -2.0]
    back = torch.from_dlpack(got)
    assert back.dtype == torch.bfloat16 and back.tolist() == [1.5, -2.0]
    assert mx.array(torch.tensor([True, False])).dtype == mx.bool_


def test_jax_hand_off():
    jnp = pytest.importorskip("jax.numpy")
    import jax
    x = jnp.arange(4, dtype=jnp.float32)
    a = mx.from_dlpack(x)
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])
    back = jax.dlpack.from_dlpack(mx.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(back), [1, 2])
