"""Large sequential outputs written around the page cache (``O_DIRECT``), where the system allows it.

Copying gigabytes into the page cache with ``write()`` is what a streamed conversion spent most of its
kernel time on (``perf``: ``copy_folio_from_iter_atomic`` 34% of a cold 3 GB ``h5 -> pt`` on the
benchmark VM). :class:`DirectWriter` stages the byte stream in an aligned buffer and hands whole blocks
to the device with ``O_DIRECT`` (no page-cache copy, nothing left to flush at ``fsync``); only the last
partial block goes through the page cache. ``dd`` of the same 3 GB file: 4.4-7.7 s buffered (system time
3.3-6.9 s) against 1.8-2.1 s with ``oflag=direct``, ``cp`` 1.9-2.0 s (docs/performance.md, Session 3).

Where ``O_DIRECT`` is missing or refused (not Linux, tmpfs, some network file systems) the writer falls
back to ordinary buffered writes, transparently: the bytes are the same either way. Outputs that are read
back at once (a verified conversion) are written through the page cache (:func:`through_page_cache`).
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os

#: Bytes staged before each ``O_DIRECT`` write (a multiple of every logical block size in use).
BLOCK = 8 << 20

_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("rnnconvert_direct_io", default=True)


@contextlib.contextmanager
def through_page_cache():
    """Within the block, :class:`DirectWriter` s write through the page cache (no ``O_DIRECT``): for an
    output that is read back at once. Verification reads the written file back in its framework, so a
    verified conversion writes through the cache (``rnnconvert.api.convert``): a cold re-read of a
    multi-GB file from the device cost more than ``O_DIRECT`` saved (docs/performance.md, Session 3)."""
    token = _ALLOWED.set(False)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


class DirectWriter:
    """A write-only binary file at ``path`` (truncated), with ``write``, ``tell``, ``flush``, ``fileno``, ``close``.

    Bytes are copied into a page-aligned staging buffer of :data:`BLOCK` bytes; each full buffer is written
    at its (block-aligned) offset through an ``O_DIRECT`` descriptor, the last partial one through an
    ordinary descriptor at :meth:`close`. ``direct`` says whether ``O_DIRECT`` is in use.

    Raises:
        OSError: the file cannot be opened or written (as ``open``/``write`` would).
    """

    def __init__(self, path: str | os.PathLike, block: int | None = None) -> None:
        self.path, self.block = os.fspath(path), block or BLOCK
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.dfd = -1
        flag = getattr(os, "O_DIRECT", 0)
        if flag and _ALLOWED.get():
            try:
                self.dfd = os.open(self.path, os.O_WRONLY | flag)
            except OSError:
                self.dfd = -1
        self.buf = mmap.mmap(-1, self.block)  # anonymous: page-aligned, as O_DIRECT wants
        self.view = memoryview(self.buf)
        self.fill = 0  # bytes staged
        self.pos = 0  # file offset of the staging buffer's first byte
        self.closed = False

    @property
    def direct(self) -> bool:
        return self.dfd >= 0

    def fileno(self) -> int:
        return self.fd

    def tell(self) -> int:
        """Bytes written so far (staged ones included)."""
        return self.pos + self.fill

    def write(self, data) -> int:
        src = memoryview(data).cast("B")
        n, done = len(src), 0
        while done < n:
            take = min(self.block - self.fill, n - done)
            self.view[self.fill:self.fill + take] = src[done:done + take]
            self.fill += take
            done += take
            if self.fill == self.block:
                self._send(self.block)
        return n

    def _send(self, size: int, direct: bool = True) -> None:
        """Write the first ``size`` staged bytes at ``pos`` (``O_DIRECT`` when possible and ``direct``: a
        whole block), then restage."""
        with self.view[:size] as out:
            done = 0
            while done < size:
                if direct and self.dfd >= 0:
                    try:
                        done += os.pwrite(self.dfd, out[done:], self.pos + done)
                        continue
                    except OSError as exc:
                        if exc.errno not in (22, 95):  # EINVAL/EOPNOTSUPP: this file system refuses O_DIRECT
                            raise
                        os.close(self.dfd)
                        self.dfd = -1
                done += os.pwrite(self.fd, out[done:], self.pos + done)
        self.pos += size
        self.fill = 0

    def flush(self) -> None:
        """Nothing to do: staged bytes are written by :meth:`close` (a partial block cannot go ``O_DIRECT``)."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.fill:  # the tail, through the page cache
                self._send(self.fill, direct=False)
        finally:
            self.view.release()
            self.buf.close()
            if self.dfd >= 0:
                os.close(self.dfd)
            os.close(self.fd)

    def __enter__(self) -> DirectWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
