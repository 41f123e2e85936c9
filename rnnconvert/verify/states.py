"""Verification states chosen from the weights, so that every unit of every gate is exercised (issue #39).

The one-step comparison (:mod:`.engine`) starts the target from the source's own trajectory states and three
probes. A unit whose gate pre-activation stays where the gate's slope is zero or negligible on all of them
(Keras 2 ``hard_sigmoid`` outside ``[-2.5, 2.5]``; a sigmoid at ``|z| > 7``) hides its weights: zeroing them,
or moving its bias by -5, leaves every compared number unchanged. A one-step check may start from any ``(x,
h, c)``, so this module

* measures, per state and gate row, the *gain* ``|d out / d z|`` of the step's outputs (``h_1`` and ``c_1``)
  with respect to that row's pre-activation (:func:`gains`: the chain rule through the canonical equations of
  :func:`rnnconvert.core.reference.step`, in float64, from the products the bound computes anyway), and
  counts the states in which each row is *responsive* (gain at least :data:`RESPONSIVE`);
* constructs states for the rows responsive in fewer than :data:`WANT` states (:func:`construct`): for a group
  of units, the minimum-norm ``(x, h)`` whose pre-activations of all their gates hit targets inside the gates'
  responsive band (least squares on the rows ``[W_ih | W_hh]`` of those units; a GRU's reset-before candidate
  by a fixed point on ``r``), clipped to the range of the layer's inputs and of its states (``|h| <= 1`` for
  bounded activations). Groups hold at most ``(I + H) / (2 G)`` units, so the system is well under-determined.

* first adds *wide* states (:func:`widen`): the same system solved nearest a start at the full ranges with random
  signs, so that each group's rows are in band while most of ``x`` and ``h`` stay large, for the single-weight
  resolution (:func:`resolution`); their bound is kept under :data:`WIDE_LOOSE` of the output's scale.

A row still unresponsive after :data:`ROUNDS` rounds is *unexercised*: it is named, and the layer's verdict is
``inconclusive``, never ``ok`` (:meth:`rnnconvert.verify.engine.StreamedVerification.judge`). docs/cli.md
"Verdicts" states the rule.
"""

from __future__ import annotations

import numpy as np

from ..core.gates import CANONICAL, gate_slice
from ..core.model import Cell, DirectionParams, RNNLayer
from ..core.reference import ACT

#: a gate row is responsive in a state when an output's derivative w.r.t. its pre-activation is at least this
#: (sigmoid: ``|z| < 6.9``; hard_sigmoid: inside its linear band, at a slope of 0.2 times what follows)
RESPONSIVE = 1e-3
#: each gate row is wanted responsive in this many states (two: a weight's input element is small in one
#: state by chance, rarely in two)
WANT = 2
#: rounds of construction (each one evaluation of the constructed states: one pass over the weights)
ROUNDS = 2
#: at most this many constructed states per direction and round
MAX_STATES = 32

#: the pre-activation targets of the constructed states, per activation: inside the responsive band
_BAND = {"hard_sigmoid": (-1.5, 1.5), "hard_sigmoid_k3": (-2.0, 2.0), "sigmoid": (-1.5, 1.5), "tanh": (-0.8, 0.8),
         "softsign": (-1.0, 1.0), "relu": (0.2, 1.0), "linear": (-1.0, 1.0)}


def slope(name: str, z: np.ndarray) -> np.ndarray:
    """``act'(z)`` of an activation of :data:`rnnconvert.core.reference.ACT` (float64; a piecewise-linear one's
    slope is 0 at and outside its kinks: the side where a change may be invisible)."""
    z = np.asarray(z, np.float64)
    if name == "sigmoid":
        s = ACT["sigmoid"](z)
        return s * (1.0 - s)
    if name == "tanh":
        return 1.0 - np.tanh(z) ** 2
    if name == "softsign":
        return 1.0 / (1.0 + np.abs(z)) ** 2
    if name == "hard_sigmoid":
        return np.where(np.abs(z) < 2.5, 0.2, 0.0)
    if name == "hard_sigmoid_k3":
        return np.where(np.abs(z) < 3.0, 1.0 / 6.0, 0.0)
    if name == "relu":
        return (z > 0).astype(np.float64)
    return np.ones_like(z)  # linear


