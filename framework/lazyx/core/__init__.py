"""``lazyx.core``: arrays, dtypes, devices, evaluation and every registered op.

Read it as ``mlx.core``::

    import lazyx.core as mx
    a = mx.array([1.0, 2.0, 3.0])
    b = mx.exp(a) * 2          # nothing has run yet
    mx.eval(b)                 # now it has

The ops themselves (``add``, ``sum``, ``matmul``, ``random.uniform`` ...) are
installed here by the op-pack plugins when this module is first imported.
"""

from .. import __version__
from ..array import ArrayIterator, ArrayLike, array
from ..array_api import __array_namespace_info__
from ..backend import Backend, backends, kernel_provider, use_backend
from ..custom_primitive import custom_primitive
from ..denormals import get_flush_denormal, set_flush_denormal
from ..device import (Device, DeviceType, Stream, StreamContext, ThreadLocalStream, clear_streams,
                      cpu, default_device, default_stream, device_count, device_info, gpu,
                      is_available, new_stream, new_thread_local_stream, new_thread_unsafe_stream,
                      set_default_device, set_default_stream, set_wired_limit, stream, synchronize)
from ..dtypes import (Dtype, DtypeCategory, bfloat16, bool_, can_cast, complex64,
                      complexfloating, e, euler_gamma, finfo, float16, float32, float64, floating,
                      generic, iinfo, inexact, inf, int8, int16, int32, int64, integer, isdtype, issubdtype,
                      nan, newaxis, number, pi, promote_types, result_type, signedinteger, uint8,
                      uint16, uint32, uint64, unsignedinteger)
from ..graph import export_to_dot, print_graph
from ..interop import asarray, from_dlpack
from ..memory import (clear_cache, get_active_memory, get_cache_memory, get_peak_memory,
                      reset_peak_memory, set_cache_limit, set_memory_limit)
from ..primitive import Primitive
from ..printoptions import PrintOptions, get_printoptions, printoptions, set_printoptions
from ..scheduler import async_eval, eval
from ..transforms.autodiff import grad, jvp, value_and_grad, vjp
from ..transforms.custom import checkpoint, custom_function
from ..transforms.compile import compile, disable_compile, enable_compile
from ..export import FunctionExporter, export_function, exporter, import_function
from ..transforms.vmap import vmap

# (Identifiers only: pytest's assertion rewriting adds "@py_builtins" to the modules of a
# distribution that registers a pytest plugin, as lazyx does.)
__all__ = [n for n in dir() if n.isidentifier() and not n.startswith("_")]

from .. import registry as _registry  # noqa: E402

_registry.load_plugins(globals(), set(__all__))

from .. import device as _device  # noqa: E402

_device.choose_default_device()


def __getattr__(name):
    _registry.conflict_error(name)
