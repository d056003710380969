"""Errors name the operation the user called, the argument and the shapes (issue 11,
item 5): one lazyx error per case, never a raw NumPy or Python exception, and the
arrays computed before stay valid."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import (ArgumentError, DtypeError, IndexOutOfRangeError, LazyxError,
                          OutOfMemoryError, ShapeError, at_op)
from lazyx.memory import memory_limit, physical_memory


def test_a_zero_slice_step_names_getitem_the_slice_and_the_shape():
    x = mx.arange(5)
    with pytest.raises(ArgumentError, match=r"^\[__getitem__\] Slice step cannot be zero: "
                                            r"slice\(None, None, 0\) on axis 0 .*shape \(5,\)"):
        x[::0]
    with pytest.raises(ArgumentError, match=r"^\[__getitem__\].*axis 1 .*shape \(2, 3\)"):
        mx.zeros((2, 3))[0:1, ::0]


def test_a_non_integer_slice_bound_is_a_dtype_error():
    with pytest.raises(DtypeError, match=r"^\[__getitem__\] Slice bounds must be integers"):
        mx.arange(5)[1.5:]


def test_a_scalar_that_overflows_names_the_op_and_the_other_operand():
    x = mx.array([1, 2], mx.uint32)
    with pytest.raises(ArgumentError, match=r"^\[add\] Converting -1 to uint32 would result in "
                                            r"overflow .*shape \(2,\)"):
        x + (-1)
    with pytest.raises(ArgumentError, match=r"^\[maximum\] .*300 to int8"):
        mx.maximum(300, mx.array([1], mx.int8))
    with pytest.raises(ArgumentError, match=r"^\[where\] "):
        mx.where(mx.array([True]), mx.array([1], mx.uint8), -1)
    np.testing.assert_array_equal(np.array(x), [1, 2])  # the operand stays valid


def test_take_from_an_empty_axis_names_take_at_the_call():
    x = mx.zeros((0, 3))
    for idx in (mx.array([0]), [0, 1]):
        with pytest.raises(IndexOutOfRangeError, match=r"^\[take\] .*axis 0 .*size 0.*"
                                                       r"\(array shape \(0, 3\)\)"):
            mx.take(x, idx, axis=0)
    with pytest.raises(IndexOutOfRangeError, match=r"^\[__getitem__\] .*size 0"):
        x[mx.array([1])]
    assert mx.take(x, mx.array([], mx.int32), axis=0).shape == (0, 3)


def test_an_index_out_of_range_found_at_evaluation_names_the_primitive_and_shapes():
    y = mx.take(mx.ones((3, 2)), mx.array([5]), axis=0)
    with pytest.raises(IndexOutOfRangeError, match=r"^\[Gather\] An index array holds a "
                                                   r"position outside the array of shape \(3, 2\)"):
        mx.eval(y)


def test_a_creation_beyond_any_memory_raises_at_the_call():
    with pytest.raises(OutOfMemoryError) as info:
        mx.zeros((2**20, 2**20), mx.complex64)
    msg = str(info.value)
    assert msg.startswith("[zeros] ")
    assert "(1048576, 1048576)" in msg and "complex64" in msg
    assert f"{2**43} bytes" in msg and f"{memory_limit()} bytes" in msg
    assert isinstance(info.value, MemoryError)
    for call in (lambda: mx.ones((2**31 - 1, 2**31 - 1)), lambda: mx.full((2**30, 2**30, 4), 1.0),
                 lambda: mx.eye(2**30)):
        with pytest.raises(OutOfMemoryError, match=r"^\[(ones|full|eye)\] "):
            call()
    # A dimension beyond 32 bits is refused first, as MLX refuses it (an OverflowError).
    for call in (lambda: mx.zeros((2**40,)), lambda: mx.arange(0, 1e300)):
        with pytest.raises(OverflowError):
            call()


def test_an_allocation_failing_in_a_kernel_names_the_primitive_shape_and_bytes():
    # broadcast_to is a view; exp needs the whole 8 TiB buffer, refused when evaluated.
    x = mx.broadcast_to(mx.array(1, mx.complex64), (2**20, 2**20))
    y = mx.exp(x)
    ok = mx.ones((2,)) * 2
    mx.eval(ok)
    with pytest.raises(OutOfMemoryError, match=r"^\[Exp\] .*shape \(1048576, 1048576\) and dtype "
                                               r"complex64.*8796093022208 bytes.*memory limit"):
        mx.eval(y)
    np.testing.assert_array_equal(np.array(ok), [2, 2])
    assert mx.get_active_memory() < physical_memory()


def test_the_memory_limit_stays_a_guideline_for_creation():
    previous = mx.set_memory_limit(0)
    try:
        np.testing.assert_array_equal(np.array(mx.zeros((4,))), np.zeros(4))
    finally:
        mx.set_memory_limit(previous)


@pytest.mark.parametrize("call, cls, pattern", [
    (lambda: mx.zeros((-1,)), ShapeError, r"^\[zeros\] Negative"),
    (lambda: mx.zeros((2.5,)), ShapeError, r"^\[zeros\] shape must be"),
    (lambda: mx.reshape(mx.zeros((4,)), (2.0, 2)), DtypeError, r"^\[reshape\]"),
    (lambda: mx.add(mx.zeros((2,)), mx.zeros((3,))), ShapeError,
     r"^\[add\] Shapes \(2,\) and \(3,\) cannot be broadcast"),
    (lambda: mx.isclose(mx.zeros((2,)), mx.zeros((3,))), ShapeError, r"^\[isclose\] Shapes"),
    (lambda: mx.softmax(mx.zeros((2,)), axis=3), LazyxError, r"^\[softmax\] axis 3"),
    (lambda: mx.tensordot(mx.zeros((2,)), mx.zeros((2,)), axes=([3], [0])), LazyxError,
     r"^\[tensordot\] axis of a 3"),
    (lambda: mx.take_along_axis(mx.zeros((2,)), mx.zeros((2,))), DtypeError,
     r"^\[take_along_axis\] Indices must be integers"),
    (lambda: mx.arange(4)[5], IndexOutOfRangeError,
     r"^\[__getitem__\] Index 5 is out of bounds for axis 0 with size 4 \(array shape \(4,\)\)"),
    (lambda: mx.arange(4)[[0, 7]], IndexOutOfRangeError, r"^\[__getitem__\] Index 7"),
    (lambda: mx.arange(4).at[9].add(1), IndexOutOfRangeError, r"^\[at\] Index 9"),
])
def test_bad_input_names_the_op(call, cls, pattern):
    with pytest.raises(cls, match=pattern):
        call()


def test_setitem_names_setitem():
    x = mx.arange(4)
    with pytest.raises(ShapeError, match=r"^\[__setitem__\] Cannot broadcast an update of "
                                         r"shape \(3,\)"):
        x[0:2] = mx.zeros((3,), mx.int32)
    np.testing.assert_array_equal(np.array(x), [0, 1, 2, 3])


def test_at_op_prefixes_once():
    e = at_op(ShapeError("bad"), "add")
    assert str(e) == "[add] bad"
    assert str(at_op(e, "sum")) == "[add] bad"


def test_numpy_scalar_subclasses_of_python_scalars_are_weak_scalars():
    # np.float64 is a float: MLX takes it as a weak Python float (int8 * 2.0 -> float32),
    # and lazyx once recursed forever on it (RecursionError).
    import numpy as np
    import lazyx.core as lx
    r = lx.array([1, 2], lx.int8) * np.float64(2.0)
    assert r.dtype == lx.float32 and r.tolist() == [2.0, 4.0]
    m = lx.minimum(np.float64(2.0), lx.array([1.0, 5.0], lx.float16))
    assert m.dtype == lx.float16 and m.tolist() == [1.0, 2.0]
