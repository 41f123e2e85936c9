"""The containers under a TensorFlow checkpoint bundle (:mod:`.bundle_read`), decoded without TensorFlow:
protobuf wire format, the leveldb-style table (SSTable) of the ``.index`` file, and the OrderedCode keys
of partitioned variables' slices.

Facts (read for facts only): protobuf encoding (varints, wire types 0/1/2/5; protobuf.dev
"Encoding"); the table: ``tsl/lib/io/{format,block,table}.cc`` of TensorFlow and leveldb's
``doc/table_format.md`` (see :mod:`.bundle_read` for the layout); OrderedCode:
``tensorflow/core/lib/strings/ordered_code.cc``. Every loop is bounded by the input's length and every
offset is checked before use: damaged input raises :class:`TableError` (never IndexError & co.).
"""

from __future__ import annotations

from ...speed import crc32c

MAGIC = 0xDB4775248B80FB57
FOOTER = 48


class BundleUnsupported(Exception):
    """Not damaged, but not read here (big-endian, compression, a dtype, ...): use TensorFlow."""


class TableError(Exception):
    """A defect found while decoding; :mod:`.bundle_read` re-raises it as FormatError naming the file."""


# ------------------------------------------------------------------------------------------ wire format
def varint(buf: bytes, pos: int, end: int, limit_bytes: int = 10) -> tuple[int, int]:
    """A base-128 varint at ``pos`` (at most ``limit_bytes`` bytes, before ``end``): (value, next pos)."""
    val = shift = 0
    for i in range(limit_bytes):
        if pos >= end:
            raise TableError("truncated varint")
        b = buf[pos]
        pos += 1
        val |= (b & 0x7F) << shift
        if b < 0x80:
            return val, pos
        shift += 7
    raise TableError("varint longer than allowed")


def int64(v: int) -> int:
    """A protobuf int64 from its varint (negative numbers are 10-byte two's complement)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def fields(buf: bytes, start: int = 0, end: int | None = None):
    """Protobuf fields of ``buf[start:end]``: (number, wire type, int value or (start, end) of the bytes)."""
    pos, end = start, len(buf) if end is None else end
    while pos < end:
        tag, pos = varint(buf, pos, end)
        num, wt = tag >> 3, tag & 7
        if num == 0:
            raise TableError("protobuf field number 0")
        if wt == 0:
            val, pos = varint(buf, pos, end)
        elif wt == 1 or wt == 5:
            n = 8 if wt == 1 else 4
            if pos + n > end:
                raise TableError("truncated fixed-width protobuf field")
            val, pos = int.from_bytes(buf[pos:pos + n], "little"), pos + n
        elif wt == 2:
            n, pos = varint(buf, pos, end)
            if pos + n > end:
                raise TableError("protobuf length past the end of its message")
            val, pos = (pos, pos + n), pos + n
        else:
            raise TableError(f"protobuf wire type {wt}")
        yield num, wt, val


def text(buf: bytes, span) -> str:
    """A protobuf string field (UTF-8; undecodable bytes replaced)."""
    return bytes(buf[span[0]:span[1]]).decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------ the table
def _block(data: bytes, handle: tuple[int, int], what: str) -> bytes:
    """The contents of the block at ``handle`` after checking its trailer (type byte + masked crc32c)."""
    off, size = handle
    if off + size + 5 > len(data):
        raise TableError(f"{what} block [{off}, +{size}] past the end of the file ({len(data)} bytes)")
    kind = data[off + size]
    stored = int.from_bytes(data[off + size + 1: off + size + 5], "little")
    if crc32c.unmask(stored) != crc32c.value(memoryview(data)[off: off + size + 1]):
        raise TableError(f"{what} block checksum does not match")
    if kind == 1:
        raise BundleUnsupported("snappy-compressed table block")
    if kind != 0:
        raise TableError(f"{what} block of unknown compression type {kind}")
    return data[off: off + size]


def _entries(block: bytes, what: str) -> list[tuple[bytes, bytes]]:
    """All (key, value) pairs of a block, keys rebuilt from their shared prefixes."""
    if len(block) < 4:
        raise TableError(f"{what} block shorter than its restart count")
    restarts = int.from_bytes(block[-4:], "little")
    if restarts > (len(block) - 4) // 4:
        raise TableError(f"{what} block declares {restarts} restarts")
    limit = len(block) - 4 * (restarts + 1)
    out, pos, key = [], 0, b""
    while pos < limit:  # each entry takes at least 3 bytes: bounded
        shared, pos = varint(block, pos, limit, 5)
        unshared, pos = varint(block, pos, limit, 5)
        vlen, pos = varint(block, pos, limit, 5)
        if shared > len(key) or pos + unshared + vlen > limit:
            raise TableError(f"{what} block entry out of bounds")
        key = key[:shared] + block[pos: pos + unshared]
        pos += unshared
        out.append((key, block[pos: pos + vlen]))
        pos += vlen
    return out


def _handle(buf: bytes, pos: int, end: int) -> tuple[tuple[int, int], int]:
    off, pos = varint(buf, pos, end)
    size, pos = varint(buf, pos, end)
    return (off, size), pos


def read_table(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an SSTable held in ``data``, in key order (raises _Bad/BundleUnsupported)."""
    if len(data) < FOOTER:
        raise TableError(f"the file has {len(data)} bytes, shorter than the 48-byte table footer")
    foot = data[-FOOTER:]
    if int.from_bytes(foot[40:48], "little") != MAGIC:
        raise TableError("no table magic number at the end (truncated or not a checkpoint index)")
    meta, pos = _handle(foot, 0, 40)
    index, _ = _handle(foot, pos, 40)
    body = data[:-FOOTER]
    _block(body, meta, "metaindex")
    out: list[tuple[bytes, bytes]] = []
    for _, value in _entries(_block(body, index, "index"), "index"):
        handle, _ = _handle(value, 0, len(value))
        for k, v in _entries(_block(body, handle, "data"), "data"):
            if out and k <= out[-1][0]:
                raise TableError("table keys out of order")
            out.append((k, v))
    return out


