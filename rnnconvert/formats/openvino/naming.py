"""OpenVINO IR names shared by the IR reader and writer: the sequence operations, their input ports, the files
of the folder rnnconvert writes, and the graph names of a written layer.

Sources: OpenVINO opset specifications ``LSTMSequence-5``, ``GRUSequence-5``, ``RNNSequence-5``
(docs.openvino.ai, "Operation Specifications"): inputs in order ``X [batch, seq, input]``, ``initial_hidden_state
[batch, num_directions, hidden]``, (LSTM) ``initial_cell_state``, ``sequence_lengths [batch]``, ``W [num_directions,
G*H, input]``, ``R [num_directions, G*H, H]``, ``B [num_directions, G*H]`` (GRU with ``linear_before_reset``:
``4*H``); gates LSTM ``f, i, c, o``, GRU ``z, r, h``.
"""

from __future__ import annotations

import re

#: op type -> (cell class name, index of the W input; R and B follow)
SEQUENCE_OPS = {"LSTMSequence": ("LSTM", 4), "GRUSequence": ("GRU", 3), "RNNSequence": ("RNN", 3)}
#: the files of a folder rnnconvert writes
XML, BIN = "model.xml", "model.bin"


def node_name(layer: str, num_layers: int, k: int) -> str:
    """The friendly name rnnconvert's writer gives the sequence node of stacked layer ``k`` of ``layer``."""
    return layer if num_layers == 1 else f"{layer}.l{k}"


def input_name(layer: str) -> str:
    """The graph input (a ``Parameter`` ``[batch, seq, input]``) of a written layer."""
    return f"{layer}__in"


def output_name(layer: str) -> str:
    """The graph output (``[batch, seq, num_directions * H]``) of a written layer."""
    return f"{layer}__out"


def layer_name(friendly: str) -> str:
    """A canonical layer name for a node's friendly name: characters other than letters, digits, ``_`` and
    ``.`` become ``_`` (``aten::lstm/LSTMSequence`` -> ``aten__lstm_LSTMSequence``)."""
    return re.sub(r"[^0-9A-Za-z_.]", "_", friendly).strip("_.") or "rnn"
