"""NumPy kernels of the random op pack: vectorised Threefry-2x32 and the SVD square root."""

import numpy as np

from lazyx.plugins import random as rd

_u32 = np.uint32
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
         8: np.dtype(np.uint64)}
_ROTATIONS = rd.RandomBits.ROTATIONS
_PARITY = _u32(rd.RandomBits.PARITY)
_CHUNK = 1 << 16


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 (20 rounds) of counter pairs ``(x0, x1)`` under keys ``(k0, k1)``.

    All four are ``uint32`` arrays of at least one dimension that broadcast
    together. Returns the two output words, as new arrays of the broadcast shape.
    """
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = np.add(x0, k0, dtype=_u32)
    x1 = np.add(x1, k1, dtype=_u32)
    if x0.shape != x1.shape:  # the rounds update both words in place
        shape = np.broadcast_shapes(x0.shape, x1.shape)
        x0 = np.broadcast_to(x0, shape).copy()
        x1 = np.broadcast_to(x1, shape).copy()
    tmp = np.empty_like(x1)
    for i in range(5):
        for r in _ROTATIONS[i & 1]:
            x0 += x1
            np.left_shift(x1, r, out=tmp)
            x1 >>= 32 - r
            x1 |= tmp
            x1 ^= x0
        x0 += ks[(i + 1) % 3]
        x1 += ks[(i + 2) % 3] + _u32(i + 1)
    return x0, x1


def bit_counts(p) -> tuple[int, int, int]:
    """``(nbytes, nwords, half)`` of a RandomBits node, per key: the bytes it draws, the
    32-bit words that hold them, and the counters hashed (each gives two words)."""
    n = 1
    for s in p.shape:
        n *= s
    nbytes = n * p.width
    nwords = (nbytes + 3) // 4
    return nbytes, nwords, (nwords + 1) // 2


def words_to_bits(p, words, batch, nbytes):
    """The ``(keys, nwords)`` uint32 words as the node's output: its first ``nbytes``
    bytes per key, in its unsigned dtype and shape (NumPy or CuPy words)."""
    if p.width != 4:
        # .copy() (C order) rather than np.ascontiguousarray, which CuPy arrays do not pass
        words = words.view(np.uint8)[:, :nbytes].copy().view(_UINT[p.width])
    return words.reshape(batch + p.shape)


def _random_bits(p, ins):
    keys = ins[0]
    batch = keys.shape[:-1]
    keys = keys.reshape(-1, 2)
    k0, k1 = keys[:, :1], keys[:, 1:]
    nbytes, nwords, half = bit_counts(p)
    rest = nwords - half  # words taken from the second output word of the hash
    words = np.empty((keys.shape[0], nwords), _u32)
    # A chunk of counters at a time: the ~100 passes of the rounds then stay in
    # cache, which is several times faster than whole-array passes.
    for start in range(0, half, _CHUNK):
        stop = min(start + _CHUNK, half)
        x0 = np.arange(start, stop, dtype=_u32)
        x1 = x0 + _u32(half)
        if stop == half and nwords & 1:
            x1[-1] = 0
        y0, y1 = threefry2x32(k0, k1, x0, x1)
        words[:, start:stop] = y0
        if start < rest:
            end = min(stop, rest)
            words[:, half + start:half + end] = y1[:, :end - start]
    return words_to_bits(p, words, batch, nbytes)


def _matrix_sqrt(p, ins):
    c = ins[0]
    if c.size == 0:
        return np.zeros(c.shape, c.dtype)
    u, s, vt = np.linalg.svd(c.astype(np.float64))
    return np.matmul(u * np.sqrt(s)[..., None, :], vt).astype(c.dtype)


def _matrix_sqrt_derivative(p, ins):
    c, t = ins
    if c.size == 0:
        return np.zeros(c.shape, c.dtype)
    u, s, vt = np.linalg.svd(c.astype(np.float64))
    q = np.sqrt(s)
    qq = q[..., :, None] + q[..., None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = 1.0 / qq
        b = qq / (s[..., :, None] + s[..., None, :])
    pm = np.matmul(np.matmul(np.swapaxes(u, -1, -2), t.astype(np.float64)),
                   np.swapaxes(vt, -1, -2))
    pt = np.swapaxes(pm, -1, -2)
    k = (pm + pt) * (0.5 * a) + (pm - pt) * (0.5 * b)
    return np.matmul(np.matmul(u, k), vt).astype(c.dtype)


KERNELS = {
    rd.RandomBits: _random_bits,
    rd.MatrixSqrt: _matrix_sqrt,
    rd.MatrixSqrtDerivative: _matrix_sqrt_derivative,
}
