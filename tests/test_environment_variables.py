"""Every environment variable lazyx reads is in ``lazyx.environment.VARIABLES`` and in
the table of ``docs/environment.md``, and ``lazyx info --env`` lists it.

The source tree is parsed (not imported): every ``os.environ.get(X)``, ``os.getenv(X)``,
``os.environ[X]`` and ``X in os.environ`` and ``read_variable(X)`` (the registry's checked read) of
``framework/``, ``backends/`` and ``plugins/`` names a variable, as a string literal, an f-string (``LAZYX_{...}_BACKEND``
matches the names it can make) or a module constant; C/C++ sources are searched for
``getenv("X")``. A read the scan cannot name fails too, so no read slips past. A variable with accepted
values (a choice or a number) is read only through ``read_variable``, so a bad value
is never ignored: the tests at the end set a bad value of each kind and see the error or
the warning, naming the variable and what it accepts.
"""

import ast
import json
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from lazyx import cli, environment
from lazyx.environment import EnvironmentVariableError, read_variable
from lazyx.errors import DeviceError, LazyxError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("framework", "backends", "plugins")
NATIVE = (".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh", ".mm", ".metal")
DOC = ROOT / "docs" / "environment.md"
# The registry reads every variable it lists (for `lazyx info --env`), by definition.
REGISTRY_SOURCE = "framework/lazyx/environment.py"


def _is_environ(node) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def _checked_read(node) -> bool:
    """``read_variable(X, ...)`` or ``environment.read_variable(X, ...)``."""
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "read_variable") or \
        (isinstance(f, ast.Attribute) and f.attr == "read_variable")


