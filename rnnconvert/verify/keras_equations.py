"""Keras equations on Keras tensors: the source side of verification for Keras files.

Deliberately independent of the conversion code: it never calls :mod:`rnnconvert.core.gates`'
permutations or the canonical parameters; it slices the tensors exactly as they sit in the file
and applies the equations of the Keras source (tf_keras ``layers/rnn/lstm.py``, ``gru.py``,
``simple_rnn.py``; CuDNN layers: the cuDNN equations on slices whose bytes are cuDNN's
``(H, in)`` row-major matrices, tf_keras ``cudnn_lstm.py``/``cudnn_gru.py``). It only reads the
gate *letters* of each format from the table in :mod:`rnnconvert.core.gates`.

The same pass over a stored kernel gives verification's one-step check its input products: with ``record=``
(:func:`source_forward_multi`), a plain (not CuDNN) float32 or float16 kernel's float64 ``x @ K`` and a bound of
``|x| @ |K|`` (summed in float32, :func:`rnnconvert.verify.bounds.magnitude_bound32`) are recorded in canonical
gate order (``'xk'``), so the check reads no turned ``W_ih`` (docs/performance.md, session 13).
"""

from __future__ import annotations

import numpy as np

from ..core.gates import CANONICAL, convention
from ..core.model import Cell, RNNLayer
from ..core.reference import ACT
from ..speed.kernels import left_products, products, widened
from ..engine.protocol import Runtime
from . import bounds


#: Kernels of at least this many bytes are evaluated with the input products of all steps hoisted
#: into one product per gate (one pass over the kernel instead of one per step) in float32 too.
#: Smaller layers keep Keras' step-by-step order in float32, which reproduces a Keras 2 graph bit for
#: bit (tests/formats/keras_files/test_realworld_keras.py); for large ones float32 serves only the tolerance's measure of
#: rounding spread, where the order of a sum does not matter.
HOIST_BYTES = 4 << 20


def _block(m: np.ndarray, j: int, H: int, cudnn: bool, dt) -> np.ndarray:
    """Gate block ``j`` of a Keras kernel ``(in, G*H)`` as the ``(in, H)`` matrix ``K_g`` of ``x @ K_g``
    (a view for plain layers: Keras' own products, step by step)."""
    s = m[:, j * H:(j + 1) * H]
    if cudnn:  # the slice's bytes are cuDNN's (H, in) matrix applied as M x, i.e. x @ M.T
        return np.ascontiguousarray(s).reshape(H, m.shape[0]).astype(dt, copy=False).T
    return np.asarray(s, dtype=dt)


def _block_t(m: np.ndarray, j: int, H: int, dt) -> np.ndarray:
    """The cuDNN matrix of gate ``j`` of a CuDNN layer's kernel ``(in, G*H)``: the slice's bytes are cuDNN's
    row-major ``(H, in)`` matrix ``M`` applied as ``M x`` (tf_keras ``cudnn_recurrent.py``), returned
    C-contiguous in ``dt`` for the products ``M @ x.T``."""
    return np.ascontiguousarray(m[:, j * H:(j + 1) * H]).reshape(H, m.shape[0]).astype(dt, copy=False)


def _direction(kind: str, cell: Cell, raw: dict, layer: RNNLayer, xs: list[np.ndarray],
               reverse: bool, record: dict | None = None, init: tuple | None = None) -> list[np.ndarray]:
    """One direction on each input of ``xs`` (one per dtype, each computed in its own dtype), in lockstep:
    the products of all hoisted dtypes read each turned weight block once (:func:`rnnconvert.speed.kernels.products`).
    ``record``: a dict that receives the states of ``xs[0]``'s run as :func:`rnnconvert.core.reference.trajectory`
    records them (``'h'``, ``'c'`` before each step, input time order; ``'c_last'``), and, where the float64
    input's products are hoisted from a plain float32 or float16 kernel, ``'xk'``: ``(x64 @ K, M)``, float64
    ``(B*T, G*H)`` each, rows in ``(b, t)`` order, columns in canonical gate order, ``M >= |x64| @ |K|``."""
    s = layer.semantics
    fam = "keras_cudnn" if kind.startswith("CuDNN") else layer.source.get("family", "keras")
    if fam == "keras1":
        fam_conv = convention("keras1", cell)
    else:
        fam_conv = convention("keras_cudnn" if fam == "keras_cudnn" else "keras", cell)
    order = fam_conv.gate_order
    cud = fam == "keras_cudnn"
    w = _Weights(raw, xs, order, layer.hidden_size, cud, cell, record)
    sig = ACT["sigmoid"] if cud else ACT[s.gate_activation]
    act = ACT["tanh"] if cud else ACT[s.activation]
    return _run(w, cell, s.reset_after, sig, act, reverse and not layer.bidirectional, reverse, record, init)


