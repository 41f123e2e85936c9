"""The MLX sniffer: a safetensors file or ``.npz`` whose tensor names and shapes are MLX recurrent modules'
(:func:`rnnconvert.conventions.mlx_names.modules`). Light: json, struct, zipfile; the safetensors header is
read only up to :data:`MAX_HEADER` bytes, ``.npz`` members' ``.npy`` headers only for MLX names.

The storage family's safetensors sniffer declines the same key sets (docs/mlx.md "Detection"), so an MLX
file is claimed once: the two sniffers exclude each other by the one rule in ``conventions/mlx_names``.
"""

from __future__ import annotations

import ast
import json
import struct
import zipfile
from pathlib import Path

from ...conventions import mlx_names

#: the largest safetensors header the sniffer parses (an MLX RNN's is a few hundred bytes)
MAX_HEADER = 1 << 20
#: the most ``.npz`` members the sniffer looks at
MAX_MEMBERS = 4096


def safetensors_shapes(head: bytes, path: Path) -> dict[str, tuple[int, ...]] | None:
    """``name -> shape`` of a safetensors file's header (``None``: not safetensors, or a header over
    :data:`MAX_HEADER` bytes)."""
    if len(head) < 10 or head[8:9] != b"{":
        return None
    n = struct.unpack("<Q", head[:8])[0]
    if not 2 <= n <= min(MAX_HEADER, path.stat().st_size - 8):
        return None
    with open(path, "rb") as fh:
        fh.seek(8)
        header = json.loads(fh.read(n))
    if not isinstance(header, dict):
        return None
    return {k: tuple(v["shape"]) for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("shape"), list)}


def npz_shapes(head: bytes, path: Path) -> dict[str, tuple[int, ...]] | None:
    """``name -> shape`` of the members of an ``.npz`` whose last name part is an MLX parameter name (their
    ``.npy`` headers only; ``None``: not a zip, or too many members)."""
    if not head.startswith(b"PK\x03\x04"):
        return None
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            return None
        out = {}
        for info in infos:
            name = info.filename[:-4] if info.filename.endswith(".npy") else None
            if name is None:
                return None  # not an npz of arrays
            if mlx_names.split(name)[1] not in mlx_names.NAMES:
                out[name] = ()
                continue
            with z.open(info) as fh:
                magic = fh.read(8)
                if magic[:6] != b"\x93NUMPY":
                    return None
                size = struct.unpack("<H" if magic[6] == 1 else "<I", fh.read(2 if magic[6] == 1 else 4))[0]
                if size > 65536:
                    return None
                meta = ast.literal_eval(fh.read(size).decode("latin1"))
                out[name] = tuple(meta["shape"])
        return out


def mlx(head: bytes, path: Path) -> bool:
    """Claims a safetensors file or ``.npz`` holding at least one MLX recurrent module
    (:func:`rnnconvert.conventions.mlx_names.modules`) and none of rnnconvert's own archive markers."""
    if not path.is_file():
        return False
    shapes = safetensors_shapes(head, path)
    if shapes is None:
        shapes = npz_shapes(head, path)
    if not shapes or "__rnnconvert__" in shapes or "__cudnn_spec__" in shapes:
        return False
    return bool(mlx_names.modules(shapes))
