"""The lazy :class:`array`.

An array holds its shape and dtype and either its data (a backend buffer: a
NumPy array on the CPU) or the node that will produce it: a primitive, the
input arrays and, for multi-output primitives, its siblings. Evaluation fills
``_data`` and detaches the node so that intermediates are freed.

Operators and most methods (``a + b``, ``a.sum()``, ``a[1:]``) are installed
on the class by the op packs through the ``array.<name>`` entries of their
``lazyx_ops`` hook; this module holds only what the core itself needs.
"""

from __future__ import annotations

import gc as _gc
import sys

import numpy as np

from . import backend as _backend
from . import dtypes as _dt
from . import ops
from .errors import ArgumentError, DtypeError, ShapeError
from .printoptions import float_format as _float_format

__all__ = ["array", "lazy", "lazy_multi", "from_buffer", "ArrayIterator", "ArrayLike"]

_ndarray = np.ndarray
_np_asarray = np.asarray


class array:
    """An N-dimensional lazy array.

    Args:
        val: a Python scalar, a (nested) list or tuple, a NumPy array or another array.
        dtype: the element type; inferred as MLX does when omitted (Python ints become
            ``int32``, floats ``float32``; NumPy ``float64`` becomes ``float32``).

    Example:
        >>> a = array([[1, 2], [3, 4]])
        >>> (a * 2).tolist()
        [[2, 4], [6, 8]]
    """

    __slots__ = ("_shape", "_dtype", "_data", "_prim", "_inputs", "_siblings", "__weakref__")

    def __init__(self, val, dtype=None):
        if dtype is not None:
            dtype = _dt.to_dtype(dtype)
        if isinstance(val, array):
            if dtype is None or dtype is val._dtype:
                _become(self, val)
            else:
                _become(self, ops.astype(val, dtype))
            return
        data = _host_copy(val, dtype)
        self._shape = data.shape
        self._dtype = _dt.from_numpy(data.dtype)
        self._data = data
        self._prim = None
        self._inputs = None
        self._siblings = None

    # -- metadata ---------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The array's dimensions, a tuple."""
        return self._shape

    @property
    def dtype(self) -> _dt.Dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self._dtype.size

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.size

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array.")
        return self._shape[0]

    # -- evaluation and export ------------------------------------------
    def _numpy(self) -> np.ndarray:
        """The evaluated buffer as a host NumPy array (evaluates when needed)."""
        if self._data is None:
            evaluate((self,))
        d = self._data
        if type(d) is not _ndarray:
            d = _backend.to_host(d)
        elif _backend.host_fences:  # a device may still be writing it (unified memory)
            _backend.host_fence(d)
        return d

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(a)``, ``np.array(a, copy=False)``: the array's own memory, writable
        (as MLX): a write changes this array and the unevaluated graphs that read it (see
        :mod:`lazyx.interop`). Read-only memory (constants, broadcasts, host copies of
        GPU buffers) stays read-only; ``copy=False`` where a copy is needed is a ValueError."""
        d = self._numpy()
        converts = dtype is not None and np.dtype(dtype) != d.dtype
        if copy is False and (converts or d is not self._data):
            raise ValueError(f"[__array__] Cannot export a {self._dtype.name} array "
                             + (f"as {np.dtype(dtype).name} " if converts else "from the GPU ")
                             + "without a copy.")
        if converts:
            return d.astype(dtype)
        if copy:
            return d.copy()
        # A view (never the buffer object itself: reshaping it in place would change this
        # array's shape); a host copy of a device buffer is read-only: writes would be lost.
        v = d.view()
        if d is not self._data:
            v.flags.writeable = False
        return v

    def item(self):
        """The value of a one-element array as a Python scalar."""
        if self.size != 1:
            raise ShapeError(f"item() needs an array of one element, got shape {self._shape}.")
        return self._numpy().reshape(()).item() if self._dtype is not _dt.bfloat16 else \
            float(self._numpy().reshape(()))

    def tolist(self):
        """The array as nested Python lists of Python scalars (a scalar for 0-d arrays)."""
        d = self._numpy()
        if self._dtype is _dt.bfloat16 or self._dtype is _dt.float16:
            d = d.astype(np.float32)
        return d.tolist()

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if self._dtype.kind not in "uib":
            raise TypeError(f"Only integer arrays can be used as an index, got {self._dtype.name}.")
        return int(self.item())

    def __iter__(self):
        if not self._shape:
            raise TypeError("Iteration over a 0-d array.")
        return ArrayIterator(self)

    def __repr__(self) -> str:
        return _format(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        # As MLX: a 0-d array formats as its value (f"{loss:.3f}"); others only as str().
        if not self._shape:
            return format(self.item(), spec)
        if spec:
            raise TypeError("unsupported format string passed to array.__format__")
        return _format(self)

    def __hash__(self):
        return id(self)

    def __array_namespace__(self, api_version: str | None = None):
        """Returns an object that has all the array API functions on it: ``lazyx.core``
        (see the `Python array API <https://data-apis.org/array-api/latest/>`_).

        Args:
            api_version (str, optional): must be None, as in MLX 0.32.
        """
        if api_version is not None:
            raise ArgumentError(f"[__array_namespace__] Explicitly specifying api_version "
                                f"is not yet implemented (got {api_version!r}); pass None.")
        return sys.modules["lazyx.core"]  # the roof, loaded whenever an array exists

    # The op packs install the operators; == without them would compare identity.
    def __eq__(self, other):  # replaced by the element-wise pack
        raise NotImplementedError("lazyx.core is not loaded: import lazyx.core first.")

    def __getstate__(self):
        return {"data": np.array(self._numpy())}

    def __setstate__(self, state):
        array.__init__(self, state["data"])

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


_new = array.__new__


class ArrayIterator:
    """A helper object to iterate over the 1st dimension of an array
    (what ``iter(a)`` returns)."""

    __slots__ = ("_array", "_i")

    def __init__(self, a: array):
        self._array = a
        self._i = 0

    def __iter__(self):
        return self

    def __next__(self) -> array:
        a = self._array
        if self._i >= a._shape[0]:
            raise StopIteration
        self._i += 1
        return a[self._i - 1]


class ArrayLike:
    """Any Python object which has an ``__mlx_array__`` method that returns an
    :obj:`array` (MLX's protocol, kept by name so MLX code runs unchanged): the array
    constructor accepts such objects.

    Args:
        obj: the object to wrap; ``ArrayLike(obj).__mlx_array__()`` is its array.
    """

    __slots__ = ("obj",)

    def __init__(self, obj, /):
        self.obj = obj

    def __mlx_array__(self) -> array:
        return self.obj.__mlx_array__()


def evaluate(arrays) -> None:
    """Evaluate ``arrays`` (a tuple): the scheduler's ``eval_arrays``, which
    :mod:`lazyx.scheduler` installs here when it loads (it sits above this module:
    it imports :class:`array`, so this module cannot import it)."""
    raise RuntimeError("lazyx.scheduler is not loaded: import lazyx.core first.")


def lazy(shape: tuple, dtype: _dt.Dtype, prim, inputs: tuple) -> array:
    """A new unevaluated array: output of ``prim`` applied to ``inputs``.

    This is how op functions add a node to the graph; ``shape`` and ``dtype`` are
    what the op function computed (the shape rule and MLX's dtype rules).
    """
    a = _new(array)
    a._shape = shape
    a._dtype = dtype
    a._data = None
    a._prim = prim
    a._inputs = inputs
    a._siblings = None
    return a


#: The Python version of :func:`lazy`, the reference of the native one below.
py_lazy = lazy

# The core's native hot path (framework/native/graph.cpp): node creation and the
# scheduler's walk and loop in C++, the same functions as the Python ones here and in
# lazyx.scheduler, which run where the module is not built (a source checkout).
try:
    from . import _graph as native
except ImportError:  # not built: the Python versions serve
    native = None
if native is not None:
    from .primitive import Primitive
    native.setup(array, Primitive)
    lazy = native.lazy


def node_maker(cls):
    """For an op function of primitive class ``cls``: the native
    ``node(cls, stream, shape, dtype, inputs)``, which is ``lazy(shape, dtype,
    cls(stream), inputs)`` in one call, when an instance of ``cls`` is just its stream
    (no parameters, no ``__init__`` or ``__new__`` of its own); else None, and the op
    builds ``cls(stream)`` and calls :func:`lazy`."""
    if native is None or cls._param_names or cls.__init__ is not Primitive.__init__ \
            or cls.__new__ is not object.__new__:
        return None
    return native.node


def lazy_multi(shapes, dtypes, prim, inputs: tuple) -> list[array]:
    """The outputs of a multi-output primitive, each knowing its siblings."""
    outs = []
    for shape, dtype in zip(shapes, dtypes):
        outs.append(lazy(tuple(shape), dtype, prim, inputs))
    sib = tuple(outs)
    for o in outs:
        o._siblings = sib
    return outs


def from_buffer(data, dtype: _dt.Dtype | None = None) -> array:
    """An evaluated array that wraps backend buffer ``data`` without copying."""
    a = _new(array)
    a._shape = tuple(data.shape)
    a._dtype = dtype if dtype is not None else _dt.from_numpy(data.dtype)
    a._data = data
    a._prim = None
    a._inputs = None
    a._siblings = None
    return a


def _become(dst: array, src: array) -> None:
    """Make ``dst`` an alias of ``src``'s value (used by constructors and __setitem__)."""
    dst._shape = src._shape
    dst._dtype = src._dtype
    dst._data = src._data
    dst._prim = src._prim
    dst._inputs = src._inputs
    dst._siblings = None
    if src._siblings is not None:
        # Keep dst a proper output of the multi-output node: take src's place.
        dst._siblings = tuple(dst if s is src else s for s in src._siblings)
        for s in dst._siblings:
            if s is not dst:
                s._siblings = dst._siblings


# -- in-place updates ----------------------------------------------------------
# ``a[idx] = v`` and ``a += b`` are functional, as in MLX: the Python object ``a`` comes to
# refer to a new node built from its previous value, which moves to a fresh object.
# Graph edges point at array objects, so nodes built earlier that read ``a`` are made to
# read the previous value instead (``y = a * 2; a += 1`` leaves ``y`` as it was).
def update_in_place(dst: array, build, refs: int, statement_refs: int) -> None:
    """Make ``dst`` refer to ``build(old)``, ``old`` a fresh object with ``dst``'s value.

    ``refs`` is ``sys.getrefcount(dst)`` taken first thing in the calling dunder and
    ``statement_refs`` what a plain statement (``a += b``, ``a[i] = v``) accounts for
    (:data:`SETITEM_REFS`, :data:`INPLACE_REFS`): only when something else holds ``dst``
    can a node read it, and only then are readers searched for. If ``build`` raises,
    ``dst`` is unchanged.
    """
    old = _new(array)
    _become(old, dst)  # takes dst's place among the outputs of a multi-output node
    new = build(old)
    if refs > statement_refs:
        # First the new value's own graph (``a[0] = a[1]``, ``a += a``), found by a walk;
        # then any other consumer.
        refs -= _redirect(new, dst, old)
        if refs > statement_refs:
            _redirect_referrers(dst, old)
    _become(dst, new)


def _statement_refs() -> tuple[int, int]:
    """References to ``a`` at the start of ``__setitem__`` in ``a[k] = v`` and of
    ``__iadd__`` in ``a += b`` (the name, the interpreter's own, ``self``, getrefcount's
    argument); measured, because the interpreter's share differs between versions."""
    seen = []

    class Probe:
        def __setitem__(self, key, value):
            seen.append(_getrefcount(self))

        def __iadd__(self, other):
            seen.append(_getrefcount(self))
            return self

    probe = Probe()
    probe[0] = 0
    probe += 0
    return seen[0], seen[1]


_getrefcount = sys.getrefcount
SETITEM_REFS, INPLACE_REFS = _statement_refs()


def _redirect(root: array, target: array, repl: array) -> int:
    """Make the unevaluated graph of ``root`` read ``repl`` where it reads ``target``;
    returns how many references were replaced."""
    replaced = 0
    seen = {id(repl), id(target)}
    stack = [root]
    while stack:
        a = stack.pop()
        ins = a._inputs
        if ins is None:
            continue
        hit = False
        for x in ins:
            if x is target:
                hit = True
            elif id(x) not in seen:
                seen.add(id(x))
                stack.append(x)
        if hit:
            replaced += sum(1 for x in ins if x is target)
            a._inputs = tuple(repl if x is target else x for x in ins)
    return replaced


def _redirect_referrers(target: array, repl: array) -> None:
    """Make every unevaluated node that reads ``target`` read ``repl`` instead.

    Nodes keep no back-references, so the garbage collector's referrer search finds
    them; it runs only when the array is referenced beyond the updating statement.
    """
    tuples = [r for r in _gc.get_referrers(target) if type(r) is tuple]
    if not tuples:
        return
    ids = {id(t) for t in tuples}
    for owner in _gc.get_referrers(*tuples):
        if isinstance(owner, array):
            ins = owner._inputs
            if ins is not None and id(ins) in ids:
                owner._inputs = tuple(repl if x is target else x for x in ins)


# The in-place operators (data: operator name -> op name in the late-bound op table).
_IN_PLACE = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift",
    "matmul": "matmul",
}


def _in_place(name: str, op_name: str):
    def iop(self, other):
        refs = _getrefcount(self)
        if name == "truediv" and self._dtype.kind not in "fc":
            raise DtypeError(f"[__itruediv__] In place division cannot cast to non-floating "
                             f"point type: the array is {self._dtype.name}; use a = a / b.")
        op = getattr(ops, op_name)
        update_in_place(self, lambda old: op(old, other), refs, INPLACE_REFS)
        return self
    iop.__name__ = f"__i{name}__"
    iop.__doc__ = (f"``a {_SYMBOL[name]}= b``: ``a`` (this object) becomes ``a {_SYMBOL[name]} b``, "
                   f"as in MLX; its dtype and shape are those of the result.")
    return iop


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
           "pow": "**", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>",
           "matmul": "@"}
