"""The fusible primitives of the registry and how to make a node of each (shared by the
codegen tests).

A primitive is fusible when it declares ``to_expression``. Element-wise family
members are made with their op function (``cls._op``); the others are listed in
:data:`MAKERS`; any other (a plugin's) is made with the examples its plugin
registers for the transform test (``lazyx_examples``), on floating dtypes. A
fusible primitive with none of these fails the registry walk, naming itself,
so a plugin's fusible primitive cannot go untested.
"""

from __future__ import annotations

import functools

import numpy as np

import lazyx.core as mx
from helpers import ALL_DTYPES, TOLERANCES, random_array
from lazyx import registry
from lazyx.errors import DtypeError
from lazyx.transforms.fusion import Compiled

# Input data by role: ``x`` for every operand, ``y`` for second operands. One
# input for all ops keeps every node of a dtype in one fused kernel (sibling
# fusion), so the walk compiles one kernel per dtype; ops with a narrower domain
# (log, erfinv) get NaN on part of it in both paths.
DOMAINS = {"x": (-4.0, 4.0), "y": (-4.0, 4.0)}


def _astype_makers():
    return [(f"to {d.name}", (lambda d: lambda x: mx.astype(x, d))(d), ("x",)) for d in ALL_DTYPES]


#: name -> [(label, function of arrays, roles of its arguments)]
MAKERS = {
    "AsType": _astype_makers,
    "Round": lambda: [("0", lambda x: mx.round(x), ("x",)),
                      ("2", lambda x: mx.round(x, 2), ("x",)),
                      ("-1", lambda x: mx.round(mx.multiply(x, 30), -1), ("x",))],
    # round(x) / round(x / 2): NaN (0 / 0), +-inf (n / 0) and finite values.
    "NanToNum": lambda: [("inf and nan", lambda x: mx.nan_to_num(
        mx.divide(mx.round(x), mx.round(mx.multiply(x, 0.5))), 1.5, 100.0, -100.0), ("x",))],
    "IsClose": lambda: [("default", lambda a, b: mx.isclose(a, mx.add(a, mx.multiply(b, 1e-6))),
                         ("x", "y")),
                        ("loose", lambda a, b: mx.isclose(a, b, 0.5, 0.25, equal_nan=True),
                         ("x", "y"))],
    "DivMod": lambda: [("divmod", lambda a, b: mx.divmod(a, b), ("x", "y"))],
    "Select": lambda: [("where", lambda a, b: mx.where(mx.greater(a, b), a, b), ("x", "y"))],
    "StopGradient": lambda: [("id", lambda x: mx.stop_gradient(mx.abs(x)), ("x",))],
    "Imag": lambda: [("imag", lambda x: mx.imag(x), ("x",))],
}


def declares(cls) -> bool:
    return callable(getattr(cls, "to_expression", None))


def fusible_primitives() -> list:
    return sorted((c for c in registry.primitives if declares(c)),
                  key=lambda c: (registry.primitives[c].name, c.name))


@functools.lru_cache(maxsize=None)
def makers(cls) -> list:
    """``[(label, fn, roles)]`` for primitive class ``cls`` (empty: no way to make one).

    Cached: an example draws fresh random data on each call, and a walk that builds the
    same nodes twice (once per device) must give both the same data."""
    if cls.name in MAKERS:
        return MAKERS[cls.name]()
    op = getattr(cls, "_op", None)
    from lazyx.plugins.elementwise import Binary, Unary
    if op is not None and issubclass(cls, Unary):
        return [(cls.name, op, ("x",))]
    if op is not None and issubclass(cls, Binary):
        return [(cls.name, op, ("x", "y"))]
    # Arguments given as NumPy data are converted to the walk's (floating) dtype.
    out = []
    for k, (make, info) in enumerate(registry.examples().get(cls, ())):
        fn, args = make()[:2]
        out.append((f"example {k} of {info.name}", fn, tuple(np.asarray(a) for a in args)))
    return out


def inputs_for(dtype, shape=(8, 33), seed=0) -> dict:
    """NumPy data for each role, of ``dtype``."""
    gen = np.random.default_rng(seed)
    out = {}
    for role, (lo, hi) in DOMAINS.items():
        out[role] = random_array(shape, dtype, gen, lo, hi)
    return out


def build(cls, arrays: dict) -> list:
    """``[(label, outputs)]``: nodes of ``cls`` made on ``arrays`` (lazyx arrays by role);
    dtypes the op refuses are left out, as are calls that return an input unchanged."""
    out = []
    dtype = arrays["x"].dtype
    for label, fn, roles in makers(cls):
        if any(not isinstance(r, str) for r in roles) and dtype.kind != "f":
            continue
        try:
            y = fn(*[arrays[r] if isinstance(r, str) else mx.array(r, dtype=dtype) for r in roles])
        except DtypeError:
            continue
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        if any(o._prim is None or o._data is not None for o in ys):
            continue
        out.append((label, ys))
    return out


