"""A plain-numpy forward pass of the canonical model: the CPU oracle.

Independent of every framework. Computes in float64 by default (inputs and weights are upcast), so that
it can judge float32 framework results. Equations (canonical gate order, see :mod:`rnnconvert.core.gates`):

* LSTM: ``z = W_ih x + b_ih + W_hh h + b_hh``; ``i, f, o = σ(z_i + p_i c), σ(z_f + forget_bias +
  p_f c), σ(z_o + p_o c')``; ``g = act(z_g)``; ``c' = clip(f c + i g)``; ``h = W_hr (o act(c'))``.
  The output peephole sees the new ``c'`` (TF1 ``LSTMCell``, ONNX ``LSTM``).
* GRU: ``r, z = σ(...)``; reset-after ``n = act(W_in x + b_in + r (W_hn h + b_hn))`` or reset-before
  ``n = act(W_in x + b_in + W_hn (r h) + b_hn)``; ``h' = (1 - z) n + z h``.
* RNN: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)``.

(cuDNN ``cudnnRNNMode_t`` documentation; PyTorch ``torch/nn/modules/rnn.py`` docstrings; tf_keras
``layers/rnn/*.py``; TF1 ``rnn_cell_impl.py``.)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .gates import CANONICAL, gate_slice
from .model import Cell, DirectionParams, RNNLayer


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


ACT = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0),
    "hard_sigmoid_k3": lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "softsign": lambda x: x / (1.0 + np.abs(x)),
}



def _plain_products(w: np.ndarray, vs: list[np.ndarray]) -> list[np.ndarray]:
    """``[w @ v for v in vs]``, each in ``v``'s dtype (``w`` cast exactly to it)."""
    return [w.astype(v.dtype, copy=False) @ v for v in vs]


#: The products the equations are evaluated with: ``products(w, vs) -> [w @ v ...]`` (each in ``v``'s dtype) and
#: ``widened(a, reuse=False)`` (``a``, or float16 widened to float32 exactly). This default is plain numpy;
#: verification passes faster ones that compute the same products (:data:`rnnconvert.speed.kernels.FAST`).
PLAIN = SimpleNamespace(products=_plain_products, widened=lambda a, reuse=False: a)


