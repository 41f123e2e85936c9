"""The verdict's words for the sequence comparisons of the rows a whole model's graph feeds a layer (issue #39:
``Findings.seq_names``, rnnconvert/verify/verdict.py): a failing or undecided one names the rows, at their full
length, and the batch's own comparison keeps its words (a single one is not "stacked layer 0"). Pure: no framework
runs; the numbers are far from every threshold, as in tests/verify/test_verdict_table.py."""

from __future__ import annotations

from rnnconvert.verify.verdict import Findings, SeqCheck, Spread, Tolerances, decide

TOL = Tolerances(first=1e-5, rho=1e-2, far=4.0)
STEP = {"ratio": 0.5, "err": 5e-7, "bound": 1e-6, "tol": 1e-6, "loose": 1e-6, "where": "stacked layer 0, direction 0, "
        "h, probe 1", "n": 24, "scale": 1.0, "err_t": [1e-7], "bound_t": [1e-6],
        "m_ratio": 0.5, "m_err": 5e-7, "m_tol": 1e-6, "m_bound": 1e-6, "m_where": "stacked layer 0, direction 0, "
        "h, probe 1", "m_kind": "bound"}
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


def test_a_one_step_state_of_fed_rows_is_named_by_its_group_row_and_step():
    """rnnconvert.verify.target_run._where: the batch's states (b * T + t), then each group's (all, or those picked:
    flat indices row * steps + step), then the probes and the constructed states."""
    import numpy as np

    from rnnconvert.verify.escapes import N_PROBES
    from rnnconvert.verify.target_run import _where

    fed = [("graph-fed row 0 (9 steps)", (0,), 9, None),
           ("graph-fed rows 1, 2 (6 steps)", (1, 2), 6, np.array([0, 7, 11]))]
    assert _where(5, 3, 8, fed) == "sequence 0, step 5"
    assert _where(24 + 4, 3, 8, fed) == "graph-fed row 0 (9 steps): row 0, unmasked step 4"
    assert _where(24 + 9 + 1, 3, 8, fed) == "graph-fed rows 1, 2 (6 steps): row 2, unmasked step 1"
    assert _where(24 + 9 + 3, 3, 8, fed) == "probe 0"
    assert _where(24 + 9 + 3 + N_PROBES + 2, 3, 8, fed) == "constructed state 2"
