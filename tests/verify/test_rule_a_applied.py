"""Rule A asked of the tolerance the one-step comparison applies (docs/cli.md "Verdicts", rules A and E).

Where the measured tolerance ``E = min(B, FAR r B + 2 u |s|)`` decides the steps, a slip is caught (the verdict can
then not be ``ok``) where its exact step ``s'`` parts from the correct one ``s`` by more than ``E`` plus the slipped
step's own ``E'`` (the same map of its own exact step and bound): its float evaluation, rounded as the correct file's
was measured to round, lies beyond ``E``, which is ``inconclusive`` within ``2 E`` and ``fail`` beyond. Not ``2 E``
plus ``E'``: ``ok`` needs only ``E``. The exact steps here come from numpy formulas written in this file (a simple
RNN's ``tanh`` step in float64), not from rnnconvert's reference; the bound from ``bounds.step_bound`` (what ``B``
is). The engine's wiring (``StreamedVerification._slips_applied``) is checked on the loose tf_keras fixture, its
escapes replaced by a bound that would let a slip pass.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.core.model import Cell, DirectionParams, RNNLayer
from rnnconvert.verify import bounds, escapes, orders

from conftest import FIXTURES

U = 2.0 ** -24
In, H = 24, 8


def _rnn(w_ih, w_hh, b_hh):
    p = DirectionParams(w_ih, w_hh, np.zeros(H, np.float32), b_hh)
    return RNNLayer(name="r", cell=Cell.RNN_TANH, input_size=In, hidden_size=H, num_layers=1, bidirectional=False,
                    params=[[p]]), p


def _exact(w_ih, w_hh, b_hh, x, h):
    """The simple RNN's exact step ``tanh(W_ih x + W_hh h + b_hh)`` in float64 (no rnnconvert code)."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    return np.tanh(f(x) @ f(w_ih).T + f(h) @ f(w_hh).T + f(b_hh))


def test_a_slip_is_caught_beyond_the_tolerance_applied_plus_its_own():
    """``b_hh`` dropped, at sizes of the bias between what the measured tolerance catches and what the bound
    catches: ``swap_escapes`` answers as the rule computed here from independent exact steps says, with the bound
    (``tolerance`` None, or the identity) and with the measured tolerance (several shares ``r``), and a slip the
    bound lets pass is caught by the measured tolerance at some size. ``W_hh`` is symmetric, so its other slip
    (``W_hh`` transposed) is the same function and always passes: the answer is never None, and says whether
    ``b_hh`` dropped passed."""
    rng = np.random.default_rng(39)
    w_ih = (rng.standard_normal((H, In)) * 0.3).astype(np.float32)
    a = rng.standard_normal((H, H)).astype(np.float32) * 0.2
    w_hh = (a + a.T).astype(np.float32)
    px, ph, _ = escapes.probe_rows(Cell.RNN_TANH, In, H, H)  # the last rows: verification's probes
    x = np.concatenate([rng.standard_normal((4, In)), px]).astype(np.float32)
    h = np.concatenate([0.5 * rng.standard_normal((4, H)), ph]).astype(np.float32)
    seen = set()
    for eps in np.geomspace(1e-8, 1e-4, 25):
        b_hh = (eps * np.sign(rng.standard_normal(H)) * (1 + rng.random(H))).astype(np.float32)
        layer, p = _rnn(w_ih, w_hh, b_hh)
        parts: dict = {}
        bounds.step_with_bound(layer, p, x, h, None, U, parts=parts)
        s, s2 = _exact(w_ih, w_hh, b_hh, x, h), _exact(w_ih, w_hh, np.zeros_like(b_hh), x, h)
        bd, _ = bounds.step_bound(layer, p, x, h, None, U)
        bd2, _ = bounds.step_bound(*_rnn(w_ih, w_hh, np.zeros_like(b_hh)), x, h, None, U)
        got = {}
        for r in (None, 1.0, 0.1, 0.01):
            t = (lambda v, b: b) if r is None else partial(orders.applied, r=r, u=U)  # identity: the bound
            caught = bool((np.abs(s2 - s) > t(s, bd) + t(s2, bd2)).any())
            ans = escapes.swap_escapes(layer, p, h, None, parts, U, tolerance=None if r is None else t)
            assert ans == ("W_hh transposed (each gate block)" if caught else "b_hh dropped"), (eps, r, ans)
            got[r] = caught
        assert escapes.swap_escapes(layer, p, h, None, parts, U) == \
            escapes.swap_escapes(layer, p, h, None, parts, U, tolerance=lambda v, b: b)
        assert not got[None] or all(got.values()), got  # caught by the bound: caught by any tolerance within it
        seen.add((got[None], got[0.01]))
    assert (False, True) in seen  # a slip the bound lets pass, the measured tolerance catches
    assert {(False, False), (True, True)} <= seen  # ... and sizes neither catches, and both catch


