"""Putting an output in place (one place for it): the destination check, the temporary beside DST, its
fsync and the rename (never replacing a DST without ``force``), and the one-line error for an environment
that refuses the write (full disk, read-only file system, permissions).

:func:`rnnconvert.api.save` and :func:`rnnconvert.api.convert` call, in this order: :func:`check_destination`
(before anything is read or written), :func:`temp_beside`, the writer on the temporary path, :func:`commit`
(after verification), :func:`discard` (always, in ``finally``), and :func:`output_error` on an exception.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import OutputError, OutputExistsError, RNNConvertError

STALE_TEMP_SECONDS = 3600


#: The extended attribute that marks a temporary as rnnconvert's own (its value: the temporary's name).
TEMP_MARK = "user.rnnconvert.temp"


def _ours(old: Path, dst: Path) -> bool:
    """Whether ``old`` is a temporary rnnconvert made for ``dst``: a regular file (not a symlink) of this
    user, named as :func:`temp_beside` names them (``mkstemp``'s 8 random characters), carrying the
    :data:`TEMP_MARK` attribute with its own name. A user's lookalike (no attribute) is never deleted."""
    import stat

    if not re.fullmatch(rf"\.{re.escape(dst.name)}\.[a-z0-9_]{{8}}\.rnnconvert-tmp", old.name):
        return False
    try:
        st = old.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return False
        return os.getxattr(old, TEMP_MARK, follow_symlinks=False) == old.name.encode()
    except (OSError, AttributeError):  # no such attribute, or a file system / platform without them
        return False


def temp_beside(dst: Path) -> Path:
    """A new ``.<name>.*.rnnconvert-tmp`` beside ``dst``, marked as rnnconvert's own (the extended attribute
    :data:`TEMP_MARK`, where the file system keeps one); marked temporaries of the same name older than an
    hour (left by a killed run: nothing else removes them) are deleted first, and nothing else is
    (:func:`_ours`). A temporary that could not be marked, or that a writer replaced by a folder, is left for
    the user to remove (docs/security.md).

    Raises:
        OutputError: the folder takes no new file (``/proc``, permissions): exit 10.
    """
    import glob
    import time

    for old in dst.parent.glob(f".{glob.escape(dst.name)}.*.rnnconvert-tmp"):
        try:
            if time.time() - old.lstat().st_mtime > STALE_TEMP_SECONDS and _ours(old, dst):
                old.unlink()
        except OSError:
            pass
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".rnnconvert-tmp", dir=dst.parent)
    except OSError as exc:
        raise OutputError(f"{dst}: cannot write the output: {dst.parent} takes no new file "
                          f"({exc.strerror or exc}); nothing was written") from exc
    try:
        os.setxattr(fd, TEMP_MARK, Path(tmp).name.encode())
    except (OSError, AttributeError):
        pass
    finally:
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


#: The entries of a folder rnnconvert writes (a TF checkpoint: formats/tf/tf1_write.py, tf2_write.py; an OpenVINO
#: IR: formats/openvino/ir_write.py): the only ones ``--force`` replaces.
OWN_TF_ENTRY = re.compile(r"^(checkpoint|ckpt(-\d+)?\.(index|data-\d{5}-of-\d{5})|model\.(xml|bin))$")


