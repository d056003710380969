"""The op fuzz suite's properties: random calls of every op family against NumPy.

Flow of one example: hypothesis draws a call (an op, shapes that are 0-d, empty,
broadcastable or not, a dtype among every lazyx dtype, axes in and out of range, indices,
Python scalars with NaN, infinities and extreme ints); :func:`outcome` runs the NumPy
reference first and lazyx second, and accepts exactly two endings:

* both succeed: the lazyx result equals the reference in the result dtype
  (:func:`helpers.assert_close`, the suite's own comparison);
* the call is invalid (NumPy refuses it, or it breaks a lazyx/MLX rule the family
  states): lazyx raises an error of its own hierarchy whose message starts with
  ``[op]``.

Anything else fails: a wrong value, a raw NumPy or Python exception, an error that
names no op. The references are the op tables of the plugin tests (``UNARY``,
``BINARY``, the reduction and scan references), loaded from their files, so the fuzz
and the example tests share one definition of every op.

Each property runs in a child process (:func:`main`, started by ``test_op_fuzz.py``)
so that a crash is reported as a failure. The ``lazyx-fuzz`` hypothesis profile is
derandomized and bounded for CI; ``LAZYX_FUZZ_EXAMPLES=N`` runs N random examples
per property instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)

import lazyx.core as mx  # noqa: E402
from helpers import ALL_DTYPES, assert_close, random_array, reference_dtype, rng, to_lazyx  # noqa: E402
from lazyx.dtypes import weak_scalar_dtype  # noqa: E402
from lazyx.errors import LazyxError  # noqa: E402

_EXAMPLES = os.environ.get("LAZYX_FUZZ_EXAMPLES")
settings.register_profile(
    "lazyx-fuzz", max_examples=int(_EXAMPLES) if _EXAMPLES else 60, deadline=None,
    derandomize=not _EXAMPLES, database=None, print_blob=True,
    suppress_health_check=list(HealthCheck))
settings.load_profile("lazyx-fuzz")


def _load(name: str):
    """A plugin test module by path (``tests/plugins`` is no package)."""
    spec = importlib.util.spec_from_file_location(f"_fuzz_{name}",
                                                  os.path.join(TESTS, "plugins", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EW = _load("test_elementwise")
RED = _load("test_reductions")


class Invalid(Exception):
    """The reference's verdict: this call must raise a lazyx error."""


def outcome(op: str, lx_call, ref_call, dtype=None, rtol=None, atol=None, at_eval=()):
    """Run one example (see the module docstring). ``ref_call`` returns the expected
    NumPy result or raises (any exception) when the call is invalid. An error raised by
    the call must name ``op``; one raised by evaluating the result (index values held by
    lazyx arrays, checked by the kernel) may name a primitive of ``at_eval`` instead."""
    try:
        with np.errstate(all="ignore"):
            expected = ref_call()
        invalid = None
    except Exception as e:  # NumPy or a stated rule refuses the call
        expected, invalid = None, e
    for stage, names in (("call", (op,)), ("eval", (op,) + tuple(at_eval))):
        try:
            if stage == "call":
                got = lx_call()
            elif isinstance(got, mx.array):
                mx.eval(got)
            elif isinstance(got, (list, tuple)):
                mx.eval(*got)
        except LazyxError as e:
            msg = str(e)
            assert invalid is not None, f"{op}: raised {type(e).__name__}: {msg} for a valid call"
            assert any(msg.startswith(f"[{n}]") for n in names), \
                f"{op}: the {stage}'s error does not name {' or '.join(names)}: {msg}"
            return
        except Exception as e:
            raise AssertionError(f"{op}: a non-lazyx exception escaped the {stage}: "
                                 f"{type(e).__module__}.{type(e).__name__}: {e}") from e
    assert invalid is None, f"{op}: expected a lazyx error ({invalid!r}), got a result"
    if isinstance(got, (list, tuple)):
        for g, e in zip(got, expected):
            assert_close(g, e, dtype, rtol, atol, msg=op)
    else:
        assert_close(got, expected, dtype, rtol, atol, msg=op)


