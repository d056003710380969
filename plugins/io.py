"""Saving and loading arrays: ``save``, ``savez``, ``savez_compressed``,
``save_safetensors``, ``save_gguf`` and ``load``, with MLX's names and signatures.

The formats are written and read by their own libraries, never by hand: NumPy's
``.npy``/``.npz`` (``np.save``, ``np.savez``, ``np.load``), the ``safetensors``
package and the ``gguf`` package (llama.cpp's). This module only moves data between
them and lazyx arrays.

Saving: the arrays are evaluated together (one scheduler pass), their host buffers
are handed to the library as NumPy views (no copy), and a path gets MLX's extension
when it lacks it (``"w"`` becomes ``"w.npy"``). A path is written to a temporary file
beside it and renamed over it at the end, so a reader never sees half a file and,
above all, arrays still mapped from the old file (see below) stay valid: the old
file lives on until they are gone.

Loading: the format comes from ``format=`` or the file's extension, then a table
(:data:`_READERS`) picks the reader. Where the format allows it the file is memory-
mapped copy-on-write (NumPy's ``mmap_mode="c"`` for ``.npy``, ``mmap`` for
``.safetensors`` and GGUF), so loading costs no copy and pages are read when first
used; the mapping is private (copy-on-write), so the arrays' memory is writable
through ``np.array(a, copy=False)`` as MLX's is, and no write reaches the file.
``.npz`` members are zip entries and are read into memory. Each library validates
its header; whatever it raises on a truncated, corrupt or foreign file becomes a
:class:`~lazyx.errors.FileFormatError` naming the file, and every array is checked
against its declared size before it is wrapped.

bfloat16 has no NumPy dtype of its own in the ``.npy`` header: NumPy (with
``ml_dtypes``) and MLX both write it as ``'<V2'`` and MLX reads ``'<V2'`` back as
bfloat16, so lazyx does the same.
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.array import array, from_buffer
from lazyx.device import to_stream
from lazyx.errors import (ArgumentError, DtypeError, FileFormatError, FileMissingError,
                          LazyxError, ShapeError)
from lazyx.hookspecs import pack_hooks

#: The extension each writer appends to a path that lacks it (as MLX does).
_EXTENSION = {"save": ".npy", "savez": ".npz", "savez_compressed": ".npz",
              "save_safetensors": ".safetensors", "save_gguf": ".gguf"}

#: safetensors' dtype codes and lazyx's dtypes.
_SAFETENSORS_DTYPES = {
    "BOOL": dt.bool_, "U8": dt.uint8, "U16": dt.uint16, "U32": dt.uint32, "U64": dt.uint64,
    "I8": dt.int8, "I16": dt.int16, "I32": dt.int32, "I64": dt.int64, "F16": dt.float16,
    "BF16": dt.bfloat16, "F32": dt.float32, "F64": dt.float64, "C64": dt.complex64,
}


# -- arguments ---------------------------------------------------------------------
def _is_path(file) -> bool:
    return isinstance(file, (str, os.PathLike))


def _check_file(op: str, file, writing: bool) -> None:
    if _is_path(file):
        return
    if not hasattr(file, "write" if writing else "read"):
        raise ArgumentError(f"[{op}] file must be a path (str or pathlib.Path) or a file "
                            f"object opened in binary mode, got {type(file).__name__}.")


def _target(op: str, file) -> str:
    """The path ``op`` writes: ``file`` with MLX's extension appended when missing."""
    path = os.fspath(file)
    ext = _EXTENSION[op]
    return path if path.endswith(ext) else path + ext


def _host(op: str, name: str, a) -> np.ndarray:
    """The host buffer of evaluated array ``a`` as a C-contiguous NumPy array (no copy
    when it already is one)."""
    if not isinstance(a, array):
        raise DtypeError(f"[{op}] {name} must be a lazyx array, got {type(a).__name__}; "
                         f"wrap it with mx.array(...).")
    return np.asarray(np.asarray(a), order="C")  # not ascontiguousarray: it makes 0-d 1-d


def _hosts(op: str, named: dict) -> dict[str, np.ndarray]:
    """``{name: host buffer}`` for ``{name: array}``, all evaluated in one pass."""
    mx.eval(*[a for a in named.values() if isinstance(a, array)])
    return {k: _host(op, f"the array {k!r}", a) for k, a in named.items()}


