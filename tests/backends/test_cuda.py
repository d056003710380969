"""The CUDA backend: every registered primitive on the GPU against the CPU, data
moving between devices by itself, transforms on the GPU, NVRTC kernels.

On machines without CUDA (CI) only the availability and error tests run; the
rest skip with the backend's reason. On a GPU machine run the op suites on the
GPU too: ``LAZYX_DEFAULT_DEVICE=gpu python -m pytest tests/plugins``.
"""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.backend import backends, resolve_kernel
from lazyx.errors import BackendError, DeviceError, LazyxError

CUDA = backends()["cuda"]
needs_gpu = pytest.mark.skipif(not CUDA.is_available(),
                               reason=f"cuda backend unavailable: {CUDA.unavailable_reason()}")


# -- everywhere -------------------------------------------------------------------------
def test_unavailable_backend_says_why():
    if CUDA.is_available():
        pytest.skip("CUDA is available here")
    reason = CUDA.unavailable_reason()
    assert "CuPy" in reason
    with pytest.raises(DeviceError, match="cuda"):
        mx.add(mx.array(1.0), 2.0, stream=mx.gpu)
    with pytest.raises(BackendError, match="not available"):
        mx.use_backend("gpu", "cuda")
    assert mx.default_device() == mx.cpu


def test_bad_default_device_variable(monkeypatch):
    from lazyx import device
    monkeypatch.setenv("LAZYX_DEFAULT_DEVICE", "tpu")
    with pytest.raises(DeviceError, match="LAZYX_DEFAULT_DEVICE"):
        device.choose_default_device()
    monkeypatch.setenv("LAZYX_DEFAULT_DEVICE", "cpu")
    assert device.choose_default_device() == mx.cpu


# -- on the GPU ----------------------------------------------------------------------------
def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _lazyx(a):
    # float64 data stays float64 (mx.array would make float32 of it, as MLX does)
    return mx.array(a, dtype=mx.float64) if a.dtype == np.float64 else mx.array(a)


def _run(fn, args, device):
    with mx.stream(device):
        outs = _outputs(fn(*[_lazyx(a) for a in args]))
        mx.eval(outs)
    return outs


EXAMPLES = [(cls, i, make) for cls in sorted(registry.primitives, key=lambda c: c.name)
            for i, (make, _info) in enumerate(registry.examples().get(cls, ()))]


def _phases(v):
    """The phase (sign, for real data) of each column's largest-magnitude entry of the
    matrices ``v`` ``(..., M, K)``: eigenvectors and singular vectors are defined only up
    to it, and cuSOLVER and LAPACK may choose differently."""
    big = np.take_along_axis(v, np.argmax(np.abs(v), axis=-2)[..., None, :], axis=-2)
    mag = np.abs(big)
    return np.where(mag > 0, big / np.where(mag > 0, mag, 1), 1)


def _canonical_eigh(outs):
    if len(outs) == 1:  # eigenvalues alone: ascending on both devices
        return outs
    w, v = outs
    return [w, v / _phases(v)]


def _canonical_svd(outs):
    if len(outs) == 1:  # singular values alone: descending on both devices
        return outs
    u, s, vt = outs
    k = s.shape[-1]
    ph = _phases(u)
    # U's column j and Vt's row j share one phase (A = U S Vt stays A); rows of Vt past
    # K span the null space and take their own.
    vt = vt.copy()
    vt[..., :k, :] *= np.swapaxes(ph[..., :k], -1, -2)
    vt[..., k:, :] /= np.swapaxes(_phases(np.swapaxes(vt[..., k:, :], -1, -2)), -1, -2)
    return [u / ph, s, vt]


def _canonical_eig(outs):
    # Eigenvalues in no promised order: sort each matrix's by real part (rounded, so that
    # rounding differences do not reorder ties) then imaginary part, its vectors' columns
    # with them, each scaled to the phase of its largest entry.
    w = outs[0]
    order = np.lexsort((w.imag, np.round(w.real, 4)), axis=-1)
    out = [np.take_along_axis(w, order, -1)]
    if len(outs) == 2:
        v = np.take_along_axis(outs[1], order[..., None, :], -1)
        out.append(v / _phases(v))
    return out


#: {primitive name: outputs (as NumPy) -> their canonical form}: the factorizations
#: whose results are unique only up to the sign or phase of vectors (and, for eig, order).
CANONICAL = {"Eigh": _canonical_eigh, "SVD": _canonical_svd, "Eig": _canonical_eig}


