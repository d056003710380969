"""Op pack ``custom_kernels``: MLX's custom-kernel APIs, ``fast.cuda_kernel``,
``fast.precompiled_cuda_kernel`` and ``fast.metal_kernel``.

The flow is MLX's:

1. ``fast.cuda_kernel(name, input_names, output_names, source, header, ...)`` (or
   ``fast.metal_kernel``) checks its arguments, notes which ``<input>_shape``,
   ``<input>_strides`` and ``<input>_ndim`` helpers the source uses, and returns a
   :class:`KernelFunction`.
2. Calling it with ``inputs``, ``template``, ``grid``, ``threadgroup``,
   ``output_shapes``, ``output_dtypes``, ``init_value`` ... generates the whole kernel
   source around the body (:func:`cuda_source`, :func:`metal_source`: the signature
   with one parameter per input, helper and output, the template arguments as
   constants), prints it with ``verbose=True``, and adds one :class:`CustomKernel`
   node with one output per output name (``lazy_multi``).
3. On evaluation, the node's ``eval_gpu`` launches it on the backend it was written
   for: CUDA C++ through :class:`lazyx.backends.cuda.CudaKernel` (NVRTC, via CuPy),
   PTX/cubin through CuPy's ``RawModule``. Any other backend, and the CPU, is a
   :class:`KernelNotFoundError` naming the kernel and the backend: there is no silent
   fallback. On the Metal backend a ``fast.metal_kernel`` node is one of its built-in
   launches (``lazyx.backends.metal.kernels.custom``): the source compiled once, the
   inputs, helpers and outputs bound in the signature's order, ``grid`` threads
   dispatched in ``threadgroup`` blocks.

A custom kernel has no gradient or batching rule (MLX has none either): wrap it in
``lazyx.core.custom_function`` to give it a vjp. It is not in the registry-wide rule
test, which evaluates examples on the CPU.

Differences from MLX, by design: the CUDA helpers ``<input>_shape`` and
``<input>_strides`` are device pointers (``const int32_t*``, ``const int64_t*``)
rather than MLX's by-value ``Shape``/``Strides`` structs (CuPy passes arrays and
scalars, not structs); indexing them reads the same.
"""

from __future__ import annotations

import re

import numpy as np

from lazyx import dtypes as dt
from lazyx.arguments import as_array
from lazyx.array import array, lazy_multi
from lazyx.device import DeviceType, to_stream
from lazyx.errors import ArgumentError, DeviceError, DtypeError, KernelNotFoundError, TransformError
from lazyx.hookspecs import pack_hooks
from lazyx.primitive import Primitive

#: lazyx dtype name -> CUDA C++ type (MLX's ``dtype_to_cuda_type``).
CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double", "complex64": "cuda::std::complex<float>",
}

#: lazyx dtype name -> Metal Shading Language type (no float64 on Metal GPUs).
METAL_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "float16_t", "bfloat16": "bfloat16_t",
    "float32": "float", "complex64": "complex64_t",
}

#: The Metal attributes a kernel body may use, with their types (MLX's list): each one
#: the source names becomes a parameter of the generated function.
METAL_ATTRIBUTES = {
    "dispatch_quadgroups_per_threadgroup": "uint",
    "dispatch_simdgroups_per_threadgroup": "uint",
    "dispatch_threads_per_threadgroup": "uint3",
    "grid_origin": "uint3", "grid_size": "uint3",
    "quadgroup_index_in_threadgroup": "uint", "quadgroups_per_threadgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint", "simdgroups_per_threadgroup": "uint",
    "thread_execution_width": "uint", "thread_index_in_quadgroup": "uint",
    "thread_index_in_simdgroup": "uint", "thread_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3", "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3", "threadgroups_per_grid": "uint3",
    "threads_per_grid": "uint3", "threads_per_simdgroup": "uint",
    "threads_per_threadgroup": "uint3",
}

