"""Isolation for parsers written in C that a damaged file can send into an endless loop or a crash.

libhdf5 (under h5py) loops forever on some corrupted files (the fuzzer in ``bench/fuzz`` finds such
files within a thousand mutations of a Keras fixture), holding the GIL: neither a signal handler nor
a watchdog thread can get control back. :func:`isolated` therefore runs such a read in a forked
child process; the parent waits at most the deadline, then kills the child and raises
:class:`~rnnconvert.errors.FormatError` (exit code 3). A child that dies (a segfault in C) gives a
FormatError too (TensorFlow's checkpoint reader aborts on some forged ``.index`` files). The child's
stderr goes to ``/dev/null``: what a dying C library prints there is not for the user; the error that
counts comes back to the parent. The result comes back pickled from our own child (never from the file).

The deadline is ``RNNCONVERT_READ_TIMEOUT`` seconds (default 60) plus one second per MiB of input.
``RNNCONVERT_ISOLATE=0`` reads in-process instead (no protection); platforms without ``fork`` do.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from pathlib import Path
from typing import Any, Callable


def budget(path: str | Path) -> float:
    """Seconds allowed to read ``path``: the base deadline plus one second per MiB."""
    from ..process import settings

    base = settings.value("RNNCONVERT_READ_TIMEOUT")
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0
    return base + size / (1 << 20)


class ReaderCrash(Exception):
    """An exception of the child that could not be pickled, re-raised by type name and message."""


def _child(fn: Callable[..., Any], args: tuple, w: int) -> None:
    try:
        try:
            data = pickle.dumps(("ok", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            try:
                data = pickle.dumps(("err", exc), protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(data)
            except BaseException:  # noqa: BLE001
                data = pickle.dumps(("err", ReaderCrash(f"{type(exc).__name__}: {exc}")))
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)


def _die_with(parent: int) -> None:
    """In the child: be killed when the parent dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so that a
    parent killed before its deadline (SIGKILL, an OOM kill) leaves no reader looping on a damaged file; and
    exit at once if the parent is already gone."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG (linux/prctl.h) = 1
    except (OSError, AttributeError):  # not Linux: the parent's deadline still bounds the child
        pass
    if os.getppid() != parent:
        os._exit(0)


def isolated(fn: Callable[..., Any], args: tuple, path: str | Path, what: str) -> Any:
    """``fn(*args)`` in a forked child under the deadline of :func:`budget`; its result or exception.

    Raises:
        FormatError: the child ran past the deadline or died without an answer.
        whatever ``fn`` raised (an unpicklable exception arrives as :class:`ReaderCrash`).
    """
    from ..errors import FormatError
    from ..process import settings

    if not hasattr(os, "fork") or settings.value("RNNCONVERT_ISOLATE") == "0":
        return fn(*args)
    seconds = budget(path)
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        _die_with(parent)
        try:  # a C library dying in the child (TF's CHECK failures print a stack) must not reach the user
            import faulthandler

            faulthandler.disable()  # it would print a Python stack on the fd it was given (pytest's)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        except OSError:
            pass
        _child(fn, args, w)
    os.close(w)
    chunks, end = [], time.monotonic() + seconds
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise FormatError(f"{path}: {what} did not finish within {seconds:.0f} s; the file is damaged "
                                  "(the parser loops on it); refused (RNNCONVERT_READ_TIMEOUT sets the limit)")
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data:
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {os.waitstatus_to_exitcode(status)}"
        raise FormatError(f"{path}: the {what} parser crashed on this file ({why}); the file is damaged")
    kind, value = pickle.loads(data)  # our own child's answer, not file content
    if kind == "ok":
        return value
    raise value
