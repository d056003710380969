"""Metal kernel of the fft pack's ``FFT`` primitive: complex, real-to-complex and
complex-to-real discrete Fourier transforms of any length, over any axes.

One MSL template, ``fft_rows<I, O>`` (``I``/``O``: ``cfloat`` for complex64, a struct of
two floats, or ``float`` for float32), instantiated for the three element pairs of
:data:`PAIRS`. A dispatch is a *pass*: it transforms rows of ``length`` points (at most
:data:`MAX_POINTS`, 4096 complex64 = 32 KiB, a threadgroup's memory), one row per
``T = ceil(L / 8)`` threads: the grid is ``(T, rows)``, its threadgroups ``(T, R)`` with
``R`` rows side by side (up to 256 threads and 4096 points in all: :func:`_threads`).
Each thread ``t`` of a row

1. **loads** points ``j = t, t + T, ...`` of its row into threadgroup memory: logical
   input index ``g = s * in_sub + j * in_step`` of sub-row ``s`` (see below) read from a
   strided row (any axis, any layout: the other axes collapsed as in
   :func:`.common.row_layout`), a real input widened, a half spectrum extended by its
   Hermitian symmetry (``x[g] = conj(x[n - g])`` past the stored bins), zero past
   ``n_read``; conjugated for an inverse transform, times a chirp for Bluestein;
2. runs the **Stockham stages** (autosorting, so the output comes out in natural order):
   for a stage of radix ``r`` after radices of product ``p``, butterfly ``i < L / r``
   reads ``row[i + j L / r]``, multiplies by the twiddle ``w_{pr}^{j (i mod p)}``, does
   an ``r``-point DFT in registers (radices 2, 4 and 8 by additions and one constant,
   3, 5, 7, 11 and 13 by a small DFT from the root table) and writes
   ``row[(i - i mod p) r + i mod p + j p]``; a barrier after the reads and after the
   writes lets one buffer serve every stage;
3. **stores** point ``k`` at logical output index ``h = s * out_sub + k * out_step``
   (below ``n_write``: a real forward transform keeps ``n // 2 + 1`` bins, an inverse
   real one the real parts), after the optional conjugations, chirp, four-step twiddle
   and the node's normalisation (``norm``, one factor per axis, no second pass).

Every transform is a forward DFT with roots ``w_N^t = exp(-2 pi i t / N)``: an inverse is
``conj(DFT(conj(x)))``. Roots, chirps and Bluestein's filter are tables computed on the
host in float64 and rounded once to complex64 (:func:`_roots`, :func:`_chirp`,
:func:`_filter`), so twiddles carry half an ulp of error whatever the length, and a
transform's error grows as ``O(log n)`` float32 ulps of the signal's norm.

How a length ``n`` is planned (:func:`plan`):

* **direct** — ``n <= 4096`` with factors in :data:`RADICES`: one pass.
* **Bluestein** — other ``n`` up to 2048 (a prime factor above 13): the chirp-z
  transform ``X_k = w_k sum_j (x_j w_j) b_{k-j}`` (``w_j = exp(-i pi j^2 / n)``, ``b =
  conj(w)``) as a circular convolution of length ``M``, the power of two ``>= 2n - 1``:
  one pass loads ``x w``, transforms it, multiplies by ``conj(FFT(b))`` (a host table)
  and conjugates, transforms again and stores ``conj(.) w / M``: all in one threadgroup.
* **four-step** — longer ``n``, split as ``n = n1 n2`` (both plannable in one pass):
  pass 1 transforms the ``n2`` columns ``x[j1 n2 + j2]`` (``n1`` points each) and stores
  them times ``w_n^{j2 k1}`` into a scratch array of complex64; pass 2 transforms its
  ``n1`` rows (``n2`` points each) and stores ``X[k1 + n1 k2]``.
* **Bluestein, four-step** — longer ``n`` with a large prime factor: Bluestein's two
  length-``M`` transforms each as a four-step pair, four passes in all (the filter
  multiply fused into the second pass's store, the chirps into the first load and the
  last store).

Every length up to ``2**23`` has a plan, and smooth lengths up to ``4096**2``; longer
rows have none: :class:`~.common.UnsupportedDtype`, and the backend runs the CPU's
kernel. A four-step pass reads its twiddles from the root table of the whole length
(``n`` complex64, host-made and cached, as large as one row). Real input is transformed
as complex with zero imaginary parts (no two-for-one packing: simpler, at most twice the
work of the real transform). A
transform over several axes is one plan per axis, each reading the previous one's
complex64 output: ``rfftn`` starts with the real axis (``axes[-1]``) and ``irfftn``
ends with it. The primitive always gets complex64 (float32 for ``rfft*``): the pack
casts, pads and truncates before the node; any other input dtype is left to the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from .common import (
    PRELUDE,
    Dispatch,
    Library,
    UnsupportedDtype,
    _collapse,
    bindable,
    empty,
    instantiate,
)

__all__ = ["LIBRARY", "MAX_POINTS", "PAIRS", "RADICES", "fft", "plan"]

#: The most points one threadgroup transforms: 4096 complex64 are 32 KiB, the
#: threadgroup memory of Apple GPUs.
MAX_POINTS = 4096
#: The radices the Stockham stages run (larger first: fewer stages, fewer barriers).
RADICES = (8, 4, 2, 3, 5, 7, 11, 13)
#: Values a thread keeps in registers during a stage (``r * ceil((L / r) / T)`` with
#: ``T = ceil(L / 8)`` is at most 13 for every radix above).
MAX_VALUES = 16
#: The most threads of a row (4096 points / 8 per thread).
MAX_THREADS = 512

#: The integer parameters of a pass, in the order of the ``params`` buffer; the MSL
#: reads them through the enumeration generated from this tuple.
PARAMS = ("length", "subrows", "stages", "in_sub", "in_step", "out_sub", "out_step",
          "root_step", "n_read", "n_write", "stored", "logical", "conj_in", "pre", "mid",
          "conj_a", "post", "twiddle", "conj_b", "kept_ndim")

_SOURCE = PRELUDE + f"enum : int {{ MAX_POINTS = {MAX_POINTS}, MAX_VALUES = {MAX_VALUES} }};\n" + \
    "enum FFTParam : int { " + ", ".join(f"P_{name.upper()} = {i}"
                                         for i, name in enumerate(PARAMS)) + " };\n" + r"""