CUDA_HEADER = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/complex>
#include <cuda/std/limits>
#include <cooperative_groups.h>

#define inf cuda::std::numeric_limits<float>::infinity()

"""

METAL_HEADER = """\
#include <metal_stdlib>
using namespace metal;

// What MLX's kernel headers give a custom kernel: its dtype names and elem_to_loc.
typedef half float16_t;
typedef bfloat bfloat16_t;
template <typename IdxT = int64_t>
inline IdxT elem_to_loc(IdxT elem, constant const int* shape, constant const int64_t* strides,
                        int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += IdxT(elem % IdxT(shape[i])) * IdxT(strides[i]);
    elem /= IdxT(shape[i]);
  }
  return loc;
}

"""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# -- the primitive ---------------------------------------------------------------------
class CustomKernel(Primitive):
    """A user's GPU kernel: ``source`` (generated CUDA C++ or MSL, or PTX/cubin bytes
    when ``precompiled``) launched on ``grid`` threads in blocks of ``threadgroup``.

    ``shape_infos`` holds, per input, whether its ``_shape``, ``_strides`` and
    ``_ndim`` helpers are passed; ``scalars`` are extra arguments after the outputs
    (precompiled kernels only).
    """

    __slots__ = ("backend", "kernel_name", "source", "grid", "threadgroup", "shapes",
                 "dtypes", "shape_infos", "init_value", "ensure_row_contiguous", "scalars",
                 "shared_memory", "precompiled")
    backend: str
    kernel_name: str
    source: str | bytes
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[dt.Dtype, ...]
    shape_infos: tuple[tuple[bool, bool, bool], ...]
    init_value: float | None
    ensure_row_contiguous: bool
    scalars: tuple[bool | int | float, ...]
    shared_memory: int
    precompiled: bool

    def output_shapes(self, inputs):
        return [tuple(s) for s in self.shapes]

    def output_dtypes(self, inputs):
        return list(self.dtypes)

    def _no_rule(self, rule: str):
        return TransformError(
            f"[{self.kernel_name}] A custom {self.backend} kernel has no {rule} rule (as in "
            f"MLX): wrap the function that calls it in lazyx.core.custom_function and give "
            f"it a vjp written with lazyx ops (or another custom kernel).")

    def vjp(self, primals, cotangents, argnums, outputs):
        raise self._no_rule("vjp")

    def jvp(self, primals, tangents, argnums):
        raise self._no_rule("jvp")

    def vmap(self, inputs, axes):
        raise self._no_rule("vmap")

    def eval_cpu(self, inputs):
        raise KernelNotFoundError(
            f"The custom {self.backend} kernel {self.kernel_name!r} runs only on the "
            f"{self.backend} backend (a GPU); it was asked to run on the cpu. lazyx does not "
            f"fall back: build the node on a GPU stream (stream=mx.gpu).")

    def eval_gpu(self, inputs):
        from lazyx.backend import backend_for  # dispatch state: read at launch only
        active = backend_for(DeviceType.gpu).name
        if active != self.backend or self.backend != "cuda":
            # (The Metal backend launches its own nodes: lazyx.backends.metal.kernels.custom.)
            why = f"the active gpu backend is {active!r}"
            raise KernelNotFoundError(
                f"The custom {self.backend} kernel {self.kernel_name!r} cannot run: {why}. "
                f"It runs only on the {self.backend} backend; lazyx does not fall back.")
        return launch_cuda(self, inputs)


# -- CUDA launch ---------------------------------------------------------------------------
_CUDA_MODULES: dict = {}


def _cuda_function(p: CustomKernel):
    """The launchable function of ``p``'s source, compiled (or loaded) once per source."""
    key = (p.kernel_name, p.source)
    fn = _CUDA_MODULES.get(key)
    if fn is None:
        from lazyx.backends.cuda.runtime import CudaKernel, cupy_module  # CuPy: GPU only
        if p.precompiled:
            import os
            import tempfile
            cp = cupy_module()
            suffix = ".ptx" if p.source.lstrip()[:1] in (b".", b"/") else ".cubin"
            with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as f:
                f.write(p.source)
            try:
                fn = cp.RawModule(path=f.name).get_function(p.kernel_name)
            finally:
                os.unlink(f.name)
        else:
            full = f"lazyx::cu::{p.kernel_name}"
            fn = CudaKernel(p.source, f"fast.cuda_kernel {p.kernel_name!r}",
                            name_expressions=(full,)).function(full)
        _CUDA_MODULES[key] = fn
    return fn


