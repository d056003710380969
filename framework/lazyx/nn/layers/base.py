"""``Module``: a layer is a dict of its parameters and its child layers (``mlx.nn.Module``).

Assigning an array, dict, list or tuple to a module attribute stores it as a dict
entry; everything else (sizes, flags, the private ``_training`` and ``_no_grad``) is
an ordinary attribute. So a model *is* a tree of plain Python data, and every tree
operation of :mod:`lazyx.utils` applies to it.

The flow of the tree operations:

- :meth:`Module.filter_and_map` walks the dict entries (into child modules, dicts and
  lists) keeping the entries a filter accepts and mapping the leaves. ``parameters``,
  ``trainable_parameters``, ``children`` and ``leaf_modules`` are that walk with
  different filters; the dotted key seen by a filter inside a nested dict or list is
  its path from the owning module (``"layers.0"``), which is also how ``freeze`` names
  the parameters it stops.
- :meth:`Module.update` / :meth:`Module.update_modules` write a (partial) tree back.
- ``load_weights`` / ``save_weights`` go through ``lazyx.core.load`` / ``savez`` /
  ``save_safetensors`` with the flattened keys (``"layers.0.weight"``), so weights saved
  by MLX load here and back.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any, Callable, List, Optional, Tuple, Union

import lazyx.core as mx
from lazyx.errors import ArgumentError, LazyxError, ShapeError
from lazyx.utils import tree_flatten, tree_unflatten

__all__ = ["Module"]


class ModuleKeyError(LazyxError, KeyError):
    """A key named to ``freeze``/``unfreeze`` that no module holds (MLX raises ``KeyError``)."""


def _write_tree(dst, src, strict: bool, leaf_type: type, method: str, noun: str,
                where: str = "") -> None:
    """Write the ``leaf_type`` leaves of the tree ``src`` into the same places of ``dst``
    (a module's dicts and lists), in place; ``update`` and ``update_modules`` are this
    walk for arrays and for modules."""
    if isinstance(src, dict):
        entries = src.items()
    elif isinstance(src, list):
        entries = enumerate(src)
    else:
        raise ArgumentError(f"{method}: expected a dict or list at '{where or '<root>'}', "
                            f"got {type(src).__name__}")
    for k, new in entries:
        path = f"{where}.{k}" if where else str(k)
        if isinstance(dst, dict):
            present = k in dst
        else:
            present = isinstance(dst, list) and isinstance(k, int) and k < len(dst)
        if not present:
            if strict:
                raise ArgumentError(f'Module does not have {noun} named "{path}".')
            continue
        if isinstance(new, leaf_type):
            dst[k] = new
        elif isinstance(new, (dict, list)):
            _write_tree(dst[k], new, strict, leaf_type, method, noun, path)
        else:
            raise ArgumentError(
                f"{method}: received invalid type {type(new).__name__} for {noun} '{path}'; "
                f"expected {'an array' if leaf_type is not Module else 'a Module'} "
                "(or a dict/list of them)")


def _default_is_leaf(module, key, value) -> bool:
    return not isinstance(value, (Module, dict, list))


class Module(dict):
    """The base class of every layer: a dict of parameters (arrays) and child modules.

    Subclasses call ``super().__init__()`` first, then assign parameters and layers as
    attributes (``self.weight = mx.zeros((4, 3))``, ``self.layers = [Linear(3, 3)]``) and
    define ``__call__``. A module is in training mode after construction (see
    :meth:`train`, :meth:`eval`), and all its parameters are trainable until frozen.

    Example:
        >>> class MLP(Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layers = [nn.Linear(2, 8), nn.Linear(8, 1)]
        ...     def __call__(self, x):
        ...         return self.layers[1](mx.maximum(self.layers[0](x), 0))
    """

    __call__: Callable

    def __init__(self):
        self._no_grad = set()
        self._training = True

    # -- attribute access: parameters and children live in the dict ---------------

    def __getattr__(self, key: str):
        if key in self:
            return self[key]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")

    def __setattr__(self, key: str, value: Any):
        if isinstance(value, (mx.array, dict, list, tuple)):
            if key in self.__dict__:
                object.__delattr__(self, key)
            self[key] = value
        else:
            if key in self:
                del self[key]
            object.__setattr__(self, key, value)

    def __delattr__(self, key: str):
        if key in self:
            del self[key]
        else:
            object.__delattr__(self, key)

    # dict's equality would compare arrays element-wise; modules are equal by identity
    # (and hashable, so a module can key a cache or sit in a set).
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    # -- mode and state ----------------------------------------------------------

    @property
    def training(self) -> bool:
        """Whether the module is in training mode (dropout active, batch statistics)."""
        return self._training

    @property
    def state(self) -> "Module":
        """The module's whole state: the module itself (a dict of arrays and children),
        for ``mx.compile(..., inputs=state, outputs=state)``."""
        return self

    def _set_training_mode(self, mode: bool) -> None:
        self._training = mode

    def train(self, mode: bool = True) -> "Module":
        """Set this module and every descendant to training (``mode=True``) or evaluation mode.

        Returns:
            The module itself.
        """
        self.apply_to_modules(lambda _, m: m._set_training_mode(mode))
        return self

    def eval(self) -> "Module":
        """Set this module and every descendant to evaluation mode; returns the module."""
        return self.train(False)

    def _extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = tree_flatten(self.children(), is_leaf=self.is_module)
        text = f"{type(self).__name__}({self._extra_repr()}"
        for key, child in children:
            text += "\n" + textwrap.indent(f"({key}): {child!r}", "  ")
        if children:
            text += "\n"
        return text + ")"

    # -- filters -------------------------------------------------------------------

    @staticmethod
    def is_module(value: Any) -> bool:
        return isinstance(value, Module)

    @staticmethod
    def valid_child_filter(module: "Module", key: str, value: Any) -> bool:
        return isinstance(value, (dict, list))

    @staticmethod
    def valid_parameter_filter(module: "Module", key: str, value: Any) -> bool:
        return isinstance(value, (dict, list, mx.array)) and not key.startswith("_")

    @staticmethod
    def trainable_parameter_filter(module: "Module", key: str, value: Any) -> bool:
        return Module.valid_parameter_filter(module, key, value) and key not in module._no_grad

    def filter_and_map(
        self,
        filter_fn: Callable[["Module", str, Any], bool],
        map_fn: Optional[Callable] = None,
        is_leaf_fn: Optional[Callable[["Module", str, Any], bool]] = None,
    ) -> dict:
        """The sub-tree of entries that ``filter_fn(module, key, value)`` keeps, with
        ``map_fn`` applied to its leaves.

        The walk enters child modules, dicts and lists; ``is_leaf_fn(module, key, value)``
        stops it (default: anything that is not a module, dict or list). Inside a dict or
        list, ``key`` is the dotted path from the owning module; entries a filter rejects
        there stay as empty dicts so list positions are kept.

        Args:
            filter_fn (callable): Keeps an entry.
            map_fn (callable, optional): Maps a leaf. Default: identity.
            is_leaf_fn (callable, optional): Stops the walk at an entry.

        Returns:
            A dict tree.
        """
        map_fn = map_fn or (lambda x: x)
        is_leaf_fn = is_leaf_fn or _default_is_leaf

        def unwrap(owner, key, value):
            if is_leaf_fn(owner, key, value):
                return map_fn(value)
            if isinstance(value, Module):
                return {k: unwrap(value, k, v) for k, v in value.items() if filter_fn(value, k, v)}
            if isinstance(value, dict):
                out = {}
                for k, v in value.items():
                    path = f"{key}.{k}"
                    out[k] = unwrap(owner, path, v) if filter_fn(owner, path, v) else {}
                return out
            if isinstance(value, list):
                out = []
                for i, v in enumerate(value):
                    path = f"{key}.{i}"
                    out.append(unwrap(owner, path, v) if filter_fn(owner, path, v) else {})
                return out
            raise ArgumentError(
                f"Module.filter_and_map: unexpected value of type {type(value).__name__} at "
                f"'{key}'; is_leaf_fn must accept everything that is not a module, dict or list"
            )

        return {k: unwrap(self, k, v) for k, v in self.items() if filter_fn(self, k, v)}

    # -- views of the tree ---------------------------------------------------------

    def parameters(self) -> dict:
        """Every array of the module and its descendants, as a nested dict (lists kept)."""
        return self.filter_and_map(self.valid_parameter_filter)

    def trainable_parameters(self) -> dict:
        """The parameters that are not frozen (see :meth:`freeze`)."""
        return self.filter_and_map(self.trainable_parameter_filter)

    def children(self) -> dict:
        """The direct child modules, in the dicts and lists that hold them."""
        return self.filter_and_map(self.valid_child_filter, is_leaf_fn=lambda m, k, v: isinstance(v, Module))

    def leaf_modules(self) -> dict:
        """The descendant modules that have no child modules, in their containers."""

        def is_leaf_module(m, k, v):
            return isinstance(v, Module) and not tree_flatten(v.children(), is_leaf=self.is_module)

        return self.filter_and_map(self.valid_child_filter, is_leaf_fn=is_leaf_module)

    def named_modules(self) -> List[Tuple[str, "Module"]]:
        """``(dotted_path, module)`` for this module (path ``""``) and every descendant.

        The order is a depth-first walk that visits the last child first, as MLX's.
        """
        found = []
        stack = [("", self)]
        while stack:
            prefix, module = stack.pop()
            found.append((prefix, module))
            for key, child in tree_flatten(module.children(), is_leaf=self.is_module):
                stack.append((f"{prefix}.{key}" if prefix else key, child))
        return found

    def modules(self) -> List["Module"]:
        """This module and every descendant, in :meth:`named_modules` order."""
        return [m for _, m in self.named_modules()]

    # -- writing the tree back -------------------------------------------------------

    def update(self, parameters: dict, strict: bool = True) -> "Module":
        """Replace parameters with the arrays of a (partial) tree of the same structure.

        Args:
            parameters (dict): A tree as returned by :meth:`parameters`; it may hold a
                subset of the parameters.
            strict (bool): Raise for a key the module does not have. Default: ``True``.

        Returns:
            The module itself.
        """

        _write_tree(self, parameters, strict, mx.array, "Module.update", "parameter")
        return self

    def update_modules(self, modules: dict, strict: bool = True) -> "Module":
        """Replace child modules with those of a (partial) tree of the same structure.

        Args:
            modules (dict): A tree as returned by :meth:`children` or :meth:`leaf_modules`.
            strict (bool): Raise for a key the module does not have. Default: ``True``.

        Returns:
            The module itself.
        """

        _write_tree(self, modules, strict, Module, "Module.update_modules", "sub-module")
        return self

    def apply(
        self,
        map_fn: Callable[[Any], Any],
        filter_fn: Optional[Callable[["Module", str, Any], bool]] = None,
    ) -> "Module":
        """Map the parameters (those ``filter_fn`` keeps) in place: ``p = map_fn(p)``.

        Example:
            >>> model.apply(lambda p: p.astype(mx.float16))
        """
        filter_fn = filter_fn or self.valid_parameter_filter
        self.update(self.filter_and_map(filter_fn, map_fn))
        return self

    def apply_to_modules(self, apply_fn: Callable[[str, "Module"], Any]) -> "Module":
        """Call ``apply_fn(path, module)`` on this module and every descendant."""
        for prefix, module in self.named_modules():
            apply_fn(prefix, module)
        return self

    def set_dtype(
        self,
        dtype,
        predicate: Optional[Callable[[Any], bool]] = lambda t: mx.issubdtype(t, mx.floating),
    ) -> None:
        """Cast the parameters whose dtype ``predicate`` accepts (default: floating) to ``dtype``."""
        predicate = predicate or (lambda _: True)
        self.apply(lambda p: p.astype(dtype) if predicate(p.dtype) else p)

    # -- freezing --------------------------------------------------------------------

    def _set_frozen(self, change: Callable, recurse: bool, keys, strict: bool) -> "Module":
        """``change(module, keys)`` on this module (and its descendants with ``recurse``),
        after checking with ``strict`` that some such module holds each key."""
        keys = [keys] if isinstance(keys, str) else keys
        owners = self.modules() if recurse else [self]
        for key in (keys if strict and keys is not None else ()):
            if not any(key in m for m in owners):
                holder = "module in the tree" if recurse else type(self).__name__
                raise ModuleKeyError(
                    f"Module doesn't contain member {key}: no {holder} holds an entry named "
                    f"'{key}' (keys name a module's own entries, e.g. 'weight')")
        for module in owners:
            change(module, keys)
        return self

    def freeze(
        self,
        *,
        recurse: bool = True,
        keys: Optional[Union[str, List[str]]] = None,
        strict: bool = False,
    ) -> "Module":
        """Stop parameters from being trainable (they leave :meth:`trainable_parameters`).

        Args:
            recurse (bool): Freeze the descendants too. Default: ``True``.
            keys (str or list[str], optional): Freeze only these entries (of every module
                visited); default: all of the module's own parameters.
            strict (bool): Raise ``KeyError`` for a key no visited module holds.

        Returns:
            The module itself.
        """
        def freeze_one(module, keys):
            if keys is None:
                own = module.filter_and_map(
                    lambda m, k, v: not isinstance(v, Module) and m.valid_parameter_filter(m, k, v))
                keys = [k for k, _ in tree_flatten(own)]
            module._no_grad.update(keys)

        return self._set_frozen(freeze_one, recurse, keys, strict)

    def unfreeze(
        self,
        *,
        recurse: bool = True,
        keys: Optional[Union[str, List[str]]] = None,
        strict: bool = False,
    ) -> "Module":
        """Make frozen parameters trainable again; the arguments are :meth:`freeze`'s."""
        def unfreeze_one(module, keys):
            if keys is None:
                module._no_grad.clear()
            else:
                module._no_grad.difference_update(keys)

        return self._set_frozen(unfreeze_one, recurse, keys, strict)

    # -- weights on disk -------------------------------------------------------------

    def load_weights(
        self,
        file_or_weights: Union[str, List[Tuple[str, Any]]],
        strict: bool = True,
    ) -> "Module":
        """Set the parameters from a ``.npz``/``.safetensors`` file or ``(key, array)`` pairs.

        Keys are dotted paths as :func:`lazyx.utils.tree_flatten` makes them
        (``"layers.0.weight"``).

        Args:
            file_or_weights (str or list): A path, or a list of ``(key, array)`` pairs.
            strict (bool): Require exactly the model's keys, each with the model's shape
                (dtypes may differ). Default: ``True``. Otherwise matching keys are set
                and the others ignored.

        Returns:
            The module itself.
        """
        weights = file_or_weights
        if isinstance(weights, (str, os.PathLike)):
            weights = list(mx.load(os.fspath(weights)).items())
        else:
            weights = list(weights)

        if strict:
            given = dict(weights)
            current = tree_flatten(self.parameters(), destination={})
            extra = sorted(given.keys() - current.keys())
            if extra:
                raise ArgumentError(
                    f"Module.load_weights: received {len(extra)} parameters not in the model: "
                    f"{', '.join(extra)} (pass strict=False to ignore them)")
            missing = sorted(current.keys() - given.keys())
            if missing:
                raise ArgumentError(
                    f"Module.load_weights: missing {len(missing)} parameters: "
                    f"{', '.join(missing)} (pass strict=False to load a subset)")
            for key, have in current.items():
                new = given[key]
                if not isinstance(new, mx.array):
                    raise ArgumentError(
                        f"Module.load_weights: expected an array for parameter {key}, "
                        f"got {type(new).__name__}")
                if tuple(new.shape) != tuple(have.shape):
                    raise ShapeError(
                        f"Module.load_weights: expected shape {tuple(have.shape)} but received "
                        f"shape {tuple(new.shape)} for parameter {key}")
        if weights:
            self.update(tree_unflatten(weights), strict=False)
        return self

    def save_weights(self, file: str) -> None:
        """Save the parameters to ``file`` (``.npz`` or ``.safetensors``) under dotted keys."""
        file = os.fspath(file)
        flat = tree_flatten(self.parameters(), destination={})
        if file.endswith(".npz"):
            mx.savez(file, **flat)
        elif file.endswith(".safetensors"):
            mx.save_safetensors(file, flat)
        else:
            raise ArgumentError(
                f"Module.save_weights: unsupported file extension for {file}; use '.npz' "
                "or '.safetensors'")