def _inverse_slope(name: str, a: np.ndarray) -> np.ndarray:
    """``act'`` as a function of ``a = act(z)`` (a reset-before GRU's candidate, recovered from ``h_1``)."""
    if name == "tanh":
        return 1.0 - np.clip(a, -1.0, 1.0) ** 2
    if name == "softsign":
        return (1.0 - np.minimum(np.abs(a), 1.0)) ** 2
    if name == "sigmoid":
        a = np.clip(a, 0.0, 1.0)
        return a * (1.0 - a)
    if name == "relu":
        return (a > 0).astype(np.float64)
    if name in ("hard_sigmoid", "hard_sigmoid_k3"):
        return np.where((a > 0) & (a < 1), 0.2 if name == "hard_sigmoid" else 1.0 / 6.0, 0.0)
    return np.ones_like(a)


def _bias(p: DirectionParams) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(p.b_ih, np.float64), np.asarray(p.b_hh, np.float64)


def gains(layer: RNNLayer, p: DirectionParams, h0: np.ndarray, c0: np.ndarray | None, zx: np.ndarray,
          zh: np.ndarray, h1: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(g_ih, g_hh, rh)``: per state (row of ``h0``) and gate row (canonical ``(G*H)``), ``|d out / d v|`` for
    ``v`` the row's product ``W_ih x`` (``g_ih``) and ``W_hh h`` (``g_hh``), ``out`` the step's ``h_1`` or
    ``c_1`` element it reaches (the largest; float64 ``(N, G*H)``). ``zx``, ``zh``: the products ``x W_ih^T``,
    ``h0 W_hh^T`` (float64 ``(N, G*H)``, as :func:`rnnconvert.verify.bounds.lin` gives them); ``h1``: the exact
    step's ``h_1``. ``rh``: a reset-before GRU's ``r * h0`` (the vector its ``W_hn`` multiplies), else None.
    A reset-before GRU's reset gate reaches every candidate through ``W_hn``: its gain is a lower bound, the
    largest of the 8 candidates of largest gain (no pass over ``W_hn``)."""
    s, cell, H = layer.semantics, layer.cell, layer.hidden_size
    b_ih, b_hh = _bias(p)
    h0 = np.asarray(h0, np.float64)
    if cell is Cell.LSTM:
        g = _lstm_gains(layer, p, c0, zx + b_ih + zh + b_hh)
        return g, g, None
    if cell is not Cell.GRU:
        g = slope(s.activation, zx + b_ih + zh + b_hh)
        return g, g, None
    r_sl, z_sl, n_sl = (gate_slice(cell, k, H) for k in "rzn")
    zr = zx[:, r_sl] + b_ih[r_sl] + zh[:, r_sl] + b_hh[r_sl]
    zz = zx[:, z_sl] + b_ih[z_sl] + zh[:, z_sl] + b_hh[z_sl]
    r, zg = ACT[s.gate_activation](zr), ACT[s.gate_activation](zz)
    g_ih, g_hh = np.zeros_like(zx), np.zeros_like(zx)
    rh = None
    if s.reset_after:
        hn = zh[:, n_sl] + b_hh[n_sl]
        npre = zx[:, n_sl] + b_ih[n_sl] + r * hn
        n, q = ACT[s.activation](npre), (1.0 - zg) * slope(s.activation, npre)
        g_ih[:, r_sl] = q * np.abs(hn) * slope(s.gate_activation, zr)
        g_ih[:, n_sl], g_hh[:, n_sl] = q, q * np.abs(r)
    else:
        h1 = np.asarray(h1, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):  # n from h1 = n + z (h0 - n); z = 1: n unseen
            n = np.where(zg < 1.0, (h1 - zg * h0) / np.where(zg < 1.0, 1.0 - zg, 1.0), 0.0)
        q = (1.0 - zg) * _inverse_slope(s.activation, n)
        top = np.argsort(-q, axis=1)[:, :8]  # the candidates of largest gain: r_j reaches them through W_hn[i, j]
        w_hn = p.w_hh[n_sl]
        reach = np.max([q[np.arange(len(q)), t][:, None] * np.abs(w_hn[t].astype(np.float64)) for t in top.T], axis=0)
        g_ih[:, r_sl] = reach * np.abs(h0) * slope(s.gate_activation, zr)
        g_ih[:, n_sl] = g_hh[:, n_sl] = q
        rh = r * h0
    g_ih[:, z_sl] = np.abs(h0 - n) * slope(s.gate_activation, zz)
    g_hh[:, r_sl], g_hh[:, z_sl] = g_ih[:, r_sl], g_ih[:, z_sl]
    return g_ih, g_hh, rh


def _lstm_gains(layer: RNNLayer, p: DirectionParams, c0: np.ndarray, z: np.ndarray) -> np.ndarray:
    """An LSTM's gains (:func:`gains`) from its pre-activations ``z`` (``W x + b + W h + b``, float64): through
    ``c_1`` for ``i, f, g`` and through ``h_1`` (projected: times the largest ``|W_hr|`` of the unit's column)
    for all four. Peepholes add their terms to the pre-activations (their own gain through ``c_1`` is left out)."""
    s, H = layer.semantics, layer.hidden_size
    sl = {k: gate_slice(Cell.LSTM, k, H) for k in "ifgo"}
    c0 = np.asarray(c0, np.float64)
    zi, zf, zg, zo = (z[:, sl[k]].copy() for k in "ifgo")
    zf += s.forget_bias
    if p.peep is not None:
        pe = np.asarray(p.peep, np.float64)
        zi += pe[0] * c0
        zf += pe[1] * c0
    ga, act = s.gate_activation, s.activation
    i, f, gg = ACT[ga](zi), ACT[ga](zf), ACT[act](zg)
    c1 = f * c0 + i * gg
    live = np.ones_like(c1) if s.cell_clip is None else (np.abs(c1) < s.cell_clip).astype(np.float64)
    if p.peep is not None:
        zo += np.asarray(p.peep, np.float64)[2] * np.clip(c1, -(s.cell_clip or np.inf), s.cell_clip or np.inf)
    o = ACT[ga](zo)
    dc = {"i": np.abs(gg) * slope(ga, zi) * live, "f": np.abs(c0) * slope(ga, zf) * live,
          "g": np.abs(i) * slope(act, zg) * live}
    out_c = np.abs(o) * slope(act, c1)  # d m / d c_1, m = o act(c_1)
    reach = 1.0 if p.w_hr is None else np.abs(np.asarray(p.w_hr, np.float64)).max(axis=0)
    g = np.empty_like(z)
    for k in "ifg":
        g[:, sl[k]] = np.maximum(dc[k], dc[k] * out_c * reach)
    g[:, sl["o"]] = np.abs(ACT[act](c1)) * slope(ga, zo) * reach
    return g


def responsive(g_ih: np.ndarray, g_hh: np.ndarray) -> np.ndarray:
    """Boolean ``(N, G*H)``: the rows whose products both reach an output by at least :data:`RESPONSIVE`."""
    return np.minimum(g_ih, g_hh) >= RESPONSIVE


def _targets(layer: RNNLayer, rng: np.random.Generator, units: np.ndarray) -> np.ndarray:
    """Pre-activation targets ``(G, len(units))`` inside each gate's responsive band (:data:`_BAND`)."""
    s = layer.semantics
    out = []
    for k in CANONICAL[layer.cell]:
        name = s.activation if k in "gnh" else s.gate_activation
        lo, hi = _BAND[name]
        out.append(rng.uniform(lo, hi, len(units)))
    return np.array(out)


def construct(layer: RNNLayer, p: DirectionParams, units: np.ndarray, rng: np.random.Generator, x_range: float,
              h_range: float, short: np.ndarray | None = None,
              wide: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One state ``(x, h, c)`` (float32 ``(I,)``, ``(P or H,)``, ``(H,)`` or None) whose pre-activations of every
    gate of ``units`` hit targets inside the gates' responsive bands: the minimum-norm least-squares solution of
    ``[W_ih | W_hh] [x; h] = t - b`` over those rows (a reset-after GRU's candidate row with ``W_hn`` scaled by
    its target ``r``; a reset-before one's ``W_hn`` applied to ``r * h``, ``r`` iterated three times from the
    previous solution), clipped to ``|x| <= x_range``, ``|h| <= h_range``. An LSTM's ``c`` is drawn in ``[-2.5,
    -0.5] U [0.5, 2.5]`` (its forget gate shows through ``c``, its output gate through ``tanh(c_1)``: a unit whose
    ``W_hr`` column is small needs ``|tanh(c_1)|`` near 1) and enters the peephole terms. ``short`` (gate rows
    ``k * H + unit``): only these rows must hit their targets; the other rows of ``units`` weigh 1e-3 in the
    least-squares system, so that a narrow layer (``I + P`` unknowns, ``G`` rows a unit: a projected LSTM's
    second layer has 4 for 4) can still place the gates that were never responsive. ``wide``: the solution
    nearest (least squares) to a start of random signs at the full ranges ``(+-x_range, +-h_range)`` instead of
    the minimum-norm one, so that most elements of ``x`` and ``h`` stay large while the units' rows are in their
    bands: a weight's change moves its row by ``D |v_k|``, so these states resolve single weights
    (:func:`resolution`) that small trajectory states (an LSTM's ``|h|`` of 0.1) and minimum-norm ones do not."""
    s, cell, H = layer.semantics, layer.cell, layer.hidden_size
    I, P = p.w_ih.shape[1], p.w_hh.shape[1]
    b_ih, b_hh = _bias(p)
    t = _targets(layer, rng, units)
    c = None
    if cell is Cell.LSTM:
        c = rng.uniform(0.5, 2.5, H) * rng.choice([-1.0, 1.0], H)
    letters = CANONICAL[cell]
    rows = np.concatenate([units + k * H for k in range(len(letters))])
    a_ih = np.asarray(p.w_ih[rows], np.float64)
    a_hh = np.asarray(p.w_hh[rows], np.float64)
    rhs = t.reshape(-1) - b_ih[rows] - b_hh[rows]
    if cell is Cell.LSTM:
        rhs[len(units):2 * len(units)] -= s.forget_bias
        if p.peep is not None:
            pe = np.asarray(p.peep, np.float64)
            rhs[:len(units)] -= pe[0, units] * c[units]
            rhs[len(units):2 * len(units)] -= pe[1, units] * c[units]
    r = np.full(P, 0.5)
    n_rows = slice(2 * len(units), 3 * len(units))
    x = h = None
    top = np.r_[np.full(I, x_range), np.full(P, h_range)]
    start = top * rng.choice([-1.0, 1.0], I + P) if wide else None
    for _ in range(3 if cell is Cell.GRU else 1):
        a_h = a_hh.copy()
        b = rhs.copy()
        if cell is Cell.GRU and s.reset_after:
            rt = ACT[s.gate_activation](t[0])
            a_h[n_rows] *= rt[:, None]
            b[n_rows] += b_hh[rows[n_rows]] * (1.0 - rt)  # b_hn is inside the reset
        elif cell is Cell.GRU:
            a_h[n_rows] *= r[None, :]
        wts = np.ones(len(rows)) if short is None else np.where(np.isin(rows, short), 1.0, 1e-3)
        sol = _bounded_lstsq(wts[:, None] * np.concatenate([a_ih, a_h], axis=1), wts * b, top, start)
        x, h = sol[:I], sol[I:]
        if cell is Cell.GRU and not s.reset_after:  # r of every unit at this solution, for the next round
            zr = p.w_ih[:H] @ x + b_ih[:H] + p.w_hh[:H] @ h + b_hh[:H]
            r = ACT[s.gate_activation](np.asarray(zr, np.float64))
    return (x.astype(np.float32), h.astype(np.float32), None if c is None else c.astype(np.float32))


def _bounded_lstsq(a: np.ndarray, b: np.ndarray, top: np.ndarray, start: np.ndarray | None = None,
                   rounds: int = 6) -> np.ndarray:
    """A least-squares solution of ``a v = b`` within ``|v| <= top`` (float64): the solution nearest ``start``
    (default zero: the minimum-norm one), then the variables past their bound fixed there and the others solved
    again, ``rounds`` times at most."""
    v0 = np.zeros(a.shape[1]) if start is None else np.asarray(start, np.float64)
    v = v0.copy()
    free = np.ones(a.shape[1], bool)
    for _ in range(rounds):
        rest = b - a[:, ~free] @ v[~free] - a[:, free] @ v0[free]
        v[free] = v0[free] + (np.linalg.lstsq(a[:, free], rest, rcond=None)[0] if start is None
                              else _ridge(a[:, free], rest))
        over = np.abs(v) > top
        v = np.clip(v, -top, top)
        if not over.any() or not (free & ~over).any():
            break
        free &= ~over
    return v


def _ridge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The least-squares (minimum-norm where under-determined) solution of ``a v = b`` by a normal-equation solve
    on the smaller side with a ridge of ``1e-10`` of the largest diagonal (float64): a tenth of ``lstsq``'s cost."""
    if a.shape[0] <= a.shape[1]:
        g = a @ a.T
        return a.T @ np.linalg.solve(g + 1e-10 * max(float(g.diagonal().max(initial=0.0)), 1e-300) * np.eye(len(g)), b)
    g = a.T @ a
    return np.linalg.solve(g + 1e-10 * max(float(g.diagonal().max(initial=0.0)), 1e-300) * np.eye(len(g)), a.T @ b)


def groups(layer: RNNLayer, p: DirectionParams, units: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """``units`` in random groups of at most ``max(1, (I + P) // (2 G))`` (each group's gate rows at most half
    the unknowns of :func:`construct`) and :data:`GROUP_MAX`, at most :data:`MAX_STATES` // :data:`WANT` groups."""
    G = layer.cell.gates
    size = min(GROUP_MAX, max(1, (p.w_ih.shape[1] + p.w_hh.shape[1]) // (2 * G)))
    order = rng.permutation(units)
    return [np.sort(order[j:j + size]) for j in range(0, len(order), size)][:MAX_STATES // WANT]


def describe(layer: RNNLayer, short: np.ndarray) -> str:
    """Names of the unexercised gate rows ``short`` (indices into ``G*H``): ``"gate z units 3, 17"``."""
    H = layer.hidden_size
    parts = []
    for k, letter in enumerate(CANONICAL[layer.cell]):
        u = [int(j) - k * H for j in short if k * H <= j < (k + 1) * H]
        if u:
            shown = ", ".join(str(v) for v in u[:8]) + (f" and {len(u) - 8} more" if len(u) > 8 else "")
            parts.append(f"gate {letter} unit{'s' if len(u) > 1 else ''} {shown}")
    return "; ".join(parts)


def ranges(layer: RNNLayer, xin: np.ndarray, h_traj: np.ndarray) -> tuple[float, float]:
    """``(x_range, h_range)`` of the constructed states: the largest ``|x|`` of the slab's input (at least 1 where
    it is all zero) and ``|h| <= 1`` for a cell whose state is bounded by its activation (tanh, softsign,
    sigmoid-like; not projected), else the largest ``|h|`` of the trajectory (at least 1)."""
    xr = float(np.abs(xin).max()) if xin.size else 0.0
    bounded = layer.semantics.activation not in ("relu", "linear") and not layer.proj_size
    hr = 1.0 if bounded else max(1.0, float(np.abs(h_traj).max()) if h_traj.size else 1.0)
    return (xr if xr > 0 else 1.0), hr


def exercise(layer: RNNLayer, dirs: list, xf: np.ndarray, entries: list, counts: list[np.ndarray], step,
             rng: np.random.Generator, x_range: float, h_range: float, seen: list | None = None,
             short: list | None = None) -> tuple[np.ndarray, list, int]:
    """Add constructed states (:func:`construct`) for the gate rows responsive in fewer than :data:`WANT` states
    (``counts``: per direction, ``(G*H,)`` counts so far, updated in place), :data:`ROUNDS` rounds at most.

    ``xf`` (float32 ``(N, I)``) and ``entries`` (per direction ``((h0, c0), (h1, c1), (dh, dc))``, rows of ``xf``)
    are the states so far; ``step(p, x, h0, c0) -> ((h1, c1), (dh, dc), (zx, zh))``: the exact step, its bound
    and its products (:func:`rnnconvert.verify.bounds.step_with_bound`). A state constructed for one direction
    starts the other from ``h = 0`` (``c = 0``): all directions share the inputs ``xf``. Returns ``(xf, entries,
    added)``, the states appended after the given ones. ``seen``: per direction, a list the ``(gains, (zx, zh))``
    of the constructed states are appended to (:func:`resolution`). ``short``: per direction, the gate rows to
    construct states for, in one round (instead of the rows responsive in fewer than :data:`WANT` states)."""
    H, added = layer.hidden_size, 0
    small = all(max(p.w_ih.size, p.w_hh.size) <= RES_WEIGHTS for p in dirs)
    if short is None and ROUNDS > 0 and small:  # (ROUNDS = 0: nothing constructed at all)
        # wide states serve the element resolution, computed only up to RES_WEIGHTS (above, their solves and
        # evaluations cost 10x the whole verification of the 3 GB benchmark's LSTM(2048) stack: 110 s, was 10 s)
        xf, entries, added = widen(layer, dirs, xf, entries, counts, step, rng, x_range, h_range, seen)
    for _ in range(ROUNDS if short is None else min(1, ROUNDS)):
        new = []
        for d, p in enumerate(dirs):
            rows = np.flatnonzero(counts[d] < WANT) if short is None else short[d]
            for grp in (groups(layer, p, np.unique(rows % H), rng) if len(rows) else []):
                new += [(d, *construct(layer, p, grp, rng, x_range, h_range, rows)) for _ in range(WANT)]
        if not new:
            break
        xf = _add(layer, dirs, xf, entries, counts, step, new, seen)
        added += len(new)
    return xf, entries, added


def _add(layer: RNNLayer, dirs: list, xf: np.ndarray, entries: list, counts: list[np.ndarray], step, new: list,
         seen: list | None) -> np.ndarray:
    """Append the constructed states ``new`` (``(direction, x, h, c)``) to ``xf`` and ``entries`` (in place)."""
    H = layer.hidden_size
    xe = np.stack([s[1] for s in new])
    for e, p in enumerate(dirs):
        he = np.stack([s[2] if s[0] == e else np.zeros(p.w_hh.shape[1], np.float32) for s in new])
        ce = None if layer.cell is not Cell.LSTM else np.stack(
            [s[3] if s[0] == e else np.zeros(H, np.float32) for s in new])
        (h1, c1), (dh, dc), (zx, zh) = step(p, xe, he, ce)
        g = gains(layer, p, he, ce, zx, zh, h1)
        counts[e] += responsive(g[0], g[1]).sum(axis=0)
        if seen is not None:
            seen[e].append((g, (zx, zh)))
        (h0, c0), (eh, ec), (bh, bc) = entries[e]
        cat = lambda a, b: None if a is None else np.concatenate([a, b])  # noqa: E731
        entries[e] = ((cat(h0, he), cat(c0, ce)), (cat(eh, h1), cat(ec, c1)), (cat(bh, dh), cat(bc, dc)))
    return np.ascontiguousarray(np.concatenate([xf, xe]), dtype=np.float32)


#: wide states (:func:`construct` with ``wide``) per group of units: every unit's rows in their bands while most
#: inputs and states are at their range, the states that resolve single weights (:func:`resolution`)
WIDE = 2
#: a wide state's one-step bound may reach this fraction of the output's scale (a quarter of the 1e-2 at which a
#: bound is too loose to decide: :func:`rnnconvert.verify.verdict.fraction`)
WIDE_LOOSE = 2.5e-3


def widen(layer: RNNLayer, dirs: list, xf: np.ndarray, entries: list, counts: list[np.ndarray], step,
          rng: np.random.Generator, x_range: float, h_range: float, seen: list | None = None) -> tuple[np.ndarray, list, int]:
    """Add :data:`WIDE` wide states (:func:`construct` with ``wide=True``) for every group of units of every
    direction (:func:`groups`: at most :data:`MAX_STATES` per direction); arguments and result as
    :func:`exercise`. A wide state whose one-step bound (``h_1`` or ``c_1``, any direction) exceeds both the
    largest bound of the states so far and :data:`WIDE_LOOSE` of their output's scale is tried again at half the
    ranges, then left out: the layer's bound as a fraction of its scale (which its verdict weighs, docs/cli.md
    "Verdicts") is not raised above that by states added for resolution."""
    H = layer.hidden_size
    tops = []
    for j in (0, 1):  # h_1, c_1: the largest bound so far, or WIDE_LOOSE of the largest output
        bd = [e[2][j] for e in entries if e[2][j] is not None]
        ex = [e[1][j] for e in entries if e[1][j] is not None]
        tops.append(max(max(float(np.max(b, initial=0.0)) for b in bd),
                        WIDE_LOOSE * max(float(np.max(np.abs(v), initial=0.0)) for v in ex)) if bd else 0.0)
    plan = [(d, grp) for d in range(len(dirs)) for grp in groups(layer, dirs[d], np.arange(H), rng)
            for _ in range(WIDE)]
    keep: list = []
    for shrink in (1.0, 0.5):
        new = [(d, *construct(layer, dirs[d], grp, rng, x_range * shrink, h_range * shrink, wide=True))
               for d, grp in plan]
        if not new:
            break
        xe = np.stack([s[1] for s in new])
        worst = np.zeros(len(new))
        for e, p in enumerate(dirs):
            he = np.stack([s[2] if s[0] == e else np.zeros(p.w_hh.shape[1], np.float32) for s in new])
            ce = None if layer.cell is not Cell.LSTM else np.stack(
                [s[3] if s[0] == e else np.zeros(H, np.float32) for s in new])
            _, (dh, dc), _ = step(p, xe, he, ce)
            over = dh.max(axis=1) > tops[0]
            if dc is not None:
                over |= dc.max(axis=1) > tops[1]
            worst = np.maximum(worst, over)
        ok = worst == 0
        keep += [s for s, k in zip(new, ok) if k]
        plan = [q for q, k in zip(plan, ok) if not k]
    if not keep:
        return xf, entries, 0
    return _add(layer, dirs, xf, entries, counts, step, keep, seen), entries, len(keep)


#: the most units of one constructed state (its least-squares system has ``G`` rows per unit: the cost of a
#: solve grows as their square times ``I + H``)
GROUP_MAX = 48
#: the element resolution (:func:`resolution`) is computed (each weight against every state, one float32 pass
#: per state over a row block) for weight matrices up to this many elements; above, it is not
#: stated (None: the bias and row resolutions, from the products the bound computes anyway, still are)
RES_WEIGHTS = 1 << 20


def _reach_bound(layer: RNNLayer, dh: np.ndarray, dc: np.ndarray | None) -> np.ndarray:
    """Per state and gate row ``(N, G*H)``: the one-step bound at the output element(s) that row reaches (the
    largest of ``h_1`` and ``c_1`` at its unit; every element of ``h_1`` for a projected LSTM and for a
    reset-before GRU's reset gate, which reach all of them)."""
    H, G = layer.hidden_size, layer.cell.gates
    top = dh.max(axis=1, keepdims=True)
    if layer.cell is Cell.LSTM:
        unit = np.maximum(dc, top if layer.proj_size else dh)
    else:
        unit = dh
    b = np.tile(unit, (1, G))
    if layer.cell is Cell.GRU and not layer.semantics.reset_after:
        b[:, :H] = np.maximum(b[:, :H], top)
    return b


def _element(gn: np.ndarray, v: np.ndarray, rows: int = 1024) -> np.ndarray:
    """Per row ``r`` of ``gn`` ``(N, R)``: ``1 / min_k max_s gn[s, r] |v[s, k]|`` over every state ``s`` (float32
    products, ``rows`` rows at a time, one pass per state): the largest smallest-caught change of any weight of
    the row."""
    av = np.abs(np.asarray(v, np.float32))
    g32 = np.asarray(gn, np.float32)
    out = np.empty(gn.shape[1])
    acc = np.empty((min(rows, gn.shape[1]), av.shape[1]), np.float32)
    tmp = np.empty_like(acc)
    for lo in range(0, gn.shape[1], rows):
        n = min(rows, gn.shape[1] - lo)
        a, t = acc[:n], tmp[:n]
        a.fill(0.0)
        for s_ in range(gn.shape[0]):
            np.multiply.outer(g32[s_, lo:lo + n], av[s_], out=t)
            np.maximum(a, t, out=a)
        with np.errstate(divide="ignore"):
            out[lo:lo + n] = 1.0 / a.min(axis=1).astype(np.float64)
    return out


def resolution(layer: RNNLayer, p: DirectionParams, x: np.ndarray, h0: np.ndarray, g: tuple, prods: tuple,
               bound: tuple) -> dict:
    """What the one-step comparison of one direction catches, from its states (docs/cli.md "Verdicts").

    A change ``D`` of one weight ``W[r, k]`` moves row ``r``'s pre-activation by ``D v_k`` (``v`` the state's
    ``x`` or ``h``) and the output it reaches by about ``D |v_k| gain`` (:func:`gains`, first order); the
    comparison fails it once that exceeds twice the bound there (the correct step's bound and the changed
    file's own: docs/cli.md "Verdicts", rule A's proof). So the smallest caught ``|D|`` is ``2 B / (|v_k|
    gain)`` at the best state. Returned, as fractions of the row's scale (the largest ``|w|`` of the row's
    ``W_ih`` and ``W_hh`` elements): ``'element'`` the largest over every weight (None above
    :data:`RES_WEIGHTS`), ``'bias'`` over every bias element, ``'row'`` the largest relative scaling ``1 + d``
    of a whole row of ``W_ih`` or ``W_hh`` caught (``d |W_r v| gain > 2 B``), and ``'worst'`` where the
    element (or bias) resolution is reached; ``'rows'``, per gate row, its weakest weight's or bias's (float64
    ``(G*H,)``, infinite where a weight reaches no output in any state). ``g``: ``(g_ih, g_hh, rh)`` of
    :func:`gains`; ``prods``: ``(zx, zh)``; ``bound``: ``(dh, dc)``; all over the same states (rows of ``x``,
    ``h0``)."""
    g_ih, g_hh, rh = g
    zx, zh = prods
    b2 = 2.0 * _reach_bound(layer, *bound)
    gn_ih, gn_hh = g_ih / b2, g_hh / b2
    scale = np.maximum(np.abs(p.w_ih).max(axis=1, initial=0.0), np.abs(p.w_hh).max(axis=1, initial=0.0))
    scale = np.where(scale > 0, scale, 1.0).astype(np.float64)
    with np.errstate(divide="ignore"):
        bias = 1.0 / np.maximum(gn_ih.max(axis=0), gn_hh.max(axis=0)) / scale
        row = 1.0 / np.maximum((np.abs(zx) * gn_ih).max(axis=0), (np.abs(zh) * gn_hh).max(axis=0))
    out = {"bias": float(bias.max()), "row": float(row.max()), "element": None,
           "worst": _row_name(layer, int(np.argmax(bias)), "bias"), "rows": bias}
    if max(p.w_ih.size, p.w_hh.size) <= RES_WEIGHTS:
        e_ih = _element(gn_ih, x) / scale
        vh = np.asarray(h0, np.float64)
        e_hh = _element(gn_hh, vh) / scale
        if rh is not None:  # a reset-before GRU's W_hn multiplies r * h
            n_sl = gate_slice(Cell.GRU, "n", layer.hidden_size)
            e_hh[n_sl] = _element(gn_hh[:, n_sl], rh) / scale[n_sl]
        worst = max((float(e_ih.max()), "W_ih", int(np.argmax(e_ih))),
                    (float(e_hh.max()), "W_hh", int(np.argmax(e_hh))), (out["bias"], "bias", int(np.argmax(bias))))
        out["element"] = max(worst[0], out["bias"])
        out["rows"] = np.maximum(bias, np.maximum(e_ih, e_hh))
        out["worst"] = _row_name(layer, worst[2], worst[1])
    return out


def _row_name(layer: RNNLayer, r: int, what: str) -> str:
    H = layer.hidden_size
    return f"{what} gate {CANONICAL[layer.cell][r // H]} unit {r % H}"
