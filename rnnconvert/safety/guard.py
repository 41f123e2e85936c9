"""Isolation for parsers written in C that a damaged file can send into an endless loop or a crash.

libhdf5 (under h5py) loops forever on some corrupted files (the fuzzer in ``bench/fuzz`` finds such
files within a thousand mutations of a Keras fixture), holding the GIL: neither a signal handler nor
a watchdog thread can get control back. :func:`isolated` therefore runs such a read in a forked
child process; the parent waits at most the deadline, then kills the child and raises
:class:`~rnnconvert.errors.FormatError` (exit code 3). A child that dies (a segfault in C) gives a
FormatError too (TensorFlow's checkpoint reader aborts on some forged ``.index`` files). The child's
stderr goes to ``/dev/null``: what a dying C library prints there is not for the user; the error that
counts comes back to the parent. The result comes back pickled from our own child (never from the file).

A plain ``fork`` copies the parent's memory but only its calling thread: once a runtime with native worker
threads has run in this process (TensorFlow's Eigen pools, torch's OpenMP pool, XLA, tensorstore,
onnxruntime), a lock one of those threads held at the fork stays locked in the child forever. Reproduced in
the suite: after the SavedModel tests ran TensorFlow and torch in the pytest process, the forked read of a
valid 30 kB ``.h5`` hung until the deadline and was reported as a damaged file. So once such a runtime is
loaded (:func:`fork_unsafe`), the child is a fresh interpreter instead (``python -m rnnconvert.safety.guard``,
about 0.3 s more to start and import the reader); the deadline, the answer and the errors are the same.

The deadline is ``RNNCONVERT_READ_TIMEOUT`` seconds (default 60) plus one second per MiB of input.
``RNNCONVERT_ISOLATE=0`` reads in-process instead (no protection); platforms without ``fork`` do.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
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


#: Modules whose native worker threads make a plain fork of this process unsafe once they are loaded.
THREADED_RUNTIMES = ("tensorflow", "torch", "jax", "jaxlib", "tensorstore", "onnxruntime", "openvino", "paddle")


def fork_unsafe() -> bool:
    """Whether a runtime with native worker threads is loaded here (see the module docstring); the isolated
    read then runs in a fresh interpreter instead of a fork of this one."""
    return any(name in sys.modules for name in THREADED_RUNTIMES)


class _Forked:
    """The reader in a plain fork of this process; it writes its answer to ``w``."""

    def __init__(self, fn: Callable[..., Any], args: tuple, r: int, w: int) -> None:
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the child
            os.close(r)
            _die_with(parent)
            _quiet_stderr()
            _child(fn, args, w)
        os.close(w)
        self.fd = r

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> str:
        os.close(self.fd)
        _, status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(status):
            return f"signal {os.WTERMSIG(status)}"
        return f"status {os.waitstatus_to_exitcode(status)}"


class _Spawned:
    """The reader in a fresh interpreter (``python -m rnnconvert.safety.guard``): no thread and no lock of
    this process comes with it. ``fn`` travels by name (its module and qualified name; the readers pass their
    own module-level functions), ``args`` pickled on its stdin; the answer comes back on its stdout."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        import subprocess

        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "rnnconvert.safety.guard", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, close_fds=True)
        try:
            self.proc.stdin.write(pickle.dumps((fn.__module__, fn.__qualname__, args), protocol=pickle.HIGHEST_PROTOCOL))
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; wait() says how
        self.fd = self.proc.stdout.fileno()

    def kill(self) -> None:
        self.proc.kill()

    def wait(self) -> str:
        self.proc.stdout.close()
        code = self.proc.wait()
        return f"signal {-code}" if code < 0 else f"status {code}"


def _spawned_main(parent: int) -> None:  # pragma: no cover - runs in the spawned child
    import importlib

    _die_with(parent)
    _quiet_stderr()
    module, name, args = pickle.loads(sys.stdin.buffer.read())  # from our parent, not from a file
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    _child(fn, args, sys.stdout.fileno())


def _quiet_stderr() -> None:  # pragma: no cover - runs in the child
    """A C library dying in the child (TF's CHECK failures print a stack) must not reach the user."""
    try:
        import faulthandler

        faulthandler.disable()  # it would print a Python stack on the fd it was given (pytest's)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    except OSError:
        pass


def isolated(fn: Callable[..., Any], args: tuple, path: str | Path, what: str) -> Any:
    """``fn(*args)`` in a child process under the deadline of :func:`budget`; its result or exception.

    ``fn`` is a module-level function (a spawned child imports it by name); the child is a fork of this
    process, or a fresh interpreter once :func:`fork_unsafe`.

    Raises:
        FormatError: the child ran past the deadline or died without an answer.
        whatever ``fn`` raised (an unpicklable exception arrives as :class:`ReaderCrash`).
    """
    from ..errors import FormatError
    from ..process import settings

    if not hasattr(os, "fork") or settings.value("RNNCONVERT_ISOLATE") == "0":
        return fn(*args)
    seconds = budget(path)
    child = _Spawned(fn, args) if fork_unsafe() else _Forked(fn, args, *os.pipe())
    r = child.fd
    chunks, end = [], time.monotonic() + seconds
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                child.kill()
                raise FormatError(f"{path}: {what} did not finish within {seconds:.0f} s; the file is damaged "
                                  "(the parser loops on it); refused (RNNCONVERT_READ_TIMEOUT sets the limit)")
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:
        child.kill()
        raise
    finally:
        why = child.wait()
    data = b"".join(chunks)
    if not data:
        raise FormatError(f"{path}: the {what} parser crashed on this file ({why}); the file is damaged")
    kind, value = pickle.loads(data)  # our own child's answer, not file content
    if kind == "ok":
        return value
    raise value


if __name__ == "__main__":  # pragma: no cover - the spawned reader of :class:`_Spawned`
    from rnnconvert.safety import guard as _guard  # the package's module: the answer names its classes

    _guard._spawned_main(int(sys.argv[1]))
