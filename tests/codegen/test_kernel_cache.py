"""The kernel cache heals itself: a damaged entry (a kernel library, the call shim, the
precompiled header) is found before it is loaded and rebuilt; processes that build one
kernel at once build it once; a size cap evicts the least recently used entries;
``lazyx cache`` shows and empties the cache.

Every child process has its own cache folder. The kernels are tiny (one loop behind a
one-line preamble) so that each build is cheap; the shim is the real one."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from lazyx.codegen import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny kernel with the CPU backend's contiguous signature, called through the shim:
# out = x * k + 1 in float64. Its preamble is precompiled like the real kernels' one.
KERNEL = textwrap.dedent("""
    def kernel(k):
        return ("#include <cstdint>\\n" + jit.PREAMBLE_END
                + f"// kernel {k}\\n"
                + 'extern "C" int lazyx_contiguous(void* const* p, int64_t n, int threads) {\\n'
                + "  const double* x = (const double*)p[0]; double* out = (double*)p[1];\\n"
                + f"  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * {k} + 1.0;\\n"
                + "  return 0;\\n}\\n")
""")

# Builds the shim, kernel 1.5 (in the cache from the start) and kernel ``salt`` (new:
# its build reads the precompiled header once that is built), calls both through the shim,
# prints the result.
CHILD = "import ctypes, json, sys\nimport numpy as np\nfrom lazyx.codegen import jit\n" + KERNEL + \
    textwrap.dedent("""
    shim = jit.shim()
    ok = shim is not None
    for k in (1.5, float(sys.argv[1])):
        lib = jit.build(kernel(k))
        fn = ctypes.cast(lib.lazyx_contiguous, ctypes.c_void_p).value
        x = np.linspace(-3, 3, 101)
        out = np.zeros_like(x)
        ok = ok and shim.contiguous(fn, (x, out), x.size, 1) == 0
        ok = ok and bool(np.allclose(out, x * k + 1, rtol=1e-14, atol=0))
    jit.wait_for_headers()  # (built in the background: count it)
    print(json.dumps({"ok": ok, "stats": jit.stats}))
""")


def _run(code, cache, *args, **env):
    e = dict(os.environ, LAZYX_CACHE_DIR=str(cache))
    e.pop("LAZYX_CACHE_MAX_MB", None)
    e.update(env)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=e, cwd=TESTS,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def _sidecars(folder):
    """Each entry's sidecar (documented format), checked against its files."""
    metas = {}
    for name in os.listdir(folder):
        if name.endswith(".meta"):
            with open(os.path.join(folder, name)) as f:
                meta = json.load(f)
            for fname, want in meta["files"].items():
                with open(os.path.join(folder, fname), "rb") as f:
                    data = f.read()
                assert len(data) == want["size"] > 0, fname
                assert hashlib.sha256(data).hexdigest() == want["sha256"], fname
            metas[name[:-len(".meta")]] = meta
    return metas