def _atomic_write(op: str, path: str, write) -> None:
    """Call ``write(tmp)`` on a new file beside ``path``, then rename it over ``path``.

    Renaming keeps the old file alive for the arrays still memory-mapped from it
    (``w = load(p); save(p, w)`` is safe); the temporary file gets the permissions a
    plain ``open(path, "wb")`` would (the umask applies).
    """
    path = os.path.realpath(path)
    tmp = os.path.join(os.path.dirname(path),
                       f".{os.path.basename(path)}.{os.urandom(6).hex()}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileNotFoundError:
        raise FileMissingError(f"[{op}] cannot write {path!r}: the folder "
                               f"{os.path.dirname(path)!r} does not exist.") from None
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _npy_view(a: np.ndarray) -> np.ndarray:
    """A ``.npy``/``.npz`` member as a lazyx-ready buffer: ``'<V2'`` read back as
    bfloat16 (how NumPy and MLX write it); other dtypes must be lazyx's."""
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.names is None:
        return a.view(dt.bfloat16.np)
    return a


# -- saving ------------------------------------------------------------------------
def save(file, arr: array) -> None:
    """Save the array to a binary file in ``.npy`` format.

    Args:
        file (str, pathlib.Path, file): File to which the array is saved; ``.npy`` is
            appended to a path that does not end with it.
        arr (array): Array to be saved.

    Example:
        >>> mx.save("weights", mx.ones((2, 2)))   # writes weights.npy
    """
    _check_file("save", file, writing=True)
    data = _host("save", "arr", arr)  # evaluates it
    if _is_path(file):
        def write(tmp):
            with open(tmp, "wb") as f:
                np.save(f, data, allow_pickle=False)
        _atomic_write("save", _target("save", file), write)
    else:
        np.save(file, data, allow_pickle=False)


def _savez(op: str, writer, file, args, kwargs) -> None:
    _check_file(op, file, writing=True)
    named = dict(kwargs)
    for i, a in enumerate(args):
        key = f"arr_{i}"
        if key in named:
            raise ArgumentError(f"[{op}] Cannot use un-named variables and keyword {key}.")
        named[key] = a
    data = _hosts(op, named)
    if _is_path(file):
        def write(tmp):
            with open(tmp, "wb") as f:
                writer(f, **data)
        _atomic_write(op, _target(op, file), write)
    else:
        writer(file, **data)


def savez(file, *args, **kwargs) -> None:
    """Save several arrays to a binary file in uncompressed ``.npz`` format.

    Args:
        file (file, str, pathlib.Path): Path to file to which the arrays are saved;
            ``.npz`` is appended to a path that does not end with it.
        *args (arrays): Arrays to be saved, named ``arr_0``, ``arr_1``, ...
        **kwargs (arrays): Arrays to be saved, each under its keyword.

    Example:
        >>> mx.savez("model.npz", w=mx.ones((10, 10)), b=mx.zeros((10,)))
    """
    _savez("savez", np.savez, file, args, kwargs)


def savez_compressed(file, *args, **kwargs) -> None:
    """Save several arrays to a binary file in compressed ``.npz`` format.

    Args:
        file (file, str, pathlib.Path): Path to file to which the arrays are saved;
            ``.npz`` is appended to a path that does not end with it.
        *args (arrays): Arrays to be saved, named ``arr_0``, ``arr_1``, ...
        **kwargs (arrays): Arrays to be saved, each under its keyword.
    """
    _savez("savez_compressed", np.savez_compressed, file, args, kwargs)


def _string_metadata(op: str, metadata) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ArgumentError(f"[{op}] metadata must be a dictionary with string keys and "
                            f"values, got {metadata!r}.")
    return metadata


def _named_arrays(op: str, arrays) -> dict:
    if not isinstance(arrays, dict) or not all(isinstance(k, str) for k in arrays):
        raise DtypeError(f"[{op}] arrays must be a dict from str names to arrays, got "
                         f"{type(arrays).__name__}.")
    return arrays


def save_safetensors(file, arrays: dict[str, array],
                     metadata: dict[str, str] | None = None) -> None:
    """Save array(s) to a binary file in ``.safetensors`` format.

    Written by the ``safetensors`` library. See the `Safetensors documentation
    <https://huggingface.co/docs/safetensors/index>`_ for the format.

    Args:
        file (file, str, pathlib.Path): File in which the arrays are saved;
            ``.safetensors`` is appended to a path that does not end with it.
        arrays (dict(str, array)): The dictionary of names to arrays to be saved.
        metadata (dict(str, str), optional): The dictionary of metadata to be saved.
    """
    from safetensors import numpy as st_numpy  # optional dependency, loaded on first use

    op = "save_safetensors"
    _check_file(op, file, writing=True)
    data = _hosts(op, _named_arrays(op, arrays))
    metadata = _string_metadata(op, metadata)
    if _is_path(file):
        _atomic_write(op, _target(op, file), lambda tmp: st_numpy.save_file(data, tmp, metadata))
    else:
        file.write(st_numpy.save(data, metadata))


#: GGUF value types (``GGUFValueType`` names) of metadata arrays, by lazyx dtype (GGUF
#: has no 16-bit floats nor complex numbers for metadata).
_GGUF_VALUE_TYPES = {
    dt.bool_: "BOOL", dt.uint8: "UINT8", dt.int8: "INT8", dt.uint16: "UINT16",
    dt.int16: "INT16", dt.uint32: "UINT32", dt.int32: "INT32", dt.uint64: "UINT64",
    dt.int64: "INT64", dt.float32: "FLOAT32", dt.float64: "FLOAT64",
}

#: The tensor dtypes GGUF stores (``GGMLQuantizationType`` names), and back.
_GGUF_TENSOR_TYPES = {
    dt.float32: "F32", dt.float16: "F16", dt.bfloat16: "BF16", dt.float64: "F64",
    dt.int8: "I8", dt.int16: "I16", dt.int32: "I32", dt.int64: "I64",
}
_GGUF_TENSOR_DTYPES = {v: k for k, v in _GGUF_TENSOR_TYPES.items()}


def _names(dtypes) -> str:
    return ", ".join(d.name for d in dtypes)


def _gguf_metadata(writer, gguf, metadata) -> None:
    """Add MLX's kinds of GGUF metadata: a str, a list of str, a scalar or 1-D array."""
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise DtypeError(f"[save_gguf] metadata keys must be str, got {key!r}.")
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY,
                                 sub_type=gguf.GGUFValueType.STRING)
        elif isinstance(value, array):
            if value.ndim > 1:
                raise ShapeError(f"[save_gguf] metadata {key!r}: cannot save arrays with "
                                 f"more than one dimension, got shape {value.shape}.")
            vtype = _GGUF_VALUE_TYPES.get(value.dtype)
            if vtype is None:
                raise DtypeError(f"[save_gguf] metadata {key!r}: GGUF has no value type for "
                                 f"{value.dtype.name}; use one of {_names(_GGUF_VALUE_TYPES)}.")
            vtype = gguf.GGUFValueType[vtype]
            host = np.asarray(value)
            if value.ndim == 0:
                writer.add_key_value(key, host.item(), vtype)
            else:
                writer.add_key_value(key, host.tolist(), gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            raise DtypeError(f"[save_gguf] metadata {key!r} must be a str, a list of str or "
                             f"a scalar or 1-D array, got {type(value).__name__}.")


def save_gguf(file, arrays: dict[str, array],
              metadata: dict[str, array | str | list[str]] | None = None) -> None:
    """Save array(s) to a binary file in ``.gguf`` format.

    Written by the ``gguf`` library. See the `GGUF documentation
    <https://github.com/ggerganov/ggml/blob/master/docs/gguf.md>`_ for the format.

    Args:
        file (str, pathlib.Path): File in which the arrays are saved; ``.gguf`` is
            appended to a path that does not end with it.
        arrays (dict(str, array)): The dictionary of names to arrays to be saved
            (float32, float16, bfloat16, float64, int8, int16, int32 or int64).
        metadata (dict(str, Union[array, str, list(str)]), optional): The dictionary
            of metadata to be saved. The values can be a scalar or 1-D array, a str,
            or a list of str.
    """
    import gguf  # optional dependency, loaded on first use

    op = "save_gguf"
    if not _is_path(file):
        raise ArgumentError(f"[{op}] file must be a path (str or pathlib.Path): the gguf "
                            f"library writes files by name; got {type(file).__name__}.")
    arrays = _named_arrays(op, arrays)
    for k, a in arrays.items():
        if isinstance(a, array) and a.dtype not in _GGUF_TENSOR_TYPES:
            raise DtypeError(f"[{op}] the array {k!r} is {a.dtype.name}, which GGUF cannot "
                             f"store; use one of {_names(_GGUF_TENSOR_TYPES)}.")
    data = _hosts(op, arrays)

    def write(tmp):
        writer = gguf.GGUFWriter(tmp, arch="")
        # GGUFWriter always records an architecture; MLX's files carry none.
        writer.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)
        _gguf_metadata(writer, gguf, metadata)
        for k, h in data.items():
            raw = gguf.GGMLQuantizationType[_GGUF_TENSOR_TYPES[arrays[k].dtype]]
            # ml_dtypes' bfloat16 is unknown to gguf: hand it the bits.
            writer.add_tensor(k, h.view(np.uint16) if raw.name == "BF16" else h,
                              raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    _atomic_write(op, _target(op, file), write)


# -- loading -----------------------------------------------------------------------
def _wrap(name: str, where: str, buf: np.ndarray, dtype: dt.Dtype, shape) -> array:
    """An array over ``buf`` (reinterpreted as ``dtype`` with ``shape``), checked first."""
    shape = tuple(int(s) for s in shape)
    want = int(np.prod(shape, dtype=np.int64)) * dtype.size
    if buf.nbytes != want:
        raise FileFormatError(f"[load] {where}: tensor {name!r} has {buf.nbytes} bytes of "
                              f"data, its shape {shape} and dtype {dtype.name} need {want}; "
                              f"the file is truncated or corrupt.")
    # ``asarray``: a plain ndarray over a ``np.memmap`` (lazyx buffers are plain ndarrays).
    buf = np.asarray(buf).reshape(-1).view(dtype.np).reshape(shape)
    if not (buf.flags.c_contiguous and buf.flags.aligned):
        buf = np.array(buf, order="C")  # kernels expect aligned row-major buffers
    return from_buffer(buf, dtype)


def _lazyx_buffer(where: str, a: np.ndarray, name: str = "") -> array:
    a = _npy_view(np.asarray(a))
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))  # a big-endian file: lazyx buffers are native
    try:
        dtype = dt.from_numpy(a.dtype)
    except LazyxError:
        raise FileFormatError(f"[load] {where}: {name or 'the array'} has NumPy dtype "
                              f"{a.dtype.str!r}, which lazyx has no dtype for.") from None
    return _wrap(name or "array", where, a, dtype, a.shape)


