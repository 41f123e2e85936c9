"""TF2 object-based checkpoints of tf_keras layers (format ``tf2_checkpoint``): writer (+ the reader of
:mod:`.checkpoint_read`).

The output is a directory with ``ckpt-1.index``, ``ckpt-1.data-*`` and ``checkpoint``, written by
``tf.train.Checkpoint`` whose children are named like a Keras model's: ``layer_with_weights-N`` for the
N-th recurrent Keras layer (LAYOUTS §7). A stacked layer (``num_layers = k``) becomes ``k`` consecutive
Keras layers; a bidirectional one a ``Bidirectional`` wrapper. ``model.load_weights(dir/ckpt-1)`` of a
tf_keras model whose weighted layers are exactly these, in this order, restores them. Other tensors
(Dense, Embedding) are not written.

Keras layout (:data:`rnnconvert.core.gates.TABLE` ``keras``/``keras_ra``): LSTM kernel ``(I, 4H)`` i, f, c, o,
bias ``b_ih + b_hh`` (one rounding; a TF1 ``forget_bias`` folded in); GRU z, r, h, bias ``(2, 3H)`` rows
``b_ih``, ``b_hh`` when ``reset_after=True``, else ``(3H,)`` = ``b_ih + b_hh``; SimpleRNN. Refused:
peepholes, projection, clipping, Keras-3 hard_sigmoid.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...errors import require
from ...core.model import Cell, Checkpoint, RNNLayer
from ...core.transforms import summed_bias
from ...conventions import keras_names as keras_naming
from . import naming
from .tf1_write import fresh_directory
from ...speed import transpose

_KERAS_ACT = {"sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "softsign"}


def refusals(layer: RNNLayer) -> list[str]:
    """What tf_keras layers cannot express about ``layer`` (empty when they can)."""
    s, why = layer.semantics, []
    for what, a in (("gate activation", s.gate_activation), ("activation", s.activation)):
        if a not in _KERAS_ACT:
            why.append(f"{what} {a} (tf_keras has no such activation)")
    if any(p.peep is not None for dirs in layer.params for p in dirs):
        why.append("peephole connections")
    if layer.proj_size:
        why.append("LSTM projection")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("cell_clip/proj_clip")
    return why


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Raises UnsupportedError for layers tf_keras cannot express; notes what is not written."""
    from ...engine import refusal

    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "tf2_checkpoint", "tf_keras layers")
    return [f"{len(ckpt.tensors)} non-recurrent tensors are not written"] if ckpt.tensors else []


def _one(keras, layer: RNNLayer, k: int, d: int, name: str):
    """A built Keras RNN layer for stacked layer ``k``, direction ``d``, and its weights. ``name`` is
    explicit: Keras' automatic names (``lstm_3``) count layers made in the process, and they are
    recorded in the checkpoint's object graph (variables' ``full_name``), so the same input would not
    give the same bytes."""
    s, H, cell = layer.semantics, layer.hidden_size, layer.cell
    p = layer.params[k][d]
    kw = {"return_sequences": True, "activation": s.activation, "name": name}
    if cell is Cell.LSTM:
        lay, conv = keras.layers.LSTM(H, recurrent_activation=s.gate_activation, **kw), gates.convention("keras", cell)
        bias = gates.vec_from_canonical(summed_bias(p), conv, cell)
    elif cell is Cell.GRU:
        lay = keras.layers.GRU(H, recurrent_activation=s.gate_activation, reset_after=s.reset_after, **kw)
        conv = keras_naming.convention(cell, s.reset_after)
        bias = (np.stack([gates.vec_from_canonical(p.b_ih, conv, cell), gates.vec_from_canonical(p.b_hh, conv, cell)])
                if s.reset_after else gates.vec_from_canonical(summed_bias(p), conv, cell))
    else:
        lay, conv = keras.layers.SimpleRNN(H, **kw), gates.convention("keras", cell)
        bias = summed_bias(p)
    return lay, [transpose.from_canonical(p.w_ih, conv, cell), transpose.from_canonical(p.w_hh, conv, cell), bias]


