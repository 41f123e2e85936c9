"""The verdict of one layer from what its two comparisons measured: tolerances in, :class:`~rnnconvert.verify.checks.LayerCheck` fields out.

Pure: :func:`decide` reads a :class:`Findings` record (the sequence comparisons, the one-step comparison's worst
numbers, what the one-step states covered) and the layer's :class:`Tolerances`, and returns the verdict, its reason
and the headline numbers. It runs nothing: the two measurements a verdict may need only on some branches (the float32
spread of a sequence over its one-sample tolerance, measured again over several evaluation orders; whether a slip
only a sequence shows would pass an ill-conditioned tolerance) are fields of the record, :data:`ASK` until measured;
where a rule needs one, :func:`decide` returns ``{"ask": ...}`` with its arguments instead, and the caller measures it
and asks again (the engine: :meth:`rnnconvert.verify.engine.StreamedVerification._measured_spreads` and
``_sequence_escapes``; the table-driven test, tests/verify/test_verdict_table.py: constants). So each is measured
only where the rules consult it, at most once, and no callback crosses modules.

Each comparison has an ``ok`` side (a tolerance within which a correct file's float32 rounding is shown to lie) and a
``fail`` side (beyond which no rounding takes a correct file). The one step: ``ok`` within its MEASURED tolerance
(:func:`rnnconvert.verify.orders.step_tolerance`: ``FAR`` times the largest share of the rigorous bound that float32
rounding reaches over several evaluation orders on the same states, never above the bound; the bound itself where
none is measured), ``fail`` beyond ``step_fail`` times it or beyond the bound. The short
sequence (no rigorous bound exists: errors compound): ``ok`` within its one-sample tolerance, or, above it, within its
MEASURED tolerance (:func:`measured`: ``first * max(1, scale) + far * M``, ``M`` the largest float32 spread over
several evaluation orders on the same inputs); ``fail`` beyond that by more than ``rho`` of the scale (what a layout
slip moves the outputs by). docs/cli.md "Verdicts" states every rule; in order:

1. a one step over its bound, or over ``step_fail`` times its measured tolerance: ``fail`` (final); so is the
   whole written layer of a wired target (every node and the file's wiring between them, its slabs otherwise
   compared one by one) over its tolerance by more than ``rho`` of its scale (issue #39);
2. a sequence beyond its measured tolerance while every step passed its bound, by at most ``rho`` of its scale:
   ``inconclusive`` (more than float32 rounding explains, less than a layout slip moves the outputs: neither
   threshold decides);
3. beyond it by more than ``rho`` of its scale (or with no one-step comparison): ``fail``;
4. a sequence over the tolerance of an ill-conditioned layer (the one-sample or measured tolerance's float32 term
   exceeds ``rho`` of the scale: no sequence error decides there): ``inconclusive``;
5. over its one-sample tolerance where the spread could not be measured again (a streamed layer above
   ``SEQ_SLIP_BYTES``), by at most ``rho`` of its scale: ``inconclusive``;
6. no one-step comparison: ``inconclusive``; 6b. a one step beyond its measured tolerance, within ``step_fail``
   times it and within the bound: ``inconclusive`` (naming both); 7. a gate unit no state exercises, 8. a weight
   no state reaches: ``inconclusive``; 9. a one-step bound above ``rho`` of the scale with a gate-block swap it
   would not catch (caught by the bound, or, where the measured tolerance decides the steps, beyond it plus the
   slip's own: :attr:`Findings.escapes_measured`): ``inconclusive``; 10. an ill-conditioned sequence tolerance (rule 4's, the sequence within
   it) that a slip only a sequence shows could pass, or an emulated target's: ``inconclusive``;
11. otherwise ``ok`` (with a note where the one-step bound or the sequence tolerance was loose but every slip
    checked would show): every one step within its measured tolerance (the layer's resolution, rule D of
    docs/cli.md),
    and the sequence within its one-sample or measured tolerance.

The tolerances themselves (:func:`fraction`, :func:`sequence_tolerance`, :func:`first`) and the numbers of the
sequence comparison (:func:`sequence_checks`, :func:`measured`) live here too. numpy only; no framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import VerificationError


def fraction(u: float) -> float:
    """The largest tolerance, as a fraction of the output's scale, at which a comparison still decides:
    ``max(1e-2, 64 u)`` (float32: 1e-2; float16 targets: 3.1e-2). A layout slip (a swapped gate block, a
    reversed direction, a dropped bias) moves outputs by a sizeable part of their scale; a tolerance above
    this could hide it. (The one-step bound is elementwise: where the largest element reaches this, most
    are far smaller, and the mutation tests measure what it still detects.)"""
    return max(1e-2, 64.0 * u)


def first(float16: bool, first_tol: float | None) -> float:
    """The relative term of the sequence tolerance: ``first_tol``, else 1e-5 (1e-2 for float16 weights)."""
    return first_tol or (1e-2 if float16 else 1e-5)


def sequence_tolerance(y64: np.ndarray, y32: np.ndarray, first: float, spread: float = 0.0) -> float:
    """The full-sequence comparison's tolerance ``first * max(1, max|y64|) + 2 * max(max|y64 - y32|, spread)``:
    the second term is the spread of the source's own float32 and float64 runs over these few steps, or
    ``spread`` where larger: that of a run emulating the target's own arithmetic (``target_arithmetic`` of a
    target that computes less accurately than float32 numpy: cuDNN's ``tanh``, float16 runs)."""
    own = float(np.abs(y64 - np.asarray(y32, np.float64)).max())
    return first * max(1.0, float(np.abs(y64).max())) + 2.0 * max(own, spread)


