"""PyTorch state dicts (``.pt``, ``.pth``): writer, basic reader, and the torch side of verification.

Keys follow ``torch.nn.LSTM/GRU/RNN`` (``torch/nn/modules/rnn.py``): for stacked layer ``k`` and
direction suffix ``''`` / ``'_reverse'``:

* ``<layer>.weight_ih_l{k}{sfx}`` ``(G*H, in_k)``, ``<layer>.weight_hh_l{k}{sfx}`` ``(G*H, H or P)``,
* ``<layer>.bias_ih_l{k}{sfx}``, ``<layer>.bias_hh_l{k}{sfx}`` ``(G*H,)`` (absent when ``bias=False``),
* ``<layer>.weight_hr_l{k}{sfx}`` ``(P, H)`` with ``proj_size``;

gates LSTM i, f, g, o; GRU r, z, n (the canonical order: a copy, bit-exact). Files are written as a
plain ``dict[str, Tensor]`` that ``torch.load(path, weights_only=True)`` reads and
``load_state_dict(strict=True)`` accepts into ``nn.LSTM(..., batch_first=True)`` of matching size.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from .. import gates
from ..errors import FormatError, UnsupportedError, require
from ..model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ..transforms import fold_forget_bias

ZIP_MAGIC = b"PK\x03\x04"
_MODULE = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}
_ACT = {Cell.LSTM: "tanh", Cell.GRU: "tanh", Cell.RNN_TANH: "tanh", Cell.RNN_RELU: "relu"}


def sniff(head: bytes, path: Path) -> bool:
    """A zip whose member names look like ``torch.save`` output (``<archive>/data.pkl``)."""
    if not head.startswith(ZIP_MAGIC):
        return False
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()[:64])
    except (zipfile.BadZipFile, OSError):
        return False


def _refusals(layer: RNNLayer) -> list[str]:
    """What torch.nn cannot express about ``layer`` (empty when it can)."""
    s, why = layer.semantics, []
    if layer.cell in (Cell.LSTM, Cell.GRU) and s.gate_activation != "sigmoid":
        why.append(f"recurrent_activation={s.gate_activation} (torch gates are sigmoid only)")
    if s.activation != _ACT[layer.cell]:
        why.append(f"activation={s.activation} (torch nn.{_MODULE[layer.cell]} uses {_ACT[layer.cell]})")
    if layer.cell is Cell.GRU and not s.reset_after:
        why.append("reset_after=False (torch nn.GRU applies the reset gate after the recurrent matmul)")
    if layer.params[0][0].peep is not None:
        why.append("peephole connections")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("cell_clip/proj_clip")
    if s.go_backwards and not layer.bidirectional:
        why.append("go_backwards=True (reverse the sequence yourself and convert the layer without it)")
    return why


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse layers torch.nn cannot express; return notes for what needs care outside the module.

    Raises:
        UnsupportedError: one line naming the layer, every blocking feature, and the way out.
    """
    notes = []
    for layer in ckpt.layers:
        why = _refusals(layer)
        if why:
            raise UnsupportedError(
                f"layer '{layer.name}' ({layer.source.get('class_name', layer.cell.value)}) cannot be written as "
                f"PyTorch nn.{_MODULE[layer.cell]}: {'; '.join(why)}. Convert to .onnx instead, which expresses it exactly")
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': nn.{_MODULE[layer.cell]} "
                         "returns both directions concatenated; apply the merge to its output")
    return notes


def module_args(layer: RNNLayer) -> dict[str, Any]:
    """Constructor arguments of the ``torch.nn`` module that loads ``layer`` (``batch_first=True``)."""
    args: dict[str, Any] = {"input_size": layer.input_size, "hidden_size": layer.hidden_size}
    if layer.num_layers != 1:
        args["num_layers"] = layer.num_layers
    if layer.cell is Cell.RNN_RELU:
        args["nonlinearity"] = "relu"
    if not layer.bias:
        args["bias"] = False
    if layer.bidirectional:
        args["bidirectional"] = True
    if layer.proj_size:
        args["proj_size"] = layer.proj_size
    args["batch_first"] = True
    return args


