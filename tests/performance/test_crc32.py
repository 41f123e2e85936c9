"""rnnconvert.speed.crc32 (ISA-L's CRC-32 where installed) against zlib's, the zip checksum's reference code."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rnnconvert.speed import crc32 as mod


@pytest.mark.parametrize("size", [0, 1, 7, 64, 4095, 1 << 20, (3 << 20) + 13])
def test_same_as_zlib_whole_and_chained(size):
    data = np.random.default_rng(size).integers(0, 256, size + 3, dtype=np.uint8)
    view = memoryview(data)[3:]  # unaligned start
    assert mod.crc32(view) == zlib.crc32(view)
    cut = size // 3
    assert mod.crc32(view[cut:], mod.crc32(view[:cut])) == zlib.crc32(view)
    assert mod.crc32(view, 0xDEADBEEF) == zlib.crc32(view, 0xDEADBEEF)


def test_float_arrays_as_the_writer_passes_them():
    a = np.random.default_rng(1).normal(size=(257, 33)).astype(np.float16)
    assert mod.crc32(memoryview(a).cast("B")) == zlib.crc32(a.tobytes())