# OrderedCode (``tensorflow/core/lib/strings/ordered_code.cc``), which names the entry of each slice:
# ``EncodeTensorNameSlice`` (``tensorflow/core/util/saved_tensor_slice_util.cc``) writes NumIncreasing(0),
# String(name), NumIncreasing(rank), then SignedNumIncreasing(start), SignedNumIncreasing(length) per dim.
def _num_increasing(n: int) -> bytes:
    """A length byte, then the big-endian bytes of ``n`` without leading zeros."""
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([len(b)]) + b


def _string_increasing(s: bytes) -> bytes:
    """``\\x00`` -> ``\\x00\\xff``, ``\\xff`` -> ``\\xff\\x00``, then the separator ``\\x00\\x01``."""
    return b"".join(b"\x00\xff" if c == 0 else b"\xff\x00" if c == 255 else bytes([c]) for c in s) + b"\x00\x01"


#: First two header bytes of a signed number encoded on 1..10 bytes (sign bit, then as many length bits).
_SIGNED_HEADER = [(0, 0), (0x80, 0), (0xC0, 0), (0xE0, 0), (0xF0, 0), (0xF8, 0), (0xFC, 0), (0xFE, 0),
                  (0xFF, 0), (0xFF, 0x80), (0xFF, 0xC0)]


def _signed_increasing(v: int) -> bytes:
    x = ~v if v < 0 else v
    if x < 64:
        return bytes([(0x80 ^ v) & 0xFF])
    n = x.bit_length() // 7 + 1  # 7 payload bits per byte
    buf = bytearray((v & ((1 << 80) - 1)).to_bytes(10, "big")[10 - n:])  # two's complement, sign-extended
    buf[0] ^= _SIGNED_HEADER[n][0]
    buf[1] ^= _SIGNED_HEADER[n][1]
    return bytes(buf)


def slice_key(name: bytes, extents: list[tuple[int, int]]) -> bytes:
    """The table key of one slice of the partitioned variable ``name``."""
    out = _num_increasing(0) + _string_increasing(name) + _num_increasing(len(extents))
    for start, length in extents:
        out += _signed_increasing(start) + _signed_increasing(length)
    return out
