"""The Keras interpreter: Keras layer records (weight names, shapes, layer configs) -> canonical layers.

Shared by every container of Keras tensors: Keras 1/2 HDF5 (:mod:`rnnconvert.formats.keras.h5_read`), the Keras 3 weights
store (:mod:`rnnconvert.formats.keras.keras3`), TF2 object checkpoints (:mod:`rnnconvert.formats.tf.checkpoint_read`) and frozen
graphs (:mod:`rnnconvert.formats.tf.graph_read`). A container hands each layer over as a
:class:`LayerEntry` (names, arrays or :func:`~rnnconvert.core.model.placeholder` s, config) and, when its
tensors stay in the file, reads them through the :class:`TensorSource` given to :class:`Interpreter`.

What is interpreted here (``docs/LAYOUTS.md`` §§1-4; tf_keras ``saving/legacy/hdf5_format.py``):

* the layer kind from the class name, or for weights-only files from the weight names and shapes
  (Keras 1 12-tensor LSTM saved i, c, f, o and 9-tensor GRU z, r, h; 3-tensor ``<layer>_W``/``_U``/``_b``;
  CuDNN forms from the bias length);
* nested ``Sequential``/``Model``, ``Bidirectional`` (forward half of the weights first),
  ``TimeDistributed``, ``keras.layers.RNN`` around ``LSTMCell``/``GRUCell``/``SimpleRNNCell``;
* semantics from the layer config, or the defaults of the ``keras_version`` that wrote a weights-only
  file (``recurrent_activation='hard_sigmoid'`` through Keras 2.2.5 and in TF1 tf.keras; ``sigmoid`` from
  standalone 2.3.0 and in TF2 tf.keras); CuDNN layers are always sigmoid/tanh;
* one direction's tensors turned into canonical form (:func:`convert_direction`: gate order i,f,g,o /
  r,z,n, ``W (G*H, in)``, bit-exact), from arrays or from row sources read one row block at a time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..core import gates
from ..errors import FormatError, UnsupportedError
from ..core.finite import all_finite
from ..core.model import (
    ACTIVATIONS,
    Cell,
    Checkpoint,
    DirectionParams,
    RNNLayer,
    Semantics,
    is_placeholder,
    placeholder,
)
from . import keras_names as naming
from .keras_names import BIAS, KERNEL, RECURRENT_KERNEL, WEIGHTS, base_name as _base
from ..speed import transpose

_KERAS_ACT = {"hard_sigmoid": "hard_sigmoid", "sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu",
              "linear": "linear", "softsign": "softsign", None: "linear"}


class TensorSource(Protocol):
    """Where the stored tensors of a :class:`LayerEntry` with ``locations`` are read from (the container:
    an open HDF5 file, :class:`rnnconvert.formats.keras.h5_access.Hdf5Tensors`; a TF2 checkpoint, ``tf.tensors.BundleTensors``)."""

    def value(self, location: str) -> np.ndarray:
        """The tensor at ``location``, read now (a non-recurrent tensor, kept in ``ckpt.tensors``: NaN/Inf
        is refused there by :func:`rnnconvert.api.check_finite`)."""
        ...

    def stored(self, locations: Mapping[str, Any]) -> Mapping[str, np.ndarray] | None:
        """A direction's tensors as stored (``kernel``, ``recurrent_kernel``, ``bias`` -> location; a tuple of
        locations: Keras 1 per-gate tensors joined along the last axis), re-read on each access (kept in
        ``layer.source['raw']`` for verification); ``None``: the container cannot re-read them (the
        interpreter then keeps the tensors it was given)."""
        ...


class StoredTensors(Protocol):
    """A direction's tensors as stored in a container (``kernel``, ``recurrent_kernel``, ``bias`` -> location),
    re-read from the file on each access: a ``Mapping`` that is a plain record of the file and the locations, no
    reading function stored (the HDF5 reader's ``h5_access.LazyRaw``, the TF2 checkpoint reader's
    ``tf.tensors.BundleRaw``); ``read(key, out)`` reads into ``out`` when it has the stored shape and dtype."""

    def __getitem__(self, key: str) -> np.ndarray: ...

    def read(self, key: str, out: np.ndarray | None = None) -> np.ndarray: ...


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
    locations: list[str] | None = None  # where each weight is stored, for the TensorSource


def index_configs(config: dict | None) -> dict[str, dict]:
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
    """Turns :class:`LayerEntry` records (:meth:`entry`, in file order) into ``self.ckpt``'s canonical layers
    and tensors. ``tensors``: where entries with ``locations`` are read from (``None``: entries hold arrays)."""

    def __init__(self, path: str, keras_version: str | None, gate_activation: str | None,
                 tensors: TensorSource | None = None):
        self.path = path
        self.keras_version = keras_version
        self.gate_override = gate_activation
        self.tensors = tensors
        self.ckpt = Checkpoint(format="keras_h5", meta={"path": path, "keras_version": keras_version})
        # by position, parallel to self.ckpt.layers: specs[i][d] = how direction d of layer i is loaded
        # (None: read from arrays, nothing to load)
        self.specs: list[list[tuple[DirSpec, dict[str, Any]] | None]] = []

    def value(self, e: LayerEntry, j: int) -> np.ndarray:
        """Weight ``j`` of ``e`` as an array (read now when the entry holds placeholders)."""
        w = e.weights[j]
        if is_placeholder(w) and e.locations is not None and self.tensors is not None:
            return self.tensors.value(e.locations[j])
        return w

    def layer_specs(self) -> list[list[tuple["DirSpec", dict[str, Any]]]]:
        """Per recurrent layer, per direction: the spec and sources its placeholders are loaded from."""
        if len(self.specs) != len(self.ckpt.layers) or any(h is None for dirs in self.specs for h in dirs):
            raise KeyError("a recurrent layer was read from arrays, not placeholders: nothing to load lazily")
        return self.specs

    def _add(self, layer: RNNLayer, specs: list) -> None:
        """Append ``layer`` to the checkpoint and, at the same position, its directions' specs."""
        self.ckpt.layers.append(layer)
        self.specs.append(specs)

    # -- dispatch ---------------------------------------------------------------------------
    def entry(self, e: LayerEntry, prefix: str) -> None:
        name = f"{prefix}{e.name}"
        cls = e.class_name
        cfg = e.config if isinstance(e.config, dict) else {}
        if cls in naming.CONTAINERS or (cls is None and self._looks_nested(e)):
            self.nested(e, name)
            return
        if cls == naming.BIDIRECTIONAL or (cls is None and self._looks_bidirectional(e)):
            self.bidirectional(e, name)
            return
        if cls == naming.TIME_DISTRIBUTED:
            inner = as_record(cfg.get("layer"))
            self.entry(LayerEntry(e.name, e.names, e.weights, inner["config"], inner["class_name"],
                              locations=e.locations), prefix)
            return
        if cls == naming.RNN_WRAPPER:  # keras.layers.RNN(cell): the cell's config plus the wrapper's direction/outputs
            cell = cfg.get("cell") or {}
            kind = naming.CELL_CLASSES.get(cell.get("class_name"))
            if kind is None:
                raise UnsupportedError(f"layer '{name}': RNN wrapper around {cell.get('class_name')!r} is not supported "
                                       f"(supported cells: {', '.join(naming.CELL_CLASSES)})")
            merged = {**(cell.get("config") or {}),
                      **{k: cfg[k] for k in ("return_sequences", "go_backwards") if k in cfg}}
            layer, spec = self.rnn(LayerEntry(e.name, e.names, e.weights, merged, kind, locations=e.locations),
                                   name, kind)
            self._add(layer, [spec])
            return
        kind = self._rnn_kind(e, cls)
        if kind:
            layer, spec = self.rnn(e, name, kind)
            self._add(layer, [spec])
            return
        self.other(e, name, cls)

    @staticmethod
    def _looks_nested(e: LayerEntry) -> bool:
        firsts = {n.split("/")[0] for n in e.names if "/" in n}
        return len(firsts) > 1 and not Interpreter._looks_bidirectional(e)

    @staticmethod
    def _looks_bidirectional(e: LayerEntry) -> bool:
        return (any(naming.FORWARD_PREFIX in n for n in e.names)
                and any(naming.BACKWARD_PREFIX in n for n in e.names))

    def _rnn_kind(self, e: LayerEntry, cls: str | None) -> str | None:
        if cls is not None:
            cls = naming.CLASS_ALIASES.get(cls, cls)
            return cls if cls in naming.RNN_CLASSES else None
        bases = [_base(n) for n in e.names]
        n = len(e.weights)
        kind1 = naming.keras1_kind(bases)
        if kind1 and n == len(naming.KERAS1_PARTS) * len(naming.KERAS1_GATES[kind1]):
            return kind1
        # Keras 2 names the recurrent matrix 'recurrent_kernel'; Keras 1 (3-tensor SimpleRNN and LSTM
        # consume_less='gpu', LAYOUTS.md §1.1, §1.3) names its tensors '<layer>_W', '<layer>_U', '<layer>_b'.
        if n not in (2, 3) or not (RECURRENT_KERNEL in bases or naming.KERAS1_RECURRENT.search(bases[1])):
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
        inner_cfgs = index_configs(e.config and {"config": e.config})
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
        (lf, sf), (lb, sb) = self.rnn(fw, name, kind_f), self.rnn(bw, name, kind_b)
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
            source={**lf.source, "wrapper": naming.BIDIRECTIONAL, "raw": [lf.source["raw"][0], lb.source["raw"][0]]},
        )
        self._add(layer, [sf, sb])

    # -- RNN layers -------------------------------------------------------------------------
    def rnn(self, e: LayerEntry, name: str, kind: str) -> tuple[RNNLayer, tuple[DirSpec, dict[str, Any]] | None]:
        """One direction of a recurrent layer, and how its placeholder parameters are loaded (``(spec,
        locations)`` for :func:`convert_direction`; ``None`` when they were converted from arrays now)."""
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

    def _rnn(self, e: LayerEntry, name: str, kind: str, cfg: dict,
             w: list[np.ndarray]) -> tuple[RNNLayer, tuple[DirSpec, dict[str, Any]] | None]:
        sem = self._semantics(name, kind, cfg)
        raw: dict[str, np.ndarray]
        keras1 = kind in ("LSTM", "GRU") and len(w) in (12, 9)  # Keras 1, consume_less='cpu'/'mem'
        if keras1:
            raw = _merge_keras1(kind, e.names, w)
            fam = "keras1"
        else:
            raw = {KERNEL: w[0], RECURRENT_KERNEL: w[1]}
            if len(w) > 2:
                raw[BIAS] = w[2]
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
        conv = naming.convention(cell, sem.reset_after, fam)
        b = raw.get("bias")
        if b is not None:
            want = {"single": (G * H,), "double_rows": (2, G * H), "double_flat": (2 * G * H,)}[conv.bias]
            if b.shape != want:
                raise ValueError(f"bias {b.shape}, expected {want}")
        spec = DirSpec(fam, cell, conv, H, I)
        if any(is_placeholder(a) for a in raw.values()):  # a lazy skeleton: the slab source converts later
            bdt = k.dtype if b is None else b.dtype
            dp = DirectionParams(placeholder((G * H, I), k.dtype), placeholder((G * H, H), r.dtype),
                                 placeholder((G * H,), bdt),
                                 placeholder((G * H,), bdt if conv.bias != "single" else k.dtype))
            if keras1:
                loc = e.locations or []
                srcs: dict[str, Any] = {key: tuple(loc[j::3]) for j, key in enumerate(WEIGHTS)}
            else:
                srcs = dict(zip(WEIGHTS, e.locations or []))
            how = (spec, srcs)
        else:
            dp = convert_direction(spec, raw, f"{self.path}: layer '{name}'")
            how = None
        if e.locations is not None and self.tensors is not None:
            # the file's tensors are re-read when needed (verification), never held beside the canonical copy
            if keras1:
                loc = e.locations
                stored = self.tensors.stored({key: tuple(loc[j::3]) for j, key in enumerate(WEIGHTS)})
            else:
                stored = self.tensors.stored(dict(zip(WEIGHTS, e.locations[:len(w)])))
            if stored is not None:
                raw = stored
        return RNNLayer(
            name=name, cell=cell, input_size=I, hidden_size=H, bias=b is not None, semantics=sem,
            params=[[dp]],
            return_sequences=bool(cfg.get("return_sequences", True if not cfg else False)),
            source={"format": "keras_h5", "class_name": kind, "family": fam, "raw": [raw], "config": cfg or None},
        ), how

    def other(self, e: LayerEntry, name: str, cls: str | None) -> None:
        bases = [_base(n) for n in e.names]
        t = self.ckpt.tensors
        e = LayerEntry(e.name, e.names, [self.value(e, j) for j in range(len(e.weights))], e.config, e.class_name,
                   locations=e.locations)
        keras1_dense = (len(e.weights) == 2 and e.weights[0].ndim == 2 and e.weights[1].ndim == 1
                        and naming.KERAS1_DENSE[0].search(bases[0])
                        and naming.KERAS1_DENSE[1].search(bases[1]))  # dense_1_W, dense_1_b
        if (cls == "Dense" or (cls is None and (keras1_dense or (bases[:1] == [naming.DENSE_WEIGHTS[0]] and len(e.weights) <= 2
                                                                 and e.weights[0].ndim == 2)))):
            t[f"{name}.weight"] = np.ascontiguousarray(e.weights[0].T)
            if len(e.weights) > 1:
                t[f"{name}.bias"] = e.weights[1]
            return
        if cls == "Embedding" or bases == list(naming.EMBEDDING_WEIGHTS):
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
    kinds = [naming.keras1_part(_base(n)) for n in names]  # 'W', 'U', 'b'
    if kinds != list(naming.KERAS1_PARTS) * (len(w) // 3):
        raise ValueError(f"Keras 1 {kind} weights are not in W, U, b triples: {[_base(n) for n in names]}")
    return {key: _cat(w[j::3]) for j, key in enumerate(WEIGHTS)}


def _cat(arrs: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate`` along the last axis; placeholders give a placeholder of the joined shape."""
    if any(is_placeholder(a) for a in arrs):
        shape = arrs[0].shape[:-1] + (sum(a.shape[-1] for a in arrs),)
        return placeholder(shape, np.result_type(*arrs))
    return np.concatenate(arrs, axis=-1)


# --------------------------------------------------------------------------------------------
# Conversion of one direction's Keras tensors (arrays, or row sources read one row block at a time)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DirSpec:
    """How one direction's Keras tensors become canonical: family, cell, convention, ``H``, ``I``."""

    fam: str
    cell: Cell
    conv: gates.Convention
    hidden: int
    inp: int


#: Bytes of one row block read from a dataset (the stored rows are turned block by block). 8 MiB, not 2: each
#: block costs a dozen calls that release and retake the GIL (the read, the NaN test, the turn), and beside a
#: thread that holds the GIL (verification's own Python, the target framework's import) each retake waits up
#: to the switch interval; with 2 MiB blocks a thread spinning in Python stretched one 384 MB slab's read from
#: 0.6 s to 18 s, with 8 MiB (and 16 MiB NaN-test pieces) to 3.8 s; a 3.1 GB ``h5 -> pt`` conversion,
#: ``--no-verify``, took 4.6-5.0 s against 5.2-5.9 s (docs/performance.md, session 13).
BLOCK_BYTES = 8 << 20


#: Bytes added to each row of the HDF5 read buffer of :func:`_rows` when rows are long: a row stride that is a
#: multiple of 4 KiB (every ``G*H`` of a large model) maps the rows of one turned tile to the same L1 cache
#: set; 64 bytes more spread them (docs/performance.md, Session 3).
ROW_PAD_BYTES = 64
#: Rows at least this long get the padding (shorter rows: the buffer is exactly the rows read).
PAD_MIN_ROW_BYTES = 4096



def _rows(src: Any, where: str):
    """Yield ``(r0, block)`` row blocks of a 2-D array or row source ``src`` (an HDF5 dataset, a
    :class:`rnnconvert.speed.filerows.FileRows`, a :class:`rnnconvert.formats.tf.bundle_read.RowSource`: anything with ``shape``, ``dtype`` and
    h5py's ``read_direct(out, rows, dest)``); a row source is read into one reused buffer (the block is
    valid until the next one; a block's rows are :data:`ROW_PAD_BYTES` apart beyond their length when
    they are :data:`PAD_MIN_ROW_BYTES` or longer: every row source takes a strided destination). NaN/Inf
    refused, block by block."""
    n_rows, width = src.shape
    itemsize = src.dtype.itemsize
    step = max(16, (BLOCK_BYTES // max(1, width * itemsize)) // 16 * 16)
    padded = not isinstance(src, np.ndarray)  # a row source: its destination may be strided
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


def _kernel(src: Any, spec: DirSpec, where: str, take=np.empty) -> np.ndarray:
    """A Keras kernel ``(width, G*H)`` (array or dataset) as canonical ``(G*H, width)``, row block by row
    block (peak memory: the result plus one block). Plain families: the tiled turn of
    :func:`rnnconvert.speed.transpose.to_canonical_block`; CuDNN form: each gate slice's rows are a contiguous piece
    of cuDNN's row-major ``(H, width)`` matrix (see :func:`_cudnn_bytes_to_rows`), copied as they are.
    Bit-exact. ``take(shape, dtype)`` gives the result's array (default ``np.empty``; a lazy reader's
    :class:`~rnnconvert.speed.pool.ArrayPool`), every element of which is written."""
    cell, conv, H = spec.cell, spec.conv, spec.hidden
    width = src.shape[0]
    out = take((cell.gates * H, width), src.dtype)
    moves = gates.gate_moves(conv.gate_order, gates.CANONICAL[cell], H)
    for r0, block in _rows(src, where):
        n = block.shape[0]
        if spec.fam == "keras_cudnn":
            for cols, rows in moves:
                out[rows].reshape(-1)[r0 * H:(r0 + n) * H].reshape(n, H)[...] = block[:, cols]
        else:
            transpose.to_canonical_block(block, conv, cell, out, r0)
    return out


def _vector(src: Any, where: str) -> np.ndarray:
    arr = np.asarray(src) if isinstance(src, np.ndarray) else src[()]
    if not all_finite(arr):
        raise FormatError(f"{where}: contains NaN or Inf values; the checkpoint is damaged")
    return arr


def convert_direction(spec: DirSpec, raw: Mapping[str, Any], where: str, take=np.empty) -> DirectionParams:
    """One direction's Keras tensors (``kernel``, ``recurrent_kernel``, optional ``bias``: arrays or HDF5
    datasets) -> canonical :class:`DirectionParams`; only permutations, turns and copies (bit-exact).
    ``take(shape, dtype)``: where the weight matrices go (:func:`_kernel`)."""
    cell, conv, H = spec.cell, spec.conv, spec.hidden
    G = cell.gates
    w_ih = _kernel(raw["kernel"], spec, f"{where} kernel", take)
    w_hh = _kernel(raw["recurrent_kernel"], spec, f"{where} recurrent_kernel", take)
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
