"""Launching generated element-wise kernels on a GPU: the planning the ``cuda`` and
``metal`` backends share.

A program (:class:`lazyx.codegen.ir.Program`: the fused run of a ``Compiled`` node,
or one element-wise op's own expression) runs on a GPU as one launch of a kernel
rendered for it. Which kernel, on which buffers, over which grid, is the same
question on every GPU and is answered here, once per program and input shapes (a
:class:`Plan`, cached per backend by the program's identity and the shapes; as on
the CPU, :mod:`lazyx.backends.cpu.compiled`, whose layout helpers this uses):

* the loop shape is the broadcast of the input shapes; inputs of one element are
  *scalars* (part of the kernel's source: read once per thread);
* when every other input has the loop's shape and C strides (checked per call),
  ``lx_contiguous`` runs; otherwise a strided kernel runs on the layout with size-1
  dimensions dropped and contiguous dimensions merged, uploaded once per input
  strides. A layout the strided kernels cannot take (strides that are not whole
  elements, more than 16 dimensions after merging) runs the contiguous kernel on
  contiguous copies of the inputs.

What differs between GPUs is a :class:`Target` (the backend's kernels, launch
sizes, strided-kernel choice, caches and counters) and a *runner*, the object that
touches the device: ``runner.empty(shape, dtype)``, ``runner.layout(host)`` (the
collapsed layout as the device reads it), ``runner.materialise(x, shape)`` and
``runner.launch(kernel, name, config, args)`` with ``args`` the inputs, the
outputs, the element count (``numpy.int64``) and, for the strided kernels, the
dimension count (``numpy.int32``) and the layout. Nothing here imports a GPU
library, so the planning runs anywhere with a runner that executes the kernels on
the CPU (:mod:`lazyx.backends.cuda.cuda_cpu`, :mod:`lazyx.backends.metal.compiled`),
which is how the tests check it.

The flow of a call: the backend's kernel (:func:`compiled_kernel` for a ``Compiled``
node, the one :func:`eager_kernel` makes for an element-wise primitive class) →
:func:`run_program` → :func:`plan_for` (cached) → ``runner.launch``. A program the
target refuses (a dtype its language lacks) or whose kernel does not compile runs
unfused (``Compiled``) or the backend's other kernel (single ops), or raises the
target's error naming the op and the dtypes where there is none.
"""

from __future__ import annotations

import math

import numpy as np

from lazyx.arguments import broadcast_shapes
from lazyx.errors import KernelCompileError, KernelNotFoundError, LazyxError
from lazyx.transforms.fusion import interpret

from .cpu.compiled import cached_layout, cached_program, compile_failed, contiguous_layout, \
    op_program, runs_contiguous

__all__ = ["Plan", "Target", "cached_kernel", "plan_for", "run_program", "compiled_kernel",
           "compiled_launch_plan", "eager_kernel"]


class Plan:
    """What a call at one set of input shapes needs.

    ``unrunnable`` plans run nothing: the inputs' dtypes are not the program's, the
    primitive's own shape rule disagrees with the broadcast (single ops), or the target
    refuses the program (``reason`` says why).
    """

    __slots__ = ("program", "shape", "size", "dtypes", "scalar", "kernel", "contiguous",
                 "launch", "strided_launch", "layouts", "unrunnable", "reason", "checked")