def _biases(b, order: str, G: int, H: int, dts: list) -> tuple[list[dict], list[dict]]:
    """The input and recurrent biases of each gate (``{g: (H,)}``) in each dtype of ``dts``, from a Keras bias:
    none, ``(2, G*H)`` (GRU ``reset_after``), ``(2*G*H,)`` (CuDNN: input then recurrent) or ``(G*H,)``."""
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
    return BI, BR


class _Weights:
    """One direction's stored kernels as :func:`_run` reads them, for each input of ``xs`` (one per dtype):
    ``xK(d, g, t)`` the input part of gate ``g`` at step ``t``, ``hR(vs, gs, fresh)`` the recurrent products, and the
    biases ``BI``, ``BR``.

    float64 (and float32 for kernels of HOIST_BYTES or more): the input part ``x_t @ K`` does not depend
    on the state and is computed for all steps at once, and every product reads the stored matrices by
    row blocks (kernels.left_products; cast per block, no float64 copy of a whole kernel) for all
    hoisted dtypes at once; cuDNN layers' per-gate matrices are turned once (_block_t). Smaller float32
    layers keep Keras' own step-by-step products. (float16 tensors are widened to float32 once: numpy's
    float16 casts are slow, float32 -> float64 fast.)"""

    def __init__(self, raw: dict, xs: list[np.ndarray], order: str, H: int, cud: bool, cell: Cell,
                 record: dict | None) -> None:
        self.xs, self.order, self.H, self.cud = xs, order, H, cud
        self.dts = dts = [x.dtype for x in xs]
        n = len(xs)
        self.B, self.T, _ = xs[0].shape
        kern = np.asarray(raw["kernel"])  # (a map of the file's bytes: dropped before the recurrent one is taken)
        self.BI, self.BR = _biases(raw.get("bias"), order, cell.gates, H, dts)
        self.hoisted = hoisted = [d for d in range(n) if dts[d] == np.float64 or kern.nbytes >= HOIST_BYTES]
        self.XK: list = [None] * n
        self.K: list = [None] * n
        self.R: list = [None] * n
        self.RT = None
        if hoisted:
            self._hoist(kern, cell, record)
        for d in range(n):
            if d not in hoisted:
                self.K[d] = {g: _block(kern, j, H, cud, dts[d]) for j, g in enumerate(order)}
        del kern  # its products are made: the kernel's mapped pages go before the recurrent kernel's come
        rec = np.asarray(raw["recurrent_kernel"])
        self.rw = rw = widened(rec, reuse=True) if hoisted else None
        if hoisted and cud:  # cuDNN's per-gate (H, H) matrices: each turned once, then read once per step
            self.RT = {g: _block_t(rw, j, H, rw.dtype) for j, g in enumerate(order)}
        for d in range(n):
            if d not in hoisted:
                self.R[d] = {g: _block(rec, j, H, cud, dts[d]) for j, g in enumerate(order)}
        self.col = {g: slice(j * H, (j + 1) * H) for j, g in enumerate(order)}

    def _hoist(self, kern: np.ndarray, cell: Cell, record: dict | None) -> None:
        """``x @ K`` of every step of the hoisted inputs (``XK``), with ``record['xk']`` where asked (see
        :func:`_direction`)."""
        xs, order, H, B, T, hoisted, dts = self.xs, self.order, self.H, self.B, self.T, self.hoisted, self.dts
        # the plain kernel is read once, by blocks; the recurrent one from a widened scratch copy (float16)
        kw = widened(kern) if self.cud else kern
        if self.cud:  # each gate slice holds cuDNN's (H, in) matrix: turned per gate
            for d in hoisted:
                self.XK[d] = {}
            for j, g in enumerate(order):
                outs = products(_block_t(kw, j, H, kw.dtype), [xs[d].reshape(B * T, -1).T for d in hoisted])
                for d, o in zip(hoisted, outs):
                    self.XK[d][g] = o.T.reshape(B, T, H)
            return
        # x @ K for all gates and steps at once, straight from the stored kernel (no turned copy)
        d64 = next((d for d in hoisted if dts[d] == np.float64), None)
        mag = None
        if record is not None and d64 is not None:  # and |x| @ |K| in the same pass (the one-step bound's)
            mag = bounds.up32(np.abs(xs[d64].reshape(B * T, -1)))
        outs = left_products([xs[d].reshape(B * T, -1) for d in hoisted], kw, magnitude=mag)
        if mag is not None and outs[-1] is not None:
            bound = bounds.magnitude_bound32(outs[-1], kw.shape[0])
            if np.isfinite(bound).all():  # (an overflowed float32 sum: the one-step check makes its own pass)
                canon = [order.index(g) for g in CANONICAL[cell]]
                val = outs[hoisted.index(d64)]
                record["xk"] = tuple(np.concatenate([a[:, j * H:(j + 1) * H] for j in canon], axis=1)
                                     for a in (val, bound))
        for d, o in zip(hoisted, outs):
            self.XK[d] = {g: o[:, j * H:(j + 1) * H].reshape(B, T, H) for j, g in enumerate(order)}

    def xK(self, d: int, g: str, t: int) -> np.ndarray:
        return self.XK[d][g][:, t] if self.XK[d] is not None else self.xs[d][:, t] @ self.K[d][g]

    def hR(self, vs: list[np.ndarray], gs: str, fresh: bool) -> list[dict[str, np.ndarray]]:
        """``{g: v @ R_g for g in gs}`` for each dtype's ``v``. The hoisted dtypes share one read of the
        recurrent kernel: straight from the stored ``(H, G*H)`` matrix, all gates of ``gs`` at once when they
        sit side by side (plain Keras), else the turned cuDNN blocks. A state of zeros (the first step: ``fresh``)
        gives zeros without reading the kernel: ``0 * w`` is exactly 0 for the finite weights readers admit."""
        n, hoisted, H = len(self.xs), self.hoisted, self.H
        res: list = [None] * n
        if fresh:
            return [{g: np.zeros((self.B, H), self.dts[d]) for g in gs} for d in range(n)]
        if hoisted and self.cud:
            for g in gs:
                for d, o in zip(hoisted, products(self.RT[g], [vs[d].T for d in hoisted])):
                    res[d] = res[d] or {}
                    res[d][g] = o.T
        elif hoisted:
            idx = sorted(self.order.index(g) for g in gs)
            base = idx[0] * H  # the columns from the first to the last gate of ``gs``
            col = self.col
            for d, o in zip(hoisted, left_products([vs[d] for d in hoisted], self.rw[:, base:(idx[-1] + 1) * H])):
                res[d] = {g: o[:, col[g].start - base:col[g].stop - base] for g in gs}
        for d in range(n):
            if res[d] is None:
                res[d] = {g: vs[d] @ self.R[d][g] for g in gs}
        return res