# -- strategies --------------------------------------------------------------------
dtypes = st.sampled_from(ALL_DTYPES)
dims = st.integers(0, 4)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
seeds = st.integers(0, 2**16)
SPECIAL_FLOATS = [np.nan, np.inf, -np.inf, 0.0, -0.0]


def data(shape, d, seed, lo=-4.0, hi=4.0, specials=False):
    """Random NumPy data of lazyx dtype ``d``; with ``specials``, NaN, +-inf and the
    extreme integers of the dtype at some positions."""
    x = np.array(random_array(shape, d, rng(seed), low=lo, high=hi))  # 0-d: not a scalar
    if specials and x.size:
        g = rng(seed + 1)
        flat = x.reshape(-1)
        pos = g.integers(0, flat.size, size=max(1, flat.size // 3))
        if d.kind in "fc":
            flat[pos] = g.choice(SPECIAL_FLOATS, size=pos.size).astype(flat.dtype)
        elif d.kind in "iu":
            info = np.iinfo(d.np)
            flat[pos] = g.choice([info.min, info.max, 0], size=pos.size).astype(d.np)
    return x


@st.composite
def broadcastable(draw, n=2):
    """``n`` shapes that broadcast together, or (sometimes) shapes that do not."""
    base = draw(shapes)
    out = []
    for _ in range(n):
        s = list(base[draw(st.integers(0, len(base))):])
        for i in range(len(s)):
            if draw(st.integers(0, 3)) == 0:
                s[i] = 1
        if draw(st.integers(0, 9)) == 0 and s:
            s[draw(st.integers(0, len(s) - 1))] += draw(st.integers(1, 2))  # maybe a mismatch
        out.append(tuple(s))
    return out


scalars = st.one_of(st.integers(-3, 3), st.sampled_from([2**31, -2**31 - 1, 2**63 - 1, -2**63, 255, -1, 300]),
                    st.floats(allow_nan=True, allow_infinity=True, width=32), st.booleans())
axes = st.integers(-6, 5)


# -- properties ----------------------------------------------------------------------
def _as_computed(x, out_d):
    """``x`` as the reference computes it: an integer input to an op with a floating
    result is first cast to that result dtype, as MLX does (uint32 max becomes 2**32 in
    float32), then widened to the reference dtype."""
    if out_d is not None and x.dtype.kind in "biu" and out_d.kind in "fc":
        x = x.astype(out_d.np)
    return x.astype(reference_dtype(x.dtype))


def _kinds_rule(kinds, d):
    if d.kind not in kinds:
        raise Invalid(f"dtype {d.name} is not accepted")


@given(name=st.sampled_from(sorted(EW.UNARY)), d=dtypes, shape=shapes, seed=seeds,
       specials=st.booleans())
def prop_unary(name, d, shape, seed, specials):
    ref, kinds, rule, (lo, hi) = EW.UNARY[name]
    x = data(shape, d, seed, lo, hi, specials)
    out_d = rule(d) if d.kind in kinds else None

    def reference():
        _kinds_rule(kinds, d)
        return ref(_as_computed(x, out_d))
    outcome(name, lambda: getattr(mx, name)(to_lazyx(x)), reference, out_d)


@given(name=st.sampled_from(sorted(EW.BINARY)), d=dtypes, sh=broadcastable(), seed=seeds,
       specials=st.booleans())
def prop_binary(name, d, sh, seed, specials):
    ref, kinds, rule, ra, rb = EW.BINARY[name]
    a = data(sh[0], d, seed, *ra, specials=specials)
    b = data(sh[1], d, seed + 7, *rb, specials=specials)
    out_d = rule(d) if d.kind in kinds else None

    def reference():
        _kinds_rule(kinds, d)
        np.broadcast_shapes(a.shape, b.shape)
        return ref(_as_computed(a, out_d), _as_computed(b, out_d))
    outcome(name, lambda: getattr(mx, name)(to_lazyx(a), to_lazyx(b)), reference, out_d)


@given(name=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum", "equal",
                             "less", "divide"]),
       d=dtypes, shape=shapes, seed=seeds, s=scalars, left=st.booleans())