class Target:
    """One GPU backend's part of the shared launch logic. A backend subclasses it once.

    Attributes:
        backend (str): the backend's name, for messages.
        kernel_kind (str): how a compile-failure warning names a kernel (``"CUDA kernel"``).
        instead (str): what runs instead of a kernel that did not compile (the warning says it).
        stats (dict): counters (``contiguous``, ``strided``, ``materialised``, ``fallbacks``)
          the shared code increments.
        plans (dict): the plan cache; broken (set): programs whose kernel did not
          compile. Read per call (a backend may keep them as module globals).
    """

    backend = "?"
    kernel_kind = "generated kernel"
    instead = "its operations run unfused instead"
    stats: dict
    plans: dict
    broken: set

    def runner(self):
        """The runner of the device (made on first use)."""
        raise NotImplementedError

    def kernel_for(self, program, scalar: tuple):
        """The kernel object of ``program`` for the scalar mask ``scalar`` (cached)."""
        raise NotImplementedError

    def refuse(self, program, size: int) -> LazyxError | None:
        """Why ``program`` cannot run on ``size`` elements here, as the error a single op
        would raise (None: it can)."""
        return None

    def configure(self, plan: Plan) -> None:
        """Set ``plan.launch`` and ``plan.strided_launch``, the runner's launch sizes."""
        raise NotImplementedError

    def strided(self, plan: Plan, dims: list, strides: list, runner) -> tuple:
        """``(device layout, nd, kernel name)`` of the strided kernel for the collapsed loop
        ``dims`` and the inputs' element ``strides`` along it."""
        raise NotImplementedError

    def launch_plan(self, plan: Plan, inputs):
        """What a native launcher needs to run ``plan``'s kernel on ``inputs``' shapes
        and strides itself (see ``backends/cuda/native/launch.cpp``); None where it cannot
        (the Python kernel runs those calls)."""
        return None

    def no_kernel(self, cls, inputs, reason) -> LazyxError:
        """The error of a single op that has neither a generated kernel nor a fallback;
        ``reason`` (an exception from :meth:`refuse`, a string, or None) says why the
        generated one cannot run."""
        why = f" ({reason})" if reason else ""
        return KernelNotFoundError(
            f"{cls.name} has no kernel on backend {self.backend!r} for inputs of dtypes "
            f"{', '.join(str(x.dtype) for x in inputs)}{why}.")


def cached_kernel(kernels: dict, make, program, scalar: tuple):
    """A backend's kernel of ``program`` for the scalar mask ``scalar``: ``make(program,
    scalar)`` (rendering the source) the first time, kept in ``kernels``."""
    key = (program, scalar)
    k = kernels.get(key)
    if k is None:
        if len(kernels) > 8192:
            kernels.clear()
        k = kernels[key] = make(program, scalar)
    return k


def _make_plan(target: Target, program, inputs) -> Plan:
    p = Plan()
    p.program = program
    p.checked = False
    p.reason = None
    p.unrunnable = len(inputs) != len(program.inputs) or \
        any(x.dtype != d.np for x, d in zip(inputs, program.inputs))
    if p.unrunnable:
        return p
    shapes = [x.shape for x in inputs]
    p.shape = tuple(broadcast_shapes(*shapes)) if shapes else ()
    p.size = math.prod(p.shape)
    p.dtypes = [o.dtype.np for o in program.outputs]
    p.scalar = tuple(x.size == 1 for x in inputs)
    p.reason = target.refuse(program, p.size)
    if p.reason is not None:
        p.unrunnable = True
        return p
    p.contiguous = contiguous_layout(p.shape, inputs, p.scalar)
    p.kernel = target.kernel_for(program, p.scalar)
    p.layouts = {}
    target.configure(p)
    return p


def plan_for(target: Target, program, inputs) -> Plan:
    """The cached plan of ``program`` at these inputs' shapes on ``target``."""
    plans = target.plans
    # Plans are found by the program's identity (cheap) and checked against it.
    key = (id(program), tuple([x.shape for x in inputs]))
    p = plans.get(key)
    if p is None or p.program is not program:
        if len(plans) > 4096:
            plans.clear()
        p = plans[key] = _make_plan(target, program, inputs)
    return p