def _build(layers: list[RNNLayer], merge: bool = True) -> tuple[list[Any], dict[str, list]]:
    """Built Keras layers in checkpoint order, and per rnnconvert layer its Keras layers."""
    keras = require("tf_keras", "tensorflow")
    out, by_name = [], {}
    for i, layer in enumerate(layers):
        mine = []
        for k in range(layer.num_layers):
            fw, wf = _one(keras, layer, k, 0, f"rnn{i}_l{k}")
            if layer.bidirectional:
                bw, wb = _one(keras, layer, k, 1, f"rnn{i}_l{k}_reverse")
                bw.go_backwards = True
                mode = layer.semantics.merge_mode if merge else "concat"
                lay = keras.layers.Bidirectional(fw, backward_layer=bw, merge_mode=mode, name=f"bidirectional{i}_l{k}")
                lay.build((None, None, layer.layer_input_size(k)))
                lay.set_weights(wf + wb)
            else:
                fw.go_backwards = layer.semantics.go_backwards
                lay = fw
                lay.build((None, None, layer.layer_input_size(k)))
                lay.set_weights(wf)
            mine.append(lay)
        out += mine
        by_name[layer.name] = mine
    return out, by_name


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write the recurrent layers as a TF2 object checkpoint directory at ``path``; one line per layer."""
    tf = require("tensorflow", "tensorflow")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    built, by_name = _build(ckpt.layers)
    p = fresh_directory(path)
    tf.train.Checkpoint(**{naming.keras_layer(i): lay for i, lay in enumerate(built)}).save(str(p / "ckpt"))
    lines, n = [], 0
    for layer in ckpt.layers:
        kinds = ", ".join(type(x).__name__ + (f"({type(x.forward_layer).__name__})" if hasattr(x, "forward_layer")
                                              else "") for x in by_name[layer.name])
        sem = layer.semantics
        opts = [f"activation='{sem.activation}'"]
        if layer.cell in (Cell.LSTM, Cell.GRU):
            opts.append(f"recurrent_activation='{sem.gate_activation}'")
        if layer.cell is Cell.GRU:
            opts.append(f"reset_after={sem.reset_after}")
        if sem.go_backwards and not layer.bidirectional:
            opts.append("go_backwards=True")
        lines.append(f"{layer.name}: tf_keras {kinds} ({', '.join(opts)}) = "
                     f"{naming.keras_layer(n)}..{n + len(by_name[layer.name]) - 1}")
        n += len(by_name[layer.name])
    return lines


ROUTE = "tf_keras (layers restored by TensorFlow from the checkpoint)"


def _restored(path: str | Path, ckpt: Checkpoint):
    """Fresh tf_keras layers (weights zeroed) restored from the written checkpoint by TensorFlow."""
    tf = require("tensorflow", "tensorflow")
    from .sniff import prefix_of

    built, by_name = _build(ckpt.layers, merge=False)
    for lay in built:  # forget the weights we set: everything must come from the file
        lay.set_weights([np.zeros_like(w) for w in lay.get_weights()])
    status = tf.train.Checkpoint(**{naming.keras_layer(i): lay for i, lay in enumerate(built)}).restore(
        prefix_of(path))
    status.assert_existing_objects_matched()
    return by_name


def load(path: str | Path, ckpt: Checkpoint, name: str, which=None):
    """The tf_keras runtime's view of a written TF2 object checkpoint
    (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`, :mod:`rnnconvert.runtimes.tf_keras`): fresh tf_keras
    layers restored from it by TensorFlow (:func:`_restored`), ``(float32, iterator of (k, Keras layer))`` for the
    stacked layers ``k`` in ``which`` (``None``: all) of layer ``name``."""
    lays = _restored(path, ckpt)[name]
    ks = range(len(lays)) if which is None else which
    return np.float32, ((k, lays[k]) for k in ks)