def describe_module(layer: RNNLayer) -> str:
    """``"rnn_1: nn.LSTM(input_size=100, hidden_size=128, batch_first=True)"``."""
    a = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in module_args(layer).items())
    return f"{layer.name}: nn.{_MODULE[layer.cell]}({a})"


def state_dict(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The numpy state dict of ``ckpt`` (RNN layers in torch naming, then the carried tensors)."""
    out: dict[str, np.ndarray] = {}
    conv = {c: gates.convention("torch", c) for c in Cell}
    for layer in ckpt.layers:
        layer = fold_forget_bias(layer)
        cv = conv[layer.cell]
        for k, dirs in enumerate(layer.params):
            for d, p in enumerate(dirs):
                sfx = f"_l{k}" + ("_reverse" if d else "")
                out[f"{layer.name}.weight_ih{sfx}"] = gates.from_canonical(p.w_ih, cv, layer.cell)
                out[f"{layer.name}.weight_hh{sfx}"] = gates.from_canonical(p.w_hh, cv, layer.cell)
                if layer.bias:
                    out[f"{layer.name}.bias_ih{sfx}"] = gates.vec_from_canonical(p.b_ih, cv, layer.cell)
                    out[f"{layer.name}.bias_hh{sfx}"] = gates.vec_from_canonical(p.b_hh, cv, layer.cell)
                if p.w_hr is not None:
                    out[f"{layer.name}.weight_hr{sfx}"] = np.ascontiguousarray(p.w_hr)
    for key, arr in ckpt.tensors.items():
        if key in out:
            raise FormatError(f"tensor name '{key}' is used twice")
        out[key] = arr
    return out


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as a ``torch.save`` dict of tensors; returns one line per layer naming its module.

    Raises:
        UnsupportedError: see :func:`check`.
    """
    torch = require("torch", "torch")
    check(ckpt)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state_dict(ckpt).items()}
    torch.save(sd, str(path))
    return [describe_module(layer) for layer in ckpt.layers]


def build_module(layer: RNNLayer, sd: dict[str, Any]):
    """A ``torch.nn`` module for ``layer`` loaded (strict) from the tensors ``sd`` under ``<layer>.``."""
    torch = require("torch", "torch")
    cls = getattr(torch.nn, _MODULE[layer.cell])
    mod = cls(**module_args(layer))
    prefix = layer.name + "."
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
    first = next(iter(sub.values()))
    mod = mod.to(first.dtype)
    mod.load_state_dict(sub, strict=True)
    return mod.eval()


def modules(ckpt: Checkpoint) -> dict[str, Any]:
    """Ready ``torch.nn`` modules for every layer of ``ckpt``, by layer name (eval mode, batch_first).

    Raises:
        UnsupportedError: a layer torch cannot express (see :func:`check`).
    """
    torch = require("torch", "torch")
    check(ckpt)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state_dict(ckpt).items()}
    return {layer.name: build_module(layer, sd) for layer in ckpt.layers}


def load_state(path: str | Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True, map_location='cpu')``; never unpickles code.

    Raises:
        FormatError: the file cannot be loaded with ``weights_only=True`` (the reason is given).
    """
    torch = require("torch", "torch")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FormatError(f"{path}: not loadable as a PyTorch file with weights_only=True: {first}") from exc


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Run layer ``name`` of the written file ``path`` in torch on ``x`` ``(B, T, I)``; float64 result."""
    torch = require("torch", "torch")
    sd = load_state(path)
    layer = ckpt.layer(name)
    mod = build_module(layer, sd)
    dtype = next(mod.parameters()).dtype
    with torch.no_grad():
        y, _ = mod(torch.from_numpy(np.asarray(x)).to(dtype))
    return y.double().numpy()


_KEY = re.compile(r"^(?:(?P<prefix>.*)\.)?weight_ih_l(?P<k>\d+)(?P<rev>_reverse)?$")