def prop_binary_scalar(name, d, shape, seed, s, left):
    """An array with a Python scalar: weak typing, and scalars that do not fit."""
    ref, kinds, rule, ra, _ = EW.BINARY[name]
    x = data(shape, d, seed, *ra)
    pd = weak_scalar_dtype(d, type(s))

    def reference():
        _kinds_rule(kinds, pd)
        if pd.kind in "iu" and not isinstance(s, bool) and isinstance(s, int):
            info = np.iinfo(pd.np)
            if not info.min <= s <= info.max:
                raise Invalid("the scalar does not fit")  # MLX: an overflow error
        xs = x.astype(pd.np)
        xr = xs.astype(reference_dtype(xs.dtype))
        sr = np.asarray(s).astype(pd.np).astype(reference_dtype(pd.np))
        return ref(sr, xr) if left else ref(xr, sr)
    fn = getattr(mx, name)
    out_d = rule(pd) if pd.kind in kinds else None
    outcome(name, lambda: fn(s, to_lazyx(x)) if left else fn(to_lazyx(x), s), reference, out_d)


@given(name=st.sampled_from(["sum", "prod", "max", "min", "all", "any"]), d=dtypes,
       shape=shapes, seed=seeds, axis=st.one_of(st.none(), axes, st.lists(axes, max_size=3)),
       keepdims=st.booleans(), specials=st.booleans())
def prop_reduce(name, d, shape, seed, axis, keepdims, specials):
    x = data(shape, d, seed, -2, 2, specials and name not in ("sum", "prod"))
    np_ref = RED._np_reduce(name)
    ax = list(range(len(shape))) if axis is None else ([axis] if isinstance(axis, int) else axis)
    out_d = RED._reduce_dtype(name, d) if ax else (mx.bool_ if name in ("all", "any") else d)

    def reference():
        if any(not -len(shape) <= a < len(shape) for a in ax):
            raise Invalid("axis out of range")  # NumPy takes axis 0 of a 0-d array; MLX not
        if len({a % len(shape) for a in ax}) != len(ax):
            raise Invalid("repeated axis")
        if not ax:  # MLX: a reduction over no axes is the identity (all/any give bool)
            return x.astype(bool) if name in ("all", "any") else x
        if name in ("max", "min") and any(shape[a] == 0 for a in ax):
            raise Invalid("max of nothing")
        return np_ref(x.astype(reference_dtype(x.dtype)), axis, keepdims)
    outcome(name, lambda: getattr(mx, name)(to_lazyx(x), axis=axis, keepdims=keepdims),
            reference, out_d)


@given(name=st.sampled_from(sorted(RED._SCAN_OPS)), d=st.sampled_from(
           [x for x in ALL_DTYPES if x.kind != "c"]), shape=shapes, seed=seeds,
       axis=st.one_of(st.none(), axes), reverse=st.booleans(), inclusive=st.booleans())
def prop_scan(name, d, shape, seed, axis, reverse, inclusive):
    op = RED._SCAN_OPS[name]
    x = data(shape, d, seed, -2, 2)

    def reference():
        if axis is not None and not -len(shape) <= axis < len(shape):
            raise Invalid("axis")
        xr = x.astype(np.float64) if name == "logcumsumexp" or d.kind == "f" else x
        if not x.size:  # the shared reference cannot shift an empty scan
            return (x.reshape(-1) if axis is None else x).astype(
                RED._scan_dtype(op, d).np if op != "logaddexp" else np.float64)
        return RED._np_scan(op, xr, axis, reverse, inclusive)
    outcome(name, lambda: getattr(mx, name)(to_lazyx(x), axis=axis, reverse=reverse,
                                            inclusive=inclusive),
            reference, RED._scan_dtype(op, d))


