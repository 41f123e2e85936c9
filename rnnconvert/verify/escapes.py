"""Gate-swap certification for verification's step rule (:mod:`.engine`): where the one-step bound is too loose to
decide, certify that every plausible slip of a conversion (gate blocks of ``W_ih``, ``W_hh``, the biases
exchanged) would have failed the comparison on the same states (:func:`swap_escapes`), and the probe states that
exercise each gate (:func:`probe_rows`). docs/cli.md "Verdicts" states the rule and its proof.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..core.gates import CANONICAL, gate_slice
from ..core.model import Cell, DirectionParams, RNNLayer
from .bounds import abs_products, lin, step_terms


#: slips :func:`swap_escapes` evaluates in one elementwise pass (its temporaries: ``SWAP_CHUNK x rows x G*H``
#: float64 each, 4.6 MB for 14 slips of 5 rows of an LSTM(2048)); 14: an LSTM's 24 gate swaps and 2 dropped
#: biases in two passes, as many as its 24 swaps took at 8 before issue #28 (with 3 passes: 12 ms more per
#: loose LSTM(2048) direction, measured)
SWAP_CHUNK = 14


#: the gate-block swaps :func:`swap_escapes` tries: the rows of two gate blocks exchanged in ``W_ih`` alone,
#: in ``W_hh`` alone, in both biases alone, and in all three (what a wrong gate order in a reader or writer
#: does)
SWAP_PARTS = ("W_ih", "W_hh", "bias", "all")


#: hidden units of the first round of :func:`swap_escapes` (evenly spaced): on the probes, these catch
#: nearly every swap of a large layer at a fraction of the cost of all ``H`` units (an LSTM(2048): 1/8)
SWAP_UNITS = 256


def _slips(layer: RNNLayer, p: DirectionParams, b_ih: np.ndarray, b_hh: np.ndarray) -> list[_Slip]:
    """The slips :func:`swap_escapes` checks for a direction of ``layer``, each one a file a plausible layout
    mistake would write (docs/cli.md "Verdicts"):

    * gate blocks ``a, b`` exchanged in ``W_ih`` alone, ``W_hh`` alone, both biases alone, all three
      (:data:`SWAP_PARTS`; cells with gates);
    * one bias dropped (``b_ih`` or ``b_hh`` zero, where nonzero);
    * ``W_hh`` transposed, each gate block in place (square blocks: no projection);
    * GRU: ``b_ih`` and ``b_hh`` exchanged (reset-after: reset-before adds both alike); the ``n`` gate's biases moved across the reset (all outside it:
      ``b_in + b_hn, 0``; all inside it: ``0, b_in + b_hn``); reset-before read as reset-after and back (with
      the biases as stored, and with each placement above);
    * peephole LSTM: two of the peephole vectors ``i, f, o`` exchanged (ONNX stores them ``i o f``).

    Slips that compute the same function as the file (a zero bias dropped, a placement of biases that are
    zero) are left out; a gate swap of two equal blocks is kept (no check can see it: the verdict stays
    ``inconclusive``)."""
    cell, s, H = layer.cell, layer.semantics, layer.hidden_size
    letters, G = CANONICAL[cell], cell.gates
    out: list[_Slip] = []
    for a_i, ga in enumerate(letters):
        for gb in letters[a_i + 1:]:
            pair = (letters.index(ga), letters.index(gb))
            order = _swap_order(G, H, pair)
            for what in SWAP_PARTS:
                where = ("the biases" if what == "bias" else "W_ih, W_hh and the biases" if what == "all" else what)
                ob = order if what in ("bias", "all") else None
                beta = None
                if what in ("W_hh", "all") and cell is Cell.GRU and 2 in pair:  # the n block of W_hh moved
                    beta = pair[0] if pair[1] == 2 else pair[1]
                out.append(_Slip(f"gates {ga} and {gb} swapped in {where}",
                                 order if what in ("W_ih", "all") else None,
                                 order if what in ("W_hh", "all") else None,
                                 b_ih if ob is None else b_ih[ob], b_hh if ob is None else b_hh[ob], beta=beta))
    zero = np.zeros_like(b_ih)
    for name, bi, bh in (("b_ih", zero, b_hh), ("b_hh", b_ih, zero)):
        if (b_ih if name == "b_ih" else b_hh).any():
            out.append(_Slip(f"{name} dropped", None, None, bi, bh))
    if p.w_hh.shape[1] == H:
        out.append(_Slip("W_hh transposed (each gate block)", None, None, b_ih, b_hh, transposed=True))
    if cell is Cell.GRU:
        n_sl = gate_slice(cell, "n", H)
        both = b_ih[n_sl] + b_hh[n_sl]

        def placed(i_n, h_n):
            bi, bh = b_ih.copy(), b_hh.copy()
            bi[n_sl], bh[n_sl] = i_n, h_n
            return bi, bh
        outside, inside = placed(both, 0.0), placed(0.0, both)
        if s.reset_after and (b_ih[n_sl] != b_hh[n_sl]).any():  # reset-before: the same function
            out.append(_Slip("b_ih and b_hh exchanged", None, None, b_hh, b_ih))
        if s.reset_after:
            cases = (("the n gate's biases all outside the reset", outside, True),
                     ("the n gate's biases all inside the reset", inside, True),
                     ("read as reset-before", (b_ih, b_hh), False))
        else:
            cases = (("read as reset-after", (b_ih, b_hh), True),
                     ("read as reset-after, the n gate's biases all outside the reset", outside, True),
                     ("read as reset-after, the n gate's biases all inside the reset", inside, True))
        seen = [(s.reset_after, b_ih, b_hh)]  # the file itself, then each slip once
        for desc, (bi, bh), ra in cases:
            if any(ra == r and np.array_equal(bi, i) and np.array_equal(bh, h) for r, i, h in seen):
                continue
            seen.append((ra, bi, bh))
            out.append(_Slip(desc, None, None, bi, bh, reset_after=ra))
    if p.peep is not None:
        for a, b in ((0, 1), (0, 2), (1, 2)):
            perm = np.arange(3)
            perm[a], perm[b] = b, a
            out.append(_Slip(f"peepholes {'ifo'[a]} and {'ifo'[b]} exchanged", None, None, b_ih, b_hh, peep=perm))
    return out


@dataclass(frozen=True, eq=False)
class _Slip:
    """One slipped file of :func:`_slips`: its description; the column orders of the ``W_ih`` and ``W_hh``
    products (``None``: as stored); its biases (float64, ``G*H``); for a GRU the reset placement it computes
    (``None``: the layer's) and, evaluated reset-before, the gate block of ``W_hh`` its ``n`` gate multiplies
    ``r * h`` by (``None``: ``n``); whether ``W_hh``'s gate blocks are transposed; a permutation of the
    peephole vectors."""

    desc: str
    oi: np.ndarray | None
    oh: np.ndarray | None
    b_ih: np.ndarray
    b_hh: np.ndarray
    reset_after: bool | None = None
    beta: int | None = None
    transposed: bool = False
    peep: np.ndarray | None = None


def _separable(layer: RNNLayer, p: DirectionParams, slip: _Slip) -> bool:
    """Whether ``slip``'s step at a hidden unit needs only that unit's columns of the products (then a
    round on a subset of units can evaluate it): not for a projection (``W_hr`` mixes the units), a
    reset-before evaluation, the file's or the slip's (``W_hn (r * h)`` needs every unit's ``r``). (A transposed
    ``W_hh`` is: on the states zero but for unit 0, unit ``j``'s column of ``W^T h`` is ``h_0 W[0, j]``.)"""
    before = layer.cell is Cell.GRU and not (layer.semantics.reset_after and slip.reset_after in (None, True))
    return p.w_hr is None and not before


def swap_escapes(layer: RNNLayer, p: DirectionParams, h0: np.ndarray, c0: np.ndarray | None, parts: dict,
                 u: float, u_acc: float | None = None, rows=None, act_ulps: float | None = None,
                 tolerance: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> str | None:
    """Whether the one-step comparison, from these states, would fail every plausible slip of ``p``
    (:func:`_slips`: gate-block swaps, a dropped bias, a transposed ``W_hh``, a GRU's ``n`` biases across
    the reset or its reset placement, exchanged peepholes): the first slip that could pass it (a
    description, e.g. ``"gates f and g swapped in W_hh"``), ``None`` when every one is caught.

    A slip is caught when at some element ``j`` (of ``h_1`` or ``c_1``, over the states ``rows``, default all:
    fewer states can only make this harder) the slipped file's exact step differs from the correct one by
    more than the correct step's bound plus the slipped step's own bound: any float evaluation of the
    slipped file then lies outside the correct step's bound there, and the comparison fails it. With
    ``tolerance`` (where the one-step comparison applies a measured tolerance, docs/cli.md "Verdicts" rules A and
    E: ``tolerance(exact, bound)`` gives it per element, :func:`rnnconvert.verify.orders.applied`), a slip is caught
    where it differs by more than the correct step's tolerance plus the slipped step's own (the same map of its own
    exact step and bound): its float evaluation, rounded as the correct file's was measured to round, then lies
    beyond the correct step's tolerance, which the comparison never judges ``ok`` (``inconclusive`` within twice
    it, ``fail`` beyond). The tolerance is at most the bound, so a slip caught by the bound is caught. Computed from
    the step's products (``parts`` of :func:`.bounds.step_with_bound`): a swap of weight rows permutes the product's
    columns, so no new pass over ``W_ih`` or ``W_hh`` is made, but for what needs a new product:

    * a reset-before evaluation (a reset-before GRU, or a reset-after one read reset-before): the slipped
      file's ``W_h? (r' * h)``, ``r'`` its own reset gate, ``W_h?`` the block of ``W_hh`` its ``n`` gate
      holds: one pass over that block for a few slips stacked (:data:`SWAP_CHUNK`) on the few ``rows``;
    * a projected LSTM: ``W_hr`` times each slipped step's output, the slips stacked;
    * ``W_hh`` transposed: evaluated on the states that are zero but for unit 0 (the zero and one-hot
      probes of :func:`probe_rows`), where ``W^T h`` is ``h_0`` times row 0 of each block: no product.

    Cost: elementwise evaluations of ``rows x G*H`` per slip, stacked a few slips at a time
    (:data:`SWAP_CHUNK`), in rounds on more and more elements, each for the slips the rounds before left:
    the last :data:`N_PROBES` rows (verification's probes, :func:`probe_rows`: they catch most slips) at
    :data:`SWAP_UNITS` evenly spaced hidden units (slips whose step is elementwise per unit,
    :func:`_separable`), the probes at every unit, all ``rows``. The answer is the same as one round on
    every element (a slip caught by some element is caught). A simple RNN (one gate) has the slips of
    its biases and of ``W_hh``."""
    cell, H = layer.cell, layer.hidden_size
    n = np.arange(h0.shape[0]) if rows is None else np.asarray(np.r_[rows])
    G = cell.gates
    zero = np.zeros(parts["xx"][0].shape[1])
    b_ih, b_hh = (zero if b is None else np.asarray(b, np.float64) for b in (p.b_ih, p.b_hh))
    slips = _slips(layer, p, b_ih, b_hh)
    if not slips:
        return None
    # Rounds, each on more elements, for the slips the rounds before left: the probes (the last rows: their
    # bound is a few u, they catch most slips) on a few hidden units, the probes on every unit, then every
    # row. A slip is caught when some element shows it, so a subset can only leave more slips for later.
    probes = n[n >= h0.shape[0] - N_PROBES]
    first = probes if len(probes) else n
    rounds = []
    if H > SWAP_UNITS:
        rounds.append((first, np.unique(np.linspace(0, H - 1, SWAP_UNITS).astype(np.intp))))
    rounds += [(sel, None) for sel in ([probes, n] if 0 < len(probes) < len(n) else [n])]
    for sel, units in rounds:
        todo = slips if units is None else [sl for sl in slips if _separable(layer, p, sl)]
        if not todo:
            continue
        cols = slice(None) if units is None else (np.arange(G)[:, None] * H + units).ravel()
        ucols = slice(None) if units is None else units
        chosen = (np.asarray(h0[sel][:, ucols], np.float64),
                  None if c0 is None else np.asarray(c0[sel][:, ucols], np.float64),
                  *(a[sel][:, cols] for pair in (parts["xx"], parts["hh"]) for a in pair))
        sub = {"act_ulps": act_ulps} if units is None else {"units": units, "n_h": h0.shape[1], "act_ulps": act_ulps}
        correct = step_terms(layer, p, *chosen, b_ih[cols], b_hh[cols], u, u_acc, **sub)  # once per set of elements
        if tolerance is not None:  # the correct step's tolerance applied in place of its bound
            dh, dc, h1, c1 = correct
            correct = (tolerance(h1, dh), None if c1 is None else tolerance(c1, dc), h1, c1)
        left = set()
        groups: dict = {}
        for sl in todo:  # slips evaluated alike (same semantics, n block, transposition, peepholes) go together
            key = (sl.reset_after, sl.beta, sl.transposed, None if sl.peep is None else tuple(sl.peep))
            groups.setdefault(key, []).append(sl)
        for key, group in groups.items():
            for j in range(0, len(group), SWAP_CHUNK):  # a few slips at a time: bounded temporaries
                left.update(id(sl) for sl in _uncaught(layer, p, chosen, cols, correct, u, u_acc,
                                                       group[j:j + SWAP_CHUNK], sub, key, h0[sel], tolerance))
        slips = [sl for sl in slips if (id(sl) in left or sl not in todo)]
        if not slips:
            return None
    return slips[0].desc


def _swap_order(blocks: int, hc: int, pair: tuple[int, int]) -> np.ndarray:
    """The column order of ``blocks`` gate blocks of ``hc`` columns each with blocks ``pair`` exchanged."""
    order = np.arange(blocks * hc)
    a, b = pair
    order[a * hc:(a + 1) * hc], order[b * hc:(b + 1) * hc] = np.arange(b * hc, (b + 1) * hc), np.arange(a * hc, (a + 1) * hc)
    return order


def _uncaught(layer: RNNLayer, p: DirectionParams, rows: tuple, cols, correct: tuple, u: float, u_acc,
              slips: list, sub: dict, key: tuple, h_full: np.ndarray, tolerance=None) -> list:
    """The entries of ``slips`` (:class:`_Slip`, all evaluated alike: ``key``) that the one-step comparison on
    the elements ``rows`` (``(h0, c0, zx, ax, zh, ah)`` of the chosen rows at the columns ``cols``, and units:
    ``sub``, the ``units``/``n_h`` of :func:`~.bounds.step_terms`) would not catch (:func:`swap_escapes`):
    every slipped step evaluated by :func:`~.bounds.step_terms` at once, the slips' rows stacked (their
    biases per row), against the correct step ``correct`` (``step_terms`` of ``rows``). ``h_full``: the chosen
    states at every unit (a transposed ``W_hh`` is evaluated on those zero but for unit 0). ``tolerance``: what the
    slipped step's own bound becomes (:func:`swap_escapes`), None the bound itself."""
    h0, c0, zx, ax, zh, ah = rows
    dh, dc, h1, c1 = correct
    reset_after, beta, transposed, peep = key
    cell, H = layer.cell, layer.hidden_size
    keep = np.arange(h0.shape[0])
    if transposed:  # only the states zero but for unit 0: W^T h = h[0] * (row 0 of each block)
        keep = np.flatnonzero(~np.asarray(h_full)[:, 1:].any(axis=1))
        if not len(keep):
            return slips
        h0, c0, zx, ax = h0[keep], None if c0 is None else c0[keep], zx[keep], ax[keep]
        w0 = np.concatenate([np.asarray(p.w_hh[g * H], np.float64) for g in range(cell.gates)])[cols]
        zh = np.asarray(h_full, np.float64)[keep, :1] * w0
        ah = np.abs(zh)
    V, m = len(slips), h0.shape[0]
    lay = layer if reset_after is None else layer.with_semantics(reset_after=reset_after)
    pp = p if peep is None else replace(p, peep=np.asarray(p.peep)[list(peep)])
    pos = None
    if not isinstance(cols, slice):  # positions of the chosen columns among them, once for all the slips
        pos = np.full(cell.gates * H, -1, np.intp)
        pos[cols] = np.arange(len(cols))
    orders: dict = {}

    def order(o):  # a slip's column order restricted to the chosen columns (each order computed once)
        if pos is None:
            return o
        if id(o) not in orders:
            orders[id(o)] = pos[o[cols]]
        return orders[id(o)]

    def stack(arr, k):  # (V * m, G*H): the columns of ``arr`` in each slip's order ``k``
        return np.concatenate([arr if getattr(sl, k) is None else arr[:, order(getattr(sl, k))] for sl in slips])
    bi = np.repeat(np.stack([sl.b_ih[cols] for sl in slips]), m, axis=0)
    bh = np.repeat(np.stack([sl.b_hh[cols] for sl in slips]), m, axis=0)
    tile = (lambda a: None if a is None else np.tile(a, (V, 1)))
    extra = {}
    if cell is Cell.GRU and not lay.semantics.reset_after:
        extra["n_products"] = _n_products(p, H, 2 if beta is None else beta, transposed)
    mdh, mdc, mh1, mc1 = step_terms(lay, pp, tile(h0), tile(c0), stack(zx, "oi"), stack(ax, "oi"),
                                     stack(zh, "oh"), stack(ah, "oh"), bi, bh, u, u_acc, **sub, **extra)
    if tolerance is not None:
        mdh, mdc = tolerance(mh1, mdh), None if mc1 is None else tolerance(mc1, mdc)
    dh, h1 = dh[keep], h1[keep]
    caught = (np.abs(mh1 - tile(h1)) > tile(dh) + mdh).reshape(V, -1).any(axis=1)
    if c1 is not None:
        caught |= (np.abs(mc1 - tile(c1[keep])) > tile(dc[keep]) + mdc).reshape(V, -1).any(axis=1)
    return [sl for sl, ok in zip(slips, caught) if not ok]


def _n_products(p: DirectionParams, H: int, block: int, transposed: bool):
    """The candidate product of a slipped reset-before step (:func:`~.bounds.step_terms`' ``n_products``):
    ``W rh``, ``|W| |rh|``, ``|W| drh`` with ``W`` gate block ``block`` of ``W_hh`` (rows ``block*H ..``), or
    its transpose, for states zero but for unit 0 (then ``rh``, ``drh`` are too: ``W^T rh = rh[0] * W[0]``)."""
    if transposed:
        w0 = np.asarray(p.w_hh[block * H], np.float64)

        def f(rh, drh):
            v = rh[:, :1] * w0
            return v, np.abs(v), drh[:, :1] * np.abs(w0)
        return f
    w = p.w_hh[block * H:(block + 1) * H]

    def g(rh, drh):
        val, mag = lin(w, rh)
        return val, mag, abs_products(w, np.ascontiguousarray(drh.T)).T
    return g


def directions_escape(mine: tuple, other: tuple, rows,
                      tolerance: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> str | None:
    """Whether the one-step comparison of a direction would fail a file with the two directions exchanged:
    ``mine``, ``other`` the ``(exact, bound)`` pairs (``((h1, c1), (dh, dc))`` of :func:`.bounds.step_with_bound`) of
    the two directions on their states; ``rows`` the states both directions share (the probes of
    :func:`probe_rows`: the same inputs and states for both). The exchanged file computes, from those
    states, the other direction's exact step, within the other's bound: caught when at some element the two
    exact steps differ by more than both bounds (``tolerance``: by more than both tolerances, each this map of the
    step's exact values and bound, as in :func:`swap_escapes`). ``None`` when caught, else a description."""
    (ev, bd), (ov, ob) = mine, other
    t = (lambda s, b: b) if tolerance is None else tolerance  # noqa: E731
    for a, da, b, db in zip(ev, bd, ov, ob):
        if a is not None and (np.abs(a[rows] - b[rows]) > t(a[rows], da[rows]) + t(b[rows], db[rows])).any():
            return None
    return "the directions exchanged"


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
