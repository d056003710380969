"""A third-party lazyx backend: ``counting`` runs the ``cpu`` backend's kernels and
counts how many times each primitive's kernel is launched.

It is installed with a real entry point (``[project.entry-points.lazyx]``) and
chosen like any backend::

    import lazyx.core as mx

    with mx.use_backend("cpu", "counting") as counting:
        counting.reset()
        mx.eval(mx.exp(x) + x)
    counting.launches        # Counter({'Exp': 1, 'Add': 1})

Everything but the kernels (buffers, memory figures, the floating-point error
state an evaluation runs in) is the wrapped backend's.
"""

from __future__ import annotations

import collections

from lazyx.extend import Backend, DeviceType, backends, hookimpl, resolve_kernel

__all__ = ["CountingBackend"]


class CountingBackend(Backend):
    """Runs backend ``wrapped``'s kernels and counts the launches by primitive name.

    Attributes:
        launches (collections.Counter): primitive name -> kernels launched.
    """

    name = "counting"
    device_type = DeviceType.cpu

    def __init__(self, wrapped: str = "cpu"):
        super().__init__()
        self.wrapped_name = wrapped
        self.launches = collections.Counter()

    @property
    def wrapped(self) -> Backend:
        return backends()[self.wrapped_name]

    def reset(self) -> None:
        """Forget the launches counted so far."""
        self.launches.clear()

    # Called once per primitive class, then cached by the dispatch table: a
    # plugin's override for "cpu" is followed too, and so is a primitive's eval_cpu.
    def find_kernel(self, cls):
        inner, _ = resolve_kernel(self.wrapped, cls)
        launches = self.launches
        name = cls.name

        def counted(prim, inputs):
            launches[name] += 1
            return inner(prim, inputs)

        counted.missing = getattr(inner, "missing", False)
        return counted

    def is_available(self) -> bool:
        return self.wrapped.is_available()

    def unavailable_reason(self) -> str:
        return self.wrapped.unavailable_reason()

    def describe(self) -> str:
        return f"wraps {self.wrapped_name!r}; {sum(self.launches.values())} launches counted"

    # Everything else is the wrapped backend's.
    def enter_eval(self):
        return self.wrapped.enter_eval()

    def exit_eval(self, token) -> None:
        self.wrapped.exit_eval(token)

    def is_buffer(self, obj) -> bool:
        return self.wrapped.is_buffer(obj)

    def to_host(self, buf):
        return self.wrapped.to_host(buf)

    def from_host(self, data):
        return self.wrapped.from_host(data)

    def synchronize(self, stream) -> None:
        self.wrapped.synchronize(stream)

    def memory_stats(self) -> dict:
        return self.wrapped.memory_stats()

    def reset_peak_memory(self) -> None:
        self.wrapped.reset_peak_memory()

    def clear_cache(self) -> None:
        self.wrapped.clear_cache()

    def set_memory_limit(self, limit: int) -> int:
        return self.wrapped.set_memory_limit(limit)

    def set_cache_limit(self, limit: int) -> int:
        return self.wrapped.set_cache_limit(limit)


@hookimpl
def lazyx_backends():
    return [CountingBackend()]
