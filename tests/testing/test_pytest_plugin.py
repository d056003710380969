"""lazyx's pytest plugin: the ``lazyx_backend`` fixture, its marker and its option.

The plugin is active in this very session (it is installed with lazyx through the
``pytest11`` entry point), so the first tests use it directly; the others run pytest
(``pytester``) on a small test file, as a plugin author's suite would.
"""

import importlib.metadata as md
import textwrap

import pytest

import lazyx.core as mx
from lazyx.backend import active_backend
from lazyx.testing import available_backends

pytest_plugins = ["pytester"]


def test_the_plugin_is_registered_by_entry_point():
    eps = {ep.name: ep for ep in md.entry_points(group="pytest11")}
    assert eps["lazyx"].value == "lazyx.testing.pytest_plugin"
    assert eps["lazyx"].dist.name == "lazyx"


def test_the_fixture_runs_the_test_once_per_backend(lazyx_backend, request):
    assert request.node.callspec.params["lazyx_backend"] == lazyx_backend.name
    assert active_backend(lazyx_backend.device_type) is lazyx_backend
    assert mx.default_device().type is lazyx_backend.device_type
    assert (mx.exp(mx.array([0.0, 1.0])) * 2).tolist() == pytest.approx([2.0, 5.43656], rel=1e-5)


@pytest.mark.lazyx_backends("counting")
def test_the_marker_chooses_the_backends(lazyx_backend):
    assert lazyx_backend.name == "counting"
    lazyx_backend.reset()
    mx.eval(mx.exp(mx.array([1.0])) + 1)
    assert lazyx_backend.launches == {"Exp": 1, "Add": 1}


SUITE = """
    import pytest
    import lazyx.core as mx

    def test_semantics(lazyx_backend):
        assert (mx.array([1, 2]) * 2).tolist() == [2, 4]

    @pytest.mark.lazyx_backends("cpu-reference", "metal")
    def test_chosen(lazyx_backend):
        assert lazyx_backend.name == "cpu-reference"

    def test_isolated(lazyx_isolated_registry):
        from lazyx.custom_primitive import custom_primitive, register
        register(custom_primitive(lambda x: x, elementwise=True, name="Ident"),
                 plugin="ident", install="ident")
        assert mx.ident

    def test_isolated_after():
        assert not hasattr(mx, "ident")
"""


def _pytest(pytester, *args):
    pytester.makepyfile(test_suite=textwrap.dedent(SUITE))
    r = pytester.runpytest_inprocess("-v", "-rs", "-p", "no:cacheprovider", *args)
    return r, "\n".join(r.outlines)


def test_a_suite_is_parametrised_over_every_available_backend(pytester):
    r, out = _pytest(pytester)
    for name in available_backends():
        assert f"test_semantics[{name}] PASSED" in out, out
    assert "test_chosen[cpu-reference] PASSED" in out
    if not mx.is_available(mx.gpu):
        assert "test_chosen[metal] SKIPPED" in out and "'metal' is not available" in out
    assert "test_isolated PASSED" in out and "test_isolated_after PASSED" in out
    assert r.ret == 0, out


def test_the_command_line_option_narrows_the_backends(pytester):
    r, out = _pytest(pytester, "--lazyx-backend", "cpu-reference", "-k", "semantics")
    assert r.ret == 0, out
    assert "test_semantics[cpu-reference] PASSED" in out
    assert "test_semantics[cpu]" not in out and "1 passed" in out


def test_the_plugin_can_be_disabled(pytester):
    r, out = _pytest(pytester, "-p", "no:lazyx", "-k", "semantics")
    assert r.ret != 0 and "fixture 'lazyx_backend' not found" in out
