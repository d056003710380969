"""The Metal backend's self-test: every kind of kernel it has, on this machine's GPU,
against the CPU backend on the same inputs.

    python -m lazyx.backends.metal.selftest [--quick] [--only TEXT] [--emulate]

The flow:

1. **Enable the backend** (:func:`enable`): on a Mac the real GPU (``LAZYX_METAL=1``
   is set for this process, overriding a ``LAZYX_METAL=0``); with ``--emulate`` lazyx's C++
   shim in its place (:func:`lazyx.backends.metal.emulate_on_cpu`), which checks the
   MSL on any machine with a C++ compiler but says nothing about the GPU. Where neither
   is possible the test prints why and exits with status 2.
2. **Run the cases** (:data:`CASES`, a list of :class:`Case`; one table row per case
   and dtype): random inputs drawn once, the computation on the CPU stream (the CPU
   backend: the reference) and on the GPU stream with the Metal backend active, the
   latter through the public API (``lazyx.core``, ``stream=mx.gpu``) as users run it.
   The kinds: generated element-wise kernels over the fusible primitives and dtypes
   (contiguous and broadcast layouts), ``compile``'s fused kernels, the built-in MSL
   kernels (reductions, arg-reductions, softmax, log-sum-exp, products and the masked,
   segmented and Hadamard ones, scans, random bits, sorts, indexing, creation, the
   ``fast`` pack and its backwards, convolutions, quantization in every mode, FFTs)
   over a few shapes and axes, and a primitive that runs the explicit CPU fallback
   (linear algebra).
3. **Say which path ran** from the backend's counters, read before and after the GPU
   call: ``lazyx.backends.metal.compiled.stats`` (generated launches) and
   ``lazyx.backends.metal.stats`` (built-in dispatches, CPU fallbacks). Where a counter
   is missing the path is "unknown" and not checked. A case that expects a generated or
   built-in kernel and ran another path fails (a fast path silently lost); one that
   expects the CPU fallback passes on any path (a primitive gaining a kernel is news,
   not a failure).
4. **Compare** each output's dtype, shape and values with the CPU's, within the
   tolerance of its dtype (:data:`lazyx.testing.checks.TOLERANCES`; integers and bool
   exactly), and print the table: kernel, dtype, shape, path, max error, result
   (pass / FAIL with the reason / skipped with the reason). Exit status 1 when a row
   failed, else 0.

:func:`main` takes a ``cases`` argument: the hook through which tests run their own
cases (a deliberately broken one must make the test fail).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import lazyx.core as mx
from lazyx import backend as registry
from lazyx.environment import read_variable
from lazyx.errors import BackendError, KernelNotFoundError, LazyxError
from lazyx.testing.checks import TOLERANCES, random_array

from .. import metal
from . import compiled

__all__ = ["Case", "CASES", "GENERATED", "BUILTIN", "FALLBACK", "UNKNOWN", "enable", "run_case",
           "main"]

# -- the paths a GPU call can take (how the table names them) ------------------------------
GENERATED = "generated"
BUILTIN = "built-in"
FALLBACK = "CPU fallback"
UNKNOWN = "unknown"

FLOATS = ("float32", "float16", "bfloat16")
INTS = ("int32",)
BOOLS = ("bool",)
NUMBERS = FLOATS + INTS


@dataclass(frozen=True)
class Case:
    """One computation checked on the GPU against the CPU backend, for each of its dtypes.

    Attributes:
        kernel: its name in the table (``"exp"``, ``"sum axis=1"``).
        fn: the lazyx computation, called with lazyx arrays on the stream in effect;
          returns an array or a tuple of arrays.
        dtypes: the dtype names (``"float32"``, ``"bool"`` ...) of its inputs, one row each.
        shapes: one shape per input.
        path: the path expected on the GPU (:data:`GENERATED`, :data:`BUILTIN`,
          :data:`FALLBACK`).
        domain: inputs are drawn uniformly from ``[low, high)`` (integers in it).
        nonzero: the last input has no zeros (divisors).
        compiled: the GPU runs ``mx.compile(fn)``; the CPU reference runs ``fn`` itself.
        reference: what the CPU runs instead of ``fn`` (default ``fn``).
        quick: part of ``--quick``'s reduced list.
    """

    kernel: str
    fn: Callable
    dtypes: tuple
    shapes: tuple
    path: str
    domain: tuple = (-4.0, 4.0)
    nonzero: bool = False
    compiled: bool = False
    reference: Callable | None = None
    quick: bool = False


# -- the cases --------------------------------------------------------------------------------
# Element-wise ops with a generated kernel: public name -> (arity, dtypes, input domain).
# Domains keep inputs where the function is defined (and, for float16, finite).
_UNARY = {
    "abs": (NUMBERS, None), "negative": (NUMBERS, None), "sign": (NUMBERS, None),
    "square": (NUMBERS, None), "exp": (FLOATS, None), "expm1": (FLOATS, None),
    "log": (FLOATS, (0.1, 4.0)), "log1p": (FLOATS, (-0.9, 4.0)), "log2": (FLOATS, (0.1, 4.0)),
    "log10": (FLOATS, (0.1, 4.0)), "sqrt": (FLOATS, (0.0, 4.0)), "rsqrt": (FLOATS, (0.1, 4.0)),
    "sin": (FLOATS, None), "cos": (FLOATS, None), "tan": (FLOATS, (-1.2, 1.2)),
    "arcsin": (FLOATS, (-0.99, 0.99)), "arccos": (FLOATS, (-0.99, 0.99)),
    "arctan": (FLOATS, None), "sinh": (FLOATS, None), "cosh": (FLOATS, None),
    "tanh": (FLOATS, None), "arcsinh": (FLOATS, None), "arccosh": (FLOATS, (1.01, 4.0)),
    "arctanh": (FLOATS, (-0.95, 0.95)), "floor": (FLOATS, None), "ceil": (FLOATS, None),
    "round": (FLOATS, None), "erf": (FLOATS, None), "erfinv": (FLOATS, (-0.95, 0.95)),
    "sigmoid": (FLOATS, None), "isnan": (FLOATS, None), "isinf": (FLOATS, None),
    "isfinite": (FLOATS, None), "stop_gradient": (NUMBERS + BOOLS, None),
    "logical_not": (BOOLS, None), "bitwise_invert": (INTS, None),
}
_BINARY = {
    "add": (NUMBERS, None, False), "subtract": (NUMBERS, None, False),
    "multiply": (NUMBERS, None, False), "divide": (FLOATS, None, True),
    "maximum": (NUMBERS, None, False), "minimum": (NUMBERS, None, False),
    "power": (FLOATS, (0.1, 3.0), False), "logaddexp": (FLOATS, None, False),
    "arctan2": (FLOATS, None, False), "floor_divide": (NUMBERS, None, True),
    "remainder": (NUMBERS, None, True), "equal": (NUMBERS + BOOLS, None, False),
    "not_equal": (NUMBERS + BOOLS, None, False), "less": (NUMBERS, None, False),
    "less_equal": (NUMBERS, None, False), "greater": (NUMBERS, None, False),
    "greater_equal": (NUMBERS, None, False), "logical_and": (BOOLS, None, False),
    "logical_or": (BOOLS, None, False), "bitwise_and": (INTS, None, False),
    "bitwise_or": (INTS, None, False), "bitwise_xor": (INTS, None, False),
    "left_shift": (INTS, (0.0, 8.0), False), "right_shift": (INTS, (0.0, 8.0), False),
}
_SHAPE = (33, 17)          # not a multiple of a SIMD width
_BROADCAST = ((33, 17), (17,))  # the strided kernel
_QUICK = {"exp", "add", "greater", "logical_and"}


def _op(name):
    """``lazyx.core.<name>`` looked up at call time (a case list is built at import)."""
    def call(*args):
        return getattr(mx, name)(*args)
    call.__name__ = name
    return call


def _elementwise_cases() -> list[Case]:
    unary = [Case(name, _op(name), dtypes, (_SHAPE,), GENERATED, domain or (-4.0, 4.0),
                  quick=name in _QUICK) for name, (dtypes, domain) in _UNARY.items()]
    binary = [Case(name, _op(name), dtypes, shapes, GENERATED, domain or (-4.0, 4.0), nonzero,
                   quick=name in _QUICK and shapes == _BROADCAST)
              for name, (dtypes, domain, nonzero) in _BINARY.items()
              for shapes in ((_SHAPE, _SHAPE), _BROADCAST)]
    where = Case("where", lambda c, a, b: mx.where(c > 0, a, b), NUMBERS, (_SHAPE,) * 3, GENERATED)
    return unary + binary + [where]


def _gelu(x):
    # GELU with erf, as nn.gelu: one fused kernel.
    return x * 0.5 * (1.0 + mx.erf(x / np.sqrt(2.0).item()))


def _two_outputs(x, y):
    # Several ops, a Python scalar and two outputs in one fused kernel.
    a = mx.sin(x) * y + 1.5
    return mx.maximum(a, mx.exp(-mx.abs(x))) - y / 2.0, a


_COMPILED = [
    Case("compile: gelu (erf)", _gelu, FLOATS, ((64, 48),), GENERATED, compiled=True, quick=True),
    Case("compile: 2 outputs, broadcast", _two_outputs, FLOATS, ((16, 24), (24,)), GENERATED,
         compiled=True),
]


def _reduce(name, axis):
    def call(x):
        return getattr(mx, name)(x, axis=axis)
    return call


# The built-in kernels: (shape, axis) pairs cover the row kernel (last axis, all axes,
# strided axes) and the column kernel (leading axes of a contiguous input).
_REDUCE_SHAPES = (((7,), None), ((5, 33), 1), ((33, 5), 0), ((4, 6, 9), (0, 2)))
_QUICK_REDUCE = {("sum", 1), ("max", 0), ("argmax", 1), ("softmax", -1), ("logsumexp", -1)}


def _builtin_cases() -> list[Case]:
    reduce = {"sum": NUMBERS + BOOLS, "prod": FLOATS, "max": NUMBERS, "min": NUMBERS,
              "all": BOOLS + ("float32",), "any": BOOLS + ("float32",)}
    cases = [Case(f"{name} axis={axis}", _reduce(name, axis), dtypes, (shape,), BUILTIN,
                  (0.5, 1.5) if name == "prod" else (-4.0, 4.0),
                  quick=(name, axis) in _QUICK_REDUCE)
             for name, dtypes in reduce.items() for shape, axis in _REDUCE_SHAPES]
    cases += [Case(f"{name} axis={axis}", _reduce(name, axis), NUMBERS, (shape,), BUILTIN,
                   quick=(name, axis) in _QUICK_REDUCE)
              for name in ("argmax", "argmin")
              for shape, axis in (((7,), None), ((5, 33), 1), ((4, 6, 9), 0))]
    cases += [Case(f"{name} axis={axis}", _reduce(name, axis), FLOATS, (shape,), BUILTIN,
                   quick=(name, axis) in _QUICK_REDUCE and shape == (5, 33))
              for name in ("softmax", "logsumexp")
              for shape, axis in (((5, 33), -1), ((4, 6, 9), (0, 2)), ((3, 200), -1))]
    return cases


# Primitives without a Metal kernel yet: the explicit CPU fallback on unified memory.
_FALLBACK = [
    Case("linalg.inv", lambda a: mx.linalg.inv(a), ("float32",), ((6, 6),), FALLBACK, quick=True),
]

# Matrix products (kernels/products.py): sizes not multiples of the 32 x 32 tile, a batch
# broadcast against one matrix, vectors, addmm with alpha and beta. (A transposed operand
# is a Transpose node, a CPU-fallback view here: tests/backends/test_metal_products.py.)
_PRODUCTS = [
    Case("matmul", lambda a, b: mx.matmul(a, b), FLOATS, ((8, 12), (12, 5)), BUILTIN, quick=True),
    # Non-negative operands: a sum of 40 products with cancellation has no relative bound.
    Case("matmul 33x40 @ 40x17", lambda a, b: mx.matmul(a, b), FLOATS, ((33, 40), (40, 17)),
         BUILTIN, (0.0, 1.0)),
    Case("matmul batch broadcast", lambda a, b: mx.matmul(a, b), ("float32",),
         ((2, 1, 5, 9), (3, 9, 4)), BUILTIN),
    Case("matmul vector @ matrix", lambda a, b: mx.matmul(a, b), ("float32",), ((9,), (9, 7)),
         BUILTIN),
    Case("addmm alpha=2 beta=-0.5", lambda c, a, b: mx.addmm(c, a, b, alpha=2.0, beta=-0.5),
         FLOATS, ((7,), (6, 10), (10, 7)), BUILTIN, quick=True),
]

#: Every case of the self-test, in table order.
CASES: list[Case] = _elementwise_cases() + _COMPILED + _builtin_cases() + _PRODUCTS + _FALLBACK


# Scans, random bits and sorts (kernels/scans.py, random.py, sorting.py): rows not a
# multiple of 32, a strided axis. Metal's Partition and ArgPartition are the full sort (a
# partition at every kth, see kernels/sorting.py), so the CPU's sort and argsort are
# their references.
CASES += [
    *(Case(f"{name} axis={axis}", _reduce(name, axis), dtypes, ((6, 33),), BUILTIN,
           (0.8, 1.2) if name == "cumprod" else (-4.0, 4.0), quick=(name, axis) == ("cumsum", 1))
      for name, dtypes in (("cumsum", NUMBERS), ("cumprod", FLOATS), ("cummax", NUMBERS),
                           ("logcumsumexp", FLOATS))
      for axis in (0, 1)),
    Case("cumsum reverse exclusive", lambda x: mx.cumsum(x, axis=1, reverse=True, inclusive=False),
         ("float32", "int32"), ((6, 33),), BUILTIN),
    Case("random split", lambda k: mx.random.split(k, 7), ("uint32",), ((2,),), BUILTIN,
         (0.0, 100.0), quick=True),
    Case("random split (batch of keys)", lambda k: mx.vmap(lambda kk: mx.random.split(kk, 5))(k),
         ("uint32",), ((3, 2),), BUILTIN, (0.0, 100.0)),
    *(Case(f"{name} axis={axis}", _reduce(name, axis), NUMBERS + BOOLS, (shape,), BUILTIN,
           quick=(name, axis) == ("argsort", -1))
      for name in ("sort", "argsort")
      for shape, axis in (((6, 33), -1), ((33, 6), 0), ((7,), None))),
    Case("partition kth=4", lambda x: mx.partition(x, 4, axis=-1), NUMBERS, ((6, 33),), BUILTIN,
         reference=lambda x: mx.sort(x, axis=-1)),
    Case("argpartition kth=4", lambda x: mx.argpartition(x, 4, axis=-1), NUMBERS, ((6, 33),),
         BUILTIN, reference=lambda x: mx.argsort(x, axis=-1)),
    Case("searchsorted right",
         lambda s, v: mx.searchsorted(mx.sort(s, stream=mx.cpu), v, side="right"), NUMBERS,
         ((40,), (5, 6)), BUILTIN),
    # topk's order is free: both sides sorted after it
    Case("topk k=5", lambda x: mx.sort(mx.topk(x, 5, axis=-1), axis=-1), NUMBERS, ((6, 33),),
         BUILTIN),
]


def _assigned(x, v):
    x[mx.array([1, -2, 1])] = v     # repeated positions: the last update wins
    return x


# Gathers, scatters and copies (kernels/indexing.py, shapes.py): negative and repeated
# indices, slices beside index arrays, strided blocks.
CASES += [
    Case("take axis=0", lambda x: mx.take(x, mx.array([[0, -1], [3, 3]]), axis=0),
         NUMBERS + BOOLS, ((6, 33),), BUILTIN, quick=True),
    Case("gather x[idx, ::-2]", lambda x: x[mx.array([4, 0, -6]), ::-2], NUMBERS, ((6, 33),),
         BUILTIN),
    Case("take_along_axis", lambda x: mx.take_along_axis(x, mx.array([[32, 0, -1]]), axis=1),
         NUMBERS + BOOLS, ((6, 33),), BUILTIN),
    Case("scatter add (repeats)", lambda x, v: x.at[mx.array([1, 4, 1, -1])].add(v), NUMBERS,
         ((6, 33), (4, 33)), BUILTIN, quick=True),
    Case("scatter max (repeats)", lambda x, v: x.at[mx.array([1, 4, 1, -1])].maximum(v),
         NUMBERS, ((6, 33), (4, 33)), BUILTIN),
    Case("scatter assign (repeats)", _assigned, NUMBERS + BOOLS, ((6, 33), (3, 33)), BUILTIN),
    Case("put_along_axis", lambda x, v: mx.put_along_axis(x, mx.array([[0, 5, 5]]), v, axis=0),
         NUMBERS, ((6, 3), (1, 3)), BUILTIN),
    Case("concatenate axis=1", lambda x, y: mx.concatenate([x, y], axis=1),
         NUMBERS + BOOLS, ((6, 33), (6, 5)), BUILTIN),
    Case("pad", lambda x: mx.pad(x, ((1, 2), (0, 3))), NUMBERS, ((6, 33),), BUILTIN),
    Case("slice_update", lambda x, u: mx.slice_update(x, u, mx.array([2, 7]), (0, 1)), NUMBERS,
         ((6, 33), (3, 9)), BUILTIN),
]


# The fast pack's forwards (kernels/fast.py): rows past a simdgroup, grouped-query heads, a
# causal mask with sinks, a boolean mask (a 4-d constant: no reshape node), wrapped targets.
_SDPA_MASK = np.arange(5 * 6).reshape(1, 1, 5, 6) % 3 != 0
CASES += [
    Case("fast.rms_norm", lambda x, w: mx.fast.rms_norm(x, w, 1e-5), FLOATS, ((6, 40), (40,)),
         BUILTIN, quick=True),
    Case("fast.layer_norm", lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5), FLOATS,
         ((6, 40), (40,), (40,)), BUILTIN),
    Case("fast.rope", lambda x: mx.fast.rope(x, 6, traditional=False, base=10000.0, scale=1.0,
                                             offset=3), FLOATS, ((2, 3, 5, 8),), BUILTIN,
         quick=True),
    Case("fast.rope traditional", lambda x: mx.fast.rope(x, 8, traditional=True, base=500.0,
                                                         scale=0.5, offset=1),
         FLOATS, ((2, 3, 5, 8),), BUILTIN),
    Case("fast.sdpa causal sinks (GQA)",
         lambda q, k, v, s: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.4,
                                                                 mask="causal", sinks=s),
         FLOATS, ((1, 4, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (4,)), BUILTIN, quick=True),
    Case("fast.sdpa bool mask",
         lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.4,
                                                              mask=mx.array(_SDPA_MASK)),
         FLOATS, ((1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8)), BUILTIN),
    Case("fast.cross_entropy", lambda x: mx.fast.cross_entropy(x, mx.array([3, -1, 12, 0])),
         FLOATS, ((4, 11),), BUILTIN),
    Case("fast.rms_norm vjp",
         lambda x, w, c: mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [c])[1],
         FLOATS, ((3, 40), (40,), (3, 40)), BUILTIN, quick=True),
    Case("fast.layer_norm vjp",
         lambda x, w, b, c: mx.vjp(lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5), [x, w, b],
                                   [c])[1],
         FLOATS, ((2, 3, 33), (33,), (33,), (2, 3, 33)), BUILTIN),
]


# Convolutions (kernels/conv.py, an implicit GEMM): strides, asymmetric and negative padding,
# dilations, groups, flip, a transposed convolution (input dilation), 3-D.
CASES += [
    Case("conv1d stride=2 padding=1", lambda x, w: mx.conv1d(x, w, stride=2, padding=1), FLOATS,
         ((2, 9, 4), (5, 3, 4)), BUILTIN, quick=True),
    Case("conv2d groups=2 dilation=2",
         lambda x, w: mx.conv2d(x, w, padding=(1, 2), dilation=2, groups=2), FLOATS,
         ((2, 7, 6, 4), (6, 3, 2, 2)), BUILTIN),
    Case("conv_general padding=([2,-1],[0,1]) flip",
         lambda x, w: mx.conv_general(x, w, stride=(1, 2), padding=([2, -1], [0, 1]),
                                      input_dilation=(2, 1), flip=True),
         FLOATS, ((1, 4, 7, 2), (3, 2, 3, 2)), BUILTIN),
    Case("conv_transpose2d stride=2", lambda x, w: mx.conv_transpose2d(x, w, stride=2, padding=1),
         FLOATS, ((1, 3, 4, 2), (3, 3, 3, 2)), BUILTIN),
    Case("conv3d", lambda x, w: mx.conv3d(x, w, padding=1), ("float32",),
         ((1, 3, 4, 3, 2), (2, 2, 3, 2, 2)), BUILTIN),
]


# Quantized products (kernels/quantized.py, affine): widths that straddle words, both
# layouts, gathered pairs; the weights are quantized on the CPU stream (as loaded weights
# are), so the GPU runs the product alone.
def _packed(w, bits, group_size=32):
    return mx.quantize(w, group_size=group_size, bits=bits, stream=mx.cpu)


CASES += [
    Case("quantized_matmul 4-bit transpose",
         lambda x, w: mx.quantized_matmul(x, *_packed(w, 4), transpose=True, group_size=32,
                                          bits=4),
         FLOATS, ((3, 64), (24, 64)), BUILTIN, quick=True),
    Case("quantized_matmul 3-bit",
         lambda x, w: mx.quantized_matmul(x, *_packed(w, 3), transpose=False, group_size=32,
                                          bits=3),
         FLOATS, ((2, 16), (16, 64)), BUILTIN),
    Case("gather_mm", lambda a, b: mx.gather_mm(a, b, mx.array([3, 0, 3]), mx.array([1, 1, 0])),
         FLOATS, ((4, 5, 12), (2, 12, 7)), BUILTIN),
    Case("dequantize 5-bit",
         lambda w: mx.dequantize(*_packed(w, 5), group_size=32, bits=5), FLOATS, ((6, 64),),
         BUILTIN),
    Case("gather_qmm 8-bit",
         lambda x, w: mx.gather_qmm(x, *_packed(w, 8), lhs_indices=mx.array([1, 0, 1]),
                                    rhs_indices=mx.array([0, 1, 1]), transpose=True,
                                    group_size=32, bits=8),
         FLOATS, ((2, 1, 32), (2, 8, 32)), BUILTIN),
]


# Fourier transforms (kernels/fft.py): a power of two, mixed radix (60 = 4 * 3 * 5), a prime
# (97: Bluestein), the real transforms (rfft zero-pads 60 to 64 on the GPU: a float32 Pad),
# 2-D. Complex inputs are complex64 data; norm "ortho" keeps the outputs O(1), the scale the per-element tolerance assumes.
CASES += [
    Case("fft.fft n=64", lambda x: mx.fft.fft(x, norm="ortho"), ("complex64",), ((3, 64),),
         BUILTIN, (-1.0, 1.0), quick=True),
    Case("fft.ifft n=60 (radices 4, 3, 5)", lambda x: mx.fft.ifft(x, norm="ortho"),
         ("complex64",), ((2, 60),), BUILTIN, (-1.0, 1.0)),
    Case("fft.fft n=97 (Bluestein)", lambda x: mx.fft.fft(x, axis=0, norm="ortho"),
         ("complex64",), ((97, 3),), BUILTIN, (-1.0, 1.0)),
    Case("fft.rfft n=64 (padded from 60)", lambda x: mx.fft.rfft(x, n=64, norm="ortho"),
         ("float32",), ((3, 60),), BUILTIN, (-1.0, 1.0), quick=True),
    Case("fft.irfft n=97", lambda x: mx.fft.irfft(x, n=97, norm="ortho"), ("complex64",),
         ((2, 49),), BUILTIN, (-1.0, 1.0)),
    Case("fft.fft2 axes=(0, 1)", lambda x: mx.fft.fft2(x, axes=(0, 1), norm="ortho"),
         ("complex64",), ((12, 10, 3),), BUILTIN, (-1.0, 1.0)),
]


# Creation ops (kernels/creation.py): no inputs, so the dtype column is the output's (a
# fractional float step, a negative one in float16, linspace to integers, k offsets) — and
# the reductions that are not folds (kernels/reductions.py). The second operands of
# allclose and array_equal are made on the CPU stream, so the GPU runs the comparison alone.
def _nudged(x):
    """``x`` times ``1 + 1e-6`` in its own dtype, made on the CPU (close to ``x``)."""
    return mx.multiply(x, 1.000001, stream=mx.cpu).astype(x.dtype, stream=mx.cpu)


CASES += [
    Case("arange -7..40 step 3", lambda: mx.arange(-7, 40, 3), INTS, (), BUILTIN, quick=True),
    Case("arange -1.3..2.3 step 0.1", lambda: mx.arange(-1.3, 2.3, 0.1), ("float32",), (),
         BUILTIN, quick=True),
    Case("arange 5..-3 step -0.37", lambda: mx.arange(5, -3, -0.37, dtype=mx.float16),
         ("float16",), (), BUILTIN),
    Case("linspace -1.5..2 num=37", lambda: mx.linspace(-1.5, 2.0, 37), ("float32",), (),
         BUILTIN),
    Case("linspace 0..3 num=10", lambda: mx.linspace(0, 3, 10, dtype=mx.int32), INTS, (),
         BUILTIN),
    Case("eye 5x7 k=1", lambda: mx.eye(5, 7, k=1), ("float32",), (), BUILTIN),
    Case("tri 6x4 k=-1", lambda: mx.tri(6, 4, k=-1, dtype=mx.bool_), BOOLS, (), BUILTIN),
    Case("full (broadcast)", lambda x: mx.full((4, 33), x), NUMBERS + BOOLS, ((33,),), BUILTIN),
    Case("zeros", lambda: mx.zeros((4, 33), dtype=mx.bfloat16), ("bfloat16",), (), BUILTIN),
    Case("hanning 33", lambda: mx.hanning(33), ("float32",), (), BUILTIN),
    Case("blackman 40", lambda: mx.blackman(40), ("float32",), (), BUILTIN),
    Case("median axis=1", lambda x: mx.median(x, axis=1), FLOATS, ((6, 33),), BUILTIN,
         quick=True),
    Case("median axis=(0, 2)", lambda x: mx.median(x, axis=(0, 2)), FLOATS, ((4, 6, 9),),
         BUILTIN),
    Case("allclose (broadcast; nudged)",
         lambda a, b: (mx.allclose(a, b), mx.allclose(a, _nudged(a))), NUMBERS + BOOLS,
         ((6, 33), (33,)), BUILTIN),
    Case("array_equal (random; a copy)",
         lambda a, b: (mx.array_equal(a, b), mx.array_equal(a, mx.array(np.array(a)))),
         NUMBERS + BOOLS, ((6, 33), (6, 33)), BUILTIN),
]


# Attention's backward (kernels/fast.py, ScaledDotProductAttentionVJP): dq by query rows, dk and
# dv by key rows summed over grouped heads, the sinks' cotangents; every mask kind. The masks
# are 4-d (no reshape node); the additive one broadcasts over heads by a stride of 0. Inputs
# in [-1, 1): gradients are sums of cancelling float32 terms, whose error grows with the
# scores' range past the table's float32 tolerance (the CPU's kernel is off as much).
def _sdpa_vjp(mask=None):
    """The cotangents of attention's q, k, v and sinks; the inputs ``(q, k, v[, mask][, sinks],
    cotangent)``. ``mask``: "causal", "bool" (:data:`_SDPA_MASK`) or "input" (the additive
    mask is an input)."""
    def grads(q, k, v, *rest):
        *extra, cot = rest
        m = extra.pop(0) if mask == "input" else mx.array(_SDPA_MASK) if mask == "bool" else mask
        sinks = extra[0] if extra else None
        # A half type's sinks get their float32 cotangent cast back by a generated kernel
        # (the primitive's rule, not this row's kernels): there they are held fixed.
        moving = sinks is not None and q.dtype == mx.float32

        def attend(q, k, v, *s):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.4, mask=m,
                                                        sinks=s[0] if moving else sinks)
        return mx.vjp(attend, [q, k, v] + [sinks] * moving, [cot])[1]
    return grads


CASES += [
    Case("fast.sdpa vjp causal sinks (GQA)", _sdpa_vjp("causal"), FLOATS,
         ((1, 4, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (4,), (1, 4, 5, 8)), BUILTIN, (-1.0, 1.0),
         quick=True),
    Case("fast.sdpa vjp bool mask", _sdpa_vjp("bool"), FLOATS,
         ((1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 5, 8)), BUILTIN, (-1.0, 1.0)),
    Case("fast.sdpa vjp additive mask", _sdpa_vjp("input"), FLOATS,
         ((1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (1, 1, 5, 6), (1, 2, 5, 8)), BUILTIN,
         (-1.0, 1.0)),
]


# Quantization (kernels/quantized.py): quantize in the GPU's kernel (packed words, scales and
# biases compared exactly: the packing is the CPU's bit for bit), then the micro-scaled float
# modes' products from weights quantized on the CPU stream.
CASES += [
    Case("quantize affine 4-bit gs=64", lambda w: mx.quantize(w, 64, 4), FLOATS, ((4, 128),),
         BUILTIN, quick=True),
    Case("quantize affine 3-bit gs=32", lambda w: mx.quantize(w, 32, 3), FLOATS, ((3, 96),),
         BUILTIN),
    Case("quantize affine 8-bit gs=128", lambda w: mx.quantize(w, 128, 8), FLOATS, ((2, 256),),
         BUILTIN),
] + [Case(f"quantize {mode}", lambda w, mode=mode: mx.quantize(w, mode=mode), FLOATS,
          ((4, 64),), BUILTIN) for mode in ("mxfp4", "nvfp4", "mxfp8")] + [
    Case(f"quantized_matmul {mode}",
         lambda x, w, mode=mode: mx.quantized_matmul(
             x, *mx.quantize(w, mode=mode, stream=mx.cpu), mode=mode),
         FLOATS, ((3, 64), (24, 64)), BUILTIN) for mode in ("mxfp4", "nvfp4", "mxfp8")]


# Block-masked and segmented products, Hadamard transforms (kernels/matmuls.py): sizes not
# multiples of the 32 x 32 tile, boolean masks (skipped blocks) and floating ones (scales) on
# each side, an empty segment, n = 2^k and 12, 20, 28 times one. Inputs in [-1, 1): sums of
# 70 products stay O(1), the scale the per-element tolerance assumes.
_OUT_BLOCKS = np.array([[True, False], [False, True]])           # (40 x 33) in blocks of 32
_LHS_BLOCKS = np.array([[True, False, True], [False, True, True]])   # (40 x 70)
_RHS_BLOCKS = np.array([[True, True], [False, True], [True, False]])  # (70 x 33)
CASES += [
    Case("block_masked_mm bool mask_out",
         lambda a, b: mx.block_masked_mm(a, b, 32, mask_out=mx.array(_OUT_BLOCKS)), FLOATS,
         ((40, 70), (70, 33)), BUILTIN, (-1.0, 1.0), quick=True),
    Case("block_masked_mm bool mask_lhs, mask_rhs",
         lambda a, b: mx.block_masked_mm(a, b, 32, mask_lhs=mx.array(_LHS_BLOCKS),
                                         mask_rhs=mx.array(_RHS_BLOCKS)), FLOATS,
         ((40, 70), (70, 33)), BUILTIN, (-1.0, 1.0)),
    Case("block_masked_mm float masks (batched)",
         lambda a, b, mo, ml, mr: mx.block_masked_mm(a, b, 32, mo, ml, mr), FLOATS,
         ((2, 40, 70), (2, 70, 33), (2, 2, 2), (2, 2, 3), (2, 3, 2)), BUILTIN, (-1.0, 1.0)),
    Case("block_masked_mm block_size=64 float mask_out",
         lambda a, b, mo: mx.block_masked_mm(a, b, 64, mask_out=mo), FLOATS,
         ((70, 40), (40, 65), (2, 2)), BUILTIN, (-1.0, 1.0)),
    Case("segmented_mm (an empty segment)",
         lambda a, b: mx.segmented_mm(a, b, mx.array([[0, 10], [10, 10], [4, 70]])), FLOATS,
         ((20, 70), (70, 33)), BUILTIN, (-1.0, 1.0), quick=True),
    *(Case(f"hadamard_transform n={label}", lambda x: mx.hadamard_transform(x), FLOATS,
           ((3, n),), BUILTIN, quick=n == 16)
      for n, label in ((16, "16"), (48, "12*4"), (40, "20*2"), (28, "28"))),
]


# -- enabling the backend -----------------------------------------------------------------------
def enable(emulate: bool) -> str | None:
    """Make the Metal backend usable in this process: with ``emulate``, through lazyx's
    C++ shim; else on this machine's GPU (``LAZYX_METAL=1`` for this process). Returns None,
    or why the backend cannot run here (in words)."""
    if emulate:
        try:
            metal.emulate_on_cpu(True)
        except BackendError as exc:
            return str(exc)
        return None
    # The backend is on by default on a Mac; LAZYX_METAL=0 in the environment turns it off,
    # and this process is the user asking for it.
    os.environ["LAZYX_METAL"] = "1"
    backend = registry.backends().get("metal")
    if backend is not None and hasattr(backend, "forget_availability"):
        backend.forget_availability()
    if not metal.is_available():
        return (f"the Metal GPU is unavailable: {metal.unavailable_reason()} Run with "
                f"--emulate to check the kernels' MSL through lazyx's C++ shim on the CPU.")
    return None


# -- which path ran ---------------------------------------------------------------------------------
def _counters() -> dict | None:
    """The backend's counters this test reads, or None where one is missing (the path is
    then reported as unknown)."""
    try:
        return {GENERATED: compiled.stats["contiguous"] + compiled.stats["strided"],
                BUILTIN: metal.stats["builtin"], FALLBACK: metal.stats["cpu_fallback"]}
    except (AttributeError, KeyError, TypeError):
        return None


def _path(before, after) -> str:
    if before is None or after is None:
        return UNKNOWN
    ran = [p for p in (GENERATED, BUILTIN, FALLBACK) if after[p] > before[p]]
    return " + ".join(ran) if ran else UNKNOWN


# -- one row ---------------------------------------------------------------------------------------
@dataclass
class Row:
    kernel: str
    dtype: str
    shape: str
    path: str = ""
    error: str = ""
    result: str = "pass"

    @property
    def failed(self) -> bool:
        return self.result.startswith("FAIL")


def _inputs(case: Case, dtype, gen) -> list:
    data = [random_array(s, dtype, gen, *case.domain) for s in case.shapes]
    if case.nonzero and dtype.kind != "b":
        data[-1] = np.where(data[-1] == 0, 1, data[-1]).astype(dtype.np)
    return [mx.array(d) for d in data]


def _evaluate(fn, inputs, stream) -> list:
    with mx.stream(stream):
        out = fn(*inputs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        mx.eval(out)
    return out


def _max_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest absolute difference, NaN against NaN and equal infinities counting as 0."""
    if got.size == 0:
        return 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    diff = np.where(same, 0.0, np.abs(g - w))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def _compare(got, want) -> tuple[float, str | None]:
    """(max error over the outputs, why they differ or None)."""
    if len(got) != len(want):
        return float("inf"), f"{len(got)} outputs, the CPU gives {len(want)}"
    worst = 0.0
    for j, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return float("inf"), (f"output {j} is {g.dtype}{list(g.shape)}, the CPU's "
                                  f"{w.dtype}{list(w.shape)}")
        gn, wn = np.array(g), np.array(w)
        if gn.dtype.kind == "c":  # compare real and imaginary parts (float64 would drop the latter)
            gn, wn = (np.stack([a.real, a.imag], axis=-1) for a in (gn, wn))
        err = _max_error(gn, wn)
        worst = max(worst, err)
        rtol, atol = TOLERANCES.get(g.dtype.name, (0.0, 0.0))
        close = np.isclose(gn.astype(np.float64), wn.astype(np.float64), rtol=rtol, atol=atol,
                           equal_nan=True)
        if not close.all():
            at = tuple(int(i) for i in np.argwhere(~close)[0])
            return worst, (f"output {j} differs at {at}: {gn[at]!r} on the GPU, {wn[at]!r} on "
                           f"the CPU (rtol {rtol}, atol {atol})")
    return worst, None


