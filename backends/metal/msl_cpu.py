"""Run MSL kernels on the CPU: how lazyx checks its Metal kernels on machines without Metal.

The kernel's source is compiled as C++17 by the system compiler, with
``shim/msl_shim.h`` in front of it (found by the source's own
``#include <metal_stdlib>`` too): the header turns MSL's qualifiers and attributes
into nothing, gives ``half`` and ``bfloat`` their 16-bit storage and ``metal::``
its math. After the source comes a generated C entry point that calls the kernel
function once per thread of the grid, in order, binding each parameter from its
attribute: ``[[buffer(n)]]`` gets buffer ``n``, ``[[thread_position_in_grid]]``
the thread's index, ``[[threads_per_grid]]`` the grid's size.

Building, the disk cache and the compiler are :mod:`lazyx.codegen.jit`'s, as for
``compile``'s fused kernels. A kernel whose threads cooperate (threadgroup memory,
barriers, SIMD-group functions, atomics) cannot run here.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from lazyx.codegen import jit
from lazyx.errors import LazyxError

from .launch import plan_launch

__all__ = ["run_msl_on_cpu", "launch_on_cpu", "MSLShimError", "SHIM_DIR", "shim_available"]

#: The folder of ``msl_shim.h`` and of the ``metal_stdlib`` that includes it.
SHIM_DIR = Path(__file__).resolve().parent / "shim"

#: Besides jit's flags: the shim's headers, and no contraction of ``a * b + c`` into fused
#: multiply-adds, so a kernel rounds as written (as NumPy references do).
_FLAGS = ("-I", str(SHIM_DIR), "-ffp-contract=off")

#: Thread-position attributes the shim can give a one-dimensional, one-thread-at-a-time grid.
_POSITIONS = ("thread_position_in_grid", "threads_per_grid")


class MSLShimError(LazyxError, RuntimeError):
    """An MSL kernel could not be built or run on the CPU: no compiler, a compile error
    (the message names the source and shows the compiler's first error lines), or a
    kernel outside what the shim supports."""


def shim_available() -> bool:
    """Whether MSL kernels can run on the CPU here (a C++ compiler was found)."""
    return jit.available()


def run_msl_on_cpu(kernel, inputs, out_shape, out_dtype, **constants):
    """Run a Metal kernel's MSL source on the CPU and return its output.

    The source is compiled as C++ through lazyx's MSL shim (cached on disk like
    ``compile``'s kernels) and run over the grid, one thread per output element,
    with the buffers bound exactly as the Metal backend binds them on a GPU.

    Args:
        kernel (MetalKernel): The kernel.
        inputs (list): NumPy arrays (any strides), one per input of ``kernel``.
        out_shape (tuple): The output's shape; the inputs broadcast to it.
        out_dtype (Dtype): The output's dtype (selects the kernel function).
        **constants: The value of each scalar constant the kernel declares.

    Returns:
        numpy.ndarray: The output.

    Raises:
        MSLShimError: No C++ compiler, or the source does not compile (the message
          names the source file and shows the compiler's first errors).
    """
    return launch_on_cpu(kernel, plan_launch(kernel, inputs, out_shape, out_dtype, constants))


def launch_on_cpu(kernel, launch):
    """Run a planned launch (:func:`lazyx.backends.metal.kernel.plan_launch`) on the CPU."""
    if launch.grid == 0:
        return launch.output
    entry, needed = _entry_point(kernel, launch.function)
    if needed > len(launch.buffers):
        raise MSLShimError(f"{kernel.label}: kernel function {launch.function!r} reads buffer "
                           f"{needed - 1}, but only {len(launch.buffers)} are bound "
                           f"({', '.join(kernel.buffers)}).")
    pointers = (ctypes.c_void_p * len(launch.buffers))(
        *(b.ctypes.data for b in launch.buffers))
    entry(pointers, launch.grid)
    return launch.output


_entries: dict = {}


def _entry_point(kernel, function: str):
    key = (kernel.source, kernel.filename, function)
    fn = _entries.get(key)
    if fn is None:
        fn = _entries[key] = _build(kernel, function)
    return fn


def _build(kernel, function: str):
    source = kernel.source
    callee, params = kernel_signature(source, function, kernel.label)
    unit = translation_unit(source, callee, params, kernel.filename or "<MSL source>")
    if not jit.available():
        raise MSLShimError(f"Cannot run {kernel.label} on the CPU: lazyx's MSL shim needs a C++ "
                           f"compiler. {jit.missing_compiler_message()}")
    try:
        lib = jit.build(unit, _FLAGS)
    except jit.KernelCompileError as exc:
        raise MSLShimError(_compile_error(kernel, function, str(exc))) from None
    fn = lib.lx_msl_entry
    fn.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64)
    fn.restype = ctypes.c_int
    return fn, 1 + max((i for kind, i in params if kind == "buffer"), default=-1)


def _compile_error(kernel, function: str, message: str) -> str:
    # jit's message ends with advice about lazyx's own code generation; this source is the
    # kernel author's, so keep only where it is and what the compiler said.
    lines = message.splitlines()
    generated = next((ln.split("source:", 1)[1].strip() for ln in lines if "source:" in ln), "?")
    start = next((i + 1 for i, ln in enumerate(lines) if "compiler output:" in ln), len(lines))
    output = [ln for ln in lines[start:] if ln.startswith("    ")]
    where = kernel.filename or "the MSL source given to MetalKernel"
    return (f"{kernel.label}: kernel function {function!r} does not compile through lazyx's "
            f"MSL-on-the-CPU shim.\n  MSL source: {where}\n  as C++: {generated}\n"
            f"  compiler output:\n" + "\n".join(output))


# -- reading the kernel's signature -----------------------------------------------------
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_INSTANTIATION = re.compile(
    r"template\s*\[\[\s*host_name\(\s*\"(?P<host>[^\"]+)\"\s*\)\s*\]\]\s*"
    r"(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*decltype\(\s*(?P<fn>[A-Za-z_]\w*)\s*<(?P<args>[^;]*?)>\s*\)")
_ATTRIBUTE = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*([^)]*?)\s*\))?\s*\]\]")


def kernel_signature(source: str, function: str, label: str = "MSL kernel"):
    """Find kernel function ``function`` in MSL ``source``.

    ``function`` is a kernel's own name (``[[kernel]] void name(...)``) or the host name
    of an explicit instantiation of a templated kernel
    (``template [[host_name("name")]] [[kernel]] decltype(f<T>) f<T>;``).

    Returns:
        tuple: the C++ expression that names the function (``f<float>``) and, per
        parameter, ``("buffer", n)`` or ``(attribute, None)`` for a thread position.
    """
    text = _COMMENTS.sub(" ", source)
    callee, base = function, function
    for m in _INSTANTIATION.finditer(text):
        if m.group("host") == function:
            base = m.group("fn")
            callee = f"{base}<{m.group('args').strip()}>"
            break
    head = re.search(r"(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*void\s+" + re.escape(base) + r"\s*\(",
                     text)
    if head is None:
        raise MSLShimError(f"{label}: no kernel function {function!r} in the source (looked for "
                           f"`[[kernel]] void {function}(` and for an explicit instantiation "
                           f"`template [[host_name(\"{function}\")]] [[kernel]] decltype(f<T>) f<T>;`).")
    params = []
    for param in _split_parameters(text, head.end()):
        attrs = _ATTRIBUTE.findall(param)
        kinds = [(a, v) for a, v in attrs if a == "buffer" or a in _POSITIONS]
        if len(kinds) != 1:
            other = ", ".join(f"[[{a}]]" for a, _ in attrs) or "no attribute"
            raise MSLShimError(
                f"{label}: parameter `{' '.join(param.split())}` of kernel {base!r} has {other}; "
                f"the CPU shim binds [[buffer(n)]] and [[{']], [['.join(_POSITIONS)}]] parameters "
                f"only (it runs one thread at a time, without threadgroups).")
        attr, value = kinds[0]
        if attr == "buffer":
            try:
                params.append(("buffer", int(value, 0)))
            except ValueError:
                raise MSLShimError(f"{label}: parameter `{' '.join(param.split())}` needs a "
                                   f"literal buffer index.") from None
        else:
            params.append((attr, None))
    return callee, params


def _split_parameters(text: str, start: int) -> list[str]:
    """The parameters of the list that opens at ``text[start - 1]``, split at its top-level commas."""
    depth, begin, out = 0, start, []
    for i in range(start, len(text)):
        c = text[i]
        if c in "([<":
            depth += 1
        elif c in ")]>":
            if depth == 0 and c == ")":
                last = text[begin:i].strip()
                if last:
                    out.append(last)
                return out
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[begin:i].strip())
            begin = i + 1
    raise MSLShimError("unbalanced parentheses in a kernel's parameter list")


def translation_unit(source: str, callee: str, params, filename: str) -> str:
    """The C++ the shim compiles: the shim header, the MSL source and an entry point
    ``lx_msl_entry(buffers, n)`` that runs threads ``0 .. n-1`` of the grid."""
    header = (SHIM_DIR / "msl_shim.h").read_text()
    args = []
    for k, (kind, index) in enumerate(params):
        ptype = f"lx_msl::parameter<lx_fn, {k}>"
        if kind == "buffer":
            args.append(f"lx_msl::bind<{ptype}>(lx_buffers[{index}])")
        elif kind == "thread_position_in_grid":
            args.append(f"lx_msl::position<{ptype}>(lx_i)")
        else:
            args.append(f"lx_msl::position<{ptype}>(lx_n)")
    call = f"{callee}({', '.join(args)})"
    quoted = filename.replace("\\", "\\\\").replace('"', '\\"')
    return (f"{header}\n{jit.PREAMBLE_END}"
            f'#line 1 "{quoted}"\n{source}\n'
            f"// ---- generated by lazyx.backends.metal.msl_cpu ----\n"
            f"#line 1 \"<lazyx MSL shim entry point>\"\n"
            f"using lx_fn = decltype(&{callee});\n"
            f'extern "C" int lx_msl_entry(void* const* lx_buffers, uint64_t lx_n) {{\n'
            f"  for (uint64_t lx_i = 0; lx_i < lx_n; ++lx_i) {call};\n"
            f"  return 0;\n}}\n")