def loose(exact, bound) -> float:
    """The largest element of a one-step bound as a fraction of its output's scale (``h_1``, then ``c_1``):
    what :func:`decide` compares with :func:`fraction` (source side and target side alike)."""
    return max(float(bd.max()) / max(float(np.abs(ev).max()), 1e-300)
               for ev, bd in zip(exact, bound) if ev is not None)


def worst(err: np.ndarray, bound: np.ndarray) -> tuple[float, float, float, tuple]:
    """``(ratio, err, bound, index)`` at the element of largest ``err / bound`` (NaN counts as infinite)."""
    ratio = np.where(np.isfinite(err), err / bound, np.inf)
    j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return float(ratio[j]), float(err[j]), float(bound[j]), j


class SeqCheck(NamedTuple):
    """One sequence comparison (the whole layer, or one slab compared alone): the largest error (``inf`` when the
    target's output is not finite), the tolerance, the output's scale ``max|ref|``, and whether the tolerance's
    float32 term is the emulated target's spread rather than the source's own."""

    err: float
    tol: float
    scale: float
    by_target: bool


def sequence_checks(name: str, runs: list, spreads: list[float], first: float) -> tuple[list[SeqCheck], Any]:
    """The sequence comparisons of ``runs`` (``[(y, y32, ref)]``: the target's output, the source's float32 run and
    its reference, float64 or the source framework's, each ``(B, T, features)``), with the emulated target's spread
    of each (0: none). Returns the :class:`SeqCheck` of each and the largest error at each step over them (the
    report's plot; None without runs).

    Raises:
        VerificationError: a target output's shape differs from the reference's.
    """
    seqs, seq_t = [], None
    for (y, y32, ref), spread in zip(runs, spreads):
        y = np.asarray(y, np.float64)
        if y.shape != ref.shape:
            raise VerificationError(f"verification failed: layer '{name}' output shape {y.shape} "
                                    f"differs from the source's {ref.shape}")
        e_t = np.nan_to_num(np.abs(y - ref), nan=np.inf).max(axis=(0, 2))
        seq_t = e_t if seq_t is None or seq_t.shape != e_t.shape else np.maximum(seq_t, e_t)
        own = float(np.abs(ref - np.asarray(y32, np.float64)).max())
        seqs.append(SeqCheck(float(np.abs(y - ref).max()) if np.isfinite(y).all() else float("inf"),
                             sequence_tolerance(ref, y32, first, spread), float(np.abs(ref).max()), spread > own))
    return seqs, seq_t