def run_program(target: Target, program, inputs, runner, plan=None):
    """Run ``program`` on device arrays ``inputs`` with ``runner``; the output array, or a
    tuple of them. Returns None when the plan is unrunnable (see :class:`Plan`). ``plan``:
    the caller's :func:`plan_for` of the same program and inputs, when it has it."""
    p = plan if plan is not None else plan_for(target, program, inputs)
    if p.unrunnable:
        return None
    empty = runner.empty
    outs = [empty(p.shape, d) for d in p.dtypes]
    n = p.size
    if n:
        stats = target.stats
        count = np.int64(n)
        if runs_contiguous(p.contiguous, inputs):
            stats["contiguous"] += 1
            runner.launch(p.kernel, "lx_contiguous", p.launch, (*inputs, *outs, count))
        else:
            layout = cached_layout(p, inputs, lambda dims, strides: target.strided(
                p, dims, strides, runner))
            if layout is None:
                # Contiguous copies at the loop's shape: the contiguous kernel runs them.
                stats["materialised"] += 1
                ins = [x if p.scalar[k] else runner.materialise(x, p.shape)
                       for k, x in enumerate(inputs)]
                runner.launch(p.kernel, "lx_contiguous", p.launch, (*ins, *outs, count))
            else:
                stats["strided"] += 1
                dev, nd, name = layout
                runner.launch(p.kernel, name, p.strided_launch, (*inputs, *outs, count, nd, dev))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _compile_failed(target: Target, program, exc) -> None:
    compile_failed(target.broken, program, exc, target.kernel_kind, target.instead)


def compiled_launch_plan(target: Target, prim, inputs):
    """The native launch plan (:meth:`Target.launch_plan`) of a ``Compiled`` node's call."""
    program = prim.program
    if program in target.broken:
        return None
    return target.launch_plan(plan_for(target, program, inputs), inputs)


def compiled_kernel(target: Target, prim, inputs):
    """Run a ``Compiled`` node's program as one generated kernel on ``target``; where it
    cannot (refused, or its kernel did not compile) the program runs unfused, each op
    on the node's stream."""
    program = prim.program
    if program not in target.broken:
        try:
            out = run_program(target, program, inputs, target.runner())
        except KernelCompileError as exc:
            _compile_failed(target, program, exc)
            out = None
        if out is not None:
            return out
    return interpret(program, list(inputs), prim.stream)


def _checked_plan(target: Target, program, prim, inputs) -> Plan:
    """A single op's plan, checked against the primitive's own shape rule at its first
    call at these shapes (unrunnable where the rule and the broadcast disagree)."""
    p = plan_for(target, program, inputs)
    if not p.checked:
        p.checked = True
        if not p.unrunnable:
            try:
                p.unrunnable = tuple(prim.output_shapes(inputs)[0]) != p.shape
            except Exception:
                p.unrunnable = True
    return p


def eager_kernel(target: Target, cls, fallback):
    """The kernel of element-wise primitive class ``cls`` on ``target``: a generated kernel
    of the primitive's own expression for the call's parameters and input dtypes (a
    one-node program, cached per (parameters, dtypes)), and ``fallback`` (a kernel) where
    it has none; with no ``fallback``, :meth:`Target.no_kernel`'s error."""
    programs: dict = {}
    with_params = bool(cls._param_names)
    stats = target.stats
    program_of = op_program

    def kernel(prim, inputs):
        entry = cached_program(programs, prim, inputs, with_params, program_of)
        reason = None
        if entry is not None and entry in target.broken:
            reason = "its generated kernel did not compile (warned when it first failed)"
        elif entry is not None:
            p = _checked_plan(target, entry, prim, inputs)
            if not p.unrunnable:
                try:
                    return run_program(target, entry, inputs, target.runner(), p)
                except KernelCompileError as exc:
                    _compile_failed(target, entry, exc)
                    p.reason = "its generated kernel did not compile"
            reason = p.reason
        stats["fallbacks"] += 1
        if fallback is None:
            raise target.no_kernel(cls, inputs, reason)
        return fallback(prim, inputs)

    def launch_plan(prim, inputs):
        # The plan of this call's launch for a native launcher, or None.
        entry = cached_program(programs, prim, inputs, with_params, program_of)
        if entry is None or entry in target.broken:
            return None
        return target.launch_plan(_checked_plan(target, entry, prim, inputs), inputs)

    kernel.generated = True
    kernel.fallback = fallback
    # A parameterised primitive's program depends on its parameters, which a launcher's
    # key (class, dtypes, shapes, strides) does not see: only the others get one.
    kernel.launch_plan = None if with_params else launch_plan
    kernel.__name__ = f"{target.backend}_elementwise_{cls.name}"
    return kernel
