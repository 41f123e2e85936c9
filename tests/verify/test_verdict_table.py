"""Every rule of the verdict (rnnconvert.verify.verdict.decide, docs/cli.md "Verdicts"), one row of a table each:
the measured numbers in, the verdict and the words of its reason out. No framework runs: the verdict is a pure
function of what the comparisons measured, and the two measurements it may ask for (the float32 spread of a sequence
over its one-sample tolerance measured again over several evaluation orders, a slip only a sequence shows) are
constants here, given when asked for, each row saying which it expects to be asked.

The numbers are chosen far from every threshold (factors of 3 or more), so no rounding moves a row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rnnconvert.errors import VerificationError
from rnnconvert.verify.verdict import (Findings, SeqCheck, Spread, Tolerances, decide, fraction, measured, route,
                                       sequence_checks, sequence_tolerance, wiring_check)

TOL = Tolerances(first=1e-5, rho=1e-2, far=4.0)

#: a one-step comparison that passed with a tight bound (ratio 0.5, bound 1e-6 of a scale 1)
STEP = {"ratio": 0.5, "err": 5e-7, "bound": 1e-6, "tol": 1e-6, "loose": 1e-6, "where": "stacked layer 0, direction 0, "
        "h, probe 1", "n": 24, "scale": 1.0, "err_t": [1e-7], "bound_t": [1e-6], "applied_t": [1e-6],
        # against the tolerance applied: the bound (no measured tolerance)
        "m_ratio": 0.5, "m_err": 5e-7, "m_tol": 1e-6, "m_bound": 1e-6, "m_where": "stacked layer 0, direction 0, "
        "h, probe 1", "m_kind": "bound", "m_max": 1e-6, "measured": (), "fraction": 1.0}
FAILED_STEP = dict(STEP, ratio=50.0, err=5e-5)
LOOSE_STEP = dict(STEP, loose=0.5, tol=0.5)  # a bound of half the output's scale: above rho
#: ... where the measured tolerance (rule E) was applied: up to 0.05 (a share 0.0125 of the bound, times FAR 4)
LOOSE_MEASURED = dict(LOOSE_STEP, m_kind="measured", m_max=0.05, m_tol=0.05, m_err=5e-7, m_ratio=1e-5,
                      measured=("numpy BLAS", "blocked sums, reversed"), fraction=0.0125)

GOOD = SeqCheck(err=1e-6, tol=2e-5, scale=1.0, by_target=False)  # well within its one-sample tolerance
OVER = SeqCheck(err=5e-4, tol=2e-5, scale=1.0, by_target=False)  # over it (one run's spread 5e-6), 20x below rho
HARD = SeqCheck(err=0.5, tol=2e-5, scale=1.0, by_target=False)  # over it by more than rho of the scale
ILL = SeqCheck(err=1e-3, tol=0.1, scale=1.0, by_target=False)  # the source's own runs part by 0.05 > rho
ILL_TARGET = ILL._replace(by_target=True)  # ... an emulated target's spread does
ILL_OVER = SeqCheck(err=0.5, tol=0.1, scale=1.0, by_target=False)  # over an ill tolerance, above rho

ORDERS = ("numpy BLAS", "blocked sums, reversed", "sequential sums")
#: measured spreads: SMALL leaves OVER beyond its measured tolerance (1e-5 + 4 * 5e-6 = 3e-5, 16x below its error);
#: WIDE covers it (1e-5 + 4 * 1e-3 = 4.01e-3, 8x above); HUGE covers HARD (0.8): a tolerance itself above rho
SMALL, WIDE, HUGE = (Spread(1e-6, ORDERS), Spread(1e-3, ORDERS), Spread(0.2, ORDERS))

# (id, Findings keywords, the spreads measured ({index: Spread} or why not), sequence_escapes' answer ("x": never
# asked), asked (spread, escapes), verdict, words)
ROWS = [
    ("1 step over its bound", dict(seqs=[HARD], step=FAILED_STEP), "x", "x", (0, 0), "fail",
     "one step from the source's state differs by 5e-05 where the float bound allows 1e-06 (stacked layer 0"),
    ("1' the whole wired layer over", dict(seqs=[GOOD, GOOD], step=STEP, whole=HARD), "x", "x", (0, 0), "fail",
     "the written layer run whole (every node and the wiring between them) on the first 8 steps differs by 0.5 "
     "from its nodes run one by one and joined as the source's layer joins them (tolerance 2e-05), more than 0.01 "
     "of the output's scale (1)"),
    ("1'' the whole wired layer over within rho", dict(seqs=[GOOD, GOOD], step=STEP, whole=OVER), "x", "x", (0, 0),
     "ok", ""),
    ("2 beyond the measured tolerance, within rho", dict(seqs=[OVER], step=STEP), {0: SMALL}, "x", (1, 0),
     "inconclusive", "differ by 0.0005, 500 times the largest float32 spread measured over 3 evaluation orders "
     "(1e-06: numpy BLAS, blocked sums, reversed, sequential sums; tolerance 3e-05), while every step passed its "
     "bound: more than float32 rounding explains, less than a layout slip moves the outputs (0.01 of the output's "
     "scale, 1): neither tolerance decides"),
    ("2' within the measured tolerance", dict(seqs=[OVER], step=STEP), {0: WIDE}, "x", (1, 0), "ok", ""),
    ("3 beyond the measured tolerance by more than rho", dict(seqs=[HARD], step=STEP), {0: SMALL}, "x", (1, 0),
     "fail", "the first 8 steps as a sequence differ by 0.5 (tolerance 3e-05, measured over 3 float32 evaluation "
     "orders)"),
    ("3' ... where the spread could not be measured", dict(seqs=[HARD], step=STEP), "WHY", "x", (1, 0), "fail",
     "differ by 0.5 (tolerance 2e-05, one float32 run's estimate)"),
    ("3'' beyond it with no one-step comparison", dict(seqs=[OVER], step={}, step_note="why"), {0: SMALL}, "x",
     (1, 0), "fail", "differ by 0.0005 (tolerance 3e-05, measured over 3 float32 evaluation orders)"),
    ("3''' the failing slab named", dict(seqs=[GOOD, HARD], step=STEP), {1: SMALL}, "x", (1, 0), "fail",
     "as a sequence (stacked layer 1, from the source's own input) differ by 0.5"),
    ("4 over an ill-conditioned tolerance", dict(seqs=[ILL_OVER], step=STEP), {0: SMALL}, "x", (1, 0),
     "inconclusive", "differ by 0.5, above the tolerance 0.2, on a layer whose float32 runs part from its float64 "
     "run (the tolerance's float32 term 0.2 exceeds 0.01 of the output's scale, 1): ill-conditioned on these "
     "inputs"),
    ("4' beyond an ill-conditioned measured tolerance", dict(seqs=[HARD], step=STEP), {0: Spread(0.05, ORDERS)},
     "x", (1, 0), "inconclusive", "differ by 0.5, above the tolerance 0.2, on a layer whose float32 runs part from "
     "its float64 run (the tolerance's float32 term 0.2 exceeds 0.01 of the output's scale, 1)"),
    ("5 over, the spread not measured, within rho", dict(seqs=[OVER], step=STEP), "the layer is not read again", "x",
     (1, 0), "inconclusive", "differ by 0.0005, above one float32 run's estimate 2e-05 but within 0.01 of the "
     "output's scale (1) while every step passed its bound, and the layer is not read again: cannot decide"),
    ("6 no one-step comparison", dict(seqs=[GOOD], step={}, step_note="no runner"), "x", "x", (0, 0),
     "inconclusive", "the one-step comparison could not run: no runner"),
    ("6' within the measured tolerance, no one-step comparison", dict(seqs=[OVER], step={}, step_note="no runner"),
     {0: WIDE}, "x", (1, 0), "inconclusive", "the one-step comparison could not run: no runner"),
    ("7 a gate unit unexercised", dict(seqs=[GOOD], step=STEP, unexercised="gate f unit 3", constructed=4), "x",
     "x", (0, 0), "inconclusive", "gate f unit 3: unresponsive in every one-step state (the trajectory's, the "
     "probes and 4 constructed"),
    ("8 a weight no state reaches", dict(seqs=[GOOD], step=STEP, resolution=math.inf, resolution_at="W_hh[0, 1]"),
     "x", "x", (0, 0), "inconclusive", "a weight of W_hh[0, 1] reaches no output in any one-step state"),
    ("9 loose bound, a swap it would miss", dict(seqs=[GOOD], step=LOOSE_STEP, loose_escape="gates i and f swapped"),
     "x", "x", (0, 0), "inconclusive", "too loose to tell a broken file from a correct one (a file with this slip "
     "could pass it: gates i and f swapped)"),
    ("9' loose bound, slips not checkable", dict(seqs=[GOOD], step=LOOSE_STEP, loose_escape="n/a: no probes"),
     "x", "x", (0, 0), "inconclusive", "from a correct one (no probes)"),
    ("9'' loose bound, nothing named", dict(seqs=[GOOD], step=LOOSE_STEP), "x", "x", (0, 0), "inconclusive",
     "too loose to tell a broken file from a correct one"),
    ("10 ill tolerance from the emulated target", dict(seqs=[ILL_TARGET], step=STEP, at_dtype=" at float16"),
     {0: SMALL}, "x", (1, 0), "inconclusive", "the sequence tolerance 0.2 (a run emulating the target's arithmetic "
     "and the float64 run part: float32 term 0.2) exceeds 0.01 of the output's scale (1): the layer is "
     "ill-conditioned on these inputs at float16"),
    ("10' ill tolerance a slip could hide in", dict(seqs=[ILL], step=STEP), {0: SMALL}, "SLIP", (1, 1),
     "inconclusive", "(float32 and float64 runs of the source part: float32 term 0.2) exceeds 0.01 of the output's "
     "scale (1): the layer is ill-conditioned on these inputs (a file with this slip could pass it: SLIP)"),
    ("10'' ill tolerance, every slip would show", dict(seqs=[ILL], step=STEP), {0: SMALL}, None, (1, 1), "ok",
     "the sequence tolerance (0.2) exceeds 0.01 of the output's scale (float32 and float64 runs of the source "
     "part), while every step passed its bound and every sequence-level slip"),
    ("10'' ... its spread not measured", dict(seqs=[ILL], step=STEP), "not read again", "SLIP", (1, 1),
     "inconclusive", "the sequence tolerance 0.1 (float32 and float64 runs of the source part: float32 term 0.1)"),
    ("10''' a measured tolerance above rho, a slip could hide in", dict(seqs=[HARD], step=STEP), {0: HUGE}, "SLIP",
     (1, 1), "inconclusive", "the sequence tolerance 0.8 (float32 and float64 runs of the source part: float32 term "
     "0.8) exceeds 0.01 of the output's scale (1): the layer is ill-conditioned on these inputs (a file with this "
     "slip could pass it: SLIP)"),
    # rule A asked of the measured tolerance (rule E): where the bound let a slip pass, the slip was checked again
    # against the tolerance applied (a slip caught: beyond it, so inconclusive or fail, never ok)
    ("9m loose bound, a slip even the measured tolerance lets pass",
     dict(seqs=[GOOD], step=LOOSE_MEASURED, loose_escape="gates i and f swapped", escapes_measured=True), "x", "x",
     (0, 0), "inconclusive", "the one-step bound (up to 0.5) exceeds 0.01 of the output's scale (1), and a file with "
     "this slip could pass even the measured tolerance applied (up to 0.05, rule E): gates i and f swapped"),
    ("9m' loose bound, measured tolerance, a slip the bound let pass in a slab without one",
     dict(seqs=[GOOD], step=LOOSE_MEASURED, loose_escape="gates i and f swapped"), "x", "x", (0, 0),
     "inconclusive", "too loose to tell a broken file from a correct one (a file with this slip could pass it: "
     "gates i and f swapped)"),
    ("11m loose bound, every slip beyond the measured tolerance",
     dict(seqs=[GOOD], step=LOOSE_MEASURED, swaps_caught=True, escapes_measured=True), "x", "x", (0, 0), "ok",
     "every gate-block swap and other layout slip checked would be beyond the measured tolerance applied (up to "
     "0.05, rule E) on these states: inconclusive or fail, never ok"),
    ("11m' loose bound, measured tolerance, every slip caught by the bound itself",
     dict(seqs=[GOOD], step=LOOSE_MEASURED, swaps_caught=True), "x", "x", (0, 0), "ok",
     "every gate-block swap and other layout slip checked would fail it on these states"),
    ("11 loose bound, every swap caught", dict(seqs=[GOOD], step=LOOSE_STEP, swaps_caught=True), "x", "x", (0, 0),
     "ok", "but every gate-block swap and other layout slip checked would fail it on these states"),
    ("11' ok", dict(seqs=[GOOD], step=STEP, resolution=1e-4), "x", "x", (0, 0), "ok", ""),
]


def _decide(f: Findings, spreads, esc, calls: dict) -> dict:
    """:func:`decide`, each measurement it asks for given (as the engine does) and counted."""
    while (out := decide(f, TOL)).get("ask"):
        if out["ask"] == "spread":
            calls["spread"] += 1
            assert out["over"] and all(f.seqs[j].err > f.seqs[j].tol or f.seqs[j] in (ILL, ILL_TARGET, ILL_OVER)
                                       for j in out["over"])  # over one sample, or ill-conditioned
            assert isinstance(spreads, str) or sorted(spreads) == out["over"], (spreads, out)
            f.spreads = spreads
        else:
            calls["esc"] += 1
            assert out["tols"] and all(t >= e.tol for t, e in zip(out["tols"], f.seqs))  # one-sample or measured
            f.sequence_escape = esc
        assert calls["spread"] <= 1 and calls["esc"] <= 1, calls
    return out


@pytest.mark.parametrize("kw,spreads,esc,asked,verdict,words", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_every_rule(kw, spreads, esc, asked, verdict, words):
    calls = {"spread": 0, "esc": 0}
    out = _decide(Findings(steps=8, **kw), spreads, esc, calls)
    assert out["verdict"] == verdict, out["reason"]
    assert (words in out["reason"]) if words else out["reason"] == "", out["reason"]
    assert (calls["spread"], calls["esc"]) == asked  # each measurement asked for exactly where a rule needs it


def test_the_measured_tolerance_is_the_headline():
    """A sequence within its measured tolerance reports that tolerance (``first * max(1, scale) + far * M``)."""
    out = _decide(Findings([OVER], dict(STEP, ratio=0.01), steps=8), {0: WIDE}, "x", {"spread": 0, "esc": 0})
    assert (out["verdict"], out["reference"], out["seq_err"], out["max_abs_err"]) == ("ok", "sequence", 5e-4, 5e-4)
    assert out["seq_tol"] == pytest.approx(1e-5 + 4 * 1e-3, rel=1e-12)


def test_the_step_against_the_tolerance_applied():
    """The one step is reported against the tolerance that decided it (rule E's measured one, or the bound), at the
    element closest to it, naming which: the numbers of the comparison, passed through."""
    bound = decide(Findings([GOOD], STEP, steps=8), TOL)
    assert (bound["step_applied_kind"], bound["step_applied_err"], bound["step_applied_tol"],
            bound["step_applied_ratio"], bound["step_ratio"]) == ("bound", 5e-7, 1e-6, 0.5, 0.5)
    m = decide(Findings([GOOD], LOOSE_MEASURED, steps=8, swaps_caught=True), TOL)
    assert (m["step_applied_kind"], m["step_applied_err"], m["step_applied_tol"], m["step_applied_ratio"],
            m["step_ratio"]) == ("measured", 5e-7, 0.05, 1e-5, 0.5)


def test_measured_tolerance():
    """``measured``: ``first * max(1, scale) + far * max(own spread, measured spread)``; never below the one-sample
    tolerance, so measuring only the sequences above it decides as measuring all would (binary fractions: exact)."""
    tol = Tolerances(first=2.0 ** -10, rho=1e-2, far=4.0)
    e = SeqCheck(err=1.0, tol=4 * 2.0 ** -10 + 2 * 2.0 ** -12, scale=4.0, by_target=False)  # own spread 2^-12
    assert measured(e, Spread(2.0 ** -8, ORDERS), tol).tol == 4 * 2.0 ** -10 + 4 * 2.0 ** -8
    assert measured(e, Spread(0.0, ORDERS), tol).tol == 4 * 2.0 ** -10 + 4 * 2.0 ** -12  # the own spread counts
    assert measured(e, Spread(0.0, ORDERS), tol).tol > e.tol
    assert measured(e, Spread(1.0, ORDERS), tol)._replace(tol=e.tol) == e  # only the tolerance changes


def test_the_failed_whole_layer_is_the_headline():
    out = decide(Findings([GOOD, GOOD], STEP, steps=8, whole=HARD), TOL)
    assert (out["max_abs_err"], out["tolerance"], out["reference"]) == (0.5, 2e-5, "sequence")


def test_headline_is_the_comparison_closer_to_failing():
    seq = decide(Findings([SeqCheck(1e-5, 2e-5, 3.0, False)], STEP, steps=8), TOL)  # 0.5 of the tolerance
    assert (seq["reference"], seq["max_abs_err"], seq["tolerance"], seq["max_abs_ref"]) == ("step", 5e-7, 1e-6, 3.0)
    assert (seq["seq_err"], seq["seq_tol"], seq["step_ratio"], seq["steps_checked"]) == (1e-5, 2e-5, 0.5, 24)
    closer = decide(Findings([SeqCheck(1.8e-5, 2e-5, 3.0, False)], STEP, steps=8), TOL)  # 0.9 of the tolerance
    assert (closer["reference"], closer["max_abs_err"], closer["tolerance"]) == ("sequence", 1.8e-5, 2e-5)
    none = decide(Findings([GOOD], {}, "why", steps=8), TOL)
    assert none["reference"] == "sequence" and "step_err" not in none


ROUTES = [  # (step ran, step note, sequence note, words)
    (True, "", "", "torch 2.1 one-step + sequence"),
    (False, "no one-step runner for this format", "", "torch 2.1 (sequence); no one-step runner for this format"),
    (True, "one step by the numpy reference on the arrays read back (no one-step runner for this format)",
     "", "torch 2.1 (sequence); one step by the numpy reference"),
    (True, "one step by the numpy reference on the arrays read back (NOT THERE)", "seq fallback",
     "numpy reference on the arrays read back from the written file, one step + sequence (torch is not installed"),
]


@pytest.mark.parametrize("ran,note,seq_note,words", ROUTES)
def test_route_words(ran, note, seq_note, words):
    assert route("torch 2.1", ran, note, seq_note, "NOT THERE").startswith(words)


def test_route_names_the_whole_layer_run():
    assert route("onnxruntime 1.2", True, "", "", "NOT THERE", whole=True) == \
        "onnxruntime 1.2 one-step + sequence + the whole layer's graph"


def test_tolerances():
    assert fraction(2.0 ** -24) == 1e-2 and fraction(2.0 ** -11) == 64 * 2.0 ** -11
    y64 = np.array([[[2.0, -4.0]]])
    y32 = np.array([[[2.0, -4.0 + 2.0 ** -20]]], np.float32)
    # first * max(1, max|y64|) + 2 * max(own spread, emulated spread): both terms by hand (binary fractions: exact)
    assert sequence_tolerance(y64, y32, 2.0 ** -10) == 4 * 2.0 ** -10 + 2 * 2.0 ** -20
    assert sequence_tolerance(y64, y32, 2.0 ** -10, spread=2.0 ** -8) == 4 * 2.0 ** -10 + 2 * 2.0 ** -8


def test_wiring_check():
    ref = np.zeros((2, 3, 4))
    ref[0, 0, 0] = -2.0
    whole = ref.copy()
    whole[1, 2, 3] = 0.5
    got = wiring_check("l", whole, ref, ref, lambda: ref, 2.0 ** -10)
    assert got == SeqCheck(0.5, 2 * 2.0 ** -10, 2.0, False)  # first * max(1, max|ref64|); no float32 spread
    whole[0, 0, 0] = np.inf
    assert wiring_check("l", whole, ref, ref, lambda: ref, 2.0 ** -10).err == math.inf
    with pytest.raises(VerificationError, match="layer 'l' output shape"):
        wiring_check("l", whole[:, :2], ref, ref, lambda: ref, 1e-5)


def test_wiring_check_equal_runs_need_no_float64_chain():
    """Whole layer and nodes joined equal bit for bit: error 0, the float64 chain never asked for (issue #38); where
    they differ and the chain cannot be computed, one clear error."""
    ref = np.zeros((2, 3, 4))
    ref[0, 0, 0] = -2.0

    def never():
        raise AssertionError("the float64 chain was computed")
    got = wiring_check("l", ref.copy(), ref, ref, never, 2.0 ** -10)
    assert got.err == 0.0 and got.err <= got.tol
    whole = ref.copy()
    whole[0, 1, 1] = 1e-3
    with pytest.raises(VerificationError, match="layer 'l'.*could not be computed: gone"):
        wiring_check("l", whole, ref, ref, lambda: "gone", 2.0 ** -10)


def test_sequence_checks():
    ref = np.zeros((2, 3, 4))
    y = ref.copy()
    y[1, 2, 0] = 0.25
    bad = y.copy()
    bad[0, 0, 0] = np.nan
    seqs, per_t = sequence_checks("l", [(y, ref, ref), (bad, ref, ref)], [0.0, 2.0 ** -6], 2.0 ** -10)
    assert seqs == [SeqCheck(0.25, 2.0 ** -10, 0.0, False), SeqCheck(math.inf, 2.0 ** -10 + 2.0 ** -5, 0.0, True)]
    assert per_t.tolist() == [math.inf, 0.0, 0.25]
    with pytest.raises(VerificationError, match="layer 'l' output shape"):
        sequence_checks("l", [(y[:, :2], ref, ref)], [0.0], 1e-5)


def test_no_framework_imported():
    import subprocess
    import sys

    code = ("import sys; import rnnconvert.verify.verdict; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'onnx', 'onnxruntime', 'keras', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
