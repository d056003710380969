"""Pictures of the lazy graph: Graphviz DOT (:func:`export_to_dot`) and an ASCII
diagram for the terminal (:func:`print_graph`).

Both draw the unevaluated part of the graph of some arrays: one node per
primitive application (a multi-output primitive is one node), labelled with the
primitive's name and parameters, and one node per array the walk stops at (an
evaluated array: an input or a constant). Shapes and dtypes are written on
every array.
"""

from __future__ import annotations

import os

from .array import array
from .dtypes import Dtype
from .errors import ArgumentError

__all__ = ["export_to_dot", "print_graph", "format_graph"]

#: Longest line of a box or label before it is cut.
MAX_WIDTH = 60


class _Node:
    __slots__ = ("index", "prim", "outputs", "inputs", "name")

    def __init__(self, index, prim, outputs, name=None):
        self.index = index
        self.prim = prim          # None for an evaluated array (a leaf)
        self.outputs = outputs    # the arrays it makes
        self.inputs = []          # (producer node, output index), in argument order
        self.name = name


def _walk(roots, names: dict) -> list:
    """The nodes of the graph of ``roots``, inputs before the nodes that use them."""
    order: list = []
    where: dict = {}  # id(array) -> (node, output index)

    # One node per application: the outputs of a multi-output primitive share a siblings
    # tuple (primitive objects are not compared: two nodes may share one).
    def key(a):
        return id(a._siblings) if a._siblings is not None else id(a)

    made: dict = {}
    for r in roots:
        if key(r) in made:
            continue
        stack = [(r, 0)]
        while stack:
            a, i = stack.pop()
            ins = a._inputs if a._prim is not None else ()
            while i < len(ins):
                x = ins[i]
                i += 1
                if key(x) not in made:
                    stack.append((a, i))
                    stack.append((x, 0))
                    break
            else:
                k = key(a)
                if k in made:
                    continue
                outs = list(a._siblings) if a._siblings is not None else [a]
                node = _Node(len(order), a._prim, outs, names.get(id(a)))
                made[k] = node
                order.append(node)
                for j, o in enumerate(outs):
                    where[id(o)] = (node, j)
                for x in ins:
                    node.inputs.append(where.get(id(x)) or (made[key(x)], 0))
    return order


def _prepare(args, kwargs):
    """The nodes, and the arrays to mark as outputs: ``[(array, label)]``.

    Positional arrays are the outputs (``output k``, or their name when one is
    also given as a keyword); a named array outside their graph is an output too.
    """
    names = {}
    for n, a in kwargs.items():
        if not isinstance(a, array):
            raise ArgumentError(f"{n} must be an array, got {type(a).__name__}.")
        names[id(a)] = n
    roots = []
    for a in args:
        if not isinstance(a, array):
            raise ArgumentError(f"Expected arrays, got {type(a).__name__}.")
        roots.append(a)
    ids = {id(a) for a in roots}
    extra = [a for a in kwargs.values() if id(a) not in ids]
    nodes = _walk(roots + extra, names)
    used = {id(src.outputs[j]) for node in nodes for src, j in node.inputs}
    marked = [(a, names.get(id(a)) or f"output {k}") for k, a in enumerate(roots)]
    marked += [(a, names[id(a)]) for a in extra if id(a) not in used]
    return nodes, marked, names


def _cut(text: str) -> str:
    return text if len(text) <= MAX_WIDTH else text[:MAX_WIDTH - 3] + "..."


def _type(a) -> str:
    return f"{a.shape} {a.dtype.name}"


def _leaf_value(a) -> str | None:
    """The value of a one-element evaluated array (a constant), as text."""
    if a._data is not None and a.size == 1:
        try:
            return repr(a.item())
        except Exception:
            return None
    return None


def _params(prim) -> list[str]:
    out = []
    for n in prim._param_names:
        v = getattr(prim, n, "?")
        out.append(_cut(f"{n}={v.name if isinstance(v, Dtype) else repr(v)}"))
    return out


