"""Putting an output in place, in one place: the exists/force rule, a temporary beside the target,
fsync, permissions, and the atomic rename (or nothing at all on any error).

Every writer writes to the temporary path :func:`staged` gives it; :func:`commit` renames it into place
only when the caller has decided the output is good (``api.convert``: after verification).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import FormatError, OutputExistsError


def check_output(dst: Path, force: bool, src: Path | None = None) -> None:
    """Refuse an output path before anything is read or written: an existing ``dst`` without ``force``,
    ``dst`` naming the source ``src`` itself, or a missing output directory.

    Raises:
        OutputExistsError, FormatError.
    """
    if dst.exists() and not force:
        raise OutputExistsError(f"{dst} exists; pass --force (force=True) to overwrite it")
    if src is not None and dst.resolve() == Path(src).resolve():
        raise OutputExistsError(f"{dst} is the source file; choose another output path")
    if not dst.parent.exists():
        raise FormatError(f"{dst.parent}: output directory does not exist")


@contextlib.contextmanager
def staged(dst: Path) -> Iterator[Path]:
    """A fresh temporary path beside ``dst`` (:func:`temp_beside`) for the block; whatever is left of it
    afterwards (an error, or no :func:`commit`) is removed."""
    tmp = temp_beside(dst)
    try:
        yield tmp
    finally:
        discard(tmp)


STALE_TEMP_SECONDS = 3600


def temp_beside(dst: Path) -> Path:
    """A new ``.<name>.*.rnnconvert-tmp`` beside ``dst``; temporaries of the same name older than an hour
    (left by a killed run: nothing else removes them) are deleted first."""
    import glob
    import time

    for old in dst.parent.glob(f".{glob.escape(dst.name)}.*.rnnconvert-tmp"):
        try:
            if time.time() - old.stat().st_mtime > STALE_TEMP_SECONDS:
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".rnnconvert-tmp", dir=dst.parent)
    os.close(fd)
    return Path(tmp)


def _umask() -> int:
    """The process umask (read from ``/proc/self/status`` where there is one, without changing it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _set_mode(tmp: Path, dst: Path) -> None:
    """Give the output the permissions ``cp`` would: those of the file it replaces, else the umask's
    default (``mkstemp`` creates 0600)."""
    import stat

    try:
        mode = stat.S_IMODE(dst.stat().st_mode) if dst.exists() and dst.is_dir() == tmp.is_dir() else (
            (0o777 if tmp.is_dir() else 0o666) & ~_umask())
        os.chmod(tmp, mode)
    except OSError:  # a filesystem without permissions: nothing to keep
        pass


def commit(tmp: Path, dst: Path) -> None:
    """Move the finished temporary output into place, with the permissions of :func:`_set_mode`.
    Directory outputs (TF checkpoints) replace an existing ``dst`` only when it is a directory
    rnnconvert could have written (it has a ``checkpoint`` file) or a file."""
    _set_mode(tmp, dst)
    if tmp.is_dir():
        if dst.is_dir():
            if not (dst / "checkpoint").is_file():
                raise OutputExistsError(f"{dst} is a directory that does not hold a TF checkpoint; "
                                        "not replacing it")
            shutil.rmtree(dst)
        elif dst.exists():
            dst.unlink()
        os.replace(tmp, dst)
        return
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dst)


def discard(tmp: Path) -> None:
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)
