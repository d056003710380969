"""The IR of fused element-wise expressions.

An :class:`Expr` is one typed value per element of a fused kernel's loop: an
input loaded at the current index (its broadcast is a property of the load,
not an op), an inlined scalar constant, a cast, or an op of :data:`OPS`
applied to other expressions. A :class:`Program` is what one kernel computes:
the dtypes of its input buffers and the expressions stored to its outputs.

Expressions are interned: building the same expression twice gives the same
object, so equality is identity, hashing is cheap, and common subexpressions
are shared for free. Every expression knows its dtype (:func:`apply` infers it
from the op's rule and checks the operands), so renderers never guess.

An element-wise primitive becomes fusible by writing itself in this IR::

    class Exp(Unary):
        def to_expression(self, args):
            return ir.apply("exp", args[0])

Renderers (:mod:`lazyx.codegen.cpp`) turn a program into source code; the
reference semantics of each op are those of the lazyx operation named in
:data:`OPS` (see :mod:`lazyx.codegen.lower`).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .. import dtypes as dt
from ..errors import DtypeError

__all__ = ["Expr", "Program", "OpInfo", "OPS", "IRError", "input", "constant", "cast",
           "apply", "maybe_apply", "select", "topological"]


class IRError(DtypeError):
    """An expression that the IR cannot express (unknown op, wrong operand dtypes)."""


class Expr:
    """One typed value of a fused kernel, per element. Build with :func:`input`,
    :func:`constant`, :func:`cast`, :func:`apply` and :func:`select`.

    Attributes:
        op: ``"input"``, ``"const"``, ``"cast"`` or a name of :data:`OPS`.
        args: the operand expressions.
        dtype: the lazyx dtype of the value.
        value: the input's index (``input``) or the Python scalar (``const``).
    """

    __slots__ = ("op", "args", "dtype", "value", "__weakref__")

    def __repr__(self) -> str:
        if self.op == "input":
            return f"in{self.value}:{self.dtype.name}"
        if self.op == "const":
            return f"{self.value!r}:{self.dtype.name}"
        if self.op == "cast":
            return f"cast({self.args[0]!r}, {self.dtype.name})"
        return f"{self.op}({', '.join(repr(a) for a in self.args)})"

    def __reduce__(self):
        raise TypeError("IR expressions are interned; rebuild them instead of pickling.")


# Interning table: (op, args, dtype, value key) -> Expr. Args are Exprs, which hash
# by identity; that is exact because they are interned themselves.
_interned: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()


def _make(op: str, args: tuple, dtype, value=None, key=None) -> Expr:
    k = (op, args, dtype, key)
    e = _interned.get(k)
    if e is None:
        e = object.__new__(Expr)
        e.op = op
        e.args = args
        e.dtype = dtype
        e.value = value
        _interned[k] = e
    return e


def input(index: int, dtype) -> Expr:  # noqa: A001  (the IR's own vocabulary)
    """The element of input buffer ``index`` (of ``dtype``) at the loop's index."""
    return _make("input", (), dt.to_dtype(dtype), int(index), int(index))


def constant(value, dtype) -> Expr:
    """An inlined scalar ``value`` converted to ``dtype`` as ``astype`` would."""
    d = dt.to_dtype(dtype)
    v = np.asarray(value)
    if v.ndim:
        raise IRError(f"IR constants are scalars, got shape {v.shape}.")
    if v.dtype.kind == "c" and d.kind != "c":
        v = v.real
    with np.errstate(all="ignore"):
        v = v.astype(d.np)
    if d.kind == "b":
        py = bool(v)
    elif d.kind in "ui":
        py = int(v)
    elif d.kind == "c":
        py = complex(v)
    else:
        py = float(v)
    # repr keys tell -0.0 from 0.0 and let NaN match itself.
    return _make("const", (), d, py, repr(py))


def cast(x: Expr, dtype) -> Expr:
    """``x`` converted to ``dtype`` with ``astype``'s rules (complex to real keeps the
    real part; float to integer truncates). A cast to ``x``'s own dtype is ``x``."""
    d = dt.to_dtype(dtype)
    if x.dtype is d:
        return x
    return _make("cast", (x,), d)


class OpInfo:
    """What the IR knows of one op: its arity, the dtype kinds its operands may
    have, how the result dtype follows from them, and the lazyx operation that
    defines its semantics (``lazyx.core.<function>``)."""

    __slots__ = ("name", "arity", "kinds", "result", "function")

    def __init__(self, name, arity, kinds, result, function):
        self.name = name
        self.arity = arity
        self.kinds = kinds
        self.result = result
        self.function = function

    def __repr__(self) -> str:
        return f"OpInfo({self.name!r}, arity={self.arity}, kinds={self.kinds!r})"


def _same(d):
    return d


def _to_bool(d):
    return dt.bool_


def _real_of(d):
    return dt.float32 if d.kind == "c" else d


_ALL = "biufc"
_NUM = "iufc"
_INEXACT = "fc"

