"""``check_primitive``: check a plugin's primitive the way lazyx checks its own.

On example inputs it runs every check below, collects the failures and
raises one ``AssertionError`` that lists each by name:

* ``graph``: the function builds a graph (of the primitive, when a class is given);
* ``shape rule``: every node's ``output_shapes`` gives the shapes its op promised;
* ``kernel on <backend>``: the graph evaluates on every available backend (the
  scheduler checks each output's shape and dtype) and agrees with the first;
* ``vjp``: against central finite differences, in float64, with respect to
  the floating inputs (for ``differentiable = False``: the cotangents are zero);
* ``jvp``: against ``vjp`` (``<u, J v> == <J^T u, v>``; or zero tangents);
* ``vmap``: against a Python loop, batched at axis 0 and at the last axes;
* ``compile``: ``lazyx.core.compile(fn)`` against eager evaluation (skipped,
  with the reason, while ``lazyx.core.compile`` does not exist).

``skip={"jvp", ...}`` leaves out the checks of rules a primitive leaves out on
purpose (:data:`SKIPPABLE`); the report lists them as skipped, never as passed.
Without ``vjp``, ``jvp`` is checked against finite differences instead; for a
non-differentiable primitive, ``zero gradients`` checks only the rules not skipped.
"""

from __future__ import annotations

import numpy as np

import lazyx.core as mx

from .. import registry as _registry
from .. import scheduler as _scheduler
from ..array import array
from ..errors import ArgumentError
from ..primitive import Primitive
from .checks import (TOLERANCES, check_jvp_vjp, check_vjp_fd, check_vmap_loop, rng,
                     to_lazyx)
from .environment import available_backends, running_on

__all__ = ["check_primitive", "CheckReport", "check_zero_gradients", "batched_examples",
           "SKIPPABLE"]

#: The checks ``check_primitive(..., skip=...)`` can leave out, with what each checks.
#: (``graph`` cannot be skipped: every other check runs on the graph it builds.)
SKIPPABLE = {
    "shape rule": "output_shapes against the shapes the op promised",
    "kernels": "the kernel on every available backend",
    "vjp": "vjp against finite differences",
    "jvp": "jvp against vjp (against finite differences when vjp is skipped)",
    "vmap": "vmap against a Python loop",
    "compile": "lazyx.core.compile against eager evaluation",
}

# Examples of a batch: scaled copies keep signs, order and most domains.
FACTORS = (1.0, 0.9, 1.1)
# Finite-difference settings by the least precise floating dtype in the graph.
PRECISE = {"eps": 1e-6, "rtol": 1e-5, "atol": 1e-7, "jvp_rtol": 1e-9}
IMPRECISE = {"eps": 1e-3, "rtol": 2e-2, "atol": 2e-3, "jvp_rtol": 1e-4}


class CheckReport:
    """What :func:`check_primitive` found: the names of the checks that passed, and
    ``{name: reason}`` for those skipped and those that failed."""

    def __init__(self, subject: str):
        self.subject = subject
        self.passed: list[str] = []
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, str] = {}

    def run(self, name: str, check, *args) -> bool:
        """Run ``check(*args)``; record its outcome under ``name``."""
        try:
            check(*args)
        except _Skip as s:
            self.skipped[name] = str(s)
            return True
        except Exception as exc:  # every failure is reported, none stops the others
            text = str(exc).strip() or type(exc).__name__
            if not isinstance(exc, AssertionError):
                text = f"{type(exc).__name__}: {text}"
            self.failed[name] = text
            return False
        self.passed.append(name)
        return True

    def __str__(self) -> str:
        lines = [f"check_primitive({self.subject}): {len(self.passed)} passed, "
                 f"{len(self.failed)} failed, {len(self.skipped)} skipped"]
        if self.passed:
            lines.append("  passed: " + ", ".join(self.passed))
        for name, why in self.failed.items():
            lines.append(f"  FAILED {name}: " + why.replace("\n", "\n    "))
        for name, why in self.skipped.items():
            lines.append(f"  skipped {name}: {why}")
        return "\n".join(lines)

    __repr__ = __str__


class _Skip(Exception):
    pass


