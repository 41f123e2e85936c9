"""Every environment variable rnnconvert reads, parsed in one place (:data:`KNOBS`): a value it cannot use is
a usage error (:class:`~rnnconvert.errors.SettingError`, exit 2) naming the variable and what it takes, never
a traceback nor a fault blamed on the file. The CLI checks them all before a command runs (:func:`check_all`);
the modules that read one call :func:`value` (``speed/kernels.py``: ``RNNCONVERT_BLOCK_BYTES``,
``verify/engine.py``: ``RNNCONVERT_BLAS_THREADS``, ``safety/guard.py``: ``RNNCONVERT_READ_TIMEOUT``,
``speed/parallel.py``: ``RNNCONVERT_THREADS``). The resource budget's ``RNNCONVERT_MAX_*`` limits
(:mod:`rnnconvert.safety.budget`, where their defaults are) are checked here too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..errors import SettingError


@dataclass(frozen=True)
class Knob:
    """One variable: ``kind`` ``'int'`` (at least ``minimum``), ``'float'`` (finite, above ``minimum``) or
    ``'choice'`` (one of ``choices``); ``default`` when unset or empty; ``takes`` says what it takes."""

    name: str
    kind: str
    default: object
    takes: str
    minimum: float = 0
    choices: tuple[str, ...] = ()


#: name -> :class:`Knob`; their meaning is documented where they are used (docs/cli.md lists them).
KNOBS = {k.name: k for k in (
    Knob("RNNCONVERT_THREADS", "int", None, "a whole number of threads, at least 1", 1),
    Knob("RNNCONVERT_BLAS_THREADS", "int", 1, "a whole number of BLAS threads, at least 1", 1),
    Knob("RNNCONVERT_BLOCK_BYTES", "int", 0, "a whole number of bytes (0: the default 1 MiB)", 0),
    Knob("RNNCONVERT_READ_TIMEOUT", "float", 60.0, "a number of seconds above 0", 0),
    Knob("RNNCONVERT_ISOLATE", "choice", "1", "0 or 1", choices=("0", "1")),
    Knob("RNNCONVERT_TF_READER", "choice", "auto", "auto or tensorflow", choices=("auto", "tensorflow")),
    Knob("RNNCONVERT_SPEED", "choice", "fast", "fast or plain", choices=("fast", "plain")),
    Knob("RNNCONVERT_SOURCE_ORACLE", "choice", "numpy", "numpy or framework", choices=("numpy", "framework")),
)}


def _bad(name: str, raw: str, takes: str) -> SettingError:
    from ..errors import printable

    shown = printable(raw if len(raw) <= 40 else raw[:40] + "...")
    return SettingError(f"the environment variable {name}={shown!r} is not {takes}; set it right or unset it")


def parse(knob: Knob, raw: str | None):
    """``raw`` (the variable's text, ``None`` when unset) as ``knob`` takes it.

    Raises:
        SettingError: a value it cannot use."""
    if raw is None or not raw.strip():
        return knob.default
    text = raw.strip()
    if knob.kind == "choice":
        if text.lower() not in knob.choices:
            raise _bad(knob.name, raw, knob.takes)
        return text.lower()
    if knob.kind == "int":
        if not (text.isascii() and text.isdigit()) or int(text) < knob.minimum:
            raise _bad(knob.name, raw, knob.takes)
        return int(text)
    try:
        if not text.isascii():
            raise ValueError
        v = float(text)
    except ValueError:
        raise _bad(knob.name, raw, knob.takes) from None
    if not math.isfinite(v) or v <= knob.minimum:
        raise _bad(knob.name, raw, knob.takes)
    return v


def value(name: str):
    """The value of variable ``name`` (one of :data:`KNOBS`) now.

    Raises:
        SettingError: it holds a value it cannot use (exit 2)."""
    return parse(KNOBS[name], os.environ.get(name))


def lenient(name: str):
    """:func:`value`, or the default where the variable holds a bad value: for a value read when a module is
    imported (the CLI's :func:`check_all` has refused a bad one before any import)."""
    try:
        return value(name)
    except SettingError:
        return KNOBS[name].default


def check_all() -> None:
    """Check every variable of :data:`KNOBS` and every budget limit (``RNNCONVERT_MAX_*``: a whole number, at
    least 0) that is set.

    Raises:
        SettingError: the first one holding a value it cannot use."""
    for name in KNOBS:
        value(name)
    from ..safety import budget

    for lim in budget.LIMITS.values():
        raw = os.environ.get(lim.env)
        if raw is not None and raw.strip():
            try:  # as the budget reads it: int(float(text))
                ok = raw.strip().isascii() and math.isfinite(float(raw)) and float(raw) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise _bad(lim.env, raw, "a number of 0 or more")