def _entry_of(folder, kind):
    """The entry name of the shim, of kernel 1.5 or of the precompiled header."""
    for name in os.listdir(folder):
        if kind == "header":  # (not a .cpp: kernel 1.5's would match below)
            if name.endswith(".h.gch"):
                return name[:-len(".h.gch")]
        elif name.endswith(".cpp") and not name.endswith(".body.cpp"):
            with open(os.path.join(folder, name)) as f:
                text = f.read()
            if ("lazyx kernel-call shim" in text) == (kind == "shim") and \
                    (kind == "shim" or "// kernel 1.5\n" in text):
                return name[:-len(".cpp")]
    raise AssertionError(f"no {kind} in {sorted(os.listdir(folder))}")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache holding the shim, kernel 1.5, kernel 2.5 and the precompiled header."""
    folder = tmp_path_factory.mktemp("pristine") / "kernels"
    r = _result(_run(CHILD, folder, 2.5))
    assert r["ok"] and r["stats"]["compiled"] == 3 and r["stats"]["headers"] == 1, r
    return folder


def _truncate(folder, name, path, meta):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _empty(folder, name, path, meta):
    open(path, "wb").close()


def _random_bytes(folder, name, path, meta):  # same size: only the hash tells
    with open(path, "wb") as f:
        f.write(os.urandom(os.path.getsize(path)))


def _other_compiler(folder, name, path, meta):  # intact, but another compiler's, says the sidecar
    meta["compiler"] = "g++ (GCC) 4.8.5 20150623"
    (folder / f"{name}.meta").write_text(json.dumps(meta))


def _no_sidecar(folder, name, path, meta):
    os.remove(folder / f"{name}.meta")


def _garbled_sidecar(folder, name, path, meta):
    (folder / f"{name}.meta").write_bytes(b'{"format": 1, "files": {')


DAMAGE = {"truncated": _truncate, "empty": _empty, "random_bytes": _random_bytes,
          "other_compiler": _other_compiler, "no_sidecar": _no_sidecar,
          "garbled_sidecar": _garbled_sidecar}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("target", ["kernel", "shim", "header"])
def test_a_damaged_entry_is_rebuilt_before_it_is_loaded(pristine, tmp_path, target, damage):
    folder = tmp_path / "kernels"
    shutil.copytree(pristine, folder)
    name = _entry_of(folder, target)
    path = folder / (name + (".h.gch" if target == "header" else ".so"))
    DAMAGE[damage](folder, name, path, _sidecars(pristine)[name])
    salt = 3.25  # a kernel the pristine cache lacks: its build reads the header
    r = _result(_run(CHILD, folder, salt))
    assert r["ok"], r
    stats = r["stats"]
    assert stats["rebuilt"] == 1, stats
    assert stats["headers"] == (target == "header"), stats
    assert stats["compiled"] == 1 + (target != "header"), stats
    # Healed: every entry matches its sidecar again, the damaged one rebuilt in place.
    metas = _sidecars(folder)
    assert name in metas and len(metas) == 5
    assert metas[name]["compiler"] == jit.compiler()[1]
    assert not [n for n in os.listdir(folder) if n.startswith(".")]


RACE = "import ctypes, json, os, sys, time\nfrom lazyx.codegen import jit\n" + textwrap.dedent("""
    barrier, me, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    got = []
    for r in range(rounds):
        # Start each round together: wait until all n processes have arrived.
        open(os.path.join(barrier, f"{r}.{me}"), "w").close()
        while sum(f.startswith(f"{r}.") for f in os.listdir(barrier)) < n:
            time.sleep(0.002)
        before = jit.stats["compiled"]
        source = ("#include <cstdint>\\n" + jit.PREAMBLE_END
                  + f'extern "C" int64_t value() {{ return {r} * 1000003LL + 7; }}\\n')
        lib = jit.build(source)
        lib.value.restype = ctypes.c_int64
        got.append([jit.stats["compiled"] - before, lib.value()])
    jit.wait_for_headers()  # (built in the background: count it)
    print(json.dumps({"rounds": got, "stats": jit.stats}))
""")


def test_processes_building_one_kernel_at_once_build_it_once(tmp_path):
    folder, barrier = tmp_path / "kernels", tmp_path / "barrier"
    barrier.mkdir()
    n, rounds = 4, 20
    procs = [_run(RACE, folder, barrier, i, n, rounds) for i in range(n)]
    results = [_result(p) for p in procs]
    for r in range(rounds):
        assert sum(res["rounds"][r][0] for res in results) == 1, (r, results)
        assert all(res["rounds"][r][1] == r * 1000003 + 7 for res in results), (r, results)
    assert sum(res["stats"]["headers"] for res in results) == 1
    assert all(res["stats"]["rebuilt"] == 0 for res in results)
    assert all(res["stats"]["disk"] == rounds - res["stats"]["compiled"] for res in results)
    # One complete library per round, no temporaries, every file as its sidecar says.
    names = os.listdir(folder)
    assert len([n for n in names if n.endswith(".so")]) == rounds
    assert not [n for n in names if n.startswith(".")], names
    assert len(_sidecars(folder)) == rounds + 1


def _tiny(i):
    """A library without a preamble (no header to pin), all of one size."""
    return f'extern "C" int value() {{ return {i:>5}; }}  // lazyx cache test\n'


def _age(folder, ages):
    """Set entries' last-use times ``ages`` seconds in the past (through their sidecars)."""
    now = time.time()
    for name, age in ages.items():
        path = folder / f"{name}.meta"
        meta = json.loads(path.read_text())
        meta["last_used"] = now - age
        path.write_text(json.dumps(meta))


