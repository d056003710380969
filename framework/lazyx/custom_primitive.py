"""Primitives written in Python alone: a NumPy kernel, a shape rule and the rules you have.

:func:`custom_primitive` turns a NumPy function into an op backed by a real
:class:`~lazyx.primitive.Primitive` subclass, so it is evaluated by the
scheduler, transformed by ``grad``/``jvp``/``vmap``, listed by ``lazyx info``
and overridable per backend exactly like a built-in (``mx`` is ``lazyx.core``)::

    @mx.custom_primitive(elementwise=True)
    def axpby(x, y, *, alpha=1.0, beta=1.0):
        return alpha * x + beta * y           # the CPU kernel: NumPy in, NumPy out

    @axpby.vjp
    def axpby_vjp(primals, cotangent, output, *, alpha, beta):
        return cotangent * alpha, cotangent * beta

    z = axpby(mx.ones((2, 3)), mx.arange(3.0), alpha=2.0)

The kernel's positional parameters are the op's array inputs, its keyword-only
parameters the primitive's parameters (hashable values: they are its identity
for ``is_equivalent`` and show in graphs and errors). Their annotations
(``alpha: float = 1.0``) declare the primitive's parameter types, which
``export_function`` needs (see :mod:`lazyx.primitive`). The op function:

* converts its inputs to arrays and, unless ``promote=False``, casts them to
  their common dtype by MLX's rules (Python scalars are weakly typed);
* computes the output shape with the shape rule (``shape(*input_shapes,
  **params)``: a tuple for one output, a list of tuples for several; the
  broadcast of the inputs for ``elementwise=True``) and the output dtype with
  the dtype rule (``dtype(*input_dtypes, **params)``; default: the common
  dtype), so a bad shape raises at the call;
* adds one node. When it runs, the kernel receives NumPy arrays and the
  parameters as keywords; its result is converted to the promised dtype
  (NumPy's promotion differs from MLX's in places), and a wrong shape is a
  :class:`~lazyx.errors.KernelOutputError` naming the primitive.

Rules (each optional; a missing one is a :class:`~lazyx.errors.TransformError`
naming the primitive and the decorator that adds it, raised when a transform
needs it), with the parameters passed as keywords:

* ``@op.vjp``: ``rule(primals, cotangent, output, **params)`` returns one
  cotangent per input (None: zero). A cotangent of a broadcast shape is summed
  back to its input's shape.
* ``@op.jvp``: ``rule(primals, tangents, **params)`` returns the output's
  tangent; ``tangents`` has one entry per input (zeros for inputs that carry
  none). A tangent is broadcast to the output's shape.
* ``@op.vmap``: ``rule(inputs, axes, **params)`` returns ``(output, axis)``:
  ``axes[i]`` is the batch axis of ``inputs[i]`` or None. With
  ``elementwise=True`` it is made for you.

For several outputs, ``cotangent``/``output`` are lists and the ``jvp`` and
``vmap`` rules return one tangent, output and axis per output.
"""

from __future__ import annotations

import inspect
import types

import numpy as np

from . import dtypes as _dt
from . import ops as _ops
from . import registry
from .arguments import as_array, binary_operands, broadcast_shapes, cast
from .array import array, lazy, lazy_multi
from .device import to_stream
from .errors import ArgumentError, PluginError, ShapeError, TransformError
from .hookspecs import hookimpl
from .primitive import Primitive
from .providers import primitives
from .rules import align_batched, sum_to_shape

__all__ = ["custom_primitive", "CustomPrimitive", "PrimitiveOp", "register"]

_PY_SCALARS = (bool, int, float, complex)
_Dtype = _dt.Dtype
_ndarray = np.ndarray
_MISSING = object()

#: What each rule receives and returns, for the error of a missing one.
_RULE_SIGNATURES = {
    "vjp": "(primals, cotangent, output, **params) -> one cotangent per input",
    "jvp": "(primals, tangents, **params) -> the output's tangent",
    "vmap": "(inputs, axes, **params) -> (output, axis)",
    "output_shapes": "(*input_shapes, **params) -> the output shape",
}