def check_primitive(prim_or_op, *example_inputs, batch_ints: bool = True,
                    backends=None, skip=()) -> CheckReport:
    """Check a primitive as the registry-wide tests check the built-in ones.

    Args:
        prim_or_op: The op function (or any function of arrays that uses the
          primitive), called as ``prim_or_op(*example_inputs)``; or a registered
          :class:`~lazyx.primitive.Primitive` subclass, with no inputs: its
          plugin's ``lazyx_examples`` are used.
        *example_inputs: NumPy or lazyx arrays. Floating ones are the
          differentiated inputs (in float64 for the gradient checks); the others
          (indices, masks) are held fixed.
        batch_ints (bool): Batch integer inputs for the ``vmap`` check by
          reversing them (``False``: by repeating them, for indices that are only
          valid in order).
        backends (list(str), optional): The backends to evaluate on (default:
          every available one).
        skip (set(str), optional): Checks to leave out on purpose, for rules the
          primitive does not have (names from :data:`SKIPPABLE`: ``"shape rule"``,
          ``"kernels"``, ``"vjp"``, ``"jvp"``, ``"vmap"``, ``"compile"``). They are
          reported as skipped, not passed.

    Returns:
        CheckReport: The checks that passed and those skipped (with the reason).

    Raises:
        AssertionError: Listing every check that failed, each by name.
        ArgumentError: ``skip`` names a check that does not exist.

    Example:
        >>> check_primitive(axpby, np.ones((2, 3)), np.arange(3.0))
        >>> check_primitive(no_forward_mode, x, skip={"jvp"})
    """
    skip = _skipped_checks(skip)
    if isinstance(prim_or_op, type) and issubclass(prim_or_op, Primitive):
        cls = prim_or_op
        if example_inputs:
            raise ArgumentError(f"check_primitive({cls.name}, ...): pass the op function that "
                                f"builds {cls.name} nodes, not the class, with example inputs.")
        report = CheckReport(cls.name)
        examples = _registry.examples().get(cls)
        if not examples:
            report.failed["examples"] = (f"{cls.name} has no example: register (cls, make) "
                                         f"with its plugin's lazyx_examples hook, or call "
                                         f"check_primitive(op, *inputs).")
        for k, (make, _info) in enumerate(examples or ()):
            made = make()
            options = made[2] if len(made) > 2 else {}
            _check(report, made[0], list(made[1]), cls,
                   options.get("batch_ints", batch_ints), backends,
                   f"example {k}: " if len(examples) > 1 else "", skip)
    else:
        if not callable(prim_or_op):
            raise ArgumentError(f"check_primitive expects an op function or a Primitive "
                                f"subclass, got {prim_or_op!r}.")
        report = CheckReport(getattr(prim_or_op, "__name__", repr(prim_or_op)))
        _check(report, prim_or_op, list(example_inputs), None, batch_ints, backends, "", skip)
    if report.failed:
        raise AssertionError(str(report))
    return report


def _skipped_checks(skip) -> frozenset:
    """``skip`` as a set of check names; an unknown name is an error naming the valid ones."""
    names = {skip} if isinstance(skip, str) else set(skip or ())
    unknown = sorted(n for n in names if n not in SKIPPABLE)
    if unknown:
        raise ArgumentError(
            f"check_primitive(skip=...): unknown check {', '.join(map(repr, unknown))}; the "
            f"checks that can be skipped are {', '.join(map(repr, SKIPPABLE))}.")
    return frozenset(names)


ON_REQUEST = "left out on purpose (skip=...)"


# -- the checks ------------------------------------------------------------------------
def _check(report, fn, args, cls, batch_ints, backends, prefix, skip=frozenset()):
    args = [np.asarray(a) for a in args]
    state: dict = {}
    if not report.run(prefix + "graph", _graph, fn, args, cls, state):
        return

    def run(name, check, *rest):
        if name in skip:
            report.skipped[prefix + name] = ON_REQUEST
        else:
            report.run(prefix + name, check, *rest)

    run("shape rule", _shape_rules, state["outputs"])
    if "kernels" in skip:
        report.skipped[prefix + "kernels"] = ON_REQUEST
    else:
        names = available_backends() if backends is None else list(backends)
        results: dict = {}
        for name in names:
            report.run(f"{prefix}kernel on {name}", _kernels, fn, args, name, results)
    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    if state["differentiable"]:
        if floats:
            tol = _tolerance(fn, args, floats)
            run("vjp", _vjp, fn, args, floats, tol)
            run("jvp", _jvp_fd if "vjp" in skip else _jvp, fn, args, floats, tol)
        else:
            for name in ("vjp", "jvp"):
                report.skipped[prefix + name] = ON_REQUEST if name in skip else \
                    "no floating input to differentiate"
    else:
        for name in ("vjp", "jvp"):
            if name in skip:
                report.skipped[prefix + name] = ON_REQUEST
        rules = tuple(r for r in ("vjp", "jvp") if r not in skip)
        if rules:
            report.run(prefix + "zero gradients", check_zero_gradients, fn, args, "", rules)
    run("vmap", _vmap, fn, args, floats, batch_ints)
    run("compile", _compiled, fn, args)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _nodes(outputs) -> list:
    """One array per unevaluated node of the graph of ``outputs``."""
    out, seen = [], set()
    stack = list(outputs)
    while stack:
        a = stack.pop()
        if id(a) in seen or a._prim is None:
            continue
        for s in a._siblings or (a,):
            seen.add(id(s))
        out.append(a)
        stack.extend(a._inputs)
    return out


