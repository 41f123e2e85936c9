"""Reading a written file into the page cache ahead of the framework that maps it.

``rnnconvert verify SRC DST`` runs DST's framework on a file that is usually not in the page cache. torch
maps it (``torch.load(mmap=True)``) and faults its pages in as its kernels touch them, a few at a time: on
the 2-core test machine the target side of verifying the 3 GB benchmark ``.pt`` took 4.8 s from a cold
cache against 1.7 s with the file read ahead in the background (docs/performance.md, session 8), the
device reading the whole file in 0.8 s. :func:`prefetch` asks the kernel to read a file (or a directory's
files) in file order, in chunks (``posix_fadvise(POSIX_FADV_WILLNEED)``: the kernel reads at most its
readahead window per call), from a daemon thread, so that the framework finds the pages there.

A hint, not a copy: nothing is held in the process's memory, the kernel may drop the pages again under
memory pressure (the framework then reads them itself), and where ``posix_fadvise`` is missing nothing
happens.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

#: bytes per ``posix_fadvise`` call (the kernel reads at most its readahead window per call: 8 MiB here)
CHUNK = 8 << 20


def _files(path: Path) -> list[Path]:
    """``path`` itself, or the regular files directly under a directory (a TF checkpoint's), links not
    followed."""
    if path.is_dir() and not path.is_symlink():
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_file(follow_symlinks=False))
    return [path] if path.is_file() else []


def _advise(files: list[Path]) -> None:
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            for pos in range(0, size, CHUNK):
                os.posix_fadvise(fd, pos, min(CHUNK, size - pos), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def prefetch(path: str | os.PathLike) -> threading.Thread | None:
    """Start reading ``path`` (a file, or the files of a directory) into the page cache in a daemon thread;
    returns the thread (``None`` where ``posix_fadvise`` is missing). Errors are ignored (a hint)."""
    if not hasattr(os, "posix_fadvise"):
        return None
    t = threading.Thread(target=_advise, args=(_files(Path(path)),), name="rnnconvert-prefetch", daemon=True)
    t.start()
    return t
