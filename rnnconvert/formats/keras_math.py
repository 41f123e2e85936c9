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
    cud = fam == "keras_cudnn"
    # np.asarray: no copy when the stored dtype is already ``dt`` (multi-GB checkpoints, verification time)
    kern = np.asarray(raw["kernel"], dtype=dt)
    rec = np.asarray(raw["recurrent_kernel"], dtype=dt)
    b = raw.get("bias")
    zero = np.zeros(G * H, dt)
    if b is None:
        bi, br = zero, zero
    elif b.ndim == 2:
        bi, br = np.asarray(b[0], dtype=dt), np.asarray(b[1], dtype=dt)
    elif b.shape[0] == 2 * G * H:
        bi, br = np.asarray(b[: G * H], dtype=dt), np.asarray(b[G * H:], dtype=dt)
    else:
        bi, br = np.asarray(b, dtype=dt), zero
    BI = {g: bi[j * H:(j + 1) * H] for j, g in enumerate(order)}
    BR = {g: br[j * H:(j + 1) * H] for j, g in enumerate(order)}
    sig = ACT["sigmoid"] if cud else ACT[s.gate_activation]
    act = ACT["tanh"] if cud else ACT[s.activation]
    B, T, _ = x.shape
    K = _blocks(kern, order, H, cud)
    R = _blocks(rec, order, H, cud)
    # float64: the input part ``x_t @ K_g`` does not depend on the state and is computed for all steps
    # at once (one pass over the kernel instead of one per step; multi-GB checkpoints). float32 keeps
    # Keras' order of operations step by step (float32 results match tf_keras/Keras 2 graphs bit for
    # bit, e.g. tests/test_realworld_keras.py; BLAS sums differently for a (B*T, in) product).
    XK = {g: x @ K[g] for g in order} if dt == np.float64 else None

    def xK(g: str, t: int) -> np.ndarray:
        return XK[g][:, t] if XK is not None else x[:, t] @ K[g]

    h = np.zeros((B, H), dt)
    c = np.zeros((B, H), dt)
    ys = np.zeros((B, T, H), dt)
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        if cell is Cell.LSTM:
            pre = {g: xK(g, t) + BI[g] + h @ R[g] + BR[g] for g in "ifgo"}
            c = sig(pre["f"]) * c + sig(pre["i"]) * act(pre["g"])
            h = sig(pre["o"]) * act(c)
        elif cell is Cell.GRU:
            z = sig(xK("z", t) + BI["z"] + h @ R["z"] + BR["z"])
            r = sig(xK("r", t) + BI["r"] + h @ R["r"] + BR["r"])
            if s.reset_after:
                hh = act(xK("n", t) + BI["n"] + r * (h @ R["n"] + BR["n"]))
            else:
                hh = act(xK("n", t) + BI["n"] + (r * h) @ R["n"])
            h = z * h + (1 - z) * hh
        else:
            h = act(xK("h", t) + BI["h"] + h @ R["h"] + BR["h"])
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
