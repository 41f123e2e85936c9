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
from ..reference import ACT, rows_product


#: Kernels of at least this many bytes are evaluated with the input products of all steps hoisted
#: into one product per gate (one pass over the kernel instead of one per step) in float32 too.
#: Smaller layers keep Keras' step-by-step order in float32, which reproduces a Keras 2 graph bit for
#: bit (tests/test_realworld_keras.py); for large ones float32 serves only the tolerance's measure of
#: rounding spread, where the order of a sum does not matter.
HOIST_BYTES = 4 << 20


def _block(m: np.ndarray, j: int, H: int, cudnn: bool, dt) -> np.ndarray:
    """Gate block ``j`` of a Keras kernel ``(in, G*H)`` as the ``(in, H)`` matrix ``K_g`` of ``x @ K_g``
    (a view for plain layers: Keras' own products, step by step)."""
    s = m[:, j * H:(j + 1) * H]
    if cudnn:  # the slice's bytes are cuDNN's (H, in) matrix applied as M x, i.e. x @ M.T
        return np.ascontiguousarray(s).reshape(H, m.shape[0]).astype(dt, copy=False).T
    return np.asarray(s, dtype=dt)


def _block_t(m: np.ndarray, j: int, H: int, cudnn: bool, dt) -> np.ndarray:
    """``K_g.T`` of :func:`_block`, C-contiguous ``(H, in)`` in ``dt``: the products are then computed as
    ``(K_g.T @ x.T).T``, which BLAS does 3-4x faster than ``x @ K_g`` for a few rows ``x`` (no packing of
    the big matrix). The turn is copied in tiles of 16 source rows, cast on the way (one pass)."""
    s = m[:, j * H:(j + 1) * H]
    if cudnn:
        return np.ascontiguousarray(s).reshape(H, m.shape[0]).astype(dt, copy=False)
    out = np.empty((H, m.shape[0]), dt)
    for i in range(0, m.shape[0], 16):
        out[:, i:i + 16] = s[i:i + 16].T
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
    kern = np.asarray(raw["kernel"])
    rec = np.asarray(raw["recurrent_kernel"])
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
    # float64 (and float32 for kernels of HOIST_BYTES or more): the input part ``x_t @ K_g`` does not
    # depend on the state and is computed for all steps at once, one gate block at a time (each block
    # dropped after its product: no float64 copy of the whole kernel), and every product uses the
    # turned blocks of _block_t. Smaller float32 layers keep Keras' own step-by-step products.
    if dt == np.float64 or kern.nbytes >= HOIST_BYTES:
        xt = x.reshape(B * T, -1).T
        # the turned blocks keep the stored dtype; float64 products cast them block by block (rows_product)
        # (float16 is widened to float32 on the way: numpy's float16 casts are slow, float32 -> float64 fast)
        wide = lambda a: a.dtype if a.dtype.itemsize >= 4 else np.dtype(np.float32)  # noqa: E731
        XK = {g: rows_product(_block_t(kern, j, H, cud, wide(kern)), xt, dt).T.reshape(B, T, H)
              for j, g in enumerate(order)}
        RT = {g: _block_t(rec, j, H, cud, wide(rec)) for j, g in enumerate(order)}
        K = R = None
    else:
        XK = RT = None
        K = {g: _block(kern, j, H, cud, dt) for j, g in enumerate(order)}
        R = {g: _block(rec, j, H, cud, dt) for j, g in enumerate(order)}

    def xK(g: str, t: int) -> np.ndarray:
        return XK[g][:, t] if XK is not None else x[:, t] @ K[g]

    def hR(h: np.ndarray, g: str) -> np.ndarray:
        return rows_product(RT[g], h.T, dt).T if RT is not None else h @ R[g]

    h = np.zeros((B, H), dt)
    c = np.zeros((B, H), dt)
    ys = np.zeros((B, T, H), dt)
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        if cell is Cell.LSTM:
            pre = {g: xK(g, t) + BI[g] + hR(h, g) + BR[g] for g in "ifgo"}
            c = sig(pre["f"]) * c + sig(pre["i"]) * act(pre["g"])
            h = sig(pre["o"]) * act(c)
        elif cell is Cell.GRU:
            z = sig(xK("z", t) + BI["z"] + hR(h, "z") + BR["z"])
            r = sig(xK("r", t) + BI["r"] + hR(h, "r") + BR["r"])
            if s.reset_after:
                hh = act(xK("n", t) + BI["n"] + r * (hR(h, "n") + BR["n"]))
            else:
                hh = act(xK("n", t) + BI["n"] + hR(r * h, "n"))
            h = z * h + (1 - z) * hh
        else:
            h = act(xK("h", t) + BI["h"] + hR(h, "h") + BR["h"])
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
