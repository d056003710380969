"""Plugin discovery through real entry points.

The test pack ``tests/plugin_packages/lazyx-testpack`` is pip-installed by the
test command into ``build/test-plugins``, which only the test session sees; broken
and conflicting plugins are real distributions laid out as ``*.dist-info`` folders on
``PYTHONPATH`` of a subprocess. No plugin can break
``import lazyx.core`` or take a built-in's name: each way of trying is one of them.
"""

import importlib.metadata as md
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import hookimpl, registry
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
                              "pip install --no-deps --upgrade --target build/test-plugins "
                              "./tests/plugin_packages/*")
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


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_op"):
        mx.no_such_op
    with pytest.raises(PluginError):
        registry.register_plugin(object(), "elementwise")


# --- Plugins cannot break the core ------------------------------------------------------
#
# One environment of misbehaving distributions, imported once in a subprocess (a plugin
# that calls sys.exit would end the test run itself); each test checks its own case in
# the report. The probe checks that the built-ins still compute, against NumPy.

_PROBE = """
    import json, warnings
    import numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lazyx.core as mx
    from lazyx import registry
    from lazyx.backend import backends
    from lazyx.errors import PluginError

    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.25]])
    a = mx.array(x)
    np.testing.assert_allclose(np.array(mx.exp(a)), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(a.sum().item(), x.sum(), rtol=1e-6)
    np.testing.assert_allclose(np.array(a.sum(axis=0)), x.sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(np.array(mx.add(a, 1)), x + 1, rtol=1e-6)
    assert mx.zeros((2,)).tolist() == [0.0, 0.0]

    # The registry stays valid: every built-in name and pack is lazyx's own, nothing
    # failed is half-registered, and every registered name is installed.
    import importlib.metadata as md
    core = {ep.name for ep in md.entry_points(group="lazyx") if ep.dist.name == "lazyx"}
    assert all(registry.plugins[n].distribution == "lazyx" and registry.plugins[n].error is None
               for n in core), core
    for name in ("exp", "add", "zeros", "array.sum"):
        assert registry.ops[name][1].distribution == "lazyx", name
    assert not [n for n, owners in registry.conflicts.items() if any(o.builtin for o in owners)]
    broken = [p for p in registry.plugins.values() if p.error is not None]
    assert not [p for p in broken if p.ops or p.primitives or p.backends or p.kernels
                or p.module in registry.plugin_manager.get_plugins()]
    assert all(registry.primitives[c].error is None for c in registry.primitives)
    for name, (fn, info) in registry.ops.items():
        prefix, _, attr = name.rpartition(".")
        target = mx.array if prefix == "array" else getattr(mx, prefix) if prefix else mx
        assert target.__dict__[attr] is fn if prefix == "array" else getattr(target, attr) is fn, name
    assert {"cpu", "cpu-reference"} <= set(backends())

    names = {}
    for name in ("twice", "only_one"):
        try:
            names[name] = repr(getattr(mx, name)(mx.array([2.0])).tolist())
        except (PluginError, AttributeError) as e:
            names[name] = f"{type(e).__name__}: {e}"
    print("REPORT", json.dumps({
        "warnings": [str(w.message) for w in caught],
        "names": names,
        "plugins": {n: [p.distribution, type(p.error).__name__ if p.error else None,
                        p.ops, [c.__name__ for c in p.primitives], [c for c, _ in p.refused]]
                    for n, p in registry.plugins.items()},
        "skipped": [[p.name, p.distribution, why] for p, why in registry.skipped],
    }))
"""

