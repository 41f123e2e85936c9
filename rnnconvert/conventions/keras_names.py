"""Keras naming: the class names of recurrent layers and wrappers, the names and order of their weights
in every Keras (1, 2, tf.keras / tf_keras, 3), and the gate convention each form stores. One table, read
by the readers (:mod:`.keras_interpreter`, :mod:`rnnconvert.formats.keras.keras3`, :mod:`rnnconvert.formats.keras.keras_whole`), the writers
(:mod:`rnnconvert.formats.keras.h5_write`, :mod:`rnnconvert.formats.keras.keras3`, :mod:`rnnconvert.formats.tf.tf2_write`) and the config
translation (:mod:`rnnconvert.formats.keras.keras_config`).

Sources (``docs/LAYOUTS.md`` §§1-6): keras 1.2.2 ``keras/layers/recurrent.py`` (per-gate weights,
``consume_less``); keras 2.x / tf_keras ``layers/rnn/lstm.py``, ``gru.py``, ``simple_rnn.py``,
``cudnn_lstm.py``, ``cudnn_gru.py`` (``build``: ``kernel``, ``recurrent_kernel``, ``bias``), tf_keras
``saving/legacy/hdf5_format.py`` (``weight_names``, ``preprocess_weights_for_loading``); keras 3.15
``src/saving/saving_lib.py`` (``vars/N`` store, snake_case keys). Each fact is checked against the real
framework in ``tests/formats/keras_files/test_keras_fixtures.py`` (files made by tf_keras / Keras 1 / Keras 2 through
``fixtures/gen_keras.py``), ``tests/formats/keras_files/test_keras3.py`` (Keras 3) and ``tests/formats/keras_files/test_keras_h5_write.py``.
"""

from __future__ import annotations

import re

from ..core import gates
from ..core.model import Cell

# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

#: A recurrent layer's weights, in the order every Keras builds, saves and ``set_weights`` them (Keras 3:
#: ``cell/vars/0, 1, 2``); ``bias`` absent with ``use_bias=False``.
KERNEL, RECURRENT_KERNEL, BIAS = "kernel", "recurrent_kernel", "bias"
WEIGHTS = (KERNEL, RECURRENT_KERNEL, BIAS)
#: Dense and Embedding weights (non-recurrent tensors kept under PyTorch names by the readers).
DENSE_WEIGHTS = ("kernel", "bias")
EMBEDDING_WEIGHTS = ("embeddings",)


def base_name(wname: str) -> str:
    """The weight's own name from a stored weight name: ``'lstm/lstm_cell/kernel:0'`` -> ``'kernel'``."""
    return wname.rsplit("/", 1)[-1].split(":")[0]


#: Keras 1 ``consume_less='cpu'/'mem'`` LSTM/GRU: per gate ``<layer>_W_<g>``, ``<layer>_U_<g>``,
#: ``<layer>_b_<g>`` (input, recurrent, bias), gates in this saved order (12 and 9 tensors).
KERAS1_PARTS = ("W", "U", "b")
KERAS1_GATES = {"LSTM": "icfo", "GRU": "zrh"}
#: Keras 1 3-tensor layers (SimpleRNN, LSTM ``consume_less='gpu'``): ``<layer>_W``, ``<layer>_U``,
#: ``<layer>_b``; Keras 1 Dense: ``<layer>_W``, ``<layer>_b``.
KERAS1_RECURRENT = re.compile(r"(^|_)U$")
KERAS1_DENSE = (re.compile(r"(^|_)W$"), re.compile(r"(^|_)b$"))


def keras1_kind(bases: list[str]) -> str | None:
    """``'LSTM'``/``'GRU'`` when the weights' base names are Keras 1's per-gate triples (all 12 / 9 of them
    ending ``_W_<g>``/``_U_<g>``/``_b_<g>`` with the kind's gate letters), else ``None``."""
    for kind, letters in KERAS1_GATES.items():
        if len(bases) == 3 * len(letters) and all(re.search(rf"_[WUb]_[{letters}]$", b) for b in bases):
            return kind
    return None