@given(d=dtypes, shape=shapes, seed=seeds, axis=axes, axis2=axes, new=shapes,
       name=st.sampled_from(["reshape", "transpose", "squeeze", "expand_dims", "swapaxes",
                             "moveaxis", "flatten", "broadcast_to", "tile", "repeat",
                             "concatenate", "stack", "split", "pad", "flip"]))
def prop_shapes(d, shape, seed, axis, axis2, new, name):
    x = data(shape, d, seed)
    lx = lambda: to_lazyx(x)  # noqa: E731
    n = len(shape)
    calls = {
        "reshape": (lambda: mx.reshape(lx(), new), lambda: np.reshape(x, new)),
        "transpose": (lambda: mx.transpose(lx(), new[:n] if len(new) >= n else None),
                      lambda: np.transpose(x, new[:n] if len(new) >= n else None)),
        "squeeze": (lambda: mx.squeeze(lx(), axis), lambda: np.squeeze(x, axis)),
        "expand_dims": (lambda: mx.expand_dims(lx(), axis), lambda: np.expand_dims(x, axis)),
        "swapaxes": (lambda: mx.swapaxes(lx(), axis, axis2), lambda: np.swapaxes(x, axis, axis2)),
        "moveaxis": (lambda: mx.moveaxis(lx(), axis, axis2), lambda: np.moveaxis(x, axis, axis2)),
        "flatten": (lambda: mx.flatten(lx()), lambda: x.reshape(-1)),
        "broadcast_to": (lambda: mx.broadcast_to(lx(), new), lambda: np.broadcast_to(x, new)),
        "tile": (lambda: mx.tile(lx(), list(new)), lambda: np.tile(x, new)),
        "repeat": (lambda: mx.repeat(lx(), axis2 % 3, axis),
                   lambda: np.repeat(x, axis2 % 3, axis)),
        "concatenate": (lambda: mx.concatenate([lx(), lx()], axis),
                        lambda: np.concatenate([x, x], axis)),
        "stack": (lambda: mx.stack([lx(), lx()], axis), lambda: np.stack([x, x], axis)),
        "split": (lambda: mx.split(lx(), axis2 % 3 + 1, axis), lambda: np.split(x, axis2 % 3 + 1, axis)),
        "pad": (lambda: mx.pad(lx(), axis2 % 3), lambda: np.pad(x, axis2 % 3)),
        "flip": (lambda: mx.flip(lx(), axis), lambda: np.flip(x, axis)),
    }
    lx_call, np_call = calls[name]

    def ref():
        if not n and name in ("repeat", "flip", "squeeze", "split"):
            raise Invalid("axis")  # NumPy takes axis 0 of a 0-d array; MLX not
        return np_call()
    outcome(name, lx_call, ref, d)


def _key_part(draw, n):
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return draw(st.integers(-n - 2, n + 2))
    if kind == 1:
        return None
    if kind == 2:
        return Ellipsis
    if kind == 3:
        return draw(st.lists(st.integers(-n - 1, n + 1), max_size=3))
    opt = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    return slice(draw(opt), draw(opt), draw(st.one_of(st.none(), st.integers(-3, 3))))


@st.composite
def index_keys(draw, shape):
    return tuple(_key_part(draw, shape[i] if i < len(shape) else 1)
                 for i in range(draw(st.integers(0, len(shape) + 1))))


