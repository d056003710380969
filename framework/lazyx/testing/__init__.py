"""``lazyx.testing``: check a plugin's primitives, ops and backends as lazyx checks its own.

* :func:`check_primitive` runs every check the built-in primitives pass (shape
  rule, kernels on every backend, ``vjp``/``jvp``/``vmap``, ``compile``) and
  reports each failure by name;
* :func:`check_op`, :func:`assert_close`, :func:`random_array` and the dtype
  lists compare an op with a NumPy reference; :func:`check_vjp_fd`,
  :func:`check_jvp_vjp` and :func:`check_vmap_loop` check one transform;
* :func:`running_on`, :func:`available_backends` and :func:`isolated_registry`
  set up where a test runs.

Installed with lazyx, it is also a pytest plugin (entry point ``pytest11``,
:mod:`lazyx.testing.pytest_plugin`): the fixture ``lazyx_backend`` runs a test
once per available backend. Importing this package is cheap: the checks load
on first use, so the pytest plugin costs nothing to projects that do not use it.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "check_primitive": "primitive_checks", "CheckReport": "primitive_checks",
    "SKIPPABLE": "primitive_checks",
    "available_backends": "environment", "running_on": "environment",
    "isolated_registry": "environment",
}
_CHECKS = ("ALL_DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "SIGNED_DTYPES", "REAL_DTYPES",
           "NUMERIC_DTYPES", "TOLERANCES", "rng", "random_array", "reference_dtype", "to_lazyx",
           "assert_close", "check_op", "check_vjp_fd", "check_jvp_vjp", "check_vmap_loop",
           "has_rules")
_WHERE.update(dict.fromkeys(_CHECKS, "checks"))

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lazyx.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
