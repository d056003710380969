"""Saving and loading (plugins/io.py): every format round-trips every dtype it can hold,
files follow MLX's naming rules, loads are zero-copy where the format allows, and
unreadable files raise a lazyx error naming the file."""

import io
import mmap
import os

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError, DtypeError, FileFormatError, FileMissingError, ShapeError
from helpers import ALL_DTYPES, random_array

GGUF_DTYPES = [d for d in ALL_DTYPES if d.name in
               ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64")]
FORMATS = ["npy", "npz", "npz_compressed", "safetensors", "gguf"]


def _save(fmt, path, arrays, metadata=None):
    """Write ``arrays`` ({name: array}) with the writer of ``fmt``; the path it wrote."""
    if fmt == "npy":
        mx.save(path, arrays["x"])
    elif fmt == "npz":
        mx.savez(path, **arrays)
    elif fmt == "npz_compressed":
        mx.savez_compressed(path, **arrays)
    elif fmt == "safetensors":
        mx.save_safetensors(path, arrays, metadata)
    else:
        mx.save_gguf(path, arrays, metadata)
    ext = {"npy": ".npy", "npz_compressed": ".npz"}.get(fmt, "." + fmt)
    return str(path) + ext


def _as_numpy(a):
    return np.asarray(a).astype(np.float64) if a.dtype == mx.bfloat16 else np.asarray(a)


def _assert_equal(got, want: np.ndarray):
    assert got.shape == want.shape
    np.testing.assert_array_equal(_as_numpy(got), want.astype(np.float64)
                                  if want.dtype.name == "bfloat16" else want)


def _dtypes(fmt):
    return GGUF_DTYPES if fmt == "gguf" else ALL_DTYPES


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_dtype_round_trips(tmp_path, fmt):
    for dtype in _dtypes(fmt):
        want = {"x": random_array((3, 4), dtype), "y": random_array((5,), dtype)}
        if fmt == "npy":
            want.pop("y")
        path = _save(fmt, tmp_path / f"f_{dtype.name}",
                     {k: mx.array(v, dtype=dtype) for k, v in want.items()})
        got = mx.load(path)
        got = {"x": got} if fmt == "npy" else got
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == dtype, (fmt, dtype, got[k].dtype)
            _assert_equal(got[k], want[k])


@pytest.mark.parametrize("fmt", ["npy", "npz", "safetensors"])
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (2, 3, 4)])
def test_shapes_round_trip(tmp_path, fmt, shape):
    want = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 2.5
    path = _save(fmt, tmp_path / "s", {"x": mx.array(want)})
    got = mx.load(path)
    _assert_equal(got if fmt == "npy" else got["x"], want)


def test_lazy_and_strided_arrays_are_evaluated_and_written_in_order(tmp_path):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    x = mx.array(base, dtype=mx.float64)
    lazy = {"t": mx.transpose(x * 2 + 1), "s": x[::2, 1::3], "e": mx.exp(x / 10)}
    ref = {"t": (base * 2 + 1).T, "s": base[::2, 1::3], "e": np.exp(base / 10)}
    for fmt in ("npz", "safetensors", "gguf"):
        got = mx.load(_save(fmt, tmp_path / "lazy", lazy))
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), ref[k], rtol=1e-12)
    mx.save(tmp_path / "one", lazy["t"])
    np.testing.assert_array_equal(np.load(tmp_path / "one.npy"), ref["t"])


def test_files_are_readable_by_numpy_and_safetensors(tmp_path):
    from safetensors.numpy import load_file

    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    mx.save(tmp_path / "a", mx.array(x))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), x)
    mx.savez(tmp_path / "b", mx.array(x), w=mx.array(x.T))
    with np.load(tmp_path / "b.npz") as z:
        assert sorted(z.files) == ["arr_0", "w"]
        np.testing.assert_array_equal(z["w"], x.T)
    mx.save_safetensors(tmp_path / "c", {"x": mx.array(x)})
    np.testing.assert_array_equal(load_file(tmp_path / "c.safetensors")["x"], x)


