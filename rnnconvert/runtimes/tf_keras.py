"""The tf_keras runtime: tf_keras layers run a written Keras HDF5 file or TF2 object checkpoint (verification's
target side), and a Keras HDF5 source file (``--verify framework``, :func:`framework_forward`).

Target side: a container hands this runtime a written file through its
:attr:`~rnnconvert.engine.protocol.FormatSpec.load`: ``load(path, ckpt, name, which) -> (dtype, layers)``, the
dtype its Keras layers compute in and an iterator of ``(k, Keras layer of stacked layer k)`` for ``k`` in
``which`` (``None``: every stacked layer, in order), each made and loaded from the file as that container's
own loader does (``keras_h5_write.load``: ``load_model``'s per-layer steps; ``tf2_writer.load``:
``tf.train.Checkpoint.restore``). A Bidirectional's directions are concatenated, the backward one in input
time order (:func:`run_last`); one steps go through each direction's own cell (:func:`cell_step`).

``--verify framework``: tf_keras is imported inside :func:`framework_forward` only. Each direction of a layer is rebuilt as a
tf_keras layer from the file's layer config (weights-only files: from the layer kind, sizes and
semantics the reader found); the file's own tensors go through tf_keras' legacy HDF5 loader conversion
(``tf_keras/src/saving/legacy/hdf5_format.py`` ``preprocess_weights_for_loading``: Keras-1 per-gate
tensors, CuDNN kernels and biases, LAYOUTS.md §1.1-1.2, §4.4) and ``set_weights``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.model import Checkpoint, RNNLayer
from ..engine.protocol import Runtime
from ..errors import UnsupportedError


def _tf_keras_layer(keras, layer: RNNLayer, backwards: bool):
    """A tf_keras layer computing one direction of ``layer``: from the file's config when there is one,
    else from the canonical class, sizes and semantics. CuDNN layers become ``LSTM`` /
    ``GRU(reset_after=True)`` (sigmoid/tanh): the v1 CuDNN layers run only on a GPU, and tf_keras' own
    legacy loader maps their weights onto these (``hdf5_format._convert_rnn_weights``)."""
    kind = layer.source["class_name"]
    over = dict(return_sequences=True, return_state=False, go_backwards=backwards, stateful=False,
                unroll=False, name=f"rnnconvert_{'bw' if backwards else 'fw'}")
    cls = {"LSTM": keras.layers.LSTM, "CuDNNLSTM": keras.layers.LSTM, "GRU": keras.layers.GRU,
           "CuDNNGRU": keras.layers.GRU, "SimpleRNN": keras.layers.SimpleRNN}[kind]
    if kind.startswith("CuDNN"):
        extra = {"reset_after": True} if kind == "CuDNNGRU" else {}
        return cls(layer.hidden_size, **extra, **over)
    cfg = layer.source.get("config")
    if cfg and "units" in cfg:
        from ..safety import keras_sanitize

        cfg = {**keras_sanitize.layer_config(kind, cfg, layer.name), **over}  # the whitelist first (issue #40)
        for key in ("dropout", "recurrent_dropout"):
            cfg.pop(key, None)
        if kind == "GRU":  # a Keras 2.0/2.1 config without the key means reset-before (LAYOUTS.md §3.4)
            cfg["reset_after"] = layer.semantics.reset_after
        return cls.from_config(cfg)
    s = layer.semantics
    if s.gate_activation == "hard_sigmoid_k3" or s.activation == "hard_sigmoid_k3":
        what = f"layer '{layer.name}': tf_keras has no Keras-3 hard_sigmoid; use "
        raise UnsupportedError(what + "the reference verification (verify='reference')", cli=what + "--verify reference")
    args = dict(activation=s.activation, use_bias=layer.bias, **over)
    if kind != "SimpleRNN":
        args["recurrent_activation"] = s.gate_activation
    if kind == "GRU":
        args["reset_after"] = s.reset_after
    return cls(layer.hidden_size, **args)


def _file_weights(layer: RNNLayer, raw: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The direction's tensors as the file holds them (Keras 1: split back into its 12/9 per-gate tensors,
    saved order, undoing the concatenation of :func:`rnnconvert.conventions.keras_interpreter._merge_keras1`)."""
    w = [raw["kernel"], raw["recurrent_kernel"]] + ([raw["bias"]] if "bias" in raw else [])
    if layer.source.get("family") != "keras1":
        return w
    G, H = layer.cell.gates, layer.hidden_size
    out = []
    for j in range(G):
        out += [raw["kernel"][:, j * H:(j + 1) * H], raw["recurrent_kernel"][:, j * H:(j + 1) * H],
                raw["bias"][j * H:(j + 1) * H]]
    return out


