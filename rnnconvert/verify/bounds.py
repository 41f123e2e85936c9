"""The one-step error bound of verification's step rule (:mod:`.engine`): a float64 step of the canonical
equations (:func:`rnnconvert.core.reference.step`'s equations, evaluated by :func:`step_terms`) together with a
rigorous bound on how far a correct float32 (or float16) evaluation of that step can be from it: the products'
rounding (Higham's ``gamma_n``, :func:`_gamma`), the activations' accuracy (:func:`act_error`, :data:`ACT_ULPS`
ulps or what the target declares: :attr:`rnnconvert.engine.protocol.Runtime.act_ulps`) and their propagation
through the gates. docs/cli.md "Verdicts" states the rule and its proof.
"""

from __future__ import annotations

import numpy as np

from ..core.gates import gate_slice
from ..core.model import Cell, DirectionParams, RNNLayer
from ..core.reference import ACT
from ..speed import gpu, parallel
from ..speed.kernels import Blocks, block_rows


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
        s = ACT["sigmoid"](z)
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

    def piece(lo: int, hi: int) -> None:
        for i, get in Blocks(w[lo:hi], rows):
            out[lo + i:lo + i + rows] = np.abs(get(np.float64)) @ v
    parallel.run(piece, parallel.split(w.shape[0], rows, w.nbytes))
    return out


