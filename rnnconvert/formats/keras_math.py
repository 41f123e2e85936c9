"""Keras equations on Keras tensors: the source side of verification for Keras files.

Deliberately independent of the conversion code: it never calls :mod:`rnnconvert.gates`'
permutations or the canonical parameters; it slices the tensors exactly as they sit in the file
and applies the equations of the Keras source (tf_keras ``layers/rnn/lstm.py``, ``gru.py``,
``simple_rnn.py``; CuDNN layers: the cuDNN equations on slices whose bytes are cuDNN's
``(H, in)`` row-major matrices, tf_keras ``cudnn_lstm.py``/``cudnn_gru.py``). It only reads the
gate *letters* of each format from the table in :mod:`rnnconvert.gates`.
"""

from __future__ import annotations

import numpy as np

from ..gates import convention
from ..model import Cell, RNNLayer
from ..reference import ACT


def _blocks(m: np.ndarray, order: str, H: int, cudnn: bool) -> dict[str, np.ndarray]:
    """Column slices of a Keras kernel ``(in, G*H)`` by gate letter, as ``(in, H)`` matrices used as ``x @ K``."""
    out = {}
    for j, g in enumerate(order):
        s = m[:, j * H:(j + 1) * H]
        # CuDNN layers: the slice's bytes are cuDNN's (H, in) matrix applied as M x, i.e. x @ M.T.
        out[g] = np.ascontiguousarray(s).reshape(H, m.shape[0]).T if cudnn else s
    return out


def _direction(kind: str, cell: Cell, raw: dict, layer: RNNLayer, x: np.ndarray, reverse: bool, dt) -> np.ndarray:
    s = layer.semantics
    fam = "keras_cudnn" if kind.startswith("CuDNN") else layer.source.get("family", "keras")
    if fam == "keras1":
        fam_conv = convention("keras1", cell)
    else:
        fam_conv = convention("keras_cudnn" if fam == "keras_cudnn" else "keras", cell)
    order = fam_conv.gate_order
    H = layer.hidden_size
    G = cell.gates
    K = _blocks(raw["kernel"].astype(dt), order, H, fam == "keras_cudnn")
    R = _blocks(raw["recurrent_kernel"].astype(dt), order, H, fam == "keras_cudnn")
    b = raw.get("bias")
    zero = np.zeros(G * H, dt)
    if b is None:
        bi, br = zero, zero
    elif b.ndim == 2:
        bi, br = b[0].astype(dt), b[1].astype(dt)
    elif b.shape[0] == 2 * G * H:
        bi, br = b[: G * H].astype(dt), b[G * H:].astype(dt)
    else:
        bi, br = b.astype(dt), zero
    BI = {g: bi[j * H:(j + 1) * H] for j, g in enumerate(order)}
    BR = {g: br[j * H:(j + 1) * H] for j, g in enumerate(order)}
    sig = ACT["sigmoid"] if fam == "keras_cudnn" else ACT[s.gate_activation]
    act = ACT["tanh"] if fam == "keras_cudnn" else ACT[s.activation]
    B, T, _ = x.shape
    h = np.zeros((B, H), dt)
    c = np.zeros((B, H), dt)
    ys = np.zeros((B, T, H), dt)
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        xt = x[:, t]
        if cell is Cell.LSTM:
            pre = {g: xt @ K[g] + BI[g] + h @ R[g] + BR[g] for g in "ifgo"}
            c = sig(pre["f"]) * c + sig(pre["i"]) * act(pre["g"])
            h = sig(pre["o"]) * act(c)
        elif cell is Cell.GRU:
            z = sig(xt @ K["z"] + BI["z"] + h @ R["z"] + BR["z"])
            r = sig(xt @ K["r"] + BI["r"] + h @ R["r"] + BR["r"])
            if s.reset_after:
                hh = act(xt @ K["n"] + BI["n"] + r * (h @ R["n"] + BR["n"]))
            else:
                hh = act(xt @ K["n"] + BI["n"] + (r * h) @ R["n"])
            h = z * h + (1 - z) * hh
        else:
            h = act(xt @ K["h"] + BI["h"] + h @ R["h"] + BR["h"])
        ys[:, n_step if reverse and not layer.bidirectional else t] = h
    return ys


def source_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Run a Keras-file layer from its raw Keras tensors; same output convention as
    :func:`rnnconvert.reference.forward` (directions concatenated, merge not applied)."""
    raws = layer.source["raw"]
    kind = layer.source["class_name"]
    x = np.asarray(x, dtype=dtype)
    if layer.bidirectional:
        return np.concatenate([_direction(kind, layer.cell, raws[0], layer, x, False, dtype),
                               _direction(kind, layer.cell, raws[1], layer, x, True, dtype)], axis=-1)
    return _direction(kind, layer.cell, raws[0], layer, x, layer.semantics.go_backwards, dtype)
