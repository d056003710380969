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

import numpy as np

from . import backend as _backend
from . import dtypes as _dt
from . import ops
from .errors import DtypeError, ShapeError

__all__ = ["array", "lazy", "lazy_multi", "from_buffer"]

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
        return d

    def __array__(self, dtype=None, copy=None):
        d = self._numpy()
        if copy:
            d = d.copy()
        else:
            # A read-only view: a NumPy user cannot corrupt the immutable array.
            d = d.view()
            d.flags.writeable = False
        if dtype is not None and np.dtype(dtype) != d.dtype:
            d = d.astype(dtype)
        return d

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
        for i in range(self._shape[0]):
            yield self[i]

    def __repr__(self) -> str:
        return _format(self)

    __str__ = __repr__

    def __hash__(self):
        return id(self)

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
            if val.dtype == np.float64:
                npd = np.float32
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
    if hasattr(val, "__array__") or hasattr(val, "__array_interface__"):
        return _to_numpy(np.asarray(val), dtype)
    raise DtypeError(f"Cannot convert a value of type {type(val).__name__} to an array.")


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
        return f"{re:g}{'+' if im >= 0 or im != im else '-'}{abs(im):g}j"
    if kind == "f":
        return f"{float(x):g}"
    return str(int(x))


def _format(a: array) -> str:
    d = a._numpy()
    kind = a._dtype.kind
    name = "bool" if a._dtype is _dt.bool_ else a._dtype.name
    if d.ndim == 0:
        return f"array({_format_scalar(d[()], kind)}, dtype={name})"
    if d.size == 0:
        return f"array([], dtype={name})"
    if a._dtype is _dt.bfloat16:
        d = d.astype(np.float32)
    body = np.array2string(
        d, separator=", ", prefix="array(", threshold=1000, edgeitems=3,
        formatter={"all": lambda x: _format_scalar(x, kind)})
    return f"array({body}, dtype={name})"