@needs_gpu
@pytest.mark.parametrize("cls,i,make", EXAMPLES,
                         ids=[f"{c.name}-{i}" for c, i, _ in EXAMPLES])
def test_every_primitive_on_gpu_matches_cpu(cls, i, make):
    made = make()
    fn, args = made[0], [np.asarray(a) for a in made[1]]
    cpu = _run(fn, args, mx.cpu)
    gpu = _run(fn, args, mx.gpu)
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu):
        assert CUDA.is_buffer(g._data), f"{cls.name}: the GPU result is not a device buffer"
        assert g.shape == c.shape and g.dtype == c.dtype
    cpu, gpu = [np.asarray(c) for c in cpu], [np.asarray(g) for g in gpu]
    if cls.name in CANONICAL:
        cpu, gpu = CANONICAL[cls.name](cpu), CANONICAL[cls.name](gpu)
    for cn, gn in zip(cpu, gpu):
        if cn.dtype.kind in "fc":
            np.testing.assert_allclose(gn.astype(np.complex128 if cn.dtype.kind == "c" else np.float64),
                                       cn.astype(np.complex128 if cn.dtype.kind == "c" else np.float64),
                                       rtol=2e-5, atol=1e-6, err_msg=cls.name)
        else:
            np.testing.assert_array_equal(gn, cn, err_msg=cls.name)


@needs_gpu
@pytest.mark.parametrize("batch", [(), (3,)], ids=["matrix", "batched"])
def test_singular_matrices_raise_on_gpu_as_on_cpu(batch):
    from lazyx.errors import LinAlgError
    L = mx.linalg
    solve = lambda a: L.solve(a, mx.ones(a.shape[:-1]))  # noqa: E731
    # {bad matrix: the ops that must refuse it}; in a stack, one bad matrix is enough.
    cases = [(np.array([[1, 2, 0], [2, 4, 0], [0, 0, 1]], np.float32), (L.inv, solve)),
             (np.array([[1, 2, 0], [2, 1, 0], [0, 0, 1]], np.float32), (L.cholesky,))]
    for bad, ops in cases:
        stack = np.stack([np.eye(3, dtype=np.float32)] * (batch[0] - 1) + [bad]) if batch else bad
        for f in ops:
            for dev in (mx.cpu, mx.gpu):
                with mx.stream(dev), pytest.raises(LinAlgError,
                                                   match=r"\[(Inverse|Solve|Cholesky)\]"):
                    mx.eval(f(mx.array(stack)))


@needs_gpu
def test_every_primitive_has_a_gpu_kernel():
    missing = [cls.name for cls in registry.primitives
               if resolve_kernel(CUDA, cls)[1] == "missing"]
    assert not missing, f"no CUDA kernel: {missing}"


@needs_gpu
def test_data_moves_between_devices():
    import cupy as cp
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = mx.array(host)                            # host data
    g = mx.exp(a, stream=mx.gpu)                  # uploaded for the GPU
    c = mx.add(g, 1.0, stream=mx.cpu)             # downloaded for the CPU
    mx.eval(c)
    assert isinstance(g._data, cp.ndarray) and isinstance(c._data, np.ndarray)
    np.testing.assert_allclose(np.asarray(c), np.exp(host) + 1, rtol=1e-6)
    assert g.tolist()[0][1] == pytest.approx(np.e, rel=1e-6)
    assert mx.sum(g, stream=mx.gpu).item() == pytest.approx(np.exp(host).sum(), rel=1e-5)
    assert "array(" in repr(g)
    # numpy views of GPU results are host copies and read-only
    v = np.asarray(g)
    assert not v.flags.writeable


@needs_gpu
def test_transforms_on_gpu():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    x = rng.standard_normal((16, 8)).astype(np.float32)

    def loss(w, x):
        return mx.mean(mx.logsumexp(mx.tanh(x @ w), axis=-1))

    results = {}
    for dev in (mx.cpu, mx.gpu):
        with mx.stream(dev):
            v, gw = mx.value_and_grad(loss)(mx.array(w), mx.array(x))
            bx = mx.vmap(lambda r: mx.sum(mx.sin(r) * 2.0))(mx.array(x))
            cl = mx.compile(loss)(mx.array(w), mx.array(x))
            mx.eval(v, gw, bx, cl)
            results[dev] = [np.asarray(t) for t in (v, gw, bx, cl)]
    for c, g in zip(results[mx.cpu], results[mx.gpu]):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-6)