def _load_npy(file, where):
    a = np.load(file, mmap_mode="c" if _is_path(file) else None, allow_pickle=False)
    if not isinstance(a, np.ndarray):
        raise FileFormatError(f"[load] {where} is not a .npy file (it holds several arrays); "
                              f"pass format='npz'.")
    return _lazyx_buffer(where, a), None


def _load_npz(file, where):
    z = np.load(file, allow_pickle=False)
    if not hasattr(z, "files"):
        raise FileFormatError(f"[load] {where} is a .npy file, not .npz; pass format='npy'.")
    with z:
        return {k: _lazyx_buffer(where, z[k], k) for k in z.files}, None


def _load_safetensors(file, where):
    import safetensors  # optional dependency, loaded on first use

    if _is_path(file):
        # The library validates the whole header against the file (offsets, sizes,
        # length); the tensors are then views of a private mapping of the file.
        with safetensors.safe_open(file, framework="np"):
            pass
        with open(file, "rb") as fh:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    else:
        raw = file.read()
        safetensors.deserialize(raw)  # validation only (the library wants ``bytes``)
        buf = bytearray(raw)  # writable memory, as every loaded array's
        del raw
    metadata = None
    # The header is the JSON object after its 8-byte little-endian length.
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(bytes(buf[8:8 + n]))
    start = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            metadata = info
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise FileFormatError(f"[load] {where}: tensor {name!r} has safetensors dtype "
                                  f"{info['dtype']}, which lazyx has no dtype for.")
        lo, hi = info["data_offsets"]
        data = np.frombuffer(buf, np.uint8, count=hi - lo, offset=start + lo)
        out[name] = _wrap(name, where, data, dtype, info["shape"])
    return out, dict(metadata or {})