def launch_cuda(p: CustomKernel, inputs):
    """Run ``p`` on CuPy ``inputs``: outputs allocated (filled with ``init_value``), the
    arguments in the generated signature's order, ``grid`` threads in blocks."""
    from lazyx.backends.cuda.runtime import cupy_module  # CuPy: GPU only
    cp = cupy_module()
    outs = []
    for shape, d in zip(p.shapes, p.dtypes):
        o = cp.empty(shape, d.np if d.name != "bfloat16" else np.uint16)
        if p.init_value is not None:
            o[...] = p.init_value
        outs.append(o)
    args = []
    for x, (shape, strides, ndim) in zip(inputs, p.shape_infos):
        if p.ensure_row_contiguous:
            x = cp.ascontiguousarray(x)
        args.append(x)
        if shape:
            args.append(cp.asarray(np.array(x.shape or (1,), np.int32)))
        if strides:
            st = [s // x.itemsize for s in x.strides] or [1]
            args.append(cp.asarray(np.array(st, np.int64)))
        if ndim:
            args.append(np.int32(x.ndim))
    args += outs
    kinds = {bool: np.bool_, int: np.int32, float: np.float32}
    args += [kinds[type(s)](s) for s in p.scalars]
    block = tuple(p.threadgroup)
    grid = tuple(-(-g // t) for g, t in zip(p.grid, block))
    if all(grid):
        _cuda_function(p)(grid, block, tuple(args), shared_mem=p.shared_memory)
    return outs


# -- source generation -----------------------------------------------------------------------
def _template_suffix(template) -> str:
    """MLX's ``template_arguments_hash``: what the template arguments add to the name."""
    out = ""
    for _, v in template:
        out += ("_t" if v else "_f") if isinstance(v, bool) else \
            f"_{v}" if isinstance(v, int) else f"_{v.name}"
    return out


def cuda_source(kernel_name, header, source, input_names, inputs, output_names, output_dtypes,
                template, shape_infos) -> str:
    """The CUDA C++ of a custom kernel: MLX's ``build_kernel`` (one ``__global__``
    function in ``namespace lazyx::cu``, template arguments as ``constexpr``/``using``)."""
    lines = [CUDA_HEADER + header, "namespace lazyx::cu {\n", "namespace cg = cooperative_groups;\n",
             f"__global__ void {kernel_name}("]
    params = []
    for name, x, (shape, strides, ndim) in zip(input_names, inputs, shape_infos):
        params.append(f"    const {_ctype(CUDA_TYPES, x.dtype, 'cuda_kernel')}* {name}")
        if shape:
            params.append(f"    const int32_t* {name}_shape")
        if strides:
            params.append(f"    const int64_t* {name}_strides")
        if ndim:
            params.append(f"    const int {name}_ndim")
    for name, d in zip(output_names, output_dtypes):
        params.append(f"    {_ctype(CUDA_TYPES, d, 'cuda_kernel')}* {name}")
    lines.append(",\n".join(params) + ") {")
    for name, v in template:
        if isinstance(v, bool):
            lines.append(f"  constexpr bool {name} = {'true' if v else 'false'};")
        elif isinstance(v, int):
            lines.append(f"  constexpr int {name} = {v};")
        else:
            lines.append(f"  using {name} = {_ctype(CUDA_TYPES, v, 'cuda_kernel')};")
    lines += [source, "}\n", "} // namespace lazyx::cu\n"]
    return "\n".join(lines)


def metal_source(kernel_name, header, source, input_names, inputs, output_names, output_dtypes,
                 template, shape_infos, atomic_outputs: bool) -> str:
    """The MSL of a custom kernel, as MLX writes it: a ``[[kernel]]`` function template
    with one ``[[buffer(n)]]`` per input, used helper and output, the attributes the
    body names, and the instantiation ``host_name``'d ``kernel_name``."""
    params, index = [], 0
    for name, x, (shape, strides, ndim) in zip(input_names, inputs, shape_infos):
        t = _ctype(METAL_TYPES, x.dtype, "metal_kernel")
        if x.ndim == 0:
            params.append(f"  const constant {t}& {name} [[buffer({index})]]")
        else:
            params.append(f"  const device {t}* {name} [[buffer({index})]]")
        index += 1
        if x.ndim:
            for used, text in ((shape, f"const constant int* {name}_shape"),
                               (strides, f"const constant int64_t* {name}_strides"),
                               (ndim, f"const constant int& {name}_ndim")):
                if used:
                    params.append(f"  {text} [[buffer({index})]]")
                    index += 1
    for name, d in zip(output_names, output_dtypes):
        t = _ctype(METAL_TYPES, d, "metal_kernel")
        t = f"atomic<{t}>" if atomic_outputs else t
        params.append(f"  device {t}* {name} [[buffer({index})]]")
        index += 1
    for attr, t in METAL_ATTRIBUTES.items():
        if re.search(rf"\b{attr}\b", source):
            params.append(f"  {t} {attr} [[{attr}]]")
    base = kernel_name[:len(kernel_name) - len(_template_suffix(template))]
    text = [METAL_HEADER + header]
    args = []
    if template:
        decl = []
        for name, v in template:
            decl.append(f"bool {name}" if isinstance(v, bool) else
                        f"int {name}" if isinstance(v, int) else f"typename {name}")
            args.append(("true" if v else "false") if isinstance(v, bool) else
                        str(v) if isinstance(v, int) else _ctype(METAL_TYPES, v, "metal_kernel"))
        text.append(f"template <{', '.join(decl)}>")
    text.append(f"[[kernel]] void {base}(\n" + ",\n".join(params) + ") {")
    text += [source, "}\n"]
    if template:
        inst = f"{base}<{', '.join(args)}>"
        text.append(f'template [[host_name("{kernel_name}")]] [[kernel]] decltype({inst}) {inst};\n')
    return "\n".join(text)


def _ctype(table: dict, d, op: str) -> str:
    t = table.get(d.name)
    if t is None:
        raise DtypeError(f"[{op}] dtype {d.name} has no {'CUDA' if table is CUDA_TYPES else 'Metal'} "
                         f"type; use one of {', '.join(table)}.")
    return t


# -- argument checks ------------------------------------------------------------------------
def _names(value, what: str, op: str) -> tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ArgumentError(f"[{op}] {what} must be a list of names, got {value!r}.")
    for n in value:
        if not isinstance(n, str) or not _IDENT.match(n):
            raise ArgumentError(f"[{op}] {what} must hold C identifiers, got {n!r}.")
    return tuple(value)


def _triple(value, what: str, op: str) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in value):
        raise ArgumentError(f"[{op}] {what} must be a tuple of 3 positive ints, got {value!r}.")
    return tuple(int(v) for v in value)


def _outputs(output_shapes, output_dtypes, count: int | None, op: str):
    shapes, dtypes = list(output_shapes or ()), list(output_dtypes or ())
    if count is not None:
        for what, got in (("output_shapes", shapes), ("output_dtypes", dtypes)):
            if len(got) != count:
                raise ArgumentError(f"[{op}] Expected `{what}` to have size {count} but got "
                                    f"size {len(got)}.")
    elif len(shapes) != len(dtypes):
        raise ArgumentError(f"[{op}] output_shapes ({len(shapes)}) and output_dtypes "
                            f"({len(dtypes)}) must have the same size.")
    out_shapes = []
    for s in shapes:
        if not isinstance(s, (list, tuple)) or not all(
                isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in s):
            raise ArgumentError(f"[{op}] Each output shape must be a sequence of non-negative "
                                f"ints, got {s!r}.")
        out_shapes.append(tuple(int(n) for n in s))
    out_dtypes = []
    for d in dtypes:
        try:
            out_dtypes.append(dt.to_dtype(d))
        except Exception:
            raise DtypeError(f"[{op}] output_dtypes holds {d!r}, which is not a dtype.") from None
    return tuple(out_shapes), tuple(out_dtypes)


def _template(template, op: str) -> tuple:
    out = []
    for item in template or ():
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str) \
                or not _IDENT.match(item[0]):
            raise ArgumentError(f"[{op}] template must be a list of (name, value) pairs, got "
                                f"{item!r}.")
        name, v = item
        if isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, dt.Dtype):
            pass
        else:
            raise ArgumentError(f"[{op}] Invalid template argument {name!r} = {v!r}: it must "
                                f"be a dtype, an int or a bool.")
        out.append((name, v))
    return tuple(out)