def _flatten(obj: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    torch = require("torch", "torch")
    if depth > 32:
        raise FormatError("containers nested deeper than 32 levels")
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k), depth + 1))
    return out


def read(path: str | Path, *, nonlinearity: str = "tanh", **_: Any) -> Checkpoint:
    """Read a PyTorch state dict (or a dict wrapping one) of ``nn.LSTM/GRU/RNN`` modules.

    ``nonlinearity`` (``'tanh'``/``'relu'``) tells an ``nn.RNN``'s activation, which the file does not store.

    Raises:
        FormatError: not loadable with ``weights_only=True``, or inconsistent shapes.
    """
    sd = {k: v for k, v in _flatten(load_state(path)).items()}
    groups: dict[str, set[tuple[int, bool]]] = {}
    for key in sd:
        m = _KEY.match(key)
        if m:
            groups.setdefault(m.group("prefix") or "", set()).add((int(m.group("k")), bool(m.group("rev"))))
    if not groups:
        raise FormatError(f"{path}: no recurrent module (keys '*.weight_ih_l0') in this PyTorch file")
    ckpt = Checkpoint(format="pt", meta={"path": str(path)})
    used: set[str] = set()
    for prefix, found in groups.items():
        pre = f"{prefix}." if prefix else ""
        nl = 1 + max(k for k, _ in found)
        bidi = any(r for _, r in found)
        g = lambda n: sd.get(f"{pre}{n}")  # noqa: E731
        w_hh0 = g("weight_hh_l0")
        w_hr0 = g("weight_hr_l0")
        if w_hh0 is None:
            raise FormatError(f"{path}: '{pre}weight_ih_l0' has no matching weight_hh_l0")
        H = w_hr0.shape[1] if w_hr0 is not None else w_hh0.shape[1]
        G = w_hh0.shape[0] // H
        cell = {4: Cell.LSTM, 3: Cell.GRU, 1: Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH}.get(G)
        if cell is None or G * H != w_hh0.shape[0]:
            raise FormatError(f"{path}: '{pre}weight_hh_l0' of shape {tuple(w_hh0.shape)} fits no LSTM/GRU/RNN")
        has_bias = g("bias_ih_l0") is not None
        params = []
        conv = gates.convention("torch", cell)
        for k in range(nl):
            row = []
            for rev in ([False, True] if bidi else [False]):
                sfx = f"_l{k}" + ("_reverse" if rev else "")
                names = [f"{pre}{n}{sfx}" for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")]
                t = [sd.get(n) for n in names]
                if t[0] is None or t[1] is None:
                    raise FormatError(f"{path}: missing {names[0]} or {names[1]}")
                used.update(n for n, v in zip(names, t) if v is not None)
                a = [None if v is None else v.detach().cpu().numpy() for v in t]
                zeros = np.zeros(G * H, dtype=a[0].dtype)
                row.append(DirectionParams(
                    gates.to_canonical(a[0], conv, cell), gates.to_canonical(a[1], conv, cell),
                    zeros if a[2] is None else gates.vec_to_canonical(a[2], conv, cell),
                    zeros.copy() if a[3] is None else gates.vec_to_canonical(a[3], conv, cell),
                    a[4]))
            params.append(row)
        try:
            ckpt.layers.append(RNNLayer(
                name=prefix or "rnn", cell=cell, input_size=params[0][0].w_ih.shape[1], hidden_size=H,
                num_layers=nl, bidirectional=bidi, proj_size=0 if w_hr0 is None else w_hr0.shape[0],
                bias=has_bias, semantics=Semantics(activation=_ACT[cell]), params=params,
                source={"format": "pt", "class_name": f"nn.{_MODULE[cell]}"}))
        except ValueError as exc:
            raise FormatError(f"{path}: {exc}") from exc
    for key, v in sd.items():
        if key not in used:
            ckpt.tensors[key] = v.detach().cpu().numpy()
    return ckpt