def _run(w: _Weights, cell: Cell, reset_after: bool, sig, act, backwards_out: bool, reverse: bool,
         record: dict | None, init: tuple | None = None) -> list[np.ndarray]:
    """The steps of one direction in lockstep over the dtypes (see :func:`_direction`); ``backwards_out``: a lone
    direction run backwards writes its outputs in the order it computes them (Keras' ``go_backwards``)."""
    n, B, T, H, dts, BI, BR = len(w.xs), w.B, w.T, w.H, w.dts, w.BI, w.BR
    xK, order = w.xK, w.order
    h = [np.zeros((B, H), dt) if not init else np.asarray(init[0], dt) for dt in dts]
    c = [np.zeros((B, H), dt) if not init or len(init) < 2 else np.asarray(init[1], dt) for dt in dts]
    ys = [np.zeros((B, T, H), dt) for dt in dts]
    if record is not None:
        record["h"] = np.zeros((B, T, H), dts[0])
        record["c"] = np.zeros((B, T, H), dts[0]) if cell is Cell.LSTM else None
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        fresh = n_step == 0 and not init
        if record is not None:
            record["h"][:, t] = h[0]
            if cell is Cell.LSTM:
                record["c"][:, t] = c[0]
        if cell is Cell.LSTM:
            hr = w.hR(h, "ifgo", fresh)
            for d in range(n):
                pre = {g: xK(d, g, t) + BI[d][g] + hr[d][g] + BR[d][g] for g in "ifgo"}
                c[d] = sig(pre["f"]) * c[d] + sig(pre["i"]) * act(pre["g"])
                h[d] = sig(pre["o"]) * act(c[d])
        elif cell is Cell.GRU:
            hg = w.hR(h, "".join(order) if reset_after else "".join(g for g in order if g != "n"), fresh)
            z = [sig(xK(d, "z", t) + BI[d]["z"] + hg[d]["z"] + BR[d]["z"]) for d in range(n)]
            r = [sig(xK(d, "r", t) + BI[d]["r"] + hg[d]["r"] + BR[d]["r"]) for d in range(n)]
            if reset_after:
                hh = [act(xK(d, "n", t) + BI[d]["n"] + r[d] * (hg[d]["n"] + BR[d]["n"])) for d in range(n)]
            else:
                hn = w.hR([r[d] * h[d] for d in range(n)], "n", fresh)
                hh = [act(xK(d, "n", t) + BI[d]["n"] + hn[d]["n"]) for d in range(n)]
            h = [z[d] * h[d] + (1 - z[d]) * hh[d] for d in range(n)]
        else:
            hh_ = w.hR(h, "h", fresh)
            h = [act(xK(d, "h", t) + BI[d]["h"] + hh_[d]["h"] + BR[d]["h"]) for d in range(n)]
        for d in range(n):
            ys[d][:, n_step if backwards_out else t] = h[d]
    if record is not None:
        record["c_last"] = c[0] if cell is Cell.LSTM else None
    return ys