def run_program(program, *inputs):
    """The outputs of ``program`` (a list of evaluated arrays) on lazyx arrays ``inputs``,
    run as one ``Compiled`` node by the active backend."""
    from lazyx.array import lazy, lazy_multi
    from lazyx.device import to_stream
    from lazyx.transforms.fusion import Compiled
    prim = Compiled(to_stream(None), program)
    shape = prim.output_shapes(inputs)[0]
    outs = program.outputs
    if len(outs) == 1:
        ys = [lazy(shape, outs[0].dtype, prim, tuple(inputs))]
    else:
        ys = lazy_multi([shape] * len(outs), [o.dtype for o in outs], prim, tuple(inputs))
    mx.eval(ys)
    return ys


# -- the walk over every fusible primitive, dtype and layout (C++ and CUDA tests) -----
#: Fusion bounds that put a whole walk into one fused node per run.
UNBOUNDED = {"max_inputs": 64, "max_outputs": 10**6, "max_ops": 10**6, "min_ops": 1}
#: The dtypes also walked with a one-element ``y`` (the kernels' scalar inputs).
SCALAR_DTYPES = (mx.bool_, mx.int8, mx.float16, mx.float32, mx.complex64)


def layout_arrays(dtype, layout, shape=(8, 33)) -> dict:
    """The walk's lazyx inputs ``{"x": ..., "y": ...}`` in ``layout``: ``contiguous``
    (``unaligned`` is the same; its test replaces the buffers at run time), ``strided``
    (a transposed and a sliced view) or ``scalar`` (a one-element ``y``)."""
    from helpers import to_lazyx
    data = inputs_for(dtype, shape)
    x, y = data["x"], data["y"]
    if layout in ("contiguous", "unaligned"):
        return {"x": to_lazyx(x), "y": to_lazyx(y)}
    if layout == "strided":
        xt = mx.transpose(to_lazyx(np.ascontiguousarray(x.T)))
        ys = to_lazyx(np.repeat(y, 2, axis=1))[:, ::2]
        mx.eval(xt, ys)
        return {"x": xt, "y": ys}
    return {"x": to_lazyx(x), "y": to_lazyx(y[0, 0])}


def walk_cases(primitives, layouts, shape=(8, 33)) -> list:
    """``[(dtype, layout, arrays, items, flat)]`` for every dtype and layout: ``items``
    are ``(class, label, outputs)`` of every primitive's nodes on ``arrays``, ``flat``
    all their outputs."""
    cases = []
    for dtype in ALL_DTYPES:
        for layout in layouts:
            if layout == "scalar" and dtype not in SCALAR_DTYPES:
                continue
            arrays = layout_arrays(dtype, layout, shape)
            items = [(cls, label, outs) for cls in primitives
                     for label, outs in build(cls, arrays)]
            flat = [o for *_, outs in items for o in outs]
            cases.append((dtype, layout, arrays, items, flat))
    return cases



# -- the renderers' walks (test_cuda_render.py, test_msl_render.py) ------------------------
def add_pairs(table: dict, dtype, layout, items, flat, fused, results) -> None:
    """Record in ``table`` (``{(class, dtype, layout): [(label, [(kernel output, unfused
    output)])]}``) each output of a walk case whose fused node's kernel ran: ``results``
    maps ``id`` of a ``Compiled`` primitive to its outputs; ``fused[k]`` replaces
    ``flat[k]``, the outputs of ``items`` in order."""
    k = 0
    for cls, label, outs in items:
        pairs = []
        for _ in outs:
            f, u = fused[k], flat[k]
            k += 1
            if isinstance(f._prim, Compiled) and id(f._prim) in results:
                sib = f._siblings
                j = 0 if sib is None else [id(s) for s in sib].index(id(f))
                pairs.append((results[id(f._prim)][j], u))
        table.setdefault((cls, dtype, layout), []).append((label, pairs))


def check_pairs(table: dict, cls, kernel: str) -> set:
    """Compare every recorded output of ``cls`` with the unfused graph's (``kernel`` names
    the renderer's in messages); the layouts that had one."""
    checked = set()
    for (c, dtype, layout), entries in table.items():
        if c is not cls:
            continue
        for label, pairs in entries:
            for j, (got, unfused) in enumerate(pairs):
                same_values(got, unfused, f"{cls.name} {label} on {dtype.name}, {layout} "
                                          f"layout, output {j}: {kernel} vs unfused")
                checked.add(layout)
    return checked


def same_values(actual, expected, msg) -> None:
    """A kernel's output against the unfused graph's: the same dtype and shape, exact for
    integers and bool, within the dtype's tolerance for floating and complex ones."""
    e = np.array(expected)
    assert actual.dtype == e.dtype and actual.shape == e.shape, msg
    d = expected.dtype  # lazyx's (bfloat16's NumPy dtype has kind "V")
    if d.kind in "fc":
        wide = np.complex128 if d.kind == "c" else np.float64
        r, t = TOLERANCES[d.name]
        np.testing.assert_allclose(actual.astype(wide), e.astype(wide), rtol=r, atol=t,
                                   equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(actual, e, err_msg=msg)