def lin(w: np.ndarray, v: np.ndarray, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(v @ w.T, M)`` in float64, ``v`` ``(N, K)``, ``w`` ``(M, K)``: the value, and an upper bound ``M >=
    |v| @ |w|.T`` of its magnitude (elementwise), in one pass over ``w``, a block of rows at a time
    (:class:`~rnnconvert.speed.kernels.Blocks`): each block cast to float64 once for the value.

    The magnitude of float32 and float16 weights is summed in float32 (:func:`_magnitude32`: half the bytes
    and twice the speed of a float64 pass; ``M`` exceeds the exact ``|v| @ |w|.T`` by at most a relative
    ``2 gamma_K(2**-24)``, 3.7e-4 for ``K = 6144``, far below what the bound's ``gamma_n`` already allows); float64
    weights keep a float64 pass (``|v| @ |w|.T`` to float64 rounding: the bound's own rounding is far
    below the float32 ``u`` it bounds).

    Rows of ``v`` that are all zero (the zero states of a trajectory's first step, the zero probes of
    :func:`.escapes.probe_rows`) give value and magnitude 0 without entering the products: exact, as ``0 * w`` is 0
    for the finite weights readers admit; of the 11 rows of the issue #18 sample's ``W_hh`` step, 6 are zero.
    Rows with one nonzero element ``v[r, j]`` (the one-hot probes) are column ``j`` of ``w`` times it, without
    a product either (exact for float32 factors; the magnitude raised by ``2**-50`` for a float64 one): a
    product of 8 columns costs two thirds of one of 9 (OpenBLAS on the 2-core machine, docs/performance.md
    session 13), and the one-hot probes were the 9th column of ``W_ih``'s and the 5th of ``W_hh``'s."""
    v = np.asarray(v, np.float64)
    count = np.count_nonzero(v, axis=1) if v.ndim == 2 else None
    if count is not None and (count <= 1).any():
        val, mag = np.zeros((v.shape[0], w.shape[0]), np.float64), np.zeros((v.shape[0], w.shape[0]), np.float64)
        for r in np.flatnonzero(count == 1):  # one nonzero v[r, j]: w[:, j] * v[r, j], exact in float64 (two
            j = int(np.flatnonzero(v[r])[0])      # float32 factors; float64 weights: one rounding, as any product)
            val[r] = w[:, j].astype(np.float64) * v[r, j]
            mag[r] = np.abs(val[r]) * (1.0 + 2.0 ** -50)  # above |w_j v_j| even where the product rounded
        many = np.flatnonzero(count > 1)
        if len(many):
            val[many], mag[many] = lin(w, v[many], rows)
        return val, mag
    if gpu.active():  # --device cuda: the products on the GPU (speed/gpu.py)
        return gpu.lin(w, v)
    rows = rows or block_rows(w)
    vt = np.ascontiguousarray(v.T)
    val = np.empty((w.shape[0], vt.shape[1]), np.float64)
    mag = np.empty_like(val)
    pieces = parallel.split(w.shape[0], rows, w.nbytes)  # rows of w shared between threads (speed/parallel.py)
    if w.dtype.itemsize <= 4:
        av32 = up32(np.abs(vt))

        def piece(lo: int, hi: int) -> None:
            abuf = np.empty((min(rows, hi - lo), w.shape[1]), np.float32)
            for i, get in Blocks(w[lo:hi], rows):
                b = get(np.float64)
                val[lo + i:lo + i + rows] = b @ vt
                a = np.abs(get(np.float32), out=abuf[:b.shape[0]])
                mag[lo + i:lo + i + rows] = _magnitude32(a, av32, b)
        parallel.run(piece, pieces)
        return val.T, mag.T
    avt = np.abs(vt)

    def piece64(lo: int, hi: int) -> None:
        for i, get in Blocks(w[lo:hi], rows):
            b = get(np.float64)
            val[lo + i:lo + i + rows] = b @ vt
            mag[lo + i:lo + i + rows] = np.abs(b) @ avt  # b is a view of w: not made absolute in place
    parallel.run(piece64, pieces)
    return val.T, mag.T


def up32(a: np.ndarray) -> np.ndarray:
    """Nonnegative float64 ``a`` as float32, rounded up (each element ``>= a``; exact where ``a`` is a float32
    number, as the trajectory's states, the inputs and the probes are)."""
    r = a.astype(np.float32)
    low = r.astype(np.float64) < a
    if low.any():
        r[low] = np.nextafter(r[low], np.float32(np.inf))
    return r


def magnitude_bound32(s: np.ndarray, K: int) -> np.ndarray:
    """An upper bound (float64) of the exact sum of ``K`` nonnegative float32 products that float32 arithmetic
    summed to ``s`` in any order, fused or not: ``(s + K * 2**-149) / (1 - gamma_K)`` (Higham eq. 3.5; ``K *
    2**-149`` for products below float32's normal range), raised by ``(1 + 2**-50)`` for this computation's own
    rounding. Infinite where ``s`` overflowed."""
    return (np.asarray(s, np.float64) + K * 2.0 ** -149) * ((1.0 + 2.0 ** -50) / (1.0 - _gamma(K, 2.0 ** -24)))


def _magnitude32(a: np.ndarray, av: np.ndarray, b64: np.ndarray) -> np.ndarray:
    """An upper bound of ``a @ av`` (``a = |W|`` rows in float32, ``av >= |v|`` in float32, both nonnegative)
    from its float32 product ``s``: the exact sum of ``K`` nonnegative float32 products is at most
    ``(s + K * 2**-149) / (1 - gamma_K)`` (Higham eq. 3.5 for any summation order, fused or not; ``K * 2**-149``
    for products that fall below float32's normal range), computed in float64 and raised by ``(1 + 2**-50)``
    for that computation's own rounding. Where ``s`` overflows, the block's float64 rows ``b64`` (a buffer,
    made absolute here) give it in float64, raised by that sum's own error bound."""
    K = a.shape[1]
    out = magnitude_bound32(a @ av, K)
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        out[bad] = (np.abs(b64[bad]) @ av.astype(np.float64)) * ((1.0 + 2.0 ** -50) / (1.0 - _gamma(K, 2.0 ** -53)))
    return out


def step_with_bound(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
                    u: float, u_acc: float | None = None, parts: dict | None = None,
                    act_ulps: float | None = None, xx: tuple | None = None) -> tuple[tuple, tuple]:
    """``(step(layer, p, x, h0, c0), step_bound(layer, p, x, h0, c0, u, u_acc))`` (float64), reading ``W_hh`` once
    for both: one pass (:func:`lin`) over each of ``W_ih``, ``W_hh`` gives the products (the exact step's, and
    the bound's pre-activations) and their magnitudes (``|x| @ |W|.T``); the exact step is evaluated from those
    products by the bound's own elementwise code (:func:`step_terms`: the equations of :func:`rnnconvert.core.reference.step`, in float64). ``parts``: a dict the products of the
    step are put into (``'xx'``, ``'hh'``: the ``(value, magnitude)`` pairs of :func:`lin`), for
    :func:`.escapes.swap_escapes`. ``act_ulps``: the activations' accuracy the bound allows (:func:`act_error`). ``xx``: the
    ``(value, magnitude)`` pair of ``W_ih x`` where the caller has it (the float64 products of the source's own
    equations, :mod:`rnnconvert.verify.keras_equations`): no pass over ``W_ih`` is made then."""
    h0 = np.asarray(h0, np.float64)
    hh = lin(p.w_hh, h0)
    xx = lin(p.w_ih, x) if xx is None else xx
    if parts is not None:
        parts.update(xx=xx, hh=hh)
    dh, dc, h1, c1 = step_terms(layer, p, h0, c0, *xx, *hh, p.b_ih, p.b_hh, u, u_acc, act_ulps=act_ulps)
    return (h1, c1), (dh, dc)


def step_bound(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
               u: float, u_acc: float | None = None, hh: tuple | None = None,
               xx: tuple | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Bounds ``(dh, dc)`` (float64, shapes of ``h1``, ``c1``) of ``|h1' - h1|``, ``|c1' - c1|`` elementwise, where
    ``h1, c1`` is the exact step of :func:`rnnconvert.core.reference.step` from ``x, h0, c0`` and ``h1', c1'`` the same step computed by
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
    relative, is far below the bound). ``hh``, ``xx``: ``lin(p.w_hh, h0)``, ``lin(p.w_ih, x)`` when the caller
    has them (:func:`step_with_bound`).
    """
    x, h0 = np.asarray(x, np.float64), np.asarray(h0, np.float64)
    zx, ax = lin(p.w_ih, x) if xx is None else xx
    zh, ah = lin(p.w_hh, h0) if hh is None else hh
    dh, dc, _, _ = step_terms(layer, p, h0, c0, zx, ax, zh, ah, p.b_ih, p.b_hh, u, u_acc)
    return dh, dc


def step_terms(layer: RNNLayer, p: DirectionParams, h0: np.ndarray, c0: np.ndarray | None, zx: np.ndarray,
                ax: np.ndarray, zh: np.ndarray, ah: np.ndarray, b_ih, b_hh, u: float, u_acc: float | None,
                units: np.ndarray | None = None, n_h: int | None = None, act_ulps: float | None = None,
                n_products=None):
    """The elementwise part of :func:`step_bound` from the products ``zx = x W_ih^T``, ``ax = |x||W_ih|^T``,
    ``zh``, ``ah`` (float64, ``(N, G*H)``) and the biases: ``(dh, dc, h1, c1)``, the bounds and the exact step
    they are bounds of (float64; ``c1`` None but for LSTM). :func:`.escapes.swap_escapes` calls it on permuted
    products and biases, and on a subset of the hidden units: ``units`` (indices into ``0..H-1``) the units
    whose columns (of each gate block) ``zx``, ``ax``, ``zh``, ``ah``, the biases, ``h0`` and ``c0`` hold, in gate
    order; ``n_h`` the fan-in of ``W_hh`` (default ``h0.shape[1]``; the whole state's width when ``h0`` holds
    only ``units``). Every term but the fan-ins is elementwise per unit (LSTM without projection, GRU with
    ``reset_after``), so the subset's results are the whole computation's at those units.

    ``n_products``: a reset-before GRU's candidate product, ``f(rh, drh) -> (W rh, |W| |rh|, |W| drh)`` for
    ``rh = r * h0`` and its bound ``drh`` (float64 ``(N, H)``), rows of ``W`` the ``n`` block of ``W_hh``
    by default; :func:`~.escapes.swap_escapes` passes another block of ``W_hh`` (a slipped file's ``n``
    gate) or a transposed one."""
    f64 = np.float64
    ua = u if u_acc is None else u_acc

    def acc(n: int) -> float:
        return _gamma(n, ua) + 4.0 * u

    def act_err(name, z, dz, _u):  # evaluated at u_acc, then rounded to the storage precision
        return act_error(name, z, dz, ua, ACT_ULPS if act_ulps is None else act_ulps) + u * (1.0 + np.abs(ACT[name](z)))

    s, cell, H = layer.semantics, layer.cell, layer.hidden_size
    I, out = p.w_ih.shape[1], (h0.shape[1] if n_h is None else n_h)
    if units is not None:
        H = len(units)  # the gate blocks of the columns given
    zero = np.zeros(p.w_ih.shape[0], f64)
    b_ih = zero if b_ih is None else np.asarray(b_ih, f64)
    b_hh = zero if b_hh is None else np.asarray(b_hh, f64)
    gact, act = s.gate_activation, s.activation
    if cell is Cell.LSTM:
        return _lstm_terms(layer, p, H, I, out, c0, zx, ax, zh, ah, b_ih, b_hh, u, units, acc, act_err)
    if cell is Cell.GRU:
        return _gru_terms(layer, p, H, I, out, h0, zx, ax, zh, ah, b_ih, b_hh, u, acc, act_err, n_products)
    z = zx + b_ih + zh + b_hh
    a = ax + np.abs(b_ih) + ah + np.abs(b_hh)
    return act_err(act, z, acc(I + out + 2) * a, u), None, ACT[act](z), None


def _lstm_terms(layer: RNNLayer, p: DirectionParams, H: int, I: int, out: int, c0, zx, ax, zh, ah, b_ih, b_hh,
                u: float, units, acc, act_err):
    """:func:`step_terms` of an LSTM (``acc(n)``: the accumulation bound of ``n`` terms; ``act_err``: an
    activation's error bound, both :func:`step_terms`')."""
    s, cell, f64 = layer.semantics, layer.cell, np.float64
    gact, act = s.gate_activation, s.activation
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
    di, df, dg = (act_err(gact, zi, dz[:, sl["i"]], u), act_err(gact, zf, dz[:, sl["f"]], u),
                  act_err(act, zg, dz[:, sl["g"]], u))
    c1 = f * c0 + i * g
    dc = np.abs(c0) * df + np.abs(g) * di + np.abs(i) * dg + di * dg + 3.0 * u * (np.abs(f * c0) + np.abs(i * g))
    if s.cell_clip is not None:
        c1 = np.clip(c1, -s.cell_clip, s.cell_clip)
    zo, dzo = z[:, sl["o"]], dz[:, sl["o"]]
    if p.peep is not None:
        zo = zo + pe[2] * c1
        dzo = acc(n) * (a[:, sl["o"]] + np.abs(pe[2] * c1)) + np.abs(pe[2]) * dc
    o, do = ACT[gact](zo), act_err(gact, zo, dzo, u)
    ac, dac = ACT[act](c1), act_err(act, c1, dc, u)
    hp = o * ac
    dh = np.abs(ac) * do + np.abs(o) * dac + do * dac + u * np.abs(hp)
    if p.w_hr is not None:
        hp, ahp = lin(p.w_hr, hp)
        dh = abs_products(p.w_hr, np.ascontiguousarray(dh.T)).T + acc(H + 2) * ahp
        if s.proj_clip is not None:  # 1-Lipschitz: the bound stands
            hp = np.clip(hp, -s.proj_clip, s.proj_clip)
    return dh, dc, hp, c1


def _gru_terms(layer: RNNLayer, p: DirectionParams, H: int, I: int, out: int, h0, zx, ax, zh, ah, b_ih, b_hh,
               u: float, acc, act_err, n_products):
    """:func:`step_terms` of a GRU (reset gate before or after the recurrent product; see :func:`_lstm_terms`)."""
    s, cell, f64 = layer.semantics, layer.cell, np.float64
    gact, act = s.gate_activation, s.activation
    r_sl, z_sl, n_sl = (gate_slice(cell, g, H) for g in "rzn")
    dzg = acc(I + out + 2)
    zr = zx[:, r_sl] + b_ih[..., r_sl] + zh[:, r_sl] + b_hh[..., r_sl]
    zz = zx[:, z_sl] + b_ih[..., z_sl] + zh[:, z_sl] + b_hh[..., z_sl]
    ar = ax[:, r_sl] + np.abs(b_ih[..., r_sl]) + ah[:, r_sl] + np.abs(b_hh[..., r_sl])
    az = ax[:, z_sl] + np.abs(b_ih[..., z_sl]) + ah[:, z_sl] + np.abs(b_hh[..., z_sl])
    r, dr = ACT[gact](zr), act_err(gact, zr, dzg * ar, u)
    zg, dzz = ACT[gact](zz), act_err(gact, zz, dzg * az, u)
    if s.reset_after:
        hn = zh[:, n_sl] + b_hh[..., n_sl]
        dhn = acc(out + 1) * (ah[:, n_sl] + np.abs(b_hh[..., n_sl]))
        npre = zx[:, n_sl] + b_ih[..., n_sl] + r * hn
        dn_pre = (acc(I + 2) * (ax[:, n_sl] + np.abs(b_ih[..., n_sl]) + np.abs(r * hn))
                  + np.abs(hn) * dr + np.abs(r) * dhn + dr * dhn)
    else:
        rh = r * h0
        drh = np.abs(h0) * dr + u * np.abs(rh)
        if n_products is None:
            w_hn = p.w_hh[n_sl]
            whrh, awhrh = lin(w_hn, rh)
            dprod = abs_products(w_hn, np.ascontiguousarray(drh.T)).T
        else:
            whrh, awhrh, dprod = n_products(rh, drh)
        npre = zx[:, n_sl] + b_ih[..., n_sl] + whrh + b_hh[..., n_sl]
        dn_pre = (acc(I + out + 2) * (ax[:, n_sl] + np.abs(b_ih[..., n_sl]) + awhrh + np.abs(b_hh[..., n_sl]))
                  + dprod)
    nn, dn = ACT[act](npre), act_err(act, npre, dn_pre, u)
    ah0, an, az_ = np.abs(h0), np.abs(nn), np.abs(zg)
    dh = (ah0 + an) * dzz + (1.0 + az_) * dn + dzz * dn + 4.0 * u * (an + ah0 + az_ * (ah0 + an))
    return dh, None, nn + zg * (h0 - nn), None
