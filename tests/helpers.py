"""Shared checks for the test suite: random data per dtype and comparison with NumPy.

The checks themselves live in :mod:`lazyx.testing.checks`, so that plugin
authors run exactly what lazyx's own tests run; this module keeps their names
importable as ``helpers`` from every test folder.

Every op test goes through :func:`check_op`: it builds lazyx inputs from NumPy
inputs, runs the lazyx op, runs the NumPy reference (in float64 for floating
inputs unless told otherwise), and compares shape, dtype and values with a
tolerance that depends on the result dtype. Transform tests use
:func:`check_vjp_fd`, :func:`check_jvp_vjp` and :func:`check_vmap_loop`.
"""

from lazyx.testing.checks import (  # noqa: F401
    ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, NUMERIC_DTYPES, REAL_DTYPES, SIGNED_DTYPES, TOLERANCES,
    assert_close, check_jvp_vjp, check_op, check_vjp_fd, check_vmap_loop, has_rules,
    reference_dtype, random_array, rng, to_lazyx)


def run_in_threads(work, n: int) -> None:
    """Run ``work(i)`` for ``i`` in ``range(n)``, each on its own thread at once; raise the
    first exception a thread raised (a failure on a thread would otherwise only print)."""
    import threading
    errors = []

    def guarded(i):
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(exc)
    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def emulated_metal_runner():
    """A fixture body: the Metal backend emulated on the CPU as the active GPU backend,
    yielding its shim runner (its ``launches`` cleared: the generated kernels run)."""
    import lazyx.core as mx
    from lazyx.backends import metal
    from lazyx.backends.metal import compiled
    previous = metal.emulate_on_cpu(True)
    try:
        with mx.use_backend("gpu", "metal"):
            runner = compiled.runner()
            runner.launches.clear()
            yield runner
    finally:
        metal.emulate_on_cpu(previous)