def wiring_check(name: str, whole: np.ndarray, joined: np.ndarray, y32: np.ndarray, ref64, first: float) -> SeqCheck:
    """The whole written layer of a wired target (``whole``: every node and the file's wiring between them) against
    its nodes run one by one and joined as the source's layer joins them (``joined``), each ``(B, T, features)``:
    the same nodes in the same arithmetic, so where the wiring is right they agree to rounding, however the stack
    amplifies it, and the nodes themselves are checked against the source slab by slab. Tolerance: the sequence
    tolerance of the source's float32 and float64 runs chained over the slabs (``y32``, ``ref64()``: a callable
    returning the float64 chain, or why it could not be computed), scale ``max|ref64|`` (issue #39). Where the
    two agree bit for bit (a correct file's do: the 3 GB benchmark's, issue #38) the float64 chain is not computed:
    the error 0 passes any tolerance (``tol`` then the first term alone, ``scale`` ``max|joined|``; neither is
    reported: only a failed wiring check is).

    Raises:
        VerificationError: the whole layer's output has another shape; or it differs from the nodes joined and the
            float64 chain could not be computed (the source could not be read again).
    """
    whole, joined = np.asarray(whole, np.float64), np.asarray(joined, np.float64)
    if whole.shape != joined.shape:
        raise VerificationError(f"verification failed: layer '{name}' output shape {whole.shape} of the whole "
                                f"written layer differs from its nodes' {joined.shape}")
    if np.isfinite(whole).all() and np.array_equal(whole, joined):
        scale = float(np.abs(joined).max(initial=0.0))
        return SeqCheck(0.0, first * max(1.0, scale), scale, False)
    err = float(np.abs(whole - joined).max()) if np.isfinite(whole).all() else float("inf")
    ref = ref64()
    if isinstance(ref, str):
        raise VerificationError(f"verification failed: layer '{name}': the whole written layer differs from its nodes "
                                f"joined by {err:.3g}, and its float64 reference could not be computed: {ref}")
    return SeqCheck(err, sequence_tolerance(ref, y32, first), float(np.abs(ref).max()), False)


@dataclass(frozen=True)
class Tolerances:
    """``first``: the relative term of the sequence tolerance (:func:`first`); ``rho``: the largest tolerance, as a
    fraction of the output's scale, at which a comparison still decides (:func:`fraction`); ``far``: the factor of
    the measured float32 spread in a sequence's measured tolerance (:func:`measured`;
    :data:`rnnconvert.verify.orders.FAR`, twice the one-sample tolerance's factor 2); ``step_fail``: the factor of
    the one-step comparison's measured tolerance beyond which a step fails (:data:`rnnconvert.verify.orders.STEP_FAIL`;
    rule 1)."""

    first: float
    rho: float
    far: float = 4.0
    step_fail: float = 2.0


class Spread(NamedTuple):
    """The float32 spread of one sequence comparison measured again (rule 2): ``spread`` the largest ``max|y32 -
    y64|`` over ``orders`` (the float32 evaluation orders of the canonical equations run on the same inputs:
    :func:`rnnconvert.verify.orders.spread`)."""

    spread: float
    orders: tuple


def measured(e: SeqCheck, spread: Spread, tol: Tolerances) -> SeqCheck:
    """``e`` with its MEASURED tolerance ``first * max(1, scale) + far * M``: ``M`` the largest of the measured
    spread and the spread behind ``e``'s own tolerance (one float32 run of the source, or an emulated target's).
    At least ``e.tol`` (``far >= 2``): a comparison within its one-sample tolerance is within this one, so
    measuring only the sequences above it decides as measuring every one would."""
    base = tol.first * max(1.0, e.scale)
    own = (e.tol - base) / 2.0
    return e._replace(tol=base + tol.far * max(own, spread.spread))