class CustomPrimitive(Primitive):
    """Base class of the primitives that :func:`custom_primitive` makes.

    Each subclass has the kernel's keyword-only parameters as its slots and
    ``_op``, the :class:`PrimitiveOp` that holds the kernel and the rules.
    """

    # The dtypes the node promised (one, or a tuple for several outputs).
    __slots__ = ("_dtypes",)
    derived_slots = ("_dtypes",)
    _op: "PrimitiveOp" = None

    def keywords(self) -> dict:
        """The parameters as a ``{name: value}`` dict (what the kernel and rules get)."""
        return {n: getattr(self, n) for n in self._param_names}

    def eval_cpu(self, inputs):
        out = self._op.kernel(*inputs, **self.keywords())
        want = getattr(self, "_dtypes", None)
        if want is None:
            return out
        if type(want) is tuple:
            if type(out) not in (tuple, list) or len(out) != len(want):
                return out  # the scheduler reports the mismatch
            return tuple(_as_dtype(o, d) for o, d in zip(out, want))
        return _as_dtype(out, want)

    def output_shapes(self, inputs):
        shapes = self._op._shapes([x.shape for x in inputs], self.keywords())
        return [shapes] if type(shapes) is tuple else shapes

    def _missing_rule(self, method: str, signature: str) -> TransformError:
        return _missing_rule(type(self), method)


def _missing_rule(cls, method: str) -> TransformError:
    """The error for a rule that ``cls`` lacks: it names the primitive, its plugin when
    registered, and the decorator that adds the rule."""
    info = primitives.get(cls)
    who = f" (from {info.label})" if info is not None else ""
    op = cls._op.__name__
    if method == "output_shapes":
        how = (f"pass shape= to custom_primitive or decorate a shape rule with @{op}.shape: "
               f"rule{_RULE_SIGNATURES[method]}")
    else:
        how = f"add it with @{op}.{method}: rule{_RULE_SIGNATURES[method]}"
    return TransformError(f"[{cls.name}.{method}] Not implemented for {cls.name}{who}: {how}.")


def _as_dtype(out, dtype):
    if type(out) is _ndarray and out.dtype == dtype.np:
        return out
    if type(out) is not _ndarray and not (hasattr(out, "__cuda_array_interface__")
                                          or hasattr(out, "__dlpack__")):
        out = np.asarray(out)  # a Python or NumPy scalar
    # A device array (the kernel ran on CuPy arrays) keeps its device.
    return out.astype(dtype.np, copy=False)


# -- the rule adapters: the Primitive contract on one side, the user's rule on the other
def _vjp(self, primals, cotangents, argnums, outputs):
    single = len(outputs) == 1
    res = self._op._rules["vjp"](list(primals), cotangents[0] if single else list(cotangents),
                                 outputs[0] if single else list(outputs), **self.keywords())
    res = _per(res, len(primals), self, "vjp", "cotangent", "input")
    out = []
    for i in argnums:
        g = res[i]
        if g is not None and isinstance(g, array):
            shape = primals[i]._shape
            if g._shape != shape and _broadcasts_to(shape, g._shape):
                g = sum_to_shape(g, shape, stream=self.stream)
        out.append(g)
    return out


def _jvp(self, primals, tangents, argnums):
    full = [None] * len(primals)
    for i, t in zip(argnums, tangents):
        full[i] = t
    full = [_ops.zeros_like(p, stream=self.stream) if t is None else t
            for p, t in zip(primals, full)]
    shapes = self.output_shapes(primals)
    res = self._op._rules["jvp"](list(primals), full, **self.keywords())
    res = _per(res, len(shapes), self, "jvp", "tangent", "output")
    out = []
    for t, shape in zip(res, shapes):
        shape = tuple(shape)
        if t is not None and isinstance(t, array) and t._shape != shape \
                and _broadcasts_to(t._shape, shape):
            t = _ops.broadcast_to(t, shape, stream=self.stream)
        out.append(t)
    return out


def _vmap(self, inputs, axes):
    res = self._op._rules["vmap"](list(inputs), list(axes), **self.keywords())
    if type(res) not in (tuple, list) or len(res) != 2:
        raise TransformError(f"[{self.name}.vmap] The rule must return (outputs, axes), "
                             f"got {type(res).__name__}.")
    outs, oaxes = res
    if type(outs) not in (tuple, list):
        outs, oaxes = [outs], [oaxes]
    return list(outs), list(oaxes)


def _vmap_elementwise(self, inputs, axes):
    ins, k = align_batched(inputs, axes)
    out = self._op(*ins, stream=self.stream, **self.keywords())
    if type(out) is list:
        return out, [k] * len(out)
    return [out], [k]


_ADAPTERS = {"vjp": _vjp, "jvp": _jvp, "vmap": _vmap}


def _per(res, n: int, prim, rule: str, what: str, of: str) -> list:
    if n == 1 and type(res) not in (tuple, list):
        return [res]
    if type(res) not in (tuple, list) or len(res) != n:
        got = f"{len(res)} values" if type(res) in (tuple, list) else type(res).__name__
        raise TransformError(f"[{prim.name}.{rule}] The rule must return one {what} per {of} "
                             f"({n}), got {got}.")
    return list(res)


