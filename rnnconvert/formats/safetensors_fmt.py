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
    # One metadata key only: safetensors serialises __metadata__ from a hash map, so several keys come out
    # in a different order from run to run; with one the bytes are deterministic (tests/test_bad_inputs.py).
    st.save_file(sd, str(path), metadata={"format": "pt"})
    return [torch_pt.describe_module(layer) for layer in ckpt.layers]


_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


def mapped(path: str | Path, prefix: str = "") -> dict[str, np.ndarray]:
    """The float tensors of a safetensors file whose names start with ``prefix``, as copy-on-write memory
    maps of the file (nothing is read until used; no copy of a multi-GB file). Used for verification of
    a file rnnconvert just wrote; the header is still checked (offsets inside the file, sizes = shapes).

    Raises:
        FormatError: a malformed header or a tensor outside the data section.
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        if n > size - 8:
            raise FormatError(f"{p}: safetensors header of {n} bytes in a {size}-byte file")
        header = json.loads(fh.read(n))
    base, data_len = 8 + n, size - 8 - n
    mm = np.memmap(p, dtype=np.uint8, mode="c", offset=base, shape=(data_len,)) if data_len else None
    out = {}
    for key, rec in header.items():
        if key == "__metadata__" or not key.startswith(prefix):
            continue
        dt = _NP_DTYPES.get(rec.get("dtype"))
        b, e = rec["data_offsets"]
        shape = tuple(int(d) for d in rec["shape"])
        if dt is None or not 0 <= b <= e <= data_len or e - b != int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize:
            raise FormatError(f"{p}: tensor '{key}' has a bad header record {rec}")
        out[key] = mm[b:e].view(dt).reshape(shape)
    return out


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Load the file's tensors into the ``torch.nn`` module of layer ``name`` and run it; float64 ``(B, T, dirs*H)``.

    The tensors are memory maps of the written file (:func:`mapped`), only those of layer ``name``."""
    torch = require("torch", "torch")
    sd = {k: torch.from_numpy(v) for k, v in mapped(path, f"{name}.").items()}
    return torch_pt.run_module(ckpt.layer(name), sd, x)
