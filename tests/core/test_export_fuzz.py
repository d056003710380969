"""Fuzzing import_function: a function file is data from anywhere.

Seed files exported from a few functions (element-wise, reductions, products,
indexing, shapes, sorting, scans, several outputs, constants, keyword inputs)
are damaged in seeded, repeatable ways:

* truncated at random lengths, and bytes flipped without fixing the checksum;
* header bytes flipped *with* the checksum recomputed (the JSON breaks or
  changes one character);
* crafted headers, checksum recomputed: a random field of the JSON replaced by a
  value of the wrong type, an unknown op string, a lying shape or dtype, a bad
  reference, a huge count, a deeply nested value.

Importing may only raise :class:`FunctionFileError`. A file that still loads is
called on the seed's inputs (when its declared shapes are small): the call may
raise only lazyx errors, its outputs must have the shapes and dtypes the file
declares, and a file whose header means what the original meant must give the
original's results.
"""

import hashlib
import json
import math
import os
import random
import shutil
import struct
import tempfile

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyx.core as mx
from lazyx.errors import LazyxError
from lazyx.export import FunctionFileError

PREFIX = struct.Struct("<8sIIQQ32s")
# Loaded files are called only when every value they declare is this small, so that
# a crafted shape never asks the machine for gigabytes.
MAX_CALLED_ELEMENTS = 1 << 14


def _parse(raw: bytes):
    _, _, _, hlen, _, _ = PREFIX.unpack_from(raw)
    return json.loads(raw[64:64 + hlen]), raw[64 + hlen:]


def _pack_text(text: bytes, payload: bytes) -> bytes:
    text += b" " * (-len(text) % 64)
    return PREFIX.pack(b"LAZYXFN\x00", 1, 0, len(text), len(payload),
                       hashlib.sha256(text + payload).digest()) + text + payload


def _pack(header, payload: bytes) -> bytes:
    return _pack_text(json.dumps(header).encode(), payload)


def _rng_array(shape, dtype, seed):
    g = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return g.uniform(-2, 2, shape).astype(dtype)
    return g.integers(1, 9, shape).astype(dtype)


W = _rng_array((3, 4), np.float32, 1)

SEEDS = {
    "elementwise": (lambda x, y: (mx.sin(x) * y + mx.exp(-x) / 3, mx.astype(x > y, mx.int32)),
                    [(3, 4), (4,)], np.float32),
    "reductions": (lambda x: (mx.sum(x, axis=1), mx.max(x, axis=-1, keepdims=True),
                              mx.argmin(x, axis=0), mx.logsumexp(x, axis=0),
                              mx.cumsum(x, axis=1, reverse=True)),
                   [(4, 5)], np.float32),
    "products": (lambda x: mx.softmax(mx.matmul(x, mx.array(W)) + 1.0, axis=-1),
                 [(2, 3)], np.float32),
    "shapes": (lambda x: (mx.transpose(mx.reshape(x, (3, 2, 2)), (2, 0, 1)),
                          mx.concatenate([x, x], axis=0), *mx.split(x, [1, 3], axis=1),
                          mx.pad(x, [(1, 0), (0, 2)]), mx.expand_dims(x, 0)[:, ::-1]),
               [(3, 4)], np.float32),
    "indexing": (lambda x, i: (x[i], mx.take(x, i, axis=1), x[1:, ::2], mx.sort(x, axis=0),
                               mx.topk(x, 2, axis=1)),
                 [(4, 6), "index"], np.float32),
    "integers": (lambda a, b: (*mx.divmod(a, b), mx.cumprod(a, axis=0), mx.arange(5) * a[0]),
                 [(5,), (5,)], np.int32),
}


class Seed:
    def __init__(self, name, path):
        fun, specs, dtype = SEEDS[name]
        self.args = []
        for k, s in enumerate(specs):
            if s == "index":
                self.args.append(mx.array(np.array([0, 3, 1], np.int32)))
            else:
                self.args.append(mx.array(_rng_array(s, dtype, 10 + k)))
        mx.export_function(str(path), fun, *self.args)
        self.raw = path.read_bytes()
        self.header, self.payload = _parse(self.raw)
        self.text = json.dumps(self.header)
        paths = [p for p, _ in _paths(self.header) if p]
        self.graph_paths = [p for p in paths if p[0] == "traces"]
        self.paths = paths
        self.want = [np.array(o) for o in mx.import_function(str(path))(*self.args)]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeds")
    return [Seed(name, folder / f"{name}.lxfn") for name in SEEDS]