for _name, _op_name in _IN_PLACE.items():
    setattr(array, f"__i{_name}__", _in_place(_name, _op_name))


def _host_copy(val, dtype) -> np.ndarray:
    """``_to_numpy`` inside the CPU backend's evaluation scope, so the copy is
    counted by its memory figures like any kernel output (as MLX counts it)."""
    state = _backend._tables
    if state is None:
        if not _backend._backends:  # plugins still loading: nothing to account with
            return _to_numpy(val, dtype)
        state = _backend.dispatch_tables()
    cpu = state[1]
    token = cpu.enter_eval()
    try:
        return _to_numpy(val, dtype)
    finally:
        cpu.exit_eval(token)


def _to_numpy(val, dtype) -> np.ndarray:
    npd = None if dtype is None else dtype.np
    if isinstance(val, np.ndarray):
        if npd is None:
            if val.dtype == np.float64 or val.dtype == np.complex128:  # MLX narrows both
                npd = np.float32 if val.dtype == np.float64 else np.complex64
            else:
                _dt.from_numpy(val.dtype)  # a DtypeError for a dtype lazyx lacks
        return np.array(val, dtype=npd, copy=True)
    if isinstance(val, (bool, int, float, complex)):
        if npd is None:
            npd = _dt.scalar_dtype(val).np
        return _checked_scalar(val, npd)
    if isinstance(val, np.generic):
        return np.array(val, dtype=npd if npd is not None else
                        (np.float32 if val.dtype == np.float64 else val.dtype))
    if isinstance(val, (list, tuple)):
        flat = _flatten_nested(val)
        if npd is None:
            npd = _infer_list_dtype(flat).np
        try:
            out = np.array(_nested_to_numpy_ready(val), dtype=npd)
        except ValueError as e:
            raise ShapeError(f"Cannot build an array from a ragged nested sequence: {e}") from None
        if out.dtype == object:
            raise ShapeError("Cannot build an array from a ragged nested sequence.")
        return out
    host = _foreign_host(val)  # DLPack (PyTorch, JAX, CuPy) and buffer-protocol objects
    if host is not None:
        return _to_numpy(host, dtype)
    if hasattr(val, "__mlx_array__"):  # MLX's ArrayLike protocol
        return _to_numpy(val.__mlx_array__(), dtype)
    raise DtypeError(f"Cannot convert a value of type {type(val).__name__} to an array.")


