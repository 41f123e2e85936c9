"""Issue #39, rule E of docs/cli.md "Verdicts": the one-step comparison's tolerance is measured.

* A framework's own float32 step (torch's ``nn.GRU``/``nn.LSTM`` on the CPU, the oracle of a correct target: it is not
  rnnconvert) from random states lies within the measured tolerance ``E`` that ``orders.step_tolerance`` makes of the
  spread ``orders.step_spread`` measures on those states; ``E`` never exceeds the rigorous bound, covers ``FAR`` times
  every spread measured, and is tighter than the bound (what the rule is for).
* The verdict's rules on it (``verdict.decide``, pure): within ``E`` ``ok`` with ``E`` the headline tolerance; beyond
  ``E`` but within ``STEP_FAIL`` times it and within the bound ``inconclusive`` naming both numbers (rule 6b); beyond
  ``STEP_FAIL`` times it ``fail`` (rule 1), as beyond the bound.

The numbers of the table rows are chosen away from every threshold; the torch comparison has the rule's own margin
(correct targets reach at most 1.4 of the ``FAR = 4`` shares of the bound on the fixtures)."""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert.verify import bounds, orders
from rnnconvert.verify.verdict import Findings, SeqCheck, Tolerances, decide

torch = pytest.importorskip("torch")

U = 2.0 ** -24


def _module(cell: str):
    torch.manual_seed(39)
    m = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(24, 32, batch_first=True)
    with torch.no_grad():  # gate-distinct weights of unit scale (default init is +-1/sqrt(32))
        for p in m.parameters():
            p.mul_(3.0)
    return m


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_torch_step_is_within_the_measured_tolerance_which_is_within_the_bound(cell):
    from rnnconvert.engine.pipeline import load_object

    m = _module(cell)
    layer = load_object(m).layers[0]
    p = layer.params[0][0]
    rng = np.random.default_rng(7)
    n, H = 64, 32
    x = rng.standard_normal((n, 24)).astype(np.float32)
    h = (rng.uniform(-0.9, 0.9, (n, H))).astype(np.float32)
    c = rng.standard_normal((n, H)).astype(np.float32) if cell == "lstm" else None
    exact, bound = bounds.step_with_bound(layer, p, x, h, c, U)
    spread, used = orders.step_spread(layer, p, x, h, c, exact)
    (th, tc), r = orders.step_tolerance(exact, bound, spread, U)
    with torch.no_grad():  # the oracle: torch's own float32 step from the same states
        init = torch.from_numpy(h)[None] if c is None else (torch.from_numpy(h)[None], torch.from_numpy(c)[None])
        _, last = m(torch.from_numpy(x)[:, None, :], init)
    got = [last] if c is None else list(last)
    for t, e, tol, b, s in zip(got, exact, (th, tc), bound, spread):
        err = np.abs(t[0].numpy().astype(np.float64) - e)
        assert (err <= tol).all(), float((err / tol).max())
        assert (tol <= b).all()
        assert (tol >= orders.FAR * s).all()
    assert r * orders.FAR < 1.0, r  # tighter than the bound: the resolution follows from it
    assert len(used) == len(orders.ORDERS)


TOL = Tolerances(first=1e-5, rho=1e-2, far=4.0, step_fail=2.0)
GOOD = SeqCheck(err=1e-6, tol=2e-5, scale=1.0, by_target=False)
ORDERS = ("numpy BLAS", "blocked sums, reversed")
#: a one-step comparison within its measured tolerance (1e-6), itself 10x below the bound (1e-5)
STEP = {"ratio": 0.03, "err": 3e-7, "bound": 1e-5, "tol": 1e-5, "loose": 1e-5, "where": "w", "n": 24, "scale": 1.0,
        "err_t": [3e-7], "bound_t": [1e-5], "m_ratio": 0.3, "m_err": 3e-7, "m_tol": 1e-6, "m_bound": 1e-5,
        "m_where": "stacked layer 0, direction 0, h, probe 1", "fraction": 0.025, "measured": ORDERS}


@pytest.mark.parametrize("step,verdict,words", [
    (STEP, "ok", ""),
    (dict(STEP, ratio=0.15, err=1.5e-6, m_ratio=1.5, m_err=1.5e-6), "inconclusive",
     "one step from the source's state differs by 1.5e-06, 1.5 times its measured tolerance 1e-06 (4 times 0.025 of "
     "the bound, the largest share of it that float32 rounding reached over 2 evaluation orders: numpy BLAS, blocked "
     "sums, reversed) but within 2 times it and within the rigorous bound 1e-05 (stacked layer 0, direction 0, h, "
     "probe 1)"),
    (dict(STEP, ratio=0.5, err=5e-6, m_ratio=5.0, m_err=5e-6), "fail",
     "one step from the source's state differs by 5e-06, more than 2 times its measured tolerance 1e-06 (4 times "
     "0.025 of the bound"),
    (dict(STEP, ratio=5.0, err=5e-5, bound=1e-5, m_ratio=50.0, m_err=5e-5), "fail",
     "one step from the source's state differs by 5e-05 where the float bound allows 1e-05"),
], ids=["within", "6b between", "1 beyond twice", "1 beyond the bound"])
def test_the_rules_on_the_measured_step_tolerance(step, verdict, words):
    out = decide(Findings([GOOD], step, "", 8, constructed=0, resolution=1e-3), TOL)
    assert out["verdict"] == verdict, out["reason"]
    assert words in out["reason"]
    if verdict != "ok" or out["reference"] == "step":
        assert out["reference"] == "step" and out["tolerance"] == step["m_tol"]
