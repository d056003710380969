"""Sphinx configuration of lazyx's documentation: the guides (Markdown, through MyST) and
the API reference (``api/``), generated from the docstrings by ``_ext/api_reference.py``.

Build it (warnings are errors, as ``tests/docs/test_api_reference.py`` builds it)::

    python -m sphinx -W --keep-going -b html docs build/docs
"""

import os
import pathlib
import sys

# The reference documents lazyx and its built-in packs only: a third-party plugin that
# happens to be installed (the test suite's own, for one) must not add pages or names.
os.environ["LAZYX_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("LAZYX_PLUGINS", None)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "_ext"))

import lazyx

project = "lazyx"
author = "the lazyx authors"
release = version = lazyx.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "api_reference",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

# The guides link to each other's sections (``page.md#a-heading``).
myst_heading_anchors = 4

# MLX's docstring style: Google (``Args:``/``Returns:``) or NumPy sections.
napoleon_google_docstring = True
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# The table of each page is the index of its entries; no stub pages are written.
autosummary_generate = False

html_theme = "alabaster"
html_title = f"lazyx {release}"