def _rounding(e: SeqCheck, tol: Tolerances) -> float:
    """The float32 term of ``e``'s tolerance (one-sample or measured): what a correct file's rounding may take."""
    return e.tol - tol.first * max(1.0, e.scale)


#: a measurement of :class:`Findings` not made yet (:func:`decide` asks for it where a rule needs it)
ASK = "<ask>"


class _Ask(Exception):
    """A rule needs a measurement still :data:`ASK`: ``what`` (``'spread'`` or ``'sequence_escapes'``) and its
    arguments."""

    def __init__(self, what: str, **args) -> None:
        super().__init__(what)
        self.what, self.args_ = what, args


@dataclass
class Findings:
    """What the two comparisons of one layer measured: :func:`decide`'s whole input (but the tolerances).

    ``seqs``: the sequence comparisons (one, or one per slab compared alone), each with its one-sample tolerance.
    ``step``: the one-step comparison's worst numbers (``ratio`` max err/bound, ``err``, ``bound`` at that element,
    ``tol`` the largest bound element, ``loose`` the largest bound as a fraction of its output's scale, ``where``,
    ``n``, ``scale``, ``err_t``, ``bound_t``, ``applied_t`` (the largest element of the tolerance applied per
    step); against the measured tolerance, the bound where none was measured:
    ``m_ratio`` max err/tolerance, ``m_err``, ``m_tol``, ``m_bound``, ``m_where`` and ``m_kind`` (``'measured'`` or
    ``'bound'``: which tolerance that element's slab applied) at that element, ``m_max`` the largest element of
    the tolerance applied, ``fraction`` the
    largest share of the bound measured, ``measured`` the orders' names, empty where none), or ``{}`` when it could
    not run, ``step_note`` then why. ``steps``:
    the short sequence's length. ``whole``: the whole written layer (every node and the file's wiring between them)
    against its nodes joined as the source joins its slabs (:func:`wiring_check`), where the slabs were compared one
    by one in a wired target (issue #39); else None.
    ``unexercised``, ``constructed``, ``resolution``, ``resolution_at``: the one-step states' coverage
    (:class:`~rnnconvert.verify.checks.LayerCheck`'s fields of those names). ``swaps_caught``: every loose direction
    showed its gate-block swaps caught; ``loose_escape``: the first slip a loose bound could let pass ("" none);
    ``escapes_measured``: the measured tolerance decided them (rule E: where the bound let a slip pass, it was asked
    again of that tolerance, a slip caught where no file with it would be within it:
    :meth:`rnnconvert.verify.engine.StreamedVerification._slips_applied`; ``loose_escape`` then passes even that).
    ``at_dtype``: the target's reduced precision in words (" at float16"), or "". ``spreads``: the float32 spread of
    each sequence over its one-sample tolerance measured again (``{index in seqs: Spread}``), or why it could not
    be (a phrase); ``sequence_escape``: a slip only a sequence shows that would pass an ill-conditioned sequence
    tolerance (``tols``), or None (both measured by the engine where :func:`decide` asks for them: :data:`ASK` until
    then)."""

    seqs: list[SeqCheck]
    step: dict = field(default_factory=dict)
    step_note: str = ""
    steps: int = 0
    whole: SeqCheck | None = None
    unexercised: str = ""
    constructed: int = 0
    resolution: float | None = None
    resolution_at: str = ""
    swaps_caught: bool = False
    loose_escape: str = ""
    escapes_measured: bool = False
    at_dtype: str = ""
    spreads: dict | str = ASK
    sequence_escape: str | None = ASK
    #: per comparison of ``seqs``, what it ran on where not the batch's short sequence: the rows a whole model's
    #: graph feeds the layer, compared at their full length (issue #39: ``"graph-fed rows 1, 2 (6 steps)"``), after
    #: the batch's comparisons; ``""`` (or missing) for those
    seq_names: list = field(default_factory=list)


