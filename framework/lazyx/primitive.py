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
  argnums)``, ``vmap(inputs, axes)``: the transform rules.
* ``to_expression(args)`` (element-wise primitives): how to write the operation
  in the codegen IR, which is what lets ``compile`` fuse it.

Parameters listed in ``__slots__`` (other than ``stream``) are the primitive's
identity: ``params()`` returns them, ``is_equivalent`` compares them, and the
graph printers show them.
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
        raise TransformError(
            f"[{self.name}.output_shapes] {self.name} cannot infer output shapes: "
            f"implement output_shapes(self, inputs).")

    # -- transforms -----------------------------------------------------
    def vjp(self, primals, cotangents, argnums, outputs):
        raise TransformError(f"[{self.name}.vjp] Not implemented for {self.name}: "
                             f"implement vjp(self, primals, cotangents, argnums, outputs).")

    def jvp(self, primals, tangents, argnums):
        raise TransformError(f"[{self.name}.jvp] Not implemented for {self.name}: "
                             f"implement jvp(self, primals, tangents, argnums).")

    def vmap(self, inputs, axes):
        raise TransformError(f"[{self.name}.vmap] Not implemented for {self.name}: "
                             f"implement vmap(self, inputs, axes).")
