"""torch's ``.pt`` zip container, written in Python: the bytes of ``torch._C.PyTorchFileWriter``.

Why: torch's writer (``caffe2/serialize/inline_container.cc`` on miniz 3.0.2) hands each tensor to
the file in one ``write`` of the whole storage, after miniz's ``mz_crc32`` has read it once. This
writer produces the same bytes writing each array straight from its memory in chunks of
:data:`CHUNK` bytes (no copy), the CRC-32 (:data:`rnnconvert.speed.crc32.crc32`) updated chunk by chunk while the chunk
is still in cache. Measured on the 2-core dev VM (torch 2.13 CPU wheel), 1 GiB of float32 to a file
in ``/tmp``: the CRC itself is not the cost (miniz 0.17 s/GiB, zlib 0.19 s/GiB, in memory); the
kernel time of one huge ``write`` per tensor is (see ``docs/pytorch.md`` for the numbers).

Layout (read in ``inline_container.cc`` ``PyTorchStreamWriter::writeRecord``/``getPadding``/
``writeEndOfFile``/``writeSerializationId``/``ostream_write_func`` and miniz 3.0.2
``mz_zip_writer_add_mem_ex_v2``/``mz_zip_writer_finalize_archive``; checked byte for byte against
torch 2.13 by ``tests/formats/torch_files/test_pt_zip.py``). Records are stored (method 0), named ``archive/<name>``,
all time/date/attribute/version fields 0, general-purpose flags ``0x808`` (UTF-8 name, data
descriptor follows) or ``0x800`` for an empty record (no data descriptor). Per record:

* local header with CRC and sizes 0; the name; when the record's size or its header offset is
  ``>= 0xFFFFFFFF``, a zip64 extra field (id 1: 64-bit size and compressed size if the size is -- the
  latter 0 here, as miniz makes this field before writing the data --, 64-bit offset if the offset
  is); then torch's padding extra field ``"FB" <u16 n> "Z"*n`` with ``n`` the bytes that put the
  data at a multiple of the storage alignment (``torch.serialization._get_storage_alignment()``, 64);
* the data; then, if not empty, a data descriptor ``PK\\x07\\x08 crc size size`` (sizes 32-bit, or
  64-bit when the record has the zip64 field);
* the central directory repeats the record (sizes and offset capped at ``0xFFFFFFFF``, the zip64
  field with the real compressed size, no padding field). torch writes with ``MZ_ZIP_FLAG_WRITE_ZIP64``, so every file ends with a
  zip64 end-of-central-directory record (made-by ``0x031E``, needed ``0x2D``) and locator, then the
  classic end record (counts capped at ``0xFFFF``, size/offset at ``0xFFFFFFFF``).

At the end torch adds ``version`` (and ``byteorder`` when absent) and ``.data/serialization_id``:
40 decimal digits, 20 for a ``c10::hash_combine`` fold of ``std::hash`` of the record names in the
iteration order of a ``std::unordered_set``, 20 for a ``hash_combine`` fold over the data
descriptors' CRCs in write order -- and over bytes 4-8 of any record whose data itself starts with
the data-descriptor signature (torch spots descriptors by their first bytes in every write). The
name half is computed without torch by :func:`rnnconvert.formats.torch.pickle_write.serialization_id_names`
(given to :class:`Tail`); :func:`torch_tail` learns it, and the tail records, from torch itself
(``PyTorchFileWriter`` on the same record names with empty data: no tensor bytes, instant) and checks
that this module rebuilds that small archive byte for byte -- the tests' reference.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ...speed.crc32 import crc32

#: Bytes per write/CRC step for array data (1 MiB: fits in cache between the CRC and the write, and
#: kept the kernel's share of the write lowest in the measurements of ``docs/pytorch.md``).
CHUNK = 1 << 20

_U32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_DD_SIG = b"PK\x07\x08"
_ID_NAME = ".data/serialization_id"


def hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit ``size_t`` (``c10/util/hash.h``)."""
    return seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64)


def _as_bytes(data: Any):
    """A 1-D byte view of ``data`` (bytes, str, or a numpy array: made C-contiguous, not copied
    when it already is)."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _zip64_field(size: int, comp_size: int, ofs: int) -> bytes:
    """miniz's zip64 extra field (id 1): sizes when ``size >= 0xFFFFFFFF``, offset when ``ofs`` is."""
    body = (struct.pack("<QQ", size, comp_size) if size >= _U32 else b"") + (struct.pack("<Q", ofs) if ofs >= _U32 else b"")
    return struct.pack("<HH", 1, len(body)) + body if body else b""