def source_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64, raw: list | None = None) -> np.ndarray:
    """Run a Keras-file layer from its raw Keras tensors; same output convention as
    :func:`rnnconvert.core.reference.forward` (directions concatenated, merge not applied).

    ``raw``: one mapping per direction of the file's tensors (``kernel``, ``recurrent_kernel``, ``bias``, or
    Keras 1's per-gate names), as verification read them; ``None``: ``layer.source['raw']`` (read through on
    access). ``layer`` is not changed."""
    return source_forward_multi(layer, [np.asarray(x, dtype=dtype)], raw)[0]


def source_forward_multi(layer: RNNLayer, xs: list[np.ndarray], raw: list | None = None,
                         record: list[dict] | None = None) -> list[np.ndarray]:
    """:func:`source_forward` of each input of ``xs`` in its own dtype, in lockstep: each raw tensor is turned once
    and read once per product for all of them. ``record``: one dict per direction, each filled with the states
    of ``xs[0]``'s run (:func:`_direction`): verification's one-step comparison starts the target from them."""
    raws = layer.source["raw"] if raw is None else raw
    kind = layer.source["class_name"]
    rec = record if record is not None else [None, None]
    if layer.bidirectional:
        fw = _direction(kind, layer.cell, raws[0], layer, xs, False, rec[0])
        bw = _direction(kind, layer.cell, raws[1], layer, xs, True, rec[1])
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)]
    return _direction(kind, layer.cell, raws[0], layer, xs, layer.semantics.go_backwards, rec[0])


def direction_forward(layer: RNNLayer, d: int, x: np.ndarray, raw: dict | None = None,
                      record: dict | None = None, init: tuple | None = None) -> np.ndarray:
    """Direction ``d`` (0 forward, 1 a Bidirectional's backward) of a Keras-file layer run FORWARD over ``x``
    ``(B, T, in)`` in ``x``'s dtype, from its raw Keras tensors (``raw``: that direction's mapping, default
    ``layer.source['raw'][d]``): ``(B, T, H)``, the output of each step in ``x``'s order. The caller reverses
    ``x`` for a backward or ``go_backwards`` run and compacts masked steps (the whole-model numpy evaluator,
    :mod:`rnnconvert.whole.verify.numpy_source`). ``record``: as :func:`_direction`'s (states before each step,
    ``'c_last'``). ``init``: the initial states ``(h,)`` or ``(h, c)``, ``(B, H)`` each (Keras ``initial_state``),
    zeros when ``None``."""
    raws = layer.source["raw"] if raw is None else None
    return _direction(layer.source["class_name"], layer.cell, raws[d] if raw is None else raw, layer, [x], False,
                      record, init)[0]


RUNTIME = Runtime("keras_equations", source_forward=source_forward, source_forward_multi=source_forward_multi)
