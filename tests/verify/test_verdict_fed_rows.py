"""The verdict's words for the sequence comparisons of the rows a whole model's graph feeds a layer (issue #39:
``Findings.seq_names``, rnnconvert/verify/verdict.py): a failing or undecided one names the rows, at their full
length, and the batch's own comparison keeps its words (a single one is not "stacked layer 0"). Pure: no framework
runs; the numbers are far from every threshold, as in tests/verify/test_verdict_table.py."""

from __future__ import annotations

from rnnconvert.verify.verdict import Findings, SeqCheck, Spread, Tolerances, decide

TOL = Tolerances(first=1e-5, rho=1e-2, far=4.0)
STEP = {"ratio": 0.5, "err": 5e-7, "bound": 1e-6, "tol": 1e-6, "loose": 1e-6, "where": "stacked layer 0, direction 0, "
        "h, probe 1", "n": 24, "scale": 1.0, "err_t": [1e-7], "bound_t": [1e-6]}
GOOD = SeqCheck(err=1e-6, tol=2e-5, scale=1.0, by_target=False)
OVER = SeqCheck(err=5e-4, tol=2e-5, scale=1.0, by_target=False)
HARD = SeqCheck(err=0.5, tol=2e-5, scale=1.0, by_target=False)
ILL = SeqCheck(err=1e-3, tol=0.1, scale=1.0, by_target=False)
NAMES = ["", "graph-fed rows 1, 2 (6 steps)"]


def _decide(seqs, spreads=None, escape="x"):
    f = Findings(seqs=seqs, step=STEP, steps=8, seq_names=NAMES)
    while (out := decide(f, TOL)).get("ask"):
        if out["ask"] == "spread":
            f.spreads = spreads
        else:
            f.sequence_escape = escape
    return out


def test_a_failing_fed_sequence_names_its_rows():
    out = _decide([GOOD, HARD], {1: Spread(1e-6, ("numpy BLAS",))})
    assert out["verdict"] == "fail"
    assert out["reason"].startswith("the graph-fed rows 1, 2 (6 steps) as a sequence (all their steps) differ by 0.5")


def test_the_batch_sequence_keeps_its_words():
    out = _decide([HARD, GOOD], {0: Spread(1e-6, ("numpy BLAS",))})
    assert out["verdict"] == "fail" and out["reason"].startswith("the first 8 steps as a sequence differ by 0.5")


def test_an_undecided_fed_sequence_names_its_rows():
    out = _decide([GOOD, OVER], {1: Spread(1e-6, ("numpy BLAS",))})
    assert out["verdict"] == "inconclusive"
    assert out["reason"].startswith("the graph-fed rows 1, 2 (6 steps) as a sequence (all their steps) differ by")


def test_an_ill_conditioned_fed_tolerance_names_its_rows():
    out = _decide([GOOD, ILL], {1: Spread(0.02, ("numpy BLAS",))}, escape="the time order flipped (go_backwards)")
    assert out["verdict"] == "inconclusive"
    assert out["reason"].startswith("the sequence tolerance of the graph-fed rows 1, 2 (6 steps)")