def test_the_size_cap_evicts_the_least_recently_used_entries(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    monkeypatch.setenv("LAZYX_CACHE_DIR", str(folder))
    monkeypatch.delenv("LAZYX_CACHE_MAX_MB", raising=False)
    salt = int(time.time() * 1000) % 9000  # kernels no earlier run of this process loaded
    libs = [jit.build(_tiny(salt + i)) for i in range(3)]
    names = sorted(_sidecars(folder), key=lambda n: json.loads(
        (folder / f"{n}.meta").read_text())["created"])
    assert len(names) == 3 and jit.cache_info()["entries"] == 3
    a, b, c = names
    _age(folder, {a: 300, b: 200, c: 100})
    # Another process uses a: that moves it to the front.
    use = "from lazyx.codegen import jit; import sys; print(jit.build(sys.argv[1]).value())"
    p = _run(use, folder, _tiny(salt))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == str(salt), err
    # A cap half an entry above the three: a fourth entry evicts one, the oldest (b).
    info = jit.cache_info()
    monkeypatch.setenv("LAZYX_CACHE_MAX_MB", str((info["bytes"] * 7 / 6) / (1 << 20)))
    evicted = jit.stats["evicted"]
    d = jit.build(_tiny(salt + 3))
    assert jit.stats["evicted"] == evicted + 1
    left = set(_sidecars(folder))
    assert a in left and c in left and b not in left and len(left) == 3
    assert not [n for n in os.listdir(folder) if n.startswith(b)]  # its files and lock
    assert jit.cache_info()["bytes"] <= jit.cache_info()["max_bytes"]
    # A library this process loaded still runs after its file was evicted.
    assert libs[1].value() == salt + 1 and d.value() == salt + 3
    # A new process rebuilds b, and under the same cap evicts c, now the oldest.
    p = _run(use, folder, _tiny(salt + 1), LAZYX_CACHE_MAX_MB=os.environ["LAZYX_CACHE_MAX_MB"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == str(salt + 1), err
    assert set(_sidecars(folder)) == left - {c} | {b}


def test_a_bad_cap_is_an_error_that_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYX_CACHE_DIR", str(tmp_path))
    for bad in ("lots", "-1", "nan"):
        monkeypatch.setenv("LAZYX_CACHE_MAX_MB", bad)
        with pytest.raises(jit.KernelCacheError, match="LAZYX_CACHE_MAX_MB") as e:
            jit.cache_info()
        assert isinstance(e.value, ValueError) and repr(bad) in str(e.value)
        with pytest.raises(jit.KernelCacheError):  # before any work
            jit.build(_tiny(int(time.time() * 1000) % 9000 + 10000))
        assert os.listdir(tmp_path) == []
    monkeypatch.setenv("LAZYX_CACHE_MAX_MB", "0.5")
    assert jit.cache_info()["max_bytes"] == 1 << 19
    monkeypatch.delenv("LAZYX_CACHE_MAX_MB")
    assert jit.cache_info()["max_bytes"] == jit.DEFAULT_MAX_MB << 20


def _cli(folder, *args, **env):
    e = dict(os.environ, LAZYX_CACHE_DIR=str(folder), **env)
    if not env:
        e.pop("LAZYX_CACHE_MAX_MB", None)
    return subprocess.run([sys.executable, "-m", "lazyx", "cache", *args], capture_output=True,
                          text=True, timeout=120, env=e)


def test_lazyx_cache_shows_and_clears_the_cache(pristine, tmp_path):
    folder = tmp_path / "kernels"
    shutil.copytree(pristine, folder)
    (folder / "notes.txt").write_text("not lazyx's")
    size = sum(os.path.getsize(folder / n) for n in os.listdir(folder) if n.startswith("lx_"))
    out = _cli(folder).stdout
    assert str(folder) in out and "4 entries" in out
    assert f"{size / (1 << 20):.1f} MiB of {jit.DEFAULT_MAX_MB:.1f} MiB" in out
    out = _cli(folder, "clear").stdout
    assert "Removed 4 entries" in out and str(folder) in out
    assert os.listdir(folder) == ["notes.txt"]
    assert "0 entries" in _cli(folder).stdout
    r = _cli(folder, LAZYX_CACHE_MAX_MB="big")
    assert r.returncode == 1 and "LAZYX_CACHE_MAX_MB='big'" in r.stderr
