"""PyTorch state dicts as a convention, whatever container holds them (``.pt``, ``.safetensors``): the
``torch.nn`` names and order of one slab's tensors, the numpy state dict of a canonical checkpoint, a flat
state dict grouped back into canonical layers (eagerly or lazily), and what ``torch.nn`` can express.

Keys follow ``torch.nn.LSTM/GRU/RNN`` (``torch/nn/modules/rnn.py``; names in :mod:`.torch_names`): for stacked
layer ``k`` and direction suffix ``''`` / ``'_reverse'``:

* ``<layer>.weight_ih_l{k}{sfx}`` ``(G*H, in_k)``, ``<layer>.weight_hh_l{k}{sfx}`` ``(G*H, H or P)``,
* ``<layer>.bias_ih_l{k}{sfx}``, ``<layer>.bias_hh_l{k}{sfx}`` ``(G*H,)`` (absent when ``bias=False``),
* ``<layer>.weight_hr_l{k}{sfx}`` ``(P, H)`` with ``proj_size``;

gates LSTM i, f, g, o; GRU r, z, n (the canonical order: a copy, bit-exact; ``core.gates.TABLE``).
Used by the ``.pt`` family (:mod:`rnnconvert.formats.torch`), the safetensors container
(:mod:`rnnconvert.formats.storage.safetensors_fmt`) and the torch runtime (:mod:`rnnconvert.runtimes.torch`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..core import cudnn, gates
from ..core import names as foreign_names
from ..core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics, is_placeholder, placeholder
from ..core.transforms import fold_forget_bias
from ..engine import refusal
from ..errors import FormatError
from . import torch_names as naming
from .torch_names import is_cell

#: (state-dict key, direction, field) of one slab; field is a DirectionParams attribute.
Plan = list[tuple[str, int, str]]


def slab_plan(layer: RNNLayer, k: int) -> Plan:
    """The state-dict keys of slab ``k`` of ``layer`` in ``torch.nn`` naming and order
    (``weight_ih, weight_hh, bias_ih, bias_hh, weight_hr`` per direction; ``torch/nn/modules/rnn.py``)."""
    out: Plan = []
    cell = is_cell(layer)
    for d in range(layer.num_directions):
        for stem, fld in naming.PARAMS:
            if (fld in ("b_ih", "b_hh") and not layer.bias) or (fld == "w_hr" and not layer.proj_size):
                continue
            out.append((naming.param_key(layer.name, stem, k, d, cell), d, fld))
    return out


def slab_items(layer: RNNLayer, k: int, dirs: list[DirectionParams]) -> list[tuple[str, np.ndarray]]:
    """The state-dict entries of slab ``k`` (loaded ``dirs``): torch's gate order is the canonical one
    (``gates.TABLE[('torch', cell)]``), so each array is the canonical one made C-contiguous. ``dirs`` has
    no run-time ``forget_bias`` left: the engine folded it (``FormatSpec.forget_bias``), or
    :func:`state_dict` did."""
    one = layer.one_slab(k, dirs)
    cv = gates.convention("torch", layer.cell)
    out = []
    for key, d, fld in slab_plan(layer, k):
        arr = getattr(one.params[0][d], fld)
        if fld in ("w_ih", "w_hh"):
            arr = gates.from_canonical(arr, cv, layer.cell)
        elif fld in ("b_ih", "b_hh"):
            arr = gates.vec_from_canonical(arr, cv, layer.cell)
        else:
            arr = np.ascontiguousarray(arr)
        out.append((key, arr))
    return out



_ACT = {Cell.LSTM: "tanh", Cell.GRU: "tanh", Cell.RNN_TANH: "tanh", Cell.RNN_RELU: "relu"}


def refusals(layer: RNNLayer) -> list[str]:
    """What torch.nn cannot express about ``layer`` (empty when it can): exactly what the cuDNN
    equations cannot (:func:`rnnconvert.core.cudnn.refusals`), which torch.nn computes on every device."""
    return cudnn.refusals(layer)


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse layers torch.nn cannot express; return notes for what needs care outside the module.

    Raises:
        UnsupportedError: one line naming the layer, every blocking feature, and the way out.
    """
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "pt", f"PyTorch nn.{naming.MODULE[layer.cell]}")
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': nn.{naming.MODULE[layer.cell]} "
                         "returns both directions concatenated; apply the merge to its output")
    return notes


