"""The transforms' own primitives, registered as a built-in plugin.

``TraceInput`` (a primal's handle in ``vjp``/``jvp``/``grad``), ``Placeholder``
(a mapped argument while ``vmap`` traces), ``CustomTransforms`` (one call of a
``custom_function`` or ``checkpoint``), ``Depends`` (an ordering edge),
``CompiledCall`` (one call of a compiled function: its whole plan in one node)
``CompileInput`` (an argument while ``compile`` traces) and ``Compiled`` (a fused
run of element-wise nodes, see :mod:`lazyx.transforms.fusion`) are
nodes of the graph like any op's, so they are registered through lazyx's own
entry point: ``lazyx info`` lists them, and the registry-wide tests check
their shape rules, kernels and transform rules.

Each evaluates itself (``eval_cpu``/``eval_gpu``): they forward or produce
other arrays' data, so no backend needs a kernel for them. ``Placeholder``'s
kernel raises on purpose: a placeholder has no values until ``vmap`` returns.
"""

from __future__ import annotations

import numpy as np

import lazyx.core as mx

from lazyx.hookspecs import hookimpl
from lazyx.transforms.autodiff import TraceInput
from lazyx.transforms.compile import CompiledCall, CompileInput
from lazyx.transforms.fusion import Compiled, fuse_arrays
from lazyx.transforms.custom import CustomTransforms, Depends, custom_function, depends
from lazyx.transforms.vmap import Placeholder

PRIMITIVES = [TraceInput, Placeholder, CustomTransforms, Depends, CompiledCall, CompileInput,
              Compiled]


@hookimpl
def lazyx_primitives():
    return PRIMITIVES


def _public_depends(inputs, dependencies):
    """Insert dependencies between arrays in the graph. The outputs are identical to
    ``inputs`` but with dependencies on ``dependencies``: they are evaluated only after
    them, and gradients flow to ``inputs`` alone.

    Args:
        inputs (array or Sequence[array]): The input array or arrays.
        dependencies (array or Sequence[array]): The array or arrays to insert
            dependencies on.

    Returns:
        array or list(array): The outputs which depend on dependencies (one array for
        one array, a list for a sequence, as in MLX).
    """
    deps = [dependencies] if isinstance(dependencies, mx.array) else list(dependencies)
    if isinstance(inputs, mx.array):
        return depends([inputs], deps)[0]
    return depends(list(inputs), deps)


@hookimpl
def lazyx_ops():
    return {"depends": _public_depends}


# -- examples for the registry-wide transform test ----------------------------------
def _data(shape, low=-1.5, high=1.5, seed=0):
    return np.random.default_rng(seed).uniform(low, high, shape)


def _gradient_of_a_function(x):
    # The gradient's graph reads the primal through its TraceInput (which stays in
    # the graph when the primal is unevaluated: an evaluated one is detached).
    return mx.grad(lambda y: mx.sum(mx.multiply(mx.sin(y), y)))(mx.cos(x))


def _vmapped(x):
    return mx.vmap(lambda y: mx.multiply(mx.sin(y), mx.sum(y)))(x)


@custom_function
def _plain(x, y):
    return mx.multiply(mx.sin(x), y)


@custom_function
def _with_rules(x, y):
    return mx.multiply(mx.sin(x), y)


@_with_rules.vjp
def _with_rules_vjp(primals, cotangent, output):
    x, y = primals
    return mx.multiply(cotangent, mx.multiply(mx.cos(x), y)), mx.multiply(cotangent, mx.sin(x))


@_with_rules.jvp
def _with_rules_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return mx.add(mx.multiply(tx, mx.multiply(mx.cos(x), y)), mx.multiply(ty, mx.sin(x)))


@_with_rules.vmap
def _with_rules_vmap(inputs, axes):
    x, y = inputs
    ax, ay = axes
    # Element-wise: batch both operands at axis 0 (an unbatched one broadcasts).
    x = x if ax is None else mx.moveaxis(x, ax, 0)
    y = y if ay is None else mx.moveaxis(y, ay, 0)
    if ax is None:
        x = mx.expand_dims(x, 0)
    if ay is None:
        y = mx.expand_dims(y, 0)
    return _with_rules(x, y), 0


_compiled = mx.compile(lambda x, y: mx.multiply(mx.sin(x), mx.exp(y)) + x)


def _compiled_in_vmap(x):
    # vmap traces its function, so the compiled function is traced too: its
    # CompileInput placeholders are part of what vmap replays.
    return mx.vmap(lambda y: _compiled(y, mx.cos(y)))(x)


def _fused(x, y):
    # The fusion pass on a lazy graph; force: also where no compiler is installed.
    (out,) = fuse_arrays([mx.multiply(mx.sin(x), y) + mx.exp(x)], force=True)
    return out


def _depends(x, y):
    return depends([mx.sin(x), mx.multiply(y, 2.0)], [mx.exp(y)])


@hookimpl
def lazyx_examples():
    x, y = _data((2, 3)), _data((2, 3), seed=1)
    return [
        (TraceInput, lambda: (_gradient_of_a_function, [x])),
        (Placeholder, lambda: (_vmapped, [x])),
        (CustomTransforms, lambda: (_plain, [x, y])),
        (CustomTransforms, lambda: (_with_rules, [x, y])),
        (CustomTransforms, lambda: (mx.checkpoint(_vmapped), [x])),
        (Depends, lambda: (_depends, [x, y])),
        (CompiledCall, lambda: (_compiled, [x, y])),
        (CompileInput, lambda: (_compiled_in_vmap, [x])),
        (Compiled, lambda: (_fused, [x, y])),
    ]
