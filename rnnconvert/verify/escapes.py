"""Gate-swap certification for verification's step rule (:mod:`.engine`): where the one-step bound is too loose to
decide, certify that every plausible slip of a conversion (gate blocks of ``W_ih``, ``W_hh``, the biases
exchanged) would have failed the comparison on the same states (:func:`swap_escapes`), and the probe states that
exercise each gate (:func:`probe_rows`). docs/cli.md "Verdicts" states the rule and its proof.
"""

from __future__ import annotations

import numpy as np

from ..core.gates import CANONICAL
from ..core.model import Cell, DirectionParams, RNNLayer
from .bounds import step_terms


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
        correct = step_terms(layer, p, *chosen, *biases, u, u_acc, **sub)  # once per set of elements
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
    the chosen rows, and units: ``sub``, the ``units``/``n_h`` of :func:`~.bounds.step_terms`) would not catch
    (:func:`swap_escapes`): every swapped step evaluated by :func:`~.bounds.step_terms` at once, the swaps' rows
    stacked (their biases per row), against the correct step ``correct`` (``step_terms`` of ``rows``)."""
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
    mdh, mdc, mh1, mc1 = step_terms(layer, p, tile(h0), tile(c0), stack(zx, 0), stack(ax, 0), stack(zh, 1),
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
