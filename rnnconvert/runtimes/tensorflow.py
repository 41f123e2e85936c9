"""The TensorFlow runtime: ``--verify framework`` for TensorFlow sources, TensorFlow itself running the layer from
the source file.

* TF1 cells (``lstm_cell``, ``basic_lstm_cell``, ``gru_cell``, ``basic_rnn_cell``): a ``tf.compat.v1``
  graph of the same cells (``LSTMCell`` with the layer's peepholes, ``num_proj``, clipping and
  ``forget_bias``; ``GRUCell``; ``BasicRNNCell``) under ``dynamic_rnn``, stacked and reversed for the
  backward direction like ``stack_bidirectional_dynamic_rnn``, whose variables a ``Saver`` restores
  from the source checkpoint by their original names.
* TF2 Keras layers: a fresh tf_keras ``LSTM``/``GRU``/``SimpleRNN`` (in ``Bidirectional`` when needed)
  restored by ``tf.train.Checkpoint`` from the source under its ``layer_with_weights-N`` name.

Other kinds (CudnnCompatible cells, which TF 2 no longer ships; CuDNN Keras layers, GPU only; nested
models) raise :class:`~rnnconvert.errors.VerificationError` naming ``--verify reference`` as the way out.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import VerificationError, require
from ..core.finite import all_finite
from ..core.model import Checkpoint, RNNLayer
from ..engine.protocol import Runtime

_TF1_CELLS = ("lstm_cell", "basic_lstm_cell", "gru_cell", "basic_rnn_cell")


def _tf1(tf, prefix: str, layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    v1, s = tf.compat.v1, layer.semantics
    rc = v1.nn.rnn_cell
    cname = layer.source["class_name"]
    H = layer.hidden_size

    def make():
        if "lstm" in cname:
            return rc.LSTMCell(H, use_peepholes=layer.params[0][0].peep is not None, num_proj=layer.proj_size or None,
                               cell_clip=s.cell_clip, proj_clip=s.proj_clip, forget_bias=s.forget_bias)
        if cname == "gru_cell":
            return rc.GRUCell(H)
        return rc.BasicRNNCell(H, activation={"tanh": tf.tanh, "relu": tf.nn.relu}[s.activation])

    g = tf.Graph()
    with g.as_default():
        y = v1.placeholder(tf.float64 if x.dtype == np.float64 else tf.float32, x.shape)
        xp, mapping = y, {}
        for k in range(layer.num_layers):
            outs = []
            for d in range(layer.num_directions):
                scope = f"l{k}d{d}"
                with v1.variable_scope(scope):
                    inp = tf.reverse(y, [1]) if d else y
                    o, _ = v1.nn.dynamic_rnn(make(), inp, dtype=y.dtype)
                    outs.append(tf.reverse(o, [1]) if d else o)
                keys = layer.source["keys"][k * layer.num_directions + d]
                for var in v1.global_variables(scope=scope + "/"):
                    short = var.op.name.split("/", 3)[3]  # l{k}d{d}/rnn/<cell scope>/<var>
                    if short not in keys:
                        _refuse(f"TF's {cname} has variable '{short}' that the source lacks")
                    if isinstance(keys[short], (tuple, list)):
                        _refuse(f"'{short}' of layer '{layer.name}' is stored in part_N shards")
                    mapping[keys[short]] = var
            y = tf.concat(outs, -1) if len(outs) > 1 else outs[0]
        with v1.Session() as sess:
            v1.train.Saver(mapping).restore(sess, prefix)
            return sess.run(y, {xp: x})


def _keras(tf, prefix: str, layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    keras = require("tf_keras", "tensorflow")
    s, H, kind = layer.semantics, layer.hidden_size, layer.source.get("class_name")
    kw = {"return_sequences": True, "activation": s.activation}

    def make(backwards: bool):
        if kind == "LSTM":
            return keras.layers.LSTM(H, recurrent_activation=s.gate_activation, go_backwards=backwards, **kw)
        if kind == "GRU":
            return keras.layers.GRU(H, recurrent_activation=s.gate_activation, reset_after=s.reset_after,
                                    go_backwards=backwards, **kw)
        return keras.layers.SimpleRNN(H, go_backwards=backwards, **kw)

    if layer.bidirectional:
        lay = keras.layers.Bidirectional(make(False), backward_layer=make(True), merge_mode="concat")
    else:
        lay = make(s.go_backwards)
    lay.build((None, None, layer.input_size))
    lay.set_weights([np.full(w.shape, np.nan, w.dtype) for w in lay.get_weights()])
    tf.train.Checkpoint(**{layer.name: lay}).restore(prefix).expect_partial()
    if not all(all_finite(w) for w in lay.get_weights()):  # every weight must come from the file
        _refuse(f"tf_keras could not restore layer '{layer.name}' from {prefix}")
    return np.asarray(lay(tf.constant(np.asarray(x, np.float32))))


def framework_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """TensorFlow's own output for layer ``name`` of the source checkpoint at ``path``; float64 ``(B, T, out)``.

    Raises:
        VerificationError: TF 2.21 cannot run this kind of layer on CPU (the reason is named).
    """
    tf = require("tensorflow", "tensorflow")
    from ..formats.tf.sniff import prefix_of

    layer = ckpt.layer(name)
    prefix = prefix_of(path)
    cname = layer.source.get("class_name")
    if cname in _TF1_CELLS and layer.source.get("keys") and not layer.source.get("opaque"):
        return np.asarray(_tf1(tf, prefix, layer, np.asarray(x, np.float32)), np.float64)
    if cname in ("LSTM", "GRU", "SimpleRNN") and "." not in name and ckpt.meta.get("kind") == "tf2_object":
        return np.asarray(_keras(tf, prefix, layer, x), np.float64)
    _refuse(f"not available for layer '{name}' ({cname}): TF 2.21 on CPU has no such layer class",
            " (TF's equations on the stored tensors)")


def _refuse(why: str, after: str = "") -> None:
    """Raise the :class:`VerificationError` of a framework verification that cannot run, in the API's
    and the CLI's words."""
    raise VerificationError(f"framework verification (verify='framework'): {why}; use verify='reference'{after}",
                            cli=f"--verify framework: {why}; use --verify reference{after}")


RUNTIME = Runtime("tensorflow", engine="tensorflow", framework_forward=framework_forward)
