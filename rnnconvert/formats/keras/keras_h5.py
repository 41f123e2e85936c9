"""Keras HDF5 files (``.h5``, ``.hdf5``, ``.keras`` of Keras 2): reader (writer: :mod:`.keras_h5_write`).

Dialects read (``docs/LAYOUTS.md`` §§1-4; tf_keras ``saving/legacy/hdf5_format.py``):

* full-model files (root ``@model_config`` + group ``model_weights``) and weights-only files
  (``@layer_names`` at the root); ``layer_names0, layer_names1 ...`` chunked attributes;
* Keras 1 (12-tensor LSTM saved i, c, f, o; 9-tensor GRU z, r, h; no ``keras_version`` on the
  weights group), standalone Keras 2.0-2.3, tf.keras / tf_keras (``lstm/lstm_cell/kernel:0``);
* nested ``Sequential``/``Model``, ``Bidirectional`` (forward half of the weights first),
  ``TimeDistributed``;
* Keras 1 3-tensor layers (``lstm_1_W``, ``lstm_1_U``, ``lstm_1_b``: LSTM ``consume_less='gpu'``,
  SimpleRNN; Dense ``dense_1_W``/``dense_1_b``), recognised by name in weights-only files;
* ``keras.layers.RNN`` around ``LSTMCell``/``GRUCell``/``SimpleRNNCell`` (read as the matching layer);
* ``LSTM``, ``GRU`` (``reset_after`` True/False; absent key = False), ``SimpleRNN``,
  ``CuDNNLSTM``/``CuDNNGRU`` (kernel slices hold cuDNN's row-major ``(H, in)`` bytes; bias
  ``(2*G*H,)``), ``use_bias=False``.

Lazy reading (``read(path, lazy=True)``, streaming conversion): the structure with placeholder
parameters and a loader reading one layer's datasets in row blocks (docs/keras.md "Reading lazily").

Weights are matched by group and order, never by the names stored inside a group (real files
put them under another prefix, e.g. textgenrnn's ``rnn_1/rnn_1_2/kernel:0``).

Semantics come from the layer config; for weights-only files from the defaults of the
``keras_version`` that wrote the file (``recurrent_activation='hard_sigmoid'`` through Keras 2.2.5
and in TF1 tf.keras; ``sigmoid`` from standalone 2.3.0 and in TF2 tf.keras). CuDNN layers are
always sigmoid/tanh.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...io import budget, guard
from ...errors import FormatError, UnsupportedError
from ...core.finite import all_finite
from ...core.model import (ACTIVATIONS, Cell, Checkpoint, DirectionParams, RNNLayer, Semantics, is_placeholder,
                     placeholder)

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
RNN_CLASSES = {"LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU", "LSTMV1", "GRUV1", "CuDNNLSTMV1"}
_CELL_KIND = {"LSTMCell": "LSTM", "GRUCell": "GRU", "SimpleRNNCell": "SimpleRNN"}
_KERAS_ACT = {"hard_sigmoid": "hard_sigmoid", "sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu",
              "linear": "linear", "softsign": "softsign", None: "linear"}


# --------------------------------------------------------------------------------------------
# HDF5 access, hardened
# --------------------------------------------------------------------------------------------

def check_links(f) -> None:
    """Refuse soft/external links and external or virtual datasets (they reach outside the file)."""
    import h5py

    bad: list[str] = []


    def walk(group, prefix=""):
        for key in group.keys():
            link = group.get(key, getlink=True)
            path = f"{prefix}/{key}"
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                bad.append(f"{path} is a {type(link).__name__}")
                continue
            obj = group.get(key)
            if isinstance(obj, h5py.Group):
                if path.count("/") > 64:
                    raise FormatError(f"HDF5 groups nested deeper than 64 levels at {path}")
                walk(obj, path)
            elif isinstance(obj, h5py.Dataset):
                if obj.external or obj.is_virtual:
                    bad.append(f"{path} is an external or virtual dataset")

    walk(f)
    if bad:
        raise FormatError(f"refusing HDF5 file with links outside the file: {bad[0]}")


def attr_list(group, name: str) -> list[str]:
    """Read a Keras string-list attribute, joining chunked ``name0, name1 ...`` attributes; at most the
    ``names`` limit of :mod:`rnnconvert.io.budget` (checked from the attribute's shape before it is read).

    Raises:
        BudgetError: more names than the limit."""
    where = f"{group.file.filename}: attribute '{name}' of {group.name}"
    if name in group.attrs:
        budget.check_count(where, "names", _attr_len(group, name), "names")
        vals = list(group.attrs[name])
    else:
        vals, i = [], 0
        while f"{name}{i}" in group.attrs:
            budget.check_count(where, "names", len(vals) + _attr_len(group, f"{name}{i}"), "names")
            vals.extend(group.attrs[f"{name}{i}"])
            i += 1
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in vals]


def _attr_len(group, name: str) -> int:
    """The number of values of attribute ``name`` from its dataspace, without reading them."""
    import h5py

    try:
        shape = h5py.h5a.open(group.id, name.encode()).shape
    except (KeyError, OSError, RuntimeError, ValueError):
        return 0
    n = 1
    for d in shape or ():
        n *= int(d)
    return n


def attr_str(obj, name: str) -> str | None:
    v = obj.attrs.get(name)
    if v is None:
        return None
    return v.decode("utf8") if isinstance(v, bytes) else str(v)


def _dataset_meta(ds, where: str) -> np.ndarray:
    """A :func:`~rnnconvert.core.model.placeholder` of a dataset's shape and dtype, after the checks that need
    no data: a dataset, floating point, a shape the file can hold (no promise of more bytes than it has)."""
    import h5py

    if not isinstance(ds, h5py.Dataset):
        raise FormatError(f"{where}: expected a dataset, found a {type(ds).__name__}")
    if ds.dtype.kind != "f":
        raise FormatError(f"{where}: weights must be floating point, found dtype {ds.dtype}")
    nbytes = int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
    fsize = Path(ds.file.filename).stat().st_size
    if nbytes > 64 * fsize + (1 << 20) and ds.compression is None:
        raise FormatError(f"{where}: declared shape {ds.shape} needs {nbytes} bytes, the file has {fsize}")
    if ds.chunks is not None or ds.compression is not None:  # filtered or sparse: judge by the bytes stored
        budget.check_expansion(where, nbytes, min(ds.id.get_storage_size(), fsize),
                               f"{'compressed' if ds.compression else 'chunked'} dataset of shape {ds.shape}")
    return placeholder(ds.shape, ds.dtype)


def read_dataset(ds, where: str, out: np.ndarray | None = None) -> np.ndarray:
    """Read a dataset fully (into ``out`` when its shape and dtype fit) after :func:`_dataset_meta`'s
    checks; NaN/Inf refused."""
    _dataset_meta(ds, where)
    if ds.shape is None or ds.size == 0:
        arr = np.asarray(ds[()])
    else:
        fits = out is not None and out.shape == ds.shape and out.dtype == ds.dtype and out.flags.c_contiguous
        arr = out if fits else np.empty(ds.shape, ds.dtype)
        ds.read_direct(arr)
    if not all_finite(arr):
        raise FormatError(f"{where}: contains NaN or Inf values; the checkpoint is damaged")
    return arr


def _read_concat(path: str, locations: tuple[str, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Keras 1 per-gate datasets ``locations`` read and joined along their last axis (LazyRaw loader;
    ``out`` is not used: Keras 1 layers are small)."""
    import h5py

    with h5py.File(path, "r") as f:
        return np.concatenate([read_dataset(f[loc], f"{path}: {loc}") for loc in locations], axis=-1)


class LazyRaw(Mapping):
    """A direction's Keras tensors as stored in the file (``kernel``, ``recurrent_kernel``, ``bias``),
    re-read from the HDF5 file on each access instead of held in memory (or with ``load(path,
    location)``: the TF2 checkpoint reader keeps checkpoint keys as locations).

    The reader keeps only the canonical copy of the weights; verification (``--verify framework``)
    reads the file's own tensors again through this mapping. Holding both would double the memory of
    a multi-GB checkpoint (docs/performance.md, "Large checkpoints").
    """

    def __init__(self, path: str, locations: dict[str, str], load: Callable[[str, str], np.ndarray] | None = None):
        self.path, self.locations, self.load = path, dict(locations), load

    def __getitem__(self, key: str) -> np.ndarray:
        return self.read(key)

    def read(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor ``key``; read into ``out`` when it has the dataset's shape and dtype (verification
        reuses one layer's buffers for the next: a fresh multi-MB array costs its first-touch page faults,
        which made re-reading the 3 GB benchmark file 16x slower than the conversion's reads)."""
        import h5py

        loc = self.locations[key]
        if self.load is not None:  # another container of Keras tensors (TF2 checkpoints: tf_checkpoint.lazy_get)
            return self.load(self.path, loc, out)
        with h5py.File(self.path, "r") as f:
            ds = f[loc]
            offset = _plain_offset(ds)
            if offset is not None and ds.dtype.kind == "f":
                # a read-only map of the file's bytes: the products read the page cache in place, with no copy
                # (the 3 GB benchmark model: 1.2 s of copying saved). Not checked for NaN/Inf again: the
                # conversion's reader refused them in these very bytes, and a non-finite value would fail
                # the comparison anyway.
                return np.memmap(self.path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
            return read_dataset(ds, f"{self.path}: {loc}", out)

    def __iter__(self):
        return iter(self.locations)

    def __len__(self) -> int:
        return len(self.locations)


# --------------------------------------------------------------------------------------------
# Layer records as found in the file
# --------------------------------------------------------------------------------------------

@dataclass
class LayerEntry:
    """One layer's weights and config as found in the file, before interpretation."""

    name: str
    names: list[str]
    weights: list[np.ndarray]
    config: dict[str, Any] | None = None
    class_name: str | None = None
    children: list["LayerEntry"] = field(default_factory=list)
    locations: list[str] | None = None  # the HDF5 dataset path of each weight, for LazyRaw


def _base(wname: str) -> str:
    """``'lstm/lstm_cell/kernel:0'`` -> ``'kernel'``."""
    return wname.rsplit("/", 1)[-1].split(":")[0]


def _index_configs(config: dict | None) -> dict[str, dict]:
    """Map top-level layer names to their ``{'class_name', 'config'}`` records."""
    if not config:
        return {}
    cfg = config.get("config", config)
    layers = cfg.get("layers", cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(layers, list):
        return {}
    out = {}
    for rec in layers:
        if isinstance(rec, dict) and isinstance(rec.get("config"), dict):
            nm = rec["config"].get("name") or rec.get("name")
            if nm:
                out[nm] = rec
    return out


# --------------------------------------------------------------------------------------------
# Version defaults (LAYOUTS.md §3.4)
# --------------------------------------------------------------------------------------------

def default_gate_activation(keras_version: str | None) -> str | None:
    """Default LSTM/GRU ``recurrent_activation`` of the Keras that wrote the file.

    Returns ``'hard_sigmoid'`` for Keras 1 and standalone Keras 2.0.0-2.2.5, ``'sigmoid'`` for
    standalone 2.3+ and tf.keras >= 2.4 / tf_keras, and ``None`` for ``'...-tf'`` versions (tf.keras
    of TF 1.x defaulted to hard_sigmoid, of TF 2.0-2.3 to sigmoid: the version cannot tell).
    (Sources: keras tags 1.2.2-2.3.1 ``keras/layers/recurrent.py``; tf_keras ``lstm_v1.py``, ``lstm.py``.)
    """
    if not keras_version or keras_version.startswith("1"):
        return "hard_sigmoid"
    if keras_version.endswith("-tf"):
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", keras_version)
    if not m:
        return None
    ver = tuple(int(x or 0) for x in m.groups())
    return "hard_sigmoid" if ver < (2, 3, 0) else "sigmoid"


def default_reset_after(keras_version: str | None) -> bool | None:
    """Default GRU ``reset_after`` of the Keras that wrote a weights-only file (LAYOUTS.md §3.4).

    ``False`` for Keras 1 (reset-before only) and standalone Keras 2.0-2.3 (the key appeared in 2.1.5
    with default ``False``); ``True`` for tf_keras / Keras >= 2.4; ``None`` for ``'...-tf'`` versions
    (tf.keras of TF 1.x: ``False``; of TF 2.x: ``True``). Only needed when the GRU has no bias: with a
    bias, its shape decides ((2, 3H): True, (3H,): False).
    """
    if not keras_version or keras_version.startswith("1"):
        return False
    if keras_version.endswith("-tf"):
        return None
    m = re.match(r"(\d+)\.(\d+)", keras_version)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))) >= (2, 4)


# --------------------------------------------------------------------------------------------
# Interpretation
# --------------------------------------------------------------------------------------------

class Interpreter:
    def __init__(self, path: str, keras_version: str | None, gate_activation: str | None):
        self.path = path
        self.keras_version = keras_version
        self.gate_override = gate_activation
        self.lazy_load: Callable[[str, str], np.ndarray] | None = None  # LazyRaw's loader (None: HDF5)
        self.ckpt = Checkpoint(format="keras_h5", meta={"path": path, "keras_version": keras_version})
        self.file = None  # the open h5py.File while a lazy skeleton is read (other layers' values)
        self.specs: dict[int, tuple[_DirSpec, dict[str, Any]]] = {}  # id(placeholder params) -> how to load

    def value(self, e: LayerEntry, j: int) -> np.ndarray:
        """Weight ``j`` of ``e`` as an array (read now when the entry holds placeholders)."""
        w = e.weights[j]
        if is_placeholder(w) and e.locations is not None:
            if self.file is not None:
                return read_dataset(self.file[e.locations[j]], f"{self.path}: {e.locations[j]}")
            if self.lazy_load is not None:  # another container (TF2 checkpoints): read through its loader
                return self.lazy_load(self.path, e.locations[j])
        return w

    def layer_specs(self) -> list[list[tuple["_DirSpec", dict[str, Any]]]]:
        """Per recurrent layer, per direction: the spec and sources its placeholders are loaded from."""
        return [[self.specs[id(dp)] for dp in layer.params[0]] for layer in self.ckpt.layers]

    # -- dispatch ---------------------------------------------------------------------------
    def entry(self, e: LayerEntry, prefix: str) -> None:
        name = f"{prefix}{e.name}"
        cls = e.class_name
        cfg = e.config if isinstance(e.config, dict) else {}
        if cls in ("Sequential", "Model", "Functional") or (cls is None and self._looks_nested(e)):
            self.nested(e, name)
            return
        if cls == "Bidirectional" or (cls is None and self._looks_bidirectional(e)):
            self.bidirectional(e, name)
            return
        if cls == "TimeDistributed":
            inner = as_record(cfg.get("layer"))
            self.entry(LayerEntry(e.name, e.names, e.weights, inner["config"], inner["class_name"],
                              locations=e.locations), prefix)
            return
        if cls == "RNN":  # keras.layers.RNN(cell): the cell's config plus the wrapper's direction/outputs
            cell = cfg.get("cell") or {}
            kind = _CELL_KIND.get(cell.get("class_name"))
            if kind is None:
                raise UnsupportedError(f"layer '{name}': RNN wrapper around {cell.get('class_name')!r} is not supported "
                                       f"(supported cells: {', '.join(_CELL_KIND)})")
            merged = {**(cell.get("config") or {}),
                      **{k: cfg[k] for k in ("return_sequences", "go_backwards") if k in cfg}}
            self.ckpt.layers.append(self.rnn(LayerEntry(e.name, e.names, e.weights, merged, kind, locations=e.locations),
                                             name, kind))
            return
        kind = self._rnn_kind(e, cls)
        if kind:
            self.ckpt.layers.append(self.rnn(e, name, kind))
            return
        self.other(e, name, cls)

    @staticmethod
    def _looks_nested(e: LayerEntry) -> bool:
        firsts = {n.split("/")[0] for n in e.names if "/" in n}
        return len(firsts) > 1 and not Interpreter._looks_bidirectional(e)

    @staticmethod
    def _looks_bidirectional(e: LayerEntry) -> bool:
        return any("forward_" in n for n in e.names) and any("backward_" in n for n in e.names)

    def _rnn_kind(self, e: LayerEntry, cls: str | None) -> str | None:
        if cls is not None:
            cls = {"LSTMV1": "LSTM", "GRUV1": "GRU"}.get(cls, cls)
            return cls if cls in RNN_CLASSES else None
        bases = [_base(n) for n in e.names]
        n = len(e.weights)
        if n == 12 and all(re.search(r"_[WUb]_[icfo]$", b) for b in bases):
            return "LSTM"
        if n == 9 and all(re.search(r"_[WUb]_[zrh]$", b) for b in bases):
            return "GRU"
        # Keras 2 names the recurrent matrix 'recurrent_kernel'; Keras 1 (3-tensor SimpleRNN and LSTM
        # consume_less='gpu', LAYOUTS.md §1.1, §1.3) names its tensors '<layer>_W', '<layer>_U', '<layer>_b'.
        if n not in (2, 3) or not ("recurrent_kernel" in bases or re.search(r"(^|_)U$", bases[1])):
            return None
        k, r = e.weights[0], e.weights[1]
        if k.ndim != 2 or r.ndim != 2 or r.shape[1] % r.shape[0]:
            return None
        g, h = r.shape[1] // r.shape[0], r.shape[0]
        b = e.weights[2] if n == 3 else None
        if g == 4:
            return "CuDNNLSTM" if b is not None and b.shape == (8 * h,) else "LSTM"
        if g == 3:
            return "CuDNNGRU" if b is not None and b.shape == (6 * h,) else "GRU"
        return "SimpleRNN" if g == 1 else None

    # -- containers -------------------------------------------------------------------------
    def nested(self, e: LayerEntry, name: str) -> None:
        inner_cfgs = _index_configs(e.config and {"config": e.config})
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(e.names):
            groups.setdefault(n.split("/")[0] if "/" in n else n, []).append(i)
        for sub, idx in groups.items():
            rec = inner_cfgs.get(sub, {})
            child = LayerEntry(sub, [e.names[i].split("/", 1)[-1] for i in idx], [e.weights[i] for i in idx],
                           rec.get("config"), rec.get("class_name"),
                           locations=None if e.locations is None else [e.locations[i] for i in idx])
            self.entry(child, f"{name}.")

    def bidirectional(self, e: LayerEntry, name: str) -> None:
        cfg = e.config if isinstance(e.config, dict) else {}
        inner = as_record(cfg.get("layer"))
        half = len(e.weights) // 2
        if half * 2 != len(e.weights) or half == 0:
            raise FormatError(f"{self.path}: Bidirectional layer '{name}' has {len(e.weights)} weights, not an even split")
        loc = e.locations
        fw = LayerEntry(name, e.names[:half], e.weights[:half], inner["config"], inner["class_name"],
                    locations=None if loc is None else loc[:half])
        bw_cfg = as_record(cfg.get("backward_layer")) if cfg.get("backward_layer") else inner
        bw = LayerEntry(name, e.names[half:], e.weights[half:], bw_cfg["config"], bw_cfg["class_name"],
                    locations=None if loc is None else loc[half:])
        kind_f = self._rnn_kind(fw, fw.class_name)
        kind_b = self._rnn_kind(bw, bw.class_name)
        if not kind_f or kind_f != kind_b:
            raise UnsupportedError(
                f"layer '{name}': Bidirectional of {kind_f or fw.class_name} / {kind_b or bw.class_name} "
                "is not supported (both directions must be the same recurrent layer kind)")
        lf, lb = self.rnn(fw, name, kind_f), self.rnn(bw, name, kind_b)
        if (lf.cell, lf.input_size, lf.hidden_size, lf.semantics) != (lb.cell, lb.input_size, lb.hidden_size,
                                                                       _unreversed(lb.semantics)):
            raise UnsupportedError(f"layer '{name}': the two directions of this Bidirectional differ in "
                                   "kind, size or activations; convert them as two separate layers")
        merge = cfg.get("merge_mode", "concat") if e.config is not None else "concat"
        if merge not in ("concat", "sum", "mul", "ave", None):
            raise FormatError(f"{self.path}: Bidirectional layer '{name}' has merge_mode={merge!r}")
        layer = RNNLayer(
            name=name, cell=lf.cell, input_size=lf.input_size, hidden_size=lf.hidden_size,
            bidirectional=True, bias=lf.bias, semantics=_with(lf.semantics, merge_mode=merge),
            params=[[lf.params[0][0], lb.params[0][0]]], return_sequences=lf.return_sequences,
            source={**lf.source, "wrapper": "Bidirectional", "raw": [lf.source["raw"][0], lb.source["raw"][0]]},
        )
        self.ckpt.layers.append(layer)

    # -- RNN layers -------------------------------------------------------------------------
    def rnn(self, e: LayerEntry, name: str, kind: str) -> RNNLayer:
        cfg = e.config if isinstance(e.config, dict) else {}
        w = e.weights
        try:
            return self._rnn(e, name, kind, cfg, w)
        except (ValueError, IndexError) as exc:
            shapes = ", ".join(str(tuple(a.shape)) for a in w)
            raise FormatError(f"{self.path}: layer '{name}' ({kind}) has weights of unexpected shapes "
                              f"[{shapes}]: {exc}") from exc

    def _semantics(self, name: str, kind: str, cfg: dict) -> Semantics:
        if kind.startswith("CuDNN"):
            return Semantics(go_backwards=bool(cfg.get("go_backwards", False)))
        act = cfg.get("activation", "tanh")
        if kind == "SimpleRNN":
            gate = "sigmoid"
        elif "recurrent_activation" in cfg or "inner_activation" in cfg:
            gate = cfg.get("recurrent_activation", cfg.get("inner_activation"))
        elif self.gate_override:
            gate = self.gate_override
        else:
            gate = default_gate_activation(self.keras_version)
            if gate is None:
                what = (f"layer '{name}': this weights-only file (keras_version {self.keras_version!r}) does not "
                        "say whether its gates use sigmoid or hard_sigmoid; pass ")
                raise UnsupportedError(what + "gate_activation='sigmoid' or 'hard_sigmoid'",
                                       cli=what + "--gate-activation sigmoid|hard_sigmoid")
        if self.gate_override and kind != "SimpleRNN":
            gate = self.gate_override
        for what, a in (("activation", act), ("recurrent_activation", gate)):
            if not isinstance(a, str) or _KERAS_ACT.get(a) not in ACTIVATIONS:
                raise UnsupportedError(f"layer '{name}': {what}={a!r} is not supported by rnnconvert "
                                       f"(supported: {', '.join(sorted(k for k in _KERAS_ACT if k))})")
        if kind != "GRU":
            reset_after = True
        elif cfg:  # a config without the key is Keras 2.0/2.1: reset-before
            reset_after = bool(cfg.get("reset_after", False))
        else:  # weights-only: the writer's default (a bias, when present, overrides it in _rnn)
            reset_after = bool(default_reset_after(self.keras_version))
        gate, act = _KERAS_ACT[gate], _KERAS_ACT[act]
        if (self.keras_version or "").startswith("3"):  # Keras 3 legacy .h5: its own hard_sigmoid (x/6)
            gate, act = (("hard_sigmoid_k3" if a == "hard_sigmoid" else a) for a in (gate, act))
        return Semantics(gate_activation=gate, activation=act, reset_after=reset_after,
                         go_backwards=bool(cfg.get("go_backwards", False)))

    def _rnn(self, e: LayerEntry, name: str, kind: str, cfg: dict, w: list[np.ndarray]) -> RNNLayer:
        sem = self._semantics(name, kind, cfg)
        raw: dict[str, np.ndarray]
        keras1 = kind in ("LSTM", "GRU") and len(w) in (12, 9)  # Keras 1, consume_less='cpu'/'mem'
        if keras1:
            raw = _merge_keras1(kind, e.names, w)
            fam = "keras1"
        else:
            raw = {"kernel": w[0], "recurrent_kernel": w[1]}
            if len(w) > 2:
                raw["bias"] = w[2]
            fam = "keras_cudnn" if kind.startswith("CuDNN") else "keras"
        if kind == "GRU" and not cfg and "bias" not in raw and default_reset_after(self.keras_version) is None:
            raise UnsupportedError(
                f"layer '{name}': this weights-only GRU has no bias and keras_version {self.keras_version!r} does not "
                "tell whether reset_after is True or False; convert the full-model file instead")
        if kind == "GRU" and "bias" in raw and raw["bias"].ndim == 2:
            if "reset_after" in cfg and not cfg["reset_after"]:
                raise FormatError(f"layer '{name}': config says reset_after=False but the bias is {raw['bias'].shape}")
            sem = _with(sem, reset_after=True)
        if kind == "GRU" and "bias" in raw and raw["bias"].ndim == 1 and sem.reset_after:
            if not cfg.get("reset_after"):  # weights-only: the version default yields to the (3H,) bias
                sem = _with(sem, reset_after=False)
            else:
                raise FormatError(f"layer '{name}': config says reset_after=True but the bias is {raw['bias'].shape}")
        cell = {"LSTM": Cell.LSTM, "CuDNNLSTM": Cell.LSTM, "GRU": Cell.GRU, "CuDNNGRU": Cell.GRU}.get(kind)
        if cell is None:
            cell = Cell.RNN_RELU if sem.activation == "relu" else Cell.RNN_TANH
        k, r = raw["kernel"], raw["recurrent_kernel"]
        H = r.shape[0]
        G = cell.gates
        if k.ndim != 2 or r.shape != (H, G * H) or k.shape[1] != G * H:
            raise ValueError(f"kernel {k.shape} / recurrent_kernel {r.shape} do not fit {G} gates")
        I = k.shape[0]
        conv = gates.convention("keras_ra" if (cell is Cell.GRU and sem.reset_after and fam == "keras") else fam, cell)
        b = raw.get("bias")
        if b is not None:
            want = {"single": (G * H,), "double_rows": (2, G * H), "double_flat": (2 * G * H,)}[conv.bias]
            if b.shape != want:
                raise ValueError(f"bias {b.shape}, expected {want}")
        spec = _DirSpec(fam, cell, conv, H, I)
        if any(is_placeholder(a) for a in raw.values()):  # a lazy skeleton: the loader converts later
            bdt = k.dtype if b is None else b.dtype
            dp = DirectionParams(placeholder((G * H, I), k.dtype), placeholder((G * H, H), r.dtype),
                                 placeholder((G * H,), bdt),
                                 placeholder((G * H,), bdt if conv.bias != "single" else k.dtype))
            if keras1:
                loc = e.locations or []
                srcs: dict[str, Any] = {"kernel": tuple(loc[0::3]), "recurrent_kernel": tuple(loc[1::3]),
                                        "bias": tuple(loc[2::3])}
            else:
                srcs = dict(zip(("kernel", "recurrent_kernel", "bias"), e.locations or []))
            self.specs[id(dp)] = (spec, srcs)
        else:
            dp = convert_direction(spec, raw, f"{self.path}: layer '{name}'")
        if e.locations is not None and (fam != "keras1" or self.file is not None):
            # the file's tensors are re-read when needed (verification), never held beside the canonical copy
            if fam == "keras1":
                raw = LazyRaw(self.path, {key: tuple(v) for key, v in srcs.items()}, _read_concat)
            else:
                raw = LazyRaw(self.path, dict(zip(("kernel", "recurrent_kernel", "bias"), e.locations[:len(w)])),
                              self.lazy_load)
        return RNNLayer(
            name=name, cell=cell, input_size=I, hidden_size=H, bias=b is not None, semantics=sem,
            params=[[dp]],
            return_sequences=bool(cfg.get("return_sequences", True if not cfg else False)),
            source={"format": "keras_h5", "class_name": kind, "family": fam, "raw": [raw], "config": cfg or None},
        )

    def other(self, e: LayerEntry, name: str, cls: str | None) -> None:
        bases = [_base(n) for n in e.names]
        t = self.ckpt.tensors
        e = LayerEntry(e.name, e.names, [self.value(e, j) for j in range(len(e.weights))], e.config, e.class_name,
                   locations=e.locations)
        keras1_dense = (len(e.weights) == 2 and e.weights[0].ndim == 2 and e.weights[1].ndim == 1
                        and re.search(r"(^|_)W$", bases[0]) and re.search(r"(^|_)b$", bases[1]))  # dense_1_W, dense_1_b
        if (cls == "Dense" or (cls is None and (keras1_dense or (bases[:1] == ["kernel"] and len(e.weights) <= 2
                                                                 and e.weights[0].ndim == 2)))):
            t[f"{name}.weight"] = np.ascontiguousarray(e.weights[0].T)
            if len(e.weights) > 1:
                t[f"{name}.bias"] = e.weights[1]
            return
        if cls == "Embedding" or bases == ["embeddings"]:
            t[f"{name}.weight"] = e.weights[0]
            return
        for b, arr in zip(bases, e.weights):
            t[f"{name}.{b}"] = arr


def as_record(x: Any) -> dict[str, Any]:
    """A ``{'class_name', 'config'}`` layer record with wrong-typed parts (crafted configs) set to ``None``."""
    x = x if isinstance(x, dict) else {}
    cls = x.get("class_name")
    return {"class_name": cls if isinstance(cls, str) else None,
            "config": x.get("config") if isinstance(x.get("config"), dict) else None}


def _with(sem: Semantics, **kw) -> Semantics:
    from dataclasses import replace

    return replace(sem, **kw)


def _unreversed(sem: Semantics) -> Semantics:
    return _with(sem, go_backwards=False)


def _cudnn_bytes_to_rows(k: np.ndarray, G: int, H: int, width: int) -> np.ndarray:
    """Keras CuDNN kernel ``(width, G*H)``: each ``(width, H)`` column slice holds the row-major bytes of
    cuDNN's ``(H, width)`` matrix (tf_keras ``gru_lstm_utils.canonical_to_params`` with
    ``transpose_weights=False``; LAYOUTS.md §4.2-4.3). Returns the ``(G*H, width)`` stack in the
    file's slice order. A pure reinterpretation: bit-exact."""
    return np.concatenate([np.ascontiguousarray(k[:, j * H:(j + 1) * H]).reshape(H, width) for j in range(G)])


def _merge_keras1(kind: str, names: list[str], w: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Keras 1 per-gate tensors -> one kernel/recurrent/bias in the saved gate order (``keras1`` convention).

    LSTM saves ``W_i, U_i, b_i, W_c, U_c, b_c, W_f, U_f, b_f, W_o, U_o, b_o``; GRU saves
    ``W_z, U_z, b_z, W_r, U_r, b_r, W_h, U_h, b_h`` (keras 1.2.2 ``keras/layers/recurrent.py``)."""
    kinds = [_base(n)[-3] for n in names]  # 'W', 'U', 'b'
    if kinds != ["W", "U", "b"] * (len(w) // 3):
        raise ValueError(f"Keras 1 {kind} weights are not in W, U, b triples: {[_base(n) for n in names]}")
    return {"kernel": _cat(w[0::3]), "recurrent_kernel": _cat(w[1::3]), "bias": _cat(w[2::3])}


def _cat(arrs: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate`` along the last axis; placeholders give a placeholder of the joined shape."""
    if any(is_placeholder(a) for a in arrs):
        shape = arrs[0].shape[:-1] + (sum(a.shape[-1] for a in arrs),)
        return placeholder(shape, np.result_type(*arrs))
    return np.concatenate(arrs, axis=-1)


# --------------------------------------------------------------------------------------------
# Conversion of one direction's Keras tensors (arrays, or HDF5 datasets read one row block at a time)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _DirSpec:
    """How one direction's Keras tensors become canonical: family, cell, convention, ``H``, ``I``."""

    fam: str
    cell: Cell
    conv: gates.Convention
    hidden: int
    inp: int


#: Bytes of one row block read from a dataset (the stored rows are turned block by block).
BLOCK_BYTES = 2 << 20


#: Bytes added to each row of the HDF5 read buffer of :func:`_rows` when rows are long: a row stride that is a
#: multiple of 4 KiB (every ``G*H`` of a large model) maps the rows of one turned tile to the same L1 cache
#: set; 64 bytes more spread them (docs/performance.md, Session 3).
ROW_PAD_BYTES = 64
#: Rows at least this long get the padding (shorter rows: the buffer is exactly the rows read).
PAD_MIN_ROW_BYTES = 4096


def _plain_offset(src: Any) -> int | None:
    """The file offset of a large 2-D HDF5 dataset stored as one plain array (contiguous layout, no filters,
    native byte order, default file driver; ``H5Dget_offset``), else ``None``."""
    import h5py

    from ...io import filerows

    if not isinstance(src, h5py.Dataset) or src.ndim != 2 or src.chunks is not None or src.compression is not None:
        return None
    if not src.dtype.isnative or src.size * src.dtype.itemsize < filerows.DIRECT_MIN_BYTES:
        return None
    offset = src.id.get_offset()
    if offset is None or src.file.driver != "sec2":
        return None
    if offset + src.size * src.dtype.itemsize > Path(src.file.filename).stat().st_size:
        return None  # h5py then reports what is wrong
    return int(offset)


def _direct(src: Any) -> Any:
    """``src``, or for a plain dataset (:func:`_plain_offset`) a :class:`.filerows.FileRows` reading its bytes
    straight from the file (io/filerows.py: about half the kernel time of h5py's ``read_direct``)."""
    from ...io import filerows

    offset = _plain_offset(src)
    if offset is None:
        return src
    try:
        return filerows.FileRows(src.file.filename, offset, src.shape, src.dtype)
    except (OSError, ValueError):
        return src  # h5py then reports what is wrong


def _rows(src: Any, where: str):
    """Yield ``(r0, block)`` row blocks of a 2-D array or HDF5 dataset ``src``; datasets are read with
    ``read_direct`` into one reused buffer (the block is valid until the next one; a block's rows are
    :data:`ROW_PAD_BYTES` apart beyond their length when they are :data:`PAD_MIN_ROW_BYTES` or longer; the
    same for a :class:`.tf_bundle.RowSource`, which says so by ``PADDED_ROWS``). NaN/Inf refused, block by
    block."""
    import h5py

    n_rows, width = src.shape
    itemsize = src.dtype.itemsize
    step = max(16, (BLOCK_BYTES // max(1, width * itemsize)) // 16 * 16)
    src = _direct(src)
    padded = isinstance(src, h5py.Dataset) or getattr(src, "PADDED_ROWS", False)  # a destination may be strided
    pad = ROW_PAD_BYTES // itemsize if padded and width * itemsize >= PAD_MIN_ROW_BYTES else 0
    # zeros: the padding columns are never written, so the whole (contiguous) buffer rows can be checked
    buf = None if isinstance(src, np.ndarray) else np.zeros((min(step, n_rows), width + pad), src.dtype)
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        if buf is None:
            block = checked = src[r0:r1]
        else:
            block, checked = buf[:r1 - r0, :width], buf[:r1 - r0]
            try:
                src.read_direct(buf, np.s_[r0:r1], np.s_[0:r1 - r0, 0:width] if pad else np.s_[0:r1 - r0])
            except (OSError, EOFError) as exc:
                raise FormatError(f"{where}: cannot be read ({exc})") from exc
        if not all_finite(checked):
            raise FormatError(f"{where}: contains NaN or Inf values; the checkpoint is damaged")
        yield r0, block


def _kernel(src: Any, spec: _DirSpec, where: str) -> np.ndarray:
    """A Keras kernel ``(width, G*H)`` (array or dataset) as canonical ``(G*H, width)``, row block by row
    block (peak memory: the result plus one block). Plain families: the tiled turn of
    :func:`rnnconvert.core.gates.to_canonical_block`; CuDNN form: each gate slice's rows are a contiguous piece
    of cuDNN's row-major ``(H, width)`` matrix (see :func:`_cudnn_bytes_to_rows`), copied as they are.
    Bit-exact."""
    cell, conv, H = spec.cell, spec.conv, spec.hidden
    width = src.shape[0]
    out = np.empty((cell.gates * H, width), src.dtype)
    moves = gates.gate_moves(conv.gate_order, gates.CANONICAL[cell], H)
    for r0, block in _rows(src, where):
        n = block.shape[0]
        if spec.fam == "keras_cudnn":
            for cols, rows in moves:
                out[rows].reshape(-1)[r0 * H:(r0 + n) * H].reshape(n, H)[...] = block[:, cols]
        else:
            gates.to_canonical_block(block, conv, cell, out, r0)
    return out


def _vector(src: Any, where: str) -> np.ndarray:
    arr = np.asarray(src) if isinstance(src, np.ndarray) else src[()]
    if not all_finite(arr):
        raise FormatError(f"{where}: contains NaN or Inf values; the checkpoint is damaged")
    return arr


def convert_direction(spec: _DirSpec, raw: Mapping[str, Any], where: str) -> DirectionParams:
    """One direction's Keras tensors (``kernel``, ``recurrent_kernel``, optional ``bias``: arrays or HDF5
    datasets) -> canonical :class:`DirectionParams`; only permutations, turns and copies (bit-exact)."""
    cell, conv, H = spec.cell, spec.conv, spec.hidden
    G = cell.gates
    w_ih = _kernel(raw["kernel"], spec, f"{where} kernel")
    w_hh = _kernel(raw["recurrent_kernel"], spec, f"{where} recurrent_kernel")
    if raw.get("bias") is None:
        zeros = np.zeros(G * H, dtype=w_ih.dtype)
        return DirectionParams(w_ih, w_hh, zeros, zeros.copy())
    b = _vector(raw["bias"], f"{where} bias")
    if conv.bias == "single":
        return DirectionParams(w_ih, w_hh, gates.vec_to_canonical(b, conv, cell), np.zeros(G * H, dtype=w_ih.dtype))
    if conv.bias == "double_rows":
        return DirectionParams(w_ih, w_hh, gates.vec_to_canonical(b[0], conv, cell),
                               gates.vec_to_canonical(b[1], conv, cell))
    return DirectionParams(w_ih, w_hh, gates.vec_to_canonical(b[: G * H], conv, cell),  # double_flat
                           gates.vec_to_canonical(b[G * H:], conv, cell))


def _dialect_in_child(path: str) -> str:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "model_weights" in f or "layer_names" in f.attrs or "layer_names0" in f.attrs:
                return "keras2"
            return "keras3" if ("layers" in f or "vars" in f) else "other"
    except (OSError, RuntimeError, KeyError, ValueError):
        return "damaged"


_DIALECTS: dict[tuple[str, int, int], str] = {}


def hdf5_dialect(path: str | Path) -> str:
    """Which Keras writes this HDF5 file: ``'keras2'`` (``model_weights`` group or ``layer_names``
    attribute), ``'keras3'`` (top-level ``layers``/``vars`` groups), ``'other'``, or ``'damaged'``.

    Looked at in the isolated child of :mod:`rnnconvert.io.guard` (libhdf5 can loop forever on a damaged
    file even while opening it); cached per path, size and modification time, so that format detection
    forks once per file. A file the child cannot finish with is ``'damaged:<reason>'``.
    """
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIALECTS:
        try:
            _DIALECTS[key] = guard.isolated(_dialect_in_child, (str(path),), path, "HDF5")
        except FormatError as exc:
            _DIALECTS[key] = f"damaged:{exc}"
    return _DIALECTS[key]


def sniff(head: bytes, path: Path | None = None) -> bool:
    """True for an HDF5 file of Keras 1/2 (see :func:`hdf5_dialect`); a damaged HDF5 file is claimed too
    (``read`` then reports why). Keras 3 ``.weights.h5`` files are left to ``keras3``."""
    if not head.startswith(HDF5_MAGIC):
        return False
    if path is None:
        return True
    d = hdf5_dialect(path)
    return d == "keras2" or d.startswith("damaged")


#: The reader can return a lazy checkpoint (streaming conversion, :func:`read` with ``lazy=True``).
LAZY = True


def read(path: str | Path, *, gate_activation: str | None = None, lazy: bool = False, **_: Any) -> Checkpoint:
    """Read a Keras 1/2 HDF5 file into a :class:`~rnnconvert.core.model.Checkpoint`.

    Args:
        path: the ``.h5``/``.hdf5`` file (full model or weights only).
        gate_activation: override the LSTM/GRU gate activation (``'sigmoid'`` or ``'hard_sigmoid'``)
            when a weights-only file cannot tell.
        lazy: return the structure only (layers, semantics, ``source`` provenance with the
            :class:`LazyRaw` tensor maps, Dense/Embedding tensors) with
            :func:`~rnnconvert.core.model.placeholder` parameters, and ``ckpt.loader(i, 0)`` reading layer
            ``i``'s datasets (both directions of a Bidirectional: one slab) when asked. ``False``: the same,
            every slab loaded before returning (one code path).

    Returns:
        the recurrent layers in file order (canonical form: gate order i,f,g,o / r,z,n, ``W (G*H, in)``,
        dtype as stored) and other layers' tensors (Dense/Embedding in PyTorch naming).

    Raises:
        FormatError: not HDF5, not a Keras file, links outside the file, damaged tensors, NaN/Inf,
            libhdf5 looping past the deadline or crashing (see :mod:`rnnconvert.io.guard`).
        UnsupportedError: an activation or wrapper rnnconvert cannot represent.

    Isolation (:mod:`rnnconvert.io.guard`): an eager read of a file up to :data:`FULL_ISOLATION_MAX` runs
    wholly in the forked child. Otherwise (a large file, or ``lazy=True``) the child first walks every
    object header, attribute and chunk index (:func:`probe_path`: where libhdf5's loops live), and this
    process then reads the metadata again and the data (the loader: contiguous extents the probe has seen
    described, or chunks whose index it has walked).
    """
    d = hdf5_dialect(path) if Path(path).exists() else ""
    if d.startswith("damaged:"):
        raise FormatError(d[len("damaged:"):])
    if d == "other":  # not Keras: the owner's own dataset names (rnnconvert.core.names, docs/foreign-names.md)
        from ...core import names
        from ..storage.hdf5_plain import read_tensors

        return names.fallback(read_tensors(path), str(path), "keras_h5", _)
    if not lazy and Path(path).stat().st_size <= FULL_ISOLATION_MAX:
        return guard.isolated(_read_path, (str(path), gate_activation, False), path, "HDF5")
    # A large file would travel back through a pipe (a second copy of every weight), and a lazy
    # checkpoint's loader runs here: the child probes, this process reads.
    guard.isolated(probe_path, (str(path),), path, "HDF5")
    return _read_path(str(path), gate_activation, lazy)


#: Files up to this size are read wholly in the isolated child (see :mod:`rnnconvert.io.guard`).
FULL_ISOLATION_MAX = 64 << 20


def probe_path(path: str) -> None:
    """Open ``path`` and touch every group, dataset header, attribute and chunk index (runs in the
    isolated child)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            check_links(f)
            for g in (f, f.get("model_weights")):  # name lists bounded here, within the deadline
                if isinstance(g, h5py.Group):
                    attr_list(g, "layer_names")

            def touch(_name, obj):
                for key in obj.attrs:
                    obj.attrs[key]
                if isinstance(obj, h5py.Dataset):
                    obj.shape, obj.dtype, obj.chunks  # noqa: B018
                    if obj.chunks is not None and hasattr(obj.id, "get_num_chunks"):
                        obj.id.get_num_chunks()  # walks the chunk B-tree the data reads will use

            f.visititems(touch)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FormatError(f"{path}: damaged HDF5 file ({first})") from exc


def _damaged(path: str, exc: Exception) -> FormatError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return FormatError(f"{path}: damaged HDF5 file ({first})")


def _read_path(path: str, gate_activation: str | None, lazy: bool = False) -> Checkpoint:
    """The skeleton of ``path`` and its loader (:func:`read`); materialized unless ``lazy`` (an eager read
    of a small file runs all of this in the isolated child of :func:`rnnconvert.io.guard.isolated`)."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise FormatError(f"{path}: not a readable HDF5 file ({exc})") from exc
    with f:
        try:
            rd = _read_file(f, path, gate_activation)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:  # h5py on damaged B-trees, heaps
            raise _damaged(path, exc) from exc
    ckpt = replace(rd.ckpt, source=H5Slabs(path, rd.layer_specs()))
    return ckpt if lazy else ckpt.materialize()


class H5Slabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a Keras HDF5 file: ``read(i, 0)`` = layer ``i``'s
    directions read from ``path`` (one ``h5py.File`` open per slab, datasets read in row blocks straight
    into the canonical arrays; nothing kept afterwards, so ``release``/``release_array`` do nothing)."""

    def __init__(self, path: str, specs: list[list[tuple[_DirSpec, dict[str, Any]]]]) -> None:
        self.path, self.specs = path, specs

    def release(self, i: int, k: int) -> None:
        pass

    def release_array(self, a: np.ndarray) -> None:
        pass

    def read(self, i: int, k: int) -> list[DirectionParams]:
        import h5py

        path, specs = self.path, self.specs
        if k != 0:
            raise IndexError(f"a Keras layer holds one stacked layer, not {k + 1}")
        try:
            with h5py.File(path, "r") as f:
                out = []
                for spec, srcs in specs[i]:
                    raw: dict[str, Any] = {}
                    for key, loc in srcs.items():
                        if isinstance(loc, tuple):  # Keras 1 per-gate tensors (small by nature): read, joined
                            raw[key] = np.concatenate([read_dataset(f[x], f"{path}: {x}") for x in loc], axis=-1)
                        else:
                            _dataset_meta(f[loc], f"{path}: {loc}")
                            raw[key] = f[loc]
                    out.append(convert_direction(spec, raw, f"{path}: {srcs.get('kernel')!s}".rsplit("/", 1)[0]))
                return out
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise _damaged(path, exc) from exc


def _read_file(f, path: str, gate_activation: str | None) -> "Interpreter":
    """The body of :func:`read` on an open ``h5py.File``: metadata (dataset shapes and dtypes, as
    placeholders), configs and the non-recurrent tensors; h5py errors are translated by the caller."""
    check_links(f)
    if "model_weights" in f:
        g = f["model_weights"]
        cfg_s = attr_str(f, "model_config")
        try:
            config = json.loads(cfg_s) if cfg_s else None
        except json.JSONDecodeError as exc:
            raise FormatError(f"{path}: model_config is not valid JSON ({exc})") from exc
    elif "layer_names" in f.attrs or "layer_names0" in f.attrs:
        g, config = f, None
    else:
        raise FormatError(f"{path}: HDF5 file without Keras 'model_weights' group or 'layer_names' "
                          "attribute; is it a Keras 3 .weights.h5 or another HDF5 file?")
    keras_version = attr_str(g, "keras_version") or attr_str(f, "keras_version")
    rd = Interpreter(path, keras_version, gate_activation)
    rd.file = f
    if isinstance(config, dict) and config.get("class_name") in ("Sequential", "Model", "Functional"):
        cfgs = _index_configs(config)
    else:
        cfgs = {}
    for lname in attr_list(g, "layer_names"):
        if lname not in g:
            raise FormatError(f"{path}: layer '{lname}' is listed in layer_names but has no group")
        grp = g[lname]
        wnames = attr_list(grp, "weight_names")
        if not wnames:
            continue
        weights, locations = [], []
        for wn in wnames:
            if wn not in grp:
                raise FormatError(f"{path}: layer '{lname}' lists weight '{wn}' that is not in the file")
            weights.append(_dataset_meta(grp[wn], f"{path}: {lname}/{wn}"))
            locations.append(grp[wn].name)
        rec = cfgs.get(lname, {})
        rd.entry(LayerEntry(lname, wnames, weights, rec.get("config"), rec.get("class_name"), locations=locations), "")
    rd.file = None
    if not rd.ckpt.layers:
        raise FormatError(f"{path}: no recurrent layer (LSTM, GRU, SimpleRNN, CuDNNLSTM, CuDNNGRU) found")
    return rd
