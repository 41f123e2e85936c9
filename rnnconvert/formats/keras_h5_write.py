"""Keras 2 HDF5 writer (tf_keras full-model ``.h5``) and the tf_keras side of verification.

The written file is a complete model that ``tf_keras.models.load_model(path)`` opens: one
``Input`` per recurrent layer of the checkpoint (named ``<layer>_input``, shape ``(None, None, I)``,
batch-major) feeding that layer; a stacked source layer (``num_layers = L``) becomes ``L`` chained
Keras layers ``<layer>_l0 .. <layer>_l{L-1}``; two directions become ``Bidirectional``. Every layer
has ``return_sequences=True``; the model's outputs are the last Keras layer of each source layer.
Layer names are the source names with every character outside ``[A-Za-z0-9_]`` replaced by ``_``.
Other tensors (Dense, Embedding) are not written (a note says so).

Two forms (LAYOUTS.md §2, §4, §15):

* default: ``LSTM`` / ``GRU`` / ``SimpleRNN``: ``kernel (I, G*H)``, ``recurrent_kernel (H, G*H)``,
  gate columns LSTM i,f,c,o, GRU z,r,h (``gates.TABLE['keras']``); LSTM and SimpleRNN receive the
  summed bias ``b_ih + b_hh`` ``(G*H,)`` (one float rounding; exact when one is zero); GRU
  ``reset_after=True`` keeps both rows ``(2, 3H)``, ``reset_after=False`` gets the summed ``(3H,)``
  (exact: in a reset-before GRU ``b_hn`` sits outside ``r``, so it adds to ``b_in``).
* ``cudnn=True``: ``CuDNNLSTM`` / ``CuDNNGRU``: each ``(in, H)`` kernel slice holds the row-major
  bytes of cuDNN's ``(H, in)`` matrix (inverse of ``keras_h5._cudnn_bytes_to_rows``), bias
  ``(2*G*H,)`` = input biases then recurrent biases, Keras slice order (``gates.TABLE['keras_cudnn']``).
  Bit-exact (no arithmetic). A file of this form can be run on a GPU only; on a CPU,
  ``tf_keras`` converts it on ``load_weights`` into ``LSTM`` / ``GRU(reset_after=True)``.

Refused (``UnsupportedError``): LSTM projection, peepholes, cell/proj clip, activations Keras 2 has
not (Keras 3 ``hard_sigmoid``); for ``cudnn=True`` also non-sigmoid gates, non-tanh activations,
GRU ``reset_after=False`` and simple RNNs. A TF1 ``forget_bias`` is folded into the bias.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from .. import gates, registry
from ..errors import UnsupportedError, require
from ..model import Cell, Checkpoint, DirectionParams, RNNLayer
from ..transforms import fold_forget_bias, summed_bias

ROUTE = "tf_keras"
_K2_ACTS = {"sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "softsign"}
_CLASS = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "SimpleRNN", Cell.RNN_RELU: "SimpleRNN"}


def tf_keras():
    """Import tf_keras (the Keras 2 implementation); raises DependencyError when missing."""
    return require("tf_keras", "tensorflow")


def keras_name(name: str) -> str:
    """A Keras-safe layer name: characters outside ``[A-Za-z0-9_]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "rnn"


def plan(ckpt: Checkpoint) -> list[tuple[RNNLayer, str, list[str]]]:
    """``(layer, input name, [Keras layer names])`` per recurrent layer, names unique in the model."""
    used: set[str] = set()
    out = []

    def uniq(n: str) -> str:
        base, i = n, 1
        while n in used:
            n, i = f"{base}_{i}", i + 1
        used.add(n)
        return n

    for layer in ckpt.layers:
        base = keras_name(layer.name)
        names = [uniq(base if layer.num_layers == 1 else f"{base}_l{k}") for k in range(layer.num_layers)]
        out.append((layer, uniq(f"{base}_input"), names))
    return out


def keras_structure_refusals(layer: RNNLayer) -> list[str]:
    """What no Keras (2 or 3) recurrent layer has: projection, peepholes, TF1 clipping."""
    s, why = layer.semantics, []
    if layer.proj_size:
        why.append(f"LSTM projection proj_size={layer.proj_size}")
    if any(p.peep is not None for dirs in layer.params for p in dirs):
        why.append("peephole connections")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("cell_clip/proj_clip")
    return why