def _brief(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:150]}"


def run_case(case: Case, dtype_name: str, seed: int = 0) -> Row:
    """Run ``case`` for dtype ``dtype_name`` on the CPU and on the GPU; its table row."""
    dtype = getattr(mx, "bool_" if dtype_name == "bool" else dtype_name)
    row = Row(case.kernel, dtype_name, ", ".join("x".join(map(str, s)) or "()" for s in case.shapes))
    inputs = _inputs(case, dtype, np.random.default_rng(seed))
    mx.eval(inputs)
    try:
        want = _evaluate(case.reference or case.fn, inputs, mx.cpu)
    except LazyxError as exc:
        row.result = f"skipped (the CPU backend refuses it: {_brief(exc)})"
        return row
    gpu_fn = mx.compile(case.fn) if case.compiled else case.fn
    before = _counters()
    try:
        got = _evaluate(gpu_fn, inputs, mx.gpu)
    except KernelNotFoundError as exc:
        if case.path == FALLBACK and read_variable("LAZYX_METAL_STRICT") == "1":
            row.result = "skipped (LAZYX_METAL_STRICT=1 refuses CPU fallbacks)"
        else:
            row.result = f"FAIL ({_brief(exc)})"
        return row
    except Exception as exc:  # noqa: BLE001 - a kernel that raises is a failed row, not the end
        row.result = f"FAIL ({_brief(exc)})"
        return row
    row.path = _path(before, _counters())
    err, why = _compare(got, want)
    row.error = f"{err:.3g}"
    if why is not None:
        row.result = f"FAIL ({why})"
    elif case.path != FALLBACK and row.path != UNKNOWN and row.path != case.path:
        row.result = f"FAIL (ran {row.path}, expected {case.path})"
    return row


