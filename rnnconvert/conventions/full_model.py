"""A whole Keras model as a whole-model reader finds it (:class:`FullModel`: config, weights, the framework that
runs it) and the layer classes the whole-model writers build (:data:`LAYERS`; the writers refuse every other
class by name with :data:`WAY_OUT`). Readers of every family return it (Keras 1/2 HDF5, Keras 3 ``.keras``,
tf_keras SavedModel folders); the whole-model compiler (:mod:`rnnconvert.whole.conventions.keras_graph`)
turns it into a graph. No framework is imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.model import Checkpoint, RNNLayer

#: the recurrent classes (CuDNN ones are read by the canonical reader with their fixed activations)
RECURRENT = ("LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU")
#: identity at inference (tf_keras: noise and dropout only in training; an activity penalty)
IDENTITY = ("Dropout", "SpatialDropout1D", "GaussianNoise", "GaussianDropout", "AlphaDropout",
            "ActivityRegularization")
MERGE = ("Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")
#: every class the whole-model writers build
LAYERS = set(RECURRENT) | set(IDENTITY) | set(MERGE) | {
    "InputLayer", "Embedding", "Masking", "Dense", "Activation", "Conv1D", "MaxPooling1D", "AveragePooling1D",
    "GlobalMaxPooling1D", "GlobalAveragePooling1D", "Flatten", "Reshape", "Permute", "RepeatVector",
    "BatchNormalization", "LayerNormalization", "TimeDistributed", "Bidirectional", "ReLU", "LeakyReLU", "ELU",
    "Softmax", "ZeroPadding1D", "Cropping1D"}
#: 2-D convolution and pooling, channels_last (issue #30; the writers transpose to NCHW around each op)
LAYERS |= {"Conv2D", "MaxPooling2D", "AveragePooling2D", "GlobalMaxPooling2D", "GlobalAveragePooling2D"}
#: dot-product / concat and additive attention (issue #41; tf_keras ``layers/attention/``, keras 3
#: ``layers/attention/``): ``[query, value(, key)]``, masks of query and value, the causal mask, the scores
ATTENTION = ("Attention", "AdditiveAttention")
LAYERS |= set(ATTENTION)
#: multi-head attention over the time axis (issue #41; tf_keras ``layers/attention/multi_head_attention.py``,
#: keras 3 ``layers/attention/multi_head_attention.py``): ``[query, value(, key)]``, masks of all three, the causal
#: mask, the scores
MHA = ("MultiHeadAttention",)
LAYERS |= set(MHA)
#: elementwise and repeat layers real models use (issue #41; tf_keras / keras 3 ``call``): ``PReLU``
#: (``shared_axes``), ``Rescaling`` (``x * scale + offset``), ``UnitNormalization`` (last axis), ``UpSampling1D``,
#: ``EinsumDense`` (one kernel, a checked equation)
SMALL = ("PReLU", "Rescaling", "UnitNormalization", "UpSampling1D", "EinsumDense")
LAYERS |= set(SMALL)
#: layers whose output carries their input's mask (tf_keras 2.21, checked in tests/test_whole_graph.py)
MASK_PASS = set(IDENTITY) | {"Dense", "Activation", "BatchNormalization", "LayerNormalization", "TimeDistributed",
                             "ReLU", "LeakyReLU", "ELU", "Softmax", "Masking", "PReLU", "UnitNormalization"} | set(ATTENTION) | set(MHA)
#: ^ attention: the query's mask; Rescaling hands its mask on in Keras 3 only (tf_keras' does not support masking)
#: Keras 2 activations the writers build (tf_keras ``activations.py``: hard_sigmoid = clip(0.2 x + 0.5, 0, 1));
#: ``hard_sigmoid_k3`` is Keras 3's ``hard_sigmoid`` = relu6(x + 3) / 6 = clip(x / 6 + 0.5, 0, 1) (keras 3
#: ``activations.py``; a Keras 3 config's 'hard_sigmoid' is read as it, :func:`build_keras3`)
ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh", "softmax", "softplus", "softsign", "elu", "selu",
               "exponential", "hard_sigmoid", "hard_sigmoid_k3")
#: how every whole-model refusal ends
WAY_OUT = "write option recurrent_only=True (CLI --recurrent-only) converts the recurrent layers alone"


@dataclass
class FullModel:
    """A Keras full model as a whole-model reader found it: its config (a ``model_config`` as a Keras 1/2
    HDF5 file stores it, or a Keras 3 ``config.json``), Keras version and every layer's stored weights.

    Readers: :func:`rnnconvert.formats.keras.keras_whole.read_full_model` (Keras 1/2 HDF5),
    :func:`rnnconvert.formats.keras.keras3.read_full_model` (Keras 3 ``.keras``),
    :func:`rnnconvert.formats.tf.savedmodel_keras.read_full_model` (tf.keras / tf_keras SavedModel folders)."""

    path: str
    config: dict[str, Any]
    keras_version: str | None
    #: top-level layer name -> [(weight name, array)] in ``@weight_names`` order (tf_keras ``layer.weights``:
    #: trainable then non-trainable, each in creation order)
    weights: dict[str, list[tuple[str, np.ndarray]]] = field(default_factory=dict)
    #: the framework that runs the source: ``tf_keras`` (Keras 1/2 HDF5, tf_keras SavedModel) or ``keras3`` (a
    #: Keras 3 ``.keras`` archive, :func:`rnnconvert.formats.keras.keras3.read_full_model`)
    framework: str = "tf_keras"
    #: where the weights come from: ``'file'`` (tf_keras loads the file itself for verification) or
    #: ``'weights'`` (a SavedModel: tf_keras rebuilds the model from ``config`` and is given ``weights``; the
    #: SavedModel's traced functions are never loaded)
    origin: str = "file"
    #: the checkpoint's recurrent layer name -> the Keras layer path (a SavedModel's checkpoint names its layers
    #: by object path, ``layer_with_weights-1``; the whole-model graph by Keras name, ``bilstm``)
    layer_names: dict[str, str] = field(default_factory=dict)
    #: the recurrent layers read with the model's config (a SavedModel: its checkpoint reader knows no config, so
    #: takes TF2 defaults for activations, ``return_sequences``, ``merge_mode``); ``None``: the checkpoint's stand
    layers: list[RNNLayer] | None = None

    def renamed(self, ckpt: Checkpoint) -> Checkpoint:
        """``ckpt`` with its recurrent layers as the Keras config makes them (:attr:`layers`, named by their Keras
        names; :attr:`layer_names` maps the checkpoint's names to them); ``ckpt`` itself when there is nothing to
        replace (HDF5 and ``.keras`` sources, or a checkpoint replaced already).

        Raises:
            FormatError: the config's recurrent layers are not the checkpoint's (other names or count)."""
        from dataclasses import replace

        from ..errors import FormatError

        if self.layers is None or not any(lay.name in self.layer_names for lay in ckpt.layers):
            return ckpt
        mine = [lay.name for lay in self.layers]
        theirs = [self.layer_names.get(lay.name, lay.name) for lay in ckpt.layers]
        if sorted(mine) != sorted(theirs):
            raise FormatError(f"{self.path}: the model config's recurrent layers ({', '.join(mine)}) are not the "
                              f"checkpoint's ({', '.join(theirs)})")
        return replace(ckpt, layers=list(self.layers))
