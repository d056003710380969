"""The tape: a traced function as numbered slots and the nodes between them.

``compile`` records a function's graph on a tape (:mod:`.compile`), simplifies it and
hands it to element-wise fusion (:mod:`.fusion`), which rewrites its nodes; both
import the tape from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..primitive import Primitive

__all__ = ["Tape", "TapeNode"]


@dataclass(eq=False)
class TapeNode:
    """One node of a tape: ``prim`` applied to the values in slots ``inputs``,
    giving the values of slots ``outputs``."""

    prim: Primitive
    inputs: tuple
    outputs: tuple


@dataclass(eq=False)
class Tape:
    """A traced function as slots and nodes (see the module docstring)."""

    nodes: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    #: Whether the tape is replayed at other shapes (output_shapes per node).
    shapeless: bool = False
    #: Whether the traced graph had a custom function's node.
    custom: bool = False

    def new_slot(self, shape: tuple, dtype) -> int:
        """A new slot holding a value of ``shape`` and ``dtype``; its number."""
        self.shapes.append(tuple(shape))
        self.dtypes.append(dtype)
        return len(self.shapes) - 1

    def __repr__(self) -> str:
        lines = [f"Tape(inputs={self.inputs}, constants={list(self.constants)}, "
                 f"outputs={self.outputs})"]
        for n in self.nodes:
            lines.append(f"  {list(n.outputs)} = {n.prim!r}{list(n.inputs)}")
        return "\n".join(lines)
