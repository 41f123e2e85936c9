"""The source side of ``--verify framework`` for Keras HDF5 files: tf_keras itself runs the layer.

tf_keras is imported inside :func:`framework_forward` only. Each direction of a layer is rebuilt as a
tf_keras layer from the file's layer config (weights-only files: from the layer kind, sizes and
semantics the reader found); the file's own tensors go through tf_keras' legacy HDF5 loader conversion
(``tf_keras/src/saving/legacy/hdf5_format.py`` ``preprocess_weights_for_loading``: Keras-1 per-gate
tensors, CuDNN kernels and biases, LAYOUTS.md §1.1-1.2, §4.4) and ``set_weights``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import UnsupportedError
from ...core.model import Checkpoint, RNNLayer


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
        cfg = {**cfg, **over}
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

    from ...errors import require

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