def test_directions_exchanged_against_the_tolerance_applied():
    """``directions_escape`` with a tolerance map: caught where the two exact steps differ by more than both
    tolerances (each the map of its own exact step and bound), at the rows both directions share."""
    s1, s2 = np.array([[0.5, 0.2]]), np.array([[0.5, 0.2 + 3e-6]])
    b = np.full((1, 2), 1e-5)  # bounds: 2e-5 together, the 3e-6 difference passes
    assert escapes.directions_escape(((s1, None), (b, None)), ((s2, None), (b, None)), slice(0, 1)) is not None
    t = partial(orders.applied, r=0.01, u=U)  # 4e-7 + 2u|s|, about 4.2e-7 each: 3e-6 is caught
    assert escapes.directions_escape(((s1, None), (b, None)), ((s2, None), (b, None)), slice(0, 1), t) is None


@pytest.fixture()
def bound_misses(monkeypatch):
    """``swap_escapes`` as if the bound let a slip pass (``tolerance`` None: what ``sample.slab_states`` asks),
    the real answer where the engine asks again of the measured tolerance; ``answer`` what that returns
    (``"real"``: the real one)."""
    real = escapes.swap_escapes
    state = {"answer": "real", "asked": 0}

    def fake(*args, tolerance=None, **kw):
        if tolerance is None:
            return "gates r and z swapped in W_ih"
        state["asked"] += 1
        return real(*args, tolerance=tolerance, **kw) if state["answer"] == "real" else state["answer"]
    monkeypatch.setattr(escapes, "swap_escapes", fake)
    return state


def test_the_engine_asks_the_measured_tolerance_where_the_bound_lets_a_slip_pass(bound_misses, tmp_path):
    """The loose tf_keras reset-before GRU (every slip caught by its bound, tests/verify/test_verify_loose_fixtures.py)
    with the bound made to let a slip pass: the engine asks that slip again of the measured tolerance, which
    catches every slip (``ok``, naming the measured tolerance), or, where even that lets one pass,
    ``inconclusive`` naming it. Into ``.npz`` (no framework: the numpy reference runs the arrays read back)."""
    src = FIXTURES / "loose" / "keras_bidi_gru_before.h5"
    rep = api.convert(src, tmp_path / "a.npz").verification
    c = next(c for c in rep.layers if c.name == "bg2")
    assert bound_misses["asked"] > 0 and c.step_applied_kind == "measured"
    assert c.verdict == "ok", c.reason
    assert "would be beyond the measured tolerance applied" in c.reason and "never ok" in c.reason
    bound_misses.update(answer="gates z and n swapped in W_hh", asked=0)
    rep = api.verify(src, tmp_path / "a.npz")
    c = next(c for c in rep.layers if c.name == "bg2")
    assert bound_misses["asked"] > 0 and c.verdict == "inconclusive"
    assert "could pass even the measured tolerance applied" in c.reason and "gates z and n swapped in W_hh" in c.reason
