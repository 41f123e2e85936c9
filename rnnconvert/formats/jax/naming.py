"""Flax's parameter names for its recurrent cells (``flax/linen/recurrent.py``, ``flax/nnx/nn/recurrent.py``,
flax 0.12.8), read by :mod:`.msgpack_read`.

Every kernel is a ``Dense``/``Linear`` kernel ``(in, out)`` applied as ``x @ kernel``:

* linen ``LSTMCell`` / ``OptimizedLSTMCell`` (same parameters) and NNX ``LSTMCell``: one Dense per gate, input
  side ``ii if ig io`` (NNX ``if_``, as ``if`` is a Python keyword) without bias, hidden side ``hi hf hg ho`` with
  bias; ``i = sigmoid(x W_ii + h W_hi + b_hi)``, ..., ``c' = f c + i g``, ``h' = o tanh(c')``.
* linen ``GRUCell``: ``ir iz in`` with bias, ``hr hz`` without, ``hn`` with bias;
  ``n = tanh(x W_in + b_in + r (h W_hn + b_hn))``, ``h' = (1 - z) n + z h`` (PyTorch's GRU equation).
* linen ``SimpleCell``: ``i`` with bias, ``h`` without; ``h' = tanh(x W_i + b_i + h W_h)``.
* NNX ``OptimizedLSTMCell``: ``dense_i`` ``(I, 4H)`` no bias, ``dense_h`` ``(H, 4H)`` with bias, gates
  ``i f g o``; NNX ``GRUCell``: ``dense_i`` ``(I, 3H)`` with bias, ``dense_h`` ``(H, 3H)`` without (so no
  ``b_hn``), gates ``r z n``; NNX ``SimpleCell``: ``dense_i`` with bias, ``dense_h`` without.
* ``MGUCell`` (``if in hf hn``): no target format computes it (refused).
* ``nn.RNN(cell)`` / ``nnx.RNN(cell)`` put the cell's parameters under ``cell``; ``nn.Bidirectional``
  under ``forward_rnn``/``backward_rnn`` (the backward one run with ``reverse=True, keep_order=True``, the two
  outputs merged by ``merge_fn``, concatenation by default: not stored); ``nn.Sequential`` names its
  sub-modules ``layers_0``, ``layers_1``, ... (applied in that order: read as one stacked layer).
"""

from __future__ import annotations

#: per-gate Dense names of the LSTM cells, in canonical gate order i f g o: (input side, hidden side)
LSTM_GATES = (("ii", "hi"), ("if", "hf"), ("ig", "hg"), ("io", "ho"))
#: NNX spells the input forget Dense ``if_``
NNX_ALIASES = {"if_": "if"}
#: linen GRUCell, canonical order r z n
GRU_GATES = (("ir", "hr"), ("iz", "hz"), ("in", "hn"))
#: linen SimpleCell
SIMPLE = ("i", "h")
#: linen MGUCell (refused)
MGU = frozenset({"if", "in", "hf", "hn"})
#: NNX fused cells
FUSED = ("dense_i", "dense_h")
#: the sub-module names nn.RNN / nn.Bidirectional give
CELL, FORWARD, BACKWARD = "cell", "forward_rnn", "backward_rnn"
#: ``nn.Sequential``'s sub-module names: stacked layers ``layers_0``, ``layers_1``, ... applied in order
LAYERS = "layers_"