def refusals(layer: RNNLayer, cudnn: bool = False) -> list[str]:
    """What a Keras 2 layer (CuDNN form when ``cudnn``) cannot express about ``layer``."""
    s, why = layer.semantics, keras_structure_refusals(layer)
    for what, a in (("activation", s.activation), ("recurrent_activation", s.gate_activation)):
        if a not in _K2_ACTS:
            why.append(f"{what}={a} (Keras 2 has no such activation)")
    if cudnn:
        if layer.cell not in (Cell.LSTM, Cell.GRU):
            why.append("simple RNN (there is no CuDNN SimpleRNN layer)")
        if s.gate_activation != "sigmoid" or s.activation != "tanh":
            why.append(f"activations {s.gate_activation}/{s.activation} (CuDNN layers are sigmoid/tanh only)")
        if layer.cell is Cell.GRU and not s.reset_after:
            why.append("GRU reset_after=False (CuDNNGRU resets after the recurrent matmul)")
    return why


def check(ckpt: Checkpoint, *, cudnn: bool = False, **_: Any) -> list[str]:
    """Refuse what Keras 2 cannot express; return notes.

    Raises:
        UnsupportedError: one line naming the layer, the features, and the way out.
    """
    for layer in ckpt.layers:
        why = refusals(layer, cudnn)
        form = "CuDNN" + ("LSTM" if layer.cell is Cell.LSTM else "GRU") if cudnn else _CLASS[layer.cell]
        if why and cudnn and not refusals(layer):
            raise UnsupportedError(f"layer '{layer.name}' cannot be written as Keras 2 {form}: {'; '.join(why)}. "
                                   "Write the plain Keras form (without --cudnn) instead")
        registry.refuse(layer, why, "keras_h5", f"Keras 2 {form}")
    notes = []
    if ckpt.tensors:
        notes.append(f"{len(ckpt.tensors)} non-recurrent tensors (e.g. {next(iter(ckpt.tensors))}) are not "
                     "written to the Keras file; only the recurrent layers are")
    return notes


def _weights(layer: RNNLayer, p: DirectionParams, cudnn: bool) -> list[np.ndarray]:
    """Keras weights ``[kernel, recurrent_kernel(, bias)]`` of one direction of one stacked layer."""
    cell, H, G = layer.cell, layer.hidden_size, layer.cell.gates
    if cudnn:
        conv = gates.convention("keras_cudnn", cell)
        out = []
        for w in (p.w_ih, p.w_hh):
            rows = gates.reorder(w, gates.CANONICAL[cell], conv.gate_order)  # (G*H, in), file slice order
            width = rows.shape[1]
            out.append(np.ascontiguousarray(np.concatenate(
                [np.ascontiguousarray(rows[j * H:(j + 1) * H]).reshape(width, H) for j in range(G)], axis=1)))
        out.append(np.concatenate([gates.vec_from_canonical(p.b_ih, conv, cell),
                                   gates.vec_from_canonical(p.b_hh, conv, cell)]))
        return out
    ra = cell is Cell.GRU and layer.semantics.reset_after
    conv = gates.convention("keras_ra" if ra else "keras", cell)
    out = [gates.from_canonical(p.w_ih, conv, cell), gates.from_canonical(p.w_hh, conv, cell)]
    if layer.bias:
        if ra:
            out.append(np.stack([gates.vec_from_canonical(p.b_ih, conv, cell),
                                 gates.vec_from_canonical(p.b_hh, conv, cell)]))
        else:
            out.append(gates.vec_from_canonical(summed_bias(p), conv, cell))
    return out


def _make_layer(k, layer: RNNLayer, name: str, cudnn: bool, twin: bool = False):
    s, H = layer.semantics, layer.hidden_size
    dtype = str(layer.dtype)
    kw: dict[str, Any] = {"return_sequences": True, "dtype": dtype}
    kw["name"] = name  # inside Bidirectional: copies named forward_<name> / backward_<name> (not auto-numbered)
    if s.go_backwards and not layer.bidirectional:
        kw["go_backwards"] = True
    if cudnn:
        if layer.cell is Cell.LSTM:
            from tf_keras.src.layers.rnn.cudnn_lstm import CuDNNLSTM as cls
        else:
            from tf_keras.src.layers.rnn.cudnn_gru import CuDNNGRU as cls
        inner = cls(H, **kw)
    else:
        kw.update(activation=s.activation, use_bias=layer.bias or twin)
        if layer.cell is Cell.LSTM:
            inner = k.layers.LSTM(H, recurrent_activation=s.gate_activation, unit_forget_bias=False, **kw)
        elif layer.cell is Cell.GRU:
            inner = k.layers.GRU(H, recurrent_activation=s.gate_activation, reset_after=s.reset_after, **kw)
        else:
            inner = k.layers.SimpleRNN(H, **kw)
    if layer.bidirectional:
        return k.layers.Bidirectional(inner, merge_mode=s.merge_mode, name=name, dtype=dtype)
    return inner


