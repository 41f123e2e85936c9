"""Issue #28: correct conversions of the models people bring verify ``ok`` by default, where the one-step
bound alone is too loose to decide (docs/cli.md "Verdicts", rules A and B).

The fixtures (fixtures/gen_loose.py, made by tf_keras and TensorFlow) are the kinds the issue's real models
were: a Keras 2 full model with stacked ``Bidirectional(GRU(reset_after=False, hard_sigmoid))`` and a TF1
frozen graph of 3 stacked ``GRUCell`` s, at weights where the bound exceeds 1% of the output's scale (before
issue #28: ``inconclusive``, "a reset-before GRU's swapped step needs a new product"); a Keras SimpleRNN
stack (relu, linear, tanh) and a TF1 projected peephole LSTM; and the Mycroft GRU of fixtures/realworld.
Each converts to every target that expresses it with verdict ``ok`` (the targets' own frameworks run the
written files: onnxruntime, tf_keras, Keras 3, TensorFlow; the oracle of the numbers is those frameworks
against the source's own equations). The slips these verdicts rule out FAIL in tests/test_verify_mutations.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.verify import bounds, escapes

from conftest import FIXTURES, REALWORLD

LOOSE = FIXTURES / "loose"
MYCROFT = REALWORLD / "mycroft-precise-gru"
#: source -> the targets that express it (the others refuse it by name: hard_sigmoid, reset_after=False,
#: projection or peepholes in torch; hard_sigmoid in a TF1 checkpoint)
CASES = {
    LOOSE / "keras_bidi_gru_before.h5": ["onnx", "h5", "keras", "tf2_checkpoint", "npz"],
    LOOSE / "tf1_gru_stack.pb": ["onnx", "h5", "keras", "tf2_checkpoint", "tf_checkpoint", "npz"],
    LOOSE / "keras_simple_rnn_stack.h5": ["onnx", "h5", "keras", "tf2_checkpoint", "npz"],
    LOOSE / "tf1_lstm_proj_peep.pb": ["tf_checkpoint", "npz"],
    MYCROFT / "hey-mycroft.net": ["onnx", "h5", "keras", "tf2_checkpoint", "npz"],
    MYCROFT / "hey-mycroft.pb": ["onnx", "h5", "keras", "tf2_checkpoint", "npz"],
}
DIRS = {"tf_checkpoint": "ckpt", "tf2_checkpoint": "ckpt"}


def _convert(src, to, tmp_path):
    dst = tmp_path / (DIRS.get(to) or f"out.{to}")
    return api.convert(src, dst, **({"to": to} if to in DIRS else {})).verification


@pytest.mark.slow
@pytest.mark.parametrize("src,to", [(s, t) for s, ts in CASES.items() for t in ts],
                         ids=[f"{s.stem}-{t}" for s, ts in CASES.items() for t in ts])
def test_correct_conversion_is_ok_by_default(src, to, tmp_path):
    pytest.importorskip("onnxruntime" if to == "onnx" else "tensorflow")
    rep = _convert(src, to, tmp_path)
    assert rep.ok, [(c.name, c.verdict, c.reason) for c in rep.layers]


@pytest.mark.parametrize("src,layer", [(LOOSE / "keras_bidi_gru_before.h5", "bg2"), (LOOSE / "tf1_gru_stack.pb", "stack")])
def test_reset_before_gru_fixture_is_loose_and_decided_by_its_slips(src, layer, tmp_path):
    """The case under test: the one-step bound of the reset-before GRU exceeds 1% of the output's scale (the
    issue's models: 0.0121-0.0161), and the verdict is ``ok`` because every slip would fail (rule A)."""
    pytest.importorskip("onnxruntime")
    rep = _convert(src, "onnx", tmp_path)
    c = next(c for c in rep.layers if c.name == layer)
    assert c.verdict == "ok" and c.step_tol > 0.01 * c.max_abs_ref
    assert "every gate-block swap and other layout slip checked would fail it" in c.reason