def _foreign_host(val) -> np.ndarray | None:
    """``val`` (a DLPack, ``__array__`` or buffer-protocol object) as a host NumPy array,
    or None; :mod:`lazyx.interop` installs it here (it sits above this module)."""
    if hasattr(val, "__array__") or hasattr(val, "__array_interface__"):
        return np.asarray(val)
    return None


def _checked_scalar(val, npd):
    if isinstance(val, int) and not isinstance(val, bool) and npd.kind in "iu":
        info = np.iinfo(npd)
        if not info.min <= val <= info.max:
            # MLX wraps Python ints into the integer dtype; NumPy 2 refuses, so wrap by hand.
            bits = info.bits
            val = val & ((1 << bits) - 1)
            if npd.kind == "i" and val >= 1 << (bits - 1):
                val -= 1 << bits
    return np.array(val, dtype=npd)


def _flatten_nested(val):
    out = []
    stack = [val]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            out.append(v)
    return out


def _nested_to_numpy_ready(val):
    # Arrays nested in lists are turned into NumPy arrays first.
    if isinstance(val, (list, tuple)):
        if any(isinstance(v, (array, list, tuple)) for v in val):
            return [_nested_to_numpy_ready(v) for v in val]
        return val
    if isinstance(val, array):
        return val._numpy()
    return val


