"""``lazyx info`` on plugins' primitives, kernels and overrides; ``lazyx kernels``."""

import io
import subprocess
import sys

from lazyx import cli, registry


def _info() -> str:
    out = io.StringIO()
    cli.info(out)
    return out.getvalue()


def test_info_shows_each_plugins_primitives_kernels_and_overrides():
    text = _info()
    lines = text.splitlines()
    at = lines.index("  testpack (lazyx-testpack 0.3.1): 1 primitives; 2 names")
    assert lines[at + 1] == "    primitives: Cube"
    assert lines[at + 2].startswith("    kernels: ") and "cpu 1/1" in lines[at + 2]
    assert "cpu-reference 1/1" in lines[at + 2] and "counting 1/1" in lines[at + 2]
    ew = next(l for l in lines if l.startswith("  elementwise (lazyx "))
    n = int(ew.split(": ")[1].split(" primitives")[0])
    kernels = lines[lines.index(ew) + 2]
    assert f"cpu {n}/{n}" in kernels and "metal 0/" in kernels and "(not available)" in kernels
    assert "    kernel override: Subtract on counting" in lines
    assert "Kernel overrides (a plugin's kernel wins over the backend's own):" in lines
    assert ("  Subtract on counting: plugin 'counting-overrides' of distribution "
            "'lazyx-countingbackend' 1.0.0") in lines


def test_kernels_says_who_provides_each_kernel():
    out = io.StringIO()
    assert cli.kernels(["Subtract", "Cube"], ["cpu", "counting"], out) == 0
    assert out.getvalue().splitlines() == [
        "Cube (plugin 'testpack' of distribution 'lazyx-testpack' 0.3.1):",
        "  counting: backend 'counting'",
        "  cpu: Cube.eval_cpu (plugin 'testpack' of distribution 'lazyx-testpack' 0.3.1)",
        f"Subtract ({registry.plugins['elementwise'].label}):",
        "  counting: plugin 'counting-overrides' of distribution 'lazyx-countingbackend' 1.0.0",
        "  cpu: backend 'cpu'",
    ]
    out = io.StringIO()
    assert cli.kernels(["Nope"], ["nowhere"], out) == 1
    assert out.getvalue() == "unknown: nowhere, Nope\n"


def test_the_kernels_command():
    r = subprocess.run([sys.executable, "-m", "lazyx", "kernels", "Add", "--backend", "metal"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"Add ({registry.plugins['elementwise'].label}):",
                                     "  metal: missing"]
