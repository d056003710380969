"""Run MSL kernels on the CPU: how lazyx checks its Metal kernels on machines without Metal.

The flow of a launch (:func:`dispatch_on_cpu`; :func:`run_msl_on_cpu` and
:func:`launch_on_cpu` plan one first):

1. **Read the source** (once per source): every kernel function in it — plain
   ``[[kernel]] void name(...)`` ones and the host names of explicit instantiations
   of templated ones — and, per parameter, what it binds: ``[[buffer(n)]]``,
   ``[[threadgroup(n)]]`` (threadgroup memory the launch sizes) or a thread-position
   attribute (:data:`POSITIONS`). Features the shim cannot emulate
   (:data:`UNSUPPORTED`) are refused here, by name.
2. **Rewrite it as C++** without moving a line: the attributes it binds become
   ``[[]]``, and a ``threadgroup`` *declaration* becomes ``static thread_local``, so
   that the threads of a threadgroup — fibers on one CPU thread — share it.
3. **Build** ``shim/msl_shim.h`` + the source + one generated body per kernel
   function (it binds each parameter) + the entry ``lx_msl_run``, with
   :mod:`lazyx.codegen.jit` (its compiler, memory and disk caches): one library per
   source, as Metal builds one library per source.
4. **Run** the grid, threadgroup after threadgroup (Metal's ``dispatchThreads``: a
   grid of threads, edge threadgroups clipped). A source that synchronises (calls
   ``threadgroup_barrier``, ``simdgroup_barrier`` or a ``simd_*`` function) runs each
   threadgroup's threads as fibers switched at those calls (see the header); any
   other runs them as a plain loop. A deadlock (a barrier some threads skip), SIMD
   lanes at different calls, or a synchronising call the scan missed is an
   :class:`MSLShimError` naming the threadgroup, the threads and the MSL lines.

``schedule="reverse"`` runs a threadgroup's threads in the opposite order between
synchronisation points: a kernel that reads another thread's write without a barrier
between them gets it wrong in one order or the other, so tests run both.
"""

from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path

import numpy as np

from lazyx.codegen import jit
from lazyx.errors import ArgumentError, LazyxError

from .launch import plan_launch

__all__ = ["run_msl_on_cpu", "launch_on_cpu", "dispatch_on_cpu", "MSLShimError", "SHIM_DIR",
           "shim_available", "POSITIONS", "UNSUPPORTED", "MAX_THREADS_PER_THREADGROUP"]

#: The folder of ``msl_shim.h`` and of the ``metal_stdlib`` that includes it.
SHIM_DIR = Path(__file__).resolve().parent / "shim"

#: Besides jit's flags: the shim's headers, and no contraction of ``a * b + c`` into fused
#: multiply-adds, so a kernel rounds as written (as NumPy references do).
_FLAGS = ("-I", str(SHIM_DIR), "-ffp-contract=off")

#: The thread-position attributes the shim binds, in the order of the header's ``attr``
#: enumeration. A parameter of type ``uint3``/``uint2`` gets all/two coordinates, a
#: scalar the first.
POSITIONS = ("thread_position_in_grid", "threads_per_grid", "threadgroup_position_in_grid",
             "thread_position_in_threadgroup", "threads_per_threadgroup",
             "dispatch_threads_per_threadgroup", "threadgroups_per_grid",
             "thread_index_in_threadgroup", "thread_index_in_simdgroup",
             "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
             "threads_per_simdgroup", "thread_execution_width")

#: Apple GPUs' limit, and the size of the shim's per-threadgroup tables.
MAX_THREADS_PER_THREADGROUP = 1024

#: What the shim cannot emulate: a pattern in the source -> the feature, in words.
UNSUPPORTED = {
    r"\btexture(?:1d|2d|3d|cube|buffer)\w*\s*<|\bsampler\b": "textures and samplers",
    r"\bsimdgroup_(?:matrix|float8x8|half8x8|bfloat8x8|multiply|load|store)\w*":
        "SIMD-group matrices (simdgroup_matrix, simdgroup_multiply_accumulate)",
    r"\bquad_\w+\s*\(|\[\[\s*(?:quadgroup_index_in_threadgroup|thread_index_in_quadgroup)":
        "quad-group functions",
    r"\b(?:float|half|bfloat|int|short|ushort|char|uchar|bool|long|ulong)[234]\b"
    r"|\buint4\b|\bpacked_\w+": "vector types (float4, half2, ...): write scalar code",
    r"\[\[\s*function_constant\b": "function constants ([[function_constant(n)]])",
    r"\[\[\s*(?:stage_in|imageblock\w*|color)\b|\bimageblock\s*<": "render-pipeline inputs "
        "and imageblocks",
    r"\bvisible_function_table\b|\bintersection_function_table\b|\braytracing::":
        "function tables and ray tracing",
}
_UNSUPPORTED = [(re.compile(k), v) for k, v in UNSUPPORTED.items()]

