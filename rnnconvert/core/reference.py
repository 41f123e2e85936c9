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

import threading

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


class _Blocks:
    """Row blocks ``w[i:i+rows]`` of a weight matrix in each dtype a product asks for, through buffers reused
    from block to block (no full-size cast copy): float16 is widened to float32 once per block (numpy's
    float16 casts are slow), other dtypes cast from the block or from that float32 copy. Exact casts
    (float16 -> float32 -> float64)."""

    def __init__(self, w: np.ndarray, rows: int) -> None:
        self.w, self.rows, self.bufs = w, rows, {}

    def __iter__(self):
        w, rows = self.w, self.rows
        for i in range(0, w.shape[0], rows):
            yield i, self._in(w[i:i + rows])

    def _in(self, blk: np.ndarray):
        """``get(dt)``: this block in ``dt`` (each cast made once per block)."""
        got = {blk.dtype: blk}

        def get(dt) -> np.ndarray:
            dt = np.dtype(dt)
            if dt not in got:
                base = get(np.float32) if blk.dtype.itemsize < 4 and dt != np.float32 else blk
                buf = self.bufs.get(dt)
                if buf is None:
                    buf = self.bufs[dt] = np.empty((min(self.rows, self.w.shape[0]), self.w.shape[1]), dt)
                b = buf[:blk.shape[0]]
                b[...] = base
                got[dt] = b
            return got[dt]
        return get


def products(w: np.ndarray, vs: list[np.ndarray], rows: int = 256) -> list[np.ndarray]:
    """``[w @ v for v in vs]``, each computed in ``v``'s dtype, reading ``w`` from memory once for all of them.

    ``w`` ``(M, K)`` (float16, float32 or float64) is taken ``rows`` rows at a time and cast, while still in
    cache, into reused buffers for the dtypes of ``vs`` (:class:`_Blocks`). The products stay ``(W @ v)``
    with ``v`` of a few columns: W keeps its row-major form and BLAS streams it without packing (3-4x
    faster than ``v.T @ W.T`` on multi-MB matrices). A product of a few columns is bound by reading
    ``w``; products in several dtypes share that read (one ``(8192, 2048)`` float32 matrix and 3 columns:
    17 ms of CPU for float64 and float32 together against 23 ms as two passes; verification now computes
    float32 alone and float64 only when needed, docs/performance.md session 4). Each result is the same as ``w.astype(dt) @ v`` up to the order of BLAS's sums.
    """
    outs = [np.empty((w.shape[0], v.shape[1]), v.dtype) for v in vs]
    for i, get in _Blocks(w, rows):
        for v, o in zip(vs, outs):
            o[i:i + rows] = get(v.dtype) @ v
    return outs


def left_products(xs: list[np.ndarray], w: np.ndarray, rows: int = 64) -> list[np.ndarray]:
    """``[x @ w for x in xs]``, each in ``x``'s dtype, reading ``w`` ``(K, N)`` once for all of them: ``rows``
    rows of ``w`` at a time (cast as in :func:`products`), the products of each row block summed. For a
    stored ``(in, G*H)`` Keras kernel and all steps' inputs at once: no turned copy of the kernel is made.
    Each result equals ``x @ w.astype(dt)`` up to the order of the sums."""
    outs = [np.zeros((x.shape[0], w.shape[1]), x.dtype) for x in xs]
    for i, get in _Blocks(w, rows):
        for x, o in zip(xs, outs):
            o += x[:, i:i + rows] @ get(x.dtype)
    return outs


_scratch = threading.local()  # one reused float32 buffer per thread for widened()


def release_scratch() -> None:
    """Drop this thread's :func:`widened` scratch buffer (verification calls it when it is done)."""
    _scratch.buf = None


def widened(a: np.ndarray | None, reuse: bool = False) -> np.ndarray | None:
    """``a`` itself, or float16 widened to float32 once (exact; numpy's float16 casts are slow, so the
    products and per-block casts work from float32). ``reuse=True``: into this thread's scratch buffer
    (valid until the next ``widened(..., reuse=True)`` call), so that layer after layer of a large model does
    not pay for fresh pages (each direction's ``W_hh`` of :func:`_direction`)."""
    if a is None or a.dtype.itemsize >= 4:
        return a
    if not reuse:
        return a.astype(np.float32)
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < a.size:
        buf = _scratch.buf = np.empty(a.size, np.float32)
    out = buf[:a.size].reshape(a.shape)
    np.copyto(out, a)
    return out


