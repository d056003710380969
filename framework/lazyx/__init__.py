"""lazyx: a lazy array framework with the programming model of MLX, built from plugins.

``import lazyx.core as mx`` is the array API and ``lazyx.extend`` the door for
authors of primitives, op packs, kernels and backends (see ``lazyx.hookspecs`` for
what a plugin can do). ``lazyx.nn``, ``lazyx.optimizers`` and ``lazyx.utils`` are
planned beside them.
"""

__version__ = "0.1.0"

from .hookspecs import hookimpl  # noqa: E402,F401