def _key_of(node) -> ast.expr | None:
    """The variable-name argument when ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if _checked_read(node):
            return node.args[0]
        if isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop") \
                and _is_environ(f.value):
            return node.args[0]
        if (isinstance(f, ast.Attribute) and f.attr == "getenv") or \
                (isinstance(f, ast.Name) and f.id == "getenv"):
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_environ(node.value) \
            and isinstance(node.ctx, ast.Load):
        return node.slice
    if isinstance(node, ast.Compare) and len(node.ops) == 1 \
            and isinstance(node.ops[0], (ast.In, ast.NotIn)) and _is_environ(node.comparators[0]):
        return node.left
    return None


def _pattern(key, constants: dict) -> str | None:
    """A regular expression of the names ``key`` can be (None: the scan cannot tell)."""
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return re.escape(key.value)
    if isinstance(key, ast.Name) and key.id in constants:
        return re.escape(constants[key.id])
    if isinstance(key, ast.JoinedStr):
        return "".join(re.escape(p.value) if isinstance(p, ast.Constant) else "[A-Z0-9_]+"
                       for p in key.values)
    return None


def environment_reads() -> list[tuple[str, str, int, bool]]:
    """``(pattern, file relative to the root, line, through read_variable)`` of every
    environment read."""
    reads = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == REGISTRY_SOURCE:
                continue
            if path.suffix == ".py":
                tree = ast.parse(path.read_text(), str(path))
                constants = {t.id: n.value.value for n in tree.body
                             if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                             and isinstance(n.value.value, str)
                             for t in n.targets if isinstance(t, ast.Name)}
                for node in ast.walk(tree):
                    key = _key_of(node)
                    if key is not None:
                        checked = isinstance(node, ast.Call) and _checked_read(node)
                        reads.append((_pattern(key, constants), rel, node.lineno, checked))
            elif path.suffix in NATIVE:
                for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    for m in re.finditer(r"getenv\s*\(\s*(\"?)([^\")]*)\1", line):
                        reads.append((re.escape(m.group(2)) if m.group(1) else None, rel, i,
                                      False))
    return reads


def test_the_scan_finds_reads_of_every_form():
    src = ("import os\nfrom os import environ, getenv\nK = 'LAZYX_K'\n"
           "a = os.environ.get('LAZYX_A', '1')\nb = os.getenv('LAZYX_B')\n"
           "c = os.environ['LAZYX_C']\nd = 'LAZYX_D' in os.environ\ne = environ.get(K)\n"
           "f = os.environ.get(f'LAZYX_{x}_BACKEND')\ng = getenv(name)\nos.environ['W'] = '1'\n")
    src += "h = read_variable('LAZYX_H')\ni = environment.read_variable('LAZYX_I', ValueError)\n"
    tree = ast.parse(src)
    keys = [_pattern(k, {"K": "LAZYX_K"}) for k in map(_key_of, ast.walk(tree)) if k is not None]
    assert sorted(keys, key=str) == sorted(
        ["LAZYX_A", "LAZYX_B", "LAZYX_C", "LAZYX_D", "LAZYX_K", "LAZYX_[A-Z0-9_]+_BACKEND", None,
         "LAZYX_H", "LAZYX_I"], key=str)


def test_every_environment_read_is_registered_where_it_happens():
    reads = environment_reads()
    assert len(reads) >= 10, reads  # the scan sees the reads lazyx is known to have
    unnamed = [f"{f}:{line}" for p, f, line, _ in reads if p is None]
    assert not unnamed, (f"cannot tell which environment variable these read: {unnamed}; "
                         f"read a string literal or a module-level string constant")
    found: dict[str, set] = {}
    for pattern, path, line, _ in reads:
        names = [n for n in environment.VARIABLES if re.fullmatch(pattern, n)]
        assert names, (f"{path}:{line} reads the environment variable {pattern!r}, which "
                       f"lazyx.environment.VARIABLES does not list: add it there (name, "
                       f"default, meaning, where it is read) and regenerate docs/environment.md")
        for n in names:
            found.setdefault(n, set()).add(path)
    for name, v in environment.VARIABLES.items():
        assert set(v.read_in) == found.get(name, set()), (
            f"{name}: VARIABLES says it is read in {sorted(v.read_in)}, the source reads it "
            f"in {sorted(found.get(name, ()))}")


def test_the_docs_table_is_the_registry():
    text = DOC.read_text()
    assert environment.markdown_table() in text, (
        "docs/environment.md's table differs from lazyx.environment.VARIABLES: replace it with "
        "the output of `python -m lazyx.environment`")
    rows = [l for l in text.splitlines() if l.startswith("| `")]
    names = [re.match(r"\| `([^`]+)`", r).group(1) for r in rows]
    assert names[:len(environment.VARIABLES)] == list(environment.VARIABLES)


def test_current_values_and_bad_values():
    rows = {r["name"]: r for r in environment.current({"LAZYX_DEFAULT_DEVICE": "tpu",
                                                       "LAZYX_CPU_ELEMENTWISE": "0"})}
    assert list(rows) == list(environment.VARIABLES)
    assert rows["LAZYX_DEFAULT_DEVICE"]["value"] == "tpu"
    assert rows["LAZYX_DEFAULT_DEVICE"]["valid"] is False
    assert rows["LAZYX_DEFAULT_DEVICE"]["choices"] == ["cpu", "gpu"]
    assert rows["LAZYX_CPU_ELEMENTWISE"] == {
        "name": "LAZYX_CPU_ELEMENTWISE", "value": "0", "default": "1", "valid": True,
        "choices": ["0", "1"], "accepted": "one of 0, 1"}
    assert rows["LAZYX_CACHE_DIR"]["value"] is None and rows["LAZYX_CACHE_DIR"]["valid"]


def _run(*args, env=None):
    import os
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "lazyx", *args], capture_output=True,
                          text=True, timeout=120, env=full)


def test_info_env_lists_every_variable_with_its_value(tmp_path):
    r = _run("info", "--env", env={"LAZYX_CACHE_DIR": str(tmp_path), "LAZYX_CUDNN_LEGACY": "yes"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = lines.index("Environment variables:")
    block = lines[at + 1:at + 1 + len(environment.VARIABLES)]
    assert [re.split(r"[ =]", l.strip())[0] for l in block] == list(environment.VARIABLES)
    assert f"  LAZYX_CACHE_DIR={tmp_path}" in block
    legacy = next(l for l in block if l.startswith("  LAZYX_CUDNN_LEGACY"))
    assert legacy == "  LAZYX_CUDNN_LEGACY=yes  (NOT ACCEPTED: one of 0, 1)"
    unset = next(l for l in block if l.startswith("  LAZYX_CACHE_MAX_MB"))
    assert unset.startswith("  LAZYX_CACHE_MAX_MB (unset; default: 1024)")
    r = _run("info", "--json", "--env", env={"LAZYX_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    env = {e["name"]: e for e in json.loads(r.stdout)["environment"]}
    assert list(env) == list(environment.VARIABLES)
    assert env["LAZYX_CACHE_DIR"]["value"] == str(tmp_path)
    # Without --env the JSON has no environment (scripts ask for it).
    assert "environment" not in cli.info_data()


# -- bad values: one mechanism, every kind ------------------------------------------------
#: Presence tests that only decide whether to import the module that reads the value
#: through read_variable (``import lazyx`` loads logging only when LAZYX_LOG is set).
GATES = {("LAZYX_LOG", "framework/lazyx/__init__.py")}


def test_every_variable_with_accepted_values_is_read_through_read_variable():
    checked = [n for n, v in environment.VARIABLES.items() if v.choices or v.number]
    assert {"LAZYX_LOG", "LAZYX_DEFAULT_DEVICE", "LAZYX_CACHE_MAX_MB",
            "LAZYX_DISABLE_COMPILE"} <= set(checked)
    around = [f"{path}:{line} ({n})" for pattern, path, line, through in environment_reads()
              for n in checked if re.fullmatch(pattern or "", n) and not through
              and (n, path) not in GATES]
    assert not around, (f"these read a variable with accepted values around "
                         f"lazyx.environment.read_variable, so a bad value would pass: {around}")


@pytest.mark.parametrize("name", [n for n, v in environment.VARIABLES.items() if v.choices])
def test_a_choice_accepts_its_values_and_names_them_when_bad(name):
    v = environment.VARIABLES[name]
    for c in v.choices:
        assert read_variable(name, environ={name: f" {c.upper()} "}) == c
    assert read_variable(name, environ={}) is None
    assert read_variable(name, environ={name: "  "}) is None
    accepted = "one of " + ", ".join(v.choices)
    if v.invalid == "warning":
        with pytest.warns(RuntimeWarning) as got:
            assert read_variable(name, environ={name: "loud"}) is None  # as if unset
        (w,) = got
        assert str(w.message).startswith(f"{name}='loud' is not accepted: set it to {accepted}")
        assert w.filename == __file__  # the user's line, not lazyx's
    else:
        with pytest.raises(EnvironmentVariableError, match=re.escape(
                f"{name}='loud' is not accepted: set it to {accepted}, or unset it.")):
            read_variable(name, environ={name: "loud"})


def test_a_number_accepts_sizes_and_names_what_it_takes_when_bad():
    name = "LAZYX_CACHE_MAX_MB"
    assert read_variable(name, environ={name: "1.5"}) == 1.5
    assert read_variable(name, environ={name: "0"}) == 0.0
    for bad in ("big", "-1", "inf", "nan", "1e400"):
        with pytest.raises(EnvironmentVariableError) as e:
            read_variable(name, environ={name: bad})
        assert str(e.value) == (f"{name}={bad!r} is not accepted: set it to a size in MiB "
                                f"(e.g. 1024), or unset it.")
        assert isinstance(e.value, (LazyxError, ValueError))
    # A site names the error class its callers expect; the message stays the registry's.
    with pytest.raises(DeviceError, match="LAZYX_DEFAULT_DEVICE='tpu' is not accepted"):
        read_variable("LAZYX_DEFAULT_DEVICE", DeviceError, environ={"LAZYX_DEFAULT_DEVICE": "tpu"})


def test_free_text_passes_as_it_is():
    assert read_variable("LAZYX_CACHE_DIR", environ={"LAZYX_CACHE_DIR": " /x y "}) == "/x y"
    rows = {r["name"]: r for r in environment.current({"LAZYX_CACHE_MAX_MB": "big",
                                                       "LAZYX_LOG": "Debug"})}
    assert rows["LAZYX_CACHE_MAX_MB"]["valid"] is False
    assert rows["LAZYX_CACHE_MAX_MB"]["accepted"] == "a size in MiB (e.g. 1024)"
    assert rows["LAZYX_LOG"]["valid"] is True


BAD = textwrap.dedent("""
    import warnings
    warnings.simplefilter("always")
    import lazyx.core as mx
    {action}
    print("ran")