_MISBEHAVING = {
    # (distribution, module, entry points, source)
    "shadow": ("lazyx-shadow", "shadow_pack", {"creation": "shadow_pack"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"zeros": lambda *a, **k: "not zeros"}
    """),
    "exit_at_import": ("lazyx-exits", "exits_pack", {"exits": "exits_pack"}, """
        import sys
        sys.exit("exits_pack gives up")
    """),
    "base_exception_at_import": ("lazyx-stops", "stops_pack", {"stops": "stops_pack"}, """
        class Stop(BaseException):
            pass
        raise Stop("stops_pack stops")
    """),
    "exit_in_hook": ("lazyx-hook-exits", "hook_exits_pack", {"hookexits": "hook_exits_pack"}, """
        import sys
        from lazyx import hookimpl
        from lazyx.primitive import Primitive
        class HalfRegistered(Primitive):
            pass
        @hookimpl
        def lazyx_primitives():
            return [HalfRegistered]
        @hookimpl
        def lazyx_ops():
            sys.exit(7)
    """),
    "claims_exp": ("lazyx-exp-claim", "exp_claim", {"expclaim": "exp_claim"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"exp": lambda x, stream=None: x, "only_one": lambda x, stream=None: x * 3}
    """),
    "claims_sum": ("lazyx-sum-claim", "sum_claim", {"sumclaim": "sum_claim"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"array.sum": lambda self, *a, **k: -1}
    """),
    "pack_one": ("pack-one", "pack_one", {"one": "pack_one"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"twice": lambda x, stream=None: x * 2, "add": lambda a, b, stream=None: a}
    """),
    "pack_two": ("pack-two", "pack_two", {"two": "pack_two"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"twice": lambda x, stream=None: x * 2}
    """),
}


def _install_all(root, cases):
    for dist, module, eps, source in cases:
        _fake_dist(root, dist, module, source, eps)


def _report(r):
    import json
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("REPORT ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[0][len("REPORT "):])


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory):
    """The report of ``import lazyx.core`` with every misbehaving plugin installed, and
    ``lazyx info``'s output in the same environment."""
    root = tmp_path_factory.mktemp("misbehaving")
    _install_all(root, _MISBEHAVING.values())
    report = _report(_run(root, _PROBE))
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    info = subprocess.run([sys.executable, "-m", "lazyx", "info"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert info.returncode == 0, info.stderr
    return report, info.stdout


def _warnings_naming(report, *words):
    return [w for w in report["warnings"] if all(word in w for word in words)]


def test_entry_point_named_like_a_builtin_pack_is_skipped(misbehaving):
    report, info = misbehaving
    assert [s[:2] for s in report["skipped"]] == [["creation", "lazyx-shadow"]]
    assert _warnings_naming(report, "lazyx-shadow", "'creation'", "built-in pack", "skipped")
    assert report["plugins"]["creation"][0] == "lazyx"          # the built-in is kept
    assert "lazyx-shadow" not in {p[0] for p in report["plugins"].values()}
    assert "creation (lazyx-shadow 1.2.3): its entry-point name 'creation' is taken" in info


@pytest.mark.parametrize("case, name, error, text", [
    ("exit_at_import", "exits", "SystemExit", "exits_pack gives up"),
    ("base_exception_at_import", "stops", "Stop", "stops_pack stops"),
    ("exit_in_hook", "hookexits", "SystemExit", "7"),
])
def test_plugin_that_exits_is_skipped_with_nothing_registered(misbehaving, case, name, error, text):
    report, info = misbehaving
    dist = _MISBEHAVING[case][0]
    assert _warnings_naming(report, dist, error, text, "skipped")
    assert report["plugins"][name][:2] == [dist, error]
    assert report["plugins"][name][2:4] == [[], []]             # nothing half-registered
    assert f"{name} ({dist} 1.2.3): FAILED TO LOAD: {error}: {text}" in info


@pytest.mark.parametrize("case, name, claim", [("claims_exp", "expclaim", "exp"),
                                                ("claims_sum", "sumclaim", "array.sum")])
def test_claim_on_a_builtin_name_is_refused_and_the_builtin_kept(misbehaving, case, name, claim):
    report, info = misbehaving
    dist = _MISBEHAVING[case][0]
    # The probe checked mx.exp and a.sum() against NumPy; here: who was told.
    warned = _warnings_naming(report, dist, f"claims {claim!r}", "'lazyx'", "refused")
    assert len(warned) == 1, report["warnings"]
    assert report["plugins"][name][4] == [claim] and claim not in report["plugins"][name][2]
    assert f"REFUSED: {claim} (built in: plugin " in info
    if case == "claims_exp":   # the rest of the plugin still loads
        assert report["plugins"][name][2] == ["only_one"] and report["names"]["only_one"] == "[6.0]"


def test_two_third_party_plugins_claiming_one_name_is_an_error_naming_both(misbehaving):
    report, info = misbehaving
    error = report["names"]["twice"]
    assert error.startswith("PluginError: ") and "pack-one" in error and "pack-two" in error
    assert _warnings_naming(report, "pack-one", "pack-two", "'twice'", "disabled")
    # pack-one's claim on the built-in `add` is refused, not a conflict.
    assert report["plugins"]["one"][4] == ["add"]
    assert "twice: plugin 'one' of distribution 'pack-one'" in info


_POLITE = [
    ("lazyx-extra", "extra_pack", {"extra": "extra_pack"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"only_one": lambda x, stream=None: x * 3}
    """),
    ("lazyx-other", "other_pack", {"other": "other_pack"}, """
        from lazyx import hookimpl
        @hookimpl
        def lazyx_ops():
            return {"twice": lambda x, stream=None: x * 2}
    """),
]


@pytest.mark.parametrize("wanted", [None, "extra, nosuch"])
def test_autoload_disabled_loads_builtins_and_the_named_plugins(tmp_path, wanted):
    _install_all(tmp_path, _POLITE)
    env = {"LAZYX_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if wanted:
        env["LAZYX_PLUGINS"] = wanted
    code = "import os\nos.environ.update(%r)\n" % env + textwrap.dedent(_PROBE)
    report = _report(_run(tmp_path, code))
    loaded = {n: p[0] for n, p in report["plugins"].items()}
    skipped = {s[0]: (s[1], s[2]) for s in report["skipped"]}
    assert set(loaded.values()) == ({"lazyx", "lazyx-extra"} if wanted else {"lazyx"})
    # Every other third-party plugin, the pip-installed ones too, is skipped and says why.
    for name in ["other", "testpack", "axpby", "counting"] + ([] if wanted else ["extra"]):
        dist, why = skipped[name]
        assert "LAZYX_DISABLE_PLUGIN_AUTOLOAD is set" in why and f"{name!r}" in why
        # Skipped as asked: recorded for `lazyx info`, not warned about.
        assert not _warnings_naming(report, dist, "skipped")
    assert report["names"]["twice"].startswith("AttributeError: ")
    if wanted:
        assert report["names"]["only_one"] == "[6.0]"
        assert _warnings_naming(report, "LAZYX_PLUGINS", "'nosuch'", "no installed distribution")
    info = subprocess.run([sys.executable, "-m", "lazyx", "info"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env, PYTHONPATH=str(tmp_path)))
    assert "Skipped plugins (not loaded):" in info.stdout
    assert "other (lazyx-other 1.2.3): LAZYX_DISABLE_PLUGIN_AUTOLOAD is set" in info.stdout
    assert "creation (lazyx " in info.stdout


# --- The same rules, registering by hand (order, primitives, backends) ------------------

class _Pack:
    """A plugin object whose hooks return what it is given."""

    def __init__(self, ops=None, primitives=(), backends=()):
        self._ops, self._primitives, self._backends = ops or {}, list(primitives), list(backends)

    @hookimpl
    def lazyx_ops(self):
        return self._ops

    @hookimpl
    def lazyx_primitives(self):
        return self._primitives

    @hookimpl
    def lazyx_backends(self):
        return self._backends


def test_a_builtin_wins_whatever_the_registration_order():
    from lazyx.testing import isolated_registry

    def early(x, stream=None):
        return "third party"

    def builtin(x, stream=None):
        return x + 1

    with isolated_registry():
        with pytest.warns(RuntimeWarning, match="'early-one'.*'early-two'.*'late_op'"):
            one = registry.register_plugin(_Pack({"late_op": early, "array.late_method": early}),
                                           "early", "early-one", "1")
            registry.register_plugin(_Pack({"late_op": early}), "early2", "early-two", "1")
        with pytest.raises(PluginError, match="early-one"):
            mx.late_op
        with pytest.warns(RuntimeWarning) as caught:
            registry.register_plugin(_Pack({"late_op": builtin, "array.late_method": builtin}),
                                     "late-builtin", registry.CORE_DISTRIBUTION, "0")
        messages = [str(w.message) for w in caught]
        for dist, claim in [("early-one", "late_op"), ("early-two", "late_op"),
                            ("early-one", "array.late_method")]:
            assert [m for m in messages if dist in m and f"claims {claim!r}" in m
                    and "'late-builtin' of distribution 'lazyx'" in m], messages
        assert mx.late_op(mx.array([1.0])).tolist() == [2.0]
        assert mx.array([2.0]).late_method().tolist() == [3.0]
        assert "late_op" not in registry.conflicts and registry.ops["late_op"][0] is builtin
        assert one.ops == [] and [c for c, _ in one.refused] == ["late_op", "array.late_method"]
    assert not hasattr(mx.array, "late_method")


def test_claims_on_builtin_primitives_backends_and_core_names_are_refused():
    from lazyx.backend import backends
    from lazyx.backends.cpu import CpuBackend
    from lazyx.plugins.elementwise import Exp
    from lazyx.testing import isolated_registry

    cpu = backends()["cpu"]
    with isolated_registry():
        with pytest.warns(RuntimeWarning) as caught:
            info = registry.register_plugin(
                _Pack({"eval": None, "eval.sub": None, "random": None, "array.shape": None},
                      primitives=[Exp]), "grabby", "lazyx-grabby", "1")
        refused = [c for c, _ in info.refused]
        assert refused == ["primitive Exp", "eval", "eval.sub", "random", "array.shape"]
        assert len([w for w in caught if "lazyx-grabby" in str(w.message)]) == 5
        assert registry.primitives[Exp].distribution == "lazyx" and info.primitives == []
        mx.eval(mx.array([1.0]))
        assert mx.random.uniform(shape=(2,)).shape == (2,) and mx.array([1.0]).shape == (1,)
        # A backend named like a built-in one: the whole plugin registers nothing.
        with pytest.warns(RuntimeWarning, match="lazyx-second-cpu.*backend 'cpu' is already"):
            info = registry.register_plugin(_Pack({"second_cpu_op": abs}, backends=[CpuBackend()]),
                                            "second-cpu", "lazyx-second-cpu", "1")
        assert isinstance(info.error, PluginError) and not info.ops and backends()["cpu"] is cpu
        assert not hasattr(mx, "second_cpu_op")
        np.testing.assert_allclose(np.array(mx.exp(mx.array([0.0, 1.0]))), np.exp([0.0, 1.0]))
