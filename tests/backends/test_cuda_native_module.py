"""The cuda backend's native module (backends/cuda/native/launch.cpp) on any machine: it
builds and imports without CUDA (the driver is loaded at run time), and refuses to make
launchers or call cuBLAS before it is set up, or with the wrong arguments. Its launches
are tested on the GPU (test_cuda_fusion.py and every CUDA test, which run through it)."""

import pytest

native = pytest.importorskip("lazyx.backends.cuda._native",
                             reason="the native module is not built (a source checkout)")


def _set_up() -> bool:
    from lazyx.backends.cuda import runtime
    return bool(runtime._native)


def test_the_module_has_its_launchers():
    assert callable(native.Launcher) and callable(native.RawFunction)
    assert callable(native.setup) and callable(native.gemm) and callable(native.setup_cublas)


def test_nothing_launches_before_setup():
    if _set_up():
        pytest.skip("this process set the module up (a GPU run)")
    with pytest.raises(RuntimeError, match="setup"):
        native.Launcher(lambda p, i: None, lambda p, i: None)
    with pytest.raises(RuntimeError, match="setup"):
        native.RawFunction(object())
    with pytest.raises(TypeError, match="setup_cublas"):
        native.gemm(*range(20))


def test_bad_arguments_are_type_errors():
    with pytest.raises(TypeError, match="setup"):
        native.setup(1, 2)
    with pytest.raises(TypeError, match="gemm"):
        native.gemm(1, 2, 3)
    with pytest.raises(TypeError, match="setup_cublas"):
        native.setup_cublas(3)
