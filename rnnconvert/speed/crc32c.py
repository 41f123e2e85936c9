"""CRC-32C (Castagnoli, reflected polynomial ``0x82F63B78``), the checksum of TensorFlow checkpoint
bundles and of leveldb-style table blocks (see :mod:`rnnconvert.formats.tf.bundle_read`).

:func:`value` uses a C implementation when one is importable (``google_crc32c`` or ``crc32c`` from
PyPI, both optional) and otherwise a numpy one. The numpy one splits the buffer into ``L``
interleaved lanes of 32-bit words and runs the table recursion on all lanes at once: with ``F`` the
linear map "feed one 32-bit word of zeros", lane ``i`` accumulates ``a = G(a) ^ w`` over its words
(``G = F^L``, tabulated on the two 16-bit halves of the state), and the lanes are folded with one more
Horner pass of ``F``; a CRC is affine over GF(2), so the initial value ``0xFFFFFFFF`` enters as
``F^N(0xFFFFFFFF)``. That makes about 6 numpy operations per 4 bytes (a few hundred MB/s on one core),
which is why :func:`fast` says whether a C implementation is in use.

Check value (RFC 3720 B.4 / the CRC catalogue): ``value(b"123456789") == 0xE3069283``.
"""

from __future__ import annotations

import numpy as np

POLY = 0x82F63B78
MASK_DELTA = 0xA282EAD8  # leveldb/TensorFlow "masked" CRCs: rotate right by 15, add this constant


def _c_impl():
    """``extend(crc, memoryview)`` of an optional C implementation, or None (``crc32c`` takes any buffer;
    ``google_crc32c`` only ``bytes``, so it costs a copy)."""
    try:
        import crc32c as _c  # type: ignore

        return lambda crc, data: _c.crc32c(data, crc)
    except ImportError:
        pass  # not installed: try the next one
    try:
        import google_crc32c  # type: ignore
    except ImportError:
        return None
    if getattr(google_crc32c, "implementation", "c") != "c":  # its pure-Python fallback: slower than ours
        return None
    return lambda crc, data: google_crc32c.extend(crc, bytes(data))


_UNSET = object()
#: The C implementation, looked for on first use (importing ``crc32c`` costs ~0.3 s, and format detection
#: imports this module for every file); None: numpy.
_C = _UNSET


def fast() -> bool:
    """True when a C implementation (``google_crc32c`` or ``crc32c``) is used; else numpy (slower)."""
    global _C
    if _C is _UNSET:
        _C = _c_impl()
    return _C is not None


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(POLY), t >> 1).astype(np.uint32)
    return t


_T8 = _byte_table()
_T8L = [int(x) for x in _T8]


def _bytes_raw(state: int, data) -> int:
    """The raw register recursion (no pre/post inversion) over ``data`` byte by byte (short inputs)."""
    t = _T8L
    for b in bytes(data):
        state = t[(state ^ b) & 0xFF] ^ (state >> 8)
    return state


# A linear map on 32-bit states is kept as the images of the 32 unit vectors (a list of ints).
def _apply(cols: list[int], v: int) -> int:
    out, b = 0, 0
    while v:
        if v & 1:
            out ^= cols[b]
        v >>= 1
        b += 1
    return out


def _compose(a: list[int], b: list[int]) -> list[int]:
    """The map ``a after b``."""
    return [_apply(a, c) for c in b]


_F = [_bytes_raw(1 << b, b"\0\0\0\0") for b in range(32)]  # feed 4 zero bytes
_POW: dict[int, list[int]] = {}


def _power(n: int) -> list[int]:
    """``F^n`` by squaring."""
    if n in _POW:
        return _POW[n]
    res, base, k = [1 << b for b in range(32)], _F, n
    while k:
        if k & 1:
            res = _compose(base, res)
        base = _compose(base, base)
        k >>= 1
    if len(_POW) < 256:
        _POW[n] = res
    return res


_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _tables(lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """``G = F^lanes`` tabulated on the low and the high 16 bits of the state."""
    if lanes not in _TABLES:
        cols = np.array(_power(lanes), dtype=np.uint32)
        x = np.arange(1 << 16, dtype=np.uint32)
        lo, hi = np.zeros(1 << 16, np.uint32), np.zeros(1 << 16, np.uint32)
        for b in range(16):
            bit = ((x >> np.uint32(b)) & np.uint32(1)).astype(bool)
            lo[bit] ^= cols[b]
            hi[bit] ^= cols[b + 16]
        _TABLES[lanes] = (lo, hi)
    return _TABLES[lanes]


def _lanes_exact(words: np.ndarray, lanes: int) -> int:
    """Raw CRC register (zero initial state) after ``words`` (uint32 little-endian, length a multiple
    of ``lanes``): lane ``i`` holds ``a_i = XOR_r G^(R-1-r)(w[r, i])``, and the state is
    ``XOR_i F^(lanes-i)(a_i)``."""
    lo_t, hi_t = _tables(lanes)
    rows = words.reshape(-1, lanes)
    a = rows[0].copy()
    idx = np.empty(lanes, np.intp)
    tmp = np.empty(lanes, np.uint32)
    for r in range(1, rows.shape[0]):
        np.bitwise_and(a, 0xFFFF, out=idx, casting="unsafe")
        np.right_shift(a, 16, out=a)
        np.take(hi_t, a, out=tmp)
        np.take(lo_t, idx, out=a)
        a ^= tmp
        a ^= rows[r]
    state = 0
    t = _T8L
    for v in a.tolist():  # Horner over the lanes with F (one 32-bit word of zeros)
        state ^= v
        for _ in range(4):
            state = t[state & 0xFF] ^ (state >> 8)
    return state


#: Lane counts tried from the largest; a buffer shorter than 4*lanes*4 bytes uses the next one.
_LANES = (1 << 15, 1 << 8)


def _extend_raw(state: int, data: memoryview) -> int:
    """The raw register after ``data`` from ``state`` (numpy path)."""
    n = len(data)
    pos = 0
    for lanes in _LANES:
        step = 4 * lanes
        cnt = (n - pos) // step
        if cnt < 4:
            continue
        nbytes = cnt * step
        words = np.frombuffer(data[pos: pos + nbytes], dtype="<u4")
        state = _apply(_power(nbytes // 4), state) ^ _lanes_exact(words, lanes)
        pos += nbytes
    return _bytes_raw(state, data[pos:])


def extend(crc: int, data) -> int:
    """The CRC-32C of ``previous + data`` given ``crc``, the CRC-32C of ``previous`` (0 for none)."""
    mv = memoryview(data).cast("B")
    if fast():
        return _C(crc, mv)
    return _extend_raw(crc ^ 0xFFFFFFFF, mv) ^ 0xFFFFFFFF


def value(data) -> int:
    """CRC-32C of a bytes-like object (any buffer; numpy arrays as their raw bytes)."""
    return extend(0, data)


def unmask(masked: int) -> int:
    """leveldb/TensorFlow ``crc32c::Unmask``: ``rot = masked - 0xA282EAD8``, rotated left by 15."""
    rot = (masked - MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF
