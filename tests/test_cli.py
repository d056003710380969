import subprocess
import sys


def test_lazyx_info_lists_everything():
    r = subprocess.run([sys.executable, "-m", "lazyx", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("lazyx ")
    for section in ("Devices:", "Backends:", "Plugins:", "Missing kernels:"):
        assert section in out
    assert "cpu (cpu) [active]" in out and "cpu-reference (cpu)" in out
    assert "elementwise (lazyx " in out and "Add" in out
    assert "testpack (lazyx-testpack 0.3.1)" in out and "Cube" in out
    assert "metal" in out


def test_console_script_help():
    r = subprocess.run([sys.executable, "-m", "lazyx"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "info" in r.stdout
