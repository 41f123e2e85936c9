"""SIGTERM and SIGHUP handled like SIGINT (Ctrl-C).

Schedulers, ``timeout`` and closing terminals stop a process with SIGTERM or SIGHUP, whose default action
ends Python without running ``finally`` blocks: temporaries beside DST, ``/tmp/rnnconvert-k3-*`` folders
and helper subprocesses were left behind. :func:`install` makes both raise :class:`Interrupted` (a
``KeyboardInterrupt``) in the main thread instead, so every cleanup that runs for Ctrl-C runs for them:
``api.convert`` removes its temporary, ``tempfile.TemporaryDirectory`` its folder, ``subprocess.run`` kills
its child, ``guard.isolated`` its forked reader. The CLI then exits with ``128 + signal number`` (129
SIGHUP, 130 SIGINT, 143 SIGTERM). A signal that is ignored when rnnconvert starts (``nohup``) stays ignored.
"""

from __future__ import annotations

import signal

#: The signals handled like SIGINT.
SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM or SIGHUP arrives; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


#: The signal that interrupted this process, once one did (typer turns any KeyboardInterrupt into a
#: plain exit code 130: the CLI reads the real one here).
received: int | None = None


def _raise(signum: int, _frame) -> None:
    global received
    received = signum
    for s in SIGNALS:  # a second signal during cleanup must not interrupt the cleanup
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def install() -> None:
    """Make SIGTERM, SIGHUP (and SIGINT, to record it) raise :class:`Interrupted` (main thread only;
    ignored signals stay ignored)."""
    global received
    received = None
    for s in SIGNALS + (signal.SIGINT,):
        try:
            if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(s, _raise)
        except (ValueError, OSError):  # not the main thread
            pass


def ignore() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP from now on (main thread): the command has finished, its output is
    in place or was never written, and the interpreter's teardown (TensorFlow's takes seconds) must not turn
    a finished run into one killed by the signal (exit -2 with the output complete)."""
    for s in SIGNALS + (signal.SIGINT,):
        try:
            signal.signal(s, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread
            pass


def exit_code(exc: BaseException) -> int:
    """128 + the signal number of an interruption (SIGINT for a plain ``KeyboardInterrupt``)."""
    return 128 + getattr(exc, "signum", received or signal.SIGINT)
