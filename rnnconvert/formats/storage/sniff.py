"""The storage formats' sniffers (format detection) and the member names that mark rnnconvert's own archives.
Light on purpose: detection asks every family."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

#: the schema member of rnnconvert's canonical ``.npz`` (docs/pytorch.md)
META = "__rnnconvert__"
#: the spec member of a raw cuDNN buffer archive (docs/cudnn-layout.md)
SPEC_KEY = "__cudnn_spec__"


def safetensors(head: bytes, path: Path) -> bool:
    """8-byte little-endian header length followed by a JSON object (the safetensors layout)."""
    if len(head) < 10 or head[8:9] != b"{":
        return False
    n = struct.unpack("<Q", head[:8])[0]
    try:
        return 2 <= n <= path.stat().st_size - 8
    except OSError:
        return False


def npz(head: bytes, path: Path) -> bool:
    """A zip whose members include ``__rnnconvert__.npy``."""
    if not head.startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return f"{META}.npy" in z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError):  # damaged zip
        return False


def cudnn_npz(head: bytes, path: Path) -> bool:
    """A zip (npz) with a ``__cudnn_spec__.npy`` member."""
    if not head.startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return f"{SPEC_KEY}.npy" in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
