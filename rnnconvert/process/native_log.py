"""Keep TensorFlow's C++ log lines out of the ``rnnconvert`` command's terminal.

TensorFlow writes from C++ straight to file descriptor 2: "All log messages before absl::InitializeLog()
is called are written to STDERR", ``cudart_stub.cc`` "Could not find cuda drivers", ``cuda_platform.cc``
"failed call to cuInit", ``cpu_feature_guard.cc`` instruction notes. Lines logged before absl is
initialised ignore ``TF_CPP_MIN_LOG_LEVEL``, and they tear the progress bar. So the command line, on
the first import of ``tensorflow``, ``tf_keras`` or ``keras`` (a :data:`sys.meta_path` hook: every
import path is covered, the frameworks are never imported when not needed):

* sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set it, and quiets the ``tensorflow`` Python logger
  to errors;
* points file descriptor 2 at ``os.devnull`` -- or at the file named by ``RNNCONVERT_NATIVE_LOG``,
  to keep the lines -- and gives Python's ``sys.stderr`` a duplicate of the original descriptor, so
  rnnconvert's own messages, progress bar and Python warnings still reach the terminal. Forked
  children (:mod:`rnnconvert.safety.guard`) inherit both.

Only :func:`rnnconvert.cli.run` (the ``rnnconvert`` command, ``python -m rnnconvert``) installs it: a
program that imports rnnconvert keeps its own descriptors.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

#: Top-level modules whose import loads TensorFlow's C++ runtime.
NATIVE = frozenset({"tensorflow", "tf_keras", "keras"})

_state = {"diverted": False}


def divert() -> None:
    """Point descriptor 2 away from the terminal, Python's ``sys.stderr`` at a copy of it (once)."""
    if _state["diverted"]:
        return
    _state["diverted"] = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        sys.stderr.flush()
        keep = os.dup(2)
        where = os.environ.get("RNNCONVERT_NATIVE_LOG") or os.devnull
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:  # no descriptor 2, or the log file cannot be opened: leave things as they are
        return
    os.dup2(fd, 2)
    os.close(fd)
    enc = getattr(sys.stderr, "encoding", None) or "utf-8"
    sys.stderr = os.fdopen(keep, "w", buffering=1, encoding=enc, errors="backslashreplace")


class _Hook(importlib.abc.MetaPathFinder):
    """Diverts descriptor 2 just before the first import of a :data:`NATIVE` module; finds nothing."""

    def find_spec(self, name, path=None, target=None):  # noqa: D102
        if not _state["diverted"] and name.partition(".")[0] in NATIVE:
            divert()  # (the hook stays in sys.meta_path: the import machinery is iterating over it)
            import logging

            logging.getLogger("tensorflow").setLevel(logging.ERROR)
        return None


def install() -> None:
    """Divert descriptor 2 on the first TensorFlow import (module docstring); at once if one happened."""
    if any(m in sys.modules for m in NATIVE):
        divert()
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
