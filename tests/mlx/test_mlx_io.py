"""Save and load against MLX 0.32.2: a file written by MLX loads in lazyx and one written
by lazyx loads in MLX, with the same names, dtypes, shapes, values and metadata; the
same file names; the same exception types for bad input."""

import os

import numpy as np
import pytest

import lazyx.core as lx
from mlx_compat import assert_same, mlx, requires_mlx, same

pytestmark = requires_mlx

#: The dtypes each MLX writer accepts (MLX's save_gguf refuses the others, its
#: save_safetensors refuses float64).
ALL = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
       "float16", "bfloat16", "float32", "float64", "complex64"]
WRITABLE = {"npy": ALL, "npz": ALL, "safetensors": [d for d in ALL if d != "float64"],
            "gguf": ["int8", "int16", "int32", "float16", "float32"]}


def _data(m, dtype, shape, seed):
    x = np.random.default_rng(seed).uniform(-4, 4, shape)
    if dtype == "complex64":
        x = (x + 1j * x[::-1]).astype(np.complex64)
    return m.array(x).astype(getattr(m, dtype))


def _write(m, fmt, path, arrays, metadata=None):
    if fmt == "npy":
        m.save(path, arrays["a"])
    elif fmt == "npz":
        m.savez(path, **arrays)
    elif fmt == "safetensors":
        m.save_safetensors(path, arrays, metadata)
    else:
        m.save_gguf(path, arrays, metadata or {})
    return f"{path}.{fmt}"


@pytest.mark.parametrize("fmt", ["npy", "npz", "safetensors", "gguf"])
@pytest.mark.parametrize("writer,reader", [(mlx, lx), (lx, mlx)], ids=["mlx-to-lazyx",
                                                                        "lazyx-to-mlx"])
def test_files_cross_between_mlx_and_lazyx(tmp_path, fmt, writer, reader):
    for dtype in WRITABLE[fmt]:
        shapes = {"a": (3, 4), "b": (5,), "c": (2, 1, 3)}
        if fmt == "npy":
            shapes = {"a": (3, 4)}
        written = {k: _data(writer, dtype, s, i) for i, (k, s) in enumerate(shapes.items())}
        path = _write(writer, fmt, str(tmp_path / f"w_{dtype}"), written)
        got = reader.load(path)
        got = {"a": got} if fmt == "npy" else got
        assert set(got) == set(shapes)
        for k in shapes:
            if reader is lx:
                assert_same(got[k], written[k], rtol=0, where=f"{fmt} {dtype} {k}")
            else:
                assert_same(written[k], got[k], rtol=0, where=f"{fmt} {dtype} {k}")


def test_transposed_arrays_cross(tmp_path):
    # MLX writes a transposed array with fortran_order=True.
    x = mlx.arange(12).reshape(3, 4).astype(mlx.float32)
    mlx.save(str(tmp_path / "t"), x.T)
    assert_same(lx.load(str(tmp_path / "t.npy")), x.T, rtol=0)
    y = lx.arange(12).reshape(3, 4).astype(lx.float32)
    lx.save(str(tmp_path / "u"), y.T)
    assert_same(y.T, mlx.load(str(tmp_path / "u.npy")), rtol=0)


@pytest.mark.parametrize("writer,reader", [(mlx, lx), (lx, mlx)], ids=["mlx-to-lazyx",
                                                                        "lazyx-to-mlx"])
def test_metadata_crosses(tmp_path, writer, reader):
    a = {"w": writer.ones((2, 2))}
    path = _write(writer, "safetensors", str(tmp_path / "s"), a, {"step": "3", "k": "é"})
    assert reader.load(path, return_metadata=True)[1] == {"step": "3", "k": "é"}
    meta = {"s": "text", "l": ["a", "b"], "i": writer.array(3), "f": writer.array([1.5, 2.5]),
            "u": writer.array(7, dtype=writer.uint8), "b": writer.array(True)}
    path = _write(writer, "gguf", str(tmp_path / "g"), a, meta)
    arrays, got = reader.load(path, return_metadata=True)
    assert set(got) == set(meta) and set(arrays) == {"w"}
    for k in meta:
        if isinstance(meta[k], (str, list)):
            assert got[k] == meta[k]
        elif reader is lx:
            assert_same(got[k], meta[k], rtol=0, where=k)
        else:
            assert_same(meta[k], got[k], rtol=0, where=k)


def test_file_names_match_mlx(tmp_path):
    listings = []
    for m in (lx, mlx):
        d = tmp_path / m.__name__
        d.mkdir()
        x = m.ones((2,))
        m.save(str(d / "a"), x)
        m.save(str(d / "b.bin"), x)
        m.save(str(d / "c.npy"), x)
        m.savez(str(d / "d"), x)
        m.savez_compressed(str(d / "e.npz"), x)
        m.save_safetensors(str(d / "f"), {"x": x})
        m.save_gguf(str(d / "g.bin"), {"x": x}, {})
        listings.append(sorted(os.listdir(d)))
    assert listings[0] == listings[1]


def test_bad_input_raises_as_mlx(tmp_path):
    d = str(tmp_path)
    same(lambda m: m.load(f"{d}/nothere.npy"))
    same(lambda m: m.load(f"{d}/nothere.safetensors"))
    with open(f"{d}/x.dat", "wb") as f:
        f.write(b"not an array")
    same(lambda m: m.load(f"{d}/x.dat"))
    same(lambda m: m.load(f"{d}/x.dat", format="xyz"))
    same(lambda m: m.load(f"{d}/x.dat", format="npy"))
    same(lambda m: m.load(f"{d}/x.dat", format="safetensors"))
    same(lambda m: m.load(f"{d}/x.dat", format="gguf"))
    same(lambda m: m.load(3))
    same(lambda m: m.save(3, m.ones((2,))))
    same(lambda m: m.savez(f"{d}/z", m.ones((2,)), arr_0=m.ones((2,))))
    same(lambda m: m.save_safetensors(f"{d}/s", {"x": m.ones((2,))}, {"k": 1}))
    mlx.savez(f"{d}/y", mlx.ones((2,)))
    mlx.save(f"{d}/v", mlx.ones((2,)))
    same(lambda m: m.load(f"{d}/y.npz", return_metadata=True))
    same(lambda m: m.load(f"{d}/v.npy", return_metadata=True))
    # A truncated file of each format MLX detects.
    mlx.save_safetensors(f"{d}/t", {"x": mlx.ones((64,))})
    with open(f"{d}/t.safetensors", "rb") as f:
        data = f.read()
    for name, content in [("short.safetensors", data[:-40]), ("short2.safetensors", data[:5])]:
        with open(f"{d}/{name}", "wb") as f:
            f.write(content)
        same(lambda m: m.load(f"{d}/{name}"))
