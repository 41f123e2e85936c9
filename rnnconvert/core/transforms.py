"""Semantics-preserving rewrites of canonical layers, shared by the writers.

Each function returns a new :class:`~rnnconvert.core.model.RNNLayer` and never changes its argument.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .gates import gate_slice
from .model import Cell, DirectionParams, RNNLayer


def fold_forget_bias(layer: RNNLayer) -> RNNLayer:
    """Add a run-time ``forget_bias`` (TF1 cells) into ``b_ih`` of the forget gate; result has 0.

    One float addition per forget-gate element (exact up to one rounding of ``b_ih[f] + forget_bias``).
    """
    fb = layer.semantics.forget_bias
    if layer.cell is not Cell.LSTM or fb == 0:
        return layer
    sl = gate_slice(Cell.LSTM, "f", layer.hidden_size)
    params = []
    for dirs in layer.params:
        row = []
        for p in dirs:
            b = p.b_ih.copy()
            b[sl] = b[sl] + np.asarray(fb, dtype=b.dtype)
            row.append(replace(p, b_ih=b))
        params.append(row)
    return replace(layer, params=params, semantics=replace(layer.semantics, forget_bias=0.0))


def summed_bias(p: DirectionParams) -> np.ndarray:
    """``b_ih + b_hh`` for a single-bias target (one float rounding per element; exact when one is 0)."""
    return p.b_ih + p.b_hh