def _gpu_stream(stream, op: str):
    s = to_stream(stream)
    if s.device.type is not DeviceType.gpu:
        raise DeviceError(f"[{op}] Only supports the GPU (got a stream on {s.device}); pass "
                          f"stream=mx.gpu or make the GPU the default device.")
    return s


def _inputs(inputs, count: int | None, op: str) -> list:
    xs = [x if type(x) is array else as_array(x) for x in (inputs or ())]
    if count is not None and len(xs) != count:
        raise ArgumentError(f"[{op}] Expected `inputs` to have size {count} but got size "
                            f"{len(xs)}.")
    return xs


class KernelFunction:
    """The callable ``fast.cuda_kernel`` / ``fast.metal_kernel`` return (MLX's
    ``MetalKernelFunction``): each call builds one :class:`CustomKernel` node."""

    def __init__(self, backend: str, name: str, input_names, output_names, source: str,
                 header: str, ensure_row_contiguous: bool, shared_memory: int = 0,
                 atomic_outputs: bool = False):
        op = f"{backend}_kernel"
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ArgumentError(f"[{op}] name must be a C identifier, got {name!r}.")
        if not isinstance(source, str) or not isinstance(header, str):
            raise ArgumentError(f"[{op}] source and header must be strings.")
        self.backend, self.op, self.name = backend, op, name
        self.input_names = _names(input_names, "input_names", op)
        self.output_names = _names(output_names, "output_names", op)
        if not self.output_names:
            raise ArgumentError(f"[{op}] Must specify at least one output.")
        taken = self.input_names + self.output_names
        if len(set(taken)) != len(taken):
            raise ArgumentError(f"[{op}] input_names and output_names must be distinct, got "
                                f"{list(taken)}.")
        self.source, self.header = source, header
        self.ensure_row_contiguous = bool(ensure_row_contiguous)
        if isinstance(shared_memory, bool) or not isinstance(shared_memory, int) or shared_memory < 0:
            raise ArgumentError(f"[{op}] shared_memory must be a non-negative int, got "
                                f"{shared_memory!r}.")
        self.shared_memory = shared_memory
        self.atomic_outputs = bool(atomic_outputs)
        # Which helpers the body uses, as MLX decides it: by a search of the source.
        self.shape_infos = tuple((f"{n}_shape" in source, f"{n}_strides" in source,
                                  f"{n}_ndim" in source) for n in self.input_names)

    def source_for(self, inputs, output_dtypes, template) -> tuple[str, str]:
        """``(kernel name, full source)`` for these inputs, output dtypes and template."""
        kernel_name = f"custom_kernel_{self.name}{_template_suffix(template)}"
        infos = [info if x.ndim else (False, False, False)
                 for x, info in zip(inputs, self.shape_infos)]
        if self.backend == "cuda":
            text = cuda_source(kernel_name, self.header, self.source, self.input_names, inputs,
                               self.output_names, output_dtypes, template, infos)
        else:
            text = metal_source(kernel_name, self.header, self.source, self.input_names, inputs,
                                self.output_names, output_dtypes, template, infos,
                                self.atomic_outputs)
        return kernel_name, text

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                 template=None, init_value: float | None = None, verbose: bool = False,
                 stream=None):
        op = self.op
        xs = _inputs(inputs, len(self.input_names), op)
        shapes, dtypes = _outputs(output_shapes, output_dtypes, len(self.output_names), op)
        grid, threadgroup = _triple(grid, "grid", op), _triple(threadgroup, "threadgroup", op)
        template = _template(template, op)
        s = _gpu_stream(stream, op)
        kernel_name, text = self.source_for(xs, dtypes, template)
        if verbose:
            print(f"Generated source code for `{kernel_name}`:\n```\n{text}\n```")
        infos = tuple(info if x.ndim else (False, False, False)
                      for x, info in zip(xs, self.shape_infos))
        prim = CustomKernel(s, self.backend, kernel_name, text, grid, threadgroup, shapes, dtypes,
                            infos, None if init_value is None else float(init_value),
                            self.ensure_row_contiguous, (), self.shared_memory, False)
        return lazy_multi(list(shapes), list(dtypes), prim, tuple(xs))

    def __repr__(self) -> str:
        return f"<fast.{self.op} {self.name!r}: {list(self.input_names)} -> {list(self.output_names)}>"


