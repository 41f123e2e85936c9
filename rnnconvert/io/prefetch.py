"""Reading a written file into the page cache ahead of the framework that maps it.

``rnnconvert verify SRC DST`` runs DST's framework on a file that is usually not in the page cache. torch
maps it (its loader's ``mmap=True``) and faults its pages in as its kernels touch them: on the 2-core test
machine the target side of verifying the 3 GB benchmark ``.pt`` took 4.8-5.6 s from a cold cache, against
0.9 s with the file read ahead (docs/performance.md, session 8). :func:`prefetch` reads a file (or a
directory's files) once, in file order, from a daemon thread, with ``os.sendfile`` into ``/dev/null``: the
kernel's ordinary read path, whose readahead fills the cache with large folios, and no copy into the
process (0.08 s of CPU for 3 GB). ``posix_fadvise(WILLNEED)`` was measured too: 0.6 s of CPU, and its
single pages made torch's target side 1.5 s instead of 0.9 s.

A hint, not a copy: nothing is held in the process's memory, the kernel may drop the pages again under
memory pressure (the framework then reads them itself), and where ``os.sendfile`` is missing nothing
happens. Only regular files are read (a FIFO put in DST's place is skipped, never waited on).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

#: bytes per ``os.sendfile`` call
CHUNK = 64 << 20


def _files(path: Path) -> list[Path]:
    """``path`` itself, or the regular files directly under a directory (a TF checkpoint's), links not
    followed."""
    if path.is_dir() and not path.is_symlink():
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_file(follow_symlinks=False))
    return [path] if path.is_file() else []


def _read(files: list[Path]) -> None:
    try:
        sink = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
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
                    got = os.sendfile(sink, fd, pos, min(CHUNK, st.st_size - pos))
                    if got <= 0:
                        break
                    pos += got
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(sink)


def prefetch(path: str | os.PathLike) -> threading.Thread | None:
    """Start reading ``path`` (a file, or the files of a directory) into the page cache in a daemon thread;
    returns the thread (``None`` where ``os.sendfile`` is missing). Errors are ignored (a hint)."""
    if not hasattr(os, "sendfile"):
        return None
    t = threading.Thread(target=_read, args=(_files(Path(path)),), name="rnnconvert-prefetch", daemon=True)
    t.start()
    return t
