"""lazyx's pytest plugin, registered through the ``pytest11`` entry point ``lazyx``.

Fixtures:

* ``lazyx_backend``: the test runs once per available backend (``cpu``,
  ``cpu-reference``, a plugin's ``counting``, ``metal`` on a Mac ...), with that
  backend active and its device the default device; the value is the
  :class:`~lazyx.backend.Backend`. Test ids end in ``[<backend name>]``.
* ``lazyx_isolated_registry``: plugins registered in the test are taken away
  after it (:func:`lazyx.testing.isolated_registry`).

Choosing backends:

* ``@pytest.mark.lazyx_backends("cpu", "counting")`` runs a test on these
  backends only (a named backend that is not available is skipped, with the
  reason);
* ``pytest --lazyx-backend NAME`` (repeatable) runs every ``lazyx_backend`` test
  on those backends only.

Plugins for the test session only: the ini option ``lazyx_plugin_path`` names
folders (relative to the ini file) holding installed distributions, as
``pip install --no-deps --target DIR`` lays them out. The session sees their
``lazyx`` entry points as if they were installed; the environment does not, so
after the tests ``lazyx info`` and a user's own suites never meet them. The flow:

1. pytest loads this module through ``pytest11`` before any ``conftest.py``;
   importing it does not import ``lazyx.core``, so lazyx has not discovered its
   plugins yet (discovery runs once, at the first ``import lazyx.core``);
2. ``pytest_load_initial_conftests`` (first of its kind, before the conftest
   files are imported: in the controller and in every xdist worker, which parses
   its configuration anew) puts the folders at the front of ``sys.path`` and of
   ``PYTHONPATH`` (for the child processes the tests start);
3. the first ``import lazyx.core``, in a conftest or a test, discovers the
   entry points of the folders' ``*.dist-info`` through ``importlib.metadata``,
   exactly as an installed distribution's. Had something imported ``lazyx.core``
   before step 2, the folders' plugins would be missing without a word: that is
   a usage error naming the fix. Both paths are restored when pytest ends.

Nothing here imports ``lazyx.core`` until a test asks for a backend, so the
plugin costs nothing to test suites that do not use it. Disable it with
``-p no:lazyx``.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

MARKER = "lazyx_backends"
PLUGIN_PATH_INI = "lazyx_plugin_path"


def pytest_addoption(parser):
    group = parser.getgroup("lazyx")
    group.addoption("--lazyx-backend", action="append", default=[], metavar="NAME",
                    help="run tests that use the lazyx_backend fixture on this lazyx backend "
                         "only (repeatable; default: every available backend)")
    parser.addini(PLUGIN_PATH_INI, type="paths", default=[],
                  help="folders of installed distributions (pip install --no-deps --target "
                       "DIR) whose lazyx plugins this test session sees, and the environment "
                       "does not: put on sys.path and PYTHONPATH before lazyx discovers plugins")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config):
    """Put the ``lazyx_plugin_path`` folders on the paths before a conftest imports lazyx.core."""
    folders = [str(p) for p in early_config.getini(PLUGIN_PATH_INI)]
    if folders:
        _add_plugin_path(early_config, folders)


def _add_plugin_path(config, folders: list[str]) -> None:
    for folder in folders:
        if not os.path.isdir(folder):
            config.issue_config_time_warning(pytest.PytestConfigWarning(
                f"{PLUGIN_PATH_INI}: {folder} does not exist, so the plugins meant to be "
                f"installed there are missing from this test session; install them with "
                f"`pip install --no-deps --target {folder} <distributions>`"), stacklevel=2)
    new = [f for f in folders if f not in sys.path]
    if not new:   # put there by the user's PYTHONPATH, or a second session in one process
        return
    registry = sys.modules.get("lazyx.registry")
    if registry is not None and registry.loaded():
        raise pytest.UsageError(
            f"{PLUGIN_PATH_INI}: lazyx.core was imported before pytest put {', '.join(new)} "
            f"on sys.path (by a pytest plugin loaded earlier, or by the code that started "
            f"pytest), so lazyx discovered its plugins without the ones there. Import "
            f"lazyx.core inside that plugin's hooks or fixtures instead of at its top.")
    saved_env = os.environ.get("PYTHONPATH")
    sys.path[:0] = new
    inherited = (saved_env or "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [f for f in new if f not in inherited] + ([saved_env] if saved_env else []))
    importlib.invalidate_caches()   # importlib.metadata's view of the path, too

    def restore():
        sys.path[:] = [p for p in sys.path if p not in new]
        if saved_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_env
    config.add_cleanup(restore)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{MARKER}(*names): run this test's lazyx_backend fixture on these lazyx "
                   f"backends only")


def pytest_generate_tests(metafunc):
    if "lazyx_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker(MARKER)
    names = list(marker.args) if marker is not None else \
        list(metafunc.config.getoption("lazyx_backend") or ())
    if not names:
        _load_plugins()
        from .environment import available_backends
        names = available_backends()
    metafunc.parametrize("lazyx_backend", names, indirect=True, ids=names)


def _load_plugins():
    """Discover lazyx's plugins, the backends among them: a test module that uses the
    fixture need not import ``lazyx.core`` itself."""
    import lazyx.core  # noqa: F401  (here, not at the top: only suites that ask for a backend pay)


@pytest.fixture
def lazyx_backend(request):
    """The active backend: the test runs once per available lazyx backend."""
    _load_plugins()
    from ..backend import backends
    from .environment import running_on
    name = getattr(request, "param", None) or "cpu"
    b = backends().get(name)
    if b is None:
        pytest.fail(f"unknown lazyx backend {name!r}; registered: {', '.join(backends())}")
    if not b.is_available():
        pytest.skip(f"lazyx backend {name!r} is not available: {b.unavailable_reason()}")
    with running_on(b):
        yield b


@pytest.fixture
def lazyx_isolated_registry():
    """Plugins registered during the test are unregistered after it."""
    from .environment import isolated_registry
    with isolated_registry():
        yield