@needs_gpu
def test_cuda_kernel_errors():
    from lazyx.backends.cuda import CudaKernel
    bad = CudaKernel('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }',
                     "bad.cu")
    with pytest.raises(LazyxError, match="bad.cu"):
        bad.function("k")
    good = CudaKernel('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "good.cu")
    with pytest.raises(LazyxError, match="no kernel 'nope'"):
        good.function("nope")


@needs_gpu
def test_gpu_memory_figures_and_limit():
    mx.eval(mx.ones((1024, 1024), stream=mx.gpu))
    stats = CUDA.memory_stats()
    assert stats["peak"] >= stats["active"] >= 0 and stats["cache"] >= 0


@needs_gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.float64, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("axes", [(-1,), (1, 2), (0,), (0, 2)], ids=str)
def test_softmax_and_logsumexp_kernels_match_cpu(dtype, axes):
    gen = np.random.default_rng(5)
    x = gen.uniform(-4, 4, (3, 5, 700)).astype(np.float32)
    x[0, 0, :] = -np.inf          # a row of -inf: NaN from softmax, -inf from logsumexp
    x[0, 1, 3] = np.inf           # +inf in a row
    x[0, 2, 7] = np.nan           # NaN in a row
    a = mx.astype(mx.array(x), dtype)
    for keepdims in (False, True):
        got = {}
        for dev in (mx.cpu, mx.gpu):
            s = mx.softmax(a, axis=list(axes), stream=dev)
            l = mx.logsumexp(a, axis=list(axes), keepdims=keepdims, stream=dev)
            mx.eval(s, l)
            got[dev] = [np.asarray(mx.astype(t, mx.float64, stream=mx.cpu)) for t in (s, l)]
        tol = 1e-5 if dtype in (mx.float32, mx.float64) else 2e-2
        for c, g in zip(got[mx.cpu], got[mx.gpu]):
            np.testing.assert_allclose(g, c, rtol=tol, atol=tol, equal_nan=True)


# -- cuDNN convolutions ----------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", [
    dict(stride=1, padding=1),                      # the common 3x3 'same'
    dict(stride=2, padding=(0, 1), dilation=2),     # strided, dilated, one-sided
    dict(stride=1, padding=0, groups=4),            # grouped
])
def test_conv2d_on_cudnn_matches_the_cpu_and_its_gradients(dtype, case):
    from lazyx.backends.cuda import cudnn
    if cudnn.library() is None:
        pytest.skip("no cuDNN library here: convolutions run im2col on cuBLAS")
    gen = np.random.default_rng(0)
    x = gen.standard_normal((2, 11, 9, 8)).astype(np.float32)
    w = (gen.standard_normal((12, 3, 3, 8 // case.get("groups", 1))) * 0.3).astype(np.float32)
    dt = getattr(mx, dtype)

    def f(a, b, stream):
        return mx.conv2d(a, b, **case, stream=stream)

    def loss(a, b, stream):
        return mx.sum(mx.square(f(a, b, stream)), stream=stream)

    ref = [np.asarray(mx.astype(v, mx.float32)) for v in
           [f(mx.array(x).astype(dt), mx.array(w).astype(dt), mx.cpu)]
           + list(mx.grad(lambda a, b: loss(a, b, mx.cpu), argnums=(0, 1))(
               mx.array(x).astype(dt), mx.array(w).astype(dt)))]
    plans = cudnn._state.setdefault("plans", {})
    before = len(plans)
    xg, wg = mx.array(x).astype(dt), mx.array(w).astype(dt)
    got = [f(xg, wg, mx.gpu)] + list(mx.grad(lambda a, b: loss(a, b, mx.gpu), argnums=(0, 1))(xg, wg))
    got = [np.asarray(mx.astype(v, mx.float32)) for v in got]
    tol = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 8e-2}[dtype]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * np.abs(r).max())
    # cuDNN ran them (new plans: the forward and the two gradient convolutions), and the
    # float32 ones without TF32 (the tolerance above is float32's)
    assert len(plans) > before or any(k[4] == np.dtype(xg.dtype.np) for k in plans)