def _infer_list_dtype(flat) -> _dt.Dtype:
    if not flat:
        return _dt.float32
    strong = None
    weak = []
    for v in flat:
        if isinstance(v, array):
            strong = v._dtype if strong is None else _dt.promote_types(strong, v._dtype)
        elif isinstance(v, (bool, int, float, complex)):
            weak.append(_dt._python_scalar_type(v))
        elif isinstance(v, np.generic):
            d = _dt.from_numpy(v.dtype)
            strong = d if strong is None else _dt.promote_types(strong, d)
        else:
            raise DtypeError(f"Cannot convert an element of type {type(v).__name__} to an array.")
    if strong is None:
        top = max(weak, key=_dt._SCALAR_RANK.__getitem__)
        if top is int:
            ints = [v for v in flat if type(v) is int]
            return _dt._int_dtype(max(ints)) if max(ints) >= 2**31 else _dt._int_dtype(min(ints))
        return _dt._SCALAR_DEFAULT[top]
    for t in set(weak):
        strong = _dt.weak_scalar_dtype(strong, t)
    return strong


def _format_scalar(x, kind):
    if kind == "b":
        return "True" if x else "False"
    if kind == "c":
        re, im = float(x.real), float(x.imag)
        return f"{_float_format(re)}{'+' if im >= 0 or im != im else '-'}{_float_format(abs(im))}j"
    if kind == "f":
        return _float_format(float(x))
    return str(int(x))


