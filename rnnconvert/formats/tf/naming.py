"""TensorFlow naming, read by both the readers (:mod:`.tf1_cells`, :mod:`.checkpoint_read`, :mod:`.graph_read`) and
the writers (:mod:`.tf1_write`, :mod:`.tf2_write`): one table for the names of the TF family.

* **TF1 cells** (name-based checkpoints, frozen graphs; LAYOUTS §8, §9): the cell scopes and their default
  run-time ``forget_bias`` (:data:`CELL_SCOPES`), the contrib cells refused by name (:data:`REFUSED`), the
  CudnnRNN saveable scopes (:data:`CUDNN_SCOPES`) with their ``opaque_kernel``, each cell's variable names
  (:data:`KERNEL` ... :data:`CAND_HIDDEN_BIAS`, :func:`peephole`), the old names TF renamed
  (:data:`RENAME`), the stacking and bidirectional scopes (:func:`cell_scope`) and the optimizer slots
  (:data:`OPTIMIZER_SLOT_RE`, :data:`SLOTS`). Sources: ``tensorflow/python/ops/rnn_cell_impl.py``
  (``LSTMCell``: ``kernel``, ``bias``, ``w_{i,f,o}_diag``, ``projection/kernel``; ``GRUCell``:
  ``gates/{kernel,bias}``, ``candidate/{kernel,bias}``; ``MultiRNNCell``: ``cell_<k>``),
  ``tensorflow/contrib/cudnn_rnn/python/ops/cudnn_rnn_ops.py`` (``CudnnCompatibleLSTMCell``/``GRUCell``
  scopes, ``candidate/{input,hidden}_projection``), ``tensorflow/contrib/rnn/python/ops/rnn.py``
  (``stack_bidirectional_rnn/cell_<k>/bidirectional_rnn/{fw,bw}``) and
  ``tensorflow/contrib/rnn/python/tools/checkpoint_convert.py`` (the old names).
* **TF2 object checkpoints** (LAYOUTS §7): a Keras model's weights are saved under the tracked path
  ``layer_with_weights-<n>/.../<variable>`` + :data:`ATTR` (``tf.train.Checkpoint`` names a child by its
  attribute name; Keras' ``Model`` tracks its weighted layers as ``layer_with_weights-<n>``). The names
  below ``layer_with_weights-<n>`` (``cell/kernel``, ``forward_layer/``, ...) are Keras names
  (``formats/keras``).
"""

from __future__ import annotations

import re

from ...core.model import Cell

# ------------------------------------------------------------------------------------------ TF1 cells

#: TF1 cell scopes and their default run-time forget_bias (LAYOUTS §8.1-8.4, §9.1, §9.3).
CELL_SCOPES = {"lstm_cell": 1.0, "basic_lstm_cell": 1.0, "lstm_block_wrapper": 1.0, "lstm_fused_cell": 1.0,
               "cudnn_compatible_lstm_cell": 0.0, "gru_cell": None, "cudnn_compatible_gru_cell": None,
               "basic_rnn_cell": None}
#: Contrib cells refused by name, with the reason (LAYOUTS §16.4; checkpoint_convert.py name list).
REFUSED = {"layer_norm_basic_lstm_cell": "layer normalisation inside the cell",
           "layer_norm_lstm_cell": "layer normalisation inside the cell",
           "nas_cell": "NASCell's searched architecture", "phased_lstm_cell": "PhasedLSTM time gate",
           "ugrnn_cell": "UGRNN update rule", "glstm_cell": "grouped LSTM (GLSTMCell)",
           "conv1d_lstm_cell": "convolutional kernels", "conv2d_lstm_cell": "convolutional kernels",
           "conv_lstm_cell": "convolutional kernels"}
#: CudnnLSTM/CudnnGRU/CudnnRNNTanh/CudnnRNNRelu layer scopes: ``<scope>/opaque_kernel`` is the cuDNN buffer
#: (LAYOUTS §9.3); the saveable also writes canonical companions under the cell scopes above.
CUDNN_SCOPES = {"cudnn_lstm": Cell.LSTM, "cudnn_gru": Cell.GRU, "cudnn_rnn_tanh": Cell.RNN_TANH,
                "cudnn_rnn_relu": Cell.RNN_RELU}
#: the cuDNN opaque buffer's variable name below a :data:`CUDNN_SCOPES` scope
OPAQUE_KERNEL = "opaque_kernel"
#: ``<prefix>/<cell scope>/<variable>`` for every cell scope of :data:`CELL_SCOPES`
CELL_RE = re.compile(r"^(?P<prefix>.*?)(?:^|/)(?P<cell>" + "|".join(CELL_SCOPES) + r")/(?P<var>.+)$")

