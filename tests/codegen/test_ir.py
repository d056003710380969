"""The IR of fused element-wise expressions: construction, typing, identity, programs."""

import math

import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES
from lazyx.codegen import ir
from lazyx.errors import DtypeError


def test_expressions_are_interned():
    x, y = ir.input(0, mx.float32), ir.input(1, mx.float32)
    assert ir.apply("add", x, y) is ir.apply("add", x, y)
    assert ir.apply("add", x, y) is not ir.apply("add", y, x)
    assert ir.input(0, mx.float32) is x
    assert ir.input(0, mx.float16) is not x
    assert ir.cast(x, mx.float32) is x
    assert ir.cast(x, mx.int32) is ir.cast(x, "int32")


def test_constants_convert_like_astype_and_keep_identity():
    assert ir.constant(1, mx.float32) is ir.constant(1.0, mx.float32)
    assert ir.constant(1.0, mx.float32).value == 1.0
    assert ir.constant(300, mx.uint8).value == 44
    assert ir.constant(2.7, mx.int32).value == 2
    assert ir.constant(1 + 2j, mx.float32).value == 1.0
    assert ir.constant(0.1, mx.float16).value == float(__import__("numpy").float16(0.1))
    nan = ir.constant(math.nan, mx.float64)
    assert nan is ir.constant(float("nan"), mx.float64)
    assert ir.constant(-0.0, mx.float32) is not ir.constant(0.0, mx.float32)
    assert ir.constant(True, mx.bool_).value is True
    with pytest.raises(ir.IRError, match="scalars"):
        ir.constant([1, 2], mx.float32)


@pytest.mark.parametrize("op, dtype, result", [
    ("exp", mx.float16, mx.float16), ("abs", mx.complex64, mx.float32),
    ("abs", mx.int8, mx.int8), ("real", mx.complex64, mx.float32),
    ("imag", mx.complex64, mx.float32), ("isnan", mx.float32, mx.bool_),
    ("not", mx.int32, mx.bool_), ("sign", mx.uint8, mx.uint8)])
def test_unary_result_dtypes(op, dtype, result):
    assert ir.apply(op, ir.input(0, dtype)).dtype is result


@pytest.mark.parametrize("op, result", [
    ("add", None), ("lt", mx.bool_), ("and", mx.bool_), ("max", None), ("pow", None)])
@pytest.mark.parametrize("dtype", [mx.bool_, mx.int16, mx.float32, mx.complex64])
def test_binary_result_dtypes(op, result, dtype):
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    assert ir.apply(op, x, y).dtype is (result or dtype)


def test_select_takes_a_bool_condition_and_one_dtype():
    c, x = ir.input(0, mx.bool_), ir.input(1, mx.int64)
    assert ir.select(c, x, x).dtype is mx.int64
    assert ir.apply("select", c, x, x) is ir.select(c, x, x)
    with pytest.raises(ir.IRError, match="condition of select must be bool"):
        ir.select(x, x, x)
    with pytest.raises(ir.IRError, match="one dtype"):
        ir.select(c, x, ir.input(2, mx.int32))


def test_bad_expressions_name_the_problem():
    f, i = ir.input(0, mx.float32), ir.input(1, mx.int32)
    with pytest.raises(ir.IRError, match="int32 operands"):
        ir.apply("exp", i)
    with pytest.raises(ir.IRError, match="one dtype.*float32, int32.*cast them first"):
        ir.apply("add", f, i)
    with pytest.raises(ir.IRError, match="Unknown IR op 'frobnicate'"):
        ir.apply("frobnicate", f)
    with pytest.raises(ir.IRError, match="takes 2 operands, got 1"):
        ir.apply("add", f)
    # An IRError is a lazyx DtypeError (and so a TypeError).
    assert issubclass(ir.IRError, DtypeError) and issubclass(ir.IRError, TypeError)


def test_maybe_apply_returns_none_for_dtypes_an_op_does_not_take():
    f, i = ir.input(0, mx.float32), ir.input(1, mx.int32)
    assert ir.maybe_apply(None, (f,)) is None
    assert ir.maybe_apply("exp", (i,)) is None
    assert ir.maybe_apply("add", (f, i)) is None
    assert ir.maybe_apply("exp", (f,)) is ir.apply("exp", f)
    b = ir.input(2, mx.bool_)
    assert ir.maybe_apply("select", (b, f, f)) is ir.select(b, f, f)
    assert ir.maybe_apply("select", (f, f, f)) is None


def test_every_op_names_a_lazyx_function():
    for name, info in ir.OPS.items():
        assert callable(getattr(mx, info.function)), name
        assert set(info.kinds) <= set("biufc"), name


def _gelu(x):
    half = ir.constant(0.5, x.dtype)
    inner = ir.apply("erf", ir.apply("mul", x, ir.constant(1 / math.sqrt(2), x.dtype)))
    return ir.apply("mul", ir.apply("mul", x, half),
                    ir.apply("add", ir.constant(1.0, x.dtype), inner))


def test_programs_compare_by_content():
    a = ir.Program([mx.float32], [_gelu(ir.input(0, mx.float32))])
    b = ir.Program([mx.float32], [_gelu(ir.input(0, mx.float32))])
    assert a == b and hash(a) == hash(b) and a.digest == b.digest
    c = ir.Program([mx.float64], [_gelu(ir.input(0, mx.float64))])
    assert a != c and a.digest != c.digest
    assert a.size == 5
    assert len(a.digest) == 16 and a.digest in repr(a)
    assert a.text().splitlines()[0] == "inputs float32"
    assert "erf" in a.text()


def test_program_text_is_stable_and_shares_subexpressions():
    x = ir.input(0, mx.float32)
    e = ir.apply("exp", x)
    p = ir.Program([mx.float32], [ir.apply("add", e, e), e])
    lines = p.text().splitlines()
    assert sum("exp" in ln for ln in lines) == 1
    assert lines[-1].startswith("outputs")
    assert len(p.nodes) == 3


def test_program_inputs_must_match_their_loads():
    with pytest.raises(ir.IRError, match="Input 0 of dtype float16"):
        ir.Program([mx.float32], [ir.apply("exp", ir.input(0, mx.float16))])
    with pytest.raises(ir.IRError, match="Input 1"):
        ir.Program([mx.float32], [ir.input(1, mx.float32)])
    with pytest.raises(ir.IRError, match="at least one output"):
        ir.Program([mx.float32], [])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype_has_inputs_constants_and_casts(dtype):
    x = ir.input(0, dtype)
    c = ir.constant(1, dtype)
    p = ir.Program([dtype], [ir.apply("add", x, c), ir.cast(x, mx.float32), ir.apply("eq", x, c)])
    assert [o.dtype for o in p.outputs] == [dtype, mx.float32, mx.bool_]