def build(ckpt: Checkpoint, *, cudnn: bool = False, with_weights: bool = True, twin: bool = False):
    """The tf_keras ``Model`` that :func:`write` saves (see the module docstring).

    ``twin=True, with_weights=False``: the untrained plain-layer model (always with bias, as CuDNN
    layers are) into which tf_keras' ``load_weights`` converts a CuDNN-form file.
    """
    k = tf_keras()
    inputs, outputs = [], []
    for layer, in_name, names in plan(ckpt):
        layer = fold_forget_bias(layer)
        inp = k.Input(shape=(None, layer.input_size), name=in_name, dtype=str(layer.dtype))
        h = inp
        for kk, nm in enumerate(names):
            lay = _make_layer(k, layer, nm, cudnn, twin)
            h = lay(h)
            if with_weights:
                lay.set_weights([w for p in layer.params[kk] for w in _weights(layer, p, cudnn)])
        inputs.append(inp)
        outputs.extend(h if isinstance(h, (list, tuple)) else [h])
    return k.Model(inputs, outputs, name="rnnconvert")


def write(ckpt: Checkpoint, path: str | Path, *, cudnn: bool = False, **_: Any) -> list[str]:
    """Write ``ckpt`` as a tf_keras full-model HDF5 file; one line per layer saying how to load it.

    Raises:
        UnsupportedError: see :func:`check`.
    """
    check(ckpt, cudnn=cudnn)
    model = build(ckpt, cudnn=cudnn)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save(str(path), save_format="h5", include_optimizer=False)
    lines = []
    for layer, in_name, names in plan(ckpt):
        form = ("CuDNN" + ("LSTM" if layer.cell is Cell.LSTM else "GRU")) if cudnn else _CLASS[layer.cell]
        lines.append(f"{layer.name}: tf_keras {form} layer(s) {', '.join(names)} (input '{in_name}', "
                     "return_sequences=True); tf_keras.models.load_model(path)")
    return lines


def _is_cudnn_file(path: str | Path) -> bool:
    import h5py

    with h5py.File(str(path), "r") as f:
        cfg = f.attrs.get("model_config", b"")
    cfg = cfg.decode("utf8") if isinstance(cfg, bytes) else str(cfg)
    return '"CuDNNLSTM"' in cfg or '"CuDNNGRU"' in cfg


def run_layer(model, names: list[str], bidirectional: bool, x: np.ndarray) -> np.ndarray:
    """Run Keras layers ``names`` of ``model`` in a chain on ``x``; the last one's directions concatenated."""
    import tensorflow as tf

    h = tf.convert_to_tensor(x)
    for nm in names[:-1]:
        h = model.get_layer(nm)(h)
    last = model.get_layer(names[-1])
    if bidirectional:
        fw = last.forward_layer(h)
        bw = tf.reverse(last.backward_layer(h), axis=[1])
        y = tf.concat([fw, bw], axis=-1)
    else:
        y = last(h)
    return np.asarray(y, dtype=np.float64)


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Run layer ``name`` of the written file in tf_keras on ``x`` ``(B, T, I)``; ``(B, T, dirs*H)`` float64.

    Plain files are opened with ``tf_keras.models.load_model``; CuDNN-form files (which need a GPU to
    run) are loaded with tf_keras' own ``load_weights`` into the equivalent ``LSTM`` /
    ``GRU(reset_after=True)`` model, whose HDF5 loader converts the CuDNN weights.
    """
    k = tf_keras()
    if _is_cudnn_file(path):
        model = build(ckpt, cudnn=False, with_weights=False, twin=True)
        model.load_weights(str(path))
    else:
        model = k.models.load_model(str(path), compile=False)
    for layer, _, names in plan(ckpt):
        if layer.name == name:
            return run_layer(model, names, layer.bidirectional, np.asarray(x, dtype=layer.dtype))
    raise KeyError(name)


