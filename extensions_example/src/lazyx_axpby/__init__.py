"""lazyx-axpby: MLX's Axpby extension example as a lazyx op pack.

    >>> import lazyx.core as mx
    >>> mx.ext.axpby(mx.array([1.0, 2.0]), mx.array([3.0, 4.0]), 2.0, 1.0)   # via the entry point
    >>> from lazyx_axpby import axpby                                         # or directly
"""

# Load lazyx's plugins (this package's among them) before the modules below, so
# that importing this package first registers it exactly once.
import lazyx.core  # noqa: F401

from .ops import Axpby, axpby  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Axpby", "axpby"]
