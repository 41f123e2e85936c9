"""The numbers verification runs on: the batch of each layer (:func:`batches`, of :func:`sample_shape`), the short
sequence's length (:data:`SEQ_STEPS`), and the one-step states of a slab (:func:`slab_states`): every state of the
source's float32 trajectory and the probes (:func:`rnnconvert.verify.escapes.probe_rows`), with the exact float64
step from each and its forward-error bound (:func:`rnnconvert.verify.bounds.step_with_bound`). The states built from
the weights for gate units these leave unresponsive are :mod:`rnnconvert.verify.states`'.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.model import Checkpoint, RNNLayer
from ..errors import FormatError
from . import bounds, escapes, states
from .verdict import fraction, loose

#: unit roundoff of the accumulation assumed by the one-step bound: float32's (float16 weights are stored
#: and rounded in float16 but summed in float32 by torch's CPU kernels and cuDNN's float compute type)
U_ACC = 2.0 ** -24
#: the full-sequence comparison uses the first this-many steps of each layer's batch
SEQ_STEPS = 8
#: the trajectory states :func:`rnnconvert.verify.escapes.swap_escapes` uses besides the probes (its cost, 24
#: elementwise evaluations of the step per LSTM direction, is linear in the states; the probes do most of the
#: work: their bound is a few ``u``)
SWAP_STATES = 2

#: The verification batch ``(sequences, steps)``: 3 random sequences of 8 steps ...
SAMPLE = (3, 8)
#: ... and for a checkpoint with at least :data:`LARGE_BYTES` of recurrent parameters, 4 sequences of 2
#: steps. Verification's cost is linear in the number of states (each is a column of every product with every
#: weight matrix: the float64 one-step products and bounds on the source side, the target framework's one
#: step) and in the number of steps (each step of the trajectory, of the source's own equations and of the
#: target's sequence reads every ``W_hh`` once more), so a multi-GB model's verification is compute-bound in
#: both (issue #18: 27 columns, 16 pseudo-layers of 50 M weights, 60 s of a 2-core machine; 2 x 4 steps -> 4 x
#: 2: 13.1-13.3 s -> 11.3-12.2 s for the whole 3 GB conversion). 8 states from the trajectory (4 of them
#: nonzero: every ``W_hh`` entry meets a nonzero state at step 2) plus the 3 probes
#: (:func:`rnnconvert.core.escapes.probe_rows`) still test every weight of the step, tell the directions and
#: ``go_backwards`` apart (two steps, not one: the mutation tests run on this sample too,
#: tests/verify/test_verify_mutations.py), and show every gate-block swap where the bound is loose
#: (:func:`rnnconvert.verify.escapes.swap_escapes`).
SAMPLE_LARGE = (4, 2)
LARGE_BYTES = 256 << 20


def sample_shape(ckpt: Checkpoint) -> tuple[int, int]:
    """``(batch, steps)`` of the verification batch for ``ckpt`` (:data:`SAMPLE`, :data:`SAMPLE_LARGE`);
    placeholders of a lazy checkpoint count at their declared size."""
    nbytes = sum(int(a.size) * a.dtype.itemsize for layer in ckpt.layers for dirs in layer.params
                 for dp in dirs for a in dp.arrays().values())
    return SAMPLE_LARGE if nbytes >= LARGE_BYTES else SAMPLE


def sample(ckpt: Checkpoint, batch: int | None, steps: int | None) -> tuple[int, int]:
    """``(batch, steps)``: those given, else :func:`sample_shape`'s."""
    b, t = sample_shape(ckpt)
    return (b if batch is None else batch), (t if steps is None else steps)


class FedRows(NamedTuple):
    """Rows a whole model's graph feeds a recurrent layer (issue #39; :func:`rnnconvert.whole.pipeline.graph_fed`):
    ``x`` float32 ``(B, L, input_size)``, rows of one length ``L`` (each row's unmasked steps, at their full length),
    checked as they are besides the layer's own batch; ``label`` names them in the report (``"graph-fed rows 1, 2
    (6 steps)"``); ``rows``: their indices in the model's batch; ``call``: the layer's call in the graph (0: the
    first)."""

    label: str
    x: np.ndarray
    rows: tuple = ()
    call: int = 0