def test_files_written_by_the_libraries_load(tmp_path):
    import gguf
    from safetensors.numpy import save_file

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "a.npy", np.asfortranarray(x.astype(">f8")))
    _assert_equal(mx.load(tmp_path / "a.npy"), x.astype(np.float64))
    np.savez_compressed(tmp_path / "b.npz", x, y=x[0])
    got = mx.load(tmp_path / "b.npz")
    _assert_equal(got["arr_0"], x)
    _assert_equal(got["y"], x[0])
    save_file({"x": x}, tmp_path / "c.safetensors", metadata={"k": "v"})
    got, meta = mx.load(tmp_path / "c.safetensors", return_metadata=True)
    _assert_equal(got["x"], x)
    assert meta == {"k": "v"}

    w = gguf.GGUFWriter(tmp_path / "d.gguf", "llama")
    w.add_tensor("x", x)
    w.add_tensor("q", gguf.quants.quantize(np.tile(x, (1, 8)), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_uint32("n", 7)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got, meta = mx.load(tmp_path / "d.gguf", return_metadata=True)
    _assert_equal(got["x"], x)
    # Q8_0 keeps 8 bits per value: dequantized to float16 (as MLX for other quantizations).
    assert got["q"].dtype == mx.float16 and got["q"].shape == (3, 32)
    np.testing.assert_allclose(np.asarray(got["q"]).astype(np.float64), np.tile(x, (1, 8)),
                               atol=1e-2)
    assert meta["general.architecture"] == "llama"
    assert meta["n"].dtype == mx.uint32 and meta["n"].shape == () and meta["n"].item() == 7


def test_extensions_follow_mlx(tmp_path):
    x = mx.ones((2,))
    mx.save(tmp_path / "a", x)
    mx.save(str(tmp_path / "b.bin"), x)
    mx.save(tmp_path / "c.npy", x)
    mx.savez(tmp_path / "d", x)
    mx.savez_compressed(tmp_path / "e.npz", x)
    mx.save_safetensors(tmp_path / "f", {"x": x})
    mx.save_gguf(tmp_path / "g.bin", {"x": x})
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "b.bin.npy", "c.npy", "d.npz", "e.npz",
                                            "f.safetensors", "g.bin.gguf"]


def test_format_argument_and_file_objects(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for fmt, write in [("npy", lambda f: mx.save(f, mx.array(x))),
                       ("npz", lambda f: mx.savez(f, x=mx.array(x))),
                       ("safetensors", lambda f: mx.save_safetensors(f, {"x": mx.array(x)}))]:
        buf = io.BytesIO()
        write(buf)
        buf.seek(0)
        got = mx.load(buf, format=fmt)
        _assert_equal(got if fmt == "npy" else got["x"], x)
        # A named file object gives its format by extension; any path by format=.
        path = tmp_path / f"f.{fmt}"
        path.write_bytes(buf.getvalue())
        with open(path, "rb") as f:
            got = mx.load(f)
        _assert_equal(got if fmt == "npy" else got["x"], x)
        os.rename(path, tmp_path / "f.dat")
        got = mx.load(str(tmp_path / "f.dat"), format=fmt)
        _assert_equal(got if fmt == "npy" else got["x"], x)


def test_metadata(tmp_path):
    x = {"w": mx.ones((2, 2))}
    mx.save_safetensors(tmp_path / "a", x, {"step": "3", "name": "é"})
    arrays, meta = mx.load(tmp_path / "a.safetensors", return_metadata=True)
    assert meta == {"step": "3", "name": "é"} and set(arrays) == {"w"}
    mx.save_safetensors(tmp_path / "b", x)
    assert mx.load(tmp_path / "b.safetensors", return_metadata=True)[1] == {}

    mx.save_gguf(tmp_path / "g", x, {"s": "text", "l": ["a", "b"], "i": mx.array(3),
                                     "f": mx.array([1.5, 2.5]), "b": mx.array(True),
                                     "u": mx.array(2**40, dtype=mx.uint64)})
    _, meta = mx.load(tmp_path / "g.gguf", return_metadata=True)
    assert meta["s"] == "text" and meta["l"] == ["a", "b"]
    for k, dtype, value in [("i", mx.int32, 3), ("b", mx.bool_, True), ("u", mx.uint64, 2**40)]:
        assert meta[k].dtype == dtype and meta[k].shape == () and meta[k].item() == value
    assert meta["f"].dtype == mx.float32 and meta["f"].tolist() == [1.5, 2.5]
    assert set(meta) == {"s", "l", "i", "f", "b", "u"}  # no architecture key, as MLX


def _mapped(a) -> bool:
    """Whether ``a``'s buffer is a view of a memory-mapped file."""
    b = np.asarray(a)
    while b is not None and not isinstance(b, mmap.mmap):
        b = getattr(b, "base", None) if isinstance(b, np.ndarray) else getattr(b, "obj", None)
    return isinstance(b, mmap.mmap)


def test_loading_maps_files_privately(tmp_path):
    x = np.arange(1024, dtype=np.float32).reshape(32, 32)
    paths = [_save(fmt, tmp_path / "m", {"x": mx.array(x)}) for fmt in
             ("npy", "safetensors", "gguf")]
    for path in paths:
        got = mx.load(path)
        got = got if path.endswith(".npy") else got["x"]
        assert _mapped(got), path
        with open(path, "rb") as f:
            before = f.read()
        # Writable through NumPy as MLX's memory is; the mapping is private, so a
        # write changes the array and never the file.
        np.asarray(got)[0, 0] = -1
        assert got[0, 0].item() == -1
        with open(path, "rb") as f:
            assert f.read() == before
        np.asarray(got)[0, 0] = 0
        _assert_equal(got + 0, x)
        # Overwriting the file the arrays are mapped from leaves them valid.
        _save(path.rsplit(".", 1)[1], tmp_path / "m", {"x": got * 2})
        _assert_equal(got, x)
        with open(path, "rb") as f:
            assert f.read() != before
        _assert_equal(mx.load(path) if path.endswith(".npy") else mx.load(path)["x"], 2 * x)


def test_save_bad_arguments(tmp_path):
    x = mx.ones((2,))
    with pytest.raises(DtypeError, match=r"\[save\] arr must be a lazyx array"):
        mx.save(tmp_path / "a", [1, 2])
    with pytest.raises(ArgumentError, match=r"\[save\] file must be a path"):
        mx.save(3, x)
    with pytest.raises(ArgumentError, match="keyword arr_0"):
        mx.savez(tmp_path / "b", x, arr_0=x)
    with pytest.raises(DtypeError, match=r"the array 'y' must be a lazyx array"):
        mx.savez(tmp_path / "b", y=np.ones(2))
    with pytest.raises(ArgumentError, match="metadata must be a dictionary"):
        mx.save_safetensors(tmp_path / "c", {"x": x}, {"k": 1})
    with pytest.raises(DtypeError, match="arrays must be a dict"):
        mx.save_safetensors(tmp_path / "c", [x])
    with pytest.raises(DtypeError, match=r"'x' is bool_?, which GGUF cannot store"):
        mx.save_gguf(tmp_path / "d", {"x": x > 0})
    with pytest.raises(ShapeError, match=r"more than one dimension, got shape \(2, 2\)"):
        mx.save_gguf(tmp_path / "d", {"x": x}, {"m": mx.ones((2, 2))})
    with pytest.raises(DtypeError, match="metadata 'm' must be a str"):
        mx.save_gguf(tmp_path / "d", {"x": x}, {"m": 1})
    with pytest.raises(ArgumentError, match="must be a path"):
        mx.save_gguf(io.BytesIO(), {"x": x})
    for save in (lambda p: mx.save(p, x), lambda p: mx.savez(p, x),
                 lambda p: mx.save_safetensors(p, {"x": x}), lambda p: mx.save_gguf(p, {"x": x})):
        with pytest.raises(FileMissingError, match=r"the folder '.*nowhere' does not exist"):
            save(tmp_path / "nowhere" / "f")
    # Nothing half-written is left behind by a failed save.
    assert os.listdir(tmp_path) == []


def test_load_bad_arguments(tmp_path):
    with pytest.raises(FileMissingError, match="nothere.npy.*no such file") as e:
        mx.load(tmp_path / "nothere.npy")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, RuntimeError)
    (tmp_path / "a.dat").write_bytes(b"abc")
    with pytest.raises(ArgumentError, match="Unknown file format 'dat'"):
        mx.load(tmp_path / "a.dat")
    with pytest.raises(ArgumentError, match="Unknown file format 'xyz'"):
        mx.load(tmp_path / "a.dat", format="xyz")
    mx.save(tmp_path / "b", mx.ones((2,)))
    with pytest.raises(ArgumentError, match="metadata not supported for format npy"):
        mx.load(tmp_path / "b.npy", return_metadata=True)
    with pytest.raises(ArgumentError, match="pass format="):
        mx.load(io.BytesIO(b""))
    with pytest.raises(ArgumentError, match="file must be a path"):
        mx.load(3)


@pytest.mark.parametrize("fmt", ["npy", "npz", "npz_compressed", "safetensors", "gguf"])
def test_truncated_corrupt_and_foreign_files_raise(tmp_path, fmt):
    x = {"x": mx.array(np.arange(64, dtype=np.float32).reshape(8, 8)), "y": mx.ones((3,))}
    if fmt == "npy":
        x.pop("y")
    path = _save(fmt, tmp_path / "good", x)
    with open(path, "rb") as f:
        data = f.read()
    fmt_name = fmt.split("_")[0]
    bad = {
        "empty": b"",
        "truncated data": data[:-40],  # past GGUF's padding (at most 31 bytes)
        "truncated header": data[:len(data) // 8],
        "garbage": bytes(range(256)) * 4,
        "text": b"hello world, not an array file\n" * 8,
    }
    # A header whose first bytes are flipped.
    bad["corrupt header"] = bytes(b ^ 0x5A for b in data[:24]) + data[24:]
    # Another format's file under this one's name.
    other = _save("safetensors" if fmt_name != "safetensors" else "npy", tmp_path / "other", x)
    with open(other, "rb") as f:
        bad["foreign"] = f.read()
    for what, content in bad.items():
        p = tmp_path / f"bad.{fmt_name}"
        p.write_bytes(content)
        with pytest.raises(FileFormatError, match=r"bad\." + fmt_name) as e:
            out = mx.load(p)
            # Compressed npz members are read when accessed: force them.
            mx.eval(*(out.values() if isinstance(out, dict) else [out]))
        assert isinstance(e.value, RuntimeError), what
    # The good file still loads.
    assert mx.load(path) is not None
