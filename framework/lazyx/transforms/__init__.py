"""Function transformations: ``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``vmap``,
``custom_function`` and ``checkpoint``.

Each transform calls the user's function on arrays and walks the lazy graph it
records, using the ``vjp``, ``jvp`` and ``vmap`` rules of each primitive (see
:mod:`lazyx.primitive`). The results are lazy graphs again, so transforms
compose: ``grad(grad(f))``, ``vmap(grad(f))``, ``jvp(grad(f), ...)``.
"""

from .autodiff import grad, jvp, value_and_grad, vjp
from .custom import checkpoint, custom_function
from .vmap import vmap
from . import replay as _replay  # noqa: F401  (installs eager replay in the scheduler)

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "vmap", "custom_function", "checkpoint"]
