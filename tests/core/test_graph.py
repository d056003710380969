"""Graph pictures: ``export_to_dot`` (Graphviz DOT) and ``print_graph`` (ASCII).

Both are read back here: the DOT text by a small parser of its statements, the
ASCII diagram by following its arrows, and each must give back the graph itself.
"""

import io
import re
import shutil
import subprocess

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError
from lazyx.graph import format_graph


def _graph():
    """A graph with a shared input, a constant, parameters and a two-output node."""
    x = mx.array([1.0, 2.0, 3.0])
    w = mx.array(np.ones((2, 3), dtype=np.float32))
    y = mx.exp(x) + x
    z = mx.sum(mx.reshape(y * w, (3, 2)), axis=0)
    q, r = mx.divmod(z, 2.0)
    return x, w, y, q, r + 1


def _edges(outputs):
    """(producer, consumer) pairs of the real graph, by object identity of the nodes."""
    pairs, seen, stack = [], set(), list(outputs)
    while stack:
        a = stack.pop()
        if a._prim is None or id(a._prim) in seen:
            continue
        seen.add(id(a._prim))
        for x in a._inputs:
            pairs.append((x._prim.name if x._prim is not None else "leaf", a._prim.name))
            stack.append(x)
    return sorted(pairs)


# -- DOT -------------------------------------------------------------------------------
_STATEMENT = re.compile(r'^\s*("?[\w.]+"?)\s*(->\s*("?[\w.]+"?))?\s*(\[(.*)\])?;$')
_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[\w.]+)')


def parse_dot(text: str):
    """Nodes ``{id: attrs}`` and edges ``[(src, dst, attrs)]`` of a flat DOT digraph."""
    lines = text.strip().splitlines()
    assert lines[0] == "digraph lazyx {" and lines[-1] == "}", text
    nodes, edges = {}, []
    for line in lines[1:-1]:
        m = _STATEMENT.match(line)
        assert m, f"not a DOT statement: {line!r}"
        attrs = {k: v.strip('"') for k, v in _ATTR.findall(m.group(5) or "")}
        if m.group(3):
            edges.append((m.group(1), m.group(3), attrs))
        elif m.group(1) != "node":
            assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
            nodes[m.group(1)] = attrs
    for src, dst, _ in edges:
        assert src in nodes and dst in nodes, f"edge {src} -> {dst} to an undeclared node"
    return nodes, edges


def test_dot_has_every_node_edge_shape_and_parameter(tmp_path):
    x, w, y, q, r1 = _graph()
    path = tmp_path / "g.dot"
    mx.export_to_dot(str(path), q, r1, x=x, y=y)
    nodes, edges = parse_dot(path.read_text())
    ops = {k: v["label"].split("\\n") for k, v in nodes.items() if v.get("shape") == "box"}
    names = sorted(label[0].split(" ", 1)[1] for label in ops.values())
    assert names == sorted(["Exp", "Add", "Multiply", "Reshape", "Reduce", "DivMod", "Add"])
    reshape = next(label for label in ops.values() if label[0].endswith("Reshape"))
    assert "shape=(3, 2)" in reshape
    reduce_ = next(label for label in ops.values() if label[0].endswith("Reduce"))
    assert "axes=(0,)" in reduce_ and "op='sum'" in reduce_
    leaves = {k: v["label"] for k, v in nodes.items() if v.get("shape") == "ellipse"
              and not k.startswith("out")}
    labels = sorted(leaves.values())
    assert any(lb.startswith("#0 x\\n(3,) float32") for lb in labels)  # the named input
    assert any("(2, 3) float32" in lb for lb in labels)               # w
    assert any("constant = 2.0" in lb for lb in labels) and any("constant = 1.0" in lb for lb in labels)
    outs = {k: v for k, v in nodes.items() if k.startswith("out")}
    assert sorted(v["label"] for v in outs.values()) == ["output 0\\n(2,) float32",
                                                          "output 1\\n(2,) float32"]
    # One edge per input of every node, each labelled with the shape and dtype it carries.
    by_id = {k: (v["label"].split("\\n")[0].split(" ", 1)[1] if v.get("shape") == "box" else "leaf")
             for k, v in nodes.items()}
    dot_pairs = sorted((by_id[s], by_id[d]) for s, d, _ in edges if not d.startswith("out"))
    assert dot_pairs == _edges([q, r1])
    assert all(re.search(r"\(\d*(, \d+)*,?\) \w+", a["label"]) for _, _, a in edges)
    assert any(a["label"] == "(3,) float32 (y)" for _, _, a in edges)   # the named intermediate
    assert any(a["label"] == "[0] (2,) float32" for _, _, a in edges)   # DivMod's first output
    # Exporting evaluates nothing.
    assert q._data is None and r1._data is None and y._data is None


