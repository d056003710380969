"""A second plugin of the same distribution: it overrides one kernel of a backend.

Through the ``lazyx_kernels`` hook it gives ``Subtract`` on the ``counting``
backend its own kernel. A plugin's override wins over the backend's own kernel
(here ``cpu``'s, counted in ``launches``), so ``x - y`` on ``counting`` runs this
kernel instead: it counts itself in ``RUNS`` and computes with the ``cpu``
backend's kernel. ``lazyx.core.kernel_provider("counting", "Subtract")`` names
this plugin.
"""

from __future__ import annotations

import collections

from lazyx.extend import backends, hookimpl, primitive_class, resolve_kernel

RUNS = collections.Counter()


def subtract(prim, inputs):
    RUNS["Subtract"] += 1
    return resolve_kernel(backends()["cpu"], type(prim))[0](prim, inputs)


@hookimpl
def lazyx_kernels():
    # The built-in packs are registered before any other plugin's hooks run.
    return [("counting", primitive_class("Subtract"), subtract)]
