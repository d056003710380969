"""Every fusible primitive of the registry, built-in or from a plugin, renders to C++ and
matches its own (unfused) kernel on random data, for every dtype its op takes.

For each dtype and input layout the nodes of every fusible primitive are made on
the same inputs and fused into one kernel (sibling fusion), which runs three
ways: the ``cpu`` backend's C++ kernel, the ``cpu-reference`` backend's
interpretation, and the unfused graph. Layouts: ``contiguous`` (the contiguous
path), ``strided`` (a transposed and a sliced input: the strided path, same
kernel), ``scalar`` (a 0-d second operand: the scalar loads; for some dtypes).
Broadcasting layouts are tested once, in ``test_cpp.py``: a load's broadcast
does not depend on the op.
"""

import concurrent.futures
import os

import numpy as np
import pytest

import lazyx.core as mx
from fusible import UNBOUNDED, declares, fusible_primitives, makers, walk_cases
from helpers import TOLERANCES
from lazyx.backends.cpu import compiled
from lazyx.codegen import jit
from lazyx.transforms.fusion import Compiled, fuse_arrays

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

PRIMITIVES = fusible_primitives()
LAYOUTS = ("contiguous", "strided", "scalar")


def _fused_here(out) -> bool:
    """Whether the node making ``out`` expresses itself for its input dtypes."""
    from lazyx.codegen import ir
    prim = out._prim
    if not declares(type(prim)):
        return False
    args = tuple(ir.input(k, x.dtype) for k, x in enumerate(out._inputs))
    return prim.to_expression(args) is not None


@pytest.fixture(scope="module")
def walk():
    """``{(class, dtype, layout): [(label, fused, reference, unfused, expected_fused)]}``."""
    cases = []
    for dtype, layout, arrays, items, flat in walk_cases(PRIMITIVES, LAYOUTS):
        ins = list(arrays.values())
        fused = fuse_arrays(flat, ins, force=True, **UNBOUNDED)
        reference = fuse_arrays(flat, ins, force=True, **UNBOUNDED)
        cases.append((dtype, layout, items, flat, fused, reference))
    # Build the kernels in parallel (each build is a compiler process).
    jobs = {}
    for *_, fused, _ in cases:
        for f in fused:
            if isinstance(f._prim, Compiled):
                scalar = tuple(x.size == 1 for x in f._inputs)
                jobs[(f._prim.program, scalar)] = None
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(lambda key: compiled.kernel_for(*key), jobs))
    table = {}
    for dtype, layout, items, flat, fused, reference in cases:
        is_fused = [isinstance(f._prim, Compiled) for f in fused]
        expected = [_fused_here(o) for o in flat]
        mx.eval(fused)
        with mx.use_backend("cpu", "cpu-reference"):
            mx.eval(reference)
        mx.eval(flat)
        k = 0
        for cls, label, outs in items:
            n = len(outs)
            entry = (label, fused[k:k + n], reference[k:k + n], flat[k:k + n],
                     list(zip(is_fused[k:k + n], expected[k:k + n])))
            table.setdefault((cls, dtype, layout), []).append(entry)
            k += n
    return table


def _same(actual, expected, msg):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, msg
    a, e = np.array(actual), np.array(expected)
    d = expected.dtype
    if d.kind in "fc":
        wide = np.complex128 if d.kind == "c" else np.float64
        r, t = TOLERANCES[d.name]
        np.testing.assert_allclose(a.astype(wide), e.astype(wide), rtol=r, atol=t,
                                   equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(a, e, err_msg=msg)


@pytest.mark.parametrize("cls", PRIMITIVES, ids=lambda c: c.name)
def test_fused_kernels_match_the_unfused_graph(cls, walk):
    assert declares(cls)
    assert makers(cls), (f"{cls.name} declares to_expression but the walk cannot make a node "
                         f"of it: add it to tests/codegen/fusible.py MAKERS")
    fused_somewhere = False
    for (c, dtype, layout), entries in walk.items():
        if c is not cls:
            continue
        for label, fused, reference, unfused, flags in entries:
            for j, (f, r, u, (is_fused, expected)) in enumerate(zip(fused, reference, unfused, flags)):
                msg = f"{cls.name} {label} on {dtype.name}, {layout} layout, output {j}"
                assert is_fused == expected, f"{msg}: fused={is_fused}, expressible={expected}"
                fused_somewhere |= is_fused
                _same(f, u, f"{msg}: C++ kernel vs unfused")
                _same(r, u, f"{msg}: cpu-reference interpretation vs unfused")
    assert fused_somewhere, f"{cls.name} declares to_expression but fused for no dtype"