def keras1_part(base: str) -> str:
    """``'W'``, ``'U'`` or ``'b'`` of a Keras 1 per-gate base name (``'lstm_1_W_i'`` -> ``'W'``)."""
    return base[-3]


# --------------------------------------------------------------------------------------------
# Classes
# --------------------------------------------------------------------------------------------

#: Recurrent layer classes read (``*V1``: tf.keras 2.x's names of the TF1-style layers).
RNN_CLASSES = {"LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU", "LSTMV1", "GRUV1", "CuDNNLSTMV1"}
#: Class names read as another class's layer.
CLASS_ALIASES = {"LSTMV1": "LSTM", "GRUV1": "GRU"}
#: The Keras 2 class of each cell (the plain form; both simple-RNN activations are ``SimpleRNN``).
KERAS_CLASS = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "SimpleRNN", Cell.RNN_RELU: "SimpleRNN"}
#: The CuDNN form (tf_keras ``cudnn_lstm.py``/``cudnn_gru.py``: sigmoid/tanh, two biases; GRU reset-after).
CUDNN_CLASS = {Cell.LSTM: "CuDNNLSTM", Cell.GRU: "CuDNNGRU"}
#: CuDNN class -> the plain class that computes the same (GRU with ``reset_after=True``).
CUDNN_TWIN = {"CuDNNLSTM": "LSTM", "CuDNNGRU": "GRU"}
#: ``keras.layers.RNN(cell)``: cell class -> the layer read.
CELL_CLASSES = {"LSTMCell": "LSTM", "GRUCell": "GRU", "SimpleRNNCell": "SimpleRNN"}
#: Containers whose layers are read in turn, and the wrappers.
CONTAINERS = ("Sequential", "Model", "Functional")
BIDIRECTIONAL, TIME_DISTRIBUTED, RNN_WRAPPER = "Bidirectional", "TimeDistributed", "RNN"
#: Weight-name prefixes of a Bidirectional's two layers (``forward_lstm/...``, ``backward_lstm/...``).
FORWARD_PREFIX, BACKWARD_PREFIX = "forward_", "backward_"


def class_name(cell: Cell, cudnn: bool = False) -> str:
    """The Keras 2 class written for ``cell`` (``cudnn``: the CuDNN form; LSTM/GRU only)."""
    return CUDNN_CLASS[cell] if cudnn else KERAS_CLASS[cell]


# --------------------------------------------------------------------------------------------
# Keras 3 weights store (keras 3.15 src/saving/saving_lib.py)
# --------------------------------------------------------------------------------------------

#: A layer's variables: datasets ``vars/0, vars/1, ...`` of its group (user name: ``@name`` of ``vars``).
K3_VARS = "vars"
#: An RNN layer's cell group, and a Bidirectional's two layer groups.
K3_CELL, K3_FORWARD, K3_BACKWARD = "cell", "forward_layer", "backward_layer"
#: Store key (snake_case class name, ``_N`` made unique) -> class.
K3_STORE_CLASS = {"lstm": "LSTM", "gru": "GRU", "simple_rnn": "SimpleRNN", "bidirectional": "Bidirectional",
                  "dense": "Dense", "embedding": "Embedding", "sequential": "Sequential",
                  "functional": "Functional", "time_distributed": "TimeDistributed"}
#: The cell's name in a recurrent layer's weight names (``lstm/lstm_cell/kernel``).
CELL_NAME = {"LSTM": "lstm_cell", "GRU": "gru_cell", "SimpleRNN": "simple_rnn_cell"}


# --------------------------------------------------------------------------------------------
# Gate conventions (rnnconvert.core.gates.TABLE)
# --------------------------------------------------------------------------------------------

#: The stored forms: ``keras`` (Keras 2/3, tf.keras), ``keras1`` (Keras 1 per-gate tensors joined),
#: ``keras_cudnn`` (CuDNNLSTM/CuDNNGRU kernels holding cuDNN's bytes).
FORMS = ("keras", "keras1", "keras_cudnn")