def _graph(fn, args, cls, state):
    outs = _outputs(fn(*[to_lazyx(a) for a in args]))
    bad = [type(o).__name__ for o in outs if not isinstance(o, array)]
    assert not bad, f"the function returned {bad}, not arrays"
    nodes = _nodes(outs)
    classes = {type(a._prim) for a in nodes}
    if cls is not None:
        assert cls in classes, f"the example's graph has no {cls.name} node"
    # The primitive under test is the one that makes the outputs.
    made = {type(o._prim) for o in outs if o._prim is not None}
    state["outputs"] = outs
    state["differentiable"] = all(c.differentiable for c in (made or classes))


def _shape_rules(outputs):
    wrong = []
    for a in _nodes(outputs):
        expected = [s._shape for s in a._siblings] if a._siblings is not None else [a._shape]
        got = [tuple(s) for s in a._prim.output_shapes(a._inputs)]
        if got != expected:
            wrong.append(f"{a._prim!r}.output_shapes gave {got}, its op promised {expected}")
    assert not wrong, "; ".join(wrong)


def _kernels(fn, args, name, results):
    check, _scheduler.check_shape_rules = _scheduler.check_shape_rules, True
    try:
        with running_on(name):
            outs = _outputs(fn(*[to_lazyx(a) for a in args]))
            mx.eval(outs)
            got = [(o.dtype, np.array(o)) for o in outs]
    finally:
        _scheduler.check_shape_rules = check
    if not results:
        results.update(backend=name, values=got)
        return
    for k, ((d, g), (_, ref)) in enumerate(zip(got, results["values"])):
        _assert_same(g, ref, d, f"output {k} differs from backend {results['backend']!r}")


def _assert_same(got, want, dtype, msg):
    assert got.shape == want.shape, f"{msg}: shape {got.shape} vs {want.shape}"
    if dtype.kind in "fc":
        r, a = TOLERANCES[dtype.name]
        wide = np.complex128 if dtype.kind == "c" else np.float64
        np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=r, atol=a,
                                   equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(got, want, err_msg=msg)


def _of_floats(fn, args, floats):
    def f(*xs):
        full = [to_lazyx(a) for a in args]
        for i, x in zip(floats, xs):
            full[i] = x
        return fn(*full)
    return f


def _tolerance(fn, args, floats) -> dict:
    """Precise finite differences when the float64 graph stays in float64."""
    xs = [mx.array(args[i].astype(np.float64), dtype=mx.float64) for i in floats]
    try:
        outs = _outputs(_of_floats(fn, args, floats)(*xs))
    except Exception:
        return IMPRECISE
    dtypes = {a.dtype for a in _nodes(outs) if a.dtype.kind in "fc"}
    dtypes |= {o.dtype for o in outs if o.dtype.kind in "fc"}
    return PRECISE if dtypes <= {mx.float64} else IMPRECISE


def _vjp(fn, args, floats, tol):
    xs = [args[i].astype(np.float64) for i in floats]
    check_vjp_fd(_of_floats(fn, args, floats), *xs, eps=tol["eps"], rtol=tol["rtol"],
                 atol=tol["atol"], msg="vjp")


def _jvp(fn, args, floats, tol):
    xs = [args[i].astype(np.float64) for i in floats]
    check_jvp_vjp(_of_floats(fn, args, floats), *xs, rtol=tol["jvp_rtol"],
                  atol=tol["jvp_rtol"], msg="jvp")


