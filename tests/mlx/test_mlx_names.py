"""Every public name of MLX 0.32.2 exists in lazyx, or is allowed to be missing here with
a reason: ``dir()`` of ``mlx.core``, its ``linalg``, ``fft``, ``random``, ``metal`` and
``cuda`` and ``distributed`` namespaces and of ``mlx.core.array``, diffed against lazyx's.

The allow-list shrinks as work lands: "planned: issue N" for later issues, "being
built" for areas in progress. A name in the list that lazyx now has fails the test too,
so the list never claims a gap that is gone.
"""

import pytest

import lazyx.core as lx
from mlx_compat import mlx, requires_mlx

pytestmark = requires_mlx

#: {module: {name: reason}}: MLX names lazyx may lack for now.
ALLOWED = {
    "": {},
    "linalg": {}, "fft": {}, "fast": {}, "random": {}, "metal": {}, "cuda": {}, "distributed": {},
    "array": {},
}

#: Dunder names of the modules that belong to the module machinery, not the API.
_MODULE_DUNDERS = {"__doc__", "__file__", "__loader__", "__name__", "__package__",
                   "__spec__", "__path__", "__builtins__", "__cached__"}


def _namespace(lib, where: str):
    if where == "":
        return lib
    if where == "array":
        return lib.array
    return getattr(lib, where)


def _names(obj, where: str) -> set:
    """Public names and API dunders (``__version__``); private ones (``_RandomState``) and
    the module machinery's are left out."""
    names = {n for n in dir(obj) if not n.startswith("_") or
             (n.startswith("__") and n.endswith("__"))}
    return names if where == "array" else names - _MODULE_DUNDERS


@pytest.mark.parametrize("where", list(ALLOWED), ids=lambda w: w or "core")
def test_every_mlx_name_exists_or_is_listed(where):
    want = _names(_namespace(mlx, where), where)
    have = _names(_namespace(lx, where), where) if where in ("", "array") or \
        hasattr(lx, where) else set()
    missing = want - have
    unlisted = sorted(missing - set(ALLOWED[where]))
    assert not unlisted, (f"lazyx.core{'.' + where if where else ''} lacks MLX's "
                          f"{unlisted}: build them or list them in ALLOWED with a reason")
    landed = sorted(set(ALLOWED[where]) & have)
    assert not landed, f"{landed} exist now: remove them from ALLOWED[{where!r}]"
    stale = sorted(set(ALLOWED[where]) - want)
    assert not stale, f"MLX 0.32 has no {stale}: remove them from ALLOWED[{where!r}]"


def test_reasons_name_an_issue_or_work_in_progress():
    for where, names in ALLOWED.items():
        for name, why in names.items():
            assert why.startswith(("planned: issue", "being built")), (where, name, why)


def test_aliases_are_mlx_aliases():
    # MLX binds these names to the same function; so does lazyx.
    for alias, target in [("cumulative_sum", "cumsum"), ("cumulative_prod", "cumprod"),
                          ("matrix_transpose", "transpose")]:
        assert (getattr(mlx, alias) is getattr(mlx, target)) == \
            (getattr(lx, alias) is getattr(lx, target)), alias
    assert mlx.matrix_norm is mlx.linalg.norm and lx.matrix_norm is lx.linalg.norm
