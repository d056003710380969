"""Every environment variable lazyx reads is in ``lazyx.environment.VARIABLES`` and in
the table of ``docs/environment.md``, and ``lazyx info --env`` lists it.

The source tree is parsed (not imported): every ``os.environ.get(X)``, ``os.getenv(X)``,
``os.environ[X]`` and ``X in os.environ`` of ``framework/``, ``backends/`` and
``plugins/`` names a variable, as a string literal, an f-string (``LAZYX_{...}_BACKEND``
matches the names it can make) or a module constant; C/C++ sources are searched for
``getenv("X")``. A read the scan cannot name fails too, so no read slips past.
"""

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

from lazyx import cli, environment

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


def _key_of(node) -> ast.expr | None:
    """The variable-name argument when ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
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


def environment_reads() -> list[tuple[str, str, int]]:
    """``(pattern, file relative to the root, line)`` of every environment read."""
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
                        reads.append((_pattern(key, constants), rel, node.lineno))
            elif path.suffix in NATIVE:
                for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    for m in re.finditer(r"getenv\s*\(\s*(\"?)([^\")]*)\1", line):
                        reads.append((re.escape(m.group(2)) if m.group(1) else None, rel, i))
    return reads


def test_the_scan_finds_reads_of_every_form():
    src = ("import os\nfrom os import environ, getenv\nK = 'LAZYX_K'\n"
           "a = os.environ.get('LAZYX_A', '1')\nb = os.getenv('LAZYX_B')\n"
           "c = os.environ['LAZYX_C']\nd = 'LAZYX_D' in os.environ\ne = environ.get(K)\n"
           "f = os.environ.get(f'LAZYX_{x}_BACKEND')\ng = getenv(name)\nos.environ['W'] = '1'\n")
    tree = ast.parse(src)
    keys = [_pattern(k, {"K": "LAZYX_K"}) for k in map(_key_of, ast.walk(tree)) if k is not None]
    assert sorted(keys, key=str) == sorted(
        ["LAZYX_A", "LAZYX_B", "LAZYX_C", "LAZYX_D", "LAZYX_K", "LAZYX_[A-Z0-9_]+_BACKEND", None],
        key=str)


def test_every_environment_read_is_registered_where_it_happens():
    reads = environment_reads()
    assert len(reads) >= 10, reads  # the scan sees the reads lazyx is known to have
    unnamed = [f"{f}:{line}" for p, f, line in reads if p is None]
    assert not unnamed, (f"cannot tell which environment variable these read: {unnamed}; "
                         f"read a string literal or a module-level string constant")
    found: dict[str, set] = {}
    for pattern, path, line in reads:
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
        "choices": ["0", "1"]}
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
