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

    def _cast(self, blk: np.ndarray, dt: np.dtype) -> np.ndarray:
        """``blk`` in ``dt``, in this dtype's reused buffer."""
        buf = self.bufs.get(dt)
        if buf is None:
            buf = self.bufs[dt] = np.empty((min(self.rows, self.w.shape[0]), self.w.shape[1]), dt)
        b = buf[:blk.shape[0]]
        if blk.dtype == np.float16 and dt == np.float32:
            return widen_into(b, np.ascontiguousarray(blk))
        b[...] = blk
        return b

    def _in(self, blk: np.ndarray):
        """``get(dt)``: this block in ``dt`` (each cast made once per block). ``get`` holds no reference to
        itself: no reference cycle keeps the block (a view of ``w``) alive after the loop, so ``w`` is
        freed as soon as its owner lets it go (a lazy reader reuses a released slab's arrays only then:
        :class:`rnnconvert.speed.pool.ArrayPool`)."""
        got = {blk.dtype: blk}
        f32 = np.dtype(np.float32)

        def get(dt) -> np.ndarray:
            dt = np.dtype(dt)
            if dt not in got:
                base = blk
                if blk.dtype.itemsize < 4 and dt != f32:
                    if f32 not in got:
                        got[f32] = self._cast(blk, f32)
                    base = got[f32]
                got[dt] = self._cast(base, dt)
            return got[dt]
        return get


#: bytes of one float64 block of rows in :func:`products`, :func:`abs_products`, :func:`_lin` (:func:`block_rows`):
#: 1 MiB stays in cache between a block's cast and its product. With 256 rows of a ``K = 2048`` matrix
#: (4 MiB) a float32+float64 pass over an ``(8192, 2048)`` ``W_hh`` with 3 columns took ~1 s of wall time on
#: the 2-core test machine against ~0.1 s with 64 rows (docs/performance.md, "one-step verification cost").
BLOCK_BYTES = 1 << 20


