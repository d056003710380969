"""``lazyx info`` on plugins' primitives, kernels and overrides; ``lazyx kernels``."""

import io
import json
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
    at = lines.index("  testpack (lazyx-testpack 0.3.1): 1 primitive; 2 names")
    assert lines[at + 1] == "    primitives: Cube"
    assert lines[at + 2].startswith("    kernels: ") and "cpu 1/1" in lines[at + 2]
    assert "cpu-reference 1/1" in lines[at + 2] and "counting 1/1" in lines[at + 2]
    ew = next(l for l in lines if l.startswith("  elementwise (lazyx "))
    n = int(ew.split(": ")[1].split(" primitives")[0])
    kernels = lines[lines.index(ew) + 2]
    # Only backends that can run here are counted: metal (not on Linux) is not.
    assert f"cpu {n}/{n}" in kernels and "metal" not in kernels
    assert "  counting (lazyx-countingbackend 1.0.0): backend counting" in lines
    assert "  cpu (lazyx 0.1.0): backends cpu, cpu-reference" in lines
    assert ("  counting-overrides (lazyx-countingbackend 1.0.0): 1 kernel override") in lines
    assert "    kernel override: Subtract on counting" in lines
    assert "Kernel overrides (a plugin's kernel wins over the backend's own):" in lines
    assert ("  Subtract on counting: plugin 'counting-overrides' of distribution "
            "'lazyx-countingbackend' 1.0.0") in lines


def test_kernels_says_who_provides_each_kernel():
    out = io.StringIO()
    assert cli.kernels(["Cube", "Subtract"], ["cpu", "counting"], out) == 0
    assert out.getvalue().splitlines() == [  # in the order asked for
        "Cube (plugin 'testpack' of distribution 'lazyx-testpack' 0.3.1):",
        "  counting: backend 'counting'",
        "  cpu: Cube.eval_cpu (plugin 'testpack' of distribution 'lazyx-testpack' 0.3.1)",
        f"Subtract ({registry.plugins['elementwise'].label}):",
        "  counting: plugin 'counting-overrides' of distribution 'lazyx-countingbackend' 1.0.0",
        "  cpu: backend 'cpu'",
    ]


