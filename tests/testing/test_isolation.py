"""The test-only plugin distributions are visible to the test session, never to the environment.

The README's test command installs ``tests/plugin_packages/*`` with ``pip install
--no-deps --target build/test-plugins``, and ``pyproject.toml`` names that folder
in the ini option ``lazyx_plugin_path`` of lazyx's pytest plugin, which puts it on
``sys.path`` and ``PYTHONPATH`` before lazyx discovers its plugins. Here: the
session finds them through real entry points (their ``*.dist-info`` in that
folder), the environment without the folder has none of them (``lazyx info``, the
entry points, a user's own suite with the ``lazyx_backend`` fixture), and the
mechanism itself, for any plugin author's folder: a session sees the folder's plugin,
and importing ``lazyx.core`` before the folder is on the path is an error.
"""

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap

import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.testing import available_backends
from lazyx.testing.pytest_plugin import PLUGIN_PATH_INI

pytest_plugins = ["pytester"]

# The distributions of tests/plugin_packages/ and their entry points.
TEST_DISTRIBUTIONS = {"lazyx-testpack": {"testpack"},
                      "lazyx-countingbackend": {"counting", "counting-overrides"},
                      "lazyx-axpby": {"axpby"}}


@pytest.fixture(scope="module")
def folders(pytestconfig):
    found = [str(p) for p in pytestconfig.getini(PLUGIN_PATH_INI)]
    assert found, f"pyproject.toml's [tool.pytest.ini_options] sets no {PLUGIN_PATH_INI}"
    return found


def _environment_without(folders):
    """This process's environment, less the session's plugin folders on PYTHONPATH."""
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in folders]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


_LIST_ENTRY_POINTS = ("import importlib.metadata as m, json; print(json.dumps("
                      "sorted([e.name, e.dist.name] for e in m.entry_points(group='lazyx'))))")


def _entry_points(env, cwd):
    r = subprocess.run([sys.executable, "-c", _LIST_ENTRY_POINTS], capture_output=True,
                       text=True, env=env, cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    return {name: dist for name, dist in json.loads(r.stdout)}


def _info_plugins(env, cwd):
    r = subprocess.run([sys.executable, "-m", "lazyx", "info", "--json"], capture_output=True,
                       text=True, env=env, cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    return {p["name"]: p["distribution"] for p in json.loads(r.stdout)["plugins"]}


def test_the_session_finds_the_test_plugins_through_their_entry_points(folders):
    # What the folders hold, read from their dist-info ...
    held = {d.metadata["Name"]: {ep.name for ep in d.entry_points.select(group="lazyx")}
            for d in md.distributions(path=folders)}
    assert {k: held.get(k) for k in TEST_DISTRIBUTIONS} == TEST_DISTRIBUTIONS, (
        f"install the test plugins: pip install --no-deps --upgrade --target {folders[0]} "
        f"./tests/plugin_packages/*")
    # ... is what this session's entry points and registry have, from those very files.
    eps = {ep.name: ep for ep in md.entry_points(group="lazyx")}
    for dist, names in TEST_DISTRIBUTIONS.items():
        for name in names:
            where = str(eps[name].dist.locate_file(""))
            assert eps[name].dist.name == dist and any(where.startswith(f) for f in folders)
            info = registry.plugins[name]
            assert (info.distribution, info.error) == (dist, None)
    assert mx.testpack.cube(mx.array([2.0])).tolist() == [8.0]
    assert "counting" in available_backends()


def test_child_processes_of_the_session_see_them_and_the_environment_does_not(folders, tmp_path):
    inside = _info_plugins(os.environ, tmp_path)
    outside = _info_plugins(_environment_without(folders), tmp_path)
    for dist, names in TEST_DISTRIBUTIONS.items():
        assert {inside.get(n) for n in names} == {dist}
    assert set(outside) & {n for names in TEST_DISTRIBUTIONS.values() for n in names} == set(), (
        "the test plugins are installed in the environment itself: pip uninstall "
        + " ".join(TEST_DISTRIBUTIONS))
    assert outside == {n: d for n, d in inside.items() if d not in TEST_DISTRIBUTIONS}
    eps = _entry_points(_environment_without(folders), tmp_path)
    assert set(eps.values()) & set(TEST_DISTRIBUTIONS) == set(), eps
    assert eps["creation"] == "lazyx"


def test_a_users_own_suite_never_runs_on_a_test_backend(pytester, monkeypatch, folders):
    monkeypatch.setenv("PYTHONPATH", _environment_without(folders)["PYTHONPATH"])
    pytester.makepyfile(test_user="def test_mine(lazyx_backend):\n    pass\n")
    r = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    out = "\n".join(r.outlines)
    assert r.ret == 0 and "test_mine[cpu] PASSED" in out and "test_mine[cpu-reference]" in out
    assert "[counting]" not in out, out


_TRIPLER = {
    "tripler_pack.py": """
        from lazyx import hookimpl

        @hookimpl
        def lazyx_ops():
            return {"tripled": lambda x, stream=None: x * 3}
    """,
    "lazyx_tripler-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: lazyx-tripler\n"
                                            "Version: 1.0\n",
    "lazyx_tripler-1.0.dist-info/entry_points.txt": "[lazyx]\ntripler = tripler_pack\n",
}

_SEES_IT = """
    import os
    import lazyx.core as mx
    from lazyx import registry

    def test_the_folder_s_plugin_is_loaded():
        assert registry.plugins["tripler"].distribution == "lazyx-tripler"
        assert mx.tripled(mx.array([1.0, 2.0])).tolist() == [3.0, 6.0]

    def test_child_processes_inherit_the_folder():
        folder = os.path.join(os.path.dirname(__file__), "plugins")
        assert folder in os.environ["PYTHONPATH"].split(os.pathsep)
"""


def test_a_folder_on_lazyx_plugin_path_is_seen_by_its_session_only(pytester, monkeypatch, folders):
    monkeypatch.setenv("PYTHONPATH", _environment_without(folders)["PYTHONPATH"])
    for name, text in _TRIPLER.items():
        (pytester.path / "plugins" / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / "plugins" / name).write_text(textwrap.dedent(text))
    pytester.makeini(f"[pytest]\n{PLUGIN_PATH_INI} = plugins\n")
    pytester.makepyfile(test_sees=textwrap.dedent(_SEES_IT))
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)
    assert "tripler" not in _entry_points(dict(os.environ), pytester.path)

    # A plugin that imports lazyx.core at its top runs before the folder is on the path:
    # lazyx would discover its plugins without the folder's, so pytest stops and says why.
    pytester.makepyfile(early_import="import lazyx.core\n")
    r = pytester.runpytest_subprocess("-p", "early_import", "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(r.errlines)
    assert f"{PLUGIN_PATH_INI}: lazyx.core was imported before pytest put" in err
    assert str(pytester.path / "plugins") in err, err


def test_the_readme_and_ci_install_the_test_plugins_where_the_session_looks(folders):
    """CI runs exactly the README's test command, which fills the folder the ini names."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    command = [line for line in readme.splitlines() if "python -m pytest" in line]
    ci = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command == [ci], (command, ci)
    words = ci.split()
    target = root / words[words.index("--target") + 1]
    assert [str(target)] == folders and "./tests/plugin_packages/*" in words
    assert "--no-deps" in words   # lazyx itself stays the environment's, once