""")


@pytest.mark.parametrize("name, value, action, outcome", [
    # Read at import: a warning naming the variable, then lazyx runs as if it were unset.
    ("LAZYX_LOG", "loud", "", "RuntimeWarning: LAZYX_LOG='loud' is not accepted: set it to "
                              "one of debug, info, warning"),
    ("LAZYX_DISABLE_COMPILE", "maybe", "assert mx.compile(lambda x: x + 1)(mx.ones(2)).sum() == 4",
     "RuntimeWarning: LAZYX_DISABLE_COMPILE='maybe' is not accepted: set it to one of 1, 0, "
     "true, false, yes, no, on, off"),
    ("LAZYX_CPU_ELEMENTWISE", "no", "import lazyx.backends.cpu.compiled",
     "RuntimeWarning: LAZYX_CPU_ELEMENTWISE='no' is not accepted: set it to one of 0, 1"),
    # Errors: the import (the default device), the first kernel build (the cache cap).
    ("LAZYX_DEFAULT_DEVICE", "tpu", "", "DeviceError: LAZYX_DEFAULT_DEVICE='tpu' is not "
                                        "accepted: set it to one of cpu, gpu, or unset it."),
])
def test_a_bad_value_in_a_real_process_is_named(tmp_path, name, value, action, outcome):
    env = {name: value, "LAZYX_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", BAD.format(action=action)], capture_output=True,
                       text=True, timeout=120, env={**__import__("os").environ, **env})
    assert outcome in r.stderr, r.stderr
    if "Error" in outcome:
        assert r.returncode != 0 and "ran" not in r.stdout
    else:
        assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
        assert r.stderr.count(f"{name}=") == 1, r.stderr  # one warning, read once


def test_a_bad_cache_cap_is_an_error_at_the_first_build(monkeypatch, tmp_path):
    from lazyx.codegen import jit
    monkeypatch.setenv("LAZYX_CACHE_MAX_MB", "lots")
    with pytest.raises(jit.KernelCacheError, match="LAZYX_CACHE_MAX_MB='lots' is not accepted"):
        jit._max_bytes()