def _jvp_fd(fn, args, floats, tol):
    """``jvp`` against central finite differences along a random direction (the check
    of ``jvp`` when ``vjp`` is left out, so ``<u, J v> == <J^T u, v>`` cannot be used)."""
    f = _of_floats(fn, args, floats)
    gen = rng(3)
    xs = [args[i].astype(np.float64) for i in floats]
    vs = [gen.standard_normal(x.shape) for x in xs]
    as64 = [mx.array(x, dtype=mx.float64) for x in xs]
    outs, tangents = mx.jvp(f, as64, [mx.array(v, dtype=mx.float64) for v in vs])
    eps = tol["eps"]

    def at(sign):
        return _outputs(f(*[mx.array(x + sign * eps * v, dtype=mx.float64)
                            for x, v in zip(xs, vs)]))

    plus, minus = at(1.0), at(-1.0)
    for k, (o, t, p, m) in enumerate(zip(_outputs(outs), tangents, plus, minus)):
        assert t.shape == o.shape, f"jvp: tangent {k} has shape {t.shape}, output {o.shape}"
        if o.dtype.kind not in "fc":
            continue
        fd = (np.array(p, dtype=np.float64) - np.array(m, dtype=np.float64)) / (2 * eps)
        np.testing.assert_allclose(np.array(t, dtype=np.float64), fd, rtol=tol["rtol"],
                                   atol=tol["atol"],
                                   err_msg=f"jvp: tangent {k} vs finite differences")


def check_zero_gradients(fn, args, msg: str = "", rules=("vjp", "jvp")):
    """Assert that ``fn`` gives zero cotangents (``"vjp"`` in ``rules``) and tangents
    (``"jvp"``) for every input (the check of a non-differentiable primitive)."""
    pre = f"{msg}: " if msg else ""
    arrays = [to_lazyx(a) for a in args]
    gen = rng(5)
    outs = _outputs(fn(*arrays))
    if "vjp" in rules:
        cots = [mx.array(gen.standard_normal(o.shape), dtype=o.dtype) if o.dtype.kind in "fc"
                else mx.zeros_like(o) for o in outs]
        _, grads = mx.vjp(fn, arrays, cots)
        for k, g in enumerate(grads):
            assert g.shape == arrays[k].shape, f"{pre}cotangent {k} has shape {g.shape}"
            assert not np.any(np.array(g)), f"{pre}nonzero cotangent for input {k}"
    if "jvp" in rules:
        _, tans = mx.jvp(fn, arrays, [mx.ones_like(a) for a in arrays])
        for k, t in enumerate(tans):
            assert not np.any(np.array(t)), f"{pre}nonzero tangent for output {k}"


def batched_examples(x: np.ndarray, axis: int, reverse_ints: bool) -> np.ndarray:
    """Three examples of input ``x`` stacked at ``axis``."""
    if x.dtype.kind in "fc":
        copies = [x * f for f in FACTORS]
    elif reverse_ints and x.ndim:
        copies = [x, x[(slice(None, None, -1),) * x.ndim], x]
    else:
        copies = [x] * len(FACTORS)
    return np.stack(copies, axis=axis)


def _vmap(fn, args, floats, batch_ints):
    if not args:
        raise _Skip("no input to map over")
    mapped = floats or range(len(args))
    axes = [0 if i in mapped else None for i in range(len(args))]
    inputs = [batched_examples(a, 0, batch_ints) if ax is not None else a for a, ax in zip(args, axes)]
    check_vmap_loop(fn, *inputs, in_axes=axes, msg=f"vmap with in_axes {axes}")
    inputs = [batched_examples(a, -1, batch_ints) for a in args]
    check_vmap_loop(fn, *inputs, in_axes=[-1] * len(args), msg="vmap at the last axes")


def _compiled(fn, args):
    compile_ = getattr(mx, "compile", None)
    if compile_ is None:
        raise _Skip("lazyx.core.compile does not exist yet")
    eager = [np.array(o) for o in _outputs(fn(*[to_lazyx(a) for a in args]))]
    compiled = compile_(fn)
    for call in ("first call", "second call"):
        outs = _outputs(compiled(*[to_lazyx(a) for a in args]))
        assert len(outs) == len(eager), f"{call}: {len(outs)} outputs, eager {len(eager)}"
        for k, (o, e) in enumerate(zip(outs, eager)):
            _assert_same(np.array(o), e, o.dtype, f"compiled {call}, output {k}")