def _subject(f: Findings, n: int, j: int) -> str:
    """The words for comparison ``j`` of the ``n`` sequence comparisons of ``f``: the batch's short sequence (of the
    whole layer, or one stacked layer compared alone), or graph-fed rows at their full length."""
    name = f.seq_names[j] if j < len(f.seq_names) else ""
    if name:
        return f"the {name} as a sequence (all their steps)"
    own = n - sum(1 for x in f.seq_names if x)
    return f"the first {f.steps} steps as a sequence" + (
        "" if own == 1 else f" (stacked layer {j}, from the source's own input)")


@dataclass
class _Sorted:
    """The sequence comparisons sorted by what they show (:func:`_sort`): ``seqs`` with their measured tolerances
    where measured; ``beyond`` those over their (measured) tolerance; ``ill`` those whose one-sample or measured
    float32 term exceeds ``rho`` of the scale; ``hard`` the ones beyond by more than a slip moves the outputs
    (rule 3); ``spreads`` the measurements (or why none)."""

    seqs: list
    beyond: list
    ill: list
    hard: list
    step_failed: bool
    worst: SeqCheck
    where: str
    spreads: dict | str


def _sort(f: Findings, tol: Tolerances) -> _Sorted:
    st, rho = f.step, tol.rho
    step_failed = bool(st) and (st["ratio"] > 1.0 or st.get("m_ratio", 0.0) > tol.step_fail)
    # ill-conditioned: the one-sample tolerance's float32 term (one float32 run of the source, or an emulated
    # target's) alone exceeds rho of the scale. There the error of a correct file is itself a sample of the same
    # rounding (0.405 against one run's 0.112 on the chaotic TF1 stack): its spread is measured whatever the error,
    # so that the rules read a tolerance no single run sets (rules 4 and 10: the same verdict on every machine)
    ill_at = [j for j, e in enumerate(f.seqs) if _rounding(e, tol) > rho * e.scale]
    over = [j for j, e in enumerate(f.seqs) if e.err > e.tol or j in ill_at]  # to measure again
    spreads: dict | str = {}
    if over and not step_failed and not _wiring_failed(f, tol):
        if f.spreads == ASK:
            raise _Ask("spread", over=over)
        spreads = f.spreads
    seqs = list(f.seqs)
    if isinstance(spreads, dict):
        seqs = [measured(e, spreads[j], tol) if j in spreads else e for j, e in enumerate(seqs)]
    # ... and those whose measured tolerance's float32 term exceeds rho: the comparison cannot resolve rho there
    ill = [e for e in seqs if _rounding(e, tol) > rho * e.scale]
    beyond = [e for e in seqs if e.err > e.tol]
    # beyond what float32 rounding explains by more than a layout slip moves the outputs (or no one-step comparison)
    hard = [e for e in beyond if e not in ill and (not st or e.err > rho * e.scale)]
    w = max(hard or beyond or seqs, key=lambda e: e.err / max(e.tol, 1e-300))  # the one reported
    return _Sorted(seqs, beyond, ill, hard, step_failed, w, _subject(f, len(seqs), _at(seqs, w)), spreads)


def _at(seqs: list, e: SeqCheck) -> int:
    """The position of ``e`` itself in ``seqs`` (not of the first equal comparison: two runs may give equal
    numbers, and each names its own rows)."""
    return next(j for j, x in enumerate(seqs) if x is e)


def _wiring_failed(f: Findings, tol: Tolerances) -> bool:
    w = f.whole
    return w is not None and w.err > w.tol and w.err > tol.rho * w.scale