def _broadcasts_to(small: tuple, big: tuple) -> bool:
    if len(small) > len(big):
        return False
    return all(s == 1 or s == b for s, b in zip(small[::-1], big[::-1]))


# -- the op ------------------------------------------------------------------------
class PrimitiveOp:
    """An op function backed by a primitive made from a NumPy kernel.

    Call it like any op (``op(x, y, alpha=2.0, stream=None)``). Attributes:

    * ``primitive``: the :class:`CustomPrimitive` subclass (register it with the
      ``lazyx_primitives`` hook, override its kernel per backend with
      ``lazyx_kernels``);
    * ``kernel``: the NumPy kernel;
    * decorators ``shape``, ``dtype``, ``vjp``, ``jvp`` and ``vmap`` that set a rule
      and return the op, so one name can be reused for every rule.
    """

    def __init__(self, kernel, *, name=None, shape=None, dtype=None, elementwise=False,
                 promote=True, differentiable=True):
        if not callable(kernel):
            raise ArgumentError(f"custom_primitive expects a function, got {kernel!r}.")
        self.kernel = kernel
        self.__name__ = getattr(kernel, "__name__", "custom")
        self.__qualname__ = getattr(kernel, "__qualname__", self.__name__)
        self.__module__ = getattr(kernel, "__module__", None)
        self.__doc__ = getattr(kernel, "__doc__", None)
        inputs, params, defaults = _split_signature(kernel, self.__name__)
        self.inputs = inputs
        self._n = len(inputs)
        self._defaults = defaults
        self._required = [p for p in params if defaults[p] is _MISSING]
        self._elementwise = elementwise
        self._promote = promote
        self._binary = promote and len(inputs) == 2
        self._shape_rule = shape
        self._dtype_rule = dtype
        self._rules: dict = {}
        cls_name = name or "".join(w[:1].upper() + w[1:] for w in self.__name__.split("_"))
        # The kernel's annotations of its keyword-only parameters declare the
        # primitive's parameters (what import_function checks a file against).
        kernel_params = inspect.signature(kernel).parameters
        annotations = {p: kernel_params[p].annotation for p in params
                       if kernel_params[p].annotation is not inspect.Parameter.empty}
        self.primitive = type(cls_name, (CustomPrimitive,), {
            "__slots__": tuple(params), "__module__": self.__module__,
            "__qualname__": cls_name, "__doc__": f"The primitive of ``{self.__name__}``.",
            "__annotations__": annotations, "_op": self, "differentiable": differentiable,
        })
        if params:
            self.primitive.__init__ = _make_init(params)
        if elementwise:
            self.primitive.vmap = _vmap_elementwise
        stream = inspect.Parameter("stream", inspect.Parameter.KEYWORD_ONLY, default=None)
        sig = inspect.signature(kernel)
        self.__signature__ = sig.replace(parameters=list(sig.parameters.values()) + [stream])

    def __repr__(self) -> str:
        return f"<custom primitive op {self.__name__} ({self.primitive.name})>"

    # -- rules, as decorators ----------------------------------------------------
    def shape(self, rule):
        """Set the shape rule ``rule(*input_shapes, **params)``; returns the op."""
        self._shape_rule = rule
        return self

    def dtype(self, rule):
        """Set the dtype rule ``rule(*input_dtypes, **params)``; returns the op."""
        self._dtype_rule = rule
        return self

    def vjp(self, rule):
        """Set the ``vjp`` rule ``rule(primals, cotangent, output, **params)``; returns the op."""
        return self._set("vjp", rule)

    def jvp(self, rule):
        """Set the ``jvp`` rule ``rule(primals, tangents, **params)``; returns the op."""
        return self._set("jvp", rule)

    def vmap(self, rule):
        """Set the ``vmap`` rule ``rule(inputs, axes, **params)``; returns the op."""
        return self._set("vmap", rule)

    def _set(self, which: str, rule):
        if not callable(rule):
            raise ArgumentError(f"@{self.__name__}.{which} decorates a function, got {rule!r}.")
        self._rules[which] = rule
        setattr(self.primitive, which, _ADAPTERS[which])
        return self

    # -- the call ----------------------------------------------------------------
    def _shapes(self, shapes: list, kw: dict):
        rule = self._shape_rule
        if rule is None:
            if not self._elementwise:
                raise _missing_rule(self.primitive, "output_shapes")
            return broadcast_shapes(*shapes) if shapes else ()
        out = rule(*shapes, **kw)
        if type(out) is tuple:
            return out
        if type(out) is list and out and all(type(s) in (tuple, list) for s in out):
            return [tuple(s) for s in out]
        raise ShapeError(f"The shape rule of {self.primitive.name} must return a tuple (one "
                         f"output) or a list of tuples (several), got {out!r}.")

    def _operands(self, args, stream):
        n = self._n
        if len(args) != n:
            raise ArgumentError(f"{self.__name__} takes {n} array input(s) "
                                f"({', '.join(self.inputs)}), got {len(args)}.")
        if n == 2 and self._promote:
            a, b, d = binary_operands(args[0], args[1], stream)
            return (a, b), d
        ins = tuple(as_array(x) if type(x) is not array else x for x in args)
        if not ins:
            return ins, None
        d = ins[0]._dtype
        if self._promote and n > 1:
            d = _common_dtype(args)
            ins = tuple(x if x._dtype is d else (
                as_array(a, d) if isinstance(a, _PY_SCALARS) else cast(x, d, stream))
                for x, a in zip(ins, args))
        return ins, d

    def _bind(self, kwargs: dict) -> dict:
        """The parameters: the defaults updated with ``kwargs``, all of them given."""
        if kwargs.keys() == self._defaults.keys():
            return kwargs
        kw = {**self._defaults, **kwargs}
        if len(kw) != len(self._defaults):
            unknown = sorted(set(kwargs) - set(self._defaults))
            raise ArgumentError(f"{self.__name__} got unexpected keyword argument(s) "
                                f"{unknown}; its parameters are {list(self._defaults)}.")
        missing = [p for p in self._required if kw[p] is _MISSING]
        if missing:
            raise ArgumentError(f"{self.__name__} is missing the parameter(s) {missing}.")
        return kw

    def __call__(self, *args, stream=None, **kwargs):
        kw = self._bind(kwargs) if kwargs or self._required else self._defaults
        # The common cases without detours: two promoted inputs, an element-wise shape.
        if self._binary and len(args) == 2:
            a, b, d = binary_operands(args[0], args[1], stream)
            ins = (a, b)
        else:
            ins, d = self._operands(args, stream)
        if self._shape_rule is None and self._elementwise:
            n = len(ins)
            shapes = ins[0]._shape if n == 1 else \
                broadcast_shapes(ins[0]._shape, ins[1]._shape) if n == 2 else \
                broadcast_shapes(*[x._shape for x in ins]) if n else ()
        else:
            shapes = self._shapes([x._shape for x in ins], kw)
        rule = self._dtype_rule
        if rule is not None:
            d = rule(*[x._dtype for x in ins], **kw)
        elif d is None:
            raise ArgumentError(f"{self.__name__} has no array inputs: give it a dtype rule.")
        prim = self.primitive(to_stream(stream), **kw)
        if type(shapes) is tuple:
            if not isinstance(d, _Dtype):
                d = _dt.to_dtype(d)
            prim._dtypes = d
            return lazy(shapes, d, prim, ins)
        dts = [_dt.to_dtype(x) for x in d] if type(d) in (tuple, list) \
            else [_dt.to_dtype(d)] * len(shapes)
        if len(dts) != len(shapes):
            raise ArgumentError(f"The dtype rule of {self.primitive.name} gave {len(dts)} "
                                f"dtypes for {len(shapes)} outputs.")
        prim._dtypes = tuple(dts)
        return lazy_multi(shapes, dts, prim, ins)


