"""safetensors files (``.safetensors``) with PyTorch's key names: writer, reader, torch verification.

The tensors and key names are exactly those of :func:`rnnconvert.formats.torch_pt.state_dict`
(``<layer>.weight_ih_l{k}[_reverse]`` ``(G*H, in)``, gates LSTM i,f,g,o / GRU r,z,n; LAYOUTS.md §12),
so ``model.load_state_dict(safetensors.torch.load_file(path))`` loads them into ``nn.LSTM/GRU/RNN``.
Reading needs no torch (``safetensors.numpy``); the key grouping is shared with the ``.pt`` reader
(:func:`rnnconvert.formats.torch_pt.group_state_dict`). The file format itself (8-byte little-endian
header length, JSON header, raw little-endian data) cannot hold code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, require
from ..model import Checkpoint
from . import torch_pt

ROUTE = "torch (safetensors tensors)"


def sniff(head: bytes, path: Path) -> bool:
    """8-byte little-endian header length followed by a JSON object (the safetensors layout)."""
    if len(head) < 10 or head[8:9] != b"{":
        return False
    n = struct.unpack("<Q", head[:8])[0]
    try:
        return 2 <= n <= path.stat().st_size - 8
    except OSError:
        return False


def _load(path: Path) -> dict[str, np.ndarray]:
    st = require("safetensors.numpy", "torch")
    try:
        return st.load_file(str(path))
    except Exception as exc:  # safetensors raises SafetensorError and others
        raise FormatError(f"{path}: not a readable safetensors file: {exc}") from exc


def read(path: str | Path, *, nonlinearity: str = "tanh", **_: Any) -> Checkpoint:
    """Read PyTorch-named tensors (``nn.LSTM/GRU/RNN`` and ``nn.*Cell`` keys, any prefix, ``module.`` stripped).

    Raises:
        FormatError: unreadable file, no recurrent keys, inconsistent shapes.
    """
    p = Path(path)
    sd = torch_pt.strip_module_prefix(_load(p))
    return torch_pt.group_state_dict(sd, str(p), "safetensors", nonlinearity)


def check(ckpt: Checkpoint, **opts: Any) -> list[str]:
    """What ``torch.nn`` cannot express is refused here too (see :func:`rnnconvert.formats.torch_pt.check`)."""
    return torch_pt.check(ckpt, **opts)


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write the PyTorch state dict of ``ckpt`` as safetensors; one line per layer names its ``torch.nn`` module.

    Raises:
        UnsupportedError: see :func:`check`.
    """
    st = require("safetensors.numpy", "torch")
    check(ckpt)
    sd = {k: np.ascontiguousarray(v) for k, v in torch_pt.state_dict(ckpt).items()}
    layers = [{"name": l.name, "module": torch_pt.describe_module(l).split(": ", 1)[1]} for l in ckpt.layers]
    _save_sorted(sd, Path(path), {"format": "pt", "rnnconvert": json.dumps(layers, sort_keys=True)})
    del st
    return [torch_pt.describe_module(layer) for layer in ckpt.layers]


_DTYPES = {"float16": "F16", "float32": "F32", "float64": "F64", "bfloat16": "BF16"}


def _save_sorted(sd: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    """Write the safetensors layout (8-byte little-endian header length, JSON header, raw little-endian
    data) with keys in sorted order: ``safetensors.save_file`` serialises ``__metadata__`` from a hash
    map, so its bytes change from run to run; these do not. Header padded with spaces to 8 bytes."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(sd):
        arr = np.ascontiguousarray(sd[name])
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        if arr.dtype.name not in _DTYPES:
            raise FormatError(f"tensor '{name}' has dtype {arr.dtype}, which rnnconvert does not write to safetensors")
        raw = arr.tobytes()
        header[name] = {"dtype": _DTYPES[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for raw in blobs:
            fh.write(raw)


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Load the file's tensors into the ``torch.nn`` module of layer ``name`` and run it; float64 ``(B, T, dirs*H)``."""
    torch = require("torch", "torch")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in _load(Path(path)).items()}
    return torch_pt.run_module(ckpt.layer(name), sd, x)