def cuda_kernel(name: str, input_names, output_names, source: str, header: str = "",
                ensure_row_contiguous: bool = True, shared_memory: int = 0) -> KernelFunction:
    """A jit-compiled custom CUDA kernel defined from a source string.

    Args:
        name (str): Name for the kernel.
        input_names (List[str]): The parameter names of the inputs in the function signature.
        output_names (List[str]): The parameter names of the outputs in the function signature.
        source (str): Source code: the body of a CUDA function; the signature is generated
            (each input ``x`` is ``const T* x``, plus ``x_shape``, ``x_strides`` and
            ``x_ndim`` when the body names them; each output ``device T*``).
        header (str): Source to put before the function (helpers, includes).
        ensure_row_contiguous (bool): Copy inputs to row-contiguous first. Default: ``True``.
        shared_memory (int): The dynamic shared memory to request. Default: ``0``.

    Returns:
        Callable: ``kernel(*, inputs, template, grid, threadgroup, output_shapes,
        output_dtypes, init_value=None, verbose=False, stream=None)`` -> list of arrays.
        ``grid`` is in threads (as Metal's), ``threadgroup`` is the block.

    Example:
        >>> k = mx.fast.cuda_kernel("myexp", ["inp"], ["out"],
        ...     "auto i = cooperative_groups::this_grid().thread_rank(); out[i] = exp(inp[i]);")
        >>> k(inputs=[a], template=[("T", mx.float32)], grid=(a.size, 1, 1),
        ...   threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[a.dtype])[0]
    """
    return KernelFunction("cuda", name, input_names, output_names, source, header,
                          ensure_row_contiguous, shared_memory=shared_memory)


