"""One rule for every file a multi-file source opens besides SRC itself: inside SRC's folder, a regular file,
opened by a path rnnconvert built.

An OpenVINO IR's ``.bin``, an Orbax checkpoint's zarr chunks, leaf folders and OCDBT data files, an ONNX model's
external data, a TF checkpoint's ``.index`` and ``.data-*`` shards, a SavedModel's ``variables/`` and
``keras_metadata.pb``: each is named by the source (a file name beside it, a path written inside it) and each is
a way for a shipped folder to reach another file of the machine (``model.bin -> ~/.ssh/id_rsa``: that file's
bytes would become "weights" in DST), or to block the reader for ever (a FIFO), or, resolved against the working
directory instead of the folder, to read whatever the user's current folder holds under that name. So:

* every path is joined to the **folder's real path** (``os.path.realpath``), never left relative (nothing a
  reader opens depends on the working directory);
* its real path (every symlink resolved, ``os.path.realpath``) must lie **inside the folder's real path**: a
  symlink to another file of the folder is fine, one leaving it is refused; the message names the entry, never
  where it leads to (its name can be private too);
* it must be of the kind expected: a **regular file** where a file is read (no FIFO, device, socket or
  directory), a directory where a folder is;
* a file is opened by its real path with ``O_NOFOLLOW`` and ``O_NONBLOCK`` (a FIFO put there between the check
  and the open neither blocks nor is read) and checked again on the open descriptor (``fstat``).

A folder handed whole to a native reader (tensorstore reads an Orbax checkpoint's files itself) is walked first
(:func:`check_tree`): every entry under it, symlinks resolved, inside and a regular file or directory, at most the
``names`` budget of entries. Every violation is one :class:`~rnnconvert.errors.FormatError` line (exit 3).
Source of the rule: issue 40 (the third attack corpus), HIGH 2 and 3.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ..errors import FormatError
from . import budget

_KINDS = {"file": stat.S_ISREG, "dir": stat.S_ISDIR}


def folder_of(src: str | os.PathLike) -> Path:
    """The folder whose files a source may open: SRC itself when it is a directory, else the directory holding
    SRC as given (the name given, not a symlink's target: an IR's ``.bin`` is beside the ``.xml`` named);
    its real path (symlinks resolved)."""
    p = os.path.abspath(src)
    return Path(os.path.realpath(p if os.path.isdir(p) else os.path.dirname(p)))


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "not a regular file")


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def inside(folder: str | os.PathLike, name: str | os.PathLike, where: object, what: str = "file",
           kind: str = "file", scope: str = "source's folder") -> Path:
    """The real path of ``name`` (joined to ``folder``'s real path when relative), checked: inside the folder
    once every symlink is resolved, existing, and a regular file (``kind='file'``) or a directory
    (``kind='dir'``).

    Args:
        folder: the source's folder (:func:`folder_of`); resolved here again.
        name: a path relative to the folder (as the source names it), or an absolute one (a path rnnconvert built
            from the folder).
        where: how messages name the source; what: how they name the entry (``"weights file"``); scope: how
            they name the folder (``"checkpoint's folder"``).

    Returns:
        the absolute real path (a :class:`~pathlib.Path`) to open.

    Raises:
        FormatError: outside the folder, missing, a symlink loop, or of another kind (a FIFO, a device, a
            directory where a file is read).
    """
    root = os.path.realpath(folder)
    joined = name if os.path.isabs(name) else os.path.join(root, name)
    real = os.path.realpath(joined)
    label = os.fspath(name)
    if not _within(real, root):
        raise FormatError(f"{where}: the {what} '{label}' leads outside the {scope} {root} (symlinks "
                          "resolved); refused (every file of a multi-file source is read from inside its folder)")
    try:
        st = os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FormatError(f"{where}: the {what} '{label}' is a symlink loop") from None
        raise FormatError(f"{where}: the {what} '{label}' is missing ({exc.strerror})") from None
    if not _KINDS[kind](st.st_mode):
        raise FormatError(f"{where}: the {what} '{label}' is {_kind(st.st_mode)}, not "
                          f"{'a regular file' if kind == 'file' else 'a directory'}; refused")
    return Path(real)


def open_inside(folder: str | os.PathLike, name: str | os.PathLike, where: object,
                what: str = "file", scope: str = "source's folder") -> BinaryIO:
    """``name`` checked by :func:`inside` and opened for reading by its real path (``O_NOFOLLOW``, ``O_NONBLOCK``
    then cleared, ``fstat`` on the descriptor: still a regular file). The caller closes it.

    Raises:
        FormatError: as :func:`inside`; or the file could not be opened (its cause named).
    """
    real = inside(folder, name, where, what, "file", scope)
    label = os.fspath(name)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FormatError(f"{where}: cannot open the {what} '{label}' ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{where}: the {what} '{label}' is {_kind(st.st_mode)}, not a regular file; refused")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_tree(folder: str | os.PathLike, where: object) -> int:
    """Walk everything under ``folder`` (not following symlinked folders; each symlink judged by its real
    path): every entry inside the folder and a regular file or a directory; at most the ``names`` budget of
    entries. For a folder handed whole to a native reader (tensorstore), which opens what it finds itself.

    Returns:
        the bytes of the regular files under it, each file counted once (by device and inode).

    Raises:
        FormatError: an entry leading outside, a symlink loop, a FIFO/device/socket.
        BudgetError: more entries than the ``names`` limit.
    """
    root = os.path.realpath(folder)
    count = budget.Counter(where, "names", "entries in the folder")
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, dirs, files in os.walk(root, followlinks=False, onerror=_raise):
        for name in dirs + files:
            count.tick()
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            try:
                lst = os.lstat(full)
            except OSError as exc:
                raise FormatError(f"{where}: cannot read the entry '{rel}' ({exc.strerror})") from None
            if stat.S_ISLNK(lst.st_mode) or not (stat.S_ISDIR(lst.st_mode) or stat.S_ISREG(lst.st_mode)):
                real = inside(root, rel, where, "entry", "dir" if os.path.isdir(full) else "file")
                st = os.stat(real)
            else:
                st = lst
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _raise(exc: OSError) -> None:
    raise FormatError(f"{exc.filename}: cannot list the folder ({exc.strerror})") from None