def _make_init(params: list):
    """``__init__(self, stream, *params)`` with one assignment per parameter: the
    generic loop of ``Primitive.__init__`` costs a microsecond per node."""
    body = "".join(f"\n    self.{p} = {p}" for p in params)
    source = f"def __init__(self, stream, {', '.join(params)}):\n    self.stream = stream{body}\n"
    namespace: dict = {}
    exec(source, namespace)  # the names are identifiers: they come from a signature
    return namespace["__init__"]


def _split_signature(kernel, name: str):
    """The kernel's array inputs (positional), its parameters (keyword-only) and their
    defaults (``_MISSING`` for required ones)."""
    inputs, params, defaults = [], [], {}
    reserved = set(dir(Primitive)) | {"stream", "keywords"}
    for p in inspect.signature(kernel).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            inputs.append(p.name)
        elif p.kind is p.KEYWORD_ONLY:
            if p.name in reserved or p.name.startswith("_"):
                raise ArgumentError(f"custom_primitive {name}: the parameter name {p.name!r} is "
                                    f"reserved; rename it.")
            params.append(p.name)
            defaults[p.name] = _MISSING if p.default is p.empty else p.default
        else:
            raise ArgumentError(f"custom_primitive {name}: the kernel takes its array inputs "
                                f"as positional parameters and the primitive's parameters as "
                                f"keyword-only ones; *{p.name} / **{p.name} are not supported.")
    return inputs, params, defaults