def _direction(layer: RNNLayer, p: DirectionParams, xs: list[np.ndarray], reverse: bool) -> list[np.ndarray]:
    """Run one direction (params ``p``) over each input of ``xs`` (``(B, T, I_k)``, one per dtype, each
    computed in its own dtype) in lockstep, so that every product
    reads the weights once for all dtypes (:func:`products`); returns the ``(B, T, out)`` outputs in input
    time order, one per input."""
    dts = [x.dtype for x in xs]
    cast = lambda a: [None if a is None else np.asarray(a, dtype=dt) for dt in dts]  # noqa: E731
    b_ih, b_hh, w_hr, peep = map(cast, (p.b_ih, p.b_hh, p.w_hr, p.peep))
    w_hh, w_ih = widened(p.w_hh, reuse=True), p.w_ih  # W_hh is read at every step: widened once; W_ih once, by blocks

    def hw(vs, rows=slice(None)):
        """``W_hh v`` for each dtype's ``v`` ``(B, n)``, one read of ``W_hh``; for the zero state of the first
        step, zeros without reading it (``0 * w`` is exactly 0 for the finite weights readers admit)."""
        if fresh:
            return [np.zeros((v.shape[0], w_hh[rows].shape[0]), v.dtype) for v in vs]
        return [o.T for o in products(w_hh[rows], [v.T for v in vs])]

    s = layer.semantics
    gact, act = ACT[s.gate_activation], ACT[s.activation]
    H, cell = layer.hidden_size, layer.cell
    B, T, _ = xs[0].shape
    n = len(xs)
    h = [np.zeros((B, layer.output_size), dt) for dt in dts]
    c = [np.zeros((B, H), dt) for dt in dts]
    out = [np.zeros((B, T, layer.output_size), dt) for dt in dts]
    xin = [o.T.reshape(B, T, -1) + b_ih[d]
           for d, o in enumerate(products(w_ih, [x.reshape(B * T, -1).T for x in xs]))]  # (B, T, G*H)
    sl = {g: gate_slice(cell, g, H) for g in CANONICAL[cell]}
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for n_step, t in enumerate(steps):
        fresh = n_step == 0
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
    return out


def forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Run ``layer`` on ``x`` of shape ``(batch, time, input_size)`` from zero initial state.

    Returns:
        array of ``dtype`` (float64 by default) ``(batch, time, dirs * out)`` -- the full output sequence of the last
        stacked layer, directions concatenated (forward first) as cuDNN/PyTorch return them.
        A ``go_backwards`` layer returns its outputs in processing order (reversed time), like Keras.
        ``merge_mode`` is not applied here (see :func:`merge`).
    """
    return forward_multi(layer, [np.asarray(x, dtype=dtype)])[0]


def forward_multi(layer: RNNLayer, xs: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`forward` of each input of ``xs`` in its own dtype, all in
    lockstep so that each weight matrix is read once per product for all of them (:func:`products`)."""
    ys = list(xs)
    for k in range(layer.num_layers):
        ys = forward_slab_multi(layer, layer.params[k], ys)
    return [finish(layer, y) for y in ys]


def forward_slab(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Stacked layer ``k`` of ``layer`` alone, with its directions ``dirs``, on its input ``x`` ``(B, T, I_k)``:
    ``(B, T, dirs * out)`` of ``dtype`` in input time order. :func:`forward` chains these over ``k`` and
    applies :func:`finish` (streaming verification does the same one slab at a time)."""
    return forward_slab_multi(layer, dirs, [np.asarray(x, dtype=dtype)])[0]


def forward_slab_multi(layer: RNNLayer, dirs: list[DirectionParams], xs: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`forward_slab` of each input of ``xs`` in its own dtype, in lockstep (see :func:`forward_multi`)."""
    if layer.bidirectional:
        fw, bw = _direction(layer, dirs[0], xs, False), _direction(layer, dirs[1], xs, True)
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)]
    return _direction(layer, dirs[0], xs, layer.semantics.go_backwards)


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