def metal_kernel(name: str, input_names, output_names, source: str, header: str = "",
                 ensure_row_contiguous: bool = True, atomic_outputs: bool = False,
                 compile_options=None) -> KernelFunction:
    """A jit-compiled custom Metal kernel defined from a source string.

    Args:
        name (str): Name for the kernel.
        input_names (List[str]): The parameter names of the inputs in the function signature.
        output_names (List[str]): The parameter names of the outputs in the function signature.
        source (str): Source code: the body of a Metal function; the signature is
            generated, with the attributes (``thread_position_in_grid`` ...) it names.
        header (str): Source to put before the function.
        ensure_row_contiguous (bool): Copy inputs to row-contiguous first. Default: ``True``.
        atomic_outputs (bool): Declare outputs ``device atomic<T>*``. Default: ``False``.
        compile_options (dict, optional): ``{"math_mode": "safe" | "relaxed" | "fast"}``.

    Returns:
        Callable: as :func:`cuda_kernel`'s.
    """
    if compile_options is not None:
        if not isinstance(compile_options, dict) or set(compile_options) - {"math_mode"} or \
                compile_options.get("math_mode", "safe") not in ("safe", "relaxed", "fast"):
            raise ArgumentError(f"[metal_kernel] compile_options supports only "
                                f"{{'math_mode': 'safe' | 'relaxed' | 'fast'}}, got "
                                f"{compile_options!r}.")
    return KernelFunction("metal", name, input_names, output_names, source, header,
                          ensure_row_contiguous, atomic_outputs=atomic_outputs)


