"""The MLX reader: ``mlx.nn.LSTM``/``GRU``/``RNN`` weights saved by ``Module.save_weights`` (``.safetensors``
or ``.npz``), read without MLX.

Layout (``mlx/nn/layers/recurrent.py``; names in :mod:`rnnconvert.conventions.mlx_names`): ``Wx`` ``(G*H, I)``,
``Wh`` ``(G*H, H)`` (RNN ``Wxh``, ``Whh``), applied as ``x @ Wx.T``; LSTM gates ``i, f, g, o`` with one bias
``bias`` (``b_ih + b_hh`` of PyTorch); GRU gates ``r, z, n`` with ``b`` ``(3H,)`` (input-side bias, the
recurrent ``r``/``z`` biases summed into it) and ``bhn`` ``(H,)`` (the recurrent candidate bias, inside the
reset gate's product). Canonical arrays (``core/model.py``): ``w_ih = Wx``, ``w_hh = Wh``; LSTM/RNN
``b_ih = bias``, ``b_hh = 0``; GRU ``b_ih = b``, ``b_hh = [0, 0, bhn]``: a bit-exact copy.

MLX < 0.18 stored the transpose (``(I, G*H)``, ``(H, G*H)``, ``x @ Wx``). The orientation is read from
``Wh``'s shape (``(4H, H)`` or ``(H, 4H)``: never both); an RNN's ``Whh`` is square, so its ``Wxh`` decides,
and when ``I == H`` too it is ambiguous: the orientation of another module of the same file decides (one MLX
version wrote it), else the reader refuses, naming ``orientation=out_in|in_out``.

Each MLX module is one canonical layer (``num_layers=1``), named by its attribute path (a bare module:
``lstm``/``gru``/``rnn``). Other tensors are carried along under their names.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import mlx_names
from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ...errors import FormatError
from ...safety import budget

#: safetensors dtypes the reader takes (BF16 has no numpy dtype: refused)
DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8, "I8": np.int8, "U32": np.uint32, "BOOL": np.bool_}
MAX_HEADER = 100 << 20
_CELL = {"LSTM": Cell.LSTM, "GRU": Cell.GRU}


def safetensors_arrays(p: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file: 8-byte little-endian header length, JSON header (``dtype``,
    ``shape``, ``data_offsets`` inside the data section, sizes matching shapes), raw little-endian data
    (``safetensors/README.md``). Nothing is read outside the declared offsets.

    Raises:
        FormatError: a malformed header, a tensor outside the data section, a dtype numpy lacks (bf16).
    """
    size = p.stat().st_size
    with open(p, "rb") as fh:
        raw = fh.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 2 <= n <= min(size - 8, MAX_HEADER):
            raise FormatError(f"{p}: not a readable safetensors file (header of {n} bytes in {size})")
        try:
            head = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"{p}: safetensors header is not valid JSON ({exc})") from exc
        if not isinstance(head, dict):
            raise FormatError(f"{p}: safetensors header is not a JSON object")
        budget.check_count(p, "names", len(head), "tensors")
        base, out = 8 + n, {}
        for key, rec in head.items():
            if key == "__metadata__":
                continue
            try:
                dname = rec["dtype"]
                shape = tuple(int(d) for d in rec["shape"])
                b, e = (int(v) for v in rec["data_offsets"])
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"{p}: tensor '{key}' has a header record rnnconvert cannot read") from exc
            if dname not in DTYPES:
                raise FormatError(f"{p}: tensor '{key}' has dtype {dname}, which rnnconvert does not read "
                                  "(save the MLX model in float32 or float16)")
            dt = np.dtype(DTYPES[dname]).newbyteorder("<")
            if min(shape, default=0) < 0 or not 0 <= b <= e <= size - base or \
                    e - b != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
                raise FormatError(f"{p}: tensor '{key}' has a bad header record")
            fh.seek(base + b)
            out[key] = np.frombuffer(fh.read(e - b), dt).reshape(shape).astype(dt.newbyteorder("="))
    return out


def npz_arrays(p: Path) -> dict[str, np.ndarray]:
    """Every member of an ``.npz`` (``np.load(allow_pickle=False)``: object arrays refused), after the zip
    checks of the budget (duplicate names, member count, deflate ratio).

    Raises:
        FormatError: not a readable npz without pickle.
    """
    try:
        with zipfile.ZipFile(p) as zf:
            budget.zip_members(p, zf.infolist())
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error) as exc:
        raise FormatError(f"{p}: not readable as .npz without pickle: {exc}") from exc


def arrays(p: Path) -> dict[str, np.ndarray]:
    """The file's tensors by name: safetensors by its layout, else an ``.npz``."""
    with open(p, "rb") as fh:
        head = fh.read(10)
    if head.startswith(b"PK\x03\x04"):
        return npz_arrays(p)
    if len(head) == 10 and head[8:9] == b"{":
        return safetensors_arrays(p)
    raise FormatError(f"{p}: neither a safetensors file nor an .npz (MLX save_weights writes one of them)")


def _orient(p: Path, prefix: str, cls: str, t: dict[str, np.ndarray]) -> str | None:
    """``'out_in'``, ``'in_out'`` or ``None`` (an RNN whose shapes fit both) for one module's tensors."""
    if cls == "RNN":
        wx, H = t["Wxh"].shape, t["Whh"].shape[0]
        if wx[0] == H and wx[1] != H:
            return "out_in"
        if wx[1] == H and wx[0] != H:
            return "in_out"
        if wx == (H, H):
            return None
        raise FormatError(f"{p}: MLX RNN '{prefix}': Wxh {wx} does not fit Whh {t['Whh'].shape}")
    return mlx_names.orientation(t["Wh"].shape, mlx_names.GATES[cls])