// complex64 as a struct of two floats (the layout of NumPy's complex64); scalar code only.
struct cfloat { float re; float im; };
inline cfloat cmake(float re, float im) { cfloat z; z.re = re; z.im = im; return z; }
inline cfloat cadd(cfloat a, cfloat b) { return cmake(a.re + b.re, a.im + b.im); }
inline cfloat csub(cfloat a, cfloat b) { return cmake(a.re - b.re, a.im - b.im); }
inline cfloat cmul(cfloat a, cfloat b) {
  return cmake(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
inline cfloat cconj(cfloat a) { return cmake(a.re, -a.im); }
inline cfloat cmul_neg_i(cfloat a) { return cmake(a.im, -a.re); }   // a * (-i)

// A point of the input as a complex value, and a point of the output from one.
inline cfloat widen(cfloat v) { return v; }
inline cfloat widen(float v) { return cmake(v, 0.0f); }
inline void put(device cfloat* out, int64_t at, cfloat v) { out[at] = v; }
inline void put(device float* out, int64_t at, cfloat v) { out[at] = v.re; }

// The forward 4-point DFT of (a, b, c, d) in place.
inline void dft4(thread cfloat& a, thread cfloat& b, thread cfloat& c, thread cfloat& d) {
  const cfloat s0 = cadd(a, c), d0 = csub(a, c);
  const cfloat s1 = cadd(b, d), d1 = cmul_neg_i(csub(b, d));
  a = cadd(s0, s1);
  b = cadd(d0, d1);
  c = csub(s0, s1);
  d = csub(d0, d1);
}

// The forward r-point DFT of x[0..r) in place; w_r^e is roots[e * step]. Radices 2, 4
// and 8 need no table (their roots are 1, -i and (+-1 - i) / sqrt 2); the others are a
// direct sum over the table's roots (r <= 13: as cheap as a factorisation at this size).
inline void dft(thread cfloat* x, int r, device const cfloat* roots, int step) {
  if (r == 2) {
    const cfloat a = x[0], b = x[1];
    x[0] = cadd(a, b);
    x[1] = csub(a, b);
    return;
  }
  if (r == 4) {
    dft4(x[0], x[1], x[2], x[3]);
    return;
  }
  if (r == 8) {
    cfloat e0 = x[0], e1 = x[2], e2 = x[4], e3 = x[6];
    cfloat o0 = x[1], o1 = x[3], o2 = x[5], o3 = x[7];
    dft4(e0, e1, e2, e3);
    dft4(o0, o1, o2, o3);
    const float h = 0.70710678118654752f;   // w_8 = (1 - i) / sqrt 2, w_8^3 = (-1 - i) / sqrt 2
    o1 = cmake((o1.re + o1.im) * h, (o1.im - o1.re) * h);
    o2 = cmul_neg_i(o2);
    o3 = cmake((o3.im - o3.re) * h, -(o3.re + o3.im) * h);
    x[0] = cadd(e0, o0); x[4] = csub(e0, o0);
    x[1] = cadd(e1, o1); x[5] = csub(e1, o1);
    x[2] = cadd(e2, o2); x[6] = csub(e2, o2);
    x[3] = cadd(e3, o3); x[7] = csub(e3, o3);
    return;
  }
  cfloat y[MAX_VALUES];
  for (int q = 0; q < r; ++q) {
    cfloat acc = x[0];
    int e = 0;
    for (int j = 1; j < r; ++j) {
      e += q;
      if (e >= r) e -= r;                 // (j q) mod r, without a division
      acc = cadd(acc, cmul(x[j], roots[e * step]));
    }
    y[q] = acc;
  }
  for (int q = 0; q < r; ++q) x[q] = y[q];
}

// The Stockham stages over the `length` points of `row` (thread t of T): natural order in,
// natural order out. w_length^e is roots[e * root_step].
inline void stockham(threadgroup cfloat* row, int length, int stages, constant int* radices,
                     device const cfloat* roots, int root_step, int t, int T) {
  int p = 1;                                  // the product of the radices done
  for (int st = 0; st < stages; ++st) {
    const int r = radices[st];
    const int b = length / r;                 // butterflies of this stage
    const int span = (length / (p * r)) * root_step;   // w_{pr} = roots[span]
    cfloat v[MAX_VALUES];
    int c = 0;
    for (int i = t; i < b; i += T, c += r) {
      const int k = i % p;
      for (int j = 0; j < r; ++j) {
        const cfloat x = row[i + j * b];
        v[c + j] = (j == 0 || k == 0) ? x : cmul(x, roots[j * k * span]);
      }
    }
    // Every thread holds its inputs: the stage writes over the same buffer.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    c = 0;
    for (int i = t; i < b; i += T, c += r) {
      dft(v + c, r, roots, b * root_step);
      const int k = i % p;
      const int at = (i - k) * r + k;
      for (int j = 0; j < r; ++j) row[at + j * p] = v[c + j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    p *= r;
  }
}

// One pass: rows of params[P_LENGTH] points (see the module docstring). Row `row` is
// sub-row s = row % S of batch position row / S (the kept axes, collapsed: kept_shape
// with in_strides / out_strides); axis_strides are the element strides of the
// transformed axis (input, output).
template <typename I, typename O>
[[kernel]] void fft_rows(
    device const I* in [[buffer(0)]], device O* out [[buffer(1)]],
    device const cfloat* roots [[buffer(2)]], device const cfloat* pre [[buffer(3)]],
    device const cfloat* mid [[buffer(4)]], device const cfloat* post [[buffer(5)]],
    constant int* radices [[buffer(6)]], constant int* params [[buffer(7)]],
    constant int* kept_shape [[buffer(8)]], constant int64_t* in_strides [[buffer(9)]],
    constant int64_t* out_strides [[buffer(10)]], constant int64_t* axis_strides [[buffer(11)]],
    constant float& scale [[buffer(12)]],
    uint3 gid [[thread_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]]) {
  threadgroup cfloat tile[MAX_POINTS];
  const int L = params[P_LENGTH], S = params[P_SUBROWS];
  const int t = int(lid.x), T = int(threads.x);
  const int base = int(lid.y) * L;   // this row's part of the tile
  const int s = int(gid.y % uint(S));
  const uint64_t batch = gid.y / uint(S);
  const int kept_ndim = params[P_KEPT_NDIM];
  const int64_t in_at = elem_to_loc(batch, kept_shape, in_strides, kept_ndim);
  const int64_t out_at = elem_to_loc(batch, kept_shape, out_strides, kept_ndim);
  const int64_t in_axis = axis_strides[0], out_axis = axis_strides[1];

  // 1. Load: logical input index g; a half spectrum (stored > 0 bins of a `logical`-point
  // signal) is extended by its symmetry; zeros past n_read.
  const int n_read = params[P_N_READ], stored = params[P_STORED], logical = params[P_LOGICAL];
  for (int j = t; j < L; j += T) {
    const int g = s * params[P_IN_SUB] + j * params[P_IN_STEP];
    cfloat x = cmake(0.0f, 0.0f);
    if (g < n_read) {
      x = (stored > 0 && g >= stored) ? cconj(widen(in[in_at + int64_t(logical - g) * in_axis]))
                                      : widen(in[in_at + int64_t(g) * in_axis]);
      if (params[P_CONJ_IN]) x = cconj(x);
      if (params[P_PRE]) x = cmul(x, pre[g]);
    }
    tile[base + j] = x;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 2. The transform; Bluestein in one threadgroup: times the filter (conjugated), again.
  const int stages = params[P_STAGES], root_step = params[P_ROOT_STEP];
  stockham(tile + base, L, stages, radices, roots, root_step, t, T);
  if (params[P_MID]) {
    for (int j = t; j < L; j += T) tile[base + j] = cmul(cconj(tile[base + j]), mid[j]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    stockham(tile + base, L, stages, radices, roots, root_step, t, T);
  }

  // 3. Store: logical output index h, below n_write.
  const int n_write = params[P_N_WRITE];
  for (int k = t; k < L; k += T) {
    const int h = s * params[P_OUT_SUB] + k * params[P_OUT_STEP];
    if (h >= n_write) continue;
    cfloat y = tile[base + k];
    if (params[P_CONJ_A]) y = cconj(y);
    if (params[P_POST]) y = cmul(y, post[h]);
    if (params[P_TWIDDLE] && s * k != 0) y = cmul(y, roots[s * k]);   // w_N^{s k}, s k < N
    if (params[P_CONJ_B]) y = cconj(y);
    put(out, out_at + int64_t(h) * out_axis, cmake(y.re * scale, y.im * scale));
  }
}
"""

#: The element types of the input and the output: complex-to-complex, real-to-complex
#: (``rfft``'s first pass) and complex-to-real (``irfft``'s last).
PAIRS = (("complex64", "complex64"), ("float32", "complex64"), ("complex64", "float32"))
_MSL = {"complex64": "cfloat", "float32": "float"}

LIBRARY = Library("fft", _SOURCE + "\n" + "".join(
    instantiate(f"fft_{i}_{o}", "fft_rows", _MSL[i], _MSL[o]) for i, o in PAIRS))

_C64, _F32 = np.dtype(np.complex64), np.dtype(np.float32)


# -- host tables: float64, rounded once --------------------------------------------------------
@lru_cache(maxsize=8)
def _roots(n: int) -> np.ndarray:
    """``exp(-2 pi i t / n)`` for ``t < n`` (complex64)."""
    t = np.arange(n, dtype=np.float64)
    return np.exp(-2j * np.pi * t / n).astype(np.complex64)


@lru_cache(maxsize=8)
def _chirp(n: int) -> np.ndarray:
    """Bluestein's chirp ``w_j = exp(-i pi j^2 / n)`` for ``j < n`` (complex64); ``j^2`` is
    reduced modulo ``2n`` in integers, so the angle is exact before its one rounding."""
    j = np.arange(n, dtype=np.int64)
    return np.exp(-1j * np.pi * ((j * j) % (2 * n)) / n).astype(np.complex64)


@lru_cache(maxsize=8)
def _filter(n: int, m: int) -> np.ndarray:
    """``conj(FFT_m(b))`` (complex64) of Bluestein's filter ``b_j = conj(w_j)`` wrapped
    circularly into ``m`` points (``b_{m-j} = b_j``), transformed in float64."""
    j = np.arange(n, dtype=np.int64)
    b = np.exp(1j * np.pi * ((j * j) % (2 * n)) / n)
    full = np.zeros(m, np.complex128)
    full[:n] = b
    full[m - n + 1:] = b[1:][::-1]
    return np.conj(np.fft.fft(full)).astype(np.complex64)


# -- plans -----------------------------------------------------------------------------------
def _radices(n: int):
    """The Stockham radices of ``n`` (a tuple), or None when a prime factor is above 13."""
    out = []
    for r in RADICES:
        while n % r == 0:
            out.append(r)
            n //= r
    return tuple(out) if n == 1 else None


def _one_pass(n: int) -> bool:
    return n <= MAX_POINTS and _radices(n) is not None


def _split(n: int):
    """``(n1, n2)``, ``n = n1 n2`` with both one-pass lengths, ``n1`` nearest ``sqrt(n)``;
    None when there is none."""
    splits = [n1 for n1 in range(max(2, -(-n // MAX_POINTS)), min(MAX_POINTS, n - 1) + 1)
              if n % n1 == 0 and _one_pass(n1) and _one_pass(n // n1)]
    if not splits:
        return None
    n1 = min(splits, key=lambda d: abs(math.log(d * d / n)))
    return n1, n // n1


@lru_cache(maxsize=64)
def plan(n: int):
    """How a transform of ``n`` points runs: ``("direct", n)``, ``("bluestein", m)``,
    ``("four-step", n1, n2)`` or ``("bluestein four-step", m, m1, m2)`` (see the module
    docstring), or None (longer than any plan: the CPU runs it)."""
    if _one_pass(n):
        return ("direct", n)
    m = 1 << (2 * n - 2).bit_length()         # the power of two >= 2n - 1
    if m <= MAX_POINTS:
        return ("bluestein", m)
    split = _split(n)
    if split is not None:
        return ("four-step", *split)
    split = _split(m)
    return None if split is None else ("bluestein four-step", m, *split)


@dataclass(frozen=True)
class _Pass:
    """One dispatch: its integer parameters (:data:`PARAMS`), tables and scale."""

    length: int
    roots: np.ndarray
    root_step: int = 1
    subrows: int = 1
    in_sub: int = 0
    in_step: int = 1
    out_sub: int = 0
    out_step: int = 1
    n_read: int = 0
    n_write: int = 0
    stored: int = 0
    logical: int = 0
    conj_in: bool = False
    pre: np.ndarray | None = None
    mid: np.ndarray | None = None
    conj_a: bool = False
    post: np.ndarray | None = None
    twiddle: bool = False
    conj_b: bool = False
    scale: float = 1.0

    def params(self, stages: int, kept_ndim: int) -> list:
        """The ``params`` buffer: :data:`PARAMS` in order, a table given as the flag 1."""
        values = {"stages": stages, "kept_ndim": kept_ndim}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = int(v is not None) if f.name in _TABLES else v
        return [int(values[name]) for name in PARAMS]


#: The optional tables of a pass (bound to buffers 3, 4, 5; their flags in ``params``).
_TABLES = ("pre", "mid", "post")


def _passes(n: int, read: dict, write: dict, scale: float) -> list:
    """The passes of one transform of ``n`` points. ``read`` holds the first pass's input
    options (``n_read``, ``stored``, ``logical``, ``conj_in``), ``write`` the last pass's
    output ones (``n_write``, ``conj_b``); the passes between read and write scratch
    arrays of complex64 (:func:`_axis` allocates them)."""
    how = plan(n)
    if how is None:
        raise UnsupportedDtype(f"Metal kernel fft has no plan for a transform of {n} points "
                               f"(it plans every length up to 2**23, and lengths with no prime "
                               f"factor above 13 up to {MAX_POINTS}**2); the CPU's kernel runs "
                               f"it.")
    kind = how[0]
    if kind == "direct":
        return [_Pass(n, _roots(n), **read, **write, scale=scale)]
    if kind == "bluestein":
        m = how[1]
        w = _chirp(n)
        return [_Pass(m, _roots(m), **read, pre=w, mid=_filter(n, m), conj_a=True, post=w,
                      **write, scale=scale / m)]
    if kind == "four-step":
        return _four_step(n, *how[1:], read, write, scale)
    m, m1, m2 = how[1:]
    w = _chirp(n)
    forward = _four_step(m, m1, m2, {**read, "pre": w},
                         {"n_write": m, "conj_a": True, "post": _filter(n, m)}, 1.0)
    back = _four_step(m, m1, m2, {"n_read": m}, {**write, "conj_a": True, "post": w}, scale / m)
    return forward + back


def _four_step(n, n1, n2, read, write, scale):
    """The two passes of an ``n = n1 n2``-point transform (see the module docstring)."""
    roots = _roots(n)
    read = dict(read)
    read.setdefault("n_read", n)
    return [
        # columns x[j1 n2 + j2] -> scratch[k1 n2 + j2], times w_n^{j2 k1}
        _Pass(n1, roots, root_step=n2, subrows=n2, in_sub=1, in_step=n2, out_sub=1,
              out_step=n2, n_write=n, twiddle=True, **read),
        # rows scratch[k1 n2 + j2] -> X[k1 + n1 k2]
        _Pass(n2, roots, root_step=n1, subrows=n1, in_sub=n2, in_step=1, out_sub=1,
              out_step=n1, n_read=n, **write, scale=scale),
    ]


# -- the launcher ------------------------------------------------------------------------------
def _scale(norm: str, inverse: bool, n: int) -> float:
    """The factor ``norm`` puts on a transform of ``n`` points (the pack's ``NORMS``)."""
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    return 1.0 / n if (norm == "backward") == inverse else 1.0


def _threads(length: int, rows: int) -> tuple:
    """(threads per row, rows per threadgroup): 8 points a thread; rows side by side up to
    256 threads and :data:`MAX_POINTS` points of threadgroup memory."""
    per_row = min(MAX_THREADS, -(-length // 8))
    side = max(1, min(rows, MAX_POINTS // length, 256 // per_row))
    return per_row, side


def _strides(a: np.ndarray, axis: int) -> tuple:
    """(the element strides of ``a``'s axes but ``axis``, that of ``axis``)."""
    st = [s // a.itemsize for s in a.strides]
    return st[:axis] + st[axis + 1:], st[axis]


def _dispatch(run, p: _Pass, src: np.ndarray, src_axis: int, dst: np.ndarray, dst_axis: int):
    """Run pass ``p`` from ``src`` (rows along ``src_axis``) into ``dst``."""
    kept = src.shape[:src_axis] + src.shape[src_axis + 1:]
    src_kept, src_step = _strides(src, src_axis)
    dst_kept, dst_step = _strides(dst, dst_axis)
    dims, (sin, sout) = _collapse(kept, src_kept, dst_kept)
    batch = math.prod(kept)
    rows = batch * p.subrows
    if rows >= 2 ** 31 or p.length * max(p.in_step, p.out_step, 1) >= 2 ** 31:
        raise UnsupportedDtype(f"Metal kernel fft indexes rows with 32-bit integers; {rows} "
                               f"rows of {p.length} points are past them.")
    radices = _radices(p.length)
    params = np.array(p.params(len(radices), len(dims)), np.int32)
    none = p.roots[:1]                         # what an unused table's buffer binds
    per_row, side = _threads(p.length, rows)
    run(Dispatch(LIBRARY, f"fft_{src.dtype.name}_{dst.dtype.name}", [
        src, dst, p.roots, none if p.pre is None else p.pre,
        none if p.mid is None else p.mid, none if p.post is None else p.post,
        np.array(radices or (1,), np.int32), params,
        np.array(dims or [1], np.int32), np.array(sin or [0], np.int64),
        np.array(sout or [0], np.int64), np.array([src_step, dst_step], np.int64),
        np.array([p.scale], np.float32)], (per_row, rows, 1), (per_row, side, 1)))


def _axis(run, src: np.ndarray, dst: np.ndarray, axis: int, inverse: bool, norm: str) -> None:
    """One axis's transform from ``src`` into ``dst`` (their dtypes and lengths along
    ``axis`` say which: complex, real-to-complex, complex-to-real)."""
    to_real = dst.dtype == _F32
    n = dst.shape[axis] if to_real else src.shape[axis]
    read = {"n_read": n, "conj_in": inverse}
    if to_real:   # the half spectrum of an n-point real signal
        read.update(stored=src.shape[axis], logical=n)
    write = {"n_write": dst.shape[axis], "conj_b": inverse}
    passes = _passes(n, read, write, _scale(norm, inverse, n))
    kept = src.shape[:axis] + src.shape[axis + 1:]
    src_axis = axis
    for k, p in enumerate(passes):
        if k == len(passes) - 1:
            target, target_axis = dst, axis
        else:   # a C-contiguous scratch array: the kept axes, then the pass's points
            target = empty(run, kept + (p.subrows * p.length,), _C64)
            target_axis = len(kept)
        _dispatch(run, p, src, src_axis, target, target_axis)
        src, src_axis = target, target_axis


def fft(primitive, inputs, run):
    """``FFT`` on Metal: the transform of ``inputs[0]`` (complex64, or float32 for a real
    forward transform) over ``primitive.axes``, scaled as ``primitive.norm`` says."""
    x = inputs[0]
    want = _F32 if primitive.real and not primitive.inverse else _C64
    if np.dtype(x.dtype) != want:
        # (complex128 has no lazyx dtype to name: the message names NumPy's)
        raise UnsupportedDtype(f"Metal kernel fft has no version for dtype "
                               f"{np.dtype(x.dtype).name} in this transform; it reads "
                               f"{want.name}. Run the primitive on another backend (the CPU's) "
                               f"for this dtype.")
    shape = primitive.output_shapes([x])[0]
    out = empty(run, shape, _F32 if primitive.real and primitive.inverse else _C64)
    if out.size == 0:
        return out
    axes = list(primitive.axes)
    if primitive.real and not primitive.inverse:
        axes = axes[-1:] + axes[:-1]          # the real axis first: then all complex
    x = bindable(x)
    for k, axis in enumerate(axes):
        if k == len(axes) - 1:
            target = out
        else:
            size = list(x.shape)
            if primitive.real and not primitive.inverse and k == 0:
                size[axis] = size[axis] // 2 + 1
            target = empty(run, tuple(size), _C64)
        _axis(run, x, target, axis, primitive.inverse, primitive.norm)
        x = target
    return out
