"""The verdict of one layer from what its two comparisons measured: tolerances in, :class:`~rnnconvert.verify.checks.LayerCheck` fields out.

Pure: :func:`decide` reads a :class:`Findings` record (the sequence comparisons, the one-step comparison's worst
numbers, what the one-step states covered) and the layer's :class:`Tolerances`, and returns the verdict, its reason
and the headline numbers. It runs nothing: the two measurements a verdict may need only on some branches (whether a
sequence is far above float32 rounding, whether a slip only a sequence shows would pass) are fields of the record,
:data:`ASK` until measured; where a rule needs one still unmeasured, :func:`decide` returns ``{"ask": ...}`` with
its arguments instead, and the caller measures it and asks again (the engine:
:meth:`rnnconvert.verify.engine.StreamedVerification._far_above` and ``_sequence_escapes``; the table-driven test,
tests/verify/test_verdict_table.py: constants). So each is measured only where the rules consult it, at most once,
and no callback crosses modules. docs/cli.md "Verdicts" states every rule; in order:

1. a one step over its bound: ``fail`` (final); so is the whole written layer of a wired target (every node and
   the file's wiring between them, its slabs otherwise compared one by one) over its tolerance by more than
   ``rho`` of its scale (issue #39);
2. a sequence over its tolerance but within ``rho`` of its scale while every step passed, and far above the float32
   spread measured over several evaluation orders: ``inconclusive``;
3. ... not that far, but a slip only a sequence shows would pass it: ``inconclusive``;
4. a sequence over its tolerance by more than ``rho`` of its scale (or with no one-step comparison): ``fail``;
5. over it on an ill-conditioned layer (the source's own runs part by more than ``rho``): ``inconclusive``;
6. no one-step comparison: ``inconclusive``; 7. a gate unit no state exercises, 8. a weight no state reaches:
   ``inconclusive``; 9. a one-step bound above ``rho`` of the scale with a gate-block swap it would not catch:
   ``inconclusive``; 10. an ill-conditioned sequence tolerance a slip could hide in: ``inconclusive``;
11. otherwise ``ok`` (with a note where a bound or tolerance was loose but every slip checked would show).

The tolerances themselves (:func:`fraction`, :func:`sequence_tolerance`, :func:`first`) and the numbers of the
sequence comparison (:func:`sequence_checks`) live here too. numpy only; no framework.
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


def wiring_check(name: str, whole: np.ndarray, joined: np.ndarray, y32: np.ndarray, ref64: np.ndarray,
                 first: float) -> SeqCheck:
    """The whole written layer of a wired target (``whole``: every node and the file's wiring between them) against
    its nodes run one by one and joined as the source's layer joins them (``joined``), each ``(B, T, features)``:
    the same nodes in the same arithmetic, so where the wiring is right they agree to rounding, however the stack
    amplifies it, and the nodes themselves are checked against the source slab by slab. Tolerance: the sequence
    tolerance of the source's float32 and float64 runs chained over the slabs (``y32``, ``ref64``), scale
    ``max|ref64|`` (issue #39).

    Raises:
        VerificationError: the whole layer's output has another shape.
    """
    whole, joined = np.asarray(whole, np.float64), np.asarray(joined, np.float64)
    if whole.shape != joined.shape:
        raise VerificationError(f"verification failed: layer '{name}' output shape {whole.shape} of the whole "
                                f"written layer differs from its nodes' {joined.shape}")
    err = float(np.abs(whole - joined).max()) if np.isfinite(whole).all() else float("inf")
    return SeqCheck(err, sequence_tolerance(ref64, y32, first), float(np.abs(ref64).max()), False)


@dataclass(frozen=True)
class Tolerances:
    """``first``: the relative term of the sequence tolerance (:func:`first`); ``rho``: the largest tolerance, as a
    fraction of the output's scale, at which a comparison still decides (:func:`fraction`)."""

    first: float
    rho: float


#: a measurement of :class:`Findings` not made yet (:func:`decide` asks for it where a rule needs it)
ASK = "<ask>"


class _Ask(Exception):
    """A rule needs a measurement still :data:`ASK`: ``what`` (``'far'`` or ``'sequence_escapes'``) and its
    arguments."""

    def __init__(self, what: str, **args) -> None:
        super().__init__(what)
        self.what, self.args_ = what, args


@dataclass
class Findings:
    """What the two comparisons of one layer measured: :func:`decide`'s whole input (but the tolerances).

    ``seqs``: the sequence comparisons (one, or one per slab compared alone). ``step``: the one-step comparison's
    worst numbers (``ratio`` max err/bound, ``err``, ``bound`` at that element, ``tol`` the largest bound element,
    ``loose`` the largest bound as a fraction of its output's scale, ``where``, ``n``, ``scale``, ``err_t``,
    ``bound_t``), or ``{}`` when it could not run, ``step_note`` then why. ``steps``: the short sequence's length.
    ``whole``: the whole written layer (every node and the file's wiring between them) against its nodes joined as
    the source joins its slabs (:func:`wiring_check`), where the slabs were compared one by one in a wired target
    (issue #39); else None.
    ``unexercised``, ``constructed``, ``resolution``, ``resolution_at``: the one-step states' coverage
    (:class:`~rnnconvert.verify.checks.LayerCheck`'s fields of those names). ``swaps_caught``: every loose direction showed its gate-block swaps
    caught; ``loose_escape``: the first slip a loose bound could let pass ("" none). ``at_dtype``: the target's
    reduced precision in words (" at float16"), or "". ``far``: why the sequences over their one-sample tolerance
    (``over``) are beyond float32 rounding, or None; ``sequence_escape``: a slip only a sequence shows that would
    pass the sequences' tolerances (``tols``), or None (both measured by the engine where :func:`decide` asks for
    them: :data:`ASK` until then)."""

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
    at_dtype: str = ""
    far: str | None = ASK
    sequence_escape: str | None = ASK


@dataclass
class _Sorted:
    """The sequence comparisons sorted by what they show (:func:`_sort`)."""

    over: list
    ill: list
    ill_over: list
    hard: list
    step_failed: bool
    worst: SeqCheck
    where: str


def _sort(f: Findings, tol: Tolerances) -> _Sorted:
    st, first, rho = f.step, tol.first, tol.rho
    over = [e for e in f.seqs if e.err > e.tol]
    ill = [e for e in f.seqs if e.tol - first * max(1.0, e.scale) > rho * e.scale]  # the source's own runs part
    step_failed = bool(st) and st["ratio"] > 1.0
    # over the tolerance on an ill-conditioned layer (its source's own float32 and float64 runs part by more
    # than rho of the scale) while every step passed its bound: the float32 estimate of the tolerance is one
    # sample of a rounding that such a layer amplifies (a TF1 3 x GRUCell(80) stack with weights x 3.5: a
    # correct .onnx 0.405 from the float64 run where the source's float32 run was 0.11 from it): no evidence
    ill_over = [e for e in over if st and not step_failed and e.err > rho * e.scale and e in ill]
    # over the tolerance by more than a layout slip moves the outputs (or with no one-step comparison)
    hard = [e for e in over if not (st and e.err <= rho * e.scale) and e not in ill_over]
    w = max(hard or f.seqs, key=lambda e: e.err / max(e.tol, 1e-300))  # the one reported
    where = "" if len(f.seqs) == 1 else f" (stacked layer {f.seqs.index(w)}, from the source's own input)"
    return _Sorted(over, ill, ill_over, hard, step_failed, w, where)


def _sequence_rules(f: Findings, tol: Tolerances, s: _Sorted, far, seq_esc) -> tuple[str, str] | None:
    """Rules 1-5 (module docstring): what the step and the sequences show by themselves."""
    st, T, rho = f.step, f.steps, tol.rho
    if s.step_failed:  # final: nothing below may turn a failed step into another verdict
        return "fail", (f"one step from the source's state differs by {st['err']:.3g} where the "
                        f"float bound allows {st['bound']:.3g} ({st['where']})")
    w = f.whole
    if w is not None and w.err > w.tol and w.err > rho * w.scale:  # final, as a failed step
        return "fail", (f"the written layer run whole (every node and the wiring between them) on the first {T} "
                        f"steps differs by {w.err:.3g} from its nodes run one by one and joined as the source's layer "
                        f"joins them (tolerance {w.tol:.3g}), more than {rho:.3g} of the output's scale "
                        f"({w.scale:.3g}): the file's wiring between its nodes does not compute the source's layer")
    if far is not None:
        return "inconclusive", far
    if seq_esc is not None:
        # every step passed its bound, and the sequences part by less than a layout slip moves them: the
        # tolerance's float32 term (one float32 run's spread) is an estimate, not a bound, and a target's
        # own float32 rounding along the sequence can exceed it on wide-range inputs (a torch GRU on
        # N(0, 1) x 1000 inputs: 1.6e-5 against 1.3e-5, outputs of scale 1): cannot decide
        return "inconclusive", (
            f"the first {T} steps as a sequence{s.where} differ by {s.worst.err:.3g}, above the tolerance "
            f"{s.worst.tol:.3g} but within {rho:.3g} of the output's scale ({s.worst.scale:.3g}) while every step "
            f"passed its bound: float32 rounding along the sequence could explain it, and so could a file with "
            f"{seq_esc}")
    if s.hard:
        return "fail", (f"the first {T} steps as a sequence{s.where} differ by {s.worst.err:.3g} "
                        f"(tolerance {s.worst.tol:.3g})")
    if s.ill_over:
        e = max(s.ill_over, key=lambda e: e.err / max(e.tol, 1e-300))
        at = "" if len(f.seqs) == 1 else f" (stacked layer {f.seqs.index(e)}, from the source's own input)"
        return "inconclusive", (
            f"the first {T} steps as a sequence{at} differ by {e.err:.3g}, above the tolerance {e.tol:.3g}, on a "
            f"layer whose source's own float32 and float64 runs part by "
            f"{(e.tol - tol.first * max(1.0, e.scale)) / 2:.3g} (more than {rho:.3g} of the output's scale, "
            f"{e.scale:.3g}): ill-conditioned on these inputs, while every step passed its bound; float32 rounding "
            f"along the sequence could explain it, and so could a slip that only a sequence shows (directions, "
            f"stacked layers, time order)")
    return None


def _state_rules(f: Findings, tol: Tolerances, s: _Sorted) -> tuple[str, str] | None:
    """Rules 6-11 (module docstring): what the one-step states could and could not show."""
    st, rho, first = f.step, tol.rho, tol.first
    if not st:
        return "inconclusive", f"the one-step comparison could not run: {f.step_note}"
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
        return "inconclusive", (
            f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale "
            f"({st['scale']:.3g}): too loose to tell a broken file from a correct one"
            + (f" ({esc.removeprefix('n/a: ')})" if esc.startswith("n/a") else
               f" (a file with this slip could pass it: {esc})" if esc else ""))
    ill_esc = None
    if s.ill and (any(e.by_target for e in s.ill) or (ill_esc := _escape(f)) is not None):
        e = max(s.ill, key=lambda e: (e.tol - first * max(1.0, e.scale)) / max(e.scale, 1e-300))
        ill_at = "" if len(f.seqs) == 1 else f" of stacked layer {f.seqs.index(e)}"
        parted = ("a run emulating the target's arithmetic and the float64 run" if e.by_target else
                  "float32 and float64 runs of the source")
        return "inconclusive", (
            f"the sequence tolerance{ill_at} {e.tol:.3g} ({parted} part by "
            f"{(e.tol - first * max(1.0, e.scale)) / 2:.3g}) exceeds {rho:.3g} of "
            f"the output's scale ({e.scale:.3g}): the layer is ill-conditioned on these inputs" + f.at_dtype
            + (f" (a file with this slip could pass it: {ill_esc})" if ill_esc else ""))
    if st["loose"] > rho:
        return "ok", (f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale, "
                      f"but every gate-block swap and other layout slip checked would fail it on these states")
    return None


def _ok_note(f: Findings, tol: Tolerances, s: _Sorted) -> str:
    """Why an ``ok`` sequence comparison was over its float32 estimate or its tolerance loose, yet decided."""
    rho = tol.rho
    return (f"the first {f.steps} steps as a sequence{s.where} differ by {s.worst.err:.3g}, above the float32 "
            f"estimate {s.worst.tol:.3g} but within {rho:.3g} of the output's scale" if s.over else
            f"the sequence tolerance ({max(e.tol for e in f.seqs):.3g}) exceeds {rho:.3g} of the output's scale "
            f"(the source's float32 and float64 runs part)") + (
            ", while every step passed its bound and every sequence-level slip (directions exchanged, stacked "
            "layers exchanged, run in the other time order) would move the float64 sequence by more than twice "
            "that")


def _escape(f: Findings) -> str | None:
    if f.sequence_escape == ASK:
        raise _Ask("sequence_escapes", tols=[e.tol for e in f.seqs])
    return f.sequence_escape


def decide(f: Findings, tol: Tolerances) -> dict[str, Any]:
    """The verdict of one layer (module docstring, rules 1-11). Returns :class:`~rnnconvert.verify.checks.LayerCheck` fields: ``verdict``
    (``'ok'``, ``'inconclusive'``, ``'fail'``), ``reason``, the headline ``max_abs_err``/``tolerance``/
    ``max_abs_ref``/``reference`` (the comparison closer to failing: ``'step'`` or ``'sequence'``), ``seq_err``/
    ``seq_tol`` (the sequence reported), and the one-step numbers where that comparison ran. Or, where a rule needs a
    measurement still :data:`ASK`, ``{"ask": "far", "over": [SeqCheck]}`` or ``{"ask": "sequence_escapes", "tols":
    [float]}``: the caller measures it into ``f`` and calls again."""
    s, st = _sort(f, tol), f.step
    far = seq_esc = None
    try:
        if s.over and not s.hard and not s.ill_over and not s.step_failed:
            if f.far == ASK:
                raise _Ask("far", over=s.over)
            far = f.far
            seq_esc = None if far else _escape(f)
        verdict, reason = (_sequence_rules(f, tol, s, far, seq_esc) or _state_rules(f, tol, s) or ("ok", ""))
    except _Ask as a:
        return {"ask": a.what, **a.args_}
    if verdict == "ok" and (s.over or s.ill):
        reason = "; ".join(r for r in (reason, _ok_note(f, tol, s)) if r)
    w = s.worst
    if verdict == "fail" and f.whole is not None and reason.startswith("the written layer run whole"):
        w = f.whole  # the comparison that failed is the headline
    out = dict(verdict=verdict, reason=reason, max_abs_err=w.err, tolerance=w.tol, max_abs_ref=w.scale,
               reference="sequence", seq_err=w.err, seq_tol=w.tol)
    if st:
        out.update(step_err=st["err"], step_tol=st["tol"], step_ratio=st["ratio"], steps_checked=st["n"],
                   step_err_t=st["err_t"], step_bound_t=st["bound_t"])
        if st["ratio"] >= w.err / max(w.tol, 1e-300):
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
