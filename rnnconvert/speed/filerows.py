"""Exact reads of a C array's rows at a known place in a file (Keras HDF5 datasets, TF bundle entries).

The lazy readers turn large kernels row block by row block (``interpreter._rows``), reading each block into
one reused buffer whose long rows may be padded (a destination row stride that is a multiple of 4 KiB
makes a turned tile's rows share one L1 cache set). This module fills such a buffer with one scatter read
(``os.preadv``) straight from the file. h5py's ``read_direct`` of a contiguous dataset costs about twice
the kernel time for the same bytes (benchmark VM, cold ``h5 -> pt`` of 3 GB; docs/performance.md,
"Session 3"), so HDF5 datasets stored as one plain array (contiguous layout, no filters, native byte
order: ``H5Dget_offset``) are read through :class:`FileRows`.
"""

from __future__ import annotations

import os

import numpy as np

def identity(path) -> tuple:
    """``(resolved path, inode, size, modification time in ns)`` of the file at ``path``: the key of a cache of
    something derived from the file (a format's dialect, a verification session or mapping), which a file
    rewritten or replaced in place no longer matches."""
    from pathlib import Path

    st = Path(path).stat()
    return str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns


#: Bytes per ``read`` call of :func:`read_exact` (on the benchmark VM one 128 MB ``read`` into a buffer
#: took longer than 1 MiB pieces).
READ_CHUNK = 1 << 20

#: Arrays of at least this many bytes are read through :class:`FileRows` (smaller ones: h5py as usual).
DIRECT_MIN_BYTES = 1 << 20


def read_exact(path: str, offset: int, view: memoryview) -> None:
    """Fill ``view`` from ``path`` at ``offset`` (one read, unless the kernel returns less: over 2 GiB).

    Raises:
        OSError: the file cannot be read.
        EOFError: the file ends before ``view`` is full.
    """
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        got = 0
        while got < len(view):
            n = f.readinto(view[got:got + READ_CHUNK])
            if not n:
                raise EOFError(f"{path} ends at {offset + got}, before byte {offset + len(view)}")
            got += n


def read_parts(path: str, offset: int, parts: list[memoryview]) -> None:
    """Fill the consecutive ``parts`` from ``path`` at ``offset``: one scatter read (``os.preadv``, at most 512
    parts a call) where the platform has one, the rest of a short read by :func:`read_exact`.

    Raises:
        OSError, EOFError: as :func:`read_exact`.
    """
    if len(parts) == 1 or not hasattr(os, "preadv"):
        for part in parts:
            read_exact(path, offset, part)
            offset += len(part)
        return
    with open(path, "rb", buffering=0) as f:
        i = 0
        while i < len(parts):
            batch = parts[i:i + 512]
            got = os.preadv(f.fileno(), batch, offset)
            for part in batch:
                if got < len(part):  # a short read: this part's rest and the following ones one by one
                    read_exact(path, offset + got, part[got:])
                    got = 0
                else:
                    got -= len(part)
                offset += len(part)
            i += len(batch)


def row_parts(target: np.ndarray, n: int, row_bytes: int) -> list[memoryview]:
    """The first ``n`` rows of ``target`` as byte views to read into: one view when the rows are contiguous,
    else one per row (rows of ``row_bytes`` each, further apart: a padded buffer).

    Raises:
        ValueError: ``target``'s rows are not C-contiguous rows of ``row_bytes`` bytes.
    """
    if target.flags.c_contiguous:
        return [memoryview(target.reshape(-1).view(np.uint8))[:n * row_bytes]]
    if (target.ndim == 2 and target.shape[0] >= n and target.shape[1] * target.itemsize == row_bytes
            and target.strides[1] == target.itemsize):
        return [memoryview(target[j].view(np.uint8)) for j in range(n)]
    raise ValueError("read_direct needs a block of C-contiguous rows")


class FileRows:
    """A 2-D C array of ``shape`` and native ``dtype`` stored at byte ``offset`` of ``path``, read like an
    HDF5 dataset: ``shape``, ``dtype``, ``read_direct(out, rows, dest)``; the destination's rows may be
    padded (:data:`PADDED_ROWS`).

    Raises:
        ValueError (constructor): the array does not lie inside the file.
    """

    #: ``read_direct`` fills a destination whose rows lie further apart than their length (``interpreter._rows``).
    PADDED_ROWS = True

    def __init__(self, path: str, offset: int, shape: tuple[int, int], dtype: np.dtype) -> None:
        self.path, self.offset, self.shape, self.dtype = path, offset, tuple(shape), np.dtype(dtype)
        self.row_bytes = int(shape[1]) * self.dtype.itemsize
        size = os.stat(path).st_size
        if offset < 0 or offset + self.row_bytes * int(shape[0]) > size:
            raise ValueError(f"{path}: an array of {shape} at byte {offset} does not fit its {size} bytes")

    def read_direct(self, out: np.ndarray, rows: slice, dest: slice | tuple | None = None) -> None:
        """Rows ``rows`` into ``out[dest]`` (OSError/EOFError when the file cannot be read)."""
        r0, r1 = rows.start or 0, min(rows.stop, self.shape[0])
        target = out[dest] if dest is not None else out
        if target.dtype != self.dtype:
            raise ValueError("read_direct needs a block of the array's dtype")
        read_parts(self.path, self.offset + r0 * self.row_bytes, row_parts(target, r1 - r0, self.row_bytes))
