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
from ..reference import ACT, left_products, products, widened


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


def _direction(kind: str, cell: Cell, raw: dict, layer: RNNLayer, xs: list[np.ndarray],
               reverse: bool) -> list[np.ndarray]:
    """One direction on each input of ``xs`` (one per dtype, each computed in its own dtype), in lockstep:
    the products of all hoisted dtypes read each turned weight block once (:func:`rnnconvert.reference.products`)."""
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
    dts = [x.dtype for x in xs]
    n = len(xs)
    zero = np.zeros(G * H)
    if b is None:
        bi, br = zero, zero
    elif b.ndim == 2:
        bi, br = np.asarray(b[0]), np.asarray(b[1])
    elif b.shape[0] == 2 * G * H:
        bi, br = np.asarray(b[: G * H]), np.asarray(b[G * H:])
    else:
        bi, br = np.asarray(b), zero
    BI = [{g: np.asarray(bi[j * H:(j + 1) * H], dtype=dt) for j, g in enumerate(order)} for dt in dts]
    BR = [{g: np.asarray(br[j * H:(j + 1) * H], dtype=dt) for j, g in enumerate(order)} for dt in dts]
    sig = ACT["sigmoid"] if cud else ACT[s.gate_activation]
    act = ACT["tanh"] if cud else ACT[s.activation]
    B, T, _ = xs[0].shape
    # float64 (and float32 for kernels of HOIST_BYTES or more): the input part ``x_t @ K_g`` does not
    # depend on the state and is computed for all steps at once, one gate block at a time (each block
    # dropped after its products: no float64 copy of the whole kernel), and every product uses the
    # turned blocks of _block_t, turned once for all hoisted dtypes. Smaller float32 layers keep Keras'
    # own step-by-step products. (float16 tensors are widened to float32 once: numpy's float16 casts are
    # slow, float32 -> float64 fast.)
    hoisted = [d for d in range(n) if dts[d] == np.float64 or kern.nbytes >= HOIST_BYTES]
    XK: list = [None] * n
    K: list = [None] * n
    R: list = [None] * n
    RT = None
    if hoisted:
        # the plain kernel is read once, by blocks; the recurrent one is turned from a widened scratch copy
        kw, rw = (widened(kern) if cud else kern), widened(rec, reuse=True)
        if cud:  # each gate slice holds cuDNN's (H, in) matrix: turned per gate
            for d in hoisted:
                XK[d] = {}
            for j, g in enumerate(order):
                outs = products(_block_t(kw, j, H, cud, kw.dtype), [xs[d].reshape(B * T, -1).T for d in hoisted])
                for d, o in zip(hoisted, outs):
                    XK[d][g] = o.T.reshape(B, T, H)
        else:  # x @ K for all gates and steps at once, straight from the stored kernel (no turned copy)
            outs = left_products([xs[d].reshape(B * T, -1) for d in hoisted], kw)
            for d, o in zip(hoisted, outs):
                XK[d] = {g: o[:, j * H:(j + 1) * H].reshape(B, T, H) for j, g in enumerate(order)}
        RT = {g: _block_t(rw, j, H, cud, rw.dtype) for j, g in enumerate(order)}
    for d in range(n):
        if d not in hoisted:
            K[d] = {g: _block(kern, j, H, cud, dts[d]) for j, g in enumerate(order)}
            R[d] = {g: _block(rec, j, H, cud, dts[d]) for j, g in enumerate(order)}

    def xK(d: int, g: str, t: int) -> np.ndarray:
        return XK[d][g][:, t] if XK[d] is not None else xs[d][:, t] @ K[d][g]

    def hR(vs: list[np.ndarray], g: str) -> list[np.ndarray]:
        """``v @ R_g`` for each dtype's ``v``; the hoisted ones share one read of the turned block."""
        res: list = [None] * n
        if hoisted:
            for d, o in zip(hoisted, products(RT[g], [vs[d].T for d in hoisted])):
                res[d] = o.T
        for d in range(n):
            if res[d] is None:
                res[d] = vs[d] @ R[d][g]
        return res

    h = [np.zeros((B, H), dt) for dt in dts]
    c = [np.zeros((B, H), dt) for dt in dts]
    ys = [np.zeros((B, T, H), dt) for dt in dts]
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        if cell is Cell.LSTM:
            hr = {g: hR(h, g) for g in "ifgo"}
            for d in range(n):
                pre = {g: xK(d, g, t) + BI[d][g] + hr[g][d] + BR[d][g] for g in "ifgo"}
                c[d] = sig(pre["f"]) * c[d] + sig(pre["i"]) * act(pre["g"])
                h[d] = sig(pre["o"]) * act(c[d])
        elif cell is Cell.GRU:
            hz, hr_ = hR(h, "z"), hR(h, "r")
            z = [sig(xK(d, "z", t) + BI[d]["z"] + hz[d] + BR[d]["z"]) for d in range(n)]
            r = [sig(xK(d, "r", t) + BI[d]["r"] + hr_[d] + BR[d]["r"]) for d in range(n)]
            if s.reset_after:
                hn = hR(h, "n")
                hh = [act(xK(d, "n", t) + BI[d]["n"] + r[d] * (hn[d] + BR[d]["n"])) for d in range(n)]
            else:
                hn = hR([r[d] * h[d] for d in range(n)], "n")
                hh = [act(xK(d, "n", t) + BI[d]["n"] + hn[d]) for d in range(n)]
            h = [z[d] * h[d] + (1 - z[d]) * hh[d] for d in range(n)]
        else:
            hh_ = hR(h, "h")
            h = [act(xK(d, "h", t) + BI[d]["h"] + hh_[d] + BR[d]["h"]) for d in range(n)]
        for d in range(n):
            ys[d][:, n_step if reverse and not layer.bidirectional else t] = h[d]
    return ys


def source_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Run a Keras-file layer from its raw Keras tensors; same output convention as
    :func:`rnnconvert.reference.forward` (directions concatenated, merge not applied)."""
    return source_forward_multi(layer, [np.asarray(x, dtype=dtype)])[0]


def source_forward_multi(layer: RNNLayer, xs: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`source_forward` of each input of ``xs`` in its own dtype (verification: float64 and float32),
    in lockstep: each raw tensor is turned once and read once per product for all of them."""
    raws = layer.source["raw"]
    kind = layer.source["class_name"]
    if layer.bidirectional:
        fw = _direction(kind, layer.cell, raws[0], layer, xs, False)
        bw = _direction(kind, layer.cell, raws[1], layer, xs, True)
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)]
    return _direction(kind, layer.cell, raws[0], layer, xs, layer.semantics.go_backwards)
