"""The layering rules of docs/architecture.md, checked on the source tree.

* Nothing below the public façade imports ``lazyx.core``: only the roof (``core/``,
  ``extend``, ``nn/``, ``optimizers/``, ``utils/``), the CLI and ``lazyx.testing`` may.
* No import circle among lazyx's modules (module-level imports; a module's own parent
  packages do not count: Python initialises them first anyway).
* A function-level import of a lazyx module says why on its line (start-up cost, an
  optional dependency): everything else is imported at the top.
* Extension authors use the door: the Axpby package, the test plugin packages and the
  extension guides import lazyx only through ``lazyx.extend`` and ``lazyx.core``
  (the guides' test examples also through ``lazyx.testing``, the testing door).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"lazyx": ROOT / "framework" / "lazyx", "lazyx.plugins": ROOT / "plugins",
            "lazyx.backends": ROOT / "backends"}
ROOF = ("lazyx.core", "lazyx.extend", "lazyx.nn", "lazyx.optimizers", "lazyx.utils",
        "lazyx.cli", "lazyx.__main__", "lazyx.testing",
        "lazyx.backends.metal.selftest")  # a program, like the CLI: it runs what users run


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "native" in path.parts or "shim" in path.parts:
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


MODULES = _modules()


def _targets(mod: str, path: Path, node) -> list[str]:
    """The lazyx modules an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


def _imports(mod: str, path: Path):
    """(module-level?, line number, target) for every lazyx import of ``mod``."""
    tree = ast.parse(path.read_text())
    top = set()
    stack = list(tree.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            top.add(id(n))
        elif isinstance(n, (ast.If, ast.Try)):
            stack += n.body + n.orelse + getattr(n, "finalbody", [])
            for h in getattr(n, "handlers", []):
                stack += h.body
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for t in _targets(mod, path, n):
                if t == "lazyx" or t.startswith("lazyx."):
                    yield id(n) in top, n.lineno, t


def _in_roof(mod: str) -> bool:
    return any(mod == r or mod.startswith(r + ".") for r in ROOF)


def test_nothing_below_the_roof_imports_the_facade():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
           for m in MODULES if not _in_roof(m) and not m.startswith("lazyx.plugins")
           for _, line, t in _imports(m, MODULES[m])
           if t == "lazyx.core" or t.startswith("lazyx.core.")]
    assert not bad, "\n".join(bad)


def test_no_import_circles():
    graph = {}
    for m, path in MODULES.items():
        deps = set()
        for top, _, t in _imports(m, path):
            if not top:
                continue
            parts = t.split(".")
            for k in range(1, len(parts) + 1):
                c = ".".join(parts[:k])
                if c in MODULES and c != m and not m.startswith(c + "."):
                    deps.add(c)
        graph[m] = deps
    # Tarjan's strongly connected components, iteratively.
    index, low, on, stack, circles = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    circles.append(sorted(comp))
    assert not circles, circles


def test_function_level_imports_say_why():
    bad = []
    for m, path in MODULES.items():
        if _in_roof(m):
            continue
        lines = path.read_text().splitlines()
        for top, line, t in _imports(m, path):
            if not top and "#" not in lines[line - 1]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()}")
    assert not bad, ("function-level imports without a reason on their line:\n"
                     + "\n".join(sorted(set(bad))))


_DOOR = {"lazyx.extend", "lazyx.core"}
_AUTHOR_CODE = [ROOT / "extensions_example" / "src",
                ROOT / "tests" / "plugin_packages" / "lazyx-testpack",
                ROOT / "tests" / "plugin_packages" / "lazyx-countingbackend"]
_GUIDES = [ROOT / "docs" / f"writing-{g}.md" for g in ("a-custom-primitive", "an-op-pack",
                                                      "a-backend")]


def _lazyx_imports(source: str) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split(".")[0] == "lazyx"}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module \
                and n.module.split(".")[0] == "lazyx":
            out |= ({n.module} if n.module != "lazyx" else {f"lazyx.{a.name}" for a in n.names})
    return out


@pytest.mark.parametrize("folder", _AUTHOR_CODE, ids=lambda p: p.name)
def test_extension_packages_use_only_the_door(folder):
    found = {}
    for path in folder.rglob("*.py"):
        if "build" in path.parts or "tests" in path.relative_to(folder).parts:
            continue
        for name in _lazyx_imports(path.read_text()) - _DOOR:
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not found, found


@pytest.mark.parametrize("guide", _GUIDES, ids=lambda p: p.stem)
def test_extension_guides_use_only_the_door(guide):
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
    names = set().union(*(_lazyx_imports(b) for b in blocks))
    assert names - _DOOR - {"lazyx.testing"} == set()
    # Nor do they reach lazyx's internals through attributes.
    text = "\n".join(blocks)
    assert not re.search(r"\blazyx\.(registry|backend|device|array|primitive|arguments)\b", text)


def test_the_door_documents_every_name():
    import lazyx.extend as door
    missing = [n for n in door.__all__ if not (getattr(door, n).__doc__ or "").strip()]
    assert not missing
    assert set(door.__all__) <= set(dir(door))
    # Everything named in the module's guide exists.
    for name in re.findall(r":(?:func|class|data|mod):`(\w+)`", door.__doc__):
        assert hasattr(door, name), name
