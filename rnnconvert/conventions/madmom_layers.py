"""Class-structured numpy networks (madmom's ``madmom.ml.nn``): per-gate objects, layer objects holding them,
bidirectional wrappers, read from an unpickled tree of inert records into canonical layers. Numpy only.

Source: ``madmom/ml/nn/layers.py`` (CPJKU/madmom, BSD-2-Clause, read at v0.16.1), confirmed by running madmom's
own numpy forward (``fixtures/gen_madmom.py``, ``tests/formats/pickle_files/test_madmom.py``: madmom computes the reference
outputs, torch and onnxruntime compute the converted files' outputs from our bytes). Per object (attributes as
pickled; weights ``(in, out)``, applied as ``x @ W``; biases ``(out,)``):

* ``Gate``: ``weights``, ``bias``, ``recurrent_weights``, ``peephole_weights`` (``(H,)`` or ``None``),
  ``activation_fn``; ``act(x W + b [+ c * p] + h U)``. ``Cell`` is a gate without peepholes, ``GRUCell``
  computes ``act(x W + b + r * (h U))`` (the reset gate multiplies ``h U``: reset-after, and no recurrent bias).
* ``LSTMLayer``: ``input_gate``, ``forget_gate``, ``cell``, ``output_gate``, ``activation_fn``, ``init``,
  ``cell_init``. ``i`` and ``f`` see the previous ``c`` through their peepholes, ``o`` the new one (TF1's
  ``LSTMCell(use_peepholes=True)``, the canonical ``peep``); ``c' = g i + c f``, ``h' = act(c') o``.
* ``GRULayer``: ``reset_gate``, ``update_gate``, ``cell``, ``init`` (``hid_init`` in models saved before 0.16);
  ``h' = u n + (1 - u) h``: madmom's ``u`` weighs the *candidate* where the canonical ``z`` weighs the old state,
  so ``z = 1 - u = sigmoid(-(x W_u + b_u + h U_u))``: the z block of ``W_ih``, ``W_hh`` and ``b_ih`` is stored
  negated (exact; as for Haiku's GRU in :mod:`.haiku_params`), ``b_hh = 0``, ``reset_after=True``.
* ``RecurrentLayer``: ``weights``, ``bias``, ``recurrent_weights``, ``activation_fn``, ``init``;
  ``h' = act(x W + b + h U)`` (tanh and relu are canonical cells; other activations are refused).
* ``BidirectionalLayer``: ``fwd_layer``, ``bwd_layer``; the backward layer runs on the reversed sequence and its
  output is reversed back, then ``hstack((fwd, bwd))``: the canonical bidirectional layer.
* ``FeedForwardLayer``: ``weights``, ``bias``, ``activation_fn``: carried as ``<name>.weight`` ``(out, in)`` and
  ``<name>.bias`` (PyTorch's ``nn.Linear``).
* activations are references to ``madmom.ml.nn.activations.<name>`` (never imported: their name is read).

Learned initial states (``init``, ``cell_init``; non-zero in madmom's own GRU downbeat models) are kept: carried
as ``<layer>_state.h0`` / ``<layer>_state.c0`` ``(directions, H)`` float tensors and named in the notes, since no
written layer format holds an initial state; zero ones are dropped (they are the default).

The structure is recognised by its attributes; the equations are madmom's. A class outside ``madmom`` with the
same structure is read by them too, with a note naming its class.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ..errors import FormatError

LSTM_PARTS = ("input_gate", "forget_gate", "cell", "output_gate")
GRU_PARTS = ("reset_gate", "update_gate", "cell")
#: canonical activation names of madmom's activation functions
ACTIVATIONS = {"tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "linear": "linear"}


def _state(o: Any, record: type) -> dict | None:
    """The attribute dict of an inert record (:meth:`rnnconvert.formats.pickle.pickle_read.Record.attributes`),
    else ``None``."""
    return o.attributes() if isinstance(o, record) else None


def kind(o: Any, record: type) -> str | None:
    """``lstm``, ``gru``, ``rnn``, ``bidirectional``, ``dense`` or ``None`` for anything else, by attributes."""
    st = _state(o, record)
    if st is None:
        return None
    if all(k in st for k in LSTM_PARTS):
        return "lstm"
    if all(k in st for k in GRU_PARTS):
        return "gru"
    if "fwd_layer" in st and "bwd_layer" in st:
        return "bidirectional"
    if all(k in st for k in ("weights", "bias", "recurrent_weights")):
        return "rnn"
    if all(k in st for k in ("weights", "bias", "activation_fn")):
        return "dense"
    return None


class _Reader:
    def __init__(self, where: str, record: type, array: Callable[[Any], np.ndarray | None]) -> None:
        self.where, self.record, self.array = where, record, array
        self.classes: set[str] = set()

    def fail(self, name: str, what: str) -> FormatError:
        return FormatError(f"{self.where}: layer '{name}': {what}")

    def arr(self, st: dict, key: str, name: str, shape: tuple | None = None, optional: bool = False) -> np.ndarray | None:
        v = st.get(key)
        a = None if v is None else self.array(v)
        if a is None:
            if optional:
                return None
            raise self.fail(name, f"'{key}' is not a numpy array")
        if a.dtype.kind != "f":
            raise self.fail(name, f"'{key}' has dtype {a.dtype}, not floating point")
        if key == "bias":
            a = a.reshape(-1)  # madmom flattens its biases
        if shape is not None and a.shape != shape:
            raise self.fail(name, f"'{key}' has shape {a.shape}, expected {shape}")
        return a

    def act(self, st: dict, name: str, part: str) -> str:
        fn = st.get("activation_fn")
        path = getattr(fn, "cls_path", None)
        short = path.rsplit(".", 1)[-1] if isinstance(path, str) else None
        if isinstance(path, str):
            self.classes.add(path)
        if short not in ACTIVATIONS:
            raise self.fail(name, f"{part} activation {path or type(fn).__name__} is not one rnnconvert computes "
                                  f"({', '.join(ACTIVATIONS)}); refused")
        return ACTIVATIONS[short]

    def gate(self, o: Any, name: str, part: str, I: int | None, H: int | None) -> tuple[dict, str, int, int]:
        st = _state(o, self.record)
        if st is None:
            raise self.fail(name, f"'{part}' is no gate object")
        self.classes.add(o.cls_path)
        w = self.arr(st, "weights", name)
        if w.ndim != 2:
            raise self.fail(name, f"{part} weights of shape {w.shape}")
        I = w.shape[0] if I is None else I
        H = w.shape[1] if H is None else H
        if w.shape != (I, H):
            raise self.fail(name, f"'weights' has shape {w.shape}, expected {(I, H)}")
        arrays = {"W": w, "b": self.arr(st, "bias", name, (H,)),
                  "U": self.arr(st, "recurrent_weights", name, (H, H)),
                  "p": self.arr(st, "peephole_weights", name, (H,), optional=True)}
        return arrays, self.act(st, name, part), I, H

    def init(self, st: dict, key: str, name: str, H: int) -> np.ndarray | None:
        a = self.arr(st, key, name, optional=True)
        if a is None:
            return None
        a = a.reshape(-1)
        if a.shape != (H,):
            raise self.fail(name, f"'{key}' has shape {a.shape}, expected ({H},)")
        return a if a.any() else None

    def direction(self, o: Any, name: str) -> tuple[Cell, Semantics, DirectionParams, dict[str, np.ndarray], int, int]:
        k = kind(o, self.record)
        st = _state(o, self.record)
        self.classes.add(getattr(o, "cls_path", "?"))
        if k == "lstm":
            parts, acts, I, H = {}, {}, None, None
            for part in LSTM_PARTS:
                parts[part], acts[part], I, H = self.gate(st[part], name, part, I, H)
            if parts["cell"]["p"] is not None:
                raise self.fail(name, "peephole weights on the cell input (no LSTM formulation has them); refused")
            layer_act = self.act(st, name, "output")
            gate_acts = {acts["input_gate"], acts["forget_gate"], acts["output_gate"]}
            if len(gate_acts) != 1 or acts["cell"] != layer_act:
                raise self.fail(name, f"gate activations {sorted(gate_acts)} and cell/output activations "
                                      f"{acts['cell']}/{layer_act} differ; rnnconvert's LSTM has one of each; refused")
            order = [parts[p] for p in LSTM_PARTS]  # i f g o: the canonical order
            peeps = [parts[p]["p"] for p in ("input_gate", "forget_gate", "output_gate")]
            if any(p is None for p in peeps) and any(p is not None for p in peeps):
                raise self.fail(name, "peepholes on some gates only; refused")
            peep = None if peeps[0] is None else np.stack(peeps)
            d = DirectionParams(w_ih=np.concatenate([g["W"].T for g in order]),
                                w_hh=np.concatenate([g["U"].T for g in order]),
                                b_ih=np.concatenate([g["b"] for g in order]),
                                b_hh=np.zeros(4 * H, order[0]["b"].dtype), peep=peep)
            inits = {"h0": self.init(st, "init", name, H), "c0": self.init(st, "cell_init", name, H)}
            sem = Semantics(gate_activation=gate_acts.pop(), activation=layer_act)
            return Cell.LSTM, sem, d, {k: v for k, v in inits.items() if v is not None}, I, H
        if k == "gru":
            parts, acts, I, H = {}, {}, None, None
            for part in GRU_PARTS:
                parts[part], acts[part], I, H = self.gate(st[part], name, part, I, H)
            if any(parts[p]["p"] is not None for p in GRU_PARTS):
                raise self.fail(name, "peephole weights on a GRU gate; refused")
            if acts["reset_gate"] != acts["update_gate"]:
                raise self.fail(name, f"reset and update gate activations {acts['reset_gate']}/{acts['update_gate']} "
                                      "differ; refused")
            r, u, n = (parts[p] for p in GRU_PARTS)
            if acts["update_gate"] != "sigmoid":
                raise self.fail(name, f"update gate activation {acts['update_gate']}: madmom's u becomes the canonical "
                                      "z = 1 - u exactly only for sigmoid (sigmoid(-x) = 1 - sigmoid(x)); refused")
            d = DirectionParams(w_ih=np.concatenate([r["W"].T, -u["W"].T, n["W"].T]),
                                w_hh=np.concatenate([r["U"].T, -u["U"].T, n["U"].T]),
                                b_ih=np.concatenate([r["b"], -u["b"], n["b"]]),
                                b_hh=np.zeros(3 * H, r["b"].dtype))
            h0 = self.init(st, "init", name, H)
            if h0 is None:
                h0 = self.init(st, "hid_init", name, H)
            sem = Semantics(gate_activation="sigmoid", activation=acts["cell"], reset_after=True)
            return Cell.GRU, sem, d, ({"h0": h0} if h0 is not None else {}), I, H
        if k == "rnn":
            g, a, I, H = self.gate(o, name, "layer", None, None)
            if g["p"] is not None:
                raise self.fail(name, "peephole weights on a simple recurrent layer; refused")
            cell = {"tanh": Cell.RNN_TANH, "relu": Cell.RNN_RELU}.get(a)
            if cell is None:
                raise self.fail(name, f"a simple recurrent layer with activation {a}: rnnconvert's simple RNN is "
                                      "tanh or relu (PyTorch nn.RNN); refused")
            d = DirectionParams(w_ih=g["W"].T.copy(), w_hh=g["U"].T.copy(), b_ih=g["b"], b_hh=np.zeros(H, g["b"].dtype))
            h0 = self.init(st, "init", name, H)
            return cell, Semantics(activation=a), d, ({"h0": h0} if h0 is not None else {}), I, H
        raise self.fail(name, f"{getattr(o, 'cls_path', type(o).__name__)} is no recurrent layer rnnconvert knows")

    def layer(self, o: Any, name: str) -> tuple[RNNLayer, dict[str, np.ndarray]]:
        if kind(o, self.record) == "bidirectional":
            st = _state(o, self.record)
            self.classes.add(o.cls_path)
            f = self.direction(st["fwd_layer"], name)
            b = self.direction(st["bwd_layer"], name)
            if f[0] != b[0] or f[1] != b[1] or f[4:] != b[4:] or (f[2].peep is None) != (b[2].peep is None):
                raise self.fail(name, "its forward and backward layers differ in cell, sizes or activations; refused")
            dirs, inits = [f[2], b[2]], [f[3], b[3]]
            cell, sem, I, H = f[0], f[1], f[4], f[5]
        else:
            cell, sem, d, init, I, H = self.direction(o, name)
            dirs, inits = [d], [init]
        states = {}
        for key in ("h0", "c0"):
            if any(key in i for i in inits):
                states[f"{name}_state.{key}"] = np.stack([i.get(key, np.zeros(H, dirs[0].b_ih.dtype)) for i in inits])
        cls = o.cls_path.rsplit(".", 1)[-1]
        if len(dirs) == 2:
            cls = f"{cls}({_state(o, self.record)['fwd_layer'].cls_path.rsplit('.', 1)[-1]})"
        layer = RNNLayer(name=name, cell=cell, input_size=I, hidden_size=H, bidirectional=len(dirs) == 2,
                         semantics=sem, params=[dirs], source={"format": "pickle", "class_name": cls, "path": name})
        return layer, states


def is_network(tree: Any, record: type) -> bool:
    """Whether an unpickled tree is a class-structured network: an object (or list) whose ``layers`` hold at
    least one recurrent layer object (:func:`kind`), or one such layer alone."""
    layers = network_layers(tree, record)
    return layers is not None and any(kind(o, record) in ("lstm", "gru", "rnn", "bidirectional") for _, o in layers)


def network_layers(tree: Any, record: type) -> list[tuple[str, Any]] | None:
    """``[(name, layer object)]``: ``tree.layers`` (madmom's ``NeuralNetwork``), a list of layer objects, or one."""
    st = _state(tree, record)
    if st is not None and isinstance(st.get("layers"), (list, tuple)):
        return [(f"layers_{i}", o) for i, o in enumerate(st["layers"])]
    if isinstance(tree, (list, tuple)):
        return [(f"layers_{i}", o) for i, o in enumerate(tree)]
    if kind(tree, record) is not None:
        return [("layer", tree)]
    return None


def read(tree: Any, where: str, fmt: str, record: type, array: Callable[[Any], np.ndarray | None]) -> Checkpoint:
    """Canonical layers of a class-structured network (module docstring).

    Args:
        tree: the unpickled tree (inert records of ``record``'s kind; arrays as ``array`` returns them).
        where: the file, for messages. fmt: the format name recorded.
        array: the numpy array a leaf holds, ``None`` for a non-array.

    Returns:
        one :class:`~rnnconvert.core.model.Checkpoint` layer per recurrent layer object, named ``layers_<i>``
        (its position in the network); dense layers as ``layers_<i>.weight`` ``(out, in)`` / ``.bias``;
        learned initial states as ``layers_<i>_state.h0``/``.c0`` ``(directions, H)``; ``meta['notes']``
        naming them and the layers neither recurrent nor dense (not carried).

    Raises:
        FormatError: a gate or layer whose arrays or activations do not fit (named, with the reason).
    """
    r = _Reader(where, record, array)
    layers, tensors, skipped, states = [], {}, [], []
    for name, o in network_layers(tree, record) or []:
        k = kind(o, record)
        if k in ("lstm", "gru", "rnn", "bidirectional"):
            layer, st = r.layer(o, name)
            layers.append(layer)
            tensors.update(st)
            states += list(st)
        elif k == "dense":
            st = _state(o, record)
            w = r.arr(st, "weights", name)
            if w.ndim != 2:
                raise r.fail(name, f"weights of shape {w.shape}")
            tensors[f"{name}.weight"] = np.ascontiguousarray(w.T)
            tensors[f"{name}.bias"] = r.arr(st, "bias", name, (w.shape[1],))
            r.classes.add(o.cls_path)
        else:
            skipped.append(f"{name} ({getattr(o, 'cls_path', type(o).__name__)})")
    notes = []
    if states:
        notes.append(f"learned initial state(s) {', '.join(states)} carried as extra tensors (directions, H), not "
                     "applied by the written layers, which start from zero: feed them as the initial state (PyTorch "
                     "h0 = t.unsqueeze(1).expand(-1, batch, -1) for one layer)")
    if skipped:
        notes.append(f"not carried (neither recurrent nor dense): {', '.join(skipped)}")
    foreign = sorted(c for c in r.classes if not c.startswith("madmom."))
    if foreign:
        notes.append(f"classes {', '.join(foreign)} read by madmom's equations (same structure; not madmom's own)")
    meta = {"path": where, "framework": "madmom (pickled numpy network)", "notes": notes}
    return Checkpoint(format=fmt, layers=layers, tensors=tensors, meta=meta)