# name: (arity, operand kinds, result rule, lazyx function). Binary operands share
# one dtype; ``select`` takes a bool condition and two operands of one dtype.
_TABLE = {
    # unary arithmetic
    "neg": (1, _NUM, _same, "negative"),
    "abs": (1, _ALL, _real_of, "abs"),
    "sign": (1, _ALL, _same, "sign"),
    "square": (1, _ALL, _same, "square"),
    "conj": (1, "c", _same, "conj"),
    "real": (1, "c", _real_of, "real"),
    "imag": (1, "c", _real_of, "imag"),
    # unary transcendental
    "exp": (1, _INEXACT, _same, "exp"),
    "expm1": (1, "f", _same, "expm1"),
    "log": (1, _INEXACT, _same, "log"),
    "log1p": (1, _INEXACT, _same, "log1p"),
    "log2": (1, _INEXACT, _same, "log2"),
    "log10": (1, _INEXACT, _same, "log10"),
    "sqrt": (1, _INEXACT, _same, "sqrt"),
    "rsqrt": (1, _INEXACT, _same, "rsqrt"),
    "sin": (1, _INEXACT, _same, "sin"),
    "cos": (1, _INEXACT, _same, "cos"),
    "tan": (1, _INEXACT, _same, "tan"),
    "asin": (1, _INEXACT, _same, "arcsin"),
    "acos": (1, _INEXACT, _same, "arccos"),
    "atan": (1, _INEXACT, _same, "arctan"),
    "sinh": (1, _INEXACT, _same, "sinh"),
    "cosh": (1, _INEXACT, _same, "cosh"),
    "tanh": (1, _INEXACT, _same, "tanh"),
    "asinh": (1, _INEXACT, _same, "arcsinh"),
    "acosh": (1, _INEXACT, _same, "arccosh"),
    "atanh": (1, _INEXACT, _same, "arctanh"),
    "erf": (1, "f", _same, "erf"),
    "erfinv": (1, "f", _same, "erfinv"),
    "sigmoid": (1, "f", _same, "sigmoid"),
    # unary rounding
    "floor": (1, "f", _same, "floor"),
    "ceil": (1, "f", _same, "ceil"),
    "trunc": (1, "f", _same, "trunc"),
    "rint": (1, "f", _same, "round"),
    # unary logic and tests
    "not": (1, _ALL, _to_bool, "logical_not"),
    "bitnot": (1, "biu", _same, "bitwise_invert"),
    "isnan": (1, _ALL, _to_bool, "isnan"),
    "isinf": (1, _ALL, _to_bool, "isinf"),
    "isfinite": (1, _ALL, _to_bool, "isfinite"),
    "isposinf": (1, "biuf", _to_bool, "isposinf"),
    "isneginf": (1, "biuf", _to_bool, "isneginf"),
    # binary arithmetic
    "add": (2, _ALL, _same, "add"),
    "sub": (2, _ALL, _same, "subtract"),
    "mul": (2, _ALL, _same, "multiply"),
    "div": (2, _INEXACT, _same, "divide"),
    "floordiv": (2, _ALL, _same, "floor_divide"),
    "mod": (2, "biuf", _same, "remainder"),
    "pow": (2, _ALL, _same, "power"),
    "max": (2, _ALL, _same, "maximum"),
    "min": (2, _ALL, _same, "minimum"),
    "logaddexp": (2, _INEXACT, _same, "logaddexp"),
    "atan2": (2, "f", _same, "arctan2"),
    # binary comparisons and logic
    "eq": (2, _ALL, _to_bool, "equal"),
    "ne": (2, _ALL, _to_bool, "not_equal"),
    "lt": (2, _ALL, _to_bool, "less"),
    "le": (2, _ALL, _to_bool, "less_equal"),
    "gt": (2, _ALL, _to_bool, "greater"),
    "ge": (2, _ALL, _to_bool, "greater_equal"),
    "and": (2, _ALL, _to_bool, "logical_and"),
    "or": (2, _ALL, _to_bool, "logical_or"),
    "xor": (2, _ALL, _to_bool, "logical_xor"),
    "bitand": (2, "biu", _same, "bitwise_and"),
    "bitor": (2, "biu", _same, "bitwise_or"),
    "bitxor": (2, "biu", _same, "bitwise_xor"),
    "shl": (2, "iu", _same, "left_shift"),
    "shr": (2, "iu", _same, "right_shift"),
    # ternary
    "select": (3, _ALL, _same, "where"),
}

#: Every op of the IR by name.
OPS: dict[str, OpInfo] = {n: OpInfo(n, *v) for n, v in _TABLE.items()}