@pytest.fixture
def scratch(tmp_path):
    """The file each damaged version is written to: in memory where the system offers it
    (thousands of rewrites of one file cost milliseconds each on some disks)."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        folder = tempfile.mkdtemp(prefix="lazyx-fuzz-", dir="/dev/shm")
        try:
            yield Path(folder) / "f.lxfn"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path / "f.lxfn"


# -- loading and calling one damaged file -------------------------------------------------
def _small(header) -> bool:
    """Whether every shape the (damaged) header declares is small enough to run."""
    stack = [header]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            shape = v.get("shape")
            if type(shape) is list and all(type(d) is int for d in shape) and \
                    math.prod(shape) > MAX_CALLED_ELEMENTS:
                return False
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
    return True


def _load_and_call(path, raw: bytes, seed, header=None):
    """Import ``raw``; only FunctionFileError may come out. Returns what happened."""
    path.write_bytes(raw)
    try:
        fn = mx.import_function(str(path))
    except FunctionFileError:
        return "refused"
    except Exception as e:  # noqa: BLE001  (the point of the test)
        pytest.fail(f"import raised {type(e).__name__}: {e}\nheader: {header!r:.2000}")
    if header is None or not _small(header):
        return "loaded"
    try:
        outs = fn(*seed.args)
        got = [np.array(o) for o in outs]
    except LazyxError:
        return "lazyx error at call"
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"calling an imported file raised {type(e).__name__}: {e}\n"
                    f"header: {header!r:.2000}")
    trace = header["traces"][0]
    assert len(got) == len(trace["outputs"])
    for g, o in zip(outs, got):
        assert o.shape == tuple(g.shape)
    if header == seed.header:
        for g, w in zip(got, seed.want):
            np.testing.assert_array_equal(g, w)
    return "called"


# -- the damages ----------------------------------------------------------------------
def _paths(obj, prefix=()):
    """Every (path, value) in a JSON tree."""
    yield prefix, obj
    if type(obj) is dict:
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif type(obj) is list:
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


DTYPES = ["bool_", "uint8", "uint32", "int8", "int32", "int64", "float16", "bfloat16",
          "float32", "float64", "complex64"]
DEEP = "__DEEP__"


def _replacement(r: random.Random, old):
    """A value to put where ``old`` was: wrong types, lies, bad references, huge counts."""
    kind = r.randrange(15)
    if kind == 0:
        return r.choice([None, True, False, 0, -1, 7, 2 ** 62 + 1, 10 ** 30, -10 ** 30,
                         1.5, float("1e308"), "", "os.system", "sum", "argmax", [], {}])
    if kind == 1 and type(old) is int:  # a nearby count, index or dimension
        return old + r.choice([-2, -1, 1, 2, 100, 2 ** 40])
    if kind == 2 and type(old) is list and old and all(type(d) is int for d in old):
        new = list(old)  # a lying shape or reference
        i = r.randrange(len(new))
        new[i] += r.choice([-1, 1, 3])
        return new if r.random() < 0.8 else new + [1]
    if kind == 3 and type(old) is str:
        if old in DTYPES:
            return r.choice(DTYPES)
        return r.choice(["a", "c", "n", "sum", "prod", "max", "min", "all", "any", "left",
                         "right", "add", "argmin", "logaddexp", "os.system", "__import__",
                         old + "x", old.upper()])
    if kind == 4:
        return r.choice([["a", 0], ["a", 9], ["c", 0], ["c", 50], ["n", 0, 0], ["n", 1, 2],
                         ["n", 99, 0], ["n", -1, 0], ["x", 0], ["n", 0], [], "n"])
    if kind == 5:
        return {"$": r.choice(["tuple", "dtype", "float", "slice", "dict", "bytes", "scalar",
                               "ndarray", "complex", "ellipsis", "pickle", "module"]),
                "items": r.choice([[], [1, 2], [[1]], 3]), "name": r.choice(DTYPES + ["x"]),
                "value": r.choice(["inf", "nan", 3]), "base64": r.choice(["AAAA", "!!", 1]),
                "dtype": r.choice(DTYPES), "shape": r.choice([[1], [2, 2], [-1], [10 ** 20]]),
                "real": 1.0, "imag": r.choice([2.0, "x"]), "start": 0, "stop": 3, "step": 0}
    if kind == 6:
        return DEEP  # replaced below by thousands of nested brackets
    if kind == 7 and type(old) is dict and old:
        new = dict(old)
        del new[r.choice(list(new))]
        return new
    if kind == 8 and type(old) is list and old:
        new = list(old)
        r.shuffle(new)
        return new if r.random() < 0.5 else new[:-1]
    if kind == 9:
        return {"$": "tuple", "items": [r.choice([0, 1, -1, 2, 5, 2 ** 63, True, 1.0, None])
                                        for _ in range(r.randrange(4))]}
    if kind == 10:
        return [r.choice([0, 1, 2, -1, 2 ** 62, 10 ** 19]) for _ in range(r.randrange(4))]
    if kind == 11 and type(old) is list:
        return old * r.choice([2, 3])
    return r.choice([None, 0, "float32", [0], {"shape": [1], "dtype": "float32"}])


def _crafted(seed, r: random.Random):
    """The seed's header with one to three fields replaced; its text and JSON."""
    h = json.loads(seed.text)
    for _ in range(r.choice([1, 1, 1, 2, 3])):
        # Mostly the traces (the graph), sometimes the tables around them.
        path = r.choice(seed.graph_paths if r.random() < 0.75 else seed.paths)
        parent = h
        try:
            for k in path[:-1]:
                parent = parent[k]
            old = parent[path[-1]]
            if type(parent) not in (dict, list):
                continue
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed it
        parent[path[-1]] = _replacement(r, old)
    text = json.dumps(h)
    if DEEP in text:
        depth = r.choice([100, 1000, 100_000])
        text = text.replace(f'"{DEEP}"', "[" * depth + "]" * depth, 1)
        h = None  # not comparable
    return text.encode(), h


