"""The primitive that stands for a traced function's input while a transform traces it."""

from __future__ import annotations

from ..errors import TransformError
from ..primitive import Primitive, Shape

__all__ = ["InputPlaceholder"]


class InputPlaceholder(Primitive):
    """Base of the placeholders of ``compile`` (``CompileInput``) and ``vmap``
    (``Placeholder``): a node of a given shape with no data and no inputs.

    A subclass gives ``message``, the error raised when something evaluates one
    (``item()``, printing, ``eval`` or a NumPy conversion inside the function).
    """

    # ``seq`` keeps two placeholders of one shape distinct (they stand for different data).
    __slots__ = ("shape", "seq")
    shape: Shape
    seq: int
    # The replay replaces every placeholder, so no transform ever walks one.
    transient = True
    message = "Cannot evaluate a placeholder of a function being traced."

    def output_shapes(self, inputs):
        return [self.shape]

    def eval_cpu(self, inputs):
        raise TransformError(self.message)

    eval_gpu = eval_cpu
