"""The :class:`Primitive` contract.

A primitive is one operation of the graph: the node that an op function creates
and that the scheduler later runs. Subclasses declare their parameters in
``__slots__`` and implement what they can of

* ``eval_cpu(inputs) / eval_gpu(inputs)``: kernels that take input buffers
  (NumPy arrays on the CPU) and return one buffer or a tuple of buffers. A
  backend may register its own kernel for the class instead; that kernel wins.
* ``output_shapes(inputs)``: the output shapes from the input arrays, without
  running anything (needed by shapeless compile).
* ``vjp(primals, cotangents, argnums, outputs)``, ``jvp(primals, tangents,
  argnums)``, ``vmap(inputs, axes)``: the transform rules (below).
* ``to_expression(args)`` (element-wise primitives): how to write the operation
  in the codegen IR, which is what lets ``compile`` fuse it.

Parameters listed in ``__slots__`` (other than ``stream``) are the primitive's
identity: ``params()`` returns them, ``is_equivalent`` compares them, and the
graph printers show them.

Transform rules
---------------
The walkers of :mod:`lazyx.transforms` call a node's rules with its input
arrays (``primals``) and build the result from what the rules return. Rules
are written with ``lazyx.core`` ops, so their results are lazy graphs that can
be transformed again; :mod:`lazyx.transforms.rules` holds the shared moves
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

from .errors import KernelNotFoundError, TransformError

__all__ = ["Primitive"]


class Primitive:
    """Base class of every operation in the graph."""

    __slots__ = ("stream",)

    #: Public name, shown in errors and graphs. Defaults to the class name.
    name: str = "Primitive"
    #: Names of the parameter slots, gathered from the class hierarchy.
    _param_names: tuple[str, ...] = ()
    #: False for a primitive that carries no gradient (its vjp and jvp give zeros).
    differentiable: bool = True
    #: True for a primitive that exists only while a transform traces (no rules).
    transient: bool = False
    #: False when parameters fix the output shape to the traced input shapes (a
    #: reshape's target shape, a slice's bounds): ``compile(..., shapeless=True)``
    #: then refuses the function, naming the primitive, instead of replaying the
    #: node at other shapes.
    shapeless: bool = True

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

    def __init__(self, stream, *params):
        self.stream = stream
        # Parameters may be given positionally, in slot order, so most subclasses
        # need no __init__ of their own.
        if params:
            for n, v in zip(self._param_names, params):
                setattr(self, n, v)

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

    # -- shape inference ------------------------------------------------
    def output_shapes(self, inputs) -> list[tuple[int, ...]]:
        raise self._missing_rule("output_shapes", "(self, inputs)")

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
        from .registry import primitives
        info = primitives.get(type(self))
        who = f" (from {info.label})" if info is not None else ""
        return TransformError(f"[{self.name}.{method}] Not implemented for {self.name}{who}: "
                              f"implement {method}{signature}.")
