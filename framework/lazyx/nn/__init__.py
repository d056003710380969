"""``lazyx.nn``: neural-network layers, losses and initialisers (``mlx.nn``).

Layers come from :mod:`lazyx.nn.layers` (one topic module each, ``Module`` in
``layers/base.py``); ``losses`` and ``init`` are submodules; :mod:`lazyx.nn.utils`
holds the module-level transforms (``value_and_grad``, ``checkpoint``,
``average_gradients``, ``quantize``). Everything sits on ``lazyx.core`` like user code.
"""

import importlib as _importlib
import importlib.util as _importlib_util

from . import layers
from .layers import *  # noqa: F401,F403
from .utils import average_gradients, checkpoint, quantize, value_and_grad

# losses and init are written alongside the layers; import them once they exist.
for _sub in ("init", "losses"):
    if _importlib_util.find_spec(f"{__name__}.{_sub}") is not None:
        globals()[_sub] = _importlib.import_module(f"{__name__}.{_sub}")
del _sub
