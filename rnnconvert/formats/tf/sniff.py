"""The TensorFlow family's sniffer (format detection) and the checkpoint prefix a path names (:func:`prefix_of`).
Light on purpose: detection asks every family."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import FormatError
from ...safety.paths import folder_of, open_inside


def prefix_of(path: str | Path) -> str | None:
    """The checkpoint prefix for a prefix, a ``.index`` file, or a directory holding ``checkpoint``."""
    p = Path(path)
    if p.is_dir() and (p / "variables" / "variables.index").is_file():  # a SavedModel directory
        return str(p / "variables" / "variables")
    if p.is_dir():
        ck = p / "checkpoint"
        if not ck.is_file():
            return None
        try:  # inside the folder, a regular file (safety/paths); else no state file
            fh = open_inside(folder_of(p), "checkpoint", p, "state file", scope="checkpoint's folder")
        except FormatError:
            return None
        with fh:  # a state file is a few lines; a huge one is not read whole
            text = fh.read(1 << 16).decode("utf8", errors="replace")
        m = re.search(r'^model_checkpoint_path:\s*"(.*)"', text, re.M)
        if not m:
            return None
        if "\x00" in m.group(1):
            raise FormatError(f"{ck}: model_checkpoint_path holds a NUL byte; not a TensorFlow checkpoint "
                              "state file")
        q = Path(m.group(1))
        q = q if q.is_absolute() else p / q
        inside = p.resolve() in Path(os.path.abspath(q)).resolve().parents
        if not inside or not Path(str(q) + ".index").is_file():
            # never followed out of the folder (an absolute path written on another machine, or '../'):
            # the prefix of that name beside the state file, as TensorFlow looks for a moved checkpoint
            q = p / q.name
        return str(q)
    s = str(p)
    if s.endswith(".index"):
        return s[: -len(".index")]
    return s if Path(s + ".index").is_file() else None


def tf_checkpoint(head: bytes, path: Path) -> bool:
    """A ``.index`` file, a directory with a ``checkpoint`` file, or a prefix whose ``.index`` exists."""
    try:
        pre = prefix_of(path)
    except OSError:
        return False
    return pre is not None and Path(pre + ".index").is_file()
