"""The MLX writer: canonical layers as the weights of ``mlx.nn.LSTM``/``GRU``/``RNN`` in a safetensors file
that ``mx.load`` and ``Module.load_weights`` read (MLX >= 0.18 layout, ``mlx/nn/layers/recurrent.py``).

Names (:mod:`rnnconvert.conventions.mlx_names`): layer ``name`` as module ``name`` (``name.Wx``, ``name.Wh``,
``name.bias``); a stack of ``num_layers`` as a list attribute ``name.layers.k`` of one-layer modules. Arrays:
``Wx = w_ih`` ``(G*H, I)``, ``Wh = w_hh`` ``(G*H, H)`` (RNN ``Wxh``, ``Whh``), gates LSTM ``i f g o``, GRU
``r z n`` (the canonical order: a copy); LSTM/RNN ``bias = b_ih + b_hh``; GRU ``b = b_ih + [b_hr, b_hz, 0]``,
``bhn = b_hn`` (one float rounding per summed element, exact where one term is 0); no bias tensors for a
``bias=False`` layer (``nn.LSTM(..., bias=False)``).

Refused (one line each, :func:`refusals`): what MLX's equations cannot compute -- the cuDNN/PyTorch equations'
limits (:func:`rnnconvert.core.cudnn.refusals`: sigmoid gates, tanh, GRU reset after the matmul, no peepholes,
no clipping), an LSTM projection, bidirectional layers (``mlx.nn`` has no bidirectional wrapper).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import mlx_names
from ...core import cudnn, gates
from ...core.model import Cell, Checkpoint, RNNLayer
from ...engine import refusal
from ...errors import UnsupportedError

ROUTE = "MLX (mx.load, mlx.nn modules)"
#: safetensors dtype names (``safetensors/README.md``)
DTYPES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
#: the dtypes of carried (non-recurrent) tensors too
ALL_DTYPES = {**DTYPES, np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32",
              np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL"}
CLASS = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}


def refusals(layer: RNNLayer) -> list[str]:
    """What ``mlx.nn`` cannot compute about ``layer`` (empty when it can)."""
    why = cudnn.refusals(layer)
    if layer.proj_size:
        why.append(f"LSTM projection proj_size={layer.proj_size} (mlx.nn.LSTM has none)")
    if layer.bidirectional:
        why.append("bidirectional (mlx.nn has no bidirectional recurrent layer)")
    if layer.dtype not in DTYPES:
        why.append(f"dtype {layer.dtype} (MLX safetensors here: float16, float32, float64)")
    return why


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse layers ``mlx.nn`` cannot express (:func:`refusals`); notes for an RNN with relu (a constructor
    argument MLX does not save) and for summed biases.

    Raises:
        UnsupportedError (:class:`rnnconvert.engine.refusal.Refused`): one line naming the layer and features.
    """
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "mlx", f"MLX nn.{CLASS[layer.cell]}")
        if layer.cell is Cell.RNN_RELU:
            notes.append(f"{layer.name}: build it as mlx.nn.RNN(..., nonlinearity=mlx.nn.relu): MLX does not "
                         "save the nonlinearity")
    for key, arr in ckpt.tensors.items():
        if np.asarray(arr).dtype.newbyteorder("=") not in ALL_DTYPES:
            raise UnsupportedError(f"tensor '{key}' has dtype {np.asarray(arr).dtype}, which rnnconvert's MLX "
                                   "safetensors writer does not store")
    return notes


def tensors(layer: RNNLayer, k: int, dirs: list) -> list[tuple[str, np.ndarray]]:
    """The MLX tensors of stacked layer ``k`` (its one direction ``dirs[0]``, canonical arrays), by name."""
    p, cell = dirs[0], layer.cell
    conv = gates.convention("mlx", cell)
    pre = mlx_names.prefix(layer.name, layer.num_layers, k)
    wx, wh = ("Wxh", "Whh") if cell in (Cell.RNN_TANH, Cell.RNN_RELU) else ("Wx", "Wh")
    out = [(mlx_names.join(pre, wx), gates.from_canonical(p.w_ih, conv, cell)),
           (mlx_names.join(pre, wh), gates.from_canonical(p.w_hh, conv, cell))]
    if not layer.bias:
        return out
    if cell is Cell.GRU:
        H = layer.hidden_size
        n = gates.gate_slice(cell, "n", H)
        b = np.array(p.b_ih, copy=True)
        b[:n.start] = p.b_ih[:n.start] + p.b_hh[:n.start]  # r, z: both biases act on the same sum
        out += [(mlx_names.join(pre, "b"), gates.vec_from_canonical(b, conv, cell)),
                (mlx_names.join(pre, "bhn"), np.ascontiguousarray(p.b_hh[n]))]
    else:
        out.append((mlx_names.join(pre, "bias"), gates.vec_from_canonical(p.b_ih + p.b_hh, conv, cell)))
    return out


def encode(items: list[tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file of ``items`` (names in sorted order, data in that order, header padded with spaces to
    a multiple of 8; ``safetensors/README.md``)."""
    head: dict[str, Any] = {"__metadata__": metadata or {"format": "mlx"}}
    pos, blobs = 0, []
    for name, arr in sorted(items, key=lambda kv: kv[0]):
        a = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        head[name] = {"dtype": ALL_DTYPES[np.dtype(arr.dtype).newbyteorder("=")], "shape": list(a.shape),
                      "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
        blobs.append(a.tobytes())
    js = json.dumps(head, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(blobs)


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as MLX safetensors (module docstring); one line per layer names the MLX modules to build.
    Assumes :func:`check` passed (the engine calls it once)."""
    items: list[tuple[str, np.ndarray]] = []
    lines = []
    for i, layer in enumerate(ckpt.layers):
        for k in range(layer.num_layers):
            items += tensors(layer, k, ckpt.slab(i, k))
        cls = CLASS[layer.cell]
        mods = (f"mlx.nn.{cls}({layer.input_size}, {layer.hidden_size}, bias={layer.bias})" if layer.num_layers == 1
                else f"a list 'layers' of {layer.num_layers} mlx.nn.{cls}(..., {layer.hidden_size}, bias={layer.bias})")
        lines.append(f"{layer.name}: {mods} under '{layer.name}'; model.load_weights(path)")
    items += [(k, np.asarray(v)) for k, v in ckpt.tensors.items()]
    data = encode(items)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return lines