def test_the_kernels_command():
    r = subprocess.run([sys.executable, "-m", "lazyx", "kernels", "Add", "Softmax", "Inverse",
                        "--backend", "metal"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # Metal generates element-wise kernels (lazyx.backends.metal.compiled), has built-in
    # ones (lazyx.backends.metal.kernels) and says which primitives fall back to the CPU.
    assert r.stdout.splitlines() == [
        f"Add ({registry.plugins['elementwise'].label}):", "  metal: backend 'metal'",
        f"Softmax ({registry.plugins['products'].label}):", "  metal: backend 'metal'",
        f"Inverse ({registry.plugins['linalg'].label}):",
        "  metal: CPU fallback (the CPU backend's kernel, on unified memory)"]


def _kernels(*names, backends=("cpu",), as_json=False):
    out, err = io.StringIO(), io.StringIO()
    status = cli.kernels(list(names), list(backends), out, as_json, err)
    return status, out.getvalue(), err.getvalue()


def test_kernels_accepts_op_names_as_users_write_them():
    status, out, err = _kernels("add", "fast.rms_norm", "linalg.qr", "cube", "Subtract")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == ["add: op 'add' uses Add", "fast.rms_norm: op 'fast.rms_norm' uses RMSNorm",
                         "linalg.qr: op 'linalg.qr' uses QR", "cube: op 'testpack.cube' uses Cube"]
    heads = [l.split(" (")[0] for l in lines[4:] if not l.startswith("  ")]
    assert heads == ["Add", "RMSNorm", "QR", "Cube", "Subtract"]
    assert f"Add ({registry.plugins['elementwise'].label}):" in lines
    # An op built from several primitives lists each (found from the graph it builds).
    status, out, _ = _kernels("mean")
    assert status == 0 and out.splitlines()[0] == "mean: op 'mean' uses Multiply, Reduce"
    classes, op = cli.resolve("Add")
    assert op is None and [c.name for c in classes] == ["Add"]
    assert cli.resolve("nothing_like_it") == ([], None)


def test_kernels_resolves_the_axpby_example_by_its_short_name():
    import pytest
    if "ext.axpby" not in registry.ops:
        pytest.skip("the lazyx-axpby example package (extensions_example/) is not installed")
    status, out, _ = _kernels("axpby")
    assert status == 0 and out.splitlines()[0] == "axpby: op 'ext.axpby' uses Axpby"


def test_unknown_names_are_errors_with_close_matches():
    status, out, err = _kernels("ad", "linalg.qrr", "RMSNrm", "zzzzzz", backends=("cpu", "nowhere"))
    assert status == 1 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("lazyx kernels: unknown backend 'nowhere'; registered backends: ")
    assert "cpu-reference" in lines[0]
    assert lines[1].startswith("lazyx kernels: unknown primitive or op 'ad'; did you mean ")
    assert "add" in lines[1].split("did you mean ")[1].rstrip("?").split(", ")
    assert "linalg.qr" in lines[2] and "RMSNorm" in lines[3]
    assert lines[4] == ("lazyx kernels: unknown primitive or op 'zzzzzz'; "
                        "`lazyx kernels` lists every primitive")
    data = cli.kernels_data(["ad"], [])
    assert data["errors"][0]["kind"] == "name" and "add" in data["errors"][0]["suggestions"]


def test_an_op_with_no_findable_primitive_says_what_to_do():
    status, _, err = _kernels("swapaxes")
    assert status == 1
    assert err.startswith("lazyx kernels: the op 'swapaxes' builds no primitive this command "
                          "can find")
    assert "Transpose" in err  # its plugin's primitives, to pick from


def test_kernels_json():
    status, out, _ = _kernels("add", "Cube", backends=("cpu", "metal"), as_json=True)
    assert status == 0
    d = json.loads(out)
    assert d["ops"] == {"add": {"op": "add", "primitives": ["Add"]}}
    assert d["errors"] == []
    add, cube = d["primitives"]
    assert (add["name"], add["plugin"], add["distribution"]) == ("Add", "elementwise", "lazyx")
    assert add["kernels"]["cpu"] == {"provider": "backend 'cpu'", "missing": False,
                                     "available": True}
    assert add["kernels"]["metal"] == {"provider": "backend 'metal'", "missing": False,
                                       "available": False}
    assert (cube["plugin"], cube["version"]) == ("testpack", "0.3.1")
    r = subprocess.run([sys.executable, "-m", "lazyx", "kernels", "add", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p["name"] for p in json.loads(r.stdout)["primitives"]] == ["Add"]


def test_missing_kernels_are_listed_for_backends_that_can_run_here():
    from lazyx.primitive import Primitive
    from lazyx.testing import available_backends, isolated_registry

    class NoKernel(Primitive):
        __slots__ = ()

        def output_shapes(self, inputs):
            return [inputs[0].shape]

    class Plugin:
        from lazyx import hookimpl

        @hookimpl
        def lazyx_primitives(self):
            return [NoKernel]

    with isolated_registry():
        registry.register_plugin(Plugin(), "nokernel", "lazyx-nokernel", "1")
        text = _info()
        data = cli.info_data()
    lines = text.splitlines()
    assert "  nokernel (lazyx-nokernel 1): 1 primitive" in lines
    total = data["primitive_count"]
    for b in available_backends():
        assert f"  {b}: 1 of {total} primitives: NoKernel" in lines
        assert data["missing_kernels"][b] == ["NoKernel"]
    assert not any(l.startswith("  metal:") for l in lines)


def test_the_kernels_command_with_an_unknown_name_fails():
    r = subprocess.run([sys.executable, "-m", "lazyx", "kernels", "ad"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("lazyx kernels: unknown primitive or op 'ad'; did you mean ")