#: LSTM (``LSTMCell``, ``BasicLSTMCell``, ``LSTMBlockCell``, ``cudnn_compatible_lstm_cell``) and basic RNN cell
#: variables: ``kernel (I+H, G*H)`` (or ``(I+P, 4H)`` with projection), ``bias (G*H,)``
KERNEL, BIAS = "kernel", "bias"
#: LSTMCell ``num_proj``: ``projection/kernel (H, P)``
PROJECTION_KERNEL = "projection/kernel"
#: GRUCell: ``gates/kernel (I+H, 2H)`` columns r, u; ``gates/bias (2H,)``; ``candidate/kernel (I+H, H)``,
#: ``candidate/bias (H,)``
GATES_KERNEL, GATES_BIAS = "gates/kernel", "gates/bias"
CANDIDATE_KERNEL, CANDIDATE_BIAS = "candidate/kernel", "candidate/bias"
#: CudnnCompatibleGRUCell: the candidate's input and hidden projections apart (reset after the matmul)
CAND_INPUT_KERNEL, CAND_INPUT_BIAS = "candidate/input_projection/kernel", "candidate/input_projection/bias"
CAND_HIDDEN_KERNEL, CAND_HIDDEN_BIAS = "candidate/hidden_projection/kernel", "candidate/hidden_projection/bias"


def peephole(gate: str) -> str:
    """LSTMCell ``use_peepholes``: the diagonal peephole of gate ``i``, ``f`` or ``o`` (``w_<g>_diag (H,)``)."""
    return f"w_{gate}_diag"


#: old names -> current: pre-1.0 ``weights``/``biases`` (checkpoint_convert.py), GRUBlockCell (V1) ``w_ru``,
#: ``b_ru``, ``w_c``, ``b_c`` (= GRUCell's gates/candidate variables; LAYOUTS §8.6, §9.2).
RENAME = (("weights", KERNEL), ("biases", BIAS), ("w_ru", GATES_KERNEL), ("b_ru", GATES_BIAS),
          ("w_c", CANDIDATE_KERNEL), ("b_c", CANDIDATE_BIAS))

#: the scopes of stacking and of bidirectional stacks (``MultiRNNCell`` under ``dynamic_rnn``'s ``rnn``;
#: ``stack_bidirectional_rnn``'s per-layer ``bidirectional_rnn/{fw,bw}``)
RNN_SCOPE, MULTI_RNN_CELL, STACK_BIDIRECTIONAL = "rnn", "multi_rnn_cell", "stack_bidirectional_rnn"
BIDIRECTIONAL_RNN, DIRECTIONS = "bidirectional_rnn", ("fw", "bw")
#: ``cell_<k>``: stacked layer ``k`` below :data:`MULTI_RNN_CELL` or :data:`STACK_BIDIRECTIONAL`
STACKED_CELL_RE = re.compile(r"cell_(\d+)")


def cell_scope(base: str, k: int, d: int, cell: str, bidirectional: bool) -> str:
    """The scope of stacked layer ``k``, direction ``d`` of a layer under ``base`` whose cell scope is
    ``cell``: ``<base>/rnn/multi_rnn_cell/cell_<k>/<cell>`` (``MultiRNNCell`` under ``dynamic_rnn``, also for
    one layer) or ``<base>/stack_bidirectional_rnn/cell_<k>/bidirectional_rnn/{fw,bw}/<cell>``."""
    if bidirectional:
        return f"{base}/{STACK_BIDIRECTIONAL}/cell_{k}/{BIDIRECTIONAL_RNN}/{DIRECTIONS[d]}/{cell}"
    return f"{base}/{RNN_SCOPE}/{MULTI_RNN_CELL}/cell_{k}/{cell}"


#: a variable name that is an optimizer slot of a cell variable (``<var>/Adam``, ``Adam_1``, ``Momentum``,
#: ``Adagrad``, ``RMSProp``, ``RMSProp_1``, ``ExponentialMovingAverage``): skipped by the cell reader
OPTIMIZER_SLOT_RE = re.compile(r"(^|/)(Adam(_\d+)?|Momentum|Adagrad|RMSProp(_\d+)?|ExponentialMovingAverage)$")
#: TF1 optimizer slot suffixes of a variable -> the suffix rnnconvert gives the carried tensors.
SLOTS = {"Adam": "adam_m", "Adam_1": "adam_v", "Momentum": "momentum", "RMSProp": "rms", "RMSProp_1": "rms_momentum"}

# ---------------------------------------------------------------------------- TF2 object checkpoints

#: the suffix of a variable's value in a TF2 object checkpoint (``<object path>/.ATTRIBUTES/VARIABLE_VALUE``)
VARIABLE_VALUE = "VARIABLE_VALUE"
ATTR = "/.ATTRIBUTES/" + VARIABLE_VALUE
#: the object path of a Keras model's ``n``-th weighted layer starts with this
LAYER_WITH_WEIGHTS = "layer_with_weights-"


def keras_layer(n: int) -> str:
    """``layer_with_weights-<n>``: the tracked name of a Keras model's ``n``-th weighted layer."""
    return f"{LAYER_WITH_WEIGHTS}{n}"
