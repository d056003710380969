"""Optimizers: a small base class plus one short class per update rule (``mlx.optimizers``).

The flow of one training step, ``optimizer.update(model, grads)``:

1. **init** (first call, or after ``state`` was replaced): the state tree grows to
   mirror the gradients' tree, one dict per parameter, filled by ``init_single``
   (``{"m": zeros, "v": zeros}`` for Adam). State already there is kept, so a loaded
   state resumes where it was saved.
2. **schedules**: every hyper-parameter given as a callable of the step is evaluated at
   the current step and stored in the state (``state["learning_rate"]``).
3. **step**: ``state["step"]`` (a ``uint64`` scalar array) is incremented.
4. **apply**: ``apply_single(gradient, parameter, state)`` runs per parameter, checked
   against the parameter's path and shape, and the new parameters go back into the
   model with ``model.update``. For a parameter of :data:`FUSE_MIN` elements or more,
   a built-in rule runs as one compiled function (one fused pass instead of an op per
   term: eager Adam's step on a 784-512-512-10 MLP went from 1.3x PyTorch's time to
   1.05x); the numbers are the rule's, to float rounding. With a GPU as the default
   device, every parameter updates in one compiled function (one CUDA graph for the
   whole model, as PyTorch's fused "multi-tensor" Adam): the MLP's eager step on an H200
   went from 429 to 638 steps/s with the other changes of that session.

Everything the update reads or writes lives in ``optimizer.state``, a plain tree of
arrays: it saves with ``mx.save_safetensors(path, dict(tree_flatten(opt.state)))``, loads
with ``opt.state = tree_unflatten(list(mx.load(path).items()))``, and a training step
compiles with ``partial(mx.compile, inputs=state, outputs=state)`` for
``state = [model.state, optimizer.state]`` (the state dict is only ever mutated in
place, never replaced, so the compiled function writes its outputs back into it).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple, Union

import lazyx.core as mx
from lazyx.errors import LazyxError, ShapeError, TreeStructureError
from lazyx.utils import (tree_flatten, tree_map, tree_map_with_path, tree_merge, tree_reduce,
                         tree_unflatten)

__all__ = ["Optimizer", "SGD", "RMSprop", "Adagrad", "AdaDelta", "Adam", "AdamW", "Adamax",
           "Lion", "Adafactor", "Muon", "MultiOptimizer", "clip_grad_norm"]

Schedulable = Union[float, Callable[[mx.array], mx.array]]


def _shape(shape) -> str:
    return str(tuple(shape))


#: Parameters of at least this many elements update through one compiled function per
#: rule (:meth:`Optimizer._apply_fused`); smaller ones op by op, where the compiled
#: call's own cost is larger than the passes it saves.
FUSE_MIN = 1 << 12

_UNFUSABLE = object()


def _fuses_all() -> bool:
    """Whether an update runs as one compiled function for all parameters: on a GPU, where
    a compiled call replays one CUDA graph and an eager op costs a launch (on the CPU a
    parameter's fused kernel is worth its call only from FUSE_MIN elements)."""
    return mx.default_device().type is mx.DeviceType.gpu


class _NotFused(Exception):
    """A parameter the all-parameter fused update does not take."""


def _hyper_parameters(optimizer) -> tuple:
    """The optimizer's plain settings (numbers, flags, strings and tuples of them), the
    constants a traced rule holds."""
    out = []
    for k, v in sorted(vars(optimizer).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, list):
            v = tuple(v)
        if isinstance(v, (bool, int, float, str, type(None))) or (
                isinstance(v, tuple) and all(isinstance(x, (bool, int, float, str)) for x in v)):
            out.append((k, v))
    return tuple(out)


def _mirror(params, state):
    """``state`` grown to hold a slot for every leaf of ``params``: an empty dict at each
    new leaf, existing entries kept. Dicts grow in place (the compiled step holds the
    top-level dict); lists and tuples are rebuilt."""
    if isinstance(params, (list, tuple)):
        if not isinstance(state, (list, tuple)):
            state = []
        grown = [_mirror(p, s) for p, s in zip(params, state)]
        grown += [tree_map(lambda _: {}, p) for p in params[len(grown):]]
        return type(params)(grown) if not hasattr(params, "_fields") else type(params)(*grown)
    if isinstance(params, dict):
        for k, p in params.items():
            state[k] = _mirror(p, state[k]) if k in state else tree_map(lambda _: {}, p)
        return state
    return state


def _has_path(tree, keys: List[str]) -> bool:
    for k in keys:
        if isinstance(tree, dict) and k in tree:
            tree = tree[k]
        elif isinstance(tree, (list, tuple)) and k.isdigit() and int(k) < len(tree):
            tree = tree[int(k)]
        else:
            return False
    return True


class Optimizer:
    """The base class of all optimizers: the state tree, schedules and the update loop.

    A subclass sets its hyper-parameters in ``__init__`` (through
    :meth:`_maybe_schedule` for those that may be schedules) and writes two methods:
    :meth:`init_single`, which fills the state of one parameter, and
    :meth:`apply_single`, which returns the updated parameter.

    Args:
        schedulers (dict, optional): ``{name: schedule}`` of state entries recomputed
            from the step before every update.
    """

    def __init__(self, schedulers: Optional[dict] = None):
        self._initialized = False
        self._state = {"step": mx.array(0, mx.uint64)}
        self._schedulers = dict(schedulers or {})
        self._fused_rules: dict = {}  # compiled rules, by fusion key (_apply_fused)
        self._fusion_key = None  # this update's optimizer-level part of that key

    def update(self, model, gradients) -> None:
        """Apply ``gradients`` to the parameters of ``model`` (``model.update``).

        Args:
            model (Module): The model, a tree of parameters with an ``update`` method.
            gradients (dict): The gradients, a tree matching (part of) the model's.
        """
        model.update(self.apply_gradients(gradients, model))

    def init(self, parameters) -> None:
        """Create the state of every parameter of ``parameters`` that has none yet.

        Called by the first update; call it yourself to see the state before training
        (to save or compile it). Existing state is kept.

        Args:
            parameters (dict): A tree of parameters (``model.trainable_parameters()``).
        """
        _mirror(parameters, self._state)
        tree_map(lambda p, s: s or self.init_single(p, s), parameters, self._state)
        self._initialized = True

    def init_single(self, parameter: mx.array, state: dict) -> None:
        """Fill ``state`` (an empty dict) for one parameter."""
        raise NotImplementedError(f"{type(self).__name__} must implement init_single"
                                  "(parameter, state)")

    def apply_gradients(self, gradients, parameters):
        """The parameters after one update with ``gradients``; the state advances.

        Args:
            gradients (dict): A tree of gradients.
            parameters (dict): A tree holding (at least) the parameters of
                ``gradients``'s tree; only those are updated and returned.

        Returns:
            The tree of updated parameters, shaped like ``gradients``.
        """
        if not self._initialized:
            self.init(gradients)
        state = self._state
        for name, schedule in self._schedulers.items():
            state[name] = self._scheduled(name, schedule)
        state["step"] = state["step"] + 1
        # What every parameter's fused rule is keyed by, read once per update.
        self._fusion_key = (tuple(k for k, v in state.items() if isinstance(v, mx.array)),
                            _hyper_parameters(self))
        if type(self).apply_single in _BUILT_IN_RULES and _fuses_all():
            done = self._apply_all_fused(gradients, parameters, state)
            if done is not None:
                return done
        try:
            return tree_map_with_path(self._apply_checked, gradients, parameters, state)
        except LazyxError:
            raise
        except (KeyError, IndexError, TypeError) as e:
            mismatch = self._mismatch(gradients, parameters)
            if mismatch is None:  # the trees agree: the error is the rule's own
                raise
            raise mismatch from e

    def _apply_checked(self, path, gradient, parameter, state):
        """``apply_single`` on one parameter, with errors that name its path and shapes."""
        name = type(self).__name__
        if gradient.shape != parameter.shape:
            raise ShapeError(f"[{name}] The gradient of '{path}' has shape "
                             f"{_shape(gradient.shape)} but the parameter has shape "
                             f"{_shape(parameter.shape)}.")
        try:
            if parameter.size >= FUSE_MIN and type(self).apply_single in _BUILT_IN_RULES \
                    and isinstance(state, dict):
                new = self._apply_fused(gradient, parameter, state)
            else:
                new = self.apply_single(gradient, parameter, state)
        except ShapeError as e:
            raise ShapeError(f"[{name}] The state of '{path}' does not fit its parameter of "
                             f"shape {_shape(parameter.shape)}: {self._state_shapes(state)}. "
                             f"Was the state made for another model? ({e})") from e
        if new.shape != parameter.shape:
            raise ShapeError(f"[{name}] The state of '{path}' does not fit its parameter of "
                             f"shape {_shape(parameter.shape)}: {self._state_shapes(state)}. "
                             "Was the state made for another model?")
        return new

    def _apply_fused(self, gradient, parameter, state):
        """``apply_single`` as one compiled function: one fused pass over the parameter,
        its gradient and its state instead of one pass per term of the rule (eager
        Adam: 12). Inside a compiled step it is inlined, as any compiled function.

        The function's inputs are the gradient, the parameter, the parameter's state
        arrays and the optimizer's own (``step``, the learning rate and the other
        scheduled values, swapped into ``self.state`` while it traces), so a replay
        reads their current values. Plain hyper-parameters (``betas``, ``eps``, ...)
        are part of the key of the compiled function: changing one traces again. A
        rule that cannot be traced (it reads a value into Python) runs as it is. Only
        the rules of this module are fused: a subclass's own ``apply_single`` may draw
        random numbers or have side effects that one trace would freeze.
        """
        if not all(isinstance(v, mx.array) for v in state.values()):
            return self.apply_single(gradient, parameter, state)
        news = self._run_fused("one", [(gradient, parameter, state)])
        return self.apply_single(gradient, parameter, state) if news is None else news[0]

    def _apply_all_fused(self, gradients, parameters, state):
        """The update of every parameter as one compiled function (a GPU's "multi-tensor"
        update: one CUDA graph for the whole model, where :meth:`_apply_fused` replays one
        per parameter and small parameters run op by op). None where anything does not fit
        (a mismatched tree, a state that is not arrays, a rule that cannot be traced): the
        per-parameter path then runs, with its errors."""
        items = []

        def collect(path, gradient, parameter, st):
            if not isinstance(st, dict) or gradient.shape != parameter.shape or \
                    not all(isinstance(v, mx.array) for v in st.values()):
                raise _NotFused
            items.append((gradient, parameter, st))

        try:
            tree_map_with_path(collect, gradients, parameters, state)
        except Exception:  # noqa: BLE001 - whatever it is, the per-parameter path says it
            return None
        if not items:
            return None
        news = self._run_fused("all", items)
        if news is None or any(n.shape != p.shape for n, (_, p, _) in zip(news, items)):
            return None
        it = iter(news)
        return tree_map(lambda _: next(it), gradients)

    def _run_fused(self, kind: str, items: list):
        """The new parameters of ``items`` (``(gradient, parameter, state)``, the states
        dicts of arrays) from one compiled function of the rule over all of them, their
        states updated; None where the rule cannot be traced. The function is kept per
        ``kind`` (``"one"``: :meth:`_apply_fused`, ``"all"``: :meth:`_apply_all_fused`),
        optimizer state, the items' state keys and the plain hyper-parameters."""
        own, hyper = self._fusion_key
        locals_ = tuple(tuple(sorted(st)) for _, _, st in items)
        key = (kind, own, locals_, hyper)
        fused = self._fused_rules
        entry = fused.get(key)
        if entry is None:
            entry = fused[key] = self._fuse(own, locals_)
        if entry is _UNFUSABLE:
            return None
        function, written = entry
        try:
            news, values = function([g for g, _, _ in items], [p for _, p, _ in items],
                                    [[st[k] for k in keys] for (_, _, st), keys in zip(items, locals_)],
                                    [self._state[k] for k in own])
        except Exception:  # noqa: BLE001 - not traceable here: the plain rule runs (and
            fused[key] = _UNFUSABLE  # raises, with its own error, if the inputs are wrong)
            return None
        for (_, _, st), keys, vals in zip(items, written, values):
            st.update(zip(keys, vals))
        return news

    def _fuse(self, own: tuple, locals_: tuple):
        """``(compiled function, the state keys each parameter's rule writes)`` for
        :meth:`_run_fused`."""
        written: list = []

        def rule(gradients, parameters, local_values, own_values):
            saved = self._state
            self._state = dict(saved, **dict(zip(own, own_values)))
            try:
                news, outs, keys_out = [], [], []
                for g, p, keys, vals in zip(gradients, parameters, locals_, local_values):
                    st = dict(zip(keys, vals))
                    news.append(self.apply_single(g, p, st))
                    keys_out.append(sorted(st))
                    outs.append([st[k] for k in keys_out[-1]])
            finally:
                self._state = saved
            written[:] = keys_out
            return news, outs
        return mx.compile(rule), written

    @staticmethod
    def _state_shapes(state) -> str:
        if not isinstance(state, dict):
            return f"the state is {type(state).__name__}, not a dict"
        return "state shapes " + ", ".join(f"{k}: {_shape(v.shape)}" for k, v in state.items()
                                           if hasattr(v, "shape"))

    def _mismatch(self, gradients, parameters) -> Optional[TreeStructureError]:
        """The error for a gradient tree that the parameters or the state lack a path of
        (None when they hold every path)."""
        name = type(self).__name__
        for path, _ in tree_flatten(gradients):
            keys = path.split(".") if path else []
            if not _has_path(parameters, keys):
                return TreeStructureError(f"[{name}] The gradients hold '{path}' but the "
                                          "parameters do not.")
            if not _has_path(self._state, keys):
                return TreeStructureError(
                    f"[{name}] The gradients hold '{path}' but the optimizer state does "
                    "not: was the state made for another model? Set optimizer.state to a "
                    "matching tree, or call optimizer.init(parameters).")
        return None

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict) -> mx.array:
        """The updated ``parameter``; writes its new state into ``state``."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply_single"
                                  "(gradient, parameter, state)")

    @property
    def state(self) -> dict:
        """The optimizer's state: a tree of arrays (``step``, the hyper-parameters, and
        one dict per parameter)."""
        return self._state

    @state.setter
    def state(self, state: dict) -> None:
        # A new state may lack parameters: the next update creates their slots.
        self._initialized = False
        self._state = state

    @property
    def step(self) -> mx.array:
        """The number of updates done, a ``uint64`` scalar array."""
        return self._state["step"]

    @property
    def learning_rate(self) -> mx.array:
        return self._state["learning_rate"]

    @learning_rate.setter
    def learning_rate(self, learning_rate) -> None:
        self._state["learning_rate"] = mx.array(learning_rate)

    def _scheduled(self, name: str, schedule: Callable) -> mx.array:
        """``schedule`` at the current step, checked to be a scalar."""
        value = schedule(self.step)
        if not isinstance(value, mx.array):
            value = mx.array(value)
        if value.ndim != 0:
            raise ShapeError(f"[{type(self).__name__}] The schedule of '{name}' returned an "
                             f"array of shape {_shape(value.shape)}; a schedule must return "
                             "a scalar (shape ()).")
        return value

    def _maybe_schedule(self, name: str, value: Schedulable) -> None:
        """Store hyper-parameter ``name``: a number, or a schedule of the step."""
        if callable(value):
            self._schedulers[name] = value
            self._state[name] = self._scheduled(name, value)
        else:
            self._state[name] = mx.array(value)


def _check_beta(owner: str, which: str, beta: float) -> None:
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"{owner} {which} should be in [0, 1), {beta} was provided instead")


class SGD(Optimizer):
    r"""Stochastic gradient descent, with optional momentum and weight decay.

    .. math::

        g_{t} &= \nabla f(w_t) + \lambda w_t \\
        v_{t+1} &= \mu v_t + (1 - \tau) g_t \\
        w_{t+1} &= w_t - \eta \, (g_t + \mu v_{t+1} \text{ if nesterov else } v_{t+1})

    Args:
        learning_rate (float or callable): :math:`\eta`.
        momentum (float): :math:`\mu`. Default: ``0``.
        weight_decay (float): :math:`\lambda` (L2 penalty). Default: ``0``.
        dampening (float): :math:`\tau`. Default: ``0``.
        nesterov (bool): Nesterov momentum (needs a momentum and no dampening).
            Default: ``False``.
    """

    def __init__(self, learning_rate: Schedulable, momentum: float = 0.0,
                 weight_decay: float = 0.0, dampening: float = 0.0, nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening.")
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.dampening = dampening
        self.nesterov = nesterov

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * parameter
        lr = self.learning_rate.astype(gradient.dtype)
        if self.momentum <= 0:
            return parameter - lr * gradient
        v = self.momentum * state["v"]
        v = v + ((1 - self.dampening) * gradient if self.dampening > 0 else gradient)
        state["v"] = v
        update = gradient + self.momentum * v if self.nesterov else v
        return parameter - lr * update


class RMSprop(Optimizer):
    r"""RMSprop [Tieleman & Hinton, 2012]: divide by a running RMS of the gradients.

    .. math::

        v_{t+1} &= \alpha v_t + (1 - \alpha) g_t^2 \\
        w_{t+1} &= w_t - \eta \frac{g_t}{\sqrt{v_{t+1}} + \epsilon}

    Args:
        learning_rate (float or callable): :math:`\eta`.
        alpha (float): The smoothing constant :math:`\alpha`. Default: ``0.99``.
        eps (float): :math:`\epsilon`, added to the denominator. Default: ``1e-8``.
    """

    def __init__(self, learning_rate: Schedulable, alpha: float = 0.99, eps: float = 1e-8):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.alpha = alpha
        self.eps = eps
        if alpha < 0.0:
            raise ValueError(f"RMSprop alpha should be >=0, {alpha} was provided instead")
        if eps <= 0.0:
            raise ValueError(f"RMSprop epsilon should be >0, {eps} was provided instead")

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        v = self.alpha * state["v"] + (1 - self.alpha) * mx.square(gradient)
        state["v"] = v
        return parameter - lr * gradient / (mx.sqrt(v) + self.eps)


class Adagrad(Optimizer):
    r"""Adagrad [Duchi et al., 2011]: divide by the root of the summed squared gradients.

    .. math::

        v_{t+1} &= v_t + g_t^2 \\
        w_{t+1} &= w_t - \eta \frac{g_t}{\sqrt{v_{t+1}} + \epsilon}

    Args:
        learning_rate (float or callable): :math:`\eta`.
        eps (float): :math:`\epsilon`, added to the denominator. Default: ``1e-8``.
    """

    def __init__(self, learning_rate: Schedulable, eps: float = 1e-8):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.eps = eps
        if eps <= 0.0:
            raise ValueError(f"Adagrad epsilon should be >0, {eps} was provided instead")

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        v = state["v"] + mx.square(gradient)
        state["v"] = v
        return parameter - lr * gradient / (mx.sqrt(v) + self.eps)


class AdaDelta(Optimizer):
    r"""AdaDelta [Zeiler, 2012]: steps scaled by the ratio of two running RMS values.

    .. math::

        v_{t+1} &= \rho v_t + (1 - \rho) g_t^2 \\
        \Delta w_{t+1} &= \frac{\sqrt{u_t + \epsilon}}{\sqrt{v_{t+1} + \epsilon}} g_t \\
        u_{t+1} &= \rho u_t + (1 - \rho) \Delta w_{t+1}^2 \\
        w_{t+1} &= w_t - \eta \Delta w_{t+1}

    Args:
        learning_rate (float or callable): :math:`\eta`.
        rho (float): :math:`\rho`. Default: ``0.9``.
        eps (float): :math:`\epsilon`. Default: ``1e-6``.
    """

    def __init__(self, learning_rate: Schedulable, rho: float = 0.9, eps: float = 1e-6):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.rho = rho
        self.eps = eps
        if rho < 0.0:
            raise ValueError(f"AdaDelta rho should be >=0, {rho} was provided instead")
        if eps <= 0.0:
            raise ValueError(f"AdaDelta epsilon should be >0, {eps} was provided instead")

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)
        state["u"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        rho, eps = self.rho, self.eps
        v = rho * state["v"] + (1 - rho) * mx.square(gradient)
        d = mx.sqrt(state["u"] + eps) / mx.sqrt(v + eps) * gradient
        u = rho * state["u"] + (1 - rho) * mx.square(d)
        state["v"] = v
        state["u"] = u
        return parameter - lr * d


class Adam(Optimizer):
    r"""Adam [Kingma & Ba, 2015], without bias correction unless asked (as MLX).

    .. math::

        m_{t+1} &= \beta_1 m_t + (1 - \beta_1) g_t \\
        v_{t+1} &= \beta_2 v_t + (1 - \beta_2) g_t^2 \\
        w_{t+1} &= w_t - \eta \frac{m_{t+1}}{\sqrt{v_{t+1}} + \epsilon}

    With ``bias_correction``, :math:`\eta` becomes :math:`\eta / (1 - \beta_1^t)` and
    :math:`\sqrt{v}` becomes :math:`\sqrt{v / (1 - \beta_2^t)}`.

    Args:
        learning_rate (float or callable): :math:`\eta`.
        betas (Tuple[float, float]): :math:`(\beta_1, \beta_2)`. Default: ``(0.9, 0.999)``.
        eps (float): :math:`\epsilon`. Default: ``1e-8``.
        bias_correction (bool): Correct the moments' bias towards 0. Default: ``False``.
    """

    # The list defaults are MLX's signatures, spelled as MLX spells them; never mutated.
    def __init__(self, learning_rate: Schedulable, betas: List[float] = [0.9, 0.999],
                 eps: float = 1e-8, bias_correction: bool = False):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.betas = betas
        self.eps = eps
        self.bias_correction = bias_correction
        _check_beta("Adam", "beta1", betas[0])
        _check_beta("Adam", "beta2", betas[1])
        if eps < 0.0:
            raise ValueError(f"Adam epsilon should be >=0, {eps} was provided instead")

    def init_single(self, parameter, state):
        state["m"] = mx.zeros_like(parameter)
        state["v"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        b1, b2 = self.betas[0], self.betas[1]
        m = b1 * state["m"] + (1 - b1) * gradient
        v = b2 * state["v"] + (1 - b2) * mx.square(gradient)
        state["m"] = m
        state["v"] = v
        if self.bias_correction:
            step = self.step
            c1 = (lr / (1 - b1 ** step)).astype(gradient.dtype)
            c2 = mx.rsqrt(1 - b2 ** step).astype(gradient.dtype)
            return parameter - c1 * m / (mx.sqrt(v) * c2 + self.eps)
        return parameter - lr * m / (mx.sqrt(v) + self.eps)


class AdamW(Adam):
    r"""Adam with decoupled weight decay [Loshchilov & Hutter, 2019].

    .. math:: w_{t+1} = \text{Adam}(w_t (1 - \eta \lambda))

    Args:
        learning_rate (float or callable): :math:`\eta`.
        betas (Tuple[float, float]): :math:`(\beta_1, \beta_2)`. Default: ``(0.9, 0.999)``.
        eps (float): :math:`\epsilon`. Default: ``1e-8``.
        weight_decay (float): :math:`\lambda`. Default: ``0.01``.
        bias_correction (bool): As :class:`Adam`. Default: ``False``.
    """

    def __init__(self, learning_rate: Schedulable, betas: List[float] = [0.9, 0.999],
                 eps: float = 1e-8, weight_decay: float = 0.01, bias_correction: bool = False):
        super().__init__(learning_rate=learning_rate, betas=betas, eps=eps,
                         bias_correction=bias_correction)
        self.weight_decay = weight_decay

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        return super().apply_single(gradient, parameter * (1 - lr * self.weight_decay), state)


class Adamax(Adam):
    r"""Adamax [Kingma & Ba, 2015]: Adam with the infinity norm in place of :math:`v`.

    .. math::

        m_{t+1} &= \beta_1 m_t + (1 - \beta_1) g_t \\
        v_{t+1} &= \max(\beta_2 v_t, |g_t|) \\
        w_{t+1} &= w_t - \eta \frac{m_{t+1}}{v_{t+1} + \epsilon}

    Args:
        learning_rate (float or callable): :math:`\eta`.
        betas (Tuple[float, float]): :math:`(\beta_1, \beta_2)`. Default: ``(0.9, 0.999)``.
        eps (float): :math:`\epsilon`. Default: ``1e-8``.
    """

    def __init__(self, learning_rate: Schedulable, betas: List[float] = [0.9, 0.999],
                 eps: float = 1e-8):
        super().__init__(learning_rate, betas, eps)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        b1, b2 = self.betas[0], self.betas[1]
        m = b1 * state["m"] + (1 - b1) * gradient
        v = mx.maximum(b2 * state["v"], mx.abs(gradient))
        state["m"] = m
        state["v"] = v
        return parameter - lr * m / (v + self.eps)


class Lion(Optimizer):
    r"""Lion [Chen et al., 2023]: the sign of an interpolated momentum.

    .. math::

        c_{t+1} &= \beta_1 m_t + (1 - \beta_1) g_t \\
        m_{t+1} &= \beta_2 m_t + (1 - \beta_2) g_t \\
        w_{t+1} &= w_t (1 - \eta \lambda) - \eta \operatorname{sign}(c_{t+1})

    Use a learning rate 3-10x smaller than AdamW's and a weight decay 3-10x larger.

    Args:
        learning_rate (float or callable): :math:`\eta`.
        betas (Tuple[float, float]): :math:`(\beta_1, \beta_2)`. Default: ``(0.9, 0.99)``.
        weight_decay (float): :math:`\lambda`. Default: ``0``.
    """

    def __init__(self, learning_rate: Schedulable, betas: List[float] = [0.9, 0.99],
                 weight_decay: float = 0.0):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.betas = betas
        self.weight_decay = weight_decay
        _check_beta("Lion", "beta1", betas[0])
        _check_beta("Lion", "beta2", betas[1])

    def init_single(self, parameter, state):
        state["m"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        lr = self.learning_rate.astype(gradient.dtype)
        b1, b2 = self.betas[0], self.betas[1]
        m = state["m"]
        c = b1 * m + (1 - b1) * gradient
        state["m"] = b2 * m + (1 - b2) * gradient
        if self.weight_decay > 0:
            parameter = (1 - lr * self.weight_decay) * parameter
        return parameter - lr * mx.sign(c)


def _rms(x: mx.array) -> mx.array:
    return mx.sqrt(mx.mean(mx.square(x)))


class Adafactor(Optimizer):
    r"""Adafactor [Shazeer & Stern, 2018]: Adam's second moment factored into row and
    column averages for matrices (sublinear memory), relative step sizes by default.

    For a gradient of 2 or more dimensions the state keeps ``exp_avg_sq_row`` (the last
    axis averaged) and ``exp_avg_sq_col`` (the second to last averaged); otherwise
    ``exp_avg_sq``; with ``beta_1``, also ``exp_avg``. The step size is
    ``max(eps[1], rms(w)) * min(1e-2, 1 / sqrt(t))`` (``relative_step``,
    ``scale_parameter``) or the learning rate; the decay of the second moment is
    :math:`1 - t^{\text{decay\_rate}}`; the update is clipped to an RMS of
    ``clip_threshold``.

    Args:
        learning_rate (float or callable, optional): Used when ``relative_step`` is
            ``False``. Default: ``None``.
        eps (Tuple[float, float]): Added to the squared gradient, and the floor of the
            parameter scale. Default: ``(1e-30, 1e-3)``.
        clip_threshold (float): The RMS the update is clipped to. Default: ``1.0``.
        decay_rate (float): The exponent of the second moment's decay. Default: ``-0.8``.
        beta_1 (float, optional): Keep a first moment with this decay. Default: ``None``.
        weight_decay (float): Default: ``0``.
        scale_parameter (bool): Scale the step by the parameter's RMS. Default: ``True``.
        relative_step (bool): The step size from the step count, not the learning rate.
            Default: ``True``.
        warmup_init (bool): Grow the relative step from ``1e-6 * t``. Default: ``False``.
    """

    def __init__(self, learning_rate: Optional[Schedulable] = None,
                 eps: Tuple[float, float] = (1e-30, 1e-3), clip_threshold: float = 1.0,
                 decay_rate: float = -0.8, beta_1: Optional[float] = None,
                 weight_decay: float = 0.0, scale_parameter: bool = True,
                 relative_step: bool = True, warmup_init: bool = False):
        super().__init__()
        if learning_rate is not None:
            self._maybe_schedule("learning_rate", learning_rate)
        elif not relative_step:
            raise ValueError("Adafactor needs a learning_rate when relative_step=False.")
        self.eps = eps
        self.clip_threshold = clip_threshold
        self.decay_rate = decay_rate
        self.beta_1 = beta_1
        self.weight_decay = weight_decay
        self.scale_parameter = scale_parameter
        self.relative_step = relative_step
        self.warmup_init = warmup_init

    def init_single(self, parameter, state):
        if parameter.ndim >= 2:
            shape = parameter.shape
            state["exp_avg_sq_row"] = mx.zeros(shape[:-1], dtype=parameter.dtype)
            state["exp_avg_sq_col"] = mx.zeros(shape[:-2] + shape[-1:], dtype=parameter.dtype)
        else:
            state["exp_avg_sq"] = mx.zeros_like(parameter)
        if self.beta_1 is not None:
            state["exp_avg"] = mx.zeros_like(parameter)

    def _step_size(self, step, parameter_rms):
        if self.relative_step:
            floor = 1e-6 * step if self.warmup_init else 1e-2
            size = mx.minimum(floor, mx.rsqrt(step))
        else:
            size = self.learning_rate
        size = size.astype(parameter_rms.dtype)
        if self.scale_parameter:
            return mx.maximum(self.eps[1], parameter_rms) * size
        return size

    def apply_single(self, gradient, parameter, state):
        step = self.step
        parameter_rms = _rms(parameter)
        lr = self._step_size(step, parameter_rms)
        beta_2 = 1.0 - (step ** self.decay_rate).astype(parameter_rms.dtype)
        update = mx.square(gradient) + self.eps[0]
        if gradient.ndim >= 2:
            row = beta_2 * state["exp_avg_sq_row"] + (1 - beta_2) * mx.mean(update, axis=-1)
            col = beta_2 * state["exp_avg_sq_col"] + (1 - beta_2) * mx.mean(update, axis=-2)
            state["exp_avg_sq_row"] = row
            state["exp_avg_sq_col"] = col
            # The rank-1 estimate of 1/sqrt(E[g^2]) from the row and column means.
            r = mx.rsqrt(row / mx.mean(row, axis=-1, keepdims=True))
            c = mx.rsqrt(col)
            update = mx.matmul(mx.expand_dims(r, -1), mx.expand_dims(c, -2)) * gradient
        else:
            v = beta_2 * state["exp_avg_sq"] + (1 - beta_2) * update
            state["exp_avg_sq"] = v
            update = mx.rsqrt(v) * gradient
        update = update / mx.maximum(1.0, _rms(update) / self.clip_threshold)
        update = lr * update
        if self.beta_1 is not None:
            update = self.beta_1 * state["exp_avg"] + (1 - self.beta_1) * update
            state["exp_avg"] = update
        if self.weight_decay != 0:
            parameter = parameter + parameter * (-self.weight_decay * lr)
        return parameter - update


class Muon(Optimizer):
    r"""Muon [Jordan et al., 2024]: momentum SGD whose update of each matrix is
    orthogonalised by Newton-Schulz iterations.

    The momentum update :math:`u` (Nesterov by default) of a parameter of 2 or more
    dimensions (flattened to ``(shape[0], -1)``) is replaced by the orthogonal factor of
    its polar decomposition, approximated by ``ns_steps`` quintic Newton-Schulz steps, and
    scaled by :math:`\sqrt{\max(1, \text{rows}/\text{cols})}`; vectors get plain momentum.

    Args:
        learning_rate (float or callable): :math:`\eta`.
        momentum (float): Default: ``0.95``.
        weight_decay (float): L2 penalty added to the gradient. Default: ``0.01``.
        nesterov (bool): Default: ``True``.
        ns_steps (int): Newton-Schulz iterations. Default: ``5``.
    """

    def __init__(self, learning_rate: Schedulable, momentum: float = 0.95,
                 weight_decay: float = 0.01, nesterov: bool = True, ns_steps: int = 5):
        super().__init__()
        self._maybe_schedule("learning_rate", learning_rate)
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.ns_steps = ns_steps

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)

    @staticmethod
    def _orthogonalize(x: mx.array, steps: int) -> mx.array:
        # The quintic's coefficients maximise the slope at 0 while keeping the iteration
        # inside [0.7, 1.2] for singular values in (0, 1] (Jordan et al.).
        a, b, c = 3.4445, -4.7750, 2.0315
        tall = x.shape[-2] > x.shape[-1]
        if tall:
            x = x.T
        x = x / (mx.linalg.norm(x, keepdims=True) + 1e-7)
        for _ in range(steps):
            s = x @ x.T
            p = mx.addmm(b * s, s, s, beta=1.0, alpha=c)
            x = mx.addmm(a * x, p, x, beta=1.0, alpha=1.0)
        return x.T if tall else x

    def apply_single(self, gradient, parameter, state):
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * parameter
        mu = self.momentum
        v = mu * state["v"] + (1 - mu) * gradient
        state["v"] = v
        update = gradient * (1 - mu) + v * mu if self.nesterov else v
        lr = self.learning_rate.astype(gradient.dtype)
        if update.ndim >= 2:
            shape = update.shape
            flat = update.reshape(shape[0], -1) if update.ndim > 2 else update
            update = self._orthogonalize(flat, self.ns_steps).reshape(shape)
            lr = lr * max(1, update.shape[-2] / update.shape[-1]) ** 0.5
        return parameter - lr * update


class MultiOptimizer(Optimizer):
    """Different optimizers for different parameters.

    A parameter goes to the first optimizer whose filter accepts it
    (``filter(path, gradient) -> bool``, ``path`` the dotted key such as
    ``"layers.0.weight"``), and to the last optimizer when none does.

    Args:
        optimizers (list(Optimizer)): The optimizers.
        filters (list(callable)): ``len(optimizers) - 1`` filters.

    Example:
        >>> opt = MultiOptimizer([Adam(1e-3), SGD(1e-2)],
        ...                      [lambda path, g: path.endswith("bias")])
    """

    def __init__(self, optimizers, filters: list = []):
        super().__init__()
        if len(filters) != len(optimizers) - 1:
            raise ValueError(f"Given {len(filters)} filters but {len(optimizers) - 1} needed.")
        self.optimizers = optimizers
        self.filters = filters

    def _split(self, tree) -> list:
        """``tree`` cut into one tree per optimizer, by the filters."""
        if len(self.optimizers) == 1:
            return [tree]
        parts = [[] for _ in self.optimizers]
        for path, g in tree_flatten(tree):
            for i, accept in enumerate(self.filters):
                if accept(path, g):
                    parts[i].append((path, g))
                    break
            else:
                parts[-1].append((path, g))
        return [tree_unflatten(p) for p in parts]

    def init(self, parameters) -> None:
        for optimizer, part in zip(self.optimizers, self._split(parameters)):
            optimizer.init(part)

    def apply_gradients(self, gradients, parameters):
        tree = {}
        for optimizer, part in zip(self.optimizers, self._split(gradients)):
            tree = tree_merge(tree, optimizer.apply_gradients(part, parameters))
        return tree

    @property
    def state(self) -> dict:
        return {"states": [o.state for o in self.optimizers]}

    @state.setter
    def state(self, state: dict) -> None:
        if "states" not in state or len(state["states"]) != len(self.optimizers):
            raise ValueError("Invalid state provided")
        for optimizer, s in zip(self.optimizers, state["states"]):
            optimizer.state = s

    @property
    def learning_rate(self) -> mx.array:
        return self.optimizers[0].learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate) -> None:
        for optimizer in self.optimizers:
            optimizer.learning_rate = learning_rate


def clip_grad_norm(grads, max_norm: float):
    """Scale ``grads`` so that their global L2 norm is at most ``max_norm``.

    Args:
        grads (dict): A tree of gradients.
        max_norm (float): The largest norm allowed.

    Returns:
        ``(clipped_grads, total_norm)``: the scaled tree, and the norm before clipping.

    Example:
        >>> grads = {"w1": mx.array([2, 3]), "w2": mx.array([1])}
        >>> clipped, norm = clip_grad_norm(grads, max_norm=2.0)
    """
    total = mx.sqrt(tree_reduce(lambda acc, g: acc + mx.sum(mx.square(g)), grads, 0.0))
    scale = mx.minimum(max_norm / (total + 1e-6), 1.0)
    return tree_map(lambda g: g * scale, grads), total


#: The ``apply_single`` of every optimizer of this module: the rules
#: :meth:`Optimizer._apply_fused` may compile (pure functions of their inputs).
_BUILT_IN_RULES = frozenset(
    cls.apply_single for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, Optimizer) and cls.__module__ == __name__
    and cls.apply_single is not Optimizer.apply_single)