#: the most states of the rows a whole model's graph feeds a layer (all its groups together) that join the one-step
#: comparison; above, this many spread evenly over them (:func:`fed_picks`): each state costs a column of every
#: float64 product with every weight matrix and ``I + 3*dirs*H`` kept numbers, and given model inputs may be long.
#: The trajectory and each group's whole sequence always run at the full length (a float32 run each): the states
#: picked are the graph's own. A checkpoint of :data:`LARGE_BYTES` or more: :data:`FED_STATES_LARGE`
FED_STATES = 256
FED_STATES_LARGE = 32


def fed_picks(sizes: list[int], budget: int) -> list[np.ndarray | None]:
    """Per group of ``sizes`` (its number of states, rows x steps), the flat indices (row * steps + step) of the
    states that join the one-step comparison: all (None) where the groups hold at most ``budget`` together, else
    ``budget`` spread evenly over all of them, in order."""
    total = sum(sizes)
    if total <= budget:
        return [None] * len(sizes)
    pick = np.unique(np.linspace(0, total - 1, budget).round().astype(np.int64))
    out, lo = [], 0
    for n in sizes:
        out.append(pick[(pick >= lo) & (pick < lo + n)] - lo)
        lo += n
    return out


def fed_rows(ckpt: Checkpoint, added: dict | None) -> list[list[FedRows]]:
    """Per layer of ``ckpt``, the :class:`FedRows` of ``added`` (``{layer name: [FedRows]}``) that fit it (3-D,
    the layer's input size, not empty), float32; a name that is no layer, or rows of the wrong input size, are
    left out (the whole model's own graph made them)."""
    out = []
    for layer in ckpt.layers:
        got = []
        for r in (added or {}).get(layer.name) or []:
            x = np.asarray(r.x)
            if x.ndim == 3 and x.shape[-1] == layer.input_size and x.size:
                got.append(r._replace(x=np.ascontiguousarray(x, dtype=np.float32)))
        out.append(got)
    return out


def batches(ckpt: Checkpoint, batch: int, steps: int, seed: int, inputs: dict | None) -> list[np.ndarray]:
    """Each layer's input batch, float32 ``(batch, steps, input_size)``: ``inputs[layer.name]`` when given
    (any batch and steps), else drawn from ``N(0, 1)`` (``default_rng(seed)``, one draw per layer in order,
    drawn whether or not the layer has given inputs, so that a layer's batch does not depend on the others').
    The rows a whole model's graph feeds a layer are not part of it: :func:`fed_rows`, checked at their own length.

    Raises:
        FormatError: a given input is not 3-D with the layer's input size last, or names no layer.
    """
    inputs = dict(inputs or {})
    rng = np.random.default_rng(seed)
    out = []
    for layer in ckpt.layers:
        x = rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
        given = inputs.pop(layer.name, None)
        if given is not None:
            given = np.asarray(given)
            if given.ndim != 3 or given.shape[-1] != layer.input_size or given.size == 0:
                raise FormatError(f"verification input for layer '{layer.name}' has shape {given.shape}; "
                                  f"expected (batch, steps, {layer.input_size})")
            x = np.ascontiguousarray(given, dtype=np.float32)
        out.append(x)
    if inputs:
        raise FormatError(f"verification inputs name no recurrent layer: {', '.join(sorted(inputs))} "
                          f"(layers: {', '.join(l.name for l in ckpt.layers)})")
    return out


def unit_roundoff(layer: RNNLayer, target_dtype=None) -> float:
    """``u`` of the step bound: float16's ``2**-11`` for float16 weights or a float16 target run, else
    float32's ``2**-24`` (float64 files are run in float32 by onnxruntime; float32 covers them)."""
    f16 = layer.dtype == np.float16 or (target_dtype is not None and np.dtype(target_dtype) == np.float16)
    return bounds.unit_roundoff(np.float16 if f16 else np.float32)