def _direction(layer: RNNLayer, p: DirectionParams, xs: list[np.ndarray], reverse: bool,
               init: tuple | None = None, record: dict | None = None, acts: dict | None = None,
               kernels=PLAIN) -> list[np.ndarray]:
    """Run one direction (params ``p``) over each input of ``xs`` (``(B, T, I_k)``, one per dtype, each
    computed in its own dtype) in lockstep, so that every product
    reads the weights once for all dtypes (``kernels.products``); returns the ``(B, T, out)`` outputs in input
    time order, one per input.

    ``init``: ``(h0, c0)`` initial states ``(B, out)``, ``(B, H)`` (``c0`` None for GRU/RNN) instead of zeros.
    ``record``: a dict that receives, for the first input of ``xs``, ``'h'`` ``(B, T, out)`` and ``'c'``
    ``(B, T, H)`` (LSTM) -- the state *before* each step, in input time order -- and ``'c_last'`` the final
    cell state (the trajectory that :func:`rnnconvert.verify.engine` takes its one-step checks from).
    ``acts``: activation functions by name that replace :data:`ACT`'s (an emulation of a target's own
    arithmetic, :func:`forward_multi`). ``kernels``: the products' implementation (:data:`PLAIN`)."""
    dts = [x.dtype for x in xs]
    cast = lambda a: [None if a is None else np.asarray(a, dtype=dt) for dt in dts]  # noqa: E731
    b_ih, b_hh, w_hr, peep = map(cast, (p.b_ih, p.b_hh, p.w_hr, p.peep))
    products = kernels.products
    w_hh, w_ih = kernels.widened(p.w_hh, reuse=True), p.w_ih  # W_hh is read at every step: widened once

    def hw(vs, rows=slice(None)):
        """``W_hh v`` for each dtype's ``v`` ``(B, n)``, one read of ``W_hh``; for the zero state of the first
        step, zeros without reading it (``0 * w`` is exactly 0 for the finite weights readers admit)."""
        if fresh:
            return [np.zeros((v.shape[0], w_hh[rows].shape[0]), v.dtype) for v in vs]
        return [o.T for o in products(w_hh[rows], [v.T for v in vs])]

    s = layer.semantics
    table = ACT if acts is None else {**ACT, **acts}
    gact, act = table[s.gate_activation], table[s.activation]
    H, cell = layer.hidden_size, layer.cell
    B, T, _ = xs[0].shape
    n = len(xs)
    h = [np.zeros((B, layer.output_size), dt) for dt in dts]
    c = [np.zeros((B, H), dt) for dt in dts]
    if init is not None:
        h = [np.array(init[0], dtype=dt) for dt in dts]
        if init[1] is not None:
            c = [np.array(init[1], dtype=dt) for dt in dts]
    if record is not None:
        record["h"] = np.zeros((B, T, layer.output_size), dts[0])
        record["c"] = np.zeros((B, T, H), dts[0]) if cell is Cell.LSTM else None
    out = [np.zeros((B, T, layer.output_size), dt) for dt in dts]
    xin = [o.T.reshape(B, T, -1) + b_ih[d]
           for d, o in enumerate(products(w_ih, [x.reshape(B * T, -1).T for x in xs]))]  # (B, T, G*H)
    sl = {g: gate_slice(cell, g, H) for g in CANONICAL[cell]}
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        fresh = n_step == 0 and init is None
        if record is not None:
            record["h"][:, t] = h[0]
            if cell is Cell.LSTM:
                record["c"][:, t] = c[0]
        if cell is Cell.LSTM:
            hh_all = hw(h)
            for d in range(n):
                zz = xin[d][:, t] + hh_all[d] + b_hh[d]
                zi, zf, zg, zo = (zz[:, sl[g]] for g in "ifgo")
                if peep[d] is not None:
                    zi = zi + peep[d][0] * c[d]
                    zf = zf + peep[d][1] * c[d]
                i, f = gact(zi), gact(zf + s.forget_bias)
                c[d] = f * c[d] + i * act(zg)
                if s.cell_clip is not None:
                    c[d] = np.clip(c[d], -s.cell_clip, s.cell_clip)
                if peep[d] is not None:
                    zo = zo + peep[d][2] * c[d]
                hh = gact(zo) * act(c[d])
                if w_hr[d] is not None:
                    hh = (w_hr[d] @ hh.T).T
                    if s.proj_clip is not None:
                        hh = np.clip(hh, -s.proj_clip, s.proj_clip)
                h[d] = hh
        elif cell is Cell.GRU:
            r_sl, z_sl, n_sl = sl["r"], sl["z"], sl["n"]
            hr = [a + b for a, b in zip(hw(h), b_hh)]
            r = [gact(xin[d][:, t, r_sl] + hr[d][:, r_sl]) for d in range(n)]
            z = [gact(xin[d][:, t, z_sl] + hr[d][:, z_sl]) for d in range(n)]
            if s.reset_after:
                cand = [act(xin[d][:, t, n_sl] + r[d] * hr[d][:, n_sl]) for d in range(n)]
            else:
                rh = hw([r[d] * h[d] for d in range(n)], n_sl)
                cand = [act(xin[d][:, t, n_sl] + rh[d] + b_hh[d][n_sl]) for d in range(n)]
            h = [(1.0 - z[d]) * cand[d] + z[d] * h[d] for d in range(n)]
        else:
            h = [act(xin[d][:, t] + a + b_hh[d]) for d, a in enumerate(hw(h))]
        for d in range(n):
            out[d][:, t] = h[d]
    if record is not None:
        record["c_last"] = c[0] if cell is Cell.LSTM else None
    return out


def forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64, *, kernels=PLAIN) -> np.ndarray:
    """Run ``layer`` on ``x`` of shape ``(batch, time, input_size)`` from zero initial state.

    Returns:
        array of ``dtype`` (float64 by default) ``(batch, time, dirs * out)`` -- the full output sequence of the last
        stacked layer, directions concatenated (forward first) as cuDNN/PyTorch return them.
        A ``go_backwards`` layer returns its outputs in processing order (reversed time), like Keras.
        ``merge_mode`` is not applied here (see :func:`merge`).
    """
    return forward_multi(layer, [np.asarray(x, dtype=dtype)], kernels=kernels)[0]


def forward_multi(layer: RNNLayer, xs: list[np.ndarray], acts: dict | None = None, *,
                  kernels=PLAIN) -> list[np.ndarray]:
    """:func:`forward` of each input of ``xs`` in its own dtype, all in
    lockstep so that each weight matrix is read once per product for all of them (``kernels.products``).
    ``acts``: ``{name: function}`` replacing activations of :data:`ACT` (e.g. a perturbed ``tanh`` that
    emulates a target's less accurate one: :meth:`rnnconvert.verify.cuda.CudaTarget.target_arithmetic`)."""
    ys = list(xs)
    for k in range(layer.num_layers):
        ys = forward_slab_multi(layer, layer.params[k], ys, acts, kernels=kernels)
    return [finish(layer, y) for y in ys]


