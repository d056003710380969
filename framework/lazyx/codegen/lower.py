"""A program written back as lazyx operations.

Each IR op names the ``lazyx.core`` function that defines its meaning
(:data:`lazyx.codegen.ir.OPS`), so a program can always be turned back into
the graph it came from. That one move serves three purposes:

* the reference evaluation of a fused kernel (the ``cpu-reference`` backend,
  and any case a native kernel does not cover): the graph's NumPy kernels run,
  so fused and unfused results agree by construction;
* the transform rules of the ``Compiled`` primitive (``vjp``, ``jvp``,
  ``vmap`` apply to the unfused graph);
* the check of every renderer against the reference in the tests.
"""

from __future__ import annotations

from .. import ops
from ..arguments import broadcast_shapes
from ..array import array
from .ir import OPS

from .ir import Program

__all__ = ["to_graph"]


def to_graph(program: Program, inputs, stream=None) -> list:
    """The outputs of ``program`` computed with lazyx operations on ``inputs``.

    Args:
        program: the fused program.
        inputs: one array per program input (any shapes that broadcast together).
        stream: the stream of the new nodes.
    Returns:
        one lazy array per program output, of the broadcast shape of the inputs.
    """
    values = {}
    shape = broadcast_shapes(*(x.shape for x in inputs)) if inputs else ()
    for e in program.nodes:
        op = e.op
        if op == "input":
            v = inputs[e.value]
        elif op == "const":
            v = array(e.value, dtype=e.dtype)
        elif op == "cast":
            v = ops.astype(values[id(e.args[0])], e.dtype, stream=stream)
        else:
            fn = getattr(ops, _FUNCTIONS[op])
            v = fn(*(values[id(a)] for a in e.args), stream=stream)
            if v.dtype is not e.dtype:
                v = ops.astype(v, e.dtype, stream=stream)
        values[id(e)] = v
    outs = []
    for o in program.outputs:
        v = values[id(o)]
        # An output that is an input or a constant still has the loop's shape.
        if v.shape != shape:
            v = ops.broadcast_to(v, shape, stream=stream)
        outs.append(v)
    return outs


_FUNCTIONS = {name: info.function for name, info in OPS.items()}
