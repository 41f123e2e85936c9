"""Putting outputs in place (one place for it): the destination rules (:func:`check_destination`: new, a
regular file, or a folder rnnconvert wrote as its :data:`MANIFEST` says; :func:`check_distinct`: a
``--report`` or ``--fix`` path never SRC, DST or the file diagnosed), the temporary beside DST, its fsync and
the rename (never replacing a DST without ``force``), several outputs and folders replaced as one
(:func:`commit_set`, with a journal :func:`recover` completes after a kill), and the one-line error for an
environment that refuses the write (full disk, read-only file system, permissions).

:func:`rnnconvert.api.save` and :func:`rnnconvert.api.convert` call, in this order: :func:`check_destination`
(before anything is read or written), :func:`temp_beside`, the writer on the temporary path, :func:`commit`
or :func:`commit_set` (after verification), :func:`discard` (always, in ``finally``), and
:func:`output_error` on an exception. docs/security.md, "Outputs", says what each step promises.
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
        return os.getxattr(old, TEMP_MARK, follow_symlinks=False) == os.fsencode(old.name)
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
        os.setxattr(fd, TEMP_MARK, os.fsencode(Path(tmp).name))
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


def check_destination(dst: Path, force: bool, *, quick: bool = False) -> None:
    """Refuse a DST that is neither a new path nor a regular file (or a folder output rnnconvert wrote, as its
    manifest says: :func:`foreign_entry`), whatever ``force`` says: a dangling symlink would be replaced by the
    output, a device or FIFO turned into a regular file, a user's folder that merely has an output's name
    emptied. An existing DST without ``force`` is refused too. A set of outputs a killed run left half
    replaced is completed first (:func:`recover`).

    ``quick``: a folder's files compared by size only, and no recovery (:func:`commit_set`'s second look).

    Raises:
        OutputExistsError (exit 6), naming DST and what it is (for a folder, the first entry rnnconvert did
        not write).
    """
    import stat

    _utf8_name(dst)
    if not quick:
        recover(dst)
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
        if os.path.islink(dst):
            what = f"{dst} is a symbolic link to a directory; refused whatever "
            raise OutputExistsError(what + "force=True says", cli=what + "--force says")
        foreign = foreign_entry(dst, quick)
        if foreign:
            what = f"{dst} is a directory holding {foreign}; refused whatever "
            why = " says (only a folder rnnconvert wrote, as its manifest lists, is replaced)"
            raise OutputExistsError(what + "force=True" + why, cli=what + "--force" + why)
    elif not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "special")
        what = f"{dst} is {kind}, not a regular file; refused whatever "
        raise OutputExistsError(what + "force=True says", cli=what + "--force says")
    if not force:
        raise OutputExistsError(f"{dst} exists; pass force=True to overwrite it",
                                cli=f"{dst} exists; pass --force to overwrite it")


def _utf8_name(dst: Path) -> None:
    """Refuse an output path holding bytes that are not UTF-8 (``os.fsdecode`` keeps them as lone surrogates):
    torch, onnxruntime and the HTML report cannot take such a name.

    Raises:
        OptionError (exit 2, a usage error)."""
    from ..errors import OptionError, printable

    text = os.fspath(dst)
    if any("\udc80" <= ch <= "\udcff" for ch in text):
        raise OptionError(f"{printable(text)}: the output path holds bytes that are not UTF-8; frameworks cannot "
                          "open it: choose another name")


def check_distinct(out: Path, others: dict[str, Any], what: str, cli_what: str | None = None) -> None:
    """Refuse an output path (``--report``, ``--fix``) that names one of ``others`` (``{label: path}``: SRC,
    DST, the file diagnosed...) or lies inside one of them (a folder SRC or DST), whatever ``force`` says:
    compared by resolved path (symlinks followed, also one at ``out``) and by file identity (a hard link,
    ``os.path.samefile``). ``None`` paths are skipped.

    Raises:
        OutputExistsError (exit 6): ``"<out>: <what> would be <label> (<path>); choose another path"``.
    """
    out_r = Path(os.path.realpath(out))
    for label, p in others.items():
        if p is None:
            continue
        p_r = Path(os.path.realpath(p))
        same = out_r == p_r or p_r in out_r.parents or os.path.abspath(out) == os.path.abspath(p)
        if not same:
            try:
                same = os.path.samefile(out, p)
            except (OSError, ValueError):
                pass
        if same:
            where = "inside " if out_r != p_r and p_r in out_r.parents else ""
            tail = f" would be {where}{label} ({p}); refused whatever "
            raise OutputExistsError(f"{out}: {what}{tail}force=True says: choose another path",
                                    cli=f"{out}: {cli_what or what}{tail}--force says: choose another path")


#: The file rnnconvert writes inside each folder output (a TF checkpoint, an OpenVINO IR): every other file's
#: relative name, size and sha256. ``force`` replaces a folder only when every entry is listed and unchanged.
MANIFEST = ".rnnconvert-manifest.json"
#: A manifest larger than this is not rnnconvert's (a folder output holds a few files).
MANIFEST_MAX_BYTES = 1 << 20


#: Names of the files rnnconvert's folder writers write (a TF checkpoint: formats/tf/tf1_write.py,
#: tf2_write.py; an OpenVINO IR: formats/openvino/ir_write.py): only to choose which entry a refusal names.
_OUTPUT_NAME = re.compile(r"^(checkpoint|ckpt(-\d+)?\.(index|data-\d{5}-of-\d{5})|model\.(xml|bin))$")


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``folder`` (relative POSIX names, the manifest left out) with its ``lstat``; a
    sub-folder is listed as ``name/`` (its own entries follow), a symlink or special file with its stat."""
    import stat

    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        rel_root = os.path.relpath(root, folder)
        for name in sorted(dirs) + sorted(files):
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel == MANIFEST:
                continue
            st = os.lstat(os.path.join(root, name))
            out.append((rel + ("/" if stat.S_ISDIR(st.st_mode) else ""), st))
    return out