class ZipWriter:
    """Writes torch's zip layout (module docstring) to ``fh`` (anything with ``write``)."""

    def __init__(self, fh: BinaryIO, alignment: int = 64, archive: str = "archive") -> None:
        self.fh, self.alignment, self.prefix = fh, alignment, archive + "/"
        self.pos = 0
        self.central: list[bytes] = []
        self.crc_fold = 0  # torch's combined_uncomp_crc32_

    def _put(self, b) -> None:
        self.fh.write(b)
        self.pos += len(b)

    def write_record(self, name: str, data: Any) -> None:
        buf = _as_bytes(data)
        size, ofs, full = len(buf), self.pos, (self.prefix + name).encode()
        z64 = _zip64_field(size, size, ofs)  # the central directory's
        # the local header's is made before the data is written: compressed size still 0
        extra = _zip64_field(size, 0, ofs)
        pad = -(ofs + 30 + len(full) + len(extra) + 4) % self.alignment
        extra += b"FB" + struct.pack("<H", pad) + b"Z" * pad
        flags = 0x808 if size else 0x800
        self._put(struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(full), len(extra)) + full + extra)
        if size >= 8 and bytes(buf[:4]) == _DD_SIG:
            self.crc_fold = hash_combine(self.crc_fold, struct.unpack("<I", bytes(buf[4:8]))[0])
        crc = 0
        if size <= CHUNK:
            crc = crc32(buf)
            self._put(buf)
        else:
            for i in range(0, size, CHUNK):
                part = buf[i:i + CHUNK]
                crc = crc32(part, crc)
                self.fh.write(part)
            self.pos += size
        if size:
            sizes = struct.pack("<QQ", size, size) if z64 else struct.pack("<II", size, size)
            self._put(_DD_SIG + struct.pack("<I", crc) + sizes)
            self.crc_fold = hash_combine(self.crc_fold, crc)
        self.central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, flags, 0, 0, 0, crc, min(size, _U32),
                                        min(size, _U32), len(full), len(z64), 0, 0, 0, 0, min(ofs, _U32)) + full + z64)

    def serialization_id(self, name_half: str) -> str:
        """torch's ``.data/serialization_id`` for the records written so far (``name_half``: the 20
        digits of the record-name hash: :func:`~rnnconvert.formats.torch.pickle_write.serialization_id_names`)."""
        return f"{name_half}{self.crc_fold:020d}"

    def finish(self) -> None:
        """Write the central directory and the (zip64) end records."""
        n, cd_ofs = len(self.central), self.pos
        cd = b"".join(self.central)
        self._put(cd)
        z64_ofs = self.pos
        self._put(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), cd_ofs))
        self._put(struct.pack("<IIQI", 0x07064B50, 0, z64_ofs, 1))
        self._put(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(len(cd), _U32),
                              min(cd_ofs, _U32), 0))


@dataclass
class Tail:
    """What torch's writer appends at its end for a given list of record names."""

    records: list[tuple[str, bytes]]  # ``version`` (and ``byteorder`` if it was missing), in order
    name_half: str                    # first 20 digits of ``.data/serialization_id``

    def write(self, zw: ZipWriter) -> None:
        """Write the tail records, the serialization id and the central directory through ``zw``."""
        for name, data in self.records:
            zw.write_record(name, data)
        zw.write_record(_ID_NAME, zw.serialization_id(self.name_half))
        zw.finish()


class _Sink:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, b) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def flush(self) -> None:
        pass

    def value(self) -> bytes:
        return b"".join(self.parts)


def torch_tail(torch, names: list[str], alignment: int) -> Tail | None:
    """torch's end-of-file records for an archive with records ``names`` (in write order), learnt by
    running ``torch._C.PyTorchFileWriter`` on those names with empty data; ``None`` when this
    module does not rebuild torch's small archive byte for byte (then use torch's writer)."""
    try:
        sink = _Sink()
        zw = torch._C.PyTorchFileWriter(sink, True, alignment)
        for name in names:
            zw.write_record(name, b"", 0)
        zw.write_end_of_file()
        ref = sink.value()
        with zipfile.ZipFile(io.BytesIO(ref)) as z:
            infos = z.infolist()
            got = [i.filename for i in infos]
            prefix = "archive/"
            if got[:len(names)] != [prefix + n for n in names] or got[-1] != prefix + _ID_NAME:
                return None
            sid = z.read(infos[-1]).decode("ascii")
            records = [(i.filename[len(prefix):], z.read(i)) for i in infos[len(names):-1]]
        if len(sid) != 40 or not sid.isdigit():
            return None
        tail = Tail(records, sid[:20])
        mine = _Sink()
        zw2 = ZipWriter(mine, alignment)
        for name in names:
            zw2.write_record(name, b"")
        tail.write(zw2)
        return tail if mine.value() == ref else None
    except Exception:  # noqa: BLE001 -- any surprise in torch's private writer: use torch's writer
        return None