def framework_forward(src_path: str | Path, ckpt: Checkpoint, layer_name: str, x: np.ndarray) -> np.ndarray:
    """Run layer ``layer_name`` of a Keras HDF5 checkpoint in tf_keras (``--verify framework``), on CPU.

    Each direction is rebuilt as a tf_keras layer (see :func:`_tf_keras_layer`); the file's own tensors
    (``layer.source['raw']``) go through tf_keras' legacy loader conversion
    (``hdf5_format.preprocess_weights_for_loading``: Keras-1 per-gate tensors, CuDNN kernels/biases)
    and ``set_weights``. ``src_path`` is unused (the tensors were read already).

    Args:
        x: ``(batch, time, input_size)`` input, run in float32.

    Returns:
        float64 ``(batch, time, dirs * H)``: the full output sequence, directions concatenated (forward
        first, backward in input time order), merge mode not applied; a ``go_backwards`` layer's outputs
        in processing order -- the convention of :func:`rnnconvert.core.reference.forward`.

    Raises:
        DependencyError: tf_keras is not installed. UnsupportedError: a Keras-3 hard_sigmoid.
    """
    import os

    from ..errors import require

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    keras = require("tf_keras", "tensorflow")
    from tf_keras.src.saving.legacy import hdf5_format

    layer = ckpt.layer(layer_name)
    version = "1" if layer.source.get("family") == "keras1" else "2"
    xs = np.asarray(x, dtype=np.float32)
    outs = []
    for d, raw in enumerate(layer.source["raw"]):
        klayer = _tf_keras_layer(keras, layer, backwards=d == 1 or layer.semantics.go_backwards)
        klayer.build((None, None, layer.input_size))
        w = hdf5_format.preprocess_weights_for_loading(klayer, _file_weights(layer, raw), original_keras_version=version)
        klayer.set_weights(w)
        y = np.asarray(klayer(xs), dtype=np.float64)
        outs.append(y[:, ::-1] if d == 1 else y)
    return np.concatenate(outs, axis=-1)


def run_last(last, h, bidirectional: bool) -> np.ndarray:
    """The last Keras layer of a chain on ``h``; a Bidirectional's directions concatenated (merge not
    applied), the backward one in input time order."""
    import tensorflow as tf

    if bidirectional:
        fw = last.forward_layer(h)
        bw = tf.reverse(last.backward_layer(h), axis=[1])
        return np.asarray(tf.concat([fw, bw], axis=-1), dtype=np.float64)
    return np.asarray(last(h), dtype=np.float64)


def cell_step(sub, x: np.ndarray, state: tuple, dtype, to_tensor=None) -> tuple[np.ndarray, np.ndarray | None]:
    """One step of a Keras recurrent layer ``sub`` (tf_keras or Keras 3) through its own cell: ``sub.cell(x,
    [h0(, c0)])`` on ``x`` ``(N, I)``, states ``state = (h0 (N, out), c0 (N, H) or None)``; returns
    ``(h1, c1 or None)`` float64. The cell is what the layer's loop calls at every time step.
    ``to_tensor``: the framework's tensor constructor (default ``tf.convert_to_tensor``)."""
    if to_tensor is None:
        import tensorflow as tf

        to_tensor = tf.convert_to_tensor
    init = [to_tensor(np.asarray(state[0], dtype))] + ([] if state[1] is None else [to_tensor(np.asarray(state[1], dtype))])
    _, new = sub.cell(to_tensor(np.asarray(x, dtype)), init)
    new = list(new) if isinstance(new, (list, tuple)) else [new]
    h1 = np.asarray(new[0], np.float64)
    return h1, (np.asarray(new[1], np.float64) if state[1] is not None else None)


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Run layer ``name`` of the written file in tf_keras on ``x`` ``(B, T, I)``; ``(B, T, dirs*H)`` float64.
    The container's ``load`` makes its Keras layers one at a time (memory: one Keras layer plus TensorFlow)."""
    import tensorflow as tf

    layer = ckpt.layer(name)
    dtype, layers = load(path, ckpt, name, None)
    h = tf.convert_to_tensor(np.asarray(x, dtype=dtype))
    for kk, klayer in layers:
        if kk < layer.num_layers - 1:
            h = klayer(h)
        else:
            return run_last(klayer, h, layer.bidirectional)
    raise AssertionError("unreachable")


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load) -> np.ndarray:
    """:func:`forward` for stacked layer ``k`` of layer ``name`` alone, ``x`` its input; output
    ``(B, T, dirs*H)`` float64 in input time order."""
    import tensorflow as tf

    layer = ckpt.layer(name)
    dtype, layers = load(path, ckpt, name, [k])
    for _, klayer in layers:
        y = run_last(klayer, tf.convert_to_tensor(np.asarray(x, dtype=dtype)), layer.bidirectional)
        return y[:, ::-1] if layer.semantics.go_backwards and not layer.bidirectional else y
    raise AssertionError("unreachable")


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """Verification's one-step check: the Keras layer of stacked layer ``k`` of layer ``name``, one step through
    its cell from each state (:func:`cell_step`; a Bidirectional's forward and backward layers each from their
    own states). ``[(h1, c1 or None)]`` per direction, float64."""
    layer = ckpt.layer(name)
    dtype, layers = load(path, ckpt, name, [k])
    for _, klayer in layers:
        subs = [klayer.forward_layer, klayer.backward_layer] if layer.bidirectional else [klayer]
        return [cell_step(sub, x, st, dtype) for sub, st in zip(subs, states)]
    raise AssertionError("unreachable")


RUNTIME = Runtime("tf_keras", engine="tf_keras", forward=forward, forward_slab=forward_slab, step=step,
                  framework_forward=framework_forward)
