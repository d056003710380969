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

Nothing here imports ``lazyx.core`` until a test asks for a backend, so the
plugin costs nothing to test suites that do not use it. Disable it with
``-p no:lazyx``.
"""

from __future__ import annotations

import pytest

MARKER = "lazyx_backends"


def pytest_addoption(parser):
    group = parser.getgroup("lazyx")
    group.addoption("--lazyx-backend", action="append", default=[], metavar="NAME",
                    help="run tests that use the lazyx_backend fixture on this lazyx backend "
                         "only (repeatable; default: every available backend)")


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
        from .environment import available_backends
        names = available_backends()
    metafunc.parametrize("lazyx_backend", names, indirect=True, ids=names)


@pytest.fixture
def lazyx_backend(request):
    """The active backend: the test runs once per available lazyx backend."""
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