def check_destination(dst: Path, force: bool) -> None:
    """Refuse a DST that is neither a new path nor a regular file (or, for a directory format, a folder
    holding only a TF checkpoint rnnconvert writes), whatever ``force`` says: a dangling symlink would be
    replaced by the output, a device or FIFO turned into a regular file, a foreign folder emptied. An
    existing DST without ``force`` is refused too.

    Raises:
        OutputExistsError (exit 6), naming DST and what it is.
    """
    import stat

    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputExistsError(f"{dst}: cannot be examined ({exc.strerror}); refused") from exc
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(dst)
        except OSError:
            raise OutputExistsError(f"{dst} is a dangling symbolic link; refused (remove it or choose another "
                                    "output path)") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        foreign = sorted(e.name for e in os.scandir(dst) if not OWN_TF_ENTRY.match(e.name))
        if foreign:
            what = (f"{dst} is a directory holding files rnnconvert did not write (e.g. '{foreign[0]}'); "
                    "refused whatever ")
            raise OutputExistsError(what + "force=True says", cli=what + "--force says")
    elif not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "special")
        what = f"{dst} is {kind}, not a regular file; refused whatever "
        raise OutputExistsError(what + "force=True says", cli=what + "--force says")
    if not force:
        raise OutputExistsError(f"{dst} exists; pass force=True to overwrite it",
                                cli=f"{dst} exists; pass --force to overwrite it")


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """``renameat2(src, dst, RENAME_NOREPLACE)`` (Linux 3.15+): True when done, False when the system or
    file system cannot; ``FileExistsError`` when ``dst`` exists."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, noreplace = -100, 1
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def commit(tmp: Path, dst: Path, force: bool = True) -> None:
    """Move the finished temporary output into place, with the permissions of :func:`_set_mode`.

    Without ``force`` DST is never replaced, even by a file that appeared while converting (another
    conversion to the same new path): the output is linked into place (``os.link``, or
    ``renameat2(RENAME_NOREPLACE)`` for folders and file systems without hard links), which fails if DST
    exists. With ``force`` DST is checked again (:func:`check_destination`) and replaced atomically;
    directory outputs (TF checkpoints) replace only a folder holding what rnnconvert writes.

    Raises:
        OutputExistsError: DST exists (without ``force``) or is not replaceable.
    """
    _set_mode(tmp, dst)
    if not tmp.is_dir():
        try:  # the output is the user's file now: no temporary's mark on it
            os.removexattr(tmp, TEMP_MARK)
        except (OSError, AttributeError):
            pass
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
    if not force:
        try:
            if tmp.is_dir() or not _link(tmp, dst):
                if not _rename_noreplace(tmp, dst):
                    check_destination(dst, False)  # last resort: a small window remains
                    os.rename(tmp, dst)
        except FileExistsError:
            raise OutputExistsError(f"{dst} appeared while converting (another process wrote it); "
                                    "not replaced, the result was discarded") from None
        return
    check_destination(dst, True)
    if tmp.is_dir():
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif os.path.lexists(dst):
            dst.unlink()
    os.replace(tmp, dst)


def _link(tmp: Path, dst: Path) -> bool:
    """``os.link(tmp, dst)`` then remove ``tmp``: True when done, False when the file system has no hard
    links; ``FileExistsError`` when ``dst`` exists."""
    import errno

    try:
        os.link(tmp, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            return False
        raise
    tmp.unlink()
    return True


#: Causes of an OSError that are the environment's, not a bug or the file's (errno -> short cause).
_ENV_ERRNO = {"ENOSPC": "no space left on the device", "EDQUOT": "disk quota exceeded",
              "EROFS": "read-only file system", "EACCES": "permission denied", "EPERM": "operation not permitted",
              "EFBIG": "file too large for the file system", "EIO": "input/output error"}
#: The same causes as C libraries (libhdf5, TensorFlow) spell them inside their own exception messages.
_ENV_TEXT = {"No space left on device": "no space left on the device", "Disk quota exceeded": "disk quota exceeded",
             "Read-only file system": "read-only file system", "Permission denied": "permission denied",
             "File too large": "file too large for the file system"}


def output_error(exc: BaseException, dst: Path) -> "OutputError | None":
    """The :class:`~rnnconvert.errors.OutputError` (exit 10) for an exception raised while writing ``dst``
    when its cause is the environment (full disk, read-only file system, permissions), also when a C
    library (h5py, TensorFlow) wrapped it in its own exception; ``None`` otherwise."""
    import errno


    cause = None
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno is not None:
            cause = _ENV_ERRNO.get(errno.errorcode.get(e.errno, ""))
            if cause:
                break
    if cause is None:
        text = str(exc)
        cause = next((c for t, c in _ENV_TEXT.items() if t in text), None)
    if cause is None:
        return None
    where = dst.parent if dst.parent != Path("") else Path(".")
    return OutputError(f"{dst}: cannot write the output: {cause} (on {where}); nothing was left behind")


def discard(tmp: Path) -> None:
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def write_in_place(dst: Path, write: Callable[[Path], Any], force: bool = True) -> Any:
    """``write(tmp)`` into a temporary beside ``dst``, then put it in place (:func:`commit`); the temporary is
    always removed. An ``OSError`` (disk full, read-only file system, ...) becomes the one-line
    :func:`output_error`; rnnconvert's own errors pass through. Returns what ``write`` returned."""
    tmp = None
    try:
        tmp = temp_beside(dst)
        got = write(tmp)
        commit(tmp, dst, force)
        return got
    except RNNConvertError:
        raise
    except Exception as exc:
        env = output_error(exc, dst)
        if env is None:
            raise
        raise env from exc
    finally:
        if tmp is not None:
            discard(tmp)

