"""The Metal backend's built-in MSL kernels (issue 20, item 2), one module per kind.

Each module holds one MSL library — kernel templates instantiated per operator and
dtype from Python tables, never text per dtype — and a launcher per primitive:
``launcher(primitive, inputs, run) -> output`` plans the grid and threadgroup
sizes, allocates the output and binds the buffers (:mod:`.common`), and hands each
:class:`~.common.Dispatch` to ``run``: the backend's
:func:`lazyx.backends.metal.runtime.dispatch` (the GPU on a Mac, the shim under
``emulate_on_cpu``), or :func:`~.common.run_on_cpu` (lazyx's MSL shim) in the
kernel tests. A dtype a kernel has no version for is an
:class:`~.common.UnsupportedDtype` naming the ones it has, raised before anything
runs; the backend then runs the CPU's kernel instead, counted as a CPU fallback.

:data:`KERNELS` maps primitive classes to launchers; the Metal backend's kernel table
is built from it (``lazyx.backends.metal``).

| primitive | module | kernels |
| --- | --- | --- |
| ``Reduce`` | reductions | rows (any axes, strided), columns (leading axes, contiguous) |
| ``ArgReduce`` | reductions | rows |
| ``Median``, ``NumberOfElements``, ``AllClose``, ``ArrayEqual`` | reductions | the sort's rows then a thread per row picking the middle value(s); one thread writing the count; an element test folded per threadgroup chunk, then across chunks |
| ``Fill``, ``Full``, ``FullLike``, ``Arange``, ``Linspace``, ``Eye``, ``Tri``, ``Window`` | creation, shapes | one thread per element: the strided copy (fills), float64 emulated in integers (float ranges: the CPU's values bit for bit), a 2-D band test, the windows as ``sin(pi a)^2`` |
| ``Matmul``, ``AddMM``, ``GatherMM`` | products | 32 x 32 output tiles in threadgroup memory, K steps of 16, batched and transposed by strides (GatherMM: each batch position's matrices picked by its indices) |
| ``BlockMaskedMM``, ``SegmentedMM`` | matmuls | the products' tiles: a false boolean block skips its K steps or the whole tile, floating blocks scale the staged operands or the accumulator; a segment's K range per batch position (empty: zeros) |
| ``Hadamard`` | matmuls | a threadgroup of rows in threadgroup memory (float): register butterflies of up to 4 stages, ``H_m`` by columns, the scale; two passes past 8192 points; the native CPU kernel's numbers bit for bit |
| ``Softmax``, ``LogSumExp`` | softmax | rows (any axes, strided) |
| ``Scan`` | scans | rows (any axis, strided; SIMD prefix scans, chunked along long rows) |
| ``RandomBits`` | random | Threefry-2x32, the CPU's counters (any key batch, any width) |
| ``Sort``, ``ArgSort``, ``(Arg)Partition``, ``TopK`` | sorting | bitonic blocks (2048), merge passes (TopK: the sort's last k) |
| ``SearchSorted`` | sorting | a binary search per value, the sort's order (NaNs last) |
| ``Gather``, ``GatherAxis`` | indexing | one thread per element, bounds-checked indices |
| ``Scatter``, ``ScatterAxis`` | indexing | owner election (atomics), ordered folds of repeats |
| ``RMSNorm``, ``LayerNorm``, ``RoPE``, ``ScaledDotProductAttention``, ``CrossEntropy`` | fast | norm rows, a thread per rotated pair, online-softmax attention (a simdgroup per query row), cross-entropy rows |
| ``RMSNormVJP``, ``LayerNormVJP`` | fast | dx by rows (the rows' statistics kept), the weight's and bias's cotangents by columns |
| ``ScaledDotProductAttentionVJP`` | fast | FlashAttention-2's backward, scores recomputed: dq by query rows (a simdgroup per row, its softmax statistics kept), dk and dv by key rows (a simdgroup per key, the grouped query heads summed), the sinks' cotangents by (batch, head) |
| ``Convolution`` | conv | implicit GEMM: 32 x 32 tiles of output pixels x output channels per group, K (taps x channels) in steps of 16, the input read through the padding/dilation index arithmetic |
| ``QuantizedMatmul``, ``GatherQMM`` (affine, mxfp4, nvfp4, mxfp8) | quantized | a simdgroup per output value, lanes along K, values decoded from the packed words (any width; a decode per mode) |
| ``Dequantize``, ``Quantize`` (every mode) | quantized | a thread per value; a simdgroup per group (min/max by SIMD reductions, a lane per packed word), MLX's packing and rounding bit for bit |
| ``CustomKernel`` (``fast.metal_kernel``) | custom | the user's MSL, compiled once per source, bound in MLX's signature order, ``grid`` threads in ``threadgroup`` blocks |
| ``FFT`` | fft | a threadgroup per row (up to 4096 points): mixed-radix Stockham (2, 3, 4, 5, 7, 8, 11, 13), Bluestein for other primes, four-step passes for longer rows; one pass per axis |
| ``SliceUpdate``, ``Concatenate``, ``Pad``, ``Contiguous``, ``DynamicSliceUpdate``, ``Diag``, ``View``, ``Reshape``, ``(Un)Flatten`` | shapes, indexing | one strided copy kernel (1/2/4/8-byte elements) |
"""