def write_manifest(folder: Path) -> None:
    """Write :data:`MANIFEST` in a folder output rnnconvert has just written (before it is put in place).

    Raises:
        OutputError: the writer left something other than regular files and folders (a bug)."""
    import json
    import stat

    files = {}
    for rel, st in _files(folder):
        if rel.endswith("/"):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{folder}: the writer left {rel!r}, not a regular file; nothing was written")
        files[rel] = {"size": st.st_size, "sha256": _sha256(folder / rel)}
    data = json.dumps({"rnnconvert": 1, "files": files}, indent=1, sort_keys=True).encode()
    with open(folder / MANIFEST, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def foreign_entry(folder: Path, quick: bool = False) -> str | None:
    """Why ``folder`` is not a folder output rnnconvert wrote: ``None`` when its :data:`MANIFEST` lists every
    other entry with the size and sha256 it has now (``quick``: sizes only), else a phrase naming the first
    entry that is not (``"'precious.txt', which rnnconvert did not write"``) or the missing manifest. Judged by
    content, not names: a user's ``model.bin/`` folder or a checkpoint edited since is refused."""
    import json
    import stat

    man = folder / MANIFEST
    try:
        st = os.lstat(man)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_MAX_BYTES:
            raise ValueError
        listed = json.loads(man.read_bytes())["files"]
        if not isinstance(listed, dict):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        # named first: an entry no writer of rnnconvert names so (the user's own file is the telling one)
        entries = sorted((rel for rel, _ in _files(folder)), key=lambda rel: bool(_OUTPUT_NAME.match(rel)))
        first = f"'{entries[0]}' and " if entries else "nothing but "
        return f"{first}no readable {MANIFEST}: not a folder rnnconvert wrote"
    for rel, st in _files(folder):
        if rel.endswith("/"):
            if not any(isinstance(k, str) and k.startswith(rel) for k in listed):
                return f"'{rel}', which rnnconvert did not write"
            continue
        want = listed.get(rel)
        if not isinstance(want, dict):
            return f"'{rel}', which rnnconvert did not write"
        if not stat.S_ISREG(st.st_mode):
            return f"'{rel}', not the regular file rnnconvert wrote"
        if st.st_size != want.get("size") or (not quick and _sha256(folder / rel) != want.get("sha256")):
            return f"'{rel}', changed since rnnconvert wrote it"
    return None


def _renameat2(src: Path, dst: Path, flag: int) -> bool:
    """``renameat2(src, dst, flag)`` (Linux 3.15+): True when done, False when the system or file system
    cannot; ``FileExistsError`` when ``dst`` exists (``RENAME_NOREPLACE``)."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flag) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """``renameat2(src, dst, RENAME_NOREPLACE)``: True when done, False when the system or file system
    cannot; ``FileExistsError`` when ``dst`` exists."""
    return _renameat2(src, dst, 1)


def exchange(a: Path, b: Path) -> bool:
    """``renameat2(a, b, RENAME_EXCHANGE)``: the two paths swap what they name, in one step (the old
    output is never absent); False when the system or file system cannot."""
    return _renameat2(a, b, 2)


def _is_dir(p: Path) -> bool:
    """A real folder at ``p`` (not a symlink to one)."""
    import stat

    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _remove(p: Path) -> None:
    """Remove what ``p`` names (a folder with its content; a symlink, not what it points at)."""
    if _is_dir(p):
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prepare(tmp: Path, dst: Path) -> None:
    """A finished temporary made the user's output: its mode, no temporary's mark, on disk (fsync); a folder
    output gets its :data:`MANIFEST`."""
    _set_mode(tmp, dst)
    if _is_dir(tmp):
        for root, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as fh:
                    os.fsync(fh.fileno())
        write_manifest(tmp)
        _fsync_dir(tmp)
        return
    try:  # the output is the user's file now: no temporary's mark on it
        os.removexattr(tmp, TEMP_MARK)
    except (OSError, AttributeError):
        pass
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())


def _swap_in(tmp: Path, dst: Path, aside: Path) -> None:
    """Put ``tmp`` at ``dst`` whatever is there; the old content ends at ``tmp`` (``RENAME_EXCHANGE``: DST is
    never absent) or, where the file system cannot exchange, at ``aside`` (renamed aside first: the journal
    of :func:`commit_set` completes the step after a kill). The caller removes both."""
    if not os.path.lexists(dst):
        os.rename(tmp, dst)
    elif not (_is_dir(tmp) or _is_dir(dst)):
        os.replace(tmp, dst)
    elif not exchange(tmp, dst):
        os.rename(dst, aside)
        os.rename(tmp, dst)


def _place_new(tmp: Path, dst: Path) -> None:
    """Put ``tmp`` at a new ``dst``, never replacing anything: ``os.link`` (files) or
    ``renameat2(RENAME_NOREPLACE)``; ``FileExistsError`` when DST exists."""
    if _is_dir(tmp) or not _link(tmp, dst):
        if not _rename_noreplace(tmp, dst):
            if os.path.lexists(dst):  # last resort: a small window remains
                raise FileExistsError(str(dst))
            os.rename(tmp, dst)


#: The journal :func:`commit_set` writes beside each output of a set while it replaces them (``.<name>`` +
#: this): which temporary goes where; :func:`recover` completes a set a killed run left half replaced.
JOURNAL = ".rnnconvert-journal"


def _journal_path(dst: Path) -> Path:
    return dst.parent / f".{dst.name}{JOURNAL}"


def _aside_path(dst: Path) -> Path:
    import secrets

    return dst.parent / f".{dst.name}.{secrets.token_hex(4)}.rnnconvert-tmp"


def commit(tmp: Path, dst: Path, force: bool = True) -> None:
    """Move the finished temporary output into place (:func:`commit_set` of one output).

    Raises:
        OutputExistsError: DST exists (without ``force``) or is not replaceable.
    """
    commit_set([(tmp, dst)], force)


def commit_set(pairs: list[tuple[Path, Path]], force: bool = True) -> None:
    """Put finished temporaries in place as one: ``pairs`` of ``(temporary, DST)``, each temporary beside its
    DST, with the permissions of :func:`_set_mode` (a folder output gets its :data:`MANIFEST` first).

    Without ``force`` no DST is ever replaced, even by a file that appeared while converting (another
    conversion to the same new path): each output is linked into place (``os.link``, or
    ``renameat2(RENAME_NOREPLACE)`` for folders and file systems without hard links), which fails if DST
    exists (the outputs of the set already placed are removed again). With ``force`` each DST is checked
    again (:func:`check_destination`: a folder only when rnnconvert wrote it) and replaced: a file by
    ``rename``, a folder by ``renameat2(RENAME_EXCHANGE)`` (never absent), else renamed aside first.

    One regular file replacing a file is one ``rename``. Anything else (several outputs: DST and the
    ``--emit-module`` files; a folder) first writes a journal beside each DST (:data:`JOURNAL`: the
    temporaries, their inodes, where the old content goes), then renames, removes the old content and the
    journals: a run killed in between leaves a journal, and the next :func:`check_destination` of any of
    these outputs completes the set (:func:`recover`); at no time is one output new and another old without a
    journal saying so.

    Raises:
        OutputExistsError: a DST exists (without ``force``) or is not replaceable.
    """
    import json

    for tmp, dst in pairs:
        _prepare(tmp, dst)
    if force:
        for _, dst in pairs:
            check_destination(dst, True, quick=True)
    if len(pairs) == 1 and not _is_dir(pairs[0][0]) and not _is_dir(pairs[0][1]):
        tmp, dst = pairs[0]
        if force:
            os.replace(tmp, dst)
            _fsync_dir(dst.parent)
            return
        try:
            _place_new(tmp, dst)
        except FileExistsError:
            raise OutputExistsError(f"{dst} appeared while converting (another process wrote it); "
                                    "not replaced, the result was discarded") from None
        _fsync_dir(dst.parent)
        return
    entries = []
    for tmp, dst in pairs:
        st = os.lstat(tmp)
        entries.append({"tmp": os.path.abspath(tmp), "dst": os.path.abspath(dst),
                        "aside": os.path.abspath(_aside_path(dst)), "dev": st.st_dev, "ino": st.st_ino})
    journals = list(dict.fromkeys(os.path.abspath(_journal_path(Path(e["dst"]))) for e in entries))
    data = json.dumps({"rnnconvert_journal": 1, "pairs": entries, "journals": journals}).encode()
    written: list[str] = []
    placed: list[dict] = []
    try:
        for j in journals:
            part = Path(j + ".part")
            with open(part, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(part, j)
            written.append(j)
            _fsync_dir(Path(j).parent)
        for e in entries:
            tmp, dst = Path(e["tmp"]), Path(e["dst"])
            if force:
                _swap_in(tmp, dst, Path(e["aside"]))
            else:
                try:
                    _place_new(tmp, dst)
                except FileExistsError:
                    _take_out(placed)
                    placed.clear()
                    raise OutputExistsError(f"{dst} appeared while converting (another process wrote it); "
                                            "not replaced, the result was discarded") from None
            placed.append(e)
        for e in entries:
            _fsync_dir(Path(e["dst"]).parent)
            _remove(Path(e["tmp"]))
            _remove(Path(e["aside"]))
        for j in journals:
            _remove(Path(j))
    except BaseException:
        if not placed:  # nothing replaced yet: no journal needed
            for j in journals:
                _remove(Path(j + ".part"))
                if j in written:
                    _remove(Path(j))
        else:  # interrupted (SIGTERM, Ctrl-C) half way, before the caller's clean-up removes the temporaries
            try:  # still to be put in place: the set completed now (force), or its new paths taken out again
                if force or len(placed) == len(entries):
                    _complete(entries, journals)
                else:
                    _take_out(placed)
                    for j in journals:
                        _remove(Path(j))
            except BaseException:  # noqa: BLE001 - the journal stays for recover()
                pass
        raise


def _take_out(placed: list[dict]) -> None:
    """Remove the new outputs a set without ``force`` had put at new paths (each only while it is still the
    file this set placed: same inode)."""
    for p in placed:
        try:
            st = os.lstat(p["dst"])
            if (st.st_dev, st.st_ino) == (p["dev"], p["ino"]):
                _remove(Path(p["dst"]))
        except OSError:
            pass


def _complete(entries: list[dict], journals: list[str]) -> None:
    """Finish a set from its journal's entries: each temporary still holding its new output (same inode) put
    in place, the old content removed, then the journals."""
    for e in entries:
        tmp, out, aside = Path(e["tmp"]), Path(e["dst"]), Path(e["aside"])
        try:
            t = os.lstat(tmp)
        except OSError:
            t = None
        if t is not None and (t.st_dev, t.st_ino) == (e["dev"], e["ino"]):
            _swap_in(tmp, out, aside)
        _fsync_dir(out.parent)
    for e in entries:
        _remove(Path(e["tmp"]))
        _remove(Path(e["aside"]))
    for j in journals:
        _remove(Path(j))


def recover(dst: Path) -> None:
    """Complete the set of outputs a killed :func:`commit_set` left half replaced, when a journal lies beside
    ``dst``: every temporary still holding its new output is put in place, the old content removed, then
    the journals. A journal that is not rnnconvert's (another owner, a foreign shape, paths that are not
    temporaries beside their outputs) is left alone."""
    import json
    import stat

    j = _journal_path(Path(dst))
    part = Path(f"{j}.part")  # a journal being written when the run was killed: nothing was replaced yet
    try:
        if os.lstat(part).st_uid == os.getuid() and not _is_dir(part):
            os.unlink(part)
    except OSError:
        pass
    try:
        st = os.lstat(j)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MANIFEST_MAX_BYTES:
            return
        data = json.loads(j.read_bytes())
        entries, journals = data["pairs"], data["journals"]
        for e in entries:
            tmp, out, aside = Path(e["tmp"]), Path(e["dst"]), Path(e["aside"])
            pattern = rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}\.rnnconvert-tmp"
            beside = tmp.parent == out.parent and re.fullmatch(pattern, tmp.name)
            # (diagnose --fix writes its output as <out's folder>/.rnnconvert-fix-XXXX/<out's name>)
            in_fix_folder = (tmp.parent.parent == out.parent and tmp.name == out.name
                             and tmp.parent.name.startswith(".rnnconvert-fix-"))
            if not ((beside or in_fix_folder) and aside.parent == out.parent and re.fullmatch(pattern, aside.name)
                    and isinstance(e["ino"], int)):
                return
        own = {os.path.abspath(_journal_path(Path(e["dst"]))) for e in entries}
        if os.path.abspath(j) not in journals or not set(journals) <= own:
            return
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    _complete(entries, journals)


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

