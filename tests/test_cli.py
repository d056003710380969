"""The ``lazyx`` console script as a user runs it: ``--version``, ``info`` (text and
``--json``), exit codes."""

import json
import subprocess
import sys

import lazyx


def _lazyx(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lazyx", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_lazyx_info_lists_everything():
    r = _lazyx("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("lazyx ")
    for section in ("Devices:", "Backends:", "Plugins:", "Missing kernels:"):
        assert section in out
    assert "cpu (cpu) [active]" in out and "cpu-reference (cpu)" in out
    assert "elementwise (lazyx " in out and "Add" in out
    assert "testpack (lazyx-testpack 0.3.1)" in out and "Cube" in out
    assert "metal" in out


def test_version():
    r = _lazyx("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"lazyx {lazyx.__version__}\n"


def test_console_script_help():
    r = _lazyx()
    assert r.returncode == 1 and "info" in r.stdout and "kernels" in r.stdout


def test_info_json_is_the_text_as_data():
    r = _lazyx("info", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["version"] == lazyx.__version__
    assert {"version", "devices", "backends", "plugins", "skipped", "kernel_overrides",
            "kernel_conflicts", "conflicts", "missing_kernels", "unchecked_backends"} <= set(d)
    assert "environment" not in d
    backends = {b["name"]: b for b in d["backends"]}
    assert backends["cpu"]["active"] and backends["cpu"]["available"]
    assert backends["cpu"]["reason"] is None
    assert backends["metal"]["available"] is False and backends["metal"]["reason"]
    # Truthful availability: only an available backend is active, only available
    # backends are checked for missing kernels, and the others are named as unchecked.
    for b in d["backends"]:
        assert not b["active"] or b["available"], b
    available = sorted(n for n, b in backends.items() if b["available"])
    assert sorted(d["missing_kernels"]) == available
    assert sorted(d["unchecked_backends"]) == sorted(set(backends) - set(available))
    assert [dev["type"] for dev in d["devices"] if dev["default"]] == ["cpu"]
    plugins = {p["name"]: p for p in d["plugins"]}
    tp = plugins["testpack"]
    assert (tp["distribution"], tp["version"], tp["primitives"]) == ("lazyx-testpack", "0.3.1",
                                                                     ["Cube"])
    assert tp["error"] is None and sorted(tp["kernels"]) == available
    assert all(v == 1 for v in tp["kernels"].values())
    ew = plugins["elementwise"]
    assert "Add" in ew["primitives"] and "add" in ew["ops"]


def test_info_never_marks_an_unavailable_backend_active():
    r = _lazyx("info")
    lines = r.stdout.splitlines()
    backends = lines[lines.index("Backends:") + 1:lines.index("Plugins:") - 1]
    rows = [l for l in backends if l.startswith("  ") and not l.startswith("    ")]
    assert rows and all("[active]" not in l for l in rows if "not available" in l)
    # metal cannot run on this machine: no kernels are "missing" for it.
    missing = lines[lines.index("Missing kernels:") + 1:]
    assert not any(l.startswith("  metal") or l.startswith("  cuda") for l in missing)
    assert any(l.startswith("  (not checked, not available here: ") and "metal" in l
               for l in missing)


def test_a_bad_environment_is_an_error_not_a_traceback():
    import os
    env = dict(os.environ, LAZYX_DEFAULT_DEVICE="tpu")
    r = _lazyx("info", env=env)
    assert r.returncode == 1
    assert r.stderr == ("lazyx: DeviceError: LAZYX_DEFAULT_DEVICE='tpu' is not accepted: set "
                        "it to one of cpu, gpu, or unset it.\n")
    # --env still lists the variables, so the culprit can be found.
    r = _lazyx("info", "--env", env=env)
    assert r.returncode == 1
    assert "  LAZYX_DEFAULT_DEVICE=tpu  (NOT ACCEPTED: one of cpu, gpu)" in r.stdout.splitlines()
