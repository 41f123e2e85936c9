"""TFLite ``WHILE`` loops with ``hard_sigmoid`` gates (issue #42; rnnconvert/formats/tflite/tflite_while.py,
docs/tflite.md): tf_keras and Keras 3 GRUs (linear or tanh candidate, reset before and after, dropout) and LSTMs
as TF 2.21's converter writes them, the multiply-by-ones of issue #42's on-device files, ``MAXIMUM`` for
``RELU``, and the real Mycroft Precise wake-word GRU converted (fixtures/gen_tflite_while_hard.py).

Oracle: ``tf.lite.Interpreter`` ran each file (``tflite_while_hard/<name>.oracle.npz``: ``x``, ``y``; ``keras``:
the Keras model's own ``predict``). Here onnxruntime runs the converted ``.onnx`` and torch the converted ``.pt2``
on the same inputs. Tolerance 2e-5 relative plus 1e-6 absolute (as test_tflite_while.py; H = 4, T = 5: the two
sides differ by float32 rounding, measured <= 3.6e-7 absolute on outputs up to 3.3).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.errors import UnsupportedError, VerificationError

TH = FIXTURES / "tflite_while_hard"
RTOL, ATOL = 2e-5, 1e-6
pytest.importorskip("tflite")

#: fixture -> (cell, gate activation, candidate activation, reset_after)
CASES = {
    "hs_gru_rb_linear": ("GRU", "hard_sigmoid", "linear", False),
    "hs_gru_rb_tanh": ("GRU", "hard_sigmoid", "tanh", False),
    "hs_gru_ra_linear": ("GRU", "hard_sigmoid", "linear", True),
    "hs_gru_ra_tanh": ("GRU", "hard_sigmoid", "tanh", True),
    "hs_gru_dropout": ("GRU", "hard_sigmoid", "linear", False),
    "hs_gru_ones": ("GRU", "hard_sigmoid", "linear", False),
    "hs_gru_max": ("GRU", "hard_sigmoid", "linear", False),
    "hs_lstm": ("LSTM", "hard_sigmoid", "tanh", True),
    "hs_lstm_dropout": ("LSTM", "hard_sigmoid", "tanh", True),
    "k3_hs_gru": ("GRU", "hard_sigmoid_k3", "tanh", True),
    "k3_hs_gru_rb_linear": ("GRU", "hard_sigmoid_k3", "linear", False),
}


def _oracle(name: str):
    return np.load(TH / f"{name}.oracle.npz")


def _last_if(y: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The last step when the Keras layer returned only that (return_sequences=False)."""
    return y[:, -1] if want.ndim == 2 and y.ndim == 3 else y


def _run_onnx(path, x):
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    ck = api.load(path)
    return ort_rt.forward(path, ck, ck.layers[0].name, x)


def _run_pt2(path, x):
    torch = pytest.importorskip("torch")
    y = torch.export.load(str(path)).module()(torch.from_numpy(x))
    return (y[0] if isinstance(y, (tuple, list)) else y).detach().numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_cell_recognised_and_named(name):
    """Each body is read as its Keras cell; which hard_sigmoid (Keras 2 or 3, told apart by the constants) is
    recorded in the semantics and named in the layer's source."""
    cell, gate, act, ra = CASES[name]
    la = api.load(TH / f"{name}.tflite").layers
    assert len(la) == 1
    la = la[0]
    s = la.semantics
    assert (la.cell.name, s.gate_activation, s.activation) == (cell, gate, act)
    if cell == "GRU":
        assert s.reset_after is ra
    assert ("Keras 3 hard_sigmoid" if gate.endswith("k3") else "Keras 2 hard_sigmoid") in la.source["class_name"]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("ext", ["onnx", "pt2"])
