"""The API reference builds from the docstrings with warnings as errors, includes the
guides, and documents every public name of the covered modules.

Sphinx runs in a subprocess: ``docs/conf.py`` turns off third-party plugin autoload,
which only works before ``lazyx.core`` is imported (this process imported it long ago,
with whatever test plugins are installed). The coverage check then reads the built
inventory (``objects.inv``) and compares it with what the modules hold here, third-party
plugins' names left out, so a new op, class or namespace missing from the reference
fails, and one without a docstring fails the build itself (see
``docs/_ext/api_reference.py``).
"""

import importlib
import pathlib
import subprocess
import sys
import textwrap
import zlib

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import api_reference

sys.path.remove(str(DOCS / "_ext"))


def sphinx_build(source: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
    """``sphinx-build -W --keep-going`` (warnings are errors), one process, fresh output."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q",
               "-b", "html", "-d", str(out / "doctrees"), str(source), str(out / "html")]
    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          check=False)


def inventory_names(path: pathlib.Path) -> set[str]:
    """The Python objects of a Sphinx ``objects.inv``: four header lines, then zlib-
    compressed lines ``name domain:role priority uri display-name``."""
    body = zlib.decompress(path.read_bytes().split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines()
            if line.split(" ", 2)[1].startswith("py:")}


def test_reference_builds_with_the_guides_and_every_public_name(tmp_path):
    # One test, one build: under xdist a module fixture would build once per worker.
    result = sphinx_build(DOCS, tmp_path)
    assert result.returncode == 0, (
        f"the docs build warned or failed (rc {result.returncode}):\n{result.stderr[-6000:]}")
    built = tmp_path / "html"

    guides = sorted(p.stem for p in DOCS.glob("*.md"))
    assert "writing-a-custom-primitive" in guides
    for stem in guides:
        assert (built / f"{stem}.html").is_file(), f"guide {stem}.md is not in the built docs"
    # The guide's prose and the reference's generated entries both made it into HTML.
    assert "Writing a custom primitive" in (built / "writing-a-custom-primitive.html").read_text()
    assert 'id="lazyx.core.linalg.svd"' in (built / "api" / "core.html").read_text()

    inventory = inventory_names(built / "objects.inv")
    missing = {}
    for module_name in api_reference.MODULES:
        assert (built / "api" / f"{module_name.rsplit('.', 1)[1]}.html").is_file(), module_name
        module = importlib.import_module(module_name)
        targets = dict(api_reference.reference_targets(module_name, module))
        # What the module declares is among the names the reference walks.
        declared = {f"{module_name}.{n}" for n in getattr(module, "__all__", [])}
        assert declared <= set(targets), sorted(declared - set(targets))
        lost = sorted(name for name, target in targets.items() if target not in inventory)
        if lost:
            missing[module_name] = lost
    assert not missing, f"public names missing from the API reference: {missing}"


def test_core_reference_is_what_dir_shows():
    """Every name a user sees in ``dir(lazyx.core)`` and its namespaces is walked, the
    plugin-installed ops included, and only third-party plugins' names are left out."""
    import lazyx.core as mx
    from lazyx import providers

    third = {key.split(".")[0] for key, (_, info) in providers.ops.items() if not info.builtin}
    third -= {key.split(".")[0] for key, (_, info) in providers.ops.items() if info.builtin}
    # (Identifiers: pytest's assertion rewriting adds "@py_builtins" to the modules of a
    # distribution that registers a pytest plugin, as an installed lazyx does.)
    shown = {n for n in dir(mx) if n.isidentifier() and not n.startswith("_")} - third
    assert set(api_reference.public_names(mx)) == shown
    for space in ("linalg", "fft", "random", "fast"):
        namespace = getattr(mx, space)
        assert set(api_reference.public_names(namespace, f"lazyx.core.{space}")) == \
            {n for n in dir(namespace) if n.isidentifier() and not n.startswith("_")}
    for name in ("add", "matmul", "array", "float32", "linalg", "random", "compile"):
        assert name in shown


def test_an_undocumented_function_fails_the_build(tmp_path):
    """The mechanism the reference relies on: a public function without a docstring is
    a warning, so ``-W`` fails the build and names it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "fake_api.py").write_text(textwrap.dedent('''\
        """A module for the test."""
        __all__ = ["documented", "undocumented"]

        def documented(x):
            """Return ``x``."""
            return x

        def undocumented(x):
            return x
        '''))
    (tmp_path / "src" / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(DOCS / '_ext')!r}, {str(tmp_path)!r}]\n"
        "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.autosummary', 'api_reference']\n")
    (tmp_path / "src" / "index.rst").write_text("Fake\n====\n\n.. lazyx-api:: fake_api\n")
    result = sphinx_build(tmp_path / "src", tmp_path / "out")
    assert result.returncode != 0
    assert "fake_api.undocumented has no docstring" in result.stderr
    assert "fake_api.documented has no" not in result.stderr