def _title(node) -> str:
    if node.prim is None:
        a = node.outputs[0]
        value = _leaf_value(a)
        what = node.name or ("constant" if value is not None else "array")
        return f"#{node.index} {what}" + (f" = {value}" if value is not None else "")
    return f"#{node.index} {node.prim.name}"


# -- DOT ----------------------------------------------------------------------------
def _edge(node, j: int, names: dict) -> str:
    """The label of the edge that carries output ``j`` of ``node``."""
    a = node.outputs[j]
    tag = f"[{j}] " if len(node.outputs) > 1 else ""
    name = names.get(id(a)) if node.prim is not None else None
    return tag + _type(a) + (f" ({name})" if name else "")


def _dot_text(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def export_to_dot(file, *args, **kwargs) -> None:
    """Write the graph of unevaluated arrays in Graphviz DOT format.

    The graph takes in every unevaluated input of the given arrays, recursively,
    and stops at evaluated arrays. Primitives are boxes labelled with their name
    and parameters; evaluated arrays and the outputs are ellipses; edges carry
    the shape and dtype of the array that flows along them.

    Args:
        file (str or file): A path to write to, or an open text file.
        *args (array): The output arrays.
        **kwargs (array): Names for arrays in the graph (inputs or outputs), to
          make the picture easier to read.

    Example:
        >>> x = lazyx.core.array([1.0, 2.0])
        >>> lazyx.core.export_to_dot("graph.dot", lazyx.core.exp(x) + x, x=x)
    """
    nodes, marked, names = _prepare(args, kwargs)
    out = ["digraph lazyx {", "  node [fontname=\"monospace\"];"]
    for node in nodes:
        if node.prim is None:
            out.append(f'  n{node.index} [shape=ellipse, label="{_dot_text(_title(node))}'
                       f'\\n{_dot_text(_type(node.outputs[0]))}"];')
            continue
        label = "\\n".join(_dot_text(s) for s in [_title(node)] + _params(node.prim))
        out.append(f'  n{node.index} [shape=box, label="{label}"];')
        for src, j in node.inputs:
            out.append(f'  n{src.index} -> n{node.index} '
                       f'[label="{_dot_text(_edge(src, j, names))}"];')
    where = {id(o): (node, j) for node in nodes for j, o in enumerate(node.outputs)}
    for k, (a, label) in enumerate(marked):
        node, j = where[id(a)]
        out.append(f'  out{k} [shape=ellipse, style=bold, label="{_dot_text(label)}\\n'
                   f'{_dot_text(_type(a))}"];')
        out.append(f'  n{node.index} -> out{k} [label="{_dot_text(_edge(node, j, {}))}"];')
    out.append("}")
    text = "\n".join(out) + "\n"
    if isinstance(file, (str, os.PathLike)):
        with open(file, "w") as f:
            f.write(text)
    else:
        file.write(text)


# -- ASCII --------------------------------------------------------------------------
def format_graph(*args, **kwargs) -> str:
    """The ASCII diagram :func:`print_graph` prints, as a string."""
    nodes, marked, names = _prepare(args, kwargs)
    if not nodes:
        return ""
    outputs = {}
    for a, label in marked:
        outputs.setdefault(id(a), label)
    # Which values (node, output) are used, and by which entry lines.
    users: dict = {}
    for node in nodes:
        for src, j in node.inputs:
            users.setdefault((src.index, j), []).append(node.index)

    # The text of each box and where its edges enter and leave.
    boxes = []
    for node in nodes:
        text = [_title(node)]
        if node.prim is not None:
            text += ["  " + p for p in _params(node.prim)]
        exits = [j for j in range(len(node.outputs)) if (node.index, j) in users]
        for j, o in enumerate(node.outputs):
            mark = f"  => {outputs[id(o)]}" if id(o) in outputs else ""
            arrow = "-> " if node.prim is not None else ""
            text.append(_cut(f"{arrow}{_edge(node, j, {} if mark else names)}{mark}"))
        height = max(len(text), len(node.inputs) + len(exits))
        boxes.append((text, height, exits))

    # Line numbers: a box is a top border, its inner lines and a bottom border.
    first_line = []
    y = 0
    for text, height, _ in boxes:
        first_line.append(y + 1)
        y += height + 2
    total = y
    exit_line = {}
    entry_lines: dict = {}
    for node, (text, height, exits) in zip(nodes, boxes):
        top = first_line[node.index]
        for k, j in enumerate(exits):
            exit_line[(node.index, j)] = top + height - len(exits) + k
        for i, (src, j) in enumerate(node.inputs):
            entry_lines.setdefault((src.index, j), []).append(top + i)

    # One lane per used value, from its exit line to its last entry line.
    lane = {}
    free_from: list = []  # per lane, the first line it is free again
    for value in sorted(exit_line, key=exit_line.get):
        start, end = exit_line[value], max(entry_lines[value])
        for k, f in enumerate(free_from):
            if f <= start:
                break
        else:
            k = len(free_from)
            free_from.append(0)
        free_from[k] = end + 1
        lane[value] = k
    nlanes = len(free_from)
    x0 = 2 * nlanes + 2
    width = max(len(t) for text, _, _ in boxes for t in text) + 4
    canvas = [[" "] * (x0 + width) for _ in range(total)]

    for value, k in lane.items():
        col = 2 * k + 1
        start, ends = exit_line[value], entry_lines[value]
        end = max(ends)
        for yy in range(start + 1, end):
            canvas[yy][col] = "|"
    # Horizontal segments after every lane is down, so they cross lanes as "|".
    for value, k in lane.items():
        col = 2 * k + 1
        start, ends = exit_line[value], entry_lines[value]
        end = max(ends)
        _horizontal(canvas, start, col, x0, ".")
        canvas[start][x0] = "+"
        for yy in ends:
            _horizontal(canvas, yy, col, x0, "'" if yy == end else "+")
            canvas[yy][x0 - 1] = ">"

    for node, (text, height, _) in zip(nodes, boxes):
        top = first_line[node.index] - 1
        border = "+" + "-" * (width - 2) + "+"
        canvas[top][x0:x0 + width] = border
        canvas[top + height + 1][x0:x0 + width] = border
        for i in range(height):
            row = canvas[top + 1 + i]
            line = text[i] if i < len(text) else ""
            if row[x0] != "+":
                row[x0] = "|"
            row[x0 + 1:x0 + width - 1] = " " + line.ljust(width - 3)
            row[x0 + width - 1] = "|"
    return "\n".join("".join(r).rstrip() for r in canvas) + "\n"


def _horizontal(canvas, y: int, col: int, x0: int, corner: str) -> None:
    row = canvas[y]
    row[col] = corner
    for x in range(col + 1, x0):
        if row[x] != "|":
            row[x] = "-"


def print_graph(*args, file=None, **kwargs) -> None:
    """Draw the graph of unevaluated arrays as an ASCII diagram.

    Each primitive application is a box (``#k Name``, its parameters, and the
    shape and dtype of each output); each evaluated array it reads is a box too.
    Boxes are in evaluation order, inputs first; an arrow leaves a box on its
    left and enters each box that uses the array (``+`` where it branches off,
    ``'`` at its last use). The given arrays are marked ``=> output k`` (or their
    name).

    Args:
        *args (array): The output arrays.
        file (file, optional): Where to write (default: standard output).
        **kwargs (array): Names for the output arrays.

    Example:
        >>> x = lazyx.core.array([1.0, 2.0])
        >>> lazyx.core.print_graph(lazyx.core.exp(x) + x)
    """
    import sys
    (file or sys.stdout).write(format_graph(*args, **kwargs))
