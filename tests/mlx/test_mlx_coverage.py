"""Every public function of ``mlx.core``, ``mlx.core.linalg``, ``mlx.core.fft`` and
``mlx.core.random`` is exercised by a differential test in ``tests/mlx``, or excluded
here with a reason.

"Exercised" is read from the test sources: a function counts once a ``tests/mlx``
module names it as an attribute (``m.cumsum(...)``, ``m.linalg.qr(...)``) or as a string
in a table of names that a test looks up with ``getattr``. The check is static, so it
costs nothing at run time; what a test does with the name is the business of that test.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

from mlx_compat import mlx, requires_mlx
from test_mlx_names import ALLOWED

pytestmark = requires_mlx

_NOT_NUMERICAL = "no numbers to compare: state of the runtime, checked in tests/core"

#: {(namespace, name): why no differential test calls it}. Namespaces are "" (mlx.core),
#: "linalg", "fft" and "random".
EXCLUDED = {
    ("", "set_default_device"): _NOT_NUMERICAL,
    ("", "set_cache_limit"): _NOT_NUMERICAL,
    ("", "set_memory_limit"): _NOT_NUMERICAL,
    ("", "get_active_memory"): "lazyx and MLX allocate differently: the figures differ by "
                               "design (tests/core/test_memory*.py check lazyx's)",
    ("", "get_cache_memory"): "lazyx and MLX allocate differently (see get_active_memory)",
    ("", "get_peak_memory"): "lazyx and MLX allocate differently (see get_active_memory)",
    ("", "reset_peak_memory"): _NOT_NUMERICAL,
    ("", "clear_cache"): _NOT_NUMERICAL,
    ("", "clear_streams"): _NOT_NUMERICAL,
    ("", "synchronize"): _NOT_NUMERICAL,
    ("", "enable_compile"): _NOT_NUMERICAL + " (compile switches: tests/transforms)",
    ("", "disable_compile"): _NOT_NUMERICAL + " (compile switches: tests/transforms)",
    ("", "export_function"): "file formats differ by design: lazyx's export is its own "
                             "format (tests/core/test_export.py)",
    ("", "import_function"): "file formats differ by design (see export_function)",
    ("", "export_to_dot"): "a text rendering of the graph: lazyx's graph nodes are its own "
                           "(tests/core/test_graph.py)",
    ("", "checkpoint"): "a transform that changes memory, not numbers: checked against grad "
                        "without it in tests/transforms",
}


def _functions(where: str) -> set[str]:
    """MLX's public functions in ``where``, less those test_mlx_names.ALLOWED plans for
    a later issue (they come with their own differential tests, and leave ALLOWED then)."""
    mod = mlx if where == "" else getattr(mlx, where)
    return {n for n in dir(mod) if not n.startswith("_")
            and callable(getattr(mod, n)) and not inspect.isclass(getattr(mod, n))
            and not inspect.ismodule(getattr(mod, n)) and n not in ALLOWED[where]}


def _exercised() -> set[tuple[str, str]]:
    """{(namespace, name)} named by the differential tests (see the module docstring)."""
    seen = set()
    for path in pathlib.Path(__file__).parent.glob("test_*.py"):
        if path.name == pathlib.Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                base = node.value
                if isinstance(base, ast.Attribute) and base.attr in ("linalg", "fft", "random"):
                    seen.add((base.attr, node.attr))
                elif not (isinstance(base, ast.Name) and base.id in ("np", "numpy", "pytest")):
                    seen.add(("", node.attr))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # a table of names looked up with getattr: "cumsum" (in whichever
                # namespace the test looks it up) or "linalg.qr"
                where, _, name = node.value.rpartition(".")
                seen.update([(where, name)] if where else
                            [(w, name) for w in ("", "linalg", "fft", "random")])
    return seen


@pytest.mark.parametrize("where", ["", "linalg", "fft", "random"], ids=lambda w: w or "core")
def test_every_mlx_function_has_a_differential_test(where):
    names = _functions(where)
    seen = _exercised()
    missing = sorted(n for n in names if (where, n) not in seen and (where, n) not in EXCLUDED)
    assert not missing, (f"mlx.core{'.' + where if where else ''} functions no test in "
                         f"tests/mlx calls: {missing}; add a differential test or an "
                         f"EXCLUDED entry with a reason")


def test_exclusions_are_current():
    # An excluded name that MLX no longer has, or that a test now exercises, is stale.
    seen = _exercised()
    for (where, name), why in EXCLUDED.items():
        assert name in _functions(where), f"MLX has no {where}.{name}: drop it from EXCLUDED"
        assert (where, name) not in seen, f"{where}.{name} is tested now: drop it from EXCLUDED"
        assert why
