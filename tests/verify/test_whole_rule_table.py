"""The one rule of whole models (rnnconvert/verify/whole_rule.py, issue #39) as a table: measurements in, verdict
out; no framework. Each row's numbers are chosen to sit on one side of one rule's threshold (by factors of 2 or
more), so no rounding decides a row."""

import math

import pytest

from rnnconvert.verify.whole_rule import AMPLIFIED, ASK, WholeFindings, decide_whole

FIRST, RHO = 2e-5, 1e-2
SRC = "the source framework's float32 run against the float64 reference"


def verdict(f: WholeFindings) -> dict:
    return decide_whole(f, FIRST, RHO)


ROWS = [
    # (case, findings, verdict, words in the reason)
    ("within the fixed term, nothing more measured", WholeFindings(1e-6, 3.0), "ok", ""),
    ("a shape mismatch", WholeFindings(math.inf, 3.0, shape="shape (3, 4) where the source gives (3, 5)"), "fail",
     "shape"),
    ("a non-finite output", WholeFindings(math.inf, 3.0), "fail", "not finite"),
    ("no float64 reference could be run", WholeFindings(1e-3, 1.0, err64=None, spreads={}, why_none="no twin"),
     "inconclusive", "no twin"),
    ("above the fixed term, within the measured spread", WholeFindings(3e-5, 1.0, err64=3e-5, spreads={SRC: 2e-5}),
     "ok", ""),
    ("well-conditioned, a slip (Dense weight x1.01)", WholeFindings(4e-3, 1.0, err64=4e-3, spreads={SRC: 1e-7}),
     "fail", "tolerance"),
    ("well-conditioned, just over twice the tolerance", WholeFindings(5e-5, 1.0, err64=5e-5, spreads={SRC: 1e-6}),
     "fail", "tolerance"),
    ("chaotic: the source's own runs part by more than rho", WholeFindings(0.8, 1.0, err64=0.8, spreads={SRC: 0.2}),
     "inconclusive", "chaotic"),
    ("amplified rounding, within AMPLIFIED x the spread",
     WholeFindings(1e-3, 1.0, err64=1e-3, spreads={SRC: 1e-4, "torch": 3e-4}), "inconclusive", "amplifies"),
    ("amplified rounding, far beyond AMPLIFIED x the spread",
     WholeFindings(2e-2, 1.0, err64=2e-2, spreads={SRC: 1e-4}), "fail", "tolerance"),
]


@pytest.mark.parametrize("case,f,want,words", ROWS, ids=[r[0] for r in ROWS])
def test_whole_rule_table(case, f, want, words):
    out = verdict(f)
    assert out["verdict"] == want, (case, out)
    assert words in out["reason"], (case, out["reason"])


def test_spreads_are_asked_for_only_above_the_fixed_term():
    assert verdict(WholeFindings(1.9e-5, 0.5))["verdict"] == "ok"  # 2e-5 * max(1, 0.5)
    assert verdict(WholeFindings(3e-5, 0.5)) == {"ask": "spreads"}
    assert verdict(WholeFindings(3e-5, 0.5, spreads={SRC: 1e-6})) == {"ask": "spreads"}  # err64 still ASK
    assert verdict(WholeFindings(3e-5, 0.5, err64=ASK, spreads=ASK)) == {"ask": "spreads"}


def test_the_largest_spread_sets_the_tolerance():
    out = verdict(WholeFindings(1e-4, 1.0, err64=1e-4, spreads={SRC: 1e-6, "another order": 4e-5}))
    assert out["verdict"] == "ok"
    assert out["tolerance"] == FIRST + 2 * 4e-5
    assert out["reference"] == "float64"


def test_a_chaotic_model_is_never_fail():
    for err in (1e-3, 0.2, 1.0, 10.0):  # within the tolerance 2e-5 + 0.1 or not: a tolerance that wide decides nothing
        assert verdict(WholeFindings(err, 1.0, err64=err, spreads={SRC: 0.05}))["verdict"] == "inconclusive"


def test_the_amplified_band_ends_at_its_factor():
    s = 1e-4  # 2 s = 2e-4 > FIRST: amplified; 2 s < RHO: not chaotic
    inside = FIRST + 2 * AMPLIFIED * s * 0.5
    outside = FIRST + 2 * AMPLIFIED * s * 2
    assert verdict(WholeFindings(inside, 1.0, err64=inside, spreads={SRC: s}))["verdict"] == "inconclusive"
    assert verdict(WholeFindings(outside, 1.0, err64=outside, spreads={SRC: s}))["verdict"] == "fail"


def test_a_chaotic_model_matching_the_source_float32_run_is_ok():
    assert verdict(WholeFindings(1e-6, 1.0, err64=0.3, spreads={SRC: 0.3}))["verdict"] == "ok"  # rule 2 first


def test_a_well_conditioned_model_is_always_decided():
    s = 1e-6  # 2 s far below FIRST
    for err in (3e-5, 1e-4, 1e-2, 1.0):
        assert verdict(WholeFindings(err, 1.0, err64=err, spreads={SRC: s}))["verdict"] == "fail"