#: MLX prints a dimension longer than twice this as its first and last entries around "...".
_EDGE_ITEMS = 3


def _format(a: array) -> str:
    """MLX's text for an array: ``array([[1, 2], [3, 4]], dtype=int32)`` with each row on
    its own line, no line wrapping, and every dimension of more than six entries
    summarised as ``first three, ..., last three``."""
    d = a._numpy()
    kind = a._dtype.kind
    if d.ndim == 0:
        return f"array({_format_scalar(d[()], kind)}, dtype={a._dtype.name})"
    return f"array({_format_nested(d, kind, len('array(') + 1)}, dtype={a._dtype.name})"


def _format_nested(d: np.ndarray, kind: str, indent: int) -> str:
    """``d`` (one or more dimensions) as nested brackets; only the printed entries are
    read, so summarising a large array costs little."""
    n = d.shape[0]
    if n > 2 * _EDGE_ITEMS:
        rows = [*range(_EDGE_ITEMS), None, *range(n - _EDGE_ITEMS, n)]
    else:
        rows = range(n)
    if d.ndim == 1:
        return "[" + ", ".join("..." if i is None else _format_scalar(d[i], kind)
                               for i in rows) + "]"
    sep = ",\n" + " " * indent
    return "[" + sep.join("..." if i is None else _format_nested(d[i], kind, indent + 1)
                          for i in rows) + "]"