def forward_slab(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray, dtype=np.float64, *,
                 kernels=PLAIN) -> np.ndarray:
    """Stacked layer ``k`` of ``layer`` alone, with its directions ``dirs``, on its input ``x`` ``(B, T, I_k)``:
    ``(B, T, dirs * out)`` of ``dtype`` in input time order. :func:`forward` chains these over ``k`` and
    applies :func:`finish` (streaming verification does the same one slab at a time)."""
    return forward_slab_multi(layer, dirs, [np.asarray(x, dtype=dtype)], kernels=kernels)[0]


def forward_slab_multi(layer: RNNLayer, dirs: list[DirectionParams], xs: list[np.ndarray],
                       acts: dict | None = None, *, kernels=PLAIN) -> list[np.ndarray]:
    """:func:`forward_slab` of each input of ``xs`` in its own dtype, in lockstep (see :func:`forward_multi`)."""
    if layer.bidirectional:
        fw = _direction(layer, dirs[0], xs, False, acts=acts, kernels=kernels)
        bw = _direction(layer, dirs[1], xs, True, acts=acts, kernels=kernels)
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)]
    return _direction(layer, dirs[0], xs, layer.semantics.go_backwards, acts=acts, kernels=kernels)


def finish(layer: RNNLayer, y: np.ndarray) -> np.ndarray:
    """The last slab's output as :func:`forward` returns it: a lone ``go_backwards`` layer's outputs in
    processing order (reversed time), like Keras."""
    return y[:, ::-1] if layer.semantics.go_backwards and not layer.bidirectional else y


def merge(y: np.ndarray, mode: str | None) -> np.ndarray:
    """Apply a Keras ``Bidirectional`` ``merge_mode`` to concatenated directions ``(..., 2*H)``."""
    if mode in (None, "concat"):
        return y
    a, b = np.split(y, 2, axis=-1)
    return {"sum": a + b, "mul": a * b, "ave": (a + b) / 2.0}[mode]


# ---------------------------------------------------------------------------------------------------------
# The trajectory of a run, and one step from given states (rnnconvert.verify.engine's step rule; its error bound:
# rnnconvert.verify.bounds).

def trajectory(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray, *,
               kernels=PLAIN) -> tuple[np.ndarray, list[dict]]:
    """Stacked layer ``k`` (params ``dirs``) on its input ``x`` ``(B, T, I_k)``, computed in ``x``'s dtype:
    its output ``(B, T, dirs*out)`` in input time order (:func:`forward_slab`) and, per direction, the state
    before every step (``{'h': (B, T, out), 'c': (B, T, H) or None}``, input time order): the points the
    one-step comparison of :mod:`rnnconvert.verify.engine` starts the target from."""
    ys, recs = trajectory_multi(layer, dirs, [x], kernels=kernels)
    return ys[0], recs


def trajectory_multi(layer: RNNLayer, dirs: list[DirectionParams], xs: list[np.ndarray], *,
                     kernels=PLAIN) -> tuple[list[np.ndarray], list[dict]]:
    """:func:`trajectory` of ``xs[0]`` and, in lockstep, :func:`forward_slab` of the other inputs of ``xs`` (each
    in its own dtype, :func:`forward_slab_multi`), so that each product reads the weights once for all of
    them. Returns the outputs, one per input, and the states of ``xs[0]``'s run. The run of ``xs[0]`` is the
    same computation, operation for operation, as ``forward_slab_multi(layer, dirs, xs)[0]`` (both are
    :func:`_direction` over the same inputs): verification takes its float32 sequence from it."""
    recs = [{} for _ in dirs]
    if layer.bidirectional:
        fw = _direction(layer, dirs[0], xs, False, record=recs[0], kernels=kernels)
        bw = _direction(layer, dirs[1], xs, True, record=recs[1], kernels=kernels)
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)], recs
    return _direction(layer, dirs[0], xs, layer.semantics.go_backwards, record=recs[0], kernels=kernels), recs


def step(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
         dtype=np.float64, *, kernels=PLAIN, acts: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One step of one direction for ``N`` independent rows: input ``x`` ``(N, I_k)``, states ``h0`` ``(N, out)``,
    ``c0`` ``(N, H)`` (LSTM; else None). Returns ``(h1, c1)`` in ``dtype`` (``c1`` None but for LSTM). The
    equations of :func:`forward` (module docstring), time direction irrelevant for one step. ``acts``: activations
    replacing :data:`ACT`'s (:func:`forward_multi`)."""
    rec: dict = {}
    y = _direction(layer, p, [np.asarray(x, dtype)[:, None, :]], False, init=(h0, c0), record=rec, acts=acts,
                   kernels=kernels)[0]
    return y[:, 0], rec["c_last"]