def _sequence_rules(f: Findings, tol: Tolerances, s: _Sorted) -> tuple[str, str] | None:
    """Rules 1-5 (module docstring): what the step and the sequences show by themselves."""
    st, T, rho = f.step, f.steps, tol.rho
    if s.step_failed:  # final: nothing below may turn a failed step into another verdict
        if st["ratio"] > 1.0:
            return "fail", (f"one step from the source's state differs by {st['err']:.3g} where the "
                            f"float bound allows {st['bound']:.3g} ({st['where']})")
        return "fail", (f"one step from the source's state differs by {st['m_err']:.3g}, more than {tol.step_fail:g} "
                        f"times its measured tolerance {st['m_tol']:.3g} ({_measured_step(st, tol)}; the rigorous "
                        f"bound there {st['m_bound']:.3g}; {st['m_where']})")
    if _wiring_failed(f, tol):  # final, as a failed step
        w = f.whole
        return "fail", (f"the written layer run whole (every node and the wiring between them) on the first {T} "
                        f"steps differs by {w.err:.3g} from its nodes run one by one and joined as the source's layer "
                        f"joins them (tolerance {w.tol:.3g}), more than {rho:.3g} of the output's scale "
                        f"({w.scale:.3g}): the file's wiring between its nodes does not compute the source's layer")
    if s.hard:
        e = s.worst
        how = (f"measured over {len(s.spreads[_at(s.seqs, e)].orders)} float32 evaluation orders"
               if isinstance(s.spreads, dict) and _at(s.seqs, e) in s.spreads else "one float32 run's estimate")
        return "fail", (f"{s.where} differ by {e.err:.3g} (tolerance {e.tol:.3g}, "
                        f"{how})")
    if not s.beyond:
        return None
    e = max(s.beyond, key=lambda e: e.err / max(e.tol, 1e-300))
    j = _at(s.seqs, e)
    subj = _subject(f, len(s.seqs), j)
    if e in s.ill:
        return "inconclusive", (
            f"{subj} differ by {e.err:.3g}, above the tolerance {e.tol:.3g}, on a "
            f"layer whose float32 runs part from its float64 run (the tolerance's float32 term "
            f"{_rounding(e, tol):.3g} exceeds {rho:.3g} of the output's scale, {e.scale:.3g}): ill-conditioned on "
            f"these inputs, while every step passed its bound; float32 rounding along the sequence could explain "
            f"it, and so could a slip that only a sequence shows (directions, stacked layers, time order)")
    if isinstance(s.spreads, str):
        return "inconclusive", (
            f"{subj} differ by {e.err:.3g}, above one float32 run's estimate "
            f"{e.tol:.3g} but within {rho:.3g} of the output's scale ({e.scale:.3g}) while every step passed its "
            f"bound, and {s.spreads}: cannot decide")
    m = s.spreads[j]
    return "inconclusive", (
        f"{subj} differ by {e.err:.3g}, {e.err / max(m.spread, 1e-300):.3g} times "
        f"the largest float32 spread measured over {len(m.orders)} evaluation orders ({m.spread:.3g}: "
        f"{', '.join(m.orders)}; tolerance {e.tol:.3g}), while every step passed its bound: more than float32 "
        f"rounding explains, less than a layout slip moves the outputs ({rho:.3g} of the output's scale, "
        f"{e.scale:.3g}): neither tolerance decides")


def _measured_step(st: dict, tol: Tolerances) -> str:
    """How the one-step comparison's measured tolerance was made, in words."""
    return (f"{tol.far:g} times {st['fraction']:.3g} of the bound, the largest share of it that float32 rounding "
            f"reached over {len(st['measured'])} evaluation orders: {', '.join(st['measured'])}")


