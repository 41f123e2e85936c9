"""Reading files into the page cache ahead of the code that reads them: a written file ahead of the framework
that maps it (:func:`prefetch`), a streamed source ahead of the slab reader (:class:`ReadAhead`).

``rnnconvert verify SRC DST`` runs DST's framework on a file that is usually not in the page cache. torch
maps it (its loader's ``mmap=True``) and faults its pages in as its kernels touch them: on the 2-core test
machine the target side of verifying the 3 GB benchmark ``.pt`` took 4.8-5.6 s from a cold cache, against
0.9 s with the file read ahead (docs/performance.md, session 8). :func:`prefetch` reads a file (or a
directory's files) once, in file order, from a daemon thread, with ``os.sendfile`` into ``/dev/null``: the
kernel's ordinary read path, whose readahead fills the cache with large folios, and no copy into the
process (0.08 s of CPU for 3 GB). ``posix_fadvise(WILLNEED)`` was measured too: 0.6 s of CPU, and its
single pages made torch's target side 1.5 s instead of 0.9 s.

Both are hints, not copies: nothing is held in the process's memory, the kernel may drop the pages again under
memory pressure (the framework then reads them itself), and where ``os.sendfile`` is missing nothing
happens. Only regular files are read (a FIFO put in DST's place is skipped, never waited on).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from . import backend

#: bytes per ``os.sendfile`` call
CHUNK = 64 << 20


def _files(path: Path) -> list[Path]:
    """``path`` itself, or the regular files directly under a directory (a TF checkpoint's), links not
    followed."""
    if path.is_dir() and not path.is_symlink():
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_file(follow_symlinks=False))
    return [path] if path.is_file() else []


def _read(files: list[Path], chunk: int | None = None, room=None) -> None:
    """Read ``files`` into the page cache in order, ``os.sendfile`` into ``/dev/null``, ``chunk`` bytes a call
    (default :data:`CHUNK`); regular files only, links not followed, a file that cannot be read skipped.
    ``room(at)``: how many bytes may be read from offset ``at`` of all the files together (it may wait;
    0 stops the reading); ``None``: all of them."""
    chunk = chunk or CHUNK
    try:
        sink = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    base = 0
    try:
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                pos = 0
                while pos < st.st_size:
                    n = min(chunk, st.st_size - pos)
                    if room is not None:
                        n = min(n, room(base + pos))
                        if n <= 0:
                            return
                    got = os.sendfile(sink, fd, pos, n)
                    if got <= 0:
                        break
                    pos += got
                base += st.st_size
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(sink)


def prefetch(path: str | os.PathLike) -> threading.Thread | None:
    """Start reading ``path`` (a file, or the files of a directory) into the page cache in a daemon thread;
    returns the thread (``None`` where ``os.sendfile`` is missing). Errors are ignored (a hint)."""
    if not hasattr(os, "sendfile") or backend.plain():
        return None
    t = threading.Thread(target=_read, args=(_files(Path(path)),), name="rnnconvert-prefetch", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no thread under a tight memory limit (ulimit -v): a hint, not needed
        return None
    return t


#: bytes per ``os.sendfile`` call of :class:`ReadAhead` (small, so that it follows its window closely and stops soon)
AHEAD_CHUNK = 8 << 20


def ahead_window(slab_bytes: int) -> int:
    """The bytes :class:`ReadAhead` may read beyond the reader's position: two of the largest slabs (the
    one being read and the next), at least 64 MiB, at most 1 GiB and an eighth of the machine's memory
    (page cache the system may reclaim, but need not be asked to)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        mem = 8 << 30
    return int(max(64 << 20, min(2 * slab_bytes, 1 << 30, mem // 8)))


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:  # gone since it was listed: read nothing of it (the reader reports what it must)
        return 0


class ReadAhead:
    """Read the files of a streamed source (``files``: the files the reader reads, in the order it reads them;
    links are not followed) into the page cache
    in a daemon thread, at most ``window`` bytes ahead of the reader (:meth:`advance`), so that the device
    reads while the conversion computes and the slab reader finds its bytes cached.

    Measured on the 2-core benchmark VM (docs/performance.md, session 10): a cold 3 GB ``h5 -> pt`` verified
    conversion's slab reads cost 0.5 s of CPU and 1.0 s of wall each while the device was read under them,
    0.2 s each from the page cache. ``os.sendfile`` into ``/dev/null``: the kernel's readahead, no copy into the
    process. The reader's position is a fraction of the parameter bytes read so far, mapped onto the files'
    bytes in order: exact for sources stored in slab order (Keras HDF5, ``.pt``), an estimate for others
    (a TF checkpoint's shards); it never reads more than ``window`` beyond that estimate. Regular files only,
    links not followed; errors end the thread quietly (the reader reads for itself, as without it)."""

    def __init__(self, files: list[str | os.PathLike], window: int) -> None:
        self.files, self.window = [p for f in files for p in _files(Path(f))], int(window)
        self.limit = self.window
        self.total = sum(_size(f) for f in self.files) or 1
        self.stopped = False
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def start(self) -> ReadAhead:
        if hasattr(os, "sendfile") and self.files and not backend.plain():
            thread = threading.Thread(target=self._run, name="rnnconvert-readahead", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no thread under a tight memory limit (ulimit -v): read without it
                return self
            self.thread = thread
        return self

    def advance(self, done: int, total: int) -> None:
        """The reader is about to read the slab that starts ``done`` of ``total`` parameter bytes in."""
        with self.cond:
            self.limit = int(self.total * (done / max(total, 1))) + self.window
            self.cond.notify()

    def stop(self) -> None:
        """End the thread (within one :data:`AHEAD_CHUNK` read) and wait for it."""
        with self.cond:
            self.stopped = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join()

    def _room(self, at: int) -> int:
        """Bytes that may be read at offset ``at`` of all the files, waiting until there are some; 0: stop."""
        with self.cond:
            while not self.stopped and at >= self.limit:
                self.cond.wait()
            return 0 if self.stopped else self.limit - at

    def _run(self) -> None:
        _read(self.files, AHEAD_CHUNK, self._room)