def precompiled_cuda_kernel(*, name: str, compiled_source: bytes, inputs, output_shapes,
                            output_dtypes, scalars, grid, threadgroup, shared_memory: int = 0,
                            init_value: float | None = None, ensure_row_contiguous: bool = False,
                            stream=None) -> list:
    """Run a precompiled CUDA kernel defined from PTX or cubin.

    Args:
        name (str): Name of the kernel (its symbol in the compiled module).
        compiled_source (bytes): The precompiled kernel in raw bytes.
        inputs (List[array]): The inputs passed to the CUDA kernel (as pointers).
        output_shapes (List[Sequence[int]]): The shape of each output.
        output_dtypes (List[Dtype]): The dtype of each output.
        scalars (List[Union[bool, int, float]]): Scalar arguments, after the outputs.
        grid (tuple[int, int, int]): The grid, in threads.
        threadgroup (tuple[int, int, int]): The block size.
        shared_memory (int): Dynamic shared memory to request. Default: ``0``.
        init_value (float, optional): A value to fill the outputs with first.
        ensure_row_contiguous (bool): Copy inputs to row-contiguous first. Default: ``False``.

    Returns:
        List[array]: The outputs.
    """
    op = "precompiled_cuda_kernel"
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"[{op}] name must be a non-empty string, got {name!r}.")
    if not isinstance(compiled_source, (bytes, bytearray)):
        raise ArgumentError(f"[{op}] compiled_source must be bytes (PTX or cubin), got "
                            f"{type(compiled_source).__name__}.")
    xs = _inputs(inputs, None, op)
    shapes, dtypes = _outputs(output_shapes, output_dtypes, None, op)
    if not shapes:
        raise ArgumentError(f"[{op}] Must specify at least one output.")
    for v in scalars:
        if type(v) not in (bool, int, float):
            raise ArgumentError(f"[{op}] scalars must be bools, ints or floats, got {v!r}.")
    if isinstance(shared_memory, bool) or not isinstance(shared_memory, int) or shared_memory < 0:
        raise ArgumentError(f"[{op}] shared_memory must be a non-negative int, got "
                            f"{shared_memory!r}.")
    grid, threadgroup = _triple(grid, "grid", op), _triple(threadgroup, "threadgroup", op)
    s = _gpu_stream(stream, op)
    prim = CustomKernel(s, "cuda", name, bytes(compiled_source), grid, threadgroup, shapes,
                        dtypes, ((False, False, False),) * len(xs),
                        None if init_value is None else float(init_value),
                        bool(ensure_row_contiguous), tuple(scalars), shared_memory, True)
    return lazy_multi(list(shapes), list(dtypes), prim, tuple(xs))


PRIMITIVES: list = []  # CustomKernel runs only on a GPU: see the module docstring
OPS: dict = {
    "fast.cuda_kernel": cuda_kernel,
    "fast.precompiled_cuda_kernel": precompiled_cuda_kernel,
    "fast.metal_kernel": metal_kernel,
}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)