#: A call that makes threads wait for each other: such a source runs its threads as fibers.
_SYNCHRONISES = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+)\s*\(")

_SCHEDULES = {"forward": 0, "reverse": 2}


class MSLShimError(LazyxError, RuntimeError):
    """An MSL kernel could not be built or run on the CPU: no compiler, a compile error
    (the message names the source and shows the compiler's first error lines), a
    feature outside what the shim emulates, or threads that do not synchronise as
    the shim needs (a deadlock, divergent SIMD-group calls)."""


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


def launch_on_cpu(kernel, launch, *, threadgroup=None, schedule: str = "forward"):
    """Run a planned launch (:func:`lazyx.backends.metal.kernel.plan_launch`) on the CPU
    and return its output.

    ``threadgroup`` (an int or up to three sizes) defaults to the launch's own
    ``threadgroup`` when it has one, else up to 1024 threads along x.
    """
    threadgroup = threadgroup or getattr(launch, "threadgroup", None)
    dispatch_on_cpu(kernel, launch.function, launch.buffers, launch.grid, threadgroup,
                    schedule=schedule)
    return launch.output


def dispatch_on_cpu(kernel, function: str, buffers, grid, threadgroup=None, *,
                    threadgroup_memory=(), schedule: str = "forward") -> None:
    """Run kernel function ``function`` of ``kernel``'s source over ``grid`` on the CPU.

    Metal's ``dispatchThreads(grid, threadgroup)``: ``grid`` counts threads (an int or
    up to three sizes); threadgroups of ``threadgroup`` threads tile it, clipped at
    its edges (``[[threads_per_threadgroup]]`` is the clipped size there).

    Args:
        kernel: Anything with the MSL ``source``, a ``filename`` (or None) and a
          ``label`` for messages (a :class:`MetalKernel`).
        function: The kernel function (its name or an instantiation's host name).
        buffers: NumPy arrays, ``buffers[n]`` bound to ``[[buffer(n)]]``; the kernel
          writes its outputs into them.
        grid: Threads per dimension.
        threadgroup: Threads per threadgroup per dimension (at most 1024 in all).
          Default: up to 1024 along x.
        threadgroup_memory: Bytes of each ``[[threadgroup(n)]]`` buffer (Metal's
          ``setThreadgroupMemoryLength``), by index. Its bytes start as 0xff
          (float NaNs), as a reminder that a GPU leaves them undefined.
        schedule: ``"forward"`` or ``"reverse"``: the order a threadgroup's threads
          run in between synchronisation points.

    Raises:
        MSLShimError: The kernel does not build, uses what the shim cannot emulate,
          or its threads do not synchronise as the shim needs.
        ArgumentError: A bad grid, threadgroup, schedule or buffer list.
    """
    grid3 = _sizes(grid, "grid", kernel, function)
    if 0 in grid3:
        return
    if threadgroup is None:
        threadgroup = min(grid3[0], MAX_THREADS_PER_THREADGROUP)
    group3 = _sizes(threadgroup, "threadgroup", kernel, function)
    if 0 in group3 or group3[0] * group3[1] * group3[2] > MAX_THREADS_PER_THREADGROUP:
        raise ArgumentError(f"{kernel.label}: kernel function {function!r}: a threadgroup of "
                            f"{group3} threads; it must have 1 to {MAX_THREADS_PER_THREADGROUP} "
                            f"threads in all.")
    if schedule not in _SCHEDULES:
        raise ArgumentError(f"dispatch_on_cpu: schedule {schedule!r}; use one of "
                            f"{', '.join(_SCHEDULES)}.")
    library, index, needed, scratch_needed = _entry_point(kernel, function)
    if needed > len(buffers):
        names = getattr(kernel, "buffers", None)
        bound = f" ({', '.join(names)})" if names else ""
        raise MSLShimError(f"{kernel.label}: kernel function {function!r} reads buffer "
                           f"{needed - 1}, but only {len(buffers)} are bound{bound}.")
    if isinstance(threadgroup_memory, dict):
        sizes = [threadgroup_memory.get(i, 0) for i in range(max(threadgroup_memory, default=-1) + 1)]
    else:
        sizes = list(threadgroup_memory)
    if scratch_needed > len(sizes):
        raise MSLShimError(f"{kernel.label}: kernel function {function!r} takes threadgroup "
                           f"memory [[threadgroup({scratch_needed - 1})]], but the launch sizes "
                           f"{len(sizes)} (pass threadgroup_memory=).")
    scratch = [np.full(max(int(n), 16), 0xff, np.uint8) for n in sizes]
    pointers = (ctypes.c_void_p * max(len(buffers), 1))(*(b.ctypes.data for b in buffers))
    tg_pointers = (ctypes.c_void_p * max(len(scratch), 1))(*(b.ctypes.data for b in scratch))
    dims = (ctypes.c_uint32 * 6)(*grid3, *group3)
    flags = _SCHEDULES[schedule] | (1 if library.synchronises else 0)
    error = ctypes.create_string_buffer(1024)
    if library.run(index, pointers, tg_pointers, dims, flags, error, len(error)):
        raise MSLShimError(f"{kernel.label}: kernel function {function!r} on a grid of {grid3} "
                           f"threads in threadgroups of {group3}: "
                           f"{error.value.decode(errors='replace')}")


def _sizes(value, what: str, kernel, function: str) -> tuple:
    sizes = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(sizes) <= 3 or any(int(n) < 0 or int(n) >= 2**32 for n in sizes):
        raise ArgumentError(f"{kernel.label}: kernel function {function!r}: {what} {value!r}; "
                            f"give 1 to 3 sizes, each in [0, 2**32).")
    return tuple(int(n) for n in sizes) + (1,) * (3 - len(sizes))


# -- building a source -------------------------------------------------------------------
class _Library:
    """A source's built library: its entry, and per kernel function its index, the
    buffers and threadgroup buffers it reads, or why it cannot run."""

    def __init__(self):
        self.run = None
        self.functions: dict = {}      # name -> (index, buffers needed, scratch needed)
        self.refused: dict = {}        # name -> MSLShimError message
        self.synchronises = False


_libraries: dict = {}
_lock = threading.Lock()
_building: dict = {}


def _entry_point(kernel, function: str):
    """``(library, index, buffers needed, threadgroup buffers needed)`` of ``function``
    (the source is built on first use)."""
    key = (kernel.source, kernel.filename)
    library = _libraries.get(key)
    if library is None or (function not in library.functions and function not in library.refused):
        with _lock:
            lock = _building.setdefault(key, threading.Lock())
        with lock:   # one build per source; different sources build in parallel
            library = _libraries.get(key)
            if library is None or (function not in library.functions
                                   and function not in library.refused):
                library = _libraries[key] = _build(kernel, function)
    if function in library.refused:
        raise MSLShimError(library.refused[function])
    return (library, *library.functions[function])


def _build(kernel, function: str) -> _Library:
    source = kernel.source
    text = _blank_comments(source)
    label = kernel.label
    found = []
    for feature, reason in _UNSUPPORTED:
        m = feature.search(text)
        if m:
            found.append(f"{reason} (`{m.group(0).strip()}`, line {text.count(chr(10), 0, m.start()) + 1})")
    if found:
        raise MSLShimError(f"{label}: the MSL-on-the-CPU shim cannot emulate "
                           f"{'; '.join(found)}. The kernel cannot be checked on the CPU "
                           f"(docs/codegen.md, \"The MSL shim\" lists what it emulates).")
    library = _Library()
    library.synchronises = bool(_SYNCHRONISES.search(text))
    names = kernel_functions(source)
    if function not in names:
        names.append(function)
    signatures = []
    for name in names:
        try:
            callee, params = kernel_signature(source, name, label)
        except MSLShimError as exc:
            if name == function:
                raise
            library.refused[name] = str(exc)
            continue
        buffers = [i for kind, i in params if kind == "buffer"]
        scratch = [i for kind, i in params if kind == "threadgroup"]
        library.functions[name] = (len(signatures), 1 + max(buffers, default=-1),
                                   1 + max(scratch, default=-1))
        signatures.append((callee, params))
    unit = translation_unit(source, signatures, kernel.filename or "<MSL source>")
    if not jit.available():
        raise MSLShimError(f"Cannot run {label} on the CPU: lazyx's MSL shim needs a C++ "
                           f"compiler. {jit.missing_compiler_message()}")
    try:
        lib = jit.build(unit, _FLAGS)
    except jit.KernelCompileError as exc:
        raise MSLShimError(_compile_error(kernel, function, str(exc))) from None
    fn = lib.lx_msl_run
    fn.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    fn.restype = ctypes.c_int
    library.run = fn
    return library


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
_KERNEL_HEAD = re.compile(r"(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*void\s+([A-Za-z_]\w*)\s*\(")
#: Attributes the entry point binds itself: they become ``[[]]`` in the C++.
_BOUND = frozenset(("buffer", "threadgroup", "max_total_threads_per_threadgroup", *POSITIONS))


def _blank_comments(source: str) -> str:
    """``source`` with its comments blanked (newlines kept): same length, same lines."""
    return _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def kernel_functions(source: str) -> list:
    """The kernel functions of an MSL source: the plain ``[[kernel]] void name(...)``
    ones and the host names of explicit instantiations of templated ones."""
    text = _blank_comments(source)
    names = []
    for m in _KERNEL_HEAD.finditer(text):
        before = text[:m.start()]
        statement = before[max(before.rfind(";"), before.rfind("}"), before.rfind("{")) + 1:]
        if not re.search(r"\btemplate\b", statement):      # a template has host names
            names.append(m.group(1))
    names += [m.group("host") for m in _INSTANTIATION.finditer(text)]
    return names


def kernel_signature(source: str, function: str, label: str = "MSL kernel"):
    """Find kernel function ``function`` in MSL ``source``.

    ``function`` is a kernel's own name (``[[kernel]] void name(...)``) or the host name
    of an explicit instantiation of a templated kernel
    (``template [[host_name("name")]] [[kernel]] decltype(f<T>) f<T>;``).

    Returns:
        tuple: the C++ expression that names the function (``f<float>``) and, per
        parameter, ``("buffer", n)``, ``("threadgroup", n)`` or ``(attribute, None)``
        for a thread position (one of :data:`POSITIONS`).
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
        kinds = [(a, v) for a, v in attrs if a in ("buffer", "threadgroup") or a in POSITIONS]
        if len(kinds) != 1:
            other = ", ".join(f"[[{a}]]" for a, _ in attrs) or "no attribute"
            raise MSLShimError(
                f"{label}: parameter `{' '.join(param.split())}` of kernel {base!r} has {other}; "
                f"the CPU shim binds [[buffer(n)]], [[threadgroup(n)]] and the thread-position "
                f"attributes [[{']], [['.join(POSITIONS)}]] only.")
        attr, value = kinds[0]
        if attr in ("buffer", "threadgroup"):
            try:
                params.append((attr, int(value, 0)))
            except (TypeError, ValueError):
                raise MSLShimError(f"{label}: parameter `{' '.join(param.split())}` needs a "
                                   f"literal {attr} index.") from None
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


def shim_source(source: str) -> str:
    """``source`` as the shim compiles it, line for line: the attributes the entry point
    binds become ``[[]]`` (spaces inside), and each ``threadgroup`` declaration (the
    word at the start of a statement) ``static thread_local``: one variable that the
    fibers of a threadgroup share (threadgroups run one after another)."""
    text = _blank_comments(source)
    out = list(source)
    for m in _ATTRIBUTE.finditer(text):
        if m.group(1) in _BOUND:
            out[m.start() + 2:m.end() - 2] = " " * (m.end() - m.start() - 4)
    edits = []
    for m in re.finditer(r"\bthreadgroup\b(?!\s*\()", text):
        before = text[:m.start()].rstrip()
        if not before or before[-1] in ";{}":
            edits.append(m)
    for m in reversed(edits):
        out[m.start():m.end()] = "static thread_local"
    return "".join(out)


def translation_unit(source: str, functions, filename: str) -> str:
    """The C++ the shim compiles: the shim header, the MSL source (:func:`shim_source`)
    and, per kernel function ``(callee, params)`` of ``functions``, a body that binds
    its parameters and calls it, selected by ``which`` in the entry
    ``lx_msl_run(which, buffers, threadgroup_buffers, dims, flags, error, size)``."""
    header = (SHIM_DIR / "msl_shim.h").read_text()
    bodies = []
    for f, (callee, params) in enumerate(functions):
        args = []
        for k, (kind, index) in enumerate(params):
            ptype = f"lx_msl::parameter<lx_fn{f}, {k}>"
            if kind == "buffer":
                args.append(f"lx_msl::bind<{ptype}>(lx_buffers[{index}])")
            elif kind == "threadgroup":
                args.append(f"lx_msl::bind<{ptype}>(lx_msl::state->tg_buffers[{index}])")
            else:
                args.append(f"lx_msl::attribute<{ptype}>(lx_msl::attr::{kind})")
        bodies.append(f"using lx_fn{f} = decltype(&{callee});\n"
                      f"static void lx_body{f}(void* const* lx_buffers) {{\n"
                      f"  (void)lx_buffers;\n  {callee}({', '.join(args)});\n}}\n")
    table = ", ".join(f"lx_body{f}" for f in range(len(functions))) or "nullptr"
    quoted = filename.replace("\\", "\\\\").replace('"', '\\"')
    return (f"{header}\n{jit.PREAMBLE_END}"
            f'#line 1 "{quoted}"\n{shim_source(source)}\n'
            f"// ---- generated by lazyx.backends.metal.msl_cpu ----\n"
            f"#line 1 \"<lazyx MSL shim entry point>\"\n"
            + "".join(bodies) +
            f'extern "C" int lx_msl_run(int which, void* const* buffers, void* const* scratch,\n'
            f"                          const uint32_t* dims, int flags, char* error, size_t size) {{\n"
            f"  static const lx_msl::body_fn bodies[] = {{{table}}};\n"
            f"  return lx_msl::launch(bodies[which], buffers, scratch, dims, flags, error, size);\n}}\n")