def test_swap_escapes_names_a_slip_no_check_can_see_on_a_reset_before_gru():
    """Rule A can answer no for a reset-before GRU: with the z and r blocks equal in every tensor, their swap
    is the same function, and ``swap_escapes`` names it (the verdict would be ``inconclusive``)."""
    from rnnconvert.core.model import Cell, DirectionParams, RNNLayer, Semantics

    rng = np.random.default_rng(3)
    H, In = 8, 6
    w_ih, w_hh = rng.standard_normal((3 * H, In)).astype(np.float32), rng.standard_normal((3 * H, H)).astype(np.float32)
    b = rng.standard_normal(3 * H).astype(np.float32)
    for a in (w_ih, w_hh, b):
        a[H:2 * H] = a[:H]  # canonical r z n: r and z equal
    p = DirectionParams(w_ih, w_hh, b, np.zeros(3 * H, np.float32))
    layer = RNNLayer(name="g", cell=Cell.GRU, input_size=In, hidden_size=H, num_layers=1, bidirectional=False,
                     params=[[p]], semantics=Semantics(reset_after=False, gate_activation="hard_sigmoid"))
    px, ph, _ = escapes.probe_rows(Cell.GRU, In, H, H)
    x = np.concatenate([rng.standard_normal((4, In)), px]).astype(np.float32)
    h0 = np.concatenate([0.5 * rng.standard_normal((4, H)), ph]).astype(np.float32)
    parts: dict = {}
    bounds.step_with_bound(layer, p, x, h0, None, 2.0 ** -24, parts=parts)
    assert escapes.swap_escapes(layer, p, h0, None, parts, 2.0 ** -24) == "gates r and z swapped in W_ih"
    w_hh[H:2 * H] += 1.0  # now r and z differ in W_hh: its swap shows, the W_ih one still cannot
    parts = {}
    bounds.step_with_bound(layer, p, x, h0, None, 2.0 ** -24, parts=parts)
    assert escapes.swap_escapes(layer, p, h0, None, parts, 2.0 ** -24) == "gates r and z swapped in W_ih"


def test_chaotic_stack_is_inconclusive_not_failed(tmp_path):
    """A correct conversion of a layer so ill-conditioned that its float32 run parts from the float64 run by more
    than the source's own float32 run does (TF1 3 x GRUCell(80), weights x 3.5, made by TensorFlow:
    fixtures/gen_loose.py) is no evidence of a broken file: it said FAIL (0.405 against a one-sample tolerance of
    0.224). Its sequence tolerance is now measured over several float32 evaluation orders (issue #39: 0.68, above
    ``rho``: ill-conditioned), and the verdict is ``ok`` only because every slip that only a sequence shows would
    move it by more than twice that (rule 10; else ``inconclusive``, naming the ill-conditioning): never ``fail``.
    The same file with two gate blocks exchanged in stacked layer 1 still FAILS, by the one-step comparison,
    which the layer's conditioning does not touch."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import numpy_helper

    src = LOOSE / "tf1_gru_chaotic" / "ckpt"
    rep = api.convert(src, tmp_path / "c.onnx", accept_inconclusive=True)
    c = rep.verification.layers[0]
    assert c.verdict != "fail" and c.step_ratio <= 1.0, c.reason
    assert "ill-conditioned" in c.reason or "every sequence-level slip" in c.reason, c.reason
    assert c.seq_tol > 0.01 * c.max_abs_ref  # the measured tolerance is above rho: the rule 10 branch
    m = onnx.load(tmp_path / "c.onnx")
    swapped = 0
    for init in m.graph.initializer:
        if init.name.endswith("l1.R"):
            a = numpy_helper.to_array(init).copy()
            H = a.shape[-1]
            a[:, :H], a[:, H:2 * H] = a[:, H:2 * H].copy(), a[:, :H].copy()
            init.CopyFrom(numpy_helper.from_array(a, init.name))
            swapped += 1
    assert swapped == 1
    bad = tmp_path / "bad.onnx"
    onnx.save(m, bad)
    rep = api.verify(src, bad)
    assert rep.failed, [(x.verdict, x.reason) for x in rep.layers]