def slab_states(layer: RNNLayer, one: RNNLayer, dirs: list, xin: np.ndarray, recs: list, u: float,
                act_ulps=None, fed=()) -> tuple[np.ndarray, list, list, list, list]:
    """The one-step states of slab ``one`` (of ``layer``) from its float32 input ``xin`` ``(B, T, I)`` and its
    trajectory ``recs`` (per direction ``{"h": (B, T, H), "c": ... or None, "xk": optional W_ih x}``): the ``B*T``
    trajectory states, then those of ``fed`` (``[(x (B2, L, I), recs)]``: the rows a whole model's graph feeds the
    layer, each group's trajectory, issue #39), then the :data:`rnnconvert.verify.escapes.N_PROBES` probes, the
    exact float64 step from each and its bound (unit roundoff ``u``, accumulation :data:`U_ACC`, activations
    ``act_ulps``).

    Returns ``(xf, entries, counts, seen, loose)``: the inputs ``(N + P, I)`` float32; per direction ``((h0, c0),
    exact, bound)``; the states each gate row is responsive in; the gains and products seen
    (:func:`rnnconvert.verify.states.exercise`'s bookkeeping); and ``(direction, escape)`` of each direction whose
    bound is above :func:`rnnconvert.verify.verdict.fraction` of its output's scale (the slips it would let pass:
    :func:`rnnconvert.verify.escapes.swap_escapes`).
    """
    B, T, I = xin.shape
    fed = list(fed)
    fx = [np.asarray(x, np.float32).reshape(-1, I) for x, _ in fed]
    N, P = B * T + sum(len(a) for a in fx), escapes.N_PROBES
    px, ph, pc = escapes.probe_rows(layer.cell, I, recs[0]["h"].shape[-1], layer.hidden_size)
    xf = np.ascontiguousarray(np.concatenate([xin.reshape(B * T, I), *fx, px]), dtype=np.float32)
    entries, slack, counts, seen = [], [], [], []
    for d, (p, rec) in enumerate(zip(dirs, recs)):
        fr = [r[d] for _, r in fed]
        # the trajectory's states, the graph-fed rows', then the probes
        h0 = np.concatenate([rec["h"].reshape(B * T, -1), *(r["h"].reshape(len(a), -1) for r, a in zip(fr, fx)),
                             ph])
        c0 = None if rec["c"] is None else np.concatenate(
            [rec["c"].reshape(B * T, -1), *(r["c"].reshape(len(a), -1) for r, a in zip(fr, fx)), pc])
        parts: dict = {}
        xx = None
        if rec.get("xk") is not None:  # W_ih x of the states from the own equations' pass over the stored kernel
            pv, pm = bounds.lin(p.w_ih, np.concatenate([*fx, px]))  # the probes: zero and one-hot inputs, no product
            xx = tuple(np.concatenate([a, b]) for a, b in zip(rec["xk"], (pv, pm)))
        exact, bound = bounds.step_with_bound(one, p, xf, h0, c0, u, U_ACC, parts=parts, act_ulps=act_ulps, xx=xx)
        entries.append(((h0, c0), exact, bound))
        g = states.gains(one, p, h0, c0, parts["xx"][0], parts["hh"][0], exact[0])
        counts.append(states.responsive(g[0], g[1]).sum(axis=0))
        seen.append([(g, (parts["xx"][0], parts["hh"][0]))])
        if loose(exact, bound) > fraction(u):  # the bound alone cannot vouch: would the slips show?
            rows = np.r_[0:min(N, SWAP_STATES), N:N + P]  # the probes, and a few trajectory states
            slack.append((d, escapes.swap_escapes(one, p, h0, c0, parts, u, U_ACC, rows, act_ulps=act_ulps)))
        del parts
    for j, (d, esc) in enumerate(slack):  # the directions exchanged: on the probes, which both directions share
        if esc is None and len(dirs) == 2:
            slack[j] = (d, escapes.directions_escape(entries[d][1:], entries[1 - d][1:], slice(N, N + P)))
    return xf, entries, counts, seen, slack