def _gguf_value(field, gguf, where):
    """A GGUF metadata value as MLX returns it: str, list of str, or an array."""
    kinds = field.types
    if kinds[0] == gguf.GGUFValueType.STRING:
        return field.contents()
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        if kinds[-1] == gguf.GGUFValueType.STRING:
            return field.contents()
        if len(kinds) > 2:
            raise FileFormatError(f"[load] {where}: metadata {field.name!r} is a nested "
                                  f"array, which lazyx does not read.")
        parts = [field.parts[i] for i in field.data]
        host = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    else:
        host = field.parts[-1].reshape(())
    host = np.array(host, dtype=bool if kinds[-1] == gguf.GGUFValueType.BOOL else host.dtype)
    return from_buffer(host, dt.from_numpy(host.dtype))


def _load_gguf(file, where):
    import gguf  # optional dependency, loaded on first use

    if not _is_path(file):
        raise ArgumentError(f"[load] a .gguf file must be given by path (the gguf library "
                            f"reads files by name), got {type(file).__name__}.")
    reader = gguf.GGUFReader(file, "c")
    out = {}
    for t in reader.tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        kind = t.tensor_type.name
        dtype = _GGUF_TENSOR_DTYPES.get(kind)
        if dtype is not None:
            out[t.name] = _wrap(t.name, where, np.asarray(t.data).reshape(-1).view(np.uint8),
                                dtype, shape)
        else:
            # A quantized tensor: dequantized by the library, then float16 as MLX does
            # for the quantizations it does not keep packed.
            host = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            out[t.name] = _wrap(t.name, where, np.ascontiguousarray(host, np.float16),
                                dt.float16, shape)
    metadata = {name: _gguf_value(f, gguf, where) for name, f in reader.fields.items()
                if not name.startswith("GGUF.")}
    return out, metadata


