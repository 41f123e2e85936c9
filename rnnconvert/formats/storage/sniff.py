"""The storage formats' sniffers (format detection) and the member names that mark rnnconvert's own archives.
Light on purpose: detection asks every family."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from ...conventions import mlx_names

#: the schema member of rnnconvert's canonical ``.npz`` (docs/pytorch.md)
META = "__rnnconvert__"
#: the spec member of a raw cuDNN buffer archive (docs/cudnn-layout.md)
SPEC_KEY = "__cudnn_spec__"


#: the largest header the safetensors sniffer parses to decline MLX key sets (an MLX RNN's is tiny)
MAX_HEADER = 1 << 20


def safetensors(head: bytes, path: Path) -> bool:
    """8-byte little-endian header length followed by a JSON object (the safetensors layout), unless its
    tensors are MLX recurrent modules' (``Wx``/``Wh``/``bias``...: :func:`rnnconvert.conventions.mlx_names.modules`),
    which the ``mlx`` format claims (docs/mlx.md "Detection"); headers over :data:`MAX_HEADER` bytes are not
    parsed (claimed)."""
    if len(head) < 10 or head[8:9] != b"{":
        return False
    n = struct.unpack("<Q", head[:8])[0]
    try:
        if not 2 <= n <= path.stat().st_size - 8:
            return False
    except OSError:
        return False
    if n > MAX_HEADER:
        return True
    try:
        with open(path, "rb") as fh:
            fh.seek(8)
            header = json.loads(fh.read(n))
        shapes = {k: tuple(v["shape"]) for k, v in header.items()
                  if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("shape"), list)}
    except (OSError, ValueError, AttributeError, TypeError):
        return True  # a damaged header: the safetensors reader reports it
    return not mlx_names.modules(shapes)


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