def convention(cell: Cell, reset_after: bool, form: str = "keras") -> gates.Convention:
    """The :class:`~rnnconvert.core.gates.Convention` of a Keras layer's tensors: ``form`` (see
    :data:`FORMS`), except a plain reset-after GRU, whose bias is ``(2, 3H)`` (``keras_ra``: row 0 input,
    row 1 recurrent; tf_keras ``gru.py``). The one place this choice is made (readers and writers)."""
    if form == "keras" and cell is Cell.GRU and reset_after:
        return gates.convention("keras_ra", cell)
    return gates.convention(form, cell)


# ---------------------------------------------------------------------------- tf.keras / tf_keras SavedModels

#: ``keras_metadata.pb`` beside ``saved_model.pb`` (tf_keras ``saving/legacy/saved_model/save.py``,
#: ``constants.SAVED_METADATA_PATH``): ``SavedMetadata {repeated SavedObject nodes = 1}``, ``SavedObject {int32
#: node_id = 2; string node_path = 3; string identifier = 4; string metadata = 5 (JSON); VersionDef version =
#: 6}`` (tf_keras ``protobuf/saved_metadata.proto``; field 1 reserved)
SAVED_METADATA = "keras_metadata.pb"
SAVED_NODES, SAVED_NODE_ID, SAVED_NODE_PATH, SAVED_IDENTIFIER, SAVED_METADATA_JSON = 1, 2, 3, 4, 5
#: the model's node path and the tracked names of a model's layers in a SavedModel's object graph (tf_keras
#: ``engine/functional.py`` ``_layer_checkpoint_dependencies``: ``layer_with_weights-<i>`` for the i-th layer with weights,
#: ``layer-<j>`` for the others)
SAVED_ROOT = "root"
#: the sort rank of each path component of a layer's variable in a SavedModel checkpoint
#: (``<layer>/[forward_layer|backward_layer/][cell/|layer/]<variable>``), giving tf_keras' ``layer.weights``
#: order = the HDF5 ``weight_names`` order: the forward layer before the backward one; a recurrent cell's
#: kernel, recurrent_kernel, bias; Dense/Conv kernel, bias; BatchNormalization gamma, beta (trainable) then
#: moving_mean, moving_variance (tf_keras ``layers/normalization/batch_normalization.py`` ``build``)
SAVED_WEIGHT_RANK = {"forward_layer": 0, "backward_layer": 1, "cell": 0, "layer": 0,
                     "kernel": 0, "embeddings": 0, "gamma": 0, "depthwise_kernel": 0,
                     "recurrent_kernel": 1, "beta": 1, "pointwise_kernel": 1,
                     "bias": 2, "moving_mean": 2, "moving_variance": 3}


def saved_weight_key(parts: list[str]) -> list[tuple[int, int]] | None:
    """The sort key of a variable's object path below its top-level layer (``parts``, e.g. ``['forward_layer',
    'cell', 'kernel']``): nested layers ``layer_with_weights-<i>`` by ``i``, the other components by
    :data:`SAVED_WEIGHT_RANK`; ``None`` for a component outside both (a variable the whole-model reader does
    not know how to order)."""
    key = []
    for p in parts:
        if p.startswith("layer_with_weights-") and p[len("layer_with_weights-"):].isdigit():
            key.append((0, int(p[len("layer_with_weights-"):])))
        elif p in SAVED_WEIGHT_RANK:
            key.append((1, SAVED_WEIGHT_RANK[p]))
        else:
            return None
    return key


def untuple(obj):
    """A SavedModel metadata config with tf_keras' tuple encoding (``{"class_name": "__tuple__", "items":
    [...]}``, tf_keras ``saving/legacy/saved_model/json_utils.py``) turned into plain lists, as a full-model
    HDF5 file's ``model_config`` holds them."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__tuple__" and isinstance(obj.get("items"), list) and len(obj) == 2:
            return [untuple(v) for v in obj["items"]]
        return {k: untuple(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [untuple(v) for v in obj]
    return obj
