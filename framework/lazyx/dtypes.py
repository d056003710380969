"""Data types, MLX's promotion rules and the dtype category tree.

A :class:`Dtype` is a small immutable object; the module-level instances
(``float32``, ``bfloat16``, ...) are the only ones that exist, so dtypes are
compared with ``is``. Each carries the NumPy dtype that the CPU backend stores
it as (``bfloat16`` through ml_dtypes, imported the first time a bfloat16's NumPy
dtype is asked for: importing ml_dtypes costs several times importing NumPy).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ArgumentError, DtypeError

__all__ = [
    "Dtype", "DtypeCategory", "bool_", "uint8", "uint16", "uint32", "uint64",
    "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "complex64", "generic", "number", "integer", "signedinteger", "unsignedinteger",
    "inexact", "floating", "complexfloating", "issubdtype", "finfo", "iinfo",
    "promote_types", "result_type", "can_cast", "from_numpy", "to_dtype", "isdtype",
]


class DtypeCategory:
    """A node of the dtype category tree (``floating``, ``integer``, ...)."""

    __slots__ = ("name", "parent")

    def __init__(self, name: str, parent: "DtypeCategory | None"):
        self.name = name
        self.parent = parent

    def __repr__(self) -> str:
        return f"DtypeCategory.{self.name}"  # MLX's text

    def is_within(self, other: "DtypeCategory") -> bool:
        node = self
        while node is not None:
            if node is other:
                return True
            node = node.parent
        return False


generic = DtypeCategory("generic", None)
number = DtypeCategory("number", generic)
integer = DtypeCategory("integer", number)
signedinteger = DtypeCategory("signedinteger", integer)
unsignedinteger = DtypeCategory("unsignedinteger", integer)
inexact = DtypeCategory("inexact", number)
floating = DtypeCategory("floating", inexact)
complexfloating = DtypeCategory("complexfloating", inexact)
# bool sits directly under generic, as in MLX.
_bool_category = DtypeCategory("bool_", generic)


class Dtype:
    """An array element type. Compare with ``is`` or ``==``.

    Attributes:
        name: MLX's name (``"float32"``).
        size: bytes per element.
        np: the NumPy dtype used for CPU buffers.
        category: the most specific :class:`DtypeCategory`.
        kind: ``"b"``, ``"u"``, ``"i"``, ``"f"`` or ``"c"``.
    """

    __slots__ = ("name", "size", "np", "category", "kind", "index")

    def __init__(self, name, np_dtype, category, kind, index, size=None):
        self.name = name
        if np_dtype is not None:
            self.np = np.dtype(np_dtype)
        self.size = self.np.itemsize if size is None else size
        self.category = category
        self.kind = kind
        self.index = index

    def __repr__(self) -> str:
        return f"lazyx.core.{self.name}"

    def __reduce__(self):
        return (to_dtype, (self.name,))

    @property
    def itemsize(self) -> int:
        return self.size


class _DeferredDtype(Dtype):
    """``bfloat16`` until its NumPy dtype (ml_dtypes, a measurable import) is first
    needed: the unset ``np`` slot falls through to ``__getattr__``, which loads it and
    turns the instance into a plain :class:`Dtype`. The hook lives on this subclass
    only, since a ``__getattr__`` on ``Dtype`` itself would slow every dtype attribute
    read (the scheduler reads ``dtype.np`` once per node)."""

    __slots__ = ()

    def __getattr__(self, attr):
        if attr == "np":
            return _load_bfloat16()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")


_ALL: list[Dtype] = []


def _make(name, np_dtype, category, kind, size=None):
    d = (Dtype if np_dtype is not None else _DeferredDtype)(name, np_dtype, category, kind, len(_ALL), size)
    _ALL.append(d)
    return d


# MLX names the bool dtype ``bool`` (``str(mx.bool_)`` is ``mlx.core.bool``).
bool_ = _make("bool", np.bool_, _bool_category, "b")
uint8 = _make("uint8", np.uint8, unsignedinteger, "u")
uint16 = _make("uint16", np.uint16, unsignedinteger, "u")
uint32 = _make("uint32", np.uint32, unsignedinteger, "u")
uint64 = _make("uint64", np.uint64, unsignedinteger, "u")
int8 = _make("int8", np.int8, signedinteger, "i")
int16 = _make("int16", np.int16, signedinteger, "i")
int32 = _make("int32", np.int32, signedinteger, "i")
int64 = _make("int64", np.int64, signedinteger, "i")
float16 = _make("float16", np.float16, floating, "f")
float32 = _make("float32", np.float32, floating, "f")
float64 = _make("float64", np.float64, floating, "f")
bfloat16 = _make("bfloat16", None, floating, "f", size=2)  # NumPy dtype: _load_bfloat16
complex64 = _make("complex64", np.complex64, complexfloating, "c")

ALL_DTYPES: tuple[Dtype, ...] = tuple(_ALL)

# MLX's promotion table (rows and columns in the order of ALL_DTYPES above).
_S = {"b": bool_, "u8": uint8, "u16": uint16, "u32": uint32, "u64": uint64,
      "i8": int8, "i16": int16, "i32": int32, "i64": int64, "f16": float16,
      "f32": float32, "f64": float64, "bf16": bfloat16, "c64": complex64}
_TABLE_TEXT = """
b   u8  u16 u32 u64 i8  i16 i32 i64 f16 f32 f64 bf16 c64
u8  u8  u16 u32 u64 i16 i16 i32 i64 f16 f32 f64 bf16 c64
u16 u16 u16 u32 u64 i32 i32 i32 i64 f16 f32 f64 bf16 c64
u32 u32 u32 u32 u64 i64 i64 i64 i64 f16 f32 f64 bf16 c64
u64 u64 u64 u64 u64 f32 f32 f32 f32 f16 f32 f64 bf16 c64
i8  i16 i32 i64 f32 i8  i16 i32 i64 f16 f32 f64 bf16 c64
i16 i16 i32 i64 f32 i16 i16 i32 i64 f16 f32 f64 bf16 c64
i32 i32 i32 i64 f32 i32 i32 i32 i64 f16 f32 f64 bf16 c64
i64 i64 i64 i64 f32 i64 i64 i64 i64 f16 f32 f64 bf16 c64
f16 f16 f16 f16 f16 f16 f16 f16 f16 f16 f32 f64 f32 c64
f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f64 f32 c64
f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 c64
bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 f32 f32 f64 bf16 c64
c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64 c64
"""
_PROMOTE: dict[tuple[Dtype, Dtype], Dtype] = {}
for _a, _row in zip(ALL_DTYPES, _TABLE_TEXT.split("\n")[1:-1]):
    for _b, _r in zip(ALL_DTYPES, _row.split()):
        _PROMOTE[(_a, _b)] = _S[_r]

_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME["bool_"] = bool_
_BY_NUMPY = {d.np: d for d in ALL_DTYPES if d is not bfloat16}


def _load_bfloat16() -> np.dtype:
    """Import ml_dtypes (an optional-cost dependency: it loads on first use) and give
    ``bfloat16`` its NumPy dtype."""
    import ml_dtypes
    dt = bfloat16.np = np.dtype(ml_dtypes.bfloat16)
    bfloat16.__class__ = Dtype  # loaded: no more hook (same layout, so allowed)
    _BY_NUMPY[dt] = bfloat16
    return dt

_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
# The dtype a Python scalar takes when it meets no array.
_SCALAR_DEFAULT = {bool: bool_, int: int32, float: float32, complex: complex64}
_SCALAR_RANK = {bool: 0, int: 1, float: 2, complex: 3}


def promote_types(a: Dtype, b: Dtype) -> Dtype:
    """The dtype of a binary operation between arrays of dtypes ``a`` and ``b``."""
    return _PROMOTE[(a, b)]


def weak_scalar_dtype(dtype: Dtype, scalar_type: type) -> Dtype:
    """The result dtype of ``array(dtype) <op> python_scalar``.

    Python scalars are weakly typed: they adopt the array's dtype unless they
    are of a higher kind (a float meeting an integer array), in which case the
    scalar's default dtype is promoted with the array's.
    """
    rank = _SCALAR_RANK[scalar_type]
    if rank <= _KIND_RANK[dtype.kind] and not (rank == 1 and dtype.kind == "b"):
        return dtype
    return _PROMOTE[(dtype, _SCALAR_DEFAULT[scalar_type])]


def _python_scalar_type(value) -> type:
    for t in (bool, int, float, complex):
        if isinstance(value, t):
            return t
    raise DtypeError(f"{type(value).__name__} is not a Python scalar.")


def _int_dtype(value: int) -> Dtype:
    # A bare Python int is int32 when it fits, else int64 (as in MLX).
    if -2**31 <= value < 2**31:
        return int32
    if -2**63 <= value < 2**63:
        return int64
    raise DtypeError(f"The Python int {value} does not fit in int64.")


def scalar_dtype(value) -> Dtype:
    """The dtype MLX gives a bare Python scalar."""
    t = type(value)
    if t is int:
        return _int_dtype(value)
    d = _SCALAR_DEFAULT.get(t)
    if d is not None:
        return d
    for base in (bool, int, float, complex):
        if isinstance(value, base):
            return _SCALAR_DEFAULT[base]
    if isinstance(value, np.generic):
        return from_numpy(value.dtype)
    raise DtypeError(f"Cannot infer a dtype for a value of type {t.__name__}.")


_NUMPY_NAMES: dict = {}


def numpy_name(np_dtype: np.dtype) -> str:
    """``np_dtype.name``, cached per dtype: NumPy builds the name anew on every access
    (~3 µs), and kernels that pick their loop by dtype name look it up on every call."""
    n = _NUMPY_NAMES.get(np_dtype)
    if n is None:
        n = _NUMPY_NAMES[np_dtype] = np_dtype.name
    return n


def from_numpy(np_dtype) -> Dtype:
    """The lazyx dtype stored as NumPy dtype ``np_dtype``."""
    d = _BY_NUMPY.get(np_dtype)
    if d is None:
        try:
            d = _BY_NUMPY.get(np.dtype(np_dtype))
        except TypeError:
            d = None
        if d is None and getattr(np_dtype, "name", np_dtype) == "bfloat16" \
                and bfloat16 not in _BY_NUMPY.values():
            _load_bfloat16()  # an ml_dtypes array met before lazyx needed bfloat16
            return from_numpy(np_dtype)
        if d is None:
            raise DtypeError(f"NumPy dtype {np_dtype!r} has no lazyx equivalent.")
    return d


def to_dtype(value) -> Dtype:
    """Accept a :class:`Dtype`, a dtype name or a NumPy dtype; return the Dtype."""
    if isinstance(value, Dtype):
        return value
    if isinstance(value, str):
        d = _BY_NAME.get(value)
        if d is None:
            raise DtypeError(f"Unknown dtype name {value!r}.")
        return d
    if value in _SCALAR_DEFAULT:
        return _SCALAR_DEFAULT[value]
    try:
        return from_numpy(np.dtype(value))
    except TypeError:
        raise DtypeError(f"{value!r} is not a dtype.") from None


def issubdtype(a, b) -> bool:
    """Whether dtype or category ``a`` lies within dtype or category ``b``.

    Example:
        >>> issubdtype(float16, floating)
        True
    """
    if type(a) is not DtypeCategory:
        a = to_dtype(a)
    if type(b) is not DtypeCategory:
        b = to_dtype(b)
    if isinstance(a, Dtype) and isinstance(b, Dtype):
        return a is b
    if isinstance(b, Dtype):
        return False
    cat = a.category if isinstance(a, Dtype) else a
    return cat.is_within(b)


def result_type(*arrays_or_dtypes) -> Dtype:
    """The dtype of combining ``arrays_or_dtypes`` (arrays or dtypes) by MLX's promotion
    rules: what an element-wise binary operation between them gives.

    Example:
        >>> result_type(int32, float16)
        lazyx.core.float16
    """
    if not arrays_or_dtypes:
        raise DtypeError("[result_type] At least one array or dtype is required.")
    for x in arrays_or_dtypes:
        if not isinstance(x, Dtype) and not _is_array(x):
            raise DtypeError(f"[result_type] Inputs must be arrays or dtypes, got "
                             f"{type(x).__name__}.")
    return _result_type(*arrays_or_dtypes)


def _is_array(x) -> bool:
    # An array is anything whose ``dtype`` is a lazyx Dtype (this module sits below array.py).
    return not isinstance(x, Dtype) and isinstance(getattr(x, "dtype", None), Dtype)


def _result_type(*args) -> Dtype:
    """:func:`result_type` that also takes Python scalars (weakly typed) and dtype names:
    the rule the op packs use for their operands."""
    strong = None
    weak = []
    for x in args:
        if isinstance(x, Dtype):
            d = x
        elif hasattr(x, "dtype") and not isinstance(x, np.generic):
            d = to_dtype(x.dtype)
        elif isinstance(x, (bool, int, float, complex)):
            weak.append(_python_scalar_type(x))
            continue
        else:
            d = to_dtype(x)
        strong = d if strong is None else _PROMOTE[(strong, d)]
    if strong is None:
        if not weak:
            raise DtypeError("result_type needs at least one argument.")
        return _SCALAR_DEFAULT[max(weak, key=_SCALAR_RANK.__getitem__)]
    for t in weak:
        strong = weak_scalar_dtype(strong, t)
    return strong


def can_cast(from_, to) -> bool:
    """Whether values of ``from_`` (an array or a dtype) convert to dtype ``to`` without
    loss: ``to`` is the promotion of the two, as in MLX."""
    if isinstance(from_, (bool, int, float, complex)):
        raise DtypeError("[can_cast] `from_` must be an array or a dtype.")
    a = from_.dtype if _is_array(from_) else to_dtype(from_)
    b = to_dtype(to)
    return _PROMOTE[(a, b)] is b and not (a.kind == "c" and b.kind != "c")


class _Limits:
    __slots__ = ("min", "max", "eps", "tiny", "resolution")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


_BFLOAT16_INFO = _Limits(min=-(2 - 2**-7) * 2.0**127, max=(2 - 2**-7) * 2.0**127, eps=2.0**-7,
                         tiny=2.0**-126, resolution=0.010009765625)


def _info_dtype(dtype, op: str) -> Dtype:
    # MLX takes a dtype only; an array is refused (NumPy's finfo(array) reads its dtype).
    if _is_array(dtype):
        raise DtypeError(f"[{op}] Expected a dtype, got an array: pass its `.dtype`.")
    return to_dtype(dtype)


class finfo:
    """Machine limits of a floating point dtype: ``min``, ``max``, ``eps``, ``tiny``, ``dtype``."""

    def __init__(self, dtype):
        d = _info_dtype(dtype, "finfo")
        if d.kind not in "fc":
            raise DtypeError(f"[finfo] dtype {d.name} is not inexact.")
        # A complex dtype's limits are those of its real part, as in MLX and NumPy.
        d = float32 if d is complex64 else d
        self.dtype = d
        # bfloat16's limits follow from its format (8 exponent bits, 7 mantissa bits),
        # so asking for them does not import ml_dtypes.
        info = _BFLOAT16_INFO if d is bfloat16 else np.finfo(d.np)
        self.min = float(info.min)
        self.max = float(info.max)
        self.eps = float(info.eps)
        self.tiny = float(info.tiny)
        self.smallest_normal = self.tiny
        self.resolution = float(info.resolution)
        self.bits = d.size * 8

    def __repr__(self) -> str:
        # MLX's text: C++'s default formatting of a double (six significant digits).
        return f"finfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype.name})"


class iinfo:
    """Limits of an integer dtype: ``min``, ``max``, ``bits``, ``dtype``."""

    def __init__(self, dtype):
        d = _info_dtype(dtype, "iinfo")
        if d.kind not in "ui":
            raise DtypeError(f"[iinfo] Only integer types supported but {d.name} was provided.")
        self.dtype = d
        info = np.iinfo(d.np)
        self.min = int(info.min)
        self.max = int(info.max)
        self.bits = d.size * 8

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype.name})"


pi = math.pi
e = math.e
euler_gamma = 0.5772156649015329
inf = math.inf
nan = math.nan
newaxis = None


#: The kinds of the Python array API that :func:`isdtype` names, as dtype kinds.
_ISDTYPE_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u",
                  "integral": "iu", "real floating": "f", "complex floating": "c",
                  "numeric": "iufc"}


def isdtype(dtype: Dtype, kind) -> bool:
    """Test whether a dtype belongs to one or more data type kinds.

    Args:
        dtype (Dtype): The dtype to test.
        kind (Dtype, str, or tuple): A dtype, a kind string, or a tuple of dtypes and
            kind strings. Supported kind strings are ``"bool"``, ``"signed integer"``,
            ``"unsigned integer"``, ``"integral"``, ``"real floating"``,
            ``"complex floating"`` and ``"numeric"``.

    Returns:
        bool: ``True`` if ``dtype`` matches any of the given kinds.

    Example:
        >>> isdtype(bfloat16, "real floating")
        True
    """
    if not isinstance(dtype, Dtype):
        raise DtypeError(f"[isdtype] dtype must be a Dtype, got {dtype!r}.")
    for k in kind if isinstance(kind, tuple) else (kind,):
        if isinstance(k, Dtype):
            if k is dtype:
                return True
        elif isinstance(k, str):
            kinds = _ISDTYPE_KINDS.get(k)
            if kinds is None:
                raise ArgumentError(f"[isdtype] Unknown data type kind: {k!r}; expected one "
                                    f"of {', '.join(map(repr, _ISDTYPE_KINDS))}.")
            if dtype.kind in kinds:
                return True
        else:
            raise ArgumentError(f"[isdtype] `kind` must be a dtype, a string, or a tuple of "
                                f"dtypes and strings, got {k!r}.")
    return False
