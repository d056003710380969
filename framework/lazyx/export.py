"""Exporting traced functions to files: ``export_function``, ``exporter`` and
``import_function``.

``export_function`` calls the function once on *placeholders* (arrays of the
example arguments' shapes and dtypes that cannot be evaluated) and records the
lazy graph between them and the outputs: every node's primitive (by the
identity under which its plugin registered it), its parameters and its input
edges, and the data of every array the function captured (closures, Python
scalars turned into constants). The record is written in lazyx's own format,
described in ``docs/export-format.md``: a fixed prefix with a checksum, a JSON
header, and the constants' raw bytes.

``import_function`` reads such a file in any process where the primitives'
plugins are installed, without the function's Python source. Reading never
runs code from the file: primitive classes are looked up by name in
:data:`lazyx.registry.primitives` and built from parameters decoded from
tagged JSON. A file is data from anywhere, so reading checks all of it before
anything runs: the prefix and checksum (``_read``), the JSON types of every
field, every parameter against its primitive's declared types and allowed
values (:meth:`Primitive.check_params`), the graph's references (in range,
inputs before their users: acyclic), and every node's output shapes and dtypes,
inferred again from its inputs (``output_shapes``, the dtype rule) and compared
with what the file declares (``_decode_plan``). Any failure is a
:class:`FunctionFileError` naming where. Calling the imported function rebuilds the recorded graph on the
given arrays with :func:`lazyx.array.lazy`, so its results are ordinary lazy
arrays that compose with ``eval``, ``grad`` and ``vmap``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import struct

import numpy as np

from . import __version__ as _lazyx_version
from . import dtypes as _dt
from . import registry as _registry
from .array import array, from_buffer, lazy, lazy_multi
from .device import to_stream
from .codegen import ir
from .custom_primitive import CustomPrimitive
from .errors import ArgumentError, DtypeError, LazyxError, PluginError, TransformError
from .primitive import FixedShape, MAX_SIZE, ParameterDeclarationError, Primitive, Shape
from .transforms.autodiff import TraceInput, _outputs
from .transforms.compile import _settings
from .transforms.trees import describe

__all__ = ["export_function", "import_function", "exporter", "FunctionExporter",
           "ImportedFunction", "ExportError", "FunctionFileError", "PrimitiveNotInstalledError",
           "FORMAT_VERSION"]

FORMAT_NAME = "lazyx.function"
#: The version of the file format this module writes (and the newest it reads).
FORMAT_VERSION = 1
MAGIC = b"LAZYXFN\x00"
# magic, format version, flags (reserved, 0), header length, payload length, SHA-256
# of header and payload: 64 bytes, so the header starts 64-byte aligned.
_PREFIX = struct.Struct("<8sIIQQ32s")
_ALIGN = 64

_array = array
_INPUT_FORMS = ("Inputs can either be a variable number of positional and keyword arrays or "
                "a single tuple and/or dictionary of arrays")


class ExportError(LazyxError, ValueError):
    """A function, its arguments or its outputs cannot be exported."""


class FunctionFileError(LazyxError, RuntimeError):
    """A function file that cannot be read: missing, truncated, corrupt, of another version,
    or whose contents fail a check (a parameter, a reference, a node's shapes or dtypes)."""


class PrimitiveNotInstalledError(FunctionFileError, PluginError):
    """A function file names a primitive that no installed plugin provides (or one with
    other parameters): a :class:`PluginError` as well, since installing the plugin fixes it."""


class ExportInput(FixedShape):
    """Stands for one argument of the function while ``export_function`` traces it."""

    # ``index`` is the argument's position among the positional then keyword inputs.
    __slots__ = ("index", "shape")
    index: int
    shape: Shape
    transient = True

    def eval_cpu(self, inputs):
        raise TransformError(
            "[export_function] Cannot evaluate an array that depends on an input of the "
            "function being exported (item(), printing, eval, NumPy conversion): the "
            "function is traced on placeholders that hold no values.")

    eval_gpu = eval_cpu


# -- parameters as tagged JSON ---------------------------------------------------------
class _Unencodable(Exception):
    def __init__(self, path, value):
        self.path = path
        self.value = value


def _lazyx_dtype(np_dtype):
    try:
        return _dt.from_numpy(np_dtype)
    except DtypeError:
        return None


def encode_value(v, path: str = ""):
    """``v`` as JSON data: plain JSON for ``None``, bools, ints, finite floats, strings and
    lists; a dict tagged ``"$"`` for tuples, non-finite floats, complex numbers, dtypes,
    slices, bytes, dicts, ``Ellipsis``, NumPy scalars and arrays. Raises ``_Unencodable``."""
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return v if math.isfinite(v) else {"$": "float", "value": repr(v)}
    if t is list:
        return [encode_value(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if t is tuple:
        return {"$": "tuple", "items": [encode_value(x, f"{path}[{i}]") for i, x in enumerate(v)]}
    if isinstance(v, _dt.Dtype):
        return {"$": "dtype", "name": v.name}
    if t is complex:
        return {"$": "complex", "real": encode_value(v.real), "imag": encode_value(v.imag)}
    if t is slice:
        return {"$": "slice", "start": encode_value(v.start, f"{path}.start"),
                "stop": encode_value(v.stop, f"{path}.stop"),
                "step": encode_value(v.step, f"{path}.step")}
    if t is bytes:
        return {"$": "bytes", "base64": base64.b64encode(v).decode("ascii")}
    if t is dict:
        return {"$": "dict", "items": [[encode_value(k, f"{path}.keys()"),
                                        encode_value(x, f"{path}[{k!r}]")]
                                       for k, x in v.items()]}
    if v is Ellipsis:
        return {"$": "ellipsis"}
    if isinstance(v, (np.generic, np.ndarray)):
        d = _lazyx_dtype(v.dtype)
        if d is None:
            raise _Unencodable(path, v)
        if t is np.ndarray:
            return {"$": "ndarray", "dtype": d.name, "shape": list(v.shape),
                    "base64": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode("ascii")}
        return {"$": "scalar", "dtype": d.name,
                "base64": base64.b64encode(v.tobytes()).decode("ascii")}
    raise _Unencodable(path, v)


def _bad(msg):
    # ``from None``: the reader's own checks say what is wrong; a JSON or base64
    # traceback underneath would only hide it.
    raise FunctionFileError(f"[import_function] {msg}") from None


def _b64(j, where):
    s = j.get("base64")
    if type(s) is not str:
        _bad(f"{where}: missing base64 data.")
    try:
        return base64.b64decode(s.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        _bad(f"{where}: invalid base64 data.")


def _dtype_named(name, where):
    try:
        return _dt.to_dtype(name) if type(name) is str else _bad(f"{where}: unknown dtype {name!r}.")
    except DtypeError:
        _bad(f"{where}: unknown dtype {name!r}.")


def _shape(j, where) -> tuple:
    if type(j) is not list or any(type(s) is not int or not 0 <= s <= MAX_SIZE for s in j):
        _bad(f"{where}: a shape must be a list of ints in [0, 2**62], got {_short(j)}.")
    if math.prod(j) > MAX_SIZE:
        _bad(f"{where}: shape {tuple(j)} has more than 2**62 elements.")
    return tuple(j)


def _short(j) -> str:
    """``repr(j)`` cut to a length an error message can carry."""
    r = repr(j)
    return r if len(r) <= 120 else r[:117] + "..."


def decode_value(j, where: str = "parameter"):
    """The Python value of ``encode_value``'s output ``j``; never evaluates code."""
    t = type(j)
    if j is None or t is bool or t is int or t is str or t is float:
        return j
    if t is list:
        return [decode_value(x, where) for x in j]
    if t is not dict:
        _bad(f"{where}: unexpected JSON value {j!r}.")
    tag = j.get("$")
    if tag == "tuple" and type(j.get("items")) is list:
        return tuple(decode_value(x, where) for x in j["items"])
    if tag == "float" and j.get("value") in ("inf", "-inf", "nan"):
        return float(j["value"])
    if tag == "dtype":
        return _dtype_named(j.get("name"), where)
    if tag == "complex":
        re, im = decode_value(j.get("real"), where), decode_value(j.get("imag"), where)
        if type(re) is not float or type(im) is not float:
            _bad(f"{where}: a complex number needs float parts.")
        return complex(re, im)
    if tag == "slice":
        return slice(decode_value(j.get("start"), where), decode_value(j.get("stop"), where),
                     decode_value(j.get("step"), where))
    if tag == "bytes":
        return _b64(j, where)
    if tag == "dict" and type(j.get("items")) is list:
        out = {}
        for item in j["items"]:
            if type(item) is not list or len(item) != 2:
                _bad(f"{where}: a dict item must be a [key, value] pair.")
            k = decode_value(item[0], where)
            try:
                out[k] = decode_value(item[1], where)
            except TypeError:
                _bad(f"{where}: unhashable dict key {k!r}.")
        return out
    if tag == "ellipsis":
        return Ellipsis
    if tag in ("scalar", "ndarray"):
        d = _dtype_named(j.get("dtype"), where)
        raw = _b64(j, where)
        shape = _shape(j.get("shape"), where) if tag == "ndarray" else ()
        if len(raw) != math.prod(shape) * d.size:
            _bad(f"{where}: {len(raw)} bytes do not hold shape {shape} of {d.name}.")
        a = np.frombuffer(raw, dtype=d.np).reshape(shape)
        return a.copy() if tag == "ndarray" else a[()]
    _bad(f"{where}: unknown tagged value {j!r}.")


def _dump(obj) -> str:
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


# -- inputs, outputs and signatures ----------------------------------------------------
def _split_inputs(args: tuple, kwargs: dict, where: str):
    """``(positional arrays, {name: array})`` from MLX's two calling forms."""
    if not kwargs and 1 <= len(args) <= 2 and type(args[0]) in (tuple, list) and (
            len(args) == 1 or type(args[1]) is dict):
        pos, kw = list(args[0]), dict(args[1]) if len(args) == 2 else {}
    elif not kwargs and len(args) == 1 and type(args[0]) is dict:
        pos, kw = [], dict(args[0])
    else:
        pos, kw = list(args), kwargs
    for i, x in enumerate(pos):
        if not isinstance(x, _array):
            raise ArgumentError(f"[{where}] {_INPUT_FORMS}; positional input {i} is "
                                f"{describe(x)}.")
    for k, x in kw.items():
        if type(k) is not str:
            raise ArgumentError(f"[{where}] {_INPUT_FORMS}; keyword {k!r} is not a string.")
        if not isinstance(x, _array):
            raise ArgumentError(f"[{where}] {_INPUT_FORMS}; keyword input {k!r} is "
                                f"{describe(x)}.")
    return pos, kw


def _spec(x) -> str:
    return f"({','.join(map(str, x[0]))}) {x[1].name}"


def _describe_signature(args, kwargs) -> str:
    lines = [f"   {i + 1}: {_spec(s)}" for i, s in enumerate(args)]
    lines += [f"   {k!r}: {_spec(s)}" for k, s in kwargs]
    return "\n".join(lines)


class _Signature:
    """The shapes and dtypes of a trace's positional and keyword inputs."""

    __slots__ = ("args", "kwargs", "names")

    def __init__(self, args, kwargs):
        self.args = args  # [(shape, dtype)]
        self.kwargs = kwargs  # [(name, (shape, dtype))]
        self.names = {k for k, _ in kwargs}

    def key(self, shapeless: bool):
        def one(s):
            return (len(s[0]) if shapeless else s[0], s[1].name)
        return (tuple(one(s) for s in self.args),
                tuple(sorted((k, one(s)) for k, s in self.kwargs)))

    def matches(self, pos, kw, shapeless: bool) -> bool:
        if len(pos) != len(self.args) or len(kw) != len(self.kwargs) or set(kw) != self.names:
            return False
        for x, (shape, dtype) in zip(pos, self.args):
            if x._dtype is not dtype or (len(x._shape) != len(shape) if shapeless
                                         else x._shape != shape):
                return False
        for k, (shape, dtype) in self.kwargs:
            x = kw[k]
            if x._dtype is not dtype or (len(x._shape) != len(shape) if shapeless
                                         else x._shape != shape):
                return False
        return True

    def describe(self) -> str:
        return (f"Function with {len(self.args)} positional inputs and {len(self.kwargs)} "
                f"keyword inputs:\n{_describe_signature(self.args, self.kwargs)}")


# -- tracing -----------------------------------------------------------------------------
class _Trace:
    """One traced signature: nodes in topological order and the output references.

    A reference is ``("a", k)`` (input ``k``: positional, then keyword in order),
    ``("c", k)`` (constant ``k``) or ``("n", i, j)`` (output ``j`` of node ``i``).
    """

    __slots__ = ("signature", "nodes", "outputs")

    def __init__(self, signature, nodes, outputs):
        self.signature = signature
        self.nodes = nodes  # [(primitive, input refs, [(shape, dtype)], input arrays)]
        self.outputs = outputs


def _compile_settings():
    """``compile``'s settings: while their ``tracing`` count is positive, a compiled
    function inlines its graph instead of adding one opaque node (as inside another
    compile's trace), so an exported function may call compiled ones."""
    return _settings if hasattr(_settings, "tracing") else None


def _trace(fun, pos, kw, constant_index) -> _Trace:
    """Call ``fun`` on placeholders of ``pos`` and ``kw`` and record its graph.

    ``constant_index(array)`` returns the index of a captured array.
    """
    stream = to_stream(None)
    placeholders = []
    prims = []
    for k, x in enumerate(pos + list(kw.values())):
        p = ExportInput(stream, k, x._shape)
        prims.append(p)
        placeholders.append(lazy(x._shape, x._dtype, p, ()))
    n = len(pos)
    settings = _compile_settings()
    if settings is not None:
        settings.tracing += 1
    try:
        out = fun(*placeholders[:n], **dict(zip(kw, placeholders[n:])))
    finally:
        if settings is not None:
            settings.tracing -= 1
    outs = _outputs(out, "export_function")
    inputs = {id(p): k for k, p in enumerate(prims)}
    refs: dict = {}  # (id(prim), id(inputs)) -> node index
    nodes = []

    def ref(a):
        if a._data is not None:
            return ("c", constant_index(a))
        p = a._prim
        if type(p) is ExportInput:
            k = inputs.get(id(p))
            if k is None:
                raise ExportError("[export_function] The function uses a placeholder of another "
                                  "export (an array kept from an earlier trace).")
            return ("a", k)
        if type(p) is TraceInput:
            # The identity a transform inside the function put on its primal. Kept, its
            # sequence number would collide with the wrappers of the importing process.
            return ref(a._inputs[0])
        i = refs[(id(p), id(a._inputs))]
        sib = a._siblings
        if sib is None:
            return ("n", i, 0)
        for j, s in enumerate(sib):
            if s is a:
                return ("n", i, j)

    def leaf(x):
        p = x._prim
        return x._data is not None or type(p) is ExportInput or (
            type(p) is not TraceInput and (id(p), id(x._inputs)) in refs)

    for r in outs:
        if leaf(r):
            continue
        stack = [(r, 0)]
        while stack:
            a, i = stack.pop()
            ins = a._inputs
            while i < len(ins):
                x = ins[i]
                i += 1
                if not leaf(x):
                    stack.append((a, i))
                    stack.append((x, 0))
                    break
            else:
                p = a._prim
                if type(p) is TraceInput:
                    continue
                sib = a._siblings or (a,)
                refs[(id(p), id(ins))] = len(nodes)
                nodes.append((p, [ref(x) for x in ins], [(s._shape, s._dtype) for s in sib],
                              ins))
    sig = _Signature([(x._shape, x._dtype) for x in pos],
                     [(k, (x._shape, x._dtype)) for k, x in kw.items()])
    return _Trace(sig, nodes, [ref(r) for r in outs])


# -- primitives by their public identity -------------------------------------------------
def _identity(cls) -> dict:
    info = _registry.primitives.get(cls)
    if info is None:
        raise ExportError(
            f"[export_function] Cannot export primitive {cls.name} ({cls.__module__}."
            f"{cls.__qualname__}): no plugin registers it, so no other process could find it. "
            f"Register it through a plugin's lazyx_primitives hook.")
    return {"id": f"{info.distribution}:{cls.__qualname__}", "distribution": info.distribution,
            "distribution_version": info.version, "plugin": info.name,
            "class": cls.__qualname__, "params": list(cls._param_names)}


def _who(cls) -> str:
    info = _registry.primitives.get(cls)
    where = f" (plugin {info.name!r} of distribution {info.distribution!r})" if info else ""
    return f"{cls.name}{where}"


def _encode_params(prim) -> list:
    cls = type(prim)
    names = cls._param_names
    out = []
    for name, v in zip(names, prim.params()):
        try:
            out.append(encode_value(v))
        except _Unencodable as e:
            raise ExportError(
                f"[export_function] Cannot export primitive {_who(cls)}: its parameter "
                f"{name!r}{e.path} holds {describe(e.value)}, which the lazyx function format "
                f"cannot encode (it stores None, bool, int, float, complex, str, bytes, "
                f"list, tuple, dict, slice, Ellipsis, dtypes and NumPy scalars and arrays)."
            ) from None
    return out


def _build(cls, stream, params):
    """``cls``'s primitive from decoded ``params``.

    A primitive's ``__init__`` takes ``stream`` and its parameters, by the names of
    their slots (most custom ``__init__``s) or positionally in slot order (the base
    class's); export checks that one of the two gives the primitive back.
    """
    if cls.__init__ is Primitive.__init__:
        return cls(stream, *params)
    try:
        return cls(stream, **dict(zip(cls._param_names, params)))
    except TypeError:
        return cls(stream, *params)


def _check_declared(prim, inputs) -> None:
    """Export-time check that the primitive's parameters are declared and fit their
    declarations, so that the file can be checked when it is loaded."""
    cls = type(prim)
    missing = cls.undeclared_params()
    if missing:
        how = ("annotate the kernel's keyword-only parameters (alpha: float = 1.0)"
               if issubclass(cls, CustomPrimitive) else
               f"annotate them beside __slots__ in its class ({missing[0]}: <type>, e.g. "
               f"float, tuple[int, ...] or Literal[\"a\", \"b\"])")
        raise ExportError(
            f"[export_function] Cannot export primitive {_who(cls)}: its parameters "
            f"{list(missing)} have no declared types, so a file holding it could not be "
            f"checked when loaded; {how}. See docs/writing-a-custom-primitive.md.")
    try:
        cls.check_params(prim.params(), inputs)
    except (ArgumentError, ParameterDeclarationError) as e:
        raise ExportError(f"[export_function] Cannot export primitive {_who(cls)}: {e} "
                          f"A file holding it would be refused when loaded.") from None


def _check_rebuild(prim, encoded: list) -> None:
    """Export-time check that the primitive comes back from its encoded parameters."""
    cls = type(prim)
    try:
        again = _encode_params(_build(cls, prim.stream,
                                      [decode_value(j) for j in encoded]))
    except ExportError:
        raise
    except Exception as e:
        again = f"{type(e).__name__}: {e}"
    if again != encoded:
        raise ExportError(
            f"[export_function] Cannot export primitive {_who(cls)}: building it again from "
            f"its parameters {dict(zip(cls._param_names, prim.params()))} does not give the "
            f"same primitive ({again!r}). Its __init__ must accept (stream, parameters...) by "
            f"the names of its parameter slots or in their order.")


def _check_shape_rule(prim, inputs, outs, shapeless: bool) -> None:
    """The primitive must infer the shapes it produced when traced: ``import_function``
    checks every node of a file with its shape rule (and, shapeless, runs it at each call)."""
    cls = type(prim)
    why = "with shapeless=True" if shapeless else "to a file"
    if shapeless and not getattr(cls, "shapeless", True):
        raise ExportError(f"[export_function] Cannot export with shapeless=True: the "
                          f"parameters of primitive {_who(cls)} fix its output shape to the "
                          f"traced shapes ({prim!r}).")
    if cls.output_shapes is Primitive.output_shapes:
        raise ExportError(f"[export_function] Cannot export {why}: primitive {_who(cls)} "
                          f"cannot infer its output shapes (it does not implement "
                          f"output_shapes), which import_function needs to check the file.")
    try:
        got = [tuple(s) for s in prim.output_shapes(inputs)]
    except LazyxError as e:
        raise ExportError(f"[export_function] Cannot export {why}: the shape rule of "
                          f"primitive {_who(cls)} fails: {e}") from None
    want = [s for s, _ in outs]
    if got != want:
        raise ExportError(f"[export_function] Cannot export {why}: primitive "
                          f"{_who(cls)} infers output shapes {got} where the traced node has "
                          f"{want}.")


# -- the exporter ------------------------------------------------------------------------
class FunctionExporter:
    """Writes traces of one function to one file; made by :func:`exporter`.

    Call it with example arguments to add a trace of that signature; the file
    is rewritten after every call, so it is complete whenever a call returns.
    Use it as a context manager or call :meth:`close` when done.
    """

    def __init__(self, file, fun, shapeless: bool = False, metadata: str | None = None):
        if not callable(fun):
            raise ArgumentError(f"[export_function] fun must be callable, got {describe(fun)}.")
        if metadata is not None and type(metadata) is not str:
            raise ArgumentError(f"[export_function] metadata must be a string, got "
                                f"{describe(metadata)}.")
        self._file = os.fsdecode(file)
        self._fun = fun
        self._shapeless = bool(shapeless)
        self._metadata = metadata
        self._closed = False
        self._constants: list = []
        self._constant_ids: dict = {}
        self._primitives: list = []
        self._primitive_ids: dict = {}
        self._traces: list = []
        self._keys: set = set()

    def _constant(self, a) -> int:
        k = self._constant_ids.get(id(a))
        if k is None:
            k = self._constant_ids[id(a)] = len(self._constants)
            self._constants.append(a)  # keeps the id valid
        return k

    def _primitive(self, cls) -> int:
        k = self._primitive_ids.get(cls)
        if k is None:
            entry = _identity(cls)
            k = self._primitive_ids[cls] = len(self._primitives)
            self._primitives.append(entry)
        return k

    def __call__(self, *args, **kwargs) -> None:
        """Trace the function on arguments of these shapes and dtypes and add it to the file."""
        if self._closed:
            raise ExportError("[export_function] Attempting to write after exporting is closed.")
        pos, kw = _split_inputs(args, kwargs, "export_function")
        n_const, n_prim = len(self._constants), len(self._primitives)
        try:
            trace = _trace(self._fun, pos, kw, self._constant)
            key = trace.signature.key(self._shapeless)
            if key in self._keys:
                raise ExportError("[export_function] Attempting to export a function twice with "
                                  "the same signature is not allowed:\n"
                                  + trace.signature.describe())
            entry = self._encode_trace(trace)
        except BaseException:
            # Leave the file's tables as they were: a failed trace adds nothing.
            for a in self._constants[n_const:]:
                del self._constant_ids[id(a)]
            del self._constants[n_const:]
            for cls in [c for c, k in self._primitive_ids.items() if k >= n_prim]:
                del self._primitive_ids[cls]
            del self._primitives[n_prim:]
            raise
        self._keys.add(key)
        self._traces.append(entry)
        self._write()

    def _encode_trace(self, trace: _Trace) -> dict:
        nodes = []
        checked: set = set()
        for prim, ins, outs, arrays in trace.nodes:
            cls = type(prim)
            pidx = self._primitive(cls)
            params = _encode_params(prim)
            key = (cls, _dump(params), tuple(len(x._shape) for x in arrays))
            if key not in checked:
                _check_declared(prim, arrays)
                _check_rebuild(prim, params)
                checked.add(key)
            _check_shape_rule(prim, arrays, outs, self._shapeless)
            nodes.append({"primitive": pidx, "params": params, "inputs": [list(r) for r in ins],
                          "outputs": [{"shape": list(s), "dtype": d.name} for s, d in outs]})
        sig = trace.signature
        return {"args": [{"shape": list(s), "dtype": d.name} for s, d in sig.args],
                "kwargs": [{"name": k, "shape": list(s), "dtype": d.name}
                           for k, (s, d) in sig.kwargs],
                "nodes": nodes, "outputs": [list(r) for r in trace.outputs]}

    def _write(self) -> None:
        header = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
                  "lazyx_version": _lazyx_version, "shapeless": self._shapeless,
                  "metadata": self._metadata, "primitives": self._primitives,
                  "constants": [], "traces": self._traces}
        blobs = []
        offset = 0
        for a in self._constants:
            data = np.ascontiguousarray(a._numpy()).tobytes()
            header["constants"].append({"dtype": a._dtype.name, "shape": list(a._shape),
                                        "offset": offset, "nbytes": len(data)})
            pad = -len(data) % _ALIGN
            blobs.append(data + b"\x00" * pad)
            offset += len(data) + pad
        text = _dump(header).encode("utf-8")
        text += b" " * (-len(text) % _ALIGN)
        digest = hashlib.sha256(text)
        for b in blobs:
            digest.update(b)
        prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(text), offset, digest.digest())
        tmp = f"{self._file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(prefix)
                f.write(text)
                for b in blobs:
                    f.write(b)
            os.replace(tmp, self._file)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise ExportError(f"[export_function] Cannot write {self._file!r}: "
                              f"{e.strerror or e}.") from None

    def close(self) -> None:
        """Finish exporting; later calls raise."""
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def exporter(file: str, fun, *, shapeless: bool = False,
             metadata: str | None = None) -> FunctionExporter:
    """Make a callable object to export multiple traces of a function to a file.

    Each call of the returned object traces ``fun`` on arrays of the given
    signature and adds the trace to ``file``; the imported function picks the
    trace whose signature matches its arguments.

    Args:
        file (str): File path to export the function to.
        fun (Callable): A function of zero or more arrays returning an array, or a
          tuple or list of arrays.
        shapeless (bool, optional): Whether or not the function allows inputs with
          variable shapes (of the traced number of dimensions). Default: ``False``.
        metadata (str, optional): A string to save alongside the function, for
          example a JSON encoded model configuration. Read it back with
          :func:`import_function`. Default: ``None``.

    Returns:
        FunctionExporter: call it with example inputs; use it in a ``with`` block or
        call ``close()`` when done.

    Example:
        >>> def fun(*args):
        ...     return sum(args)
        >>> with mx.exporter("fun.lxfn", fun) as ex:
        ...     ex(mx.array(1))
        ...     ex(mx.array(1), mx.array(2))
    """
    return FunctionExporter(file, fun, shapeless, metadata)


def _value_names():
    n = 0
    while True:
        s, k = "", n
        while True:
            s = chr(65 + k % 26) + s
            k = k // 26 - 1
            if k < 0:
                break
        yield s
        n += 1


def _to_callback(callback, trace: _Trace, constants: list) -> None:
    """Describe ``trace`` to ``callback`` as a series of dicts (MLX's callback export)."""
    names = _value_names()
    sig = trace.signature
    specs = list(sig.args) + [s for _, s in sig.kwargs]
    arg_names = [next(names) for _ in specs]
    const_names = [next(names) for _ in constants]
    node_names = [[next(names) for _ in node[2]] for node in trace.nodes]

    def name(r):
        return {"a": arg_names, "c": const_names}[r[0]][r[1]] if r[0] != "n" else \
            node_names[r[1]][r[2]]

    def spec(r):
        if r[0] == "a":
            return specs[r[1]]
        if r[0] == "c":
            return constants[r[1]]._shape, constants[r[1]]._dtype
        return trace.nodes[r[1]][2][r[2]]

    def value(r):
        s = spec(r)
        return (name(r), s[0], s[1])

    callback({"type": "inputs", "inputs": [(n, s, d) for n, (s, d) in zip(arg_names, specs)]})
    callback({"type": "keyword_inputs",
              "keywords": [(k, arg_names[len(sig.args) + i]) for i, (k, _) in
                           enumerate(sig.kwargs)]})
    callback({"type": "outputs", "outputs": [value(r) for r in trace.outputs]})
    callback({"type": "constants", "constants": list(zip(const_names, constants))})
    for i, (prim, ins, outs, _) in enumerate(trace.nodes):
        callback({"type": "primitive", "name": prim.name, "arguments": list(prim.params()),
                  "inputs": [value(r) for r in ins],
                  "outputs": [(n, s, d) for n, (s, d) in zip(node_names[i], outs)]})


def export_function(file_or_callback, fun, *args, shapeless: bool = False,
                    metadata: str | None = None, **kwargs) -> None:
    """Export a function to a file.

    Example input arrays must be provided to export a function. The example
    inputs can be variable ``*args`` and ``**kwargs`` or a tuple of arrays
    and/or dictionary of string keys with array values. The function is traced
    once on placeholders of those shapes and dtypes; arrays it captures (closures,
    scalars) are saved with it. Load it with :func:`import_function`, in this or
    another process, without the function's source.

    Args:
        file_or_callback (str or Callable): Either a file path to export the
          function to or a callback, which receives the traced graph as a series
          of dicts (``"type"``: ``"inputs"``, ``"keyword_inputs"``, ``"outputs"``,
          ``"constants"``, then one ``"primitive"`` per node in order).
        fun (Callable): A function which takes as input zero or more
          :class:`array` and returns one or more :class:`array`.
        *args (array): Example array inputs to the function.
        shapeless (bool, optional): Whether or not the function allows inputs
          with variable shapes (of the same number of dimensions). Every
          primitive must then infer its output shapes. Default: ``False``.
        metadata (str, optional): A string to save alongside the function, for
          example a JSON encoded model configuration. Only supported when
          exporting to a file. Default: ``None``.
        **kwargs (array): Additional example keyword array inputs to the function.

    Example:
        >>> def fun(x, y):
        ...     return x + y
        >>> mx.export_function("fun.lxfn", fun, mx.array(1), y=mx.array([1, 2, 3]))
    """
    if callable(file_or_callback) and not isinstance(file_or_callback, (str, bytes, os.PathLike)):
        if metadata is not None:
            raise ArgumentError("[export_function] The metadata argument is only supported "
                                "when exporting to a file, not when using a callback.")
        pos, kw = _split_inputs(args, kwargs, "export_function")
        constants: list = []
        ids: dict = {}

        def index(a):
            k = ids.get(id(a))
            if k is None:
                k = ids[id(a)] = len(constants)
                constants.append(a)
            return k

        _to_callback(file_or_callback, _trace(fun, pos, kw, index), constants)
        return
    with FunctionExporter(file_or_callback, fun, shapeless, metadata) as ex:
        ex(*args, **kwargs)


# -- reading -----------------------------------------------------------------------------
def _read(file: str):
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise FunctionFileError(f"[import_function] Failed to open {file!r}: "
                                f"{e.strerror or e}.") from None
    n = _PREFIX.size
    if len(raw) < n or raw[:8] != MAGIC:
        if raw[:8] == MAGIC:
            _bad(f"{file!r} is truncated: {len(raw)} bytes, shorter than the format's "
                 f"{n}-byte prefix.")
        _bad(f"{file!r} is not a lazyx function file (it does not start with {MAGIC!r}).")
    _, version, flags, hlen, plen, digest = _PREFIX.unpack_from(raw)
    if version != FORMAT_VERSION:
        _bad(f"{file!r} has format version {version}; this lazyx ({_lazyx_version}) reads "
             f"version {FORMAT_VERSION}" + (": it was written by a newer lazyx, upgrade to read "
                                            "it." if version > FORMAT_VERSION else "."))
    if flags != 0:
        _bad(f"{file!r} is corrupt: its prefix has flags {flags:#x}; format version "
             f"{FORMAT_VERSION} defines none.")
    if len(raw) != n + hlen + plen:
        what = "truncated" if len(raw) < n + hlen + plen else "followed by unexpected bytes"
        _bad(f"{file!r} is {what}: it has {len(raw)} bytes, its prefix promises "
             f"{n + hlen + plen}.")
    body = memoryview(raw)[n:]
    if hashlib.sha256(body).digest() != digest:
        _bad(f"{file!r} is corrupt: its checksum does not match its contents.")
    try:
        header = json.loads(bytes(body[:hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        _bad(f"{file!r} has an unreadable header: {e}.")
    if type(header) is not dict or header.get("format") != FORMAT_NAME:
        _bad(f"{file!r} is not a lazyx function file (its header names no format "
             f"{FORMAT_NAME!r}).")
    if header.get("version") != version:
        _bad(f"{file!r}: its header's version {header.get('version')!r} differs from its "
             f"prefix's {version}.")
    return header, body[hlen:]


def _field(obj, key, kind, where):
    v = obj.get(key) if type(obj) is dict else None
    if type(v) is not kind:
        _bad(f"{where}: field {key!r} must be a {kind.__name__}, got {v!r}.")
    return v


def _classes_by_identity() -> dict:
    out: dict = {}
    for cls, info in _registry.primitives.items():
        out.setdefault(f"{info.distribution}:{cls.__qualname__}", []).append((cls, info))
    return out


def _resolve_primitive(entry: dict, table: dict, file: str, k: int):
    where = f"{file!r} primitive {k}"
    if type(entry) is not dict:
        _bad(f"{where}: an entry must be an object, got {_short(entry)}.")
    pid = _field(entry, "id", str, where)
    dist, plugin, names = entry.get("distribution"), entry.get("plugin"), entry.get("params")
    for key, v in (("distribution", dist), ("plugin", plugin),
                   ("distribution_version", entry.get("distribution_version")),
                   ("class", entry.get("class"))):
        if v is not None and type(v) is not str:
            _bad(f"{where}: field {key!r} must be a string, got {_short(v)}.")
    if names is not None and (type(names) is not list or any(type(n) is not str for n in names)):
        _bad(f"{where}: field 'params' must be a list of names, got {_short(names)}.")
    found = [c for c, info in table.get(pid, ()) if plugin is None or info.name == plugin] or \
        [c for c, _ in table.get(pid, ())]
    if not found:
        failed = [p for p in _registry.plugins.values()
                  if p.distribution == dist and p.error is not None]
        note = "".join(f" Its plugin {p.name!r} failed to load: {type(p.error).__name__}: "
                       f"{p.error}." for p in failed)
        raise PrimitiveNotInstalledError(
            f"[import_function] {file!r} uses primitive {entry.get('class', pid)!r} ({pid!r}), "
            f"registered at export time by plugin {plugin!r} of distribution {dist!r} "
            f"{entry.get('distribution_version', '')}, which is not installed here: install "
            f"{dist!r} to import this function.{note}")
    cls = found[0]
    if names is not None and names != list(cls._param_names):
        raise PrimitiveNotInstalledError(
            f"[import_function] {file!r} records primitive {pid!r} with parameters "
            f"{tuple(names)} (distribution version {entry.get('distribution_version')}); "
            f"the installed one ({_registry.primitives[cls].version}) has "
            f"{cls._param_names}.")
    missing = cls.undeclared_params()
    if missing:
        _bad(f"{where}: the installed primitive {_who(cls)} does not declare the types of its "
             f"parameters {list(missing)}, so the file's values for them cannot be checked; "
             f"its plugin must annotate them (see docs/writing-a-custom-primitive.md).")
    try:
        cls.param_validators()
    except ParameterDeclarationError as e:
        _bad(f"{where}: the parameter declarations of {_who(cls)} are broken: {e}")
    return cls


class _Plan:
    """One imported trace: its signature and the graph to rebuild, in compact form."""

    __slots__ = ("signature", "nodes", "outputs", "n_args", "_prims")

    def __init__(self, signature, nodes, outputs):
        self.signature = signature
        self.nodes = nodes  # [(cls, params, input refs, shapes, dtypes)]
        self.outputs = outputs
        self.n_args = len(signature.args) + len(signature.kwargs)
        self._prims: dict = {}

    def prims(self, stream) -> list:
        ps = self._prims.get(stream)
        if ps is None:
            ps = self._prims[stream] = [_build(n[0], stream, n[1]) for n in self.nodes]
        return ps


def _placeholder(stream, shape, dtype):
    """An array of ``shape`` and ``dtype`` that cannot be evaluated: what a node's rules
    see of an input while the file is checked."""
    return lazy(shape, dtype, ExportInput(stream, -1, shape), ())


def _infer_dtypes(prim, inputs):
    """The output dtypes ``prim`` gives for ``inputs``: its ``output_dtypes`` rule, else its
    codegen expression's dtypes (element-wise primitives), else None (no rule: the
    scheduler checks the kernel's outputs against the graph when the node runs)."""
    got = prim.output_dtypes(inputs)
    if got is not None:
        return list(got)
    fn = getattr(prim, "to_expression", None)
    if fn is None:
        return None
    try:
        e = fn(tuple(ir.input(k, x._dtype) for k, x in enumerate(inputs)))
    except ir.IRError:
        return None
    if e is None:
        return None
    es = e if type(e) is tuple else (e,)
    return [x.dtype for x in es] if all(isinstance(x, ir.Expr) for x in es) else None


def _check_node(where, cls, params, ins, shapes, dtypes, stream):
    """Build the node's primitive and infer its outputs from ``ins`` (placeholders of the
    declared inputs); any disagreement with the file is a FunctionFileError at ``where``."""
    if cls.arity is not None and len(ins) != cls.arity:
        _bad(f"{where}: {cls.name} takes {cls.arity} inputs, the file gives it {len(ins)}.")
    try:
        cls.check_params(params, ins)
    except ArgumentError as e:
        _bad(f"{where}: {e}")
    try:
        prim = _build(cls, stream, params)
    except Exception as e:
        _bad(f"{where}: the primitive cannot be built from the file's parameters: "
             f"{type(e).__name__}: {e}")
    try:
        got = [tuple(s) for s in prim.output_shapes(ins)]
        if any(type(d) is not int for s in got for d in s):
            raise TypeError(f"output_shapes gave {got}, not tuples of ints")
        got_dtypes = _infer_dtypes(prim, ins)
    except Exception as e:
        ins_text = ", ".join(f"{x._shape} {x._dtype.name}" for x in ins)
        _bad(f"{where}: its parameters do not fit its inputs ({ins_text}): "
             f"{type(e).__name__}: {e}")
    if got != shapes:
        _bad(f"{where}: the file declares output shapes {shapes}; the primitive infers "
             f"{got} from its inputs ({', '.join(str(x._shape) for x in ins)}).")
    if got_dtypes is not None and got_dtypes != dtypes:
        _bad(f"{where}: the file declares output dtypes {[d.name for d in dtypes]}; the "
             f"primitive infers {[d.name for d in got_dtypes]} from its inputs "
             f"({', '.join(x._dtype.name for x in ins)}).")
    return prim


def _decode_plan(t, classes, constants, file, n_trace) -> _Plan:
    where = f"{file!r} trace {n_trace}"
    if type(t) is not dict:
        _bad(f"{where}: a trace must be an object, got {_short(t)}.")

    def spec(s, what):
        if type(s) is not dict:
            _bad(f"{where}: {what} must be an object, got {_short(s)}.")
        return (_shape(_field(s, "shape", list, f"{where} {what}"), f"{where} {what}"),
                _dtype_named(s.get("dtype"), f"{where} {what}"))

    args = [spec(s, f"input {i}") for i, s in enumerate(_field(t, "args", list, where))]
    kwargs = []
    for i, s in enumerate(_field(t, "kwargs", list, where)):
        kwargs.append((_field(s, "name", str, f"{where} keyword input {i}"),
                       spec(s, f"keyword input {i}")))
    if len({k for k, _ in kwargs}) != len(kwargs):
        _bad(f"{where}: a keyword input is listed twice.")
    stream = to_stream(None)
    # What each reference stands for while the file is checked: placeholders of the
    # inputs and of the node outputs as declared (once checked), and the constants.
    values = ([_placeholder(stream, sh, d) for sh, d in args + [s for _, s in kwargs]],
              constants, [])
    nodes, prims = [], []

    def ref(r, what):
        ok = type(r) is list and len(r) in (2, 3) and all(type(x) is int and x >= 0
                                                          for x in r[1:])
        if ok and r[0] == "a" and len(r) == 2 and r[1] < len(values[0]):
            return (0, r[1], 0)
        if ok and r[0] == "c" and len(r) == 2 and r[1] < len(constants):
            return (1, r[1], 0)
        if ok and r[0] == "n" and len(r) == 3 and r[1] < len(nodes) and \
                r[2] < len(values[2][r[1]]):
            return (2, r[1], r[2])
        _bad(f"{where}: {what}: invalid reference {_short(r)} (an input, a constant or an "
             f"output of an earlier node: inputs must come before their users).")

    for i, node in enumerate(_field(t, "nodes", list, where)):
        at = f"{where} node {i}"
        pidx = _field(node, "primitive", int, at)
        if not 0 <= pidx < len(classes):
            _bad(f"{at}: primitive index {pidx} out of range (the file lists "
                 f"{len(classes)}).")
        cls = classes[pidx]
        at = f"{at} ({cls.name})"
        encoded = _field(node, "params", list, at)
        if len(encoded) != len(cls._param_names):
            _bad(f"{at}: {cls.name} needs {len(cls._param_names)} parameters "
                 f"{cls._param_names}, the file has {len(encoded)}.")
        params = [decode_value(j, f"{at}: parameter {n!r}")
                  for n, j in zip(cls._param_names, encoded)]
        ins = tuple(ref(r, f"node {i} input {k}")
                    for k, r in enumerate(_field(node, "inputs", list, at)))
        outs = _field(node, "outputs", list, at)
        if not outs:
            _bad(f"{at}: a node without outputs.")
        specs = [spec(o, f"node {i} output {k}") for k, o in enumerate(outs)]
        shapes, dtypes = [s for s, _ in specs], [d for _, d in specs]
        arrays = tuple(values[k][j] if k < 2 else values[2][j][m] for k, j, m in ins)
        prims.append(_check_node(at, cls, params, arrays, shapes, dtypes, stream))
        nodes.append((cls, params, ins, shapes, dtypes))
        values[2].append([_placeholder(stream, sh, d) for sh, d in specs])
    outputs = [ref(r, f"output {k}") for k, r in enumerate(_field(t, "outputs", list, where))]
    plan = _Plan(_Signature(args, kwargs), nodes, outputs)
    plan._prims[stream] = prims
    return plan


class ImportedFunction:
    """A function read from a file by :func:`import_function`.

    Call it with arrays of one of the exported signatures, as ``f(*args, **kwargs)``
    or ``f(args_tuple, kwargs_dict)``; it returns a tuple of lazy arrays.
    """

    def __init__(self, file, plans, constants, shapeless, metadata, lazyx_version):
        self.file = file
        self._plans = plans
        self._constants = constants
        self.shapeless = shapeless
        self.metadata = metadata
        self.lazyx_version = lazyx_version

    def __repr__(self) -> str:
        return (f"<lazyx imported function from {self.file!r}: {len(self._plans)} "
                f"trace(s){', shapeless' if self.shapeless else ''}>")

    def __call__(self, *args, **kwargs) -> tuple:
        pos, kw = _split_inputs(args, kwargs, "import_function::call")
        shapeless = self.shapeless
        for plan in self._plans:
            if plan.signature.matches(pos, kw, shapeless):
                break
        else:
            given = _Signature([(x._shape, x._dtype) for x in pos],
                               [(k, (x._shape, x._dtype)) for k, x in kw.items()])
            listed = "\n".join(f" {i + 1}. {p.signature.describe()}"
                               for i, p in enumerate(self._plans))
            sizes = " (any sizes of these numbers of dimensions)" if shapeless else ""
            raise ArgumentError(
                f"[import_function::call] No imported function found which matches the given "
                f"positional and keyword arguments. Possible functions include{sizes}:\n"
                f"{listed}\n\nCalled with {len(pos)} positional "
                f"inputs and {len(kw)} keyword inputs:\n"
                f"{_describe_signature(given.args, given.kwargs)}")
        values = (pos + [kw[k] for k, _ in plan.signature.kwargs], self._constants, [])
        nodes_out = values[2]
        stream = to_stream(None)
        for (cls, _, ins, shapes, dtypes), prim in zip(plan.nodes, plan.prims(stream)):
            inputs = tuple(values[k][i] if k < 2 else values[2][i][j] for k, i, j in ins)
            if shapeless:
                shapes = [tuple(int(d) for d in s) for s in prim.output_shapes(inputs)]
            if len(dtypes) == 1:
                nodes_out.append((lazy(shapes[0], dtypes[0], prim, inputs),))
            else:
                nodes_out.append(lazy_multi(shapes, dtypes, prim, inputs))
        return tuple(values[k][i] if k < 2 else values[2][i][j] for k, i, j in plan.outputs)


def import_function(file: str, return_metadata: bool = False):
    """Import a function from a file written by :func:`export_function` or :func:`exporter`.

    The imported function can be called either with ``*args`` and ``**kwargs``
    or with a tuple of arrays and/or dictionary of string keys with array
    values, of one of the exported signatures (any sizes of the same number of
    dimensions when exported with ``shapeless=True``). Imported functions always
    return a tuple of (lazy) arrays. Reading the file never runs code from it;
    the plugins that registered the function's primitives must be installed.

    Args:
        file (str): The file path to import the function from.
        return_metadata (bool, optional): If ``True`` also return the metadata
          string saved with the function. Default: ``False``.

    Returns:
        Callable or tuple: The imported function, or ``(function, metadata)``
        when ``return_metadata`` is ``True``.

    Example:
        >>> fn = mx.import_function("fun.lxfn")
        >>> out = fn(a, b, x=x, y=y)[0]
        >>> out = fn((a, b), {"x": x, "y": y})[0]
    """
    file = os.fsdecode(file)
    header, payload = _read(file)
    try:
        fn = _decode(header, payload, file)
    except FunctionFileError:
        raise
    except RecursionError:
        _bad(f"{file!r} has a header nested too deeply.")
    except Exception as e:
        # Every check above names where the file is wrong; this keeps any failure they
        # did not foresee a FunctionFileError too, never a bare TypeError or KeyError.
        _bad(f"{file!r} cannot be read: {type(e).__name__}: {e}")
    if return_metadata:
        return fn, fn.metadata if fn.metadata is not None else ""
    return fn


def _decode(header: dict, payload, file: str) -> ImportedFunction:
    table = _classes_by_identity()
    classes = [_resolve_primitive(e, table, file, k)
               for k, e in enumerate(_field(header, "primitives", list, f"{file!r}"))]
    constants = []
    for c in _field(header, "constants", list, f"{file!r}"):
        where = f"{file!r} constant {len(constants)}"
        if type(c) is not dict:
            _bad(f"{where}: an entry must be an object, got {_short(c)}.")
        d = _dtype_named(c.get("dtype"), where)
        shape = _shape(_field(c, "shape", list, where), where)
        off, nb = _field(c, "offset", int, where), _field(c, "nbytes", int, where)
        if nb != math.prod(shape) * d.size or off < 0 or off + nb > len(payload):
            _bad(f"{where}: {nb} bytes at offset {off} do not hold shape {shape} of "
                 f"{d.name} within the {len(payload)}-byte payload.")
        data = np.frombuffer(payload[off:off + nb], dtype=d.np).reshape(shape)
        constants.append(from_buffer(data, d))
    shapeless = header.get("shapeless")
    metadata = header.get("metadata")
    if type(shapeless) is not bool or (metadata is not None and type(metadata) is not str):
        _bad(f"{file!r}: malformed 'shapeless' or 'metadata' field.")
    plans = [_decode_plan(t, classes, constants, file, k)
             for k, t in enumerate(_field(header, "traces", list, f"{file!r}"))]
    if shapeless:
        fixed = [c for c in classes if not getattr(c, "shapeless", True)]
        if fixed:
            _bad(f"{file!r} is marked shapeless but uses {_who(fixed[0])}, whose parameters "
                 f"fix its output shape here.")
    return ImportedFunction(file, plans, constants, shapeless, metadata,
                            header.get("lazyx_version"))