from lazyx.plugins import conv as _conv
from lazyx.plugins import custom_kernels as _custom
from lazyx.plugins import elementwise as _elementwise
from lazyx.plugins import fft as _fft
from lazyx.plugins import matmuls as _matmuls
from lazyx.plugins import fast as _fast
from lazyx.plugins import products as _products
from lazyx.plugins import quantized as _quantized
from lazyx.plugins import reductions as _reductions
from lazyx.plugins import random as _random
from lazyx.plugins import sorting as _sorting

from . import products, reductions, softmax
from . import random, scans, sorting
from . import fast, indexing, shapes
from . import conv, quantized
from . import creation, custom, fft, matmuls
from .common import Dispatch, Library, UnsupportedDtype, run_on_cpu

__all__ = ["KERNELS", "LIBRARIES", "Dispatch", "Library", "UnsupportedDtype", "run_on_cpu"]

#: Primitive class -> launcher ``(primitive, inputs, run) -> output``.
KERNELS = {
    _reductions.Reduce: reductions.reduce,
    _reductions.ArgReduce: reductions.arg_reduce,
    _reductions.Median: reductions.median,   # a row sort, then the middle value(s)
    _reductions.NumberOfElements: reductions.number_of_elements,
    _elementwise.AllClose: reductions.allclose,   # an element test folded to one bool
    _elementwise.ArrayEqual: reductions.array_equal,
    _reductions.LogSumExp: softmax.logsumexp,
    _products.Softmax: softmax.softmax,
    _products.Matmul: products.matmul,
    _products.AddMM: products.addmm,
    _matmuls.GatherMM: products.gather_mm,
    _reductions.Scan: scans.scan,
    _random.RandomBits: random.random_bits,
    _sorting.Sort: sorting.sort,
    _sorting.ArgSort: sorting.argsort,
    _sorting.Partition: sorting.partition,
    _sorting.ArgPartition: sorting.argpartition,
    _sorting.TopK: sorting.topk,
    _sorting.SearchSorted: sorting.searchsorted,
    **indexing.KERNELS,   # Gather(Axis), Scatter(Axis), SliceUpdate
    **shapes.KERNELS,     # Concatenate, Pad, Contiguous, ...: the shapes pack's copies
    **creation.KERNELS,   # Fill, Full(Like), Arange, Linspace, Eye, Tri, Window
    _fast.RMSNorm: fast.rms_norm,   # the fast pack's forwards, and the norms' backwards
    _fast.LayerNorm: fast.layer_norm,
    _fast.RMSNormVJP: fast.rms_norm_vjp,
    _fast.LayerNormVJP: fast.layer_norm_vjp,
    _fast.RoPE: fast.rope,
    _fast.ScaledDotProductAttention: fast.attention,
    _fast.ScaledDotProductAttentionVJP: fast.attention_vjp,
    _fast.CrossEntropy: fast.cross_entropy,
    _conv.Convolution: conv.convolution,   # its gradients are convolutions too
    _quantized.QuantizedMatmul: quantized.quantized_matmul,   # every mode (affine, mx/nv fp)
    _quantized.GatherQMM: quantized.gather_qmm,
    _quantized.Dequantize: quantized.dequantize,
    _quantized.Quantize: quantized.quantize,
    _custom.CustomKernel: custom.custom_kernel,   # fast.metal_kernel's nodes
    _fft.FFT: fft.fft,   # any length: Stockham in threadgroup memory, Bluestein, four-step
    _matmuls.BlockMaskedMM: matmuls.block_masked_mm,   # the products' tiles, masked blocks skipped
    _matmuls.SegmentedMM: matmuls.segmented_mm,
    _matmuls.Hadamard: matmuls.hadamard,   # butterflies in threadgroup memory
}

#: Every library of built-in kernels (the Mac self-test compiles each).
LIBRARIES = (reductions.LIBRARY, softmax.LIBRARY, scans.LIBRARY, random.LIBRARY, sorting.LIBRARY,
             indexing.LIBRARY, shapes.LIBRARY, products.LIBRARY, fast.LIBRARY, conv.LIBRARY,
             quantized.LIBRARY, fft.LIBRARY, creation.LIBRARY, matmuls.LIBRARY)
