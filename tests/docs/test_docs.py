"""The documentation's code runs: every ```python block of each page, in order, in one
namespace per page.

A page runs as the body of a fresh module (so ``sys.modules[__name__]`` is a real
module, as ``__main__`` is in a notebook), in a temporary working directory, with
the plugin registry isolated: what a page registers is gone afterwards.
"""

import pathlib
import re
import sys
import types

import pytest

from lazyx.testing import isolated_registry

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = ["writing-a-custom-primitive.md", "writing-an-op-pack.md", "writing-a-backend.md"]
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def code_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown page, with the line each starts on."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def test_code_blocks_are_found():
    text = "a\n```python\nx = 1\n```\n```toml\n[a]\n```\n```python\ny = 2\n```\n"
    assert code_blocks(text) == [(3, "x = 1\n"), (9, "y = 2\n")]


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(page, tmp_path, monkeypatch):
    path = DOCS / page
    blocks = code_blocks(path.read_text())
    assert len(blocks) >= 3, f"{page} has {len(blocks)} python blocks"
    name = "lazyx_doc_" + path.stem.replace("-", "_")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.chdir(tmp_path)
    with isolated_registry():
        for line, source in blocks:
            # Pad with blank lines so tracebacks give the page's own line numbers.
            code = compile("\n" * (line - 1) + source, str(path), "exec")
            exec(code, module.__dict__)