#: Readers by format name: each returns ``(arrays, metadata or None)``.
_READERS = {"npy": _load_npy, "npz": _load_npz, "safetensors": _load_safetensors,
            "gguf": _load_gguf}
_HAS_METADATA = ("safetensors", "gguf")


def load(file, /, format: str | None = None, return_metadata: bool = False, *,
         stream=None) -> array | dict[str, array] | tuple[dict[str, array], dict[str, Any]]:
    """Load array(s) from a binary file.

    The supported formats are ``.npy``, ``.npz``, ``.safetensors`` and ``.gguf``.
    ``.npy``, ``.safetensors`` and ``.gguf`` files given by path are memory-mapped
    copy-on-write: nothing is copied until the data is used, and nothing done to the
    arrays reaches the file.

    Args:
        file (file, str, pathlib.Path): File in which the array is saved.
        format (str, optional): Format of the file: ``"npy"``, ``"npz"``,
            ``"safetensors"`` or ``"gguf"``. If ``None``, the format is inferred from
            the file extension. Default: ``None``.
        return_metadata (bool, optional): Load the metadata for formats which support
            it (safetensors, GGUF). The metadata is returned as an additional
            dictionary. Default: ``False``.

    Returns:
        array, dict, or tuple: A single array if loading from a ``.npy`` file, or a dict
        mapping names to arrays otherwise. If ``return_metadata`` is ``True``, a tuple
        ``(arrays, metadata)``.

    Example:
        >>> mx.save_safetensors("w", {"w": mx.ones((2,))}, {"step": "3"})
        >>> mx.load("w.safetensors", return_metadata=True)[1]
        {'step': '3'}
    """
    to_stream(stream)  # a bad stream= is an error here too
    _check_file("load", file, writing=False)
    if format is None:
        name = os.fspath(file) if _is_path(file) else getattr(file, "name", None)
        if not isinstance(name, (str, bytes)):
            raise ArgumentError("[load] cannot infer the format of a file object without a "
                                "name; pass format='npy', 'npz', 'safetensors' or 'gguf'.")
        format = os.path.splitext(os.fsdecode(name))[1].lstrip(".")
    reader = _READERS.get(format)
    if reader is None:
        raise ArgumentError(f"[load] Unknown file format {format!r}; the formats are "
                            f"{', '.join(_READERS)} (pass format= to choose one).")
    if return_metadata and format not in _HAS_METADATA:
        raise ArgumentError(f"[load] metadata not supported for format {format}; "
                            f"load it without return_metadata=True.")
    where = f"{os.fsdecode(os.fspath(file))!r} ({format})" if _is_path(file) else \
        f"{getattr(file, 'name', type(file).__name__)!r} ({format})"
    if _is_path(file) and not os.path.exists(file):
        raise FileMissingError(f"[load] {where}: no such file.")
    try:
        arrays, metadata = reader(file, where)
    except LazyxError:
        raise
    except MemoryError:
        raise
    except Exception as e:  # each library raises its own kinds
        raise FileFormatError(f"[load] {where} is not a readable {format} file (truncated, "
                              f"corrupt or of another format): {type(e).__name__}: {e}") from e
    return (arrays, metadata) if return_metadata else arrays


OPS = {"save": save, "savez": savez, "savez_compressed": savez_compressed,
       "save_safetensors": save_safetensors, "save_gguf": save_gguf, "load": load}

lazyx_primitives, lazyx_ops = pack_hooks([], OPS)
