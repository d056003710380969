"""lazyx: a lazy array framework with the programming model of MLX, built from plugins.

``import lazyx.core as mx`` is the array API and ``lazyx.extend`` the door for
authors of primitives, op packs, kernels and backends (see ``lazyx.hookspecs`` for
what a plugin can do). ``lazyx.nn``, ``lazyx.optimizers`` and ``lazyx.utils`` are
planned beside them.
"""

__version__ = "0.1.0"

from .hookspecs import hookimpl  # noqa: E402,F401

import os as _os  # noqa: E402

if _os.environ.get("LAZYX_LOG"):  # logging (a few ms to import) loads only when asked for
    from . import log as _log  # noqa: E402
    _log.configure()
