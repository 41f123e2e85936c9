"""CRC-32 of zip archives (ISO-HDLC polynomial, as :func:`zlib.crc32`): the checksum of every record of a
``.pt`` file (:mod:`rnnconvert.formats.torch.zip_write`).

:data:`crc32` is ISA-L's (``isal.isal_zlib.crc32``, the ``fast`` extra) when importable, else :func:`zlib.crc32`:
the same function (``tests/performance/test_crc32.py`` checks it against zlib, third-party code, on random buffers,
chained and unaligned), about 3.4x as fast here (12.5 against 3.7 GB/s on the 2-core benchmark machine: 0.8 s
of a 3 GB ``.pt`` written, docs/performance.md, session 9). Both release the GIL for large buffers, which the
streamed writer relies on (the reader and the verifier run beside it).
"""

from __future__ import annotations

import zlib
from typing import Callable

from . import backend


def _implementation() -> Callable[..., int]:
    if backend.plain():
        return zlib.crc32
    try:
        from isal import isal_zlib  # type: ignore
    except ImportError:
        return zlib.crc32
    return isal_zlib.crc32


#: ``crc32(data, value=0) -> int``: the CRC-32 of ``data`` (any buffer) continuing from ``value``
crc32: Callable[..., int] = _implementation()
