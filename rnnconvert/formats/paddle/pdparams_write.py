"""The PaddlePaddle ``.pdparams`` writer: a state dict that ``paddle.nn.LSTM``/``GRU``/``SimpleRNN``
``set_state_dict(paddle.load(path))`` loads -- every parameter under its per-cell name and under the flat alias
``RNNBase`` gives it (:mod:`.naming`, including the shift a projection causes), pickled (protocol 4) as
``paddle.save`` pickles them: a dict of numpy arrays, names in ``state_dict()`` order (flat aliases, then the
cells'). The arrays are rnnconvert's own (the writer pickles nothing it read from a file as an object).

Arrays: ``weight_ih = w_ih``, ``weight_hh = w_hh``, ``bias_ih = b_ih``, ``bias_hh = b_hh`` (gate orders equal
PyTorch's: a copy), ``weight_ho = w_hr.T`` ``(H, P)``. Refused (:func:`refusals`): what the PyTorch equations
cannot compute (``core/cudnn.refusals``; Paddle's cells compute the same), except that a projection is written.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ...core import cudnn, gates
from ...core.model import Cell, Checkpoint, RNNLayer
from ...engine import refusal
from . import naming

#: the report's target side when Paddle runs the file (without Paddle: rnnconvert.runtimes.paddle.FALLBACK_ROUTE)
ROUTE = "paddle.nn layers loading the written file (paddle.load)"
CLASS = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "SimpleRNN", Cell.RNN_RELU: "SimpleRNN"}


def refusals(layer: RNNLayer) -> list[str]:
    """What ``paddle.nn`` cannot compute about ``layer`` (empty when it can)."""
    return cudnn.refusals(layer)


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse what ``paddle.nn`` cannot express; notes for a relu SimpleRNN (its activation is not saved).

    Raises:
        UnsupportedError (:class:`rnnconvert.engine.refusal.Refused`)."""
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "paddle", f"paddle.nn.{CLASS[layer.cell]}")
        if layer.cell is Cell.RNN_RELU:
            notes.append(f"{layer.name}: build it as paddle.nn.SimpleRNN(..., activation='relu'): the activation "
                         "is not saved")
    return notes


def state_dict(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The Paddle state dict of ``ckpt`` (module docstring), in ``state_dict()`` order."""
    out: dict[str, np.ndarray] = {}
    for i, layer in enumerate(ckpt.layers):
        pre = f"{layer.name}."
        cv = gates.convention("paddle", layer.cell)
        cells, plist = {}, []
        for k in range(layer.num_layers):
            for d, p in enumerate(ckpt.slab(i, k)):
                t = {"weight_ih": gates.from_canonical(p.w_ih, cv, layer.cell),
                     "weight_hh": gates.from_canonical(p.w_hh, cv, layer.cell)}
                if layer.bias:
                    t["bias_ih"] = gates.vec_from_canonical(p.b_ih, cv, layer.cell)
                    t["bias_hh"] = gates.vec_from_canonical(p.b_hh, cv, layer.cell)
                if layer.proj_size:
                    t["weight_ho"] = np.ascontiguousarray(p.w_hr.T)
                for n, a in t.items():
                    cells[naming.cell_key(pre, k, d, layer.bidirectional, n)] = a
                plist += list(t.values())
        flat = naming.flat_names(pre, layer.num_layers, layer.num_directions, layer.bias, layer.bias)
        out.update(zip(flat, plist))  # RNNBase.__init__: zip(param_names, self.parameters())
        out.update(cells)
    for key, arr in ckpt.tensors.items():
        out.setdefault(key, np.asarray(arr))
    return out


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as a ``.pdparams`` (module docstring); one line per layer names the Paddle layer to build.
    Assumes :func:`check` passed."""
    data = pickle.dumps(state_dict(ckpt), protocol=4)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return [f"{layer.name}: paddle.nn.{CLASS[layer.cell]}({layer.input_size}, {layer.hidden_size}, "
            f"num_layers={layer.num_layers}" + (", direction='bidirect'" if layer.bidirectional else "")
            + (f", proj_size={layer.proj_size}" if layer.proj_size else "")
            + ("" if layer.bias else ", bias_ih_attr=False, bias_hh_attr=False")
            + f") under '{layer.name}'; layer.set_state_dict(paddle.load(path))" for layer in ckpt.layers]
