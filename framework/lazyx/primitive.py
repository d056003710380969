"""The :class:`Primitive` contract.

A primitive is one operation of the graph: the node that an op function creates
and that the scheduler later runs. Subclasses declare their parameters in
``__slots__`` and implement what they can of

* ``eval_cpu(inputs) / eval_gpu(inputs)``: kernels that take input buffers
  (NumPy arrays on the CPU) and return one buffer or a tuple of buffers. A
  backend may register its own kernel for the class instead; that kernel wins.
* ``output_shapes(inputs)``: the output shapes from the input arrays, without
  running anything (needed by shapeless compile, and by ``import_function``,
  which checks every node of a file with it).
* ``output_dtypes(inputs)`` (optional): the output dtypes from the input arrays;
  ``import_function`` checks a file's declared dtypes with it (or, for an
  element-wise primitive, with the dtypes of its ``to_expression``).
* ``vjp(primals, cotangents, argnums, outputs)``, ``jvp(primals, tangents,
  argnums)``, ``vmap(inputs, axes)``: the transform rules (below).
* ``to_expression(args)`` (element-wise primitives): how to write the operation
  in the codegen IR, which is what lets ``compile`` fuse it.

Parameters listed in ``__slots__`` (other than ``stream``) are the primitive's
identity: ``params()`` returns them, ``is_equivalent`` compares them, and the
graph printers show them.

Parameter declarations
----------------------
Each parameter slot is declared with a class annotation beside ``__slots__``,
in the vocabulary of :mod:`typing`::

    class Reduce(Primitive):
        __slots__ = ("axes", "keepdims", "op")
        axes: Axes                                   # tuple[int, ...]
        keepdims: bool
        op: Literal["sum", "prod", "max", "min", "all", "any"]

``import_function`` checks every parameter a file gives against these before
it builds a primitive (a file is data from anywhere), and ``export_function``
refuses a primitive whose parameters are undeclared, so every file it writes
can be checked. The forms understood are ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, ``None``, a class (``Dtype``: an instance of
it), ``Literal[...]`` (allowed values; ``Literal[tuple(TABLE)]`` derives them
from a table), ``X | Y``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]``,
``dict[K, V]``, ``Annotated[int, Range(low, high)]`` (inclusive bounds),
``Annotated[int, AxisOf(k)]`` (an axis of input ``k``: in range, distinct in a
tuple; checked against the node's inputs) and ``Any`` (anything the file
format holds: say so only where nothing stricter fits). Types are exact, as in the file format: ``True`` is not an ``int`` and
``1`` is not a ``float`` (write ``int | float``). :data:`Size`, :data:`Shape`,
:data:`Axis`, :data:`Axes` and :data:`NewAxes` name the common ones. Annotations are read once per class when
it is created and compiled into one validator per slot on first use, so a table
defined after the class (in a module with ``from __future__ import
annotations``) can be named.

Transform rules
---------------
The walkers of :mod:`lazyx.transforms` call a node's rules with its input
arrays (``primals``) and build the result from what the rules return. Rules
are written with ``lazyx.core`` ops, so their results are lazy graphs that can
be transformed again; :mod:`lazyx.rules` holds the shared moves
(``sum_to_shape``, ``batch_first`` ...).

* ``vjp(primals, cotangents, argnums, outputs) -> list``. ``cotangents`` holds
  one array per output (an output that received none gets zeros when a
  sibling did), ``outputs`` the node's outputs, ``argnums`` the indices of the
  inputs that need a cotangent (those that depend on a differentiated
  argument; always ``[0]`` for a one-input node). Return one entry per index
  in ``argnums``.
* ``jvp(primals, tangents, argnums) -> list``. ``tangents`` are aligned with
  ``argnums`` (the inputs that carry one); return one entry per output.
* ``vmap(inputs, axes) -> (outputs, out_axes)``. ``inputs`` are the node's
  inputs with the batched ones in place, ``axes[i]`` the non-negative batch
  axis of ``inputs[i]`` or None for an unbatched one (at least one is
  batched). Return one array per output and its batch axis (None: the output
  is the same for every example).

**None means zero.** A ``vjp`` or ``jvp`` entry of None is a zero cotangent or
tangent ("no gradient"): the walker skips it instead of adding zeros, and gives
``zeros_like`` only where a user asked for the result.

**Integer outputs.** An integer or boolean output computed from a floating
input carries no gradient: when every output of a node is integer or bool
and one of the inputs in ``argnums`` is floating, the walkers give zero
cotangents and tangents without calling the rule (``argmax``, comparisons).
Integer computations on integer inputs are differentiated like any other (the
rule is called), as in MLX.

**What the walkers check.** ``vjp`` must return exactly ``len(argnums)``
entries and ``jvp`` one per output, each None or an array of that input's
(``vjp``) or output's (``jvp``) shape, else a :class:`TransformError` names the
primitive and the rule; a result of the right shape but another dtype is
cast to the input's or output's dtype. ``vmap`` must return one output and
one axis per node output, each output of the per-example shape with the batch
inserted at its axis and of the node's dtype, else a :class:`TransformError`.
A primitive without a rule raises :class:`TransformError` naming it when a
transform reaches it.

Two class attributes describe a primitive to the registry-wide transform test
(``tests/transforms/test_every_primitive.py``; examples come from the
``lazyx_examples`` hook): ``differentiable = False`` says it carries no
gradient (the test checks only that its cotangents are zero, and ``vmap``), and
``transient = True`` says it exists only while a transform traces (``vmap``'s
``Placeholder``): it needs no rules, and its examples must not leave it in
the graph.
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Annotated, Any, Literal

from .errors import ArgumentError, KernelNotFoundError, TransformError
from .providers import primitives

__all__ = ["Primitive", "SameShape", "FixedShape", "Range", "AxisOf", "Size", "Shape", "Axis", "Axes", "NewAxes",
           "ParameterDeclarationError"]


class ParameterDeclarationError(TransformError):
    """A parameter annotation that :class:`Primitive` cannot turn into a check."""


class Range:
    """Inclusive bounds of a numeric parameter: ``Annotated[int, Range(0)]`` is a
    non-negative int, ``Annotated[float, Range(0.0, 1.0)]`` a probability."""

    __slots__ = ("low", "high")

    def __init__(self, low=None, high=None):
        self.low = low
        self.high = high

    def __repr__(self) -> str:
        return f"Range({self.low!r}, {self.high!r})"

    def __contains__(self, v) -> bool:
        return (self.low is None or v >= self.low) and (self.high is None or v <= self.high)


class AxisOf:
    """Declares an int, or each int of a tuple, to be an axis of input ``k``: in
    ``[-n, n)`` with ``n`` its number of dimensions, distinct within a tuple. With
    ``new=True`` the axes are those of the output after the tuple's axes are inserted
    (``expand_dims``: ``n`` is the input's ndim plus the tuple's length).
    Checked where the inputs are known (``import_function`` checks a file's nodes)."""

    __slots__ = ("k", "new")

    def __init__(self, k: int = 0, new: bool = False):
        self.k = k
        self.new = new

    def __repr__(self) -> str:
        return f"AxisOf({self.k}{', new=True' if self.new else ''})"

    def check(self, v, inputs):
        """None when ``v`` fits ``inputs``, else the reason."""
        if v is None:
            return None
        if self.k >= len(inputs):
            return f"it names an axis of input {self.k}, and the node has {len(inputs)} inputs"
        axes = v if type(v) is tuple else (v,)
        n = len(inputs[self.k].shape) + (len(axes) if self.new else 0)
        seen = set()
        for a in axes:
            if not -n <= a < n:
                return f"axis {a} is out of range for {n} dimensions"
            if a % n in seen:
                return f"axis {a} is repeated"
            seen.add(a % n)
        return None


#: The largest dimension or count a parameter may hold (int64 offsets stay exact).
MAX_SIZE = 2 ** 62
#: A dimension or a count: an int in ``[0, 2**62]``.
Size = Annotated[int, Range(0, MAX_SIZE)]
#: An array shape.
Shape = tuple[Size, ...]
#: An axis of input 0 (negative ones count from the end).
Axis = Annotated[int, AxisOf(0)]
#: Distinct axes of input 0.
Axes = Annotated[tuple[int, ...], AxisOf(0)]
#: Distinct axes of the output of inserting them into input 0 (``expand_dims``).
NewAxes = Annotated[tuple[int, ...], AxisOf(0, new=True)]


# -- parameter validators ------------------------------------------------------------
# A validator takes a value and returns None when it fits, else a short reason.
def _describe_annotation(t) -> str:
    """``t`` as an error message writes it: ``tuple[int in [0, 2**62], ...] | None``."""
    if t is None or t is type(None):
        return "None"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Annotated:
        bounds = "".join(f" in [{r.low}, {r.high}]" for r in args[1:] if isinstance(r, Range))
        bounds += "".join(f" (distinct axes of input {a.k}"
                          f"{' after insertion' if a.new else ''})"
                          for a in args[1:] if isinstance(a, AxisOf))
        return _describe_annotation(args[0]) + bounds.replace(str(MAX_SIZE), "2**62")
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_describe_annotation(a) for a in args)
    if origin in (tuple, list, dict):
        inner = ", ".join("..." if a is Ellipsis else _describe_annotation(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if isinstance(t, type):
        return t.__name__
    return repr(t).replace("typing.", "")


def _axis_checks(t) -> list:
    """The :class:`AxisOf` declarations of annotation ``t`` (at its top or in a union)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Annotated:
        return [a for a in args[1:] if isinstance(a, AxisOf)]
    if origin is typing.Union or origin is types.UnionType:
        return [a for x in args for a in _axis_checks(x)]
    return []


def _exact(kind):
    def check(v):
        return None if type(v) is kind else f"not a {kind.__name__}"
    return check


def _compile_validator(t, where: str):
    """One validator for annotation ``t`` (already evaluated)."""
    if t is Any:
        return lambda v: None
    if t is None or t is type(None):
        return lambda v: None if v is None else "None is needed"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Annotated:
        base = _compile_validator(args[0], where)
        ranges = [a for a in args[1:] if isinstance(a, Range)]

        def annotated(v):
            why = base(v)
            if why is None:
                for r in ranges:
                    if v not in r:
                        return f"the value must lie in [{r.low}, {r.high}]"
            return why
        return annotated
    if origin is Literal:
        allowed = tuple(args)

        def literal(v):
            for a in allowed:
                if type(v) is type(a) and v == a:
                    return None
            return f"one of {list(allowed)} is needed"
        return literal
    if origin is typing.Union or origin is types.UnionType:
        options = [_compile_validator(a, where) for a in args]

        def union(v):
            return None if any(o(v) is None for o in options) else "no alternative fits"
        return union
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        items = [] if args == ((),) else [_compile_validator(a, where) for a in args]

        def fixed_tuple(v):
            if type(v) is not tuple or len(v) != len(items):
                return f"a tuple of {len(items)} items is needed"
            for i, (check, x) in enumerate(zip(items, v)):
                why = check(x)
                if why is not None:
                    return f"item {i} ({x!r}): {why}"
            return None
        return fixed_tuple
    if origin is tuple or origin is list:  # tuple[X, ...] or list[X]
        item = _compile_validator(args[0], where) if args else (lambda v: None)

        def sequence_of(v):
            if type(v) is not origin:
                return f"a {origin.__name__} is needed"
            for i, x in enumerate(v):
                why = item(x)
                if why is not None:
                    return f"item {i} ({x!r}): {why}"
            return None
        return sequence_of
    if origin is dict:
        key, val = ([_compile_validator(a, where) for a in args] if args
                    else (lambda v: None, lambda v: None))

        def dict_of(v):
            if type(v) is not dict:
                return "a dict is needed"
            for k, x in v.items():
                why = key(k) or val(x)
                if why is not None:
                    return f"entry {k!r}: {why}"
            return None
        return dict_of
    if t in (bool, int, float, complex, str, bytes, slice):
        return _exact(t)
    if isinstance(t, type):
        return lambda v: None if isinstance(v, t) else f"not a {t.__name__}"
    raise ParameterDeclarationError(
        f"{where}: cannot check parameters annotated {t!r}; use bool, int, float, complex, "
        f"str, bytes, None, a class, Literal[...], X | Y, tuple[...], list[...], dict[...], "
        f"Annotated[..., Range(low, high)] or Any.")


class Primitive:
    """Base class of every operation in the graph."""

    __slots__ = ("stream",)

    #: Public name, shown in errors and graphs. Defaults to the class name.
    name: str = "Primitive"
    #: Names of the parameter slots, gathered from the class hierarchy.
    _param_names: tuple[str, ...] = ()
    #: ``{slot: (annotation, module name)}`` of the declared parameters, gathered from
    #: the class hierarchy when the class is created (see "Parameter declarations").
    _param_annotations: dict = {}
    #: ``{slot: (annotation text, validator)}``, compiled on first use by ``check_params``.
    _param_validators: dict | None = None
    #: False for a primitive that carries no gradient (its vjp and jvp give zeros).
    differentiable: bool = True
    #: True for a primitive that exists only while a transform traces (no rules).
    transient: bool = False
    #: The number of inputs when it is fixed (None: any). ``import_function`` checks
    #: a file's nodes against it; declare it where the shape rule does not read every
    #: input (a reshape's shape comes from its parameters alone).
    arity: int | None = None
    #: False when parameters fix the output shape to the traced input shapes (a
    #: reshape's target shape, a slice's bounds): ``compile(..., shapeless=True)``
    #: then refuses the function, naming the primitive, instead of replaying the
    #: node at other shapes.
    shapeless: bool = True
    #: The private slots (names starting with ``_``) that hold only what the parameters
    #: determine (a cache computed from them). Eager replay (``lazyx.transforms.replay``)
    #: runs a node of one step with the primitive of an earlier step of the same
    #: structure, so a primitive with other private state (a communicator, a callback)
    #: is never replayed.
    derived_slots: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__
        names = []
        for klass in reversed(cls.__mro__):
            for s in klass.__dict__.get("__slots__", ()):
                if s != "stream" and not s.startswith("_") and s not in names:
                    names.append(s)
        cls._param_names = tuple(names)
        declared = {}
        for klass in reversed(cls.__mro__):
            for n, t in klass.__dict__.get("__annotations__", {}).items():
                if n in names:
                    declared[n] = (t, klass.__module__)
        cls._param_annotations = declared
        cls._param_validators = None
        if names and (cls.__init__ is Primitive.__init__ or
                      getattr(cls.__init__, "_by_name", False)):
            # A parameterised primitive without an __init__ of its own takes its
            # parameters by name too; one without parameters keeps the cheaper call.
            cls.__init__ = _init_for(tuple(names))

    # -- declared parameters ---------------------------------------------
    @classmethod
    def undeclared_params(cls) -> tuple[str, ...]:
        """The parameter slots that have no type annotation (see "Parameter declarations")."""
        return tuple(n for n in cls._param_names if n not in cls._param_annotations)

    @classmethod
    def param_validators(cls) -> dict:
        """``{slot: (annotation text, validator)}`` of the declared parameters; a
        validator returns None for a value that fits and a reason otherwise."""
        table = cls.__dict__.get("_param_validators")
        if table is None:
            table = {}
            for n, (t, module) in cls._param_annotations.items():
                where = f"{cls.__qualname__}.{n}"
                if isinstance(t, str):
                    scope = dict(vars(typing))
                    scope.update(vars(sys.modules[module]) if module in sys.modules else {})
                    try:
                        t = eval(t, scope)  # an annotation written in the class's own module
                    except Exception as e:
                        raise ParameterDeclarationError(
                            f"{where}: the annotation {t!r} cannot be evaluated in "
                            f"{module}: {type(e).__name__}: {e}.") from None
                table[n] = (_describe_annotation(t), _compile_validator(t, where),
                            _axis_checks(t))
            cls._param_validators = table
        return table

    @classmethod
    def check_params(cls, values, inputs=None) -> None:
        """Raise :class:`ArgumentError` naming the first parameter of ``values`` (in
        slot order) that its declaration refuses, or an undeclared one. With the node's
        ``inputs`` (arrays, or anything with a ``shape``), :class:`AxisOf` declarations
        are checked against their shapes too."""
        table = cls.param_validators()
        for n, v in zip(cls._param_names, values):
            entry = table.get(n)
            if entry is None:
                raise ArgumentError(
                    f"[{cls.name}] Parameter {n!r} has no declared type, so its value "
                    f"cannot be checked: annotate it beside __slots__ ({n}: <type>).")
            why = entry[1](v)
            if why is None and inputs is not None:
                for axis in entry[2]:
                    why = axis.check(v, inputs)
                    if why is not None:
                        break
            if why is not None:
                raise ArgumentError(f"[{cls.name}] Parameter {n!r} must be {entry[0]}, got "
                                    f"{v!r} ({why}).")

    def __init__(self, stream, *params):
        # Parameters are given positionally in slot order, or by name (a parameterised
        # subclass gets _init_by_name), so a subclass needs no __init__ of its own
        # unless it computes something.
        self.stream = stream
        if params:
            _set_params(self, params, {})

    # -- identity -------------------------------------------------------
    def params(self) -> tuple:
        """The primitive's parameters, in slot order."""
        return tuple(getattr(self, n) for n in self._param_names)

    def is_equivalent(self, other: "Primitive") -> bool:
        """Whether ``other`` computes the same function of the same inputs."""
        if type(other) is not type(self) or other.stream != self.stream:
            return False
        a, b = self.params(), other.params()
        try:
            return bool(a == b)
        except Exception:
            return False

    def is_noop(self, inputs) -> bool:
        """Whether this node returns its (single) input unchanged for ``inputs``
        (a cast to the input's dtype, a reshape to its shape): ``compile`` drops it."""
        return False

    def constant_at(self, shapes):
        """The value of this node's one 0-d output as a Python number when the input
        shapes ``shapes`` alone give it (an element count), else None. A compile at
        fixed shapes (which traces again for new shapes) makes such a node a constant,
        which fuses into its readers; a shapeless one keeps the node."""
        return None

    def __repr__(self) -> str:
        ps = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._param_names)
        return f"{self.name}({ps})"

    # -- kernels --------------------------------------------------------
    def eval_cpu(self, inputs):
        raise KernelNotFoundError(
            f"{self.name} has no CPU kernel: the active cpu backend registers none "
            f"and the primitive does not implement eval_cpu.")

    def eval_gpu(self, inputs):
        raise KernelNotFoundError(
            f"{self.name} has no GPU kernel: the active gpu backend registers none "
            f"and the primitive does not implement eval_gpu.")

    # -- shape and dtype inference --------------------------------------
    def output_shapes(self, inputs) -> list[tuple[int, ...]]:
        raise self._missing_rule("output_shapes", "(self, inputs)")

    def output_dtypes(self, inputs):
        """The output dtypes for ``inputs``, or None where the primitive gives no rule
        (an element-wise primitive's ``to_expression`` then says them)."""
        return None

    # -- transforms -----------------------------------------------------
    def vjp(self, primals, cotangents, argnums, outputs):
        raise self._missing_rule("vjp", "(self, primals, cotangents, argnums, outputs)")

    def jvp(self, primals, tangents, argnums):
        raise self._missing_rule("jvp", "(self, primals, tangents, argnums)")

    def vmap(self, inputs, axes):
        raise self._missing_rule("vmap", "(self, inputs, axes)")

    def _missing_rule(self, method: str, signature: str) -> TransformError:
        """The error for a rule this primitive lacks: it names the primitive, its
        plugin's distribution when registered, and the method to write. (A class made
        by :func:`lazyx.custom_primitive.primitive` says which decorator adds it.)"""
        info = primitives.get(type(self))
        who = f" (from {info.label})" if info is not None else ""
        return TransformError(f"[{self.name}.{method}] Not implemented for {self.name}{who}: "
                              f"implement {method}{signature}.")


def _init_for(names: tuple):
    """``Primitive.__init__`` for a primitive with parameters ``names``: every parameter
    by position is one tuple assignment (the call every op makes, once per node);
    fewer, or some by name, go through :func:`_init_by_name`."""
    targets = ", ".join(f"self.{n}" for n in names)
    source = (f"def __init__(self, stream, *params, **named):\n"
              f"    if len(params) == {len(names)} and not named:\n"
              f"        self.stream = stream\n"
              f"        {targets}, = params\n"
              f"    else:\n"
              f"        _init_by_name(self, stream, *params, **named)\n")
    scope = {"_init_by_name": _init_by_name}
    exec(compile(source, f"<lazyx primitive __init__ {names}>", "exec"), scope)  # names: slots
    init = scope["__init__"]
    init._by_name = True
    init.__doc__ = _init_by_name.__doc__
    return init


def _init_by_name(self, stream, *params, **named):
    """``Primitive.__init__`` of a primitive with parameters: by position or by name."""
    self.stream = stream
    if params or named:
        _set_params(self, params, named)


def _set_params(prim, params: tuple, named: dict) -> None:
    names = prim._param_names
    if len(params) > len(names):
        raise TypeError(f"{prim.name} takes {len(names)} parameters ({', '.join(names)}), "
                        f"got {len(params)}.")
    for n, v in zip(names, params):
        setattr(prim, n, v)
    for n, v in named.items():
        if n not in names or n in names[:len(params)]:
            raise TypeError(f"{prim.name} got an unexpected or repeated parameter {n!r} "
                            f"(its parameters: {', '.join(names)}).")
        setattr(prim, n, v)


class SameShape(Primitive):
    """A primitive whose one output has its first input's shape (a sort, a scan, a
    softmax, an update of part of the input): the shape rule, written once."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]


class FixedShape(Primitive):
    """A primitive whose output shape is its ``shape`` parameter (a fill, a reshape, a
    broadcast): the shape rule, written once. The subclass declares the ``shape``
    slot (and ``shapeless = False`` where the parameter comes from the input shapes
    the op was called with, as a reshape's does)."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [self.shape]
