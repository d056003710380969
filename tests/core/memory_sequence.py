"""A sequence of allocations whose memory figures lazyx and MLX must agree on.

    python tests/core/memory_sequence.py lazyx|mlx

Prints a JSON list of ``[step, active, peak, cache]``. It runs in a fresh process:
"nothing alive" means nothing, which a test process that has run other tests cannot
promise.
"""

import gc
import json
import sys

import numpy as np

mx = __import__(sys.argv[1] + ".core", fromlist=["core"])
out = []


def record(step):
    out.append([step, mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory()])


mx.reset_peak_memory()
record("start")
a = mx.array(np.zeros(10, np.float32))
mx.eval(a)
record("10 float32")
b = mx.array(np.ones((1000, 1000), np.float32))
mx.eval(b)
record("1M float32")
del a, b
gc.collect()
record("deleted")
mx.reset_peak_memory()
record("peak reset")
c = mx.array(np.arange(7, dtype=np.int32))  # 28 bytes, served by the cached 40-byte block
mx.eval(c)
record("7 int32 from the cache")
d = mx.array([1, 2, 3])
record("list")
del c, d
gc.collect()
record("deleted again")
mx.clear_cache()
record("cache cleared")
e = mx.arange(7)
mx.eval(e)
record("arange(7)")
f = mx.compile(lambda x: x * 2 + 1)
mx.eval(f(mx.array(np.ones(16, np.float32))))  # trace and build first
del e
mx.clear_cache()
x = mx.array(np.ones((256, 256), np.float32))
mx.eval(x)
mx.reset_peak_memory()
y = f(x)
del x
mx.eval(y)
record("compiled, input donated")
del y
gc.collect()
mx.clear_cache()
mx.reset_peak_memory()
record("end")
print(json.dumps(out))
