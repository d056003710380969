"""Plugin discovery through real entry points.

The test pack ``tests/plugin_packages/lazyx-testpack`` is pip-installed by the
test command; broken and conflicting plugins are real distributions laid out as
``*.dist-info`` folders on ``PYTHONPATH`` of a subprocess.
"""

import importlib.metadata as md
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.errors import PluginError

BUILTIN = {"creation", "elementwise", "reductions", "shapes", "indexing", "products", "sorting",
           "random", "cpu", "metal"}


def test_builtin_packs_come_from_lazyx_entry_points():
    eps = {ep.name: ep for ep in md.entry_points(group="lazyx")}
    for name in BUILTIN:
        assert eps[name].dist.name == "lazyx"
        info = registry.plugins[name]
        assert info.distribution == "lazyx" and info.error is None
    assert {"cpu", "cpu-reference"} <= set(registry.plugins["cpu"].backends)


def test_installed_test_pack_is_found_by_its_entry_point():
    info = registry.plugins.get("testpack")
    assert info is not None, ("the test pack is not installed: "
                              "pip install ./tests/plugin_packages/lazyx-testpack")
    assert info.distribution == "lazyx-testpack" and info.version == "0.3.1"
    import lazyx_testpack
    assert lazyx_testpack.Cube in registry.primitives
    assert registry.primitives[lazyx_testpack.Cube] is info
    x = mx.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(np.array(mx.testpack.cube(x)), [1.0, -8.0, 27.0])
    assert x.cube().tolist() == [1.0, -8.0, 27.0]
    assert "testpack.cube" in info.ops


def _fake_dist(root, dist, module, source, group_entries):
    """Lay out an installed distribution: its module and a dist-info with entry points."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    di = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
    di.mkdir()
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    (di / "entry_points.txt").write_text("[lazyx]\n" + "".join(f"{k} = {v}\n" for k, v in group_entries.items()))


def _run(root, code):
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_plugin_that_fails_to_import_is_reported_and_skipped(tmp_path):
    _fake_dist(tmp_path, "broken-pack", "broken_pack", """
        raise ImportError("libfoo.so.3: cannot open shared object file")
    """, {"broken": "broken_pack"})
    r = _run(tmp_path, """
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import lazyx.core as mx
        msgs = [str(x.message) for x in w]
        print("WARN:", msgs)
        print("ADD:", (mx.array([1]) + 1).tolist())
        from lazyx import registry
        p = registry.plugins["broken"]
        print("ERR:", p.distribution, type(p.error).__name__, p.error)
    """)
    assert r.returncode == 0, r.stderr
    assert "broken-pack" in r.stdout and "libfoo.so.3" in r.stdout
    assert "ADD: [2]" in r.stdout
    assert "ERR: broken-pack ImportError libfoo.so.3" in r.stdout
    info = subprocess.run([sys.executable, "-m", "lazyx", "info"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=120)
    assert "FAILED TO LOAD: ImportError: libfoo.so.3" in info.stdout


def test_two_plugins_claiming_one_name_is_an_error_naming_both(tmp_path):
    src = """
        from lazyx import hookimpl
        def twice(x):
            return x * 2
        @hookimpl
        def lazyx_ops():
            return {"twice": twice, "add": twice}
    """
    _fake_dist(tmp_path, "pack-one", "pack_one", src, {"one": "pack_one"})
    _fake_dist(tmp_path, "pack-two", "pack_two", src, {"two": "pack_two"})
    r = _run(tmp_path, """
        import warnings
        warnings.simplefilter("ignore")
        import lazyx.core as mx
        from lazyx.errors import PluginError
        for name in ("twice", "add"):
            try:
                getattr(mx, name)
            except PluginError as e:
                print("ERROR:", name, e)
        print("EXP:", mx.exp(mx.array([0.0])).tolist())
    """)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("ERROR:")]
    assert len(lines) == 2
    assert "pack-one" in lines[0] and "pack-two" in lines[0]
    assert "'lazyx'" in lines[1] and "pack-one" in lines[1]
    assert "EXP: [1.0]" in r.stdout


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_op"):
        mx.no_such_op
    with pytest.raises(PluginError):
        registry.register_plugin(object(), "elementwise")