@given(d=dtypes, shape=shapes, seed=seeds, st_data=st.data())
def prop_getitem(d, shape, seed, st_data):
    x = data(shape, d, seed)
    key = st_data.draw(index_keys(shape))
    if sum(isinstance(k, list) for k in key) and any(isinstance(k, list) and not k for k in key):
        key = tuple(k if not (isinstance(k, list) and not k) else 0 for k in key)

    def reference():
        if any(type(k) is Ellipsis.__class__ for k in key) and \
                sum(k is Ellipsis for k in key) > 1:
            raise Invalid("two ellipses")
        return x[tuple(np.asarray(k) if isinstance(k, list) else k for k in key)]
    lx_key = tuple(mx.array(k, mx.int32) if isinstance(k, list) and st_data.draw(st.booleans())
                   else k for k in key)
    outcome("__getitem__", lambda: to_lazyx(x)[lx_key], reference, d, at_eval=("Gather",))


@given(d=dtypes, shape=shapes, seed=seeds, axis=st.one_of(st.none(), axes),
       idx=st.lists(st.integers(-5, 5), max_size=4), lazy_idx=st.booleans())
def prop_take(d, shape, seed, axis, idx, lazy_idx):
    x = data(shape, d, seed)
    i = np.array(idx, np.int32)
    n = x.size if axis is None or not -x.ndim <= axis < x.ndim else x.shape[axis]
    # Lazy indices out of range with an empty result: the kernel reads nothing, so an
    # error and an empty array are both right (MLX never checks).
    assume(not (lazy_idx and n and i.size and (i.min() < -n or i.max() >= n)
                and not i.size * (x.size // n)))

    def reference():
        n = x.size if axis is None else x.shape[axis]
        out_size = i.size * (x.size // n if n else 0)
        if i.size and (i.min() < -n or i.max() >= n):
            raise Invalid("out of bounds")
        return np.take(x, i, axis=axis)
    outcome("take", lambda: mx.take(to_lazyx(x), mx.array(i) if lazy_idx else list(idx),
                                    axis=axis),
            reference, d, at_eval=("Gather",))


@given(d=dtypes, sa=st.lists(st.integers(0, 3), max_size=4).map(tuple),
       sb=st.lists(st.integers(0, 3), max_size=4).map(tuple), seed=seeds)
def prop_matmul(d, sa, sb, seed):
    a, b = data(sa, d, seed, -2, 2), data(sb, d, seed + 3, -2, 2)

    def reference():
        if d.kind not in "fc":
            raise Invalid("MLX's matmul takes floating point and complex types only")
        if not sa or not sb:
            raise Invalid("0-d")
        return np.matmul(a.astype(reference_dtype(a.dtype)), b.astype(reference_dtype(b.dtype)))
    outcome("matmul", lambda: mx.matmul(to_lazyx(a), to_lazyx(b)), reference, d,
            rtol=5e-2 if d.size == 2 else None, atol=5e-2 if d.size == 2 else None)


@given(d=st.sampled_from([x for x in ALL_DTYPES if x.kind != "c"]), shape=shapes, seed=seeds,
       axis=st.one_of(st.none(), axes), specials=st.booleans(),
       name=st.sampled_from(["sort", "argsort"]))
def prop_sort(d, shape, seed, axis, specials, name):
    x = data(shape, d, seed, -50, 50, specials)
    if name == "argsort":  # distinct values: the order is then unique
        x = np.arange(x.size)[::-1].reshape(shape).astype(d.np) if d.kind != "b" else x
        if d.kind == "b" or (d.kind in "iu" and x.size > np.iinfo(d.np).max) or \
                (d.kind == "f" and d.size == 2 and x.size > 256):
            return

    def reference():
        if axis is not None and not -x.ndim <= axis < x.ndim:
            raise Invalid("axis")  # NumPy takes axis 0 of a 0-d array; MLX not
        return getattr(np, name)(x, axis=axis, kind="stable")
    outcome(name, lambda: getattr(mx, name)(to_lazyx(x), axis=axis), reference,
            d if name == "sort" else mx.uint32)


@given(op=st.sampled_from(["zeros", "ones", "full", "eye", "arange"]), d=dtypes,
       shape=st.one_of(shapes, st.lists(st.sampled_from([-1, 2.5, 2**40, 2**62, 3]), min_size=1,
                                        max_size=3).map(tuple)),
       v=st.one_of(st.integers(-50, 50), st.floats(-1e4, 1e4),
                   st.sampled_from([np.nan, np.inf, -np.inf, 1e300, 2**62, True])))
def prop_creation(op, d, shape, v):
    calls = {
        "zeros": (lambda: mx.zeros(shape, d), lambda: np.zeros(shape, d.np)),
        "ones": (lambda: mx.ones(shape, d), lambda: np.ones(shape, d.np)),
        "full": (lambda: mx.full(shape, 1, d), lambda: np.full(shape, 1, d.np)),
        "eye": (lambda: mx.eye(*(shape[:2] or (0,)), dtype=d),
                lambda: np.eye(*(shape[:2] or (0,)), dtype=d.np)),
        "arange": (lambda: mx.arange(0, v, 1, d) if d.kind != "b" else mx.arange(0, v, 1),
                   lambda: np.arange(0, v, 1, d.np if d.kind != "b" else None)),
    }
    lx_call, ref = calls[op]

    def reference():
        sizes = [s for s in shape if isinstance(s, int)]
        if op != "arange" and (any(not isinstance(s, int) for s in shape) or
                               any(s < 0 for s in sizes) or
                               np.prod(sizes, dtype=object) * d.size > 2**34):
            raise Invalid("bad or huge shape")  # checked before NumPy tries to allocate
        if op == "arange":
            if isinstance(v, bool) or not np.isfinite(v) or abs(v) > 2**40:
                raise Invalid("bad stop")  # a bool is no number; 2**62 elements never fit
        return ref()
    outcome(op, lx_call, reference, None if op == "arange" else d)


@given(name=st.sampled_from(["uniform", "normal", "randint", "bernoulli"]), d=dtypes,
       shape=st.one_of(shapes, st.lists(st.sampled_from([-1, 2.5, 3]), min_size=1,
                                        max_size=2).map(tuple)), seed=seeds)
def prop_random(name, d, shape, seed):
    key = mx.random.key(seed)
    calls = {
        "uniform": lambda: mx.random.uniform(shape=shape, dtype=d, key=key),
        "normal": lambda: mx.random.normal(shape=shape, dtype=d, key=key),
        "randint": lambda: mx.random.randint(0, 2, shape=shape, dtype=d, key=key),
        "bernoulli": lambda: mx.random.bernoulli(0.5, shape=shape, key=key),
    }

    def reference():
        if any(not isinstance(s, int) or s < 0 for s in shape):
            raise Invalid("bad shape")
        if d.kind not in {"uniform": "f", "normal": "fc", "randint": "iub"}.get(name, d.kind):
            raise Invalid("dtype")  # complex normal is MLX's too
    try:
        with np.errstate(all="ignore"):
            reference()
        valid = True
    except Invalid:
        valid = False
    try:
        r = calls[name]()
        got = np.array(r)
    except LazyxError as e:
        assert str(e).startswith(f"[{name}]"), f"{name}: {e}"
        return
    except Exception as e:
        raise AssertionError(f"{name}: a non-lazyx exception escaped: {type(e).__name__}: {e}")
    assert valid, f"{name}: expected a lazyx error for shape {shape} and dtype {d}"
    assert got.shape == tuple(shape) and r.dtype == (mx.bool_ if name == "bernoulli" else d)
    if name == "uniform":
        assert ((got >= 0) & (got <= 1)).all()
    if name == "randint":
        assert ((got >= 0) & (got < 2)).all()
    assert np.isfinite(got).all()


PROPERTIES = {name[5:]: fn for name, fn in globals().items() if name.startswith("prop_")}


def main(name: str) -> None:
    """Run property ``name`` (in the child process) and exit 0 when it holds."""
    try:
        PROPERTIES[name]()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