def block_rows(w: np.ndarray) -> int:
    """Rows per block for ``w`` ``(M, K)``: :data:`BLOCK_BYTES` of float64, at least 64 (small matrices: one
    or a few blocks, so that Python's per-block overhead stays small on long sequences)."""
    return max(64, BLOCK_BYTES // (8 * max(1, w.shape[1])))


def products(w: np.ndarray, vs: list[np.ndarray], rows: int | None = None) -> list[np.ndarray]:
    """``[w @ v for v in vs]``, each computed in ``v``'s dtype, reading ``w`` from memory once for all of them.

    ``w`` ``(M, K)`` (float16, float32 or float64) is taken ``rows`` rows at a time and cast, while still in
    cache, into reused buffers for the dtypes of ``vs`` (:class:`_Blocks`). The products stay ``(W @ v)``
    with ``v`` of a few columns: W keeps its row-major form and BLAS streams it without packing (3-4x
    faster than ``v.T @ W.T`` on multi-MB matrices). A product of a few columns is bound by reading
    ``w``; products in several dtypes share that read (one ``(8192, 2048)`` float32 matrix and 3 columns:
    17 ms of CPU for float64 and float32 together against 23 ms as two passes, docs/performance.md
    session 4; block size: :func:`block_rows`). Each result is the same as ``w.astype(dt) @ v`` up to the order of BLAS's sums.
    """
    rows = rows or block_rows(w)
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


#: elements per torch copy in :func:`widen_into`: torch's ``GRAIN_SIZE``, below which it does not hand a copy
#: to its OpenMP threads (whose spinning afterwards took a fifth of the 2 cores' time)
_TORCH_GRAIN = 32768


def widen_into(out: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``out[...] = a`` for float16 ``a`` into float32 ``out`` (same shape, both C-contiguous): exact either
    way. numpy converts float16 one element at a time (``npy_halfbits_to_floatbits``, ~2 ns per element:
    28% of the CPU of a verified float16 conversion of the issue #18 model); torch's conversion is vectorised
    (~7x faster), so it is used when torch is already imported and done importing (this never imports it;
    verification imports it in the background for torch targets: ``engine.verify.import_engine``)."""
    import sys

    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    if (torch is not None and not getattr(spec, "_initializing", True) and a.dtype == np.float16
            and out.dtype == np.float32 and a.flags.c_contiguous and out.flags.c_contiguous and a.size):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # from_numpy of a read-only (mapped) array warns; it is only read
            src, dst = torch.from_numpy(a.reshape(-1)), torch.from_numpy(out.reshape(-1))
        for i in range(0, a.size, _TORCH_GRAIN):  # pieces torch copies in the calling thread: a larger copy
            dst[i:i + _TORCH_GRAIN].copy_(src[i:i + _TORCH_GRAIN])  # wakes its OpenMP pool, which then spins
        return out
    np.copyto(out, a)
    return out


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
        return widen_into(np.empty(a.shape, np.float32), np.ascontiguousarray(a))
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < a.size:
        buf = _scratch.buf = np.empty(a.size, np.float32)
    return widen_into(buf[:a.size].reshape(a.shape), np.ascontiguousarray(a))


def _direction(layer: RNNLayer, p: DirectionParams, xs: list[np.ndarray], reverse: bool,
               init: tuple | None = None, record: dict | None = None, acts: dict | None = None) -> list[np.ndarray]:
    """Run one direction (params ``p``) over each input of ``xs`` (``(B, T, I_k)``, one per dtype, each
    computed in its own dtype) in lockstep, so that every product
    reads the weights once for all dtypes (:func:`products`); returns the ``(B, T, out)`` outputs in input
    time order, one per input.

    ``init``: ``(h0, c0)`` initial states ``(B, out)``, ``(B, H)`` (``c0`` None for GRU/RNN) instead of zeros.
    ``record``: a dict that receives, for the first input of ``xs``, ``'h'`` ``(B, T, out)`` and ``'c'``
    ``(B, T, H)`` (LSTM) -- the state *before* each step, in input time order -- and ``'c_last'`` the final
    cell state (the trajectory that :func:`rnnconvert.verify.engine` takes its one-step checks from).
    ``acts``: activation functions by name that replace :data:`ACT`'s (an emulation of a target's own
    arithmetic, :func:`forward_multi`)."""
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


def forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Run ``layer`` on ``x`` of shape ``(batch, time, input_size)`` from zero initial state.

    Returns:
        array of ``dtype`` (float64 by default) ``(batch, time, dirs * out)`` -- the full output sequence of the last
        stacked layer, directions concatenated (forward first) as cuDNN/PyTorch return them.
        A ``go_backwards`` layer returns its outputs in processing order (reversed time), like Keras.
        ``merge_mode`` is not applied here (see :func:`merge`).
    """
    return forward_multi(layer, [np.asarray(x, dtype=dtype)])[0]


def forward_multi(layer: RNNLayer, xs: list[np.ndarray], acts: dict | None = None) -> list[np.ndarray]:
    """:func:`forward` of each input of ``xs`` in its own dtype, all in
    lockstep so that each weight matrix is read once per product for all of them (:func:`products`).
    ``acts``: ``{name: function}`` replacing activations of :data:`ACT` (e.g. a perturbed ``tanh`` that
    emulates a target's less accurate one: :meth:`rnnconvert.verify.cuda.CudaTarget.target_arithmetic`)."""
    ys = list(xs)
    for k in range(layer.num_layers):
        ys = forward_slab_multi(layer, layer.params[k], ys, acts)
    return [finish(layer, y) for y in ys]


def forward_slab(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Stacked layer ``k`` of ``layer`` alone, with its directions ``dirs``, on its input ``x`` ``(B, T, I_k)``:
    ``(B, T, dirs * out)`` of ``dtype`` in input time order. :func:`forward` chains these over ``k`` and
    applies :func:`finish` (streaming verification does the same one slab at a time)."""
    return forward_slab_multi(layer, dirs, [np.asarray(x, dtype=dtype)])[0]


def forward_slab_multi(layer: RNNLayer, dirs: list[DirectionParams], xs: list[np.ndarray],
                       acts: dict | None = None) -> list[np.ndarray]:
    """:func:`forward_slab` of each input of ``xs`` in its own dtype, in lockstep (see :func:`forward_multi`)."""
    if layer.bidirectional:
        fw, bw = _direction(layer, dirs[0], xs, False, acts=acts), _direction(layer, dirs[1], xs, True, acts=acts)
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)]
    return _direction(layer, dirs[0], xs, layer.semantics.go_backwards, acts=acts)


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
# One step from given states, and a bound on its floating-point error (rnnconvert.verify.engine's step rule).

def trajectory(layer: RNNLayer, dirs: list[DirectionParams], x: np.ndarray) -> tuple[np.ndarray, list[dict]]:
    """Stacked layer ``k`` (params ``dirs``) on its input ``x`` ``(B, T, I_k)``, computed in ``x``'s dtype:
    its output ``(B, T, dirs*out)`` in input time order (:func:`forward_slab`) and, per direction, the state
    before every step (``{'h': (B, T, out), 'c': (B, T, H) or None}``, input time order): the points the
    one-step comparison of :mod:`rnnconvert.verify.engine` starts the target from."""
    ys, recs = trajectory_multi(layer, dirs, [x])
    return ys[0], recs


def trajectory_multi(layer: RNNLayer, dirs: list[DirectionParams],
                     xs: list[np.ndarray]) -> tuple[list[np.ndarray], list[dict]]:
    """:func:`trajectory` of ``xs[0]`` and, in lockstep, :func:`forward_slab` of the other inputs of ``xs`` (each
    in its own dtype, :func:`forward_slab_multi`), so that each product reads the weights once for all of
    them. Returns the outputs, one per input, and the states of ``xs[0]``'s run. The run of ``xs[0]`` is the
    same computation, operation for operation, as ``forward_slab_multi(layer, dirs, xs)[0]`` (both are
    :func:`_direction` over the same inputs): verification takes its float32 sequence from it."""
    recs = [{} for _ in dirs]
    if layer.bidirectional:
        fw = _direction(layer, dirs[0], xs, False, record=recs[0])
        bw = _direction(layer, dirs[1], xs, True, record=recs[1])
        return [np.concatenate([a, b], axis=-1) for a, b in zip(fw, bw)], recs
    return _direction(layer, dirs[0], xs, layer.semantics.go_backwards, record=recs[0]), recs


def step(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
         dtype=np.float64) -> tuple[np.ndarray, np.ndarray | None]:
    """One step of one direction for ``N`` independent rows: input ``x`` ``(N, I_k)``, states ``h0`` ``(N, out)``,
    ``c0`` ``(N, H)`` (LSTM; else None). Returns ``(h1, c1)`` in ``dtype`` (``c1`` None but for LSTM). The
    equations of :func:`forward` (module docstring), time direction irrelevant for one step."""
    rec: dict = {}
    y = _direction(layer, p, [np.asarray(x, dtype)[:, None, :]], False, init=(h0, c0), record=rec)[0]
    return y[:, 0], rec["c_last"]


def unit_roundoff(dtype) -> float:
    """``u = 2**-p`` of a float dtype of ``p`` significand bits (float32: 2**-24, float16: 2**-11)."""
    return float(np.finfo(dtype).eps) / 2.0


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: ``|fl(sum of n terms) - sum| <= gamma_n * sum|terms|`` for
    sums and dot products in any order of evaluation (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2nd ed., eq. 3.5 and section 4.2)."""
    return n * u / (1.0 - n * u)


#: ``(max |act'|, max |act''|)`` of the smooth activations: sigmoid ``1/4, 0.0962``; tanh ``1, 0.7699``
#: (``4/(3 sqrt 3)``); softsign ``1, 2``.
_SMOOTH = {"sigmoid": (0.25, 0.0963), "tanh": (1.0, 0.7699), "softsign": (1.0, 2.0)}
#: slopes of the piecewise-linear activations (Lipschitz constants)
_LIPSCHITZ = {"hard_sigmoid": 0.2, "hard_sigmoid_k3": 1.0 / 6.0, "relu": 1.0, "linear": 1.0}
#: what a framework's own float activation may add: this many units of roundoff of ``1 + |act(z)|``
#: (vectorised exp/tanh approximations of oneDNN, MLAS, Eigen are within a few ulps; 16 leaves room)
ACT_ULPS = 16.0


def _slope(name: str, z: np.ndarray) -> np.ndarray:
    if name == "sigmoid":
        s = _sigmoid(z)
        return s * (1.0 - s)
    if name == "tanh":
        return 1.0 - np.tanh(z) ** 2
    return 1.0 / (1.0 + np.abs(z)) ** 2  # softsign


def act_error(name: str, z: np.ndarray, dz: np.ndarray, u: float, ulps: float = ACT_ULPS) -> np.ndarray:
    """Bound of ``|fl(act(z + e)) - act(z)|`` for ``|e| <= dz``: by the mean value theorem the slope's
    largest value on ``[z - dz, z + dz]`` times ``dz`` (for smooth activations the slope at ``z`` plus
    ``max|act''| * dz``, capped by ``max|act'|``; piecewise-linear ones their Lipschitz constant), plus the
    evaluation's own rounding ``ulps * u * (1 + |act(z)|)`` (default :data:`ACT_ULPS`; a target that evaluates
    its activations less accurately declares its own: :attr:`rnnconvert.verify.cuda.CudaTarget.act_ulps`)."""
    if name in _SMOOTH:
        top, curv = _SMOOTH[name]
        slope = np.minimum(top, _slope(name, z) + curv * dz)
    else:
        slope = _LIPSCHITZ[name]
    return slope * dz + ulps * u * (1.0 + np.abs(ACT[name](z)))


def abs_products(w: np.ndarray, v: np.ndarray, rows: int | None = None) -> np.ndarray:
    """``|w| @ v`` in float64 for ``w`` ``(M, K)`` and ``v`` ``(K, N)`` (``v >= 0``), ``rows`` rows of ``w``
    at a time (no full-size copy of ``|w|``)."""
    rows = rows or block_rows(w)
    out = np.empty((w.shape[0], v.shape[1]), np.float64)
    for i, get in _Blocks(w, rows):
        out[i:i + rows] = np.abs(get(np.float64)) @ v
    return out


def _lin(w: np.ndarray, v: np.ndarray, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(v @ w.T, M)`` in float64, ``v`` ``(N, K)``, ``w`` ``(M, K)``: the value, and an upper bound ``M >=
    |v| @ |w|.T`` of its magnitude (elementwise), in one pass over ``w``, a block of rows at a time
    (:class:`_Blocks`): each block cast to float64 once for the value.

    The magnitude of float32 and float16 weights is summed in float32 (:func:`_magnitude32`: half the bytes
    and twice the speed of a float64 pass; ``M`` exceeds the exact ``|v| @ |w|.T`` by at most a relative
    ``2 gamma_K(2**-24)``, 3.7e-4 for ``K = 6144``, far below what the bound's ``gamma_n`` already allows); float64
    weights keep a float64 pass (``|v| @ |w|.T`` to float64 rounding: the bound's own rounding is far
    below the float32 ``u`` it bounds).

    Rows of ``v`` that are all zero (the zero states of a trajectory's first step, the zero probes of
    :func:`probe_rows`) give value and magnitude 0 without entering the products: exact, as ``0 * w`` is 0
    for the finite weights readers admit; of the 11 rows of the issue #18 sample's ``W_hh`` step, 6 are zero."""
    v = np.asarray(v, np.float64)
    nz = np.flatnonzero(v.any(axis=1)) if v.ndim == 2 else None
    if nz is not None and len(nz) < v.shape[0]:
        val, mag = np.zeros((v.shape[0], w.shape[0]), np.float64), np.zeros((v.shape[0], w.shape[0]), np.float64)
        if len(nz):
            val[nz], mag[nz] = _lin(w, v[nz], rows)
        return val, mag
    rows = rows or block_rows(w)
    vt = np.ascontiguousarray(v.T)
    val = np.empty((w.shape[0], vt.shape[1]), np.float64)
    mag = np.empty_like(val)
    if w.dtype.itemsize <= 4:
        av32 = _up32(np.abs(vt))
        abuf = np.empty((min(rows, w.shape[0]), w.shape[1]), np.float32)
        for i, get in _Blocks(w, rows):
            b = get(np.float64)
            val[i:i + rows] = b @ vt
            a = np.abs(get(np.float32), out=abuf[:b.shape[0]])
            mag[i:i + rows] = _magnitude32(a, av32, b)
        return val.T, mag.T
    avt = np.abs(vt)
    for i, get in _Blocks(w, rows):
        b = get(np.float64)
        val[i:i + rows] = b @ vt
        mag[i:i + rows] = np.abs(b) @ avt  # b is a view of w: not made absolute in place
    return val.T, mag.T


def _up32(a: np.ndarray) -> np.ndarray:
    """Nonnegative float64 ``a`` as float32, rounded up (each element ``>= a``; exact where ``a`` is a float32
    number, as the trajectory's states, the inputs and the probes are)."""
    r = a.astype(np.float32)
    low = r.astype(np.float64) < a
    if low.any():
        r[low] = np.nextafter(r[low], np.float32(np.inf))
    return r


def _magnitude32(a: np.ndarray, av: np.ndarray, b64: np.ndarray) -> np.ndarray:
    """An upper bound of ``a @ av`` (``a = |W|`` rows in float32, ``av >= |v|`` in float32, both nonnegative)
    from its float32 product ``s``: the exact sum of ``K`` nonnegative float32 products is at most
    ``(s + K * 2**-149) / (1 - gamma_K)`` (Higham eq. 3.5 for any summation order, fused or not; ``K * 2**-149``
    for products that fall below float32's normal range), computed in float64 and raised by ``(1 + 2**-50)``
    for that computation's own rounding. Where ``s`` overflows, the block's float64 rows ``b64`` (a buffer,
    made absolute here) give it in float64, raised by that sum's own error bound."""
    K = a.shape[1]
    s = (a @ av).astype(np.float64)
    out = (s + K * 2.0 ** -149) * ((1.0 + 2.0 ** -50) / (1.0 - _gamma(K, 2.0 ** -24)))
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        out[bad] = (np.abs(b64[bad]) @ av.astype(np.float64)) * ((1.0 + 2.0 ** -50) / (1.0 - _gamma(K, 2.0 ** -53)))
    return out


act_error_ = act_error


def step_with_bound(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
                    u: float, u_acc: float | None = None, parts: dict | None = None,
                    act_ulps: float | None = None) -> tuple[tuple, tuple]:
    """``(step(layer, p, x, h0, c0), step_bound(layer, p, x, h0, c0, u, u_acc))`` (float64), reading ``W_hh`` once
    for both: one pass (:func:`_lin`) over each of ``W_ih``, ``W_hh`` gives the products (the exact step's, and
    the bound's pre-activations) and their magnitudes (``|x| @ |W|.T``); the exact step is evaluated from those
    products by the bound's own elementwise code (:func:`_step_terms`: the equations of :func:`step`, in float64). ``parts``: a dict the products of the
    step are put into (``'xx'``, ``'hh'``: the ``(value, magnitude)`` pairs of :func:`_lin`), for
    :func:`swap_escapes`. ``act_ulps``: the activations' accuracy the bound allows (:func:`act_error`)."""
    h0 = np.asarray(h0, np.float64)
    hh, xx = _lin(p.w_hh, h0), _lin(p.w_ih, x)
    if parts is not None:
        parts.update(xx=xx, hh=hh)
    dh, dc, h1, c1 = _step_terms(layer, p, h0, c0, *xx, *hh, p.b_ih, p.b_hh, u, u_acc, act_ulps=act_ulps)
    return (h1, c1), (dh, dc)


def step_bound(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
               u: float, u_acc: float | None = None, hh: tuple | None = None,
               xx: tuple | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Bounds ``(dh, dc)`` (float64, shapes of ``h1``, ``c1``) of ``|h1' - h1|``, ``|c1' - c1|`` elementwise, where
    ``h1, c1`` is the exact step of :func:`step` from ``x, h0, c0`` and ``h1', c1'`` the same step computed by
    any implementation in floating point of unit roundoff ``u`` (float32: ``2**-24``) that holds the same
    weights and states (or rounds them once to its precision), sums in any order and evaluates its
    activations within :data:`ACT_ULPS` ulps. Forward error analysis, term by term:

    * a pre-activation ``z = W_ih x + b_ih + W_hh h + b_hh (+ p c)`` of ``n`` terms: ``|dz| <= (gamma_n(u_acc)
      + 4 u) * (|W_ih||x| + |b_ih| + |W_hh||h| + |b_hh| (+ |p||c|))`` (:func:`_gamma`): the sums accumulated
      at unit roundoff ``u_acc`` (default ``u``; float32 for float16 storage, as torch's CPU half GEMMs and
      cuDNN's float compute type accumulate), and ``4 u`` for rounding the weights, ``x``, ``h`` and the
      result to the storage precision once each;
    * an activation: :func:`act_error`;
    * a product ``a b`` of perturbed factors: ``|a| db + |b| da + da db + u |a b|``; a sum of two: the sum
      of the bounds plus ``u`` times the magnitudes; cell and projection clips are 1-Lipschitz;
    * GRU's update ``h' = (1 - z) n + z h``, in either algebraic form frameworks use
      (``n + z (h - n)``: PyTorch; ``z h + (1 - z) n``: Keras): ``(|h| + |n|) dz + (1 + |z|) dn + dz dn +
      4 u (|n| + |h| + |z| (|h| + |n|))``.

    The magnitudes are those of the exact step, computed here in float64 (its own error, ``~1e-16``
    relative, is far below the bound). ``hh``, ``xx``: ``_lin(p.w_hh, h0)``, ``_lin(p.w_ih, x)`` when the caller
    has them (:func:`step_with_bound`).
    """
    x, h0 = np.asarray(x, np.float64), np.asarray(h0, np.float64)
    zx, ax = _lin(p.w_ih, x) if xx is None else xx
    zh, ah = _lin(p.w_hh, h0) if hh is None else hh
    dh, dc, _, _ = _step_terms(layer, p, h0, c0, zx, ax, zh, ah, p.b_ih, p.b_hh, u, u_acc)
    return dh, dc


def _step_terms(layer: RNNLayer, p: DirectionParams, h0: np.ndarray, c0: np.ndarray | None, zx: np.ndarray,
                ax: np.ndarray, zh: np.ndarray, ah: np.ndarray, b_ih, b_hh, u: float, u_acc: float | None,
                units: np.ndarray | None = None, n_h: int | None = None, act_ulps: float | None = None):
    """The elementwise part of :func:`step_bound` from the products ``zx = x W_ih^T``, ``ax = |x||W_ih|^T``,
    ``zh``, ``ah`` (float64, ``(N, G*H)``) and the biases: ``(dh, dc, h1, c1)``, the bounds and the exact step
    they are bounds of (float64; ``c1`` None but for LSTM). :func:`swap_escapes` calls it on permuted
    products and biases, and on a subset of the hidden units: ``units`` (indices into ``0..H-1``) the units
    whose columns (of each gate block) ``zx``, ``ax``, ``zh``, ``ah``, the biases, ``h0`` and ``c0`` hold, in gate
    order; ``n_h`` the fan-in of ``W_hh`` (default ``h0.shape[1]``; the whole state's width when ``h0`` holds
    only ``units``). Every term but the fan-ins is elementwise per unit (LSTM without projection, GRU with
    ``reset_after``), so the subset's results are the whole computation's at those units."""
    f64 = np.float64
    ua = u if u_acc is None else u_acc

    def acc(n: int) -> float:
        return _gamma(n, ua) + 4.0 * u

    def act_error(name, z, dz, _u):  # evaluated at u_acc, then rounded to the storage precision
        return act_error_(name, z, dz, ua, ACT_ULPS if act_ulps is None else act_ulps) + u * (1.0 + np.abs(ACT[name](z)))

    s, cell, H = layer.semantics, layer.cell, layer.hidden_size
    I, out = p.w_ih.shape[1], (h0.shape[1] if n_h is None else n_h)
    if units is not None:
        H = len(units)  # the gate blocks of the columns given
    zero = np.zeros(p.w_ih.shape[0], f64)
    b_ih = zero if b_ih is None else np.asarray(b_ih, f64)
    b_hh = zero if b_hh is None else np.asarray(b_hh, f64)
    gact, act = s.gate_activation, s.activation
    if cell is Cell.LSTM:
        c0 = np.asarray(c0, f64)
        sl = {g: gate_slice(cell, g, H) for g in "ifgo"}
        z = zx + b_ih + zh + b_hh
        a = ax + np.abs(b_ih) + ah + np.abs(b_hh)
        n = I + out + 5  # both biases and the forget bias
        if p.peep is not None:
            pe = np.asarray(p.peep if units is None else p.peep[:, units], f64)
            z[:, sl["i"]] += pe[0] * c0
            z[:, sl["f"]] += pe[1] * c0
            a[:, sl["i"]] += np.abs(pe[0] * c0)
            a[:, sl["f"]] += np.abs(pe[1] * c0)
            n += 1
        dz = acc(n) * a
        zi, zf, zg = z[:, sl["i"]], z[:, sl["f"]] + s.forget_bias, z[:, sl["g"]]
        i, f, g = ACT[gact](zi), ACT[gact](zf), ACT[act](zg)
        di, df, dg = (act_error(gact, zi, dz[:, sl["i"]], u), act_error(gact, zf, dz[:, sl["f"]], u),
                      act_error(act, zg, dz[:, sl["g"]], u))
        c1 = f * c0 + i * g
        dc = np.abs(c0) * df + np.abs(g) * di + np.abs(i) * dg + di * dg + 3.0 * u * (np.abs(f * c0) + np.abs(i * g))
        if s.cell_clip is not None:
            c1 = np.clip(c1, -s.cell_clip, s.cell_clip)
        zo, dzo = z[:, sl["o"]], dz[:, sl["o"]]
        if p.peep is not None:
            zo = zo + pe[2] * c1
            dzo = acc(n) * (a[:, sl["o"]] + np.abs(pe[2] * c1)) + np.abs(pe[2]) * dc
        o, do = ACT[gact](zo), act_error(gact, zo, dzo, u)
        ac, dac = ACT[act](c1), act_error(act, c1, dc, u)
        hp = o * ac
        dh = np.abs(ac) * do + np.abs(o) * dac + do * dac + u * np.abs(hp)
        if p.w_hr is not None:
            hp, ahp = _lin(p.w_hr, hp)
            dh = abs_products(p.w_hr, np.ascontiguousarray(dh.T)).T + acc(H + 2) * ahp
            if s.proj_clip is not None:  # 1-Lipschitz: the bound stands
                hp = np.clip(hp, -s.proj_clip, s.proj_clip)
        return dh, dc, hp, c1
    if cell is Cell.GRU:
        r_sl, z_sl, n_sl = (gate_slice(cell, g, H) for g in "rzn")
        dzg = acc(I + out + 2)
        zr = zx[:, r_sl] + b_ih[..., r_sl] + zh[:, r_sl] + b_hh[..., r_sl]
        zz = zx[:, z_sl] + b_ih[..., z_sl] + zh[:, z_sl] + b_hh[..., z_sl]
        ar = ax[:, r_sl] + np.abs(b_ih[..., r_sl]) + ah[:, r_sl] + np.abs(b_hh[..., r_sl])
        az = ax[:, z_sl] + np.abs(b_ih[..., z_sl]) + ah[:, z_sl] + np.abs(b_hh[..., z_sl])
        r, dr = ACT[gact](zr), act_error(gact, zr, dzg * ar, u)
        zg, dzz = ACT[gact](zz), act_error(gact, zz, dzg * az, u)
        if s.reset_after:
            hn = zh[:, n_sl] + b_hh[..., n_sl]
            dhn = acc(out + 1) * (ah[:, n_sl] + np.abs(b_hh[..., n_sl]))
            npre = zx[:, n_sl] + b_ih[..., n_sl] + r * hn
            dn_pre = (acc(I + 2) * (ax[:, n_sl] + np.abs(b_ih[..., n_sl]) + np.abs(r * hn))
                      + np.abs(hn) * dr + np.abs(r) * dhn + dr * dhn)
        else:
            rh = r * h0
            drh = np.abs(h0) * dr + u * np.abs(rh)
            w_hn = p.w_hh[n_sl]
            whrh, awhrh = _lin(w_hn, rh)
            npre = zx[:, n_sl] + b_ih[..., n_sl] + whrh + b_hh[..., n_sl]
            dn_pre = (acc(I + out + 2) * (ax[:, n_sl] + np.abs(b_ih[..., n_sl]) + awhrh + np.abs(b_hh[..., n_sl]))
                      + abs_products(w_hn, np.ascontiguousarray(drh.T)).T)
        nn, dn = ACT[act](npre), act_error(act, npre, dn_pre, u)
        ah0, an, az_ = np.abs(h0), np.abs(nn), np.abs(zg)
        dh = (ah0 + an) * dzz + (1.0 + az_) * dn + dzz * dn + 4.0 * u * (an + ah0 + az_ * (ah0 + an))
        return dh, None, nn + zg * (h0 - nn), None
    z = zx + b_ih + zh + b_hh
    a = ax + np.abs(b_ih) + ah + np.abs(b_hh)
    return act_error(act, z, acc(I + out + 2) * a, u), None, ACT[act](z), None


#: swaps :func:`swap_escapes` evaluates in one elementwise pass (its temporaries: ``SWAP_CHUNK x rows x G*H``
#: float64 each, 2.6 MB for 8 swaps of 5 rows of an LSTM(2048))
SWAP_CHUNK = 8
#: the gate-block swaps :func:`swap_escapes` tries: the rows of two gate blocks exchanged in ``W_ih`` alone,
#: in ``W_hh`` alone, in both biases alone, and in all three (what a wrong gate order in a reader or writer
#: does)
SWAP_PARTS = ("W_ih", "W_hh", "bias", "all")
#: hidden units of the first round of :func:`swap_escapes` (evenly spaced): on the probes, these catch
#: nearly every swap of a large layer at a fraction of the cost of all ``H`` units (an LSTM(2048): 1/8)
SWAP_UNITS = 256


def swap_escapes(layer: RNNLayer, p: DirectionParams, h0: np.ndarray, c0: np.ndarray | None, parts: dict,
                 u: float, u_acc: float | None = None, rows=None, act_ulps: float | None = None) -> str | None:
    """Whether the one-step comparison, from these states, would fail every gate-block swap of ``p``: the
    first swap that could pass it (a description, e.g. ``"gates f and g swapped in W_hh"``), ``None`` when
    every one is caught, or ``"n/a: ..."`` when this cell cannot be checked this way.

    A swap is caught when at some element ``j`` (of ``h_1`` or ``c_1``, over the states ``rows``, default all:
    fewer states can only make this harder) the
    swapped file's exact step differs from the correct one by
    more than the correct step's bound plus the swapped step's own bound: any float evaluation of the
    swapped file then lies outside the correct step's bound there, and the comparison fails it. Computed from
    the step's products (``parts`` of :func:`step_with_bound`) with the gate blocks of their columns
    permuted (a swap of weight rows permutes the product's columns), with no new pass over the weights.
    LSTM (without projection) and GRU with ``reset_after``; others (their swapped step needs a new product,
    or they have one gate) say ``n/a``. Cost: ``4 * G (G - 1) / 2`` elementwise evaluations of ``rows x G*H``,
    stacked a few swaps at a time (:data:`SWAP_CHUNK`), in rounds on more and more elements, each for the swaps
    the rounds before left: the last :data:`N_PROBES` rows (verification's probes, :func:`probe_rows`: they
    catch most swaps) at :data:`SWAP_UNITS` evenly spaced hidden units, the probes at every unit, all ``rows``.
    The answer is the same as one round on every element (a swap caught by some element is caught)."""
    cell, s, H = layer.cell, layer.semantics, layer.hidden_size
    if cell.gates == 1:
        return "n/a: a simple RNN has no gate blocks to swap"
    if p.w_hr is not None:
        return "n/a: a projected LSTM's swapped step needs a new product"
    if cell is Cell.GRU and not s.reset_after:
        return "n/a: a reset-before GRU's swapped step needs a new product"
    n = np.arange(h0.shape[0]) if rows is None else np.asarray(np.r_[rows])
    letters, G = CANONICAL[cell], cell.gates
    swaps = [(f"gates {ga} and {gb} swapped in "
              f"{'the biases' if what == 'bias' else 'W_ih, W_hh and the biases' if what == 'all' else what}",
              (letters.index(ga), letters.index(gb)), what)
             for a_i, ga in enumerate(letters) for gb in letters[a_i + 1:] for what in SWAP_PARTS]
    # Rounds, each on more elements, for the swaps the rounds before left: the probes (the last rows: their
    # bound is a few u, they catch most swaps) on a few hidden units, the probes on every unit, then every
    # row. A swap is caught when some element shows it, so a subset can only leave more swaps for later.
    probes = n[n >= h0.shape[0] - N_PROBES]
    first = probes if len(probes) else n
    rounds = []
    if H > SWAP_UNITS:
        rounds.append((first, np.unique(np.linspace(0, H - 1, SWAP_UNITS).astype(np.intp))))
    rounds += [(sel, None) for sel in ([probes, n] if 0 < len(probes) < len(n) else [n])]
    zero = np.zeros(parts["xx"][0].shape[1])
    b_ih, b_hh = (zero if b is None else np.asarray(b, np.float64) for b in (p.b_ih, p.b_hh))
    for sel, units in rounds:
        cols = slice(None) if units is None else (np.arange(G)[:, None] * H + units).ravel()
        ucols = slice(None) if units is None else units
        chosen = (np.asarray(h0[sel][:, ucols], np.float64),
                  None if c0 is None else np.asarray(c0[sel][:, ucols], np.float64),
                  *(a[sel][:, cols] for pair in (parts["xx"], parts["hh"]) for a in pair))
        biases = (b_ih[cols], b_hh[cols])
        sub = {"act_ulps": act_ulps} if units is None else {"units": units, "n_h": h0.shape[1], "act_ulps": act_ulps}
        correct = _step_terms(layer, p, *chosen, *biases, u, u_acc, **sub)  # once per set of elements
        swaps = [sw for j in range(0, len(swaps), SWAP_CHUNK)  # a few swaps at a time: bounded temporaries
                 for sw in _uncaught(layer, p, chosen, biases, correct, u, u_acc, swaps[j:j + SWAP_CHUNK], sub)]
        if not swaps:
            return None
    return swaps[0][0]


def _swap_order(blocks: int, hc: int, pair: tuple[int, int]) -> np.ndarray:
    """The column order of ``blocks`` gate blocks of ``hc`` columns each with blocks ``pair`` exchanged."""
    order = np.arange(blocks * hc)
    a, b = pair
    order[a * hc:(a + 1) * hc], order[b * hc:(b + 1) * hc] = np.arange(b * hc, (b + 1) * hc), np.arange(a * hc, (a + 1) * hc)
    return order


def _uncaught(layer: RNNLayer, p: DirectionParams, rows: tuple, biases: tuple, correct: tuple, u: float, u_acc,
              swaps: list, sub: dict) -> list:
    """The entries of ``swaps`` (``(description, (gate block a, gate block b), where)``, ``where`` one of
    :data:`SWAP_PARTS`) that the one-step comparison on the elements ``rows`` (``(h0, c0, zx, ax, zh, ah)`` of
    the chosen rows, and units: ``sub``, the ``units``/``n_h`` of :func:`_step_terms`) would not catch
    (:func:`swap_escapes`): every swapped step evaluated by :func:`_step_terms` at once, the swaps' rows
    stacked (their biases per row), against the correct step ``correct`` (``_step_terms`` of ``rows``)."""
    h0, c0, zx, ax, zh, ah = rows
    dh, dc, h1, c1 = correct
    V, m = len(swaps), h0.shape[0]
    G = layer.cell.gates
    ident = np.arange(zx.shape[1])
    orders = [[_swap_order(G, zx.shape[1] // G, pair) if what in (k, "all") else ident
               for k in ("W_ih", "W_hh", "bias")] for _, pair, what in swaps]

    def stack(arr, k):  # (V * m, G*H): the columns of ``arr`` in each swap's order ``k``
        return np.concatenate([arr[:, o[k]] for o in orders])
    bi, bh = (np.repeat(np.stack([b[o[2]] for o in orders]), m, axis=0) for b in biases)
    tile = (lambda a: None if a is None else np.tile(a, (V, 1)))
    mdh, mdc, mh1, mc1 = _step_terms(layer, p, tile(h0), tile(c0), stack(zx, 0), stack(ax, 0), stack(zh, 1),
                                     stack(ah, 1), bi, bh, u, u_acc, **sub)
    caught = (np.abs(mh1 - tile(h1)) > tile(dh) + mdh).reshape(V, -1).any(axis=1)
    if c1 is not None:
        caught |= (np.abs(mc1 - tile(c1)) > tile(dc) + mdc).reshape(V, -1).any(axis=1)
    return [sw for sw, ok in zip(swaps, caught) if not ok]


#: how many probe rows :func:`probe_rows` makes
N_PROBES = 3


def probe_rows(cell: Cell, n_in: int, n_out: int, hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(x, h0, c0)`` of :data:`N_PROBES` one-step probes (float32, ``(3, n_in)``, ``(3, n_out)``, ``(3, hidden)``
    or None but for LSTM) that verification appends to the states of the one-step comparison: a zero input
    and state (the step is then a function of the biases alone), a one-hot input (one column of ``W_ih``) and
    a one-hot state (one column of ``W_hh``); ``c0 = 1`` so that the forget gate shows. Each pre-activation
    has at most one nonzero product, so its bound is a few ``u`` of that weight and the biases: a gate swap
    in the biases or the weights moves these steps far beyond it even where the bound of the random states
    is loose (large fan-in, wide-range inputs; :func:`swap_escapes`)."""
    x = np.zeros((N_PROBES, n_in), np.float32)
    h = np.zeros((N_PROBES, n_out), np.float32)
    x[1, 0] = 1.0
    h[2, 0] = 1.0
    return x, h, (np.ones((N_PROBES, hidden), np.float32) if cell is Cell.LSTM else None)
