import pytest

import lazyx.core as mx
from lazyx.errors import DeviceError


def test_defaults():
    assert mx.default_device() == mx.Device(mx.cpu)
    assert mx.default_device() == mx.cpu
    assert mx.default_stream(mx.cpu).device == mx.Device(mx.cpu, 0)
    assert mx.is_available(mx.cpu)
    assert repr(mx.Device(mx.cpu)) == "Device(cpu, 0)"


def test_stream_argument_is_recorded_on_the_node():
    s = mx.new_stream(mx.cpu)
    assert s != mx.default_stream(mx.cpu)
    a = mx.add(mx.array([1.0]), 1.0, stream=s)
    assert a._prim.stream is s
    b = mx.add(mx.array([1.0]), 1.0, stream=mx.cpu)
    assert b._prim.stream == mx.default_stream(mx.cpu)
    assert (a + b).tolist() == [4.0]
    with pytest.raises(DeviceError):
        mx.add(1, 2, stream="cpu0")


def test_stream_context_manager():
    s = mx.new_stream(mx.cpu)
    with mx.stream(s):
        a = mx.exp(mx.array([0.0]))
        assert mx.default_device() == mx.cpu
    assert a._prim.stream is s
    b = mx.exp(mx.array([0.0]))
    assert b._prim.stream is mx.default_stream(mx.cpu)
    with mx.stream(mx.cpu):
        c = mx.exp(mx.array([0.0]))
    assert c._prim.stream is mx.default_stream(mx.cpu)
    mx.synchronize()
    mx.synchronize(s)


def test_gpu_is_reported_unavailable_not_silently_used():
    if mx.is_available(mx.gpu):
        pytest.skip("a GPU backend is available here")
    with pytest.raises(DeviceError, match="not available"):
        mx.set_default_device(mx.gpu)
    assert mx.default_device() == mx.cpu
    with pytest.raises(DeviceError, match="not available"):
        mx.add(mx.array([1.0]), 1.0, stream=mx.gpu)
    with pytest.raises(DeviceError):
        with mx.stream(mx.gpu):
            pass


def test_set_default_stream_and_device():
    s = mx.new_stream(mx.cpu)
    old = mx.default_stream(mx.default_device())
    try:
        mx.set_default_stream(s)
        assert mx.exp(mx.array([1.0]))._prim.stream is s
    finally:
        mx.set_default_stream(old)
    mx.set_default_device(mx.cpu)
    with pytest.raises(DeviceError):
        mx.set_default_device("cpu")