def test_dot_to_a_file_object_and_of_evaluated_arrays():
    a = mx.array([1, 2])
    buf = io.StringIO()
    mx.export_to_dot(buf, a)
    nodes, edges = parse_dot(buf.getvalue())
    assert len(nodes) == 2 and len(edges) == 1  # the array itself, and the output
    with pytest.raises(ArgumentError):
        mx.export_to_dot(buf, [1, 2])


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_graphviz_reads_it(tmp_path):
    path = tmp_path / "g.dot"
    mx.export_to_dot(path, *_graph()[3:])
    subprocess.run(["dot", "-Tsvg", str(path), "-o", str(tmp_path / "g.svg")], check=True)


# -- ASCII -----------------------------------------------------------------------------
def read_ascii(text: str):
    """The boxes ``{index: title}`` and the edges ``[(producer, consumer)]`` of a diagram,
    found by following each arrow from the box it leaves down to the boxes it enters."""
    rows = text.splitlines()
    x0 = rows[0].index("+")  # the first box has no arrow beside its top
    boxes, owner = {}, {}
    inside, current = False, None
    for y, r in enumerate(rows):
        body = r[x0:]
        if body.startswith("+-"):
            inside, current = not inside, None if inside else current
            continue
        assert inside, f"line {y} is outside every box: {r!r}"
        if current is None:
            m = re.match(r"[|+] #(\d+) (.*?)\s*\|$", body)
            assert m, f"line {y}: a box without a title"
            current = int(m.group(1))
            assert current not in boxes, f"box #{current} drawn twice"
            boxes[current] = m.group(2)
        owner[y] = current
    edges = []
    for y, r in enumerate(rows):
        if r[x0] == "+" and not r[x0:].startswith("+-"):  # an arrow leaves this box
            col = r[:x0].index(".")
            assert set(r[col + 1:x0]) <= {"-", "|"}
            for yy in range(y + 1, len(rows)):
                c = rows[yy][col] if col < len(rows[yy]) else " "
                if c in "+'":
                    assert rows[yy][x0 - 1] == ">", f"line {yy}: an arrow without a head"
                    edges.append((owner[y], owner[yy]))
                    if c == "'":
                        break
                else:
                    assert c == "|", f"line {yy}: the arrow from line {y} is broken"
            else:
                raise AssertionError(f"the arrow from line {y} never ends")
    return boxes, edges


def _named(boxes, edges):
    name = {i: (t if t[0].isupper() else "leaf") for i, t in boxes.items()}
    return sorted((name[a], name[b]) for a, b in edges)


def test_ascii_draws_every_node_once_and_every_edge():
    x, w, y, q, r1 = _graph()
    text = format_graph(q, r1, x=x)
    boxes, edges = read_ascii(text)
    assert len(boxes) == 11 and sorted(boxes) == list(range(11))
    titles = {i: t.split(" = ")[0] for i, t in boxes.items()}
    assert titles[0] == "x"
    assert sorted(t for t in titles.values() if t[0].isupper()) == sorted(
        ["Exp", "Add", "Multiply", "Reshape", "Reduce", "DivMod", "Add"])
    assert text.count(">|") == len(edges)
    assert _named(titles, edges) == _edges([q, r1])
    assert "shape=(3, 2)" in text and "=> output 0" in text and "=> output 1" in text
    assert "-> [0] (2,) float32" in text and "-> [1] (2,) float32" in text
    assert q._data is None


def test_ascii_of_a_few_dozen_nodes_stays_readable():
    x = mx.array(np.arange(4.0, dtype=np.float32))
    ys = [x]
    for k in range(30):
        ys.append(mx.sin(ys[-1]) * ys[max(0, len(ys) - 3)])
    text = format_graph(ys[-1])
    boxes, edges = read_ascii(text)
    assert len(boxes) == len({id(a._prim) for a in _nodes(ys[-1])}) + 1
    assert _named(boxes, edges) == _edges([ys[-1]])
    assert max(len(r) for r in text.splitlines()) < 100  # lanes are reused


def _nodes(root):
    out, stack, seen = [], [root], set()
    while stack:
        a = stack.pop()
        if a._prim is None or id(a) in seen:
            continue
        seen.add(id(a))
        out.append(a)
        stack.extend(a._inputs)
    return out


def test_print_graph_prints_to_a_file_and_stdout(capsys):
    a = mx.array([1.0]) * 2
    buf = io.StringIO()
    mx.print_graph(a, file=buf)
    mx.print_graph(a)
    assert capsys.readouterr().out == buf.getvalue() == format_graph(a)
    assert "#2 Multiply" in buf.getvalue()
    assert format_graph() == ""