def apply(op: str, *args: Expr) -> Expr:
    """``op`` (a name of :data:`OPS`) applied to ``args``; the result's dtype follows
    from the op's rule.

    Raises:
        IRError: unknown op, wrong number of operands, operands of different
            dtypes, or a dtype the op does not take.
    """
    info = OPS.get(op)
    if info is None:
        raise IRError(f"Unknown IR op {op!r}; the IR has {', '.join(sorted(OPS))}.")
    if len(args) != info.arity:
        raise IRError(f"IR op {op!r} takes {info.arity} operands, got {len(args)}.")
    if op == "select":
        return select(*args)
    d = args[0].dtype
    for a in args[1:]:
        if a.dtype is not d:
            raise IRError(f"IR op {op!r} needs operands of one dtype, got "
                          f"{', '.join(a.dtype.name for a in args)}: cast them first.")
    if d.kind not in info.kinds:
        raise IRError(f"IR op {op!r} does not take {d.name} operands.")
    return _make(op, tuple(args), info.result(d))


def maybe_apply(op: str | None, args) -> Expr | None:
    """``apply(op, *args)``, or None when ``op`` is None or does not take these operands'
    dtypes (what a primitive's ``to_expression`` returns when it cannot be fused)."""
    if op is None:
        return None
    info = OPS[op]
    if op == "select":
        c, x, y = args
        ok = c.dtype is dt.bool_ and x.dtype is y.dtype
    else:
        d = args[0].dtype
        ok = d.kind in info.kinds and all(a.dtype is d for a in args)
    return apply(op, *args) if ok else None


def select(condition: Expr, x: Expr, y: Expr) -> Expr:
    """``x`` where ``condition`` (bool) is true, else ``y`` (``x`` and ``y`` of one dtype)."""
    if condition.dtype is not dt.bool_:
        raise IRError(f"The condition of select must be bool, got {condition.dtype.name}.")
    if x.dtype is not y.dtype:
        raise IRError(f"select needs two operands of one dtype, got {x.dtype.name} and "
                      f"{y.dtype.name}: cast them first.")
    return _make("select", (condition, x, y), x.dtype)


def topological(outputs) -> list[Expr]:
    """Every expression that ``outputs`` depend on, each once, operands first."""
    order, seen = [], set()
    for root in outputs:
        if id(root) in seen:
            continue
        stack = [(root, 0)]
        while stack:
            e, i = stack.pop()
            if i < len(e.args):
                stack.append((e, i + 1))
                a = e.args[i]
                if id(a) not in seen:
                    stack.append((a, 0))
                continue
            if id(e) not in seen:
                seen.add(id(e))
                order.append(e)
    return order


class Program:
    """What one fused kernel computes: ``outputs[j]`` for every element, from input
    buffers of dtypes ``inputs``. Hashable; two programs are equal when they
    compute the same expressions of inputs of the same dtypes.

    Args:
        inputs: the dtype of each input buffer, in order.
        outputs: the expression stored to each output buffer.
    """

    __slots__ = ("inputs", "outputs", "_hash", "_digest", "_nodes")

    def __init__(self, inputs, outputs):
        self.inputs = tuple(dt.to_dtype(d) for d in inputs)
        self.outputs = tuple(outputs)
        if not self.outputs:
            raise IRError("A program needs at least one output.")
        self._nodes = topological(self.outputs)
        for e in self._nodes:
            if e.op == "input":
                k = e.value
                if not 0 <= k < len(self.inputs) or self.inputs[k] is not e.dtype:
                    raise IRError(f"Input {k} of dtype {e.dtype.name} does not match the "
                                  f"program's inputs ({', '.join(d.name for d in self.inputs)}).")
        self._hash = hash((self.inputs, self.outputs))
        self._digest = None

    @property
    def nodes(self) -> list[Expr]:
        """Every expression of the program, operands first."""
        return self._nodes

    @property
    def size(self) -> int:
        """The number of ops (inputs and constants not counted)."""
        return sum(1 for e in self._nodes if e.op not in ("input", "const"))

    def text(self) -> str:
        """A canonical listing (one SSA line per expression), stable across processes."""
        names, lines = {}, []
        lines.append("inputs " + " ".join(d.name for d in self.inputs))
        for k, e in enumerate(self._nodes):
            names[id(e)] = f"v{k}"
            if e.op == "input":
                rhs = f"input {e.value}"
            elif e.op == "const":
                rhs = f"const {_const_text(e.value)}"
            else:
                rhs = f"{e.op} " + " ".join(names[id(a)] for a in e.args)
            lines.append(f"v{k} = {rhs} : {e.dtype.name}")
        lines.append("outputs " + " ".join(names[id(o)] for o in self.outputs))
        return "\n".join(lines)

    @property
    def digest(self) -> str:
        """A short hash of :meth:`text`, the program's name in logs and file names."""
        if self._digest is None:
            import hashlib  # start-up: the first digest pays for it, not every import
            self._digest = hashlib.sha256(self.text().encode()).hexdigest()[:16]
        return self._digest

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if type(other) is not Program or self._hash != other._hash:
            return False
        return self.inputs == other.inputs and self.outputs == other.outputs

    def __repr__(self) -> str:
        return (f"<Program {self.digest}: {self.size} ops, {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs>")


def _const_text(v) -> str:
    if isinstance(v, float):
        return v.hex() if math.isfinite(v) else repr(v)
    if isinstance(v, complex):
        return f"{_const_text(v.real)},{_const_text(v.imag)}"
    return repr(v)