def read(path: str | Path, *, orientation: str = "auto", nonlinearity: str = "tanh", **_: Any) -> Checkpoint:
    """Read the MLX recurrent modules of ``path`` (module docstring) into canonical layers.

    Options: ``orientation`` (``auto``: from shapes; ``out_in``: MLX >= 0.18, ``(G*H, in)``; ``in_out``:
    MLX < 0.18, ``(in, G*H)``); ``nonlinearity`` (``tanh`` or ``relu``: an ``mlx.nn.RNN``'s nonlinearity is
    a callable, not saved).

    Raises:
        FormatError: unreadable file, no MLX recurrent module, shapes that fit no MLX layout, an RNN
            whose orientation the shapes cannot tell (the message names ``orientation=``).
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    if orientation not in ("auto", "out_in", "in_out"):
        raise FormatError(f"orientation={orientation!r}: use auto, out_in (MLX >= 0.18) or in_out (MLX < 0.18)")
    if nonlinearity not in ("tanh", "relu"):
        raise FormatError(f"nonlinearity={nonlinearity!r}: use tanh or relu")
    try:
        tensors = arrays(p)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    found = mlx_names.modules({k: v.shape for k, v in tensors.items()})
    if not found:
        raise FormatError(f"{p}: no MLX recurrent module (Wx/Wh/bias, Wx/Wh/b/bhn or Wxh/Whh/bias tensors)")
    own = {pre: {leaf: tensors[mlx_names.join(pre, leaf)] for leaf in mlx_names.NAMES
                 if mlx_names.join(pre, leaf) in tensors} for pre in found}
    orients = {pre: _orient(p, pre, found[pre], own[pre]) for pre in found}
    known = {o for o in orients.values() if o is not None}
    if len(known) > 1:
        raise FormatError(f"{p}: MLX modules stored in both orientations ((G*H, in) and (in, G*H)); "
                          "one MLX version writes one; refused")
    file_orient = orientation if orientation != "auto" else (known.pop() if known else None)
    ckpt = Checkpoint(format="mlx", meta={"path": str(p)})
    for pre, cls in found.items():
        o = orientation if orientation != "auto" else orients[pre] or file_orient
        if o is None:
            raise FormatError(f"{p}: MLX RNN '{pre or 'rnn'}' has input size = hidden size, so its (out, in) "
                              "layout (MLX >= 0.18) and (in, out) layout (MLX < 0.18) cannot be told apart; "
                              "name it with orientation=out_in or orientation=in_out (MLX < 0.18; the CLI's --read-opt)")
        ckpt.layers.append(_layer(p, pre, cls, own[pre], o, nonlinearity))
    claimed = {mlx_names.join(pre, leaf) for pre in found for leaf in own[pre]}
    from dataclasses import replace

    return replace(ckpt, tensors={k: v for k, v in tensors.items() if k not in claimed})


def _layer(p: Path, pre: str, cls: str, t: dict[str, np.ndarray], orient: str, nonlinearity: str) -> RNNLayer:
    """One MLX module's tensors ``t`` (stored under ``orient``) as a canonical one-layer :class:`RNNLayer`."""
    if cls == "RNN":
        cell = Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH
        wx, wh, bias = t["Wxh"], t["Whh"], t.get("bias")
    else:
        cell = _CELL[cls]
        wx, wh, bias = t["Wx"], t["Wh"], t.get("bias", t.get("b"))
    conv = gates.convention("mlx", cell)
    cv = conv if orient == "out_in" else gates.Convention(conv.gate_order, "in_out", conv.bias, conv.source)
    try:
        w_ih = gates.to_canonical(wx, cv, cell)
        w_hh = gates.to_canonical(wh, cv, cell)
    except ValueError as exc:
        raise FormatError(f"{p}: MLX {cls} '{pre}': {exc}") from exc
    G, H = cell.gates, w_hh.shape[1]
    dt = np.result_type(w_ih.dtype, w_hh.dtype)
    b_ih, b_hh = np.zeros(G * H, dt), np.zeros(G * H, dt)
    if bias is not None:
        b_ih = gates.vec_to_canonical(np.ascontiguousarray(bias), conv, cell) if bias.shape == (G * H,) else None
        if b_ih is None:
            raise FormatError(f"{p}: MLX {cls} '{pre}': bias of shape {bias.shape}, expected {(G * H,)}")
        if cell is Cell.GRU:
            bhn = t["bhn"]
            if bhn.shape != (H,):
                raise FormatError(f"{p}: MLX GRU '{pre}': bhn of shape {bhn.shape}, expected {(H,)}")
            b_hh = np.zeros(G * H, bhn.dtype)
            b_hh[gates.gate_slice(cell, "n", H)] = bhn
    name = pre or cls.lower()
    keys = {leaf: mlx_names.join(pre, leaf) for leaf in t}
    try:
        return RNNLayer(name=name, cell=cell, input_size=w_ih.shape[1], hidden_size=H, bias=bias is not None,
                        semantics=Semantics(activation="relu" if cell is Cell.RNN_RELU else "tanh"),
                        params=[[DirectionParams(w_ih, w_hh, b_ih, b_hh)]],
                        source={"format": "mlx", "class_name": f"mlx.nn.{cls}", "orientation": orient,
                                "tensors": keys})
    except ValueError as exc:
        raise FormatError(f"{p}: MLX {cls} '{pre}': {exc}") from exc