def _flip(raw: bytes, r: random.Random, start: int, end: int) -> bytes:
    bad = bytearray(raw)
    i = r.randrange(start, end)
    bad[i] ^= 1 << r.randrange(8)
    return bytes(bad)


# -- the tests -------------------------------------------------------------------------
N_CRAFTED = 1600
N_BYTES = 400


def test_crafted_headers_with_valid_checksums(seeds, scratch):
    r = random.Random(1234)
    path = scratch
    seen = {}
    for n in range(N_CRAFTED):
        seed = seeds[n % len(seeds)]
        text, header = _crafted(seed, r)
        what = _load_and_call(path, _pack_text(text, seed.payload), seed, header)
        seen[what] = seen.get(what, 0) + 1
    # The damage reaches every outcome: most files are refused, some still load and run.
    assert seen.get("refused", 0) > N_CRAFTED // 2, seen
    assert seen.get("called", 0) > 0, seen


def test_truncations_and_bit_flips(seeds, scratch):
    r = random.Random(99)
    path = scratch
    for n in range(N_BYTES):
        seed = seeds[n % len(seeds)]
        raw = seed.raw
        hlen = PREFIX.unpack_from(raw)[3]
        kind = n % 4
        if kind == 0:  # truncated
            bad = raw[:r.randrange(len(raw))]
        elif kind == 1:  # any byte, checksum left as it was
            bad = _flip(raw, r, 0, len(raw))
        else:  # header bytes with the checksum recomputed: broken or changed JSON
            text = _flip(raw, r, 64, 64 + hlen)[64:64 + hlen]
            bad = _pack_text(text, seed.payload)
            try:
                header = json.loads(text)
            except ValueError:
                header = None
            _load_and_call(path, bad, seed, header if type(header) is dict else None)
            continue
        assert _load_and_call(path, bad, seed) == "refused"


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2 ** 32 - 1), st.integers(0, len(SEEDS) - 1))
def test_crafted_headers_hypothesis(seeds, scratch, salt, which):
    seed = seeds[which]
    text, header = _crafted(seed, random.Random(salt))
    _load_and_call(scratch, _pack_text(text, seed.payload), seed, header)