def _state_rules(f: Findings, tol: Tolerances, s: _Sorted) -> tuple[str, str] | None:
    """Rules 6-11 (module docstring): what the one-step states could and could not show."""
    st, rho = f.step, tol.rho
    if not st:
        return "inconclusive", f"the one-step comparison could not run: {f.step_note}"
    if st.get("m_ratio", 0.0) > 1.0:  # rule 6b: within the bound and twice the measured tolerance, beyond it
        return "inconclusive", (
            f"one step from the source's state differs by {st['m_err']:.3g}, {st['m_ratio']:.3g} times its measured "
            f"tolerance {st['m_tol']:.3g} ({_measured_step(st, tol)}) but within {tol.step_fail:g} times it and "
            f"within the rigorous bound {st['m_bound']:.3g} ({st['m_where']}): more than float32 rounding was seen "
            f"to reach, less than it could not: neither tolerance decides")
    if f.unexercised:
        return "inconclusive", (
            f"{f.unexercised}: unresponsive in every one-step state (the trajectory's, the probes and "
            f"{f.constructed} constructed from the weights), so a change of their weights or biases would not show")
    if f.resolution is not None and not np.isfinite(f.resolution):
        return "inconclusive", (
            f"a weight of {f.resolution_at} reaches no output in any one-step state (its input element is "
            f"zero wherever its row is live, also in the {f.constructed} states constructed from the weights): "
            f"a change of it would not show")
    if st["loose"] > rho and not f.swaps_caught:
        esc = f.loose_escape
        if f.escapes_measured and esc and not esc.startswith("n/a"):  # rule A asked of the measured tolerance
            return "inconclusive", (
                f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale "
                f"({st['scale']:.3g}), and a file with this slip could pass even the measured tolerance applied "
                f"(up to {st.get('m_max', st['tol']):.3g}, rule E): {esc}")
        return "inconclusive", (
            f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale "
            f"({st['scale']:.3g}): too loose to tell a broken file from a correct one"
            + (f" ({esc.removeprefix('n/a: ')})" if esc.startswith("n/a") else
               f" (a file with this slip could pass it: {esc})" if esc else ""))
    ill_esc = None
    if s.ill and (any(e.by_target for e in s.ill) or (ill_esc := _escape(f, s)) is not None):
        e = max(s.ill, key=lambda e: _rounding(e, tol) / max(e.scale, 1e-300))
        j = _at(s.seqs, e)
        name = f.seq_names[j] if j < len(f.seq_names) else ""
        own = len(s.seqs) - sum(1 for x in f.seq_names if x)
        ill_at = f" of the {name}" if name else "" if own == 1 else f" of stacked layer {j}"
        parted = ("a run emulating the target's arithmetic and the float64 run" if e.by_target else
                  "float32 and float64 runs of the source")
        return "inconclusive", (
            f"the sequence tolerance{ill_at} {e.tol:.3g} ({parted} part: float32 term {_rounding(e, tol):.3g}) "
            f"exceeds {rho:.3g} of the output's scale ({e.scale:.3g}): the layer is ill-conditioned on these inputs"
            + f.at_dtype + (f" (a file with this slip could pass it: {ill_esc})" if ill_esc else ""))
    if st["loose"] > rho:
        if f.escapes_measured:
            return "ok", (f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale, "
                          f"but every gate-block swap and other layout slip checked would be beyond the measured "
                          f"tolerance applied (up to {st.get('m_max', st['tol']):.3g}, rule E) on these states: "
                          f"inconclusive or fail, never ok")
        return "ok", (f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale, "
                      f"but every gate-block swap and other layout slip checked would fail it on these states")
    return None


def _ok_note(tol: Tolerances, s: _Sorted) -> str:
    """Why an ``ok`` layer's sequence tolerance exceeds ``rho`` of its scale, yet decided (rule 10)."""
    return (f"the sequence tolerance ({max(e.tol for e in s.ill):.3g}) exceeds {tol.rho:.3g} of the output's scale "
            f"(float32 and float64 runs of the source part), while every step passed its bound and every "
            f"sequence-level slip (directions exchanged, stacked layers exchanged, run in the other time order) "
            f"would move the float64 sequence by more than twice that")


