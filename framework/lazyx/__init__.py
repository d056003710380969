"""lazyx: a lazy array framework with the programming model of MLX, built from plugins.

``import lazyx.core as mx`` is the array API; ``lazyx.nn``, ``lazyx.optimizers``
and ``lazyx.utils`` sit beside it. See ``lazyx.hookspecs`` for what a plugin can do.
"""

__version__ = "0.1.0"

from .hookspecs import hookimpl  # noqa: E402,F401