# -- the table ---------------------------------------------------------------------------------------
_COLUMNS = (("kernel", "kernel"), ("dtype", "dtype"), ("shape", "shape"), ("path", "path"),
            ("max error", "error"), ("result", "result"))


def _print_table(rows: list[Row], out) -> None:
    widths = [max(len(title), *(len(getattr(r, attr)) for r in rows)) for title, attr in _COLUMNS[:-1]]
    line = "  ".join(f"{title:{w}}" for (title, _), w in zip(_COLUMNS, widths)) + "  result"
    print(line, file=out)
    print("-" * len(line), file=out)
    for r in rows:
        cells = [getattr(r, attr) for _, attr in _COLUMNS[:-1]]
        print("  ".join(f"{c:{w}}" for c, w in zip(cells, widths)) + "  " + r.result, file=out)


def _where(emulate: bool) -> str:
    if emulate:
        return ("the CPU, through lazyx's MSL shim (--emulate): this checks the kernels' MSL, "
                "not the GPU")
    return f"the Metal GPU of this {platform.machine()} Mac (macOS {platform.mac_ver()[0]})"


def main(argv=None, cases: list[Case] | None = None) -> int:
    """Run the self-test; returns the exit status (0 pass, 1 a failure, 2 no Metal).

    Args:
        argv: the command line (default ``sys.argv[1:]``).
        cases: the cases to run instead of :data:`CASES` (the hook tests use).
    """
    ap = argparse.ArgumentParser(prog="python -m lazyx.backends.metal.selftest",
                                 description="Run every Metal kernel kind against the CPU backend.")
    ap.add_argument("--emulate", action="store_true",
                    help="run the Metal kernels on the CPU through lazyx's C++ shim (any machine "
                         "with a C++ compiler): checks the MSL, not the GPU")
    ap.add_argument("--quick", action="store_true", help="a reduced case list (a few of each kind)")
    ap.add_argument("--only", default=None, metavar="TEXT",
                    help="only the cases whose kernel name contains TEXT")
    ap.add_argument("--seed", type=int, default=0, help="the inputs' random seed")
    args = ap.parse_args(argv)

    previous = metal.runtime.emulating()
    reason = enable(args.emulate)
    if reason is not None:
        print(f"lazyx Metal self-test: not run: {reason}", file=sys.stderr)
        return 2
    chosen = CASES if cases is None else cases
    chosen = [c for c in chosen if (not args.quick or c.quick or cases is not None)
              and (args.only is None or args.only in c.kernel)]
    print(f"lazyx Metal self-test: {len(chosen)} cases; Metal kernels run on {_where(args.emulate)}; "
          f"each compared with the CPU backend on the same inputs.")
    rows = []
    try:
        with mx.use_backend("gpu", "metal"):
            for case in chosen:
                for dtype_name in case.dtypes:
                    rows.append(run_case(case, dtype_name, args.seed))
    finally:
        if args.emulate:
            metal.emulate_on_cpu(previous)
    _print_table(rows, sys.stdout)
    failed = sum(r.failed for r in rows)
    skipped = sum(r.result.startswith("skipped") for r in rows)
    by_path = {p: sum(r.path == p for r in rows) for p in (GENERATED, BUILTIN, FALLBACK, UNKNOWN)}
    print(f"\n{len(rows) - failed - skipped} passed, {failed} failed, {skipped} skipped; paths: "
          + ", ".join(f"{p} {n}" for p, n in by_path.items() if n))
    if args.emulate:
        print("Emulated: no Metal API call ran; on a Mac run without --emulate to check the GPU.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
