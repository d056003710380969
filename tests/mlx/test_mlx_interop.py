"""Interop against MLX 0.32.2: construction from buffers and DLPack objects, asarray's
results and errors, memoryview's layout, and writes through exported memory.

Deliberate differences are not compared here (tests/core/test_interop.py covers them):
MLX's CPU build copies on every import, so ``asarray(x)``/``from_dlpack(x)`` do not share
and ``copy=False`` always raises there; lazyx shares (the documented MLX semantics)."""

from __future__ import annotations

import array as pyarray

import numpy as np
import pytest
from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

BUFFERS = {
    "bytes": lambda: b"\x01\x02\xff",
    "bytearray": lambda: bytearray(b"\x07\x08"),
    "memoryview": lambda: memoryview(b"\x03\x04"),
    "array.f": lambda: pyarray.array("f", [1.5, -2.0]),
    "array.d": lambda: pyarray.array("d", [1.5, -2.0]),
    "array.b": lambda: pyarray.array("b", [-3, 4]),
    "array.H": lambda: pyarray.array("H", [3, 65535]),
    "array.i": lambda: pyarray.array("i", [-1, 2]),
    "array.q": lambda: pyarray.array("q", [1, 2 ** 40]),
}


@pytest.mark.parametrize("kind", list(BUFFERS))
def test_construction_from_buffers(kind):
    same(lambda m: m.array(BUFFERS[kind]()))
    same(lambda m: m.asarray(BUFFERS[kind]()))


NUMPY = {
    "bool": np.array([True, False]), "uint8": np.array([1, 255], np.uint8),
    "uint16": np.array([1, 9], np.uint16), "uint64": np.array([1, 2 ** 60], np.uint64),
    "int8": np.array([-1, 2], np.int8), "int64": np.array([-(2 ** 40), 2], np.int64),
    "float16": np.array([0.5, -1], np.float16), "float32": np.array([1.25, 3], np.float32),
    "float64": np.array([1.25, 3]), "complex64": np.array([1 + 2j], np.complex64),
    "complex128": np.array([1 - 2j]), "strided": np.arange(12, dtype=np.int32)[::3],
    "2d-T": np.arange(6, dtype=np.float32).reshape(2, 3).T,
}


@pytest.mark.parametrize("kind", list(NUMPY))
def test_from_dlpack_asarray_and_array_of_numpy(kind):
    same(lambda m: m.from_dlpack(NUMPY[kind]))
    same(lambda m: m.from_dlpack(NUMPY[kind], copy=True))
    same(lambda m: m.asarray(NUMPY[kind]))
    same(lambda m: m.array(NUMPY[kind]))
    same(lambda m: m.from_dlpack(NUMPY[kind].__dlpack__()))


def test_asarray_arguments():
    same(lambda m: m.asarray([1, 2, 3]))
    same(lambda m: m.asarray(2.5))
    same(lambda m: m.asarray([[1, 2], [3, 4]], m.float16))
    same(lambda m: m.asarray(np.arange(3, dtype=np.int32), m.float32))
    same(lambda m: m.asarray([1, 2], copy=False))           # both: ValueError
    same(lambda m: m.asarray(m.array([1.0], m.float64)))
    same(lambda m: m.asarray(m.array([1, 2]), m.float32))
    same(lambda m: m.from_dlpack(m.array([1.0], m.float64).__dlpack__()))


@pytest.mark.parametrize("dtype", ["bool_", "uint8", "uint32", "int16", "int64", "float16",
                                   "float32", "float64", "complex64"])
def test_memoryview_layout(dtype):
    def layout(m):
        a = m.arange(6).astype(getattr(m, dtype)).reshape(2, 3)
        out = []
        for x in (a, a.T, a[:, 1:], m.broadcast_to(a[0], (2, 3))):
            v = memoryview(x)
            # NumPy names int64 'l' where MLX says 'q' (both 8-byte ints on LP64).
            fmt = {"l": "q", "L": "Q"}.get(v.format, v.format)
            out.append((fmt, v.shape, v.strides, v.itemsize, v.nbytes, v.ndim))
        return out
    same(layout)


def test_writes_go_through_to_arrays_and_pending_graphs():
    def write(m):
        a = m.array([1.0, 2.0, 3.0])
        done = a * 2
        m.eval(done)
        pending = a + 1
        np.array(a, copy=False)[0] = 10
        np.asarray(a)[1] = 20
        return [a, done, pending]
    same(write)


def test_dlpack_device_and_export_to_numpy_and_torch():
    same(lambda m: list(m.array([1.0]).__dlpack_device__()))
    same(lambda m: m.array(np.from_dlpack(m.arange(4).reshape(2, 2).T)))
    torch = pytest.importorskip("torch")

    def through_torch(m):
        a = m.array([1.0, 2.0])
        torch.from_dlpack(a)[1] = -5
        return a
    same(through_torch)
    same(lambda m: m.from_dlpack(torch.tensor([1.5, -2.0], dtype=torch.bfloat16)))
    same(lambda m: m.array(torch.tensor([[1, 2]], dtype=torch.int16)))
    same(lambda m: m.asarray(torch.tensor([1.0, 2.0], dtype=torch.float64)))