def state_dict(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The numpy state dict of ``ckpt`` (RNN layers in torch naming, then the carried tensors): what
    ``torch.nn`` runs for any canonical layer, so a run-time ``forget_bias`` (which torch.nn lacks) is folded
    into ``b_ih`` first (:func:`rnnconvert.core.transforms.fold_forget_bias`, one rounding), as the engine
    folds it before the ``.pt`` writer (``FormatSpec.forget_bias``); used by the runtimes, not the writer."""
    out: dict[str, np.ndarray] = {}
    for i, layer in enumerate(ckpt.layers):
        for k in range(layer.num_layers):
            one = fold_forget_bias(layer.one_slab(k, ckpt.slab(i, k)))
            out.update(slab_items(layer, k, one.params[0]))
    for key, arr in ckpt.tensors.items():
        if key in out:
            raise FormatError(f"tensor name '{key}' is used twice")
        out[key] = arr
    return out


class MappedSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a state dict whose arrays are views of a mapped file
    (:class:`rnnconvert.speed.mapped.MappedFile`; the safetensors reader): slab ``(i, k)`` = the arrays named
    ``keys[i][k]`` put in canonical form (as :func:`group_state_dict` does); ``release`` gives back their
    pages, ``release_array`` one array's. Made by :func:`lazy_state_dict`."""

    def __init__(self, mapped, arrays: dict[str, np.ndarray], keys: list, layers: list[RNNLayer]) -> None:
        self.mapped, self.arrays, self.keys = mapped, arrays, keys
        self.shape = [(layer.cell, layer.cell.gates * layer.hidden_size) for layer in layers]

    def read(self, i: int, k: int) -> list[DirectionParams]:
        cell, gh = self.shape[i]
        return [direction([None if n is None else self.arrays[n] for n in names], cell, gh)
                for names in self.keys[i][k]]

    def release(self, i: int, k: int) -> None:
        for names in self.keys[i][k]:
            for n in names:
                if n is not None:
                    self.mapped.release_array(self.arrays[n])

    def release_array(self, a: np.ndarray) -> None:
        self.mapped.release_array(a)


def lazy_state_dict(sd: dict[str, np.ndarray], mapped, where: str, fmt: str, nonlinearity: str) -> Checkpoint:
    """:func:`group_state_dict` of ``sd`` (arrays that are views of ``mapped``, a
    :class:`rnnconvert.speed.mapped.MappedFile`) as a lazy checkpoint: placeholder parameters, read one slab at a
    time through :class:`MappedSlabs`; the other tensors (``ckpt.tensors``) stay the mapped views.

    Raises:
        FormatError: as :func:`group_state_dict`."""
    stub = {k: placeholder(v.shape, v.dtype) if v.dtype.kind in "fc" else v for k, v in sd.items()}
    ckpt, keys = group(stub, where, fmt, nonlinearity)
    return replace(ckpt, tensors={k: sd[k] for k in ckpt.tensors}, slabs=MappedSlabs(mapped, sd, keys, ckpt.layers))


def has_torch_names(sd: dict[str, Any]) -> bool:
    """Whether any key of ``sd`` is a ``torch.nn`` recurrent key (``*.weight_ih_l{k}`` or ``*.weight_ih``);
    readers send files without one to the foreign-name table (:mod:`rnnconvert.core.names`)."""
    return any(isinstance(k, str) and naming.FIRST_KEY.match(k) for k in sd)


def foreign(sd: dict[str, Any], where: str, nonlinearity: str, map: Any, container: str | None = None) -> Checkpoint:
    ckpt = foreign_names.fallback(sd, where, "pt", {"map": map, "nonlinearity": nonlinearity})
    if container:
        ckpt.meta["container"] = container
    return ckpt


def strip_module_prefix(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop the ``module.`` prefix that ``DataParallel``/``DistributedDataParallel`` add to every key."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def group_state_dict(sd: dict[str, np.ndarray], where: str, fmt: str = "pt", nonlinearity: str = "tanh") -> Checkpoint:
    """Group a flat state dict of numpy arrays (PyTorch key names) into recurrent layers.

    Used by the ``.pt`` and ``.safetensors`` readers. ``nn.LSTM/GRU/RNN`` keys (``weight_ih_l{k}``,
    ``_reverse``, ``weight_hr``) and cell keys (``weight_ih`` without suffix, ``nn.LSTMCell`` etc.) are
    recognised; ``nonlinearity`` tells the activation of ``nn.RNN``/``nn.RNNCell`` (not stored).
    Gate orders: :data:`rnnconvert.core.gates.TABLE` ``("torch", cell)`` (a copy: bit-exact). Values of ``sd``
    may be :func:`~rnnconvert.core.model.placeholder` arrays (a lazy reader): they are kept as they are.

    Raises:
        FormatError: no recurrent keys, or inconsistent shapes.
    """
    return group(sd, where, fmt, nonlinearity)[0]


def direction(a: list, layer_cell: Cell, gh: int) -> DirectionParams:
    """Canonical params of one direction from its ``weight_ih, weight_hh, bias_ih, bias_hh, weight_hr``
    (``None`` for absent ones; missing biases are zeros). Placeholders pass through as they are."""
    conv = gates.convention("torch", layer_cell)
    canon = lambda m, f: m if is_placeholder(m) else f(m, conv, layer_cell)  # noqa: E731
    zeros = np.zeros(gh, dtype=a[0].dtype)
    return DirectionParams(
        canon(a[0], gates.to_canonical), canon(a[1], gates.to_canonical),
        zeros if a[2] is None else canon(a[2], gates.vec_to_canonical),
        zeros.copy() if a[3] is None else canon(a[3], gates.vec_to_canonical), a[4])


def group(sd: dict[str, np.ndarray], where: str, fmt: str, nonlinearity: str):
    """:func:`group_state_dict`, plus the key names of every slab: ``keys[i][k][d]`` lists the five keys
    (``None`` when absent) that :func:`direction` takes, for a lazy reader's loader."""
    groups: dict[str, set[tuple[int, bool]]] = {}
    cells: set[str] = set()
    for key in sd:
        m = naming.FIRST_KEY.match(key)
        if m:
            prefix = m.group("prefix") or ""
            if m.group("k") is None:
                cells.add(prefix)
            groups.setdefault(prefix, set()).add((int(m.group("k") or 0), bool(m.group("rev"))))
    if not groups:
        raise FormatError(f"{where}: no recurrent module (keys '*.weight_ih_l0' or '*.weight_ih') in this file")
    ckpt = Checkpoint(format=fmt, meta={"path": where})
    used: set[str] = set()
    keys: list = []
    for prefix, found in groups.items():
        pre = f"{prefix}." if prefix else ""
        is_cell = prefix in cells
        nl = 1 + max(k for k, _ in found)
        bidi = any(r for _, r in found)
        s0 = naming.suffix(0, 0, is_cell)
        w_hh0 = sd.get(naming.param_key(prefix, "weight_hh", 0, 0, is_cell))
        w_hr0 = sd.get(naming.param_key(prefix, "weight_hr", 0, 0, is_cell))
        if w_hh0 is None:
            raise FormatError(f"{where}: '{pre}weight_ih{s0}' has no matching weight_hh{s0}")
        H = w_hr0.shape[1] if w_hr0 is not None else w_hh0.shape[1]
        G = w_hh0.shape[0] // H if H else 0
        cell = {4: Cell.LSTM, 3: Cell.GRU, 1: Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH}.get(G)
        if cell is None or G * H != w_hh0.shape[0]:
            raise FormatError(f"{where}: '{pre}weight_hh{s0}' of shape {tuple(w_hh0.shape)} fits no LSTM/GRU/RNN")
        has_bias = naming.param_key(prefix, "bias_ih", 0, 0, is_cell) in sd
        params, lkeys = [], []
        for k in range(nl):
            row, rkeys = [], []
            for rev in ([False, True] if bidi else [False]):
                names = [naming.param_key(prefix, stem, k, rev, is_cell) for stem, _ in naming.PARAMS]
                a = [sd.get(n) for n in names]
                if a[0] is None or a[1] is None:
                    raise FormatError(f"{where}: missing {names[0]} or {names[1]}")
                used.update(n for n, v in zip(names, a) if v is not None)
                try:
                    row.append(direction(a, cell, G * H))
                except ValueError as exc:  # a weight whose rows do not split into the gates
                    raise FormatError(f"{where}: '{names[0]}': {exc}") from exc
                rkeys.append([n if v is not None else None for n, v in zip(names, a)])
            params.append(row)
            lkeys.append(rkeys)
        cls = f"nn.{naming.MODULE[cell]}" + ("Cell" if is_cell else "")
        try:
            ckpt.layers.append(RNNLayer(
                name=prefix or "rnn", cell=cell, input_size=params[0][0].w_ih.shape[1], hidden_size=H,
                num_layers=nl, bidirectional=bidi, proj_size=0 if w_hr0 is None else w_hr0.shape[0],
                bias=has_bias, semantics=Semantics(activation=_ACT[cell]), params=params,
                source={"format": fmt, "class_name": cls}))
        except ValueError as exc:
            raise FormatError(f"{where}: {exc}") from exc
        keys.append(lkeys)
    for key, v in sd.items():
        if key not in used:
            ckpt.tensors[key] = v
    return ckpt, keys