def _escape(f: Findings, s: _Sorted) -> str | None:
    if f.sequence_escape == ASK:
        raise _Ask("sequence_escapes", tols=[e.tol for e in s.seqs])
    return f.sequence_escape


def decide(f: Findings, tol: Tolerances) -> dict[str, Any]:
    """The verdict of one layer (module docstring, rules 1-11). Returns :class:`~rnnconvert.verify.checks.LayerCheck`
    fields: ``verdict`` (``'ok'``, ``'inconclusive'``, ``'fail'``), ``reason``, the headline ``max_abs_err``/
    ``tolerance``/``max_abs_ref``/``reference`` (the comparison closer to failing: ``'step'`` or ``'sequence'``),
    ``seq_err``/``seq_tol`` (the sequence reported; its measured tolerance where measured), and the one-step numbers
    where that comparison ran (``step_applied_*``: at the element closest to the tolerance applied, rule E's
    measured one or the bound, ``step_applied_kind`` saying which). Or, where a rule needs a measurement still :data:`ASK`, ``{"ask": "spread", "over":
    [index in seqs]}`` (the sequences over their one-sample tolerance, not ill-conditioned) or ``{"ask":
    "sequence_escapes", "tols": [float]}`` (rule 10): the caller measures it into ``f`` and calls again."""
    st = f.step
    try:
        s = _sort(f, tol)
        verdict, reason = (_sequence_rules(f, tol, s) or _state_rules(f, tol, s) or ("ok", ""))
    except _Ask as a:
        return {"ask": a.what, **a.args_}
    w = s.worst
    if verdict == "ok" and s.ill:
        reason = "; ".join(r for r in (reason, _ok_note(tol, s)) if r)
    if verdict == "fail" and f.whole is not None and reason.startswith("the written layer run whole"):
        w = f.whole  # the comparison that failed is the headline
    out = dict(verdict=verdict, reason=reason, max_abs_err=w.err, tolerance=w.tol, max_abs_ref=w.scale,
               reference="sequence", seq_err=w.err, seq_tol=w.tol)
    if st:
        out.update(step_err=st["err"], step_tol=st["tol"], step_ratio=st["ratio"], steps_checked=st["n"],
                   step_err_t=st["err_t"], step_bound_t=st["bound_t"],
                   step_applied_t=st.get("applied_t", []),
                   # against the tolerance applied (rule E's where measured, else the bound), at its worst element
                   step_applied_err=st["m_err"], step_applied_tol=st["m_tol"], step_applied_ratio=st["m_ratio"],
                   step_applied_kind=st.get("m_kind") or ("measured" if st.get("measured") else "bound"))
        if st.get("measured"):  # the tolerance applied: the measured one (rule 6b)
            if st["m_ratio"] >= w.err / max(w.tol, 1e-300):
                out.update(max_abs_err=st["m_err"], tolerance=st["m_tol"], reference="step")
        elif st["ratio"] >= w.err / max(w.tol, 1e-300):
            out.update(max_abs_err=st["err"], tolerance=st["bound"], reference="step")
    return out


def route(target_route: str, step_ran: bool, step_note: str, seq_note: str, not_installed: str,
          whole: bool = False) -> str:
    """The report's words for the target side: the engine (``target_route``), which comparisons ran in it (``whole``:
    also the whole written layer, its wiring included), and the fallbacks' notes; when neither comparison ran in
    the target framework (``not_installed``: the note's words for a framework not installed), the numpy reference
    on the arrays read back."""
    out = target_route + (" one-step + sequence" if step_ran and not step_note else " (sequence)")
    out += " + the whole layer's graph" if whole else ""
    if step_note.endswith(f"({not_installed})") and seq_note:  # neither comparison ran in the target framework
        return (f"numpy reference on the arrays read back from the written file, one step + sequence "
                f"({target_route.split(' ', 1)[0]} is not installed or failed to import)")
    for why in (w for w in (step_note, seq_note) if w):
        out += f"; {why}"
    return out
