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
    st.save_file(sd, str(path), metadata={"format": "pt", "rnnconvert": json.dumps(layers, sort_keys=True)})
    return [torch_pt.describe_module(layer) for layer in ckpt.layers]


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Load the file's tensors into the ``torch.nn`` module of layer ``name`` and run it; float64 ``(B, T, dirs*H)``."""
    torch = require("torch", "torch")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in _load(Path(path)).items()}
    return torch_pt.run_module(ckpt.layer(name), sd, x)
