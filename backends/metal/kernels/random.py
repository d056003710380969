"""Metal kernel of ``RandomBits``: Threefry-2x32 with the CPU backend's counters.

``random_bits`` — one thread per (counter ``i``, key): the CPU kernel's numbers bit
for bit (``backends/cpu/kernels/random.py``, the primitive's docstring). Per key the
output is ``nbytes = prod(shape) * width`` bytes from ``nwords = ceil(nbytes / 4)``
32-bit words; with ``half = ceil(nwords / 2)`` thread ``i < half`` hashes the counter
pair ``(i, i + half)`` (``(half - 1, 0)`` for the last pair of an odd ``nwords``)
under the key and writes word ``i`` (the hash's first word) and word ``i + half``
(its second, when it exists). Words are stored little-endian: whole when ``nbytes``
is a multiple of 4, byte by byte otherwise (the last word of a key is then cut),
so every width (1, 2, 4, 8 bytes) and every key batch shape is one kernel. The
rotation and parity constants come from the primitive (``RandomBits.ROTATIONS``,
``PARITY``); the keys may be any strided ``(..., 2)`` uint32 view.
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.plugins import random as rd

from .common import empty, PRELUDE, Dispatch, Library, bindable, row_layout, unsupported

__all__ = ["random_bits", "LIBRARY"]

_EVEN, _ODD = rd.RandomBits.ROTATIONS
_EVEN_TEXT, _ODD_TEXT = ", ".join(map(str, _EVEN)), ", ".join(map(str, _ODD))
_SOURCE = PRELUDE + f"""
constant uint ROTATIONS[2][4] = {{{{{_EVEN_TEXT}}}, {{{_ODD_TEXT}}}}};
constant uint PARITY = {rd.RandomBits.PARITY:#x}u;
""" + r"""
inline uint rotate_left(uint v, uint r) { return (v << r) | (v >> (32u - r)); }

// Threefry-2x32, 20 rounds, of counters (x0, x1) under key (k0, k1), in place.
inline void threefry2x32(uint k0, uint k1, thread uint& x0, thread uint& x1) {
  uint ks[3] = {k0, k1, k0 ^ k1 ^ PARITY};
  x0 += k0;
  x1 += k1;
  for (uint i = 0; i < 5; ++i) {
    for (uint r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotate_left(x1, ROTATIONS[i & 1u][r]);
      x1 ^= x0;
    }
    x0 += ks[(i + 1) % 3];
    x1 += ks[(i + 2) % 3] + (i + 1);
  }
}

// Word `w` of key `key`'s output, little-endian: whole, or its bytes below `nbytes`.
inline void store_word(device uchar* out, uint64_t key, uint nbytes, uint w, uint word) {
  device uchar* base = out + key * uint64_t(nbytes);
  if ((nbytes & 3u) == 0) {
    ((device uint*)base)[w] = word;
    return;
  }
  for (uint b = 0; b < 4 && 4 * w + b < nbytes; ++b) base[4 * w + b] = uchar(word >> (8 * b));
}

// keys: (..., 2) uint32, strided (buffers 5-10 from common.row_layout(keys.shape, (-1,), keys)).
// Grid: (half, number of keys).
[[kernel]] void random_bits(
    device const uint* keys [[buffer(0)]], device uchar* out [[buffer(1)]],
    constant uint& nbytes [[buffer(2)]], constant uint& nwords [[buffer(3)]],
    constant uint& half_words [[buffer(4)]],
    constant int* pair_shape [[buffer(5)]], constant int64_t* pair_strides [[buffer(6)]],
    constant int& pair_ndim [[buffer(7)]],
    constant int* key_shape [[buffer(8)]], constant int64_t* key_strides [[buffer(9)]],
    constant int& key_ndim [[buffer(10)]],
    uint3 pos [[thread_position_in_grid]]) {
  uint i = pos.x;
  if (i >= half_words) return;
  device const uint* key = keys + elem_to_loc(pos.y, key_shape, key_strides, key_ndim);
  uint k0 = key[0], k1 = key[elem_to_loc(1, pair_shape, pair_strides, pair_ndim)];
  uint x0 = i, x1 = i + half_words;
  if ((nwords & 1u) && i == half_words - 1) x1 = 0;
  threefry2x32(k0, k1, x0, x1);
  store_word(out, pos.y, nbytes, i, x0);
  if (i + half_words < nwords) store_word(out, pos.y, nbytes, i + half_words, x1);
}
"""

LIBRARY = Library("random", _SOURCE)

_KEY = ldt.uint32
_THREADS = 256


def random_bits(primitive, inputs, run):
    """``RandomBits`` (``shape``, ``width`` bytes per element) on Metal: the bits of every
    key of the ``(..., 2)`` uint32 keys, of shape ``keys.shape[:-1] + shape``."""
    keys = bindable(inputs[0])
    if ldt.from_numpy(keys.dtype) != _KEY:
        raise unsupported("random_bits", ldt.from_numpy(keys.dtype), (_KEY,))
    batch = keys.shape[:-1]
    out = empty(run, batch + tuple(primitive.shape), np.dtype(f"uint{8 * primitive.width}"))
    if out.size == 0:
        return out
    nbytes = out.size // max(int(np.prod(batch, dtype=np.int64)), 1) * primitive.width
    nwords = -(-nbytes // 4)
    half = -(-nwords // 2)
    n_keys, _, layout = row_layout(keys.shape, (keys.ndim - 1,), keys)
    # The kernel writes bytes: the output's bytes, seen as uint8 (the same memory).
    run(Dispatch(LIBRARY, "random_bits",
                 [keys, out.reshape(-1).view(np.uint8), np.array([nbytes], np.uint32),
                  np.array([nwords], np.uint32), np.array([half], np.uint32), *layout],
                 (half, n_keys, 1), (min(_THREADS, half), 1, 1)))
    return out