def _common_dtype(args) -> _dt.Dtype:
    """MLX's promotion of several operands; Python scalars are weakly typed."""
    strong = None
    weak = []
    for a in args:
        if isinstance(a, _PY_SCALARS):
            weak.append(type(a))
        else:
            d = a._dtype if isinstance(a, array) else as_array(a)._dtype
            strong = d if strong is None else _dt.promote_types(strong, d)
    if strong is None:
        return _dt._result_type(*args)
    for t in weak:
        strong = _dt.weak_scalar_dtype(strong, t)
    return strong


def custom_primitive(kernel=None, /, *, name: str | None = None, shape=None, dtype=None,
                     elementwise: bool = False, promote: bool = True,
                     differentiable: bool = True):
    """Make an op, backed by a new primitive, from a NumPy kernel.

    Use it as ``@custom_primitive`` or ``@custom_primitive(...)``. The kernel's
    positional parameters are the array inputs, its keyword-only parameters the
    primitive's parameters. Add rules with the returned op's decorators
    ``.vjp``, ``.jvp``, ``.vmap`` (and ``.shape``, ``.dtype``).

    Args:
        kernel (Callable): ``kernel(*numpy_inputs, **params)`` returning a NumPy
          array (or a tuple of them for several outputs).
        name (str, optional): The primitive's name. Default: the kernel's name in
          CamelCase (``axpby`` makes ``Axpby``).
        shape (Callable, optional): ``shape(*input_shapes, **params)``: the output
          shape (a tuple), or a list of shapes for several outputs.
        dtype (Callable, optional): ``dtype(*input_dtypes, **params)``: the output
          dtype(s). Default: the inputs' common dtype.
        elementwise (bool): The op broadcasts its inputs and works element by
          element: the shape rule is the broadcast and ``vmap`` comes for free.
        promote (bool): Cast the inputs to their common dtype (MLX's promotion,
          weak Python scalars). Default ``True``.
        differentiable (bool): ``False`` for an op without a gradient (integer
          results, comparisons): the registry-wide tests then check that its
          gradients are zero.

    Returns:
        PrimitiveOp: The op function; ``op.primitive`` is the primitive class.

    Example:
        >>> @custom_primitive(elementwise=True)
        ... def axpby(x, y, *, alpha=1.0, beta=1.0):
        ...     return alpha * x + beta * y
        >>> axpby(lazyx.core.ones(3), 2.0, beta=3.0).tolist()
        [7.0, 7.0, 7.0]
    """
    options = dict(name=name, shape=shape, dtype=dtype, elementwise=elementwise,
                   promote=promote, differentiable=differentiable)
    if kernel is None:
        return lambda k: PrimitiveOp(k, **options)
    return PrimitiveOp(kernel, **options)


def register(*ops, plugin: str | None = None, install: bool | str = False):
    """Register custom primitives without an entry point (a notebook, a script, a test).

    Their primitives are recorded like a plugin's: ``lazyx info`` lists them,
    errors name the plugin, and ``lazyx.core.kernel_provider`` knows them.

    Args:
        *ops (PrimitiveOp): Ops made by :func:`custom_primitive`.
        plugin (str, optional): The plugin's name (default: the module of the first
          op, ``"__main__"`` in a notebook). A name can be registered once.
        install (bool or str): ``True`` installs each op as ``lazyx.core.<name>``;
          a string ``"ns"`` installs it as ``lazyx.core.ns.<name>``.

    Returns:
        PluginInfo: What was registered.
    """
    if not registry.loaded():
        raise PluginError("register: the plugins are not loaded yet; import lazyx.core first "
                          "(the ops are installed into it).")
    for op in ops:
        if not isinstance(op, PrimitiveOp):
            raise ArgumentError(f"register expects ops made by custom_primitive, got {op!r}.")
    name = plugin or (ops[0].__module__ if ops else None) or "__main__"
    module = types.ModuleType(f"lazyx-custom-primitives:{name}")

    @hookimpl
    def lazyx_primitives():
        return [op.primitive for op in ops]

    @hookimpl
    def lazyx_ops():
        if not install:
            return {}
        prefix = "" if install is True else f"{install}."
        return {f"{prefix}{op.__name__}": op for op in ops}

    module.lazyx_primitives = lazyx_primitives
    module.lazyx_ops = lazyx_ops
    return registry.register_plugin(module, name, "(not installed)", "")
