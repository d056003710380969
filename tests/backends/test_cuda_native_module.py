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


# -- the launchers run, on the CPU: a stand-in driver ------------------------------------------
# A shared library named libcuda.so.1 whose cuLaunchKernel calls the "function" it is given
# as a host function of the parameter array, loaded before setup() so that the module's
# dlopen finds it; device arrays are host arrays behind CuPy's attributes. So the launchers'
# keys, plans, argument packing, donation, fallbacks and errors run without a GPU. (In a
# subprocess: a GPU run has loaded the real driver.)
_DRIVER = r"""
typedef void (*host_kernel)(void**);
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  if (!f) return 400;
  ((host_kernel)f)(params);
  return 0;
}
int cuGetErrorString(int rc, const char** s) { *s = "CUDA_ERROR_INVALID_HANDLE"; return 0; }
/* lx_contiguous(a, b, out, long long n) of a float32 add */
void add_f32(void** p) {
  const float* a = *(float**)p[0]; const float* b = *(float**)p[1]; float* o = *(float**)p[2];
  long long n = *(long long*)p[3];
  for (long long i = 0; i < n; ++i) o[i] = a[i] + b[i];
}
/* a strided kernel's tail (n, nd, layout) and a RawFunction's (a, scalar int32, out) */
long long seen[4];
void record_strided(void** p) {
  seen[0] = *(long long*)p[3]; seen[1] = *(int*)p[4]; seen[2] = **(long long**)p[5];
}
void scale_i32(void** p) {
  const float* a = *(float**)p[0]; int k = *(int*)p[1]; float* o = *(float**)p[2];
  for (int i = 0; i < 4; ++i) o[i] = a[i] * k;
}
void* address(int which) {
  return which == 0 ? (void*)add_f32 : which == 1 ? (void*)record_strided : (void*)scale_i32;
}
"""

_SCRIPT = r"""
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib.address.restype = ctypes.c_void_p
from lazyx.backends.cuda import _native as native


class Memory:
    def __init__(self, ptr):
        self.ptr = ptr


class Dev:  # CuPy's ndarray attributes over a host array
    def __init__(self, shape, dtype, host=None):
        self.host = np.zeros(shape, dtype) if host is None else host
        self.shape, self.dtype, self.strides = self.host.shape, self.host.dtype, self.host.strides
        self.data, self.base = Memory(self.host.ctypes.data), None


class LaunchFailed(Exception):
    pass


native.setup(Dev, lambda: 0, LaunchFailed, np.generic)


class Prim:
    name = "Add"


f32 = np.dtype(np.float32)
asked, fell = [], []
answer = {"plan": None}


def planner(prim, inputs):
    asked.append([x.shape for x in inputs])
    return answer["plan"]


def fallback(prim, inputs):
    fell.append(len(inputs))
    return "fallback"


stats = {"contiguous": 0, "strided": 0, "native": 0, "donated": 0}
launch = native.Launcher(fallback, planner, None, stats)
a = Dev((4,), f32, np.arange(4, dtype=np.float32))
b = Dev((4,), f32, np.full(4, 10, np.float32))
answer["plan"] = (lib.address(0), 1, 4, 4, 0, 0b11, (4,), (f32,), None)
out = launch(Prim(), [a, b])
assert type(out) is Dev and out.host.tolist() == [10, 11, 12, 13], out.host
assert launch(Prim(), [a, b]) is not a and len(asked) == 1  # planned once per key
out = launch(Prim(), [a, b], (0,))  # a donor of the output's shape and dtype
assert out is a and a.host.tolist() == [10, 11, 12, 13]
a.base = object()  # a view: never written into
assert launch(Prim(), [a, b], (0,)) is not a
assert stats == {"contiguous": 4, "strided": 0, "native": 4, "donated": 1}, stats
assert launch(Prim(), [a, np.ones(4, np.float32)]) == "fallback"  # a host input, no upload
answer["plan"] = None  # another key the planner refuses: always the fallback, asked once
c = Dev((2, 2), f32)
assert launch(Prim(), [c, c]) == "fallback" and launch(Prim(), [c, c]) == "fallback"
assert len(asked) == 2 and len(fell) == 3
assert launch.cached() == 2
layout = Dev((2,), np.int64, np.array([7, 0]))
answer["plan"] = (lib.address(1), 1, 32, 6, 0, 0, (6,), (f32,), (1, layout))
e = Dev((6,), f32)
launch(Prim(), [e, e])
seen = (ctypes.c_longlong * 4).in_dll(lib, "seen")
assert list(seen)[:3] == [6, 1, 7], list(seen)
assert stats["strided"] == 1
answer["plan"] = (0, 1, 1, 5, 0, 0, (5,), (f32,), None)  # the driver refuses the launch
g = Dev((5,), f32)
try:
    launch(Prim(), [g, g])
    raise AssertionError("no error")
except LaunchFailed as exc:
    assert "Add" in str(exc) and "CUDA_ERROR_INVALID_HANDLE" in str(exc), exc
launch.forget()
assert launch.cached() == 0

calls = []


class Kernel:
    ptr = lib.address(2)


class Raw:  # CuPy's RawKernel: gets what the RawFunction does not take
    kernel = Kernel()
    max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        calls.append((grid, block, shared_mem))


raw = Raw()
fn = native.RawFunction(raw)
src, dst = Dev((4,), f32, np.arange(4, dtype=np.float32)), Dev((4,), f32)
assert fn((1,), (4,), (src, np.int32(3), dst)) is None and calls == []
assert dst.host.tolist() == [0, 3, 6, 9]
fn((1,), (4,), (src, np.int32(2), dst), shared_mem=128)
assert dst.host.tolist() == [0, 2, 4, 6] and calls == []
fn((1,), (4,), (src, 2, dst))  # a Python int: CuPy's own call
assert calls == [((1,), (4,), 0)]
fn.max_dynamic_shared_size_bytes = 4096  # attributes are the RawKernel's
assert raw.max_dynamic_shared_size_bytes == 4096 and fn.kernel is Raw.kernel
print("ok")
"""


def test_the_launchers_run_against_a_stand_in_driver(tmp_path):
    import subprocess
    import sys

    from lazyx.codegen import jit
    found = jit.compiler()
    if found is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "driver.c"
    source.write_text(_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    build = subprocess.run([*found[0], "-x", "c", "-shared", "-fPIC", "-O1",
                            "-Wl,-soname,libcuda.so.1", str(source), "-o", str(lib)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    run = subprocess.run([sys.executable, str(script), str(lib)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
