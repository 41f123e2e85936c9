"""A read-only memory map of a file, handing out numpy views of byte ranges and giving their pages back.

Lazy readers of formats that store raw little-endian tensors at known offsets (safetensors) map the file
once and give each slab's arrays as views (no copy, nothing read until used); ``release_array`` drops the
pages that lie wholly inside an array (``MADV_DONTNEED``: the file is unchanged, a later use reads them
again), so that a streamed conversion holds one slab's pages, not the file's.
"""

from __future__ import annotations

import mmap
import os

import numpy as np


class MappedFile:
    """``path`` mapped read-only. :meth:`array` gives a view, :meth:`release_array` drops its pages."""

    def __init__(self, path: str | os.PathLike) -> None:
        with open(path, "rb") as fh:
            self.size = os.fstat(fh.fileno()).st_size
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        self._base = np.frombuffer(self._mm, np.uint8) if self._mm is not None else np.zeros(0, np.uint8)

    def array(self, offset: int, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The read-only array of ``shape`` and ``dtype`` stored at byte ``offset`` (the caller checked that it
        lies inside the file)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        return self._base[offset:offset + n * dt.itemsize].view(dt).reshape(shape)

    def release_array(self, a: np.ndarray) -> None:
        """Drop the mapped pages wholly inside ``a``'s memory when ``a`` is a view of this map (else nothing)."""
        release_view(self._mm, a)


def release_view(mm: mmap.mmap | None, a: np.ndarray) -> None:
    """Drop the pages of the map ``mm`` that lie wholly inside array ``a``'s memory, when ``a`` is a
    C-contiguous view of ``mm`` (``MADV_DONTNEED``: ``a`` stays valid, its pages are read again from the file
    if used; neighbours keep theirs); nothing otherwise. Shared by :class:`MappedFile` and the ``.pt``
    archive (``formats.torch.torch_zip.Archive``)."""
    if mm is None or not hasattr(mmap, "MADV_DONTNEED") or not a.size or not a.flags.c_contiguous:
        return
    lo = a.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    hi = lo + a.nbytes
    if lo < 0 or hi > len(mm):
        return
    page = mmap.PAGESIZE
    lo, hi = -(-lo // page) * page, hi // page * page  # pages wholly inside
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
