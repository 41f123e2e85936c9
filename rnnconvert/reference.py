"""A plain-numpy forward pass of the canonical model: the CPU oracle.

Independent of every framework. Computes in float64 by default (inputs and weights are upcast), so that
it can judge float32 framework results. Equations (canonical gate order, see :mod:`rnnconvert.gates`):

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


def rows_product(w: np.ndarray, xt: np.ndarray, dt, rows: int = 1024) -> np.ndarray:
    """``w @ xt`` in ``dt``, ``w`` cast ``rows`` rows at a time (no ``dt`` copy of the whole matrix; as fast
    as the product of a cast copy, which is bound by reading ``w`` either way)."""
    out = np.empty((w.shape[0], xt.shape[1]), dt)
    for i in range(0, w.shape[0], rows):
        out[i:i + rows] = np.asarray(w[i:i + rows], dtype=dt) @ xt
    return out


def _direction(layer: RNNLayer, p: DirectionParams, x: np.ndarray, reverse: bool, dt=np.float64) -> np.ndarray:
    """Run one direction (params ``p``) over ``x`` ``(B, T, I_k)``; returns ``(B, T, out)`` in input time order."""
    f64 = lambda a: None if a is None else np.asarray(a, dtype=dt)  # noqa: E731
    b_ih, b_hh, w_hr, peep = map(f64, (p.b_ih, p.b_hh, p.w_hr, p.peep))
    # ``W_hh h`` is cast block by block at every step rather than once: measured as fast (the product is
    # bound by reading W_hh either way) and no dt copy of W_hh is ever held
    # (float16 weights are widened to float32 once: numpy's float16 casts are slow, float32 -> float64 fast)
    w_hh = p.w_hh if p.w_hh.dtype.itemsize >= 4 else p.w_hh.astype(np.float32)
    hw = lambda v, rows=slice(None): rows_product(w_hh[rows], v.T, dt).T  # noqa: E731
    s = layer.semantics
    gact, act = ACT[s.gate_activation], ACT[s.activation]
    H, cell = layer.hidden_size, layer.cell
    B, T, _ = x.shape
    h = np.zeros((B, layer.output_size), dt)
    c = np.zeros((B, H), dt)
    out = np.zeros((B, T, layer.output_size), dt)
    # products as ``(W @ x.T).T``: W stays in its canonical (G*H, in) row-major form and BLAS, given a
    # few columns, streams it without packing (3-4x faster than ``x @ W.T`` on multi-MB matrices)
    xin = rows_product(p.w_ih, x.reshape(B * T, -1).T, dt).T.reshape(B, T, -1) + b_ih  # (B, T, G*H)
    sl = {g: gate_slice(cell, g, H) for g in CANONICAL[cell]}
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for t in steps:
        xt = xin[:, t]
        if cell is Cell.LSTM:
            zz = xt + hw(h) + b_hh
            zi, zf, zg, zo = (zz[:, sl[g]] for g in "ifgo")
            if peep is not None:
                zi = zi + peep[0] * c
                zf = zf + peep[1] * c
            i, f = gact(zi), gact(zf + s.forget_bias)
            c = f * c + i * act(zg)
            if s.cell_clip is not None:
                c = np.clip(c, -s.cell_clip, s.cell_clip)
            if peep is not None:
                zo = zo + peep[2] * c
            hh = gact(zo) * act(c)
            if w_hr is not None:
                hh = (w_hr @ hh.T).T
                if s.proj_clip is not None:
                    hh = np.clip(hh, -s.proj_clip, s.proj_clip)
            h = hh
        elif cell is Cell.GRU:
            r_sl, z_sl, n_sl = sl["r"], sl["z"], sl["n"]
            hr = hw(h) + b_hh
            r = gact(xt[:, r_sl] + hr[:, r_sl])
            z = gact(xt[:, z_sl] + hr[:, z_sl])
            if s.reset_after:
                n = act(xt[:, n_sl] + r * hr[:, n_sl])
            else:
                n = act(xt[:, n_sl] + hw(r * h, n_sl) + b_hh[n_sl])
            h = (1.0 - z) * n + z * h
        else:
            h = act(xt + hw(h) + b_hh)
        out[:, t] = h
    return out


def forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Run ``layer`` on ``x`` of shape ``(batch, time, input_size)`` from zero initial state.

    Returns:
        array of ``dtype`` (float64 by default) ``(batch, time, dirs * out)`` -- the full output sequence of the last
        stacked layer, directions concatenated (forward first) as cuDNN/PyTorch return them.
        A ``go_backwards`` layer returns its outputs in processing order (reversed time), like Keras.
        ``merge_mode`` is not applied here (see :func:`merge`).
    """
    y = np.asarray(x, dtype=dtype)
    for k in range(layer.num_layers):
        y = forward_slab(layer, layer.params[k], y, dtype)
    return finish(layer, y)


def forward_slab(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Stacked layer ``k`` of ``layer`` alone, with its directions ``dirs``, on its input ``x`` ``(B, T, I_k)``:
    ``(B, T, dirs * out)`` of ``dtype`` in input time order. :func:`forward` chains these over ``k`` and
    applies :func:`finish` (streaming verification does the same one slab at a time)."""
    y = np.asarray(x, dtype=dtype)
    if layer.bidirectional:
        return np.concatenate([_direction(layer, dirs[0], y, False, dtype), _direction(layer, dirs[1], y, True, dtype)],
                              axis=-1)
    return _direction(layer, dirs[0], y, layer.semantics.go_backwards, dtype)


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