def test_onnx_and_pt2_reproduce_the_interpreter(tmp_path, name, ext):
    """.onnx (onnxruntime) and .pt2 (torch.export) reproduce tf.lite.Interpreter on the file; the default
    verification says ok."""
    orc = _oracle(name)
    out = tmp_path / f"out.{ext}"
    rep = api.convert(TH / f"{name}.tflite", out)
    assert rep.verification.verdict == "ok"
    y = (_run_onnx if ext == "onnx" else _run_pt2)(out, orc["x"])
    np.testing.assert_allclose(_last_if(y, orc["y"]), orc["y"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["hs_gru_rb_linear", "hs_lstm", "k3_hs_gru"])
def test_pt_refused_naming_hard_sigmoid_and_the_way_out(tmp_path, name):
    """torch's nn.GRU/nn.LSTM have sigmoid gates only: .pt is refused, naming hard_sigmoid and the formats that
    compute it (.onnx, .pt2); nothing is written."""
    with pytest.raises(UnsupportedError, match="hard_sigmoid") as exc:
        api.convert(TH / f"{name}.tflite", tmp_path / "out.pt")
    assert ".onnx" in str(exc.value) and ".pt2" in str(exc.value)
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("name, wrong", [("hs_gru_rb_linear", {"gate_activation": "sigmoid"}),
                                         ("hs_lstm", {"gate_activation": "sigmoid"}),
                                         ("hs_gru_rb_tanh", {"gate_activation": "hard_sigmoid_k3"}),
                                         ("k3_hs_gru", {"gate_activation": "hard_sigmoid"}),
                                         ("hs_gru_rb_linear", {"activation": "tanh"}),
                                         ("hs_gru_rb_linear", {"reset_after": True})])
def test_traps_miss_the_interpreter(name, wrong):
    """Why each fact must be read, not assumed: the layer as read follows the interpreter; with sigmoid gates, the
    other Keras version's hard_sigmoid, a tanh candidate or reset after, it misses by more than 1e-3."""
    orc = _oracle(name)
    la = api.load(TH / f"{name}.tflite").layers[0]
    np.testing.assert_allclose(_last_if(reference.forward(la, orc["x"]), orc["y"]), orc["y"], rtol=RTOL, atol=ATOL)
    bad = la.with_semantics(**wrong)
    assert np.max(np.abs(_last_if(reference.forward(bad, orc["x"]), orc["y"]) - orc["y"])) > 1e-3


def test_multiply_by_ones_is_the_identity():
    """The interpreter computes the same outputs with and without the multiplies by ones (TensorFlow's fact, not
    ours); rnnconvert reads them as the identity and says so in a note."""
    assert np.array_equal(_oracle("hs_gru_ones")["y"], _oracle("hs_gru_rb_linear")["y"])
    ck = api.load(TH / "hs_gru_ones.tflite")
    assert any("2 MUL op(s) by a constant of ones" in n for n in ck.meta["notes"])
    assert "notes" not in api.load(TH / "hs_gru_rb_linear.tflite").meta


def test_a_clip_that_is_not_keras_hard_sigmoid_is_refused(tmp_path):
    """clip(0.25 x + 0.5, 0, 1) is neither Keras hard_sigmoid: refused, naming the op, the body and the
    constants found; nothing written. The interpreter's outputs differ from the Keras model's (so guessing
    Keras' definition would be wrong)."""
    orc = _oracle("hs_gru_bad_const")
    assert np.max(np.abs(orc["y"] - orc["keras"])) > 1e-2
    with pytest.raises(UnsupportedError, match=r"op \d+ \(RELU\) does not fit a Keras cell \(the update gate is "
                                               r"clip\(0\.25 x \+ 0\.5, 0, 1\)") as exc:
        api.convert(TH / "hs_gru_bad_const.tflite", tmp_path / "out.onnx")
    assert "while_body' (the body of WHILE op" in str(exc.value)
    assert not (tmp_path / "out.onnx").exists()


def _mutating_writer(monkeypatch, fmt: str, mutate):
    spec = registry.get(fmt).load()
    real = spec.write

    def write(ckpt, *args, **kw):
        return real(replace(ckpt, layers=[mutate(la) for la in ckpt.layers]), *args, **kw)

    monkeypatch.setattr(spec, "write", write)


@pytest.mark.parametrize("name, wrong", [("hs_gru_rb_linear", "sigmoid"), ("k3_hs_gru", "hard_sigmoid")])
def test_verification_catches_a_wrong_gate_activation(tmp_path, monkeypatch, name, wrong):
    """Mutation: an .onnx written with the wrong gate activation fails the default verification (no file)."""
    pytest.importorskip("onnxruntime")
    _mutating_writer(monkeypatch, "onnx", lambda la: la.with_semantics(gate_activation=wrong))
    with pytest.raises(VerificationError):
        api.convert(TH / f"{name}.tflite", tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_real_wake_word_gru(tmp_path):
    """Mycroft Precise's hey-mycroft GRU(20) (real trained weights, Apache-2.0; linear candidate, Keras 2
    hard_sigmoid gates, reset before), converted by TF's converter: read, and its .onnx and .pt2 follow the
    interpreter. Tolerance: the linear candidate lets the state grow (|y| up to 66 on the spoken 'hey mycroft'
    features), so float32 summation order matters; the three frameworks' own outputs (interpreter, tf_keras,
    TensorFlow running Keras 2.1.4's frozen graph) differ by up to 5.2e-4 of each sample's largest |y|; rnnconvert's
    conversions must stay within 1e-3 of it (measured 4.1e-4 .onnx, 3.2e-4 .pt2)."""
    orc = _oracle("mycroft_gru")
    la = api.load(TH / "mycroft_gru.tflite").layers[0]
    s = la.semantics
    assert (la.cell.name, la.hidden_size, la.input_size, s.gate_activation, s.activation, s.reset_after) == \
        ("GRU", 20, 13, "hard_sigmoid", "linear", False)
    scale = np.max(np.abs(orc["y"]), axis=1, keepdims=True)
    frameworks = [orc["keras"], orc["frozen"]]
    assert max(np.max(np.abs(f - orc["y"]) / scale) for f in frameworks) < 1e-3
    for ext in ("onnx", "pt2"):
        rep = api.convert(TH / "mycroft_gru.tflite", tmp_path / f"out.{ext}")
        assert rep.verification.verdict == "ok"
        y = _last_if((_run_onnx if ext == "onnx" else _run_pt2)(tmp_path / f"out.{ext}", orc["x"]), orc["y"])
        assert np.max(np.abs(y - orc["y"]) / scale) < 1e-3, ext


def test_bidirectional_hard_sigmoid_is_one_layer(tmp_path):
    """tf_keras Bidirectional(GRU(hard_sigmoid, linear, reset before)): one bidirectional layer; its .onnx follows
    the interpreter."""
    orc = _oracle("hs_bigru")
    (la,) = api.load(TH / "hs_bigru.tflite").layers
    assert la.bidirectional and la.semantics.gate_activation == "hard_sigmoid"
    assert api.convert(TH / "hs_bigru.tflite", tmp_path / "out.onnx").verification.verdict == "ok"
    np.testing.assert_allclose(_run_onnx(tmp_path / "out.onnx", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)


def test_directions_with_different_gates_stay_two_layers():
    """Keras' Bidirectional with a backward_layer of sigmoid gates under a hard_sigmoid forward layer: the two
    loops are two layers, each with its own gates (read as one, the backward direction would take the forward's
    hard_sigmoid: it misses the interpreter by > 0.1); each follows its half of the interpreter's output (the
    backward one reversed in time, as Bidirectional does)."""
    orc = _oracle("hs_bigru_mixed")
    layers = {la.semantics.go_backwards: la for la in api.load(TH / "hs_bigru_mixed.tflite").layers}
    assert len(layers) == 2 and not any(la.bidirectional for la in layers.values())
    fwd, bwd = layers[False], layers[True]
    assert (fwd.semantics.gate_activation, bwd.semantics.gate_activation) == ("hard_sigmoid", "sigmoid")
    H = fwd.hidden_size
    np.testing.assert_allclose(reference.forward(fwd, orc["x"]), orc["y"][..., :H], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(reference.forward(bwd, orc["x"])[:, ::-1], orc["y"][..., H:], rtol=RTOL, atol=ATOL)
    wrong = bwd.with_semantics(gate_activation="hard_sigmoid")
    assert np.max(np.abs(reference.forward(wrong, orc["x"])[:, ::-1] - orc["y"][..., H:])) > 0.1
