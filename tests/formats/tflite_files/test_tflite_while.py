"""TFLite ``WHILE``-loop recurrences (issue 31; rnnconvert/formats/tflite/tflite_while.py, docs/tflite.md): Keras
GRU (reset after and before), SimpleRNN (tanh, relu), Keras 3 LSTM and GRU, go_backwards and Bidirectional, as
TF 2.21's converter writes them (fixtures/gen_tflite_while.py).

Oracle: ``tf.lite.Interpreter`` ran each file on fixed inputs (``tflite_while/<name>.oracle.npz``: ``x``, ``y``;
``keras``: what the Keras model computed before conversion). Here torch (``nn.GRU``/``nn.RNN``/``nn.LSTM`` built
from the converted .pt by ``load_state_dict``) or onnxruntime (the converted .onnx) runs the conversion on the same
inputs. Tolerance: 2e-5 relative plus 1e-6 absolute (issue 31's criterion): H = 4, T = 5, weights below 0.4, so
the sides differ by float32 rounding (measured: <= 1.04e-7 absolute with rnnconvert's float64 reference).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES
from rnnconvert import api
from rnnconvert.core import gates, reference
from rnnconvert.engine import registry
from rnnconvert.errors import UnsupportedError, VerificationError

TW = FIXTURES / "tflite_while"
RTOL, ATOL = 2e-5, 1e-6
pytest.importorskip("tflite")
torch = pytest.importorskip("torch")

#: fixture -> (layer name, cell, reset_after, go_backwards, bidirectional, whether .pt can hold it)
CASES = {
    "gru_ra": ("gru_0", "GRU", True, False, False, True),
    "gru_rb": ("gru_0", "GRU", False, False, False, False),
    "gru_f16": ("gru_0", "GRU", True, False, False, True),
    "rnn_tanh": ("simple_rnn_0", "RNN_TANH", True, False, False, True),
    "rnn_relu": ("simple_rnn_0", "RNN_RELU", True, False, False, True),
    "rnn_linear": ("simple_rnn_0", "RNN_TANH", True, False, False, False),
    "gru_back_last": ("gru_0", "GRU", True, True, False, False),
    "bigru": ("gru_0", "GRU", True, False, True, True),
    "bigru_last": ("gru_0", "GRU", True, False, True, True),
    "k3_bilstm": ("lstm_0", "LSTM", True, False, True, True),
    "k3_lstm": ("lstm_0", "LSTM", True, False, False, True),
    "k3_lstm_bmm": ("lstm_0", "LSTM", True, False, False, True),
    "k3_gru": ("gru_0", "GRU", True, False, False, True),
}


def _oracle(name: str):
    return np.load(TW / f"{name}.oracle.npz")


def _last_if(y: np.ndarray, want: np.ndarray, bidirectional: bool = False) -> np.ndarray:
    """The last processed step when the Keras layer returned only that (return_sequences=False): for a
    bidirectional layer the forward direction's at the last time step and the backward one's at the first."""
    if want.ndim == 2 and y.ndim == 3:
        if bidirectional:
            H = y.shape[2] // 2
            return np.concatenate([y[:, -1, :H], y[:, 0, H:]], axis=1)
        return y[:, -1]
    return y


@pytest.mark.parametrize("name", sorted(CASES))
def test_cell_recognised(name):
    lname, cell, ra, back, bi, _ = CASES[name]
    la = api.load(TW / f"{name}.tflite").layers
    assert len(la) == 1
    la = la[0]
    assert (la.name, la.cell.name, la.bidirectional, la.semantics.go_backwards) == (lname, cell, bi, back)
    if cell == "GRU":
        assert la.semantics.reset_after is ra


@pytest.mark.parametrize("name", sorted(CASES))
def test_to_pt_and_onnx_reproduce_the_interpreter(tmp_path, name):
    """.pt (torch runs it) and .onnx (onnxruntime runs it) reproduce tf.lite.Interpreter on the file; the
    verification run by default says ok. Layers torch cannot hold (reset before, go_backwards, a linear SimpleRNN)
    are refused for .pt, naming the feature."""
    orc = _oracle(name)
    lname, cell, _, _, bi, pt_ok = CASES[name]
    if pt_ok:
        rep = api.convert(TW / f"{name}.tflite", tmp_path / "out.pt")
        assert rep.verification.verdict == "ok"
        # a .pt state dict does not store nn.RNN's nonlinearity: the reader is told it, as torch's user would
        opts = {"nonlinearity": "relu"} if cell == "RNN_RELU" else {}
        mod = api.torch_modules(tmp_path / "out.pt", **opts)[lname]
        with torch.no_grad():
            y = mod(torch.from_numpy(orc["x"]))[0].numpy()
        np.testing.assert_allclose(_last_if(y, orc["y"], bi), orc["y"], rtol=RTOL, atol=ATOL)
    else:
        with pytest.raises(UnsupportedError, match="reset_after=False|go_backwards=True|linear"):
            api.convert(TW / f"{name}.tflite", tmp_path / "out.pt")
        assert not (tmp_path / "out.pt").exists()
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    rep = api.convert(TW / f"{name}.tflite", tmp_path / "out.onnx")
    assert rep.verification.verdict == "ok"
    y = ort_rt.forward(tmp_path / "out.onnx", api.load(tmp_path / "out.onnx"), lname, orc["x"])
    np.testing.assert_allclose(_last_if(y, orc["y"], bi), orc["y"], rtol=RTOL, atol=ATOL)


def test_float16_weights_behind_dequantize():
    """The converter's float16 quantisation puts DEQUANTIZE ops in the body: read as float32 (exact widening), the
    layer follows the interpreter, not the float32 Keras model it came from (they differ by the float16 rounding)."""
    orc = _oracle("gru_f16")
    la = api.load(TW / "gru_f16.tflite").layers[0]
    assert la.params[0][0].w_ih.dtype == np.float32
    assert np.all(la.params[0][0].w_ih.astype(np.float16).astype(np.float32) == la.params[0][0].w_ih)
    y = reference.forward(la, orc["x"])
    np.testing.assert_allclose(y, orc["y"], rtol=RTOL, atol=ATOL)
    assert np.max(np.abs(orc["keras"] - orc["y"])) > 2e-5


def test_stacked_loops_to_pt_and_onnx(tmp_path):
    """GRU(4) then SimpleRNN(5): the converter folds the TRANSPOSE pair between the loops, so the second loop reads
    the first's time-major outputs; two layers, run one after the other in torch and onnxruntime."""
    orc = _oracle("gru_stack")
    assert [(la.name, la.cell.name) for la in api.load(TW / "gru_stack.tflite").layers] == \
        [("gru_0", "GRU"), ("simple_rnn_1", "RNN_TANH")]
    rep = api.convert(TW / "gru_stack.tflite", tmp_path / "out.pt")
    assert rep.verification.verdict == "ok"
    mods = api.torch_modules(tmp_path / "out.pt")
    h = torch.from_numpy(orc["x"])
    with torch.no_grad():
        for name in ("gru_0", "simple_rnn_1"):
            h = mods[name](h)[0]
    np.testing.assert_allclose(h.numpy(), orc["y"], rtol=RTOL, atol=ATOL)
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    rep = api.convert(TW / "gru_stack.tflite", tmp_path / "out.onnx")
    assert rep.verification.verdict == "ok"
    ck, y = api.load(tmp_path / "out.onnx"), orc["x"]
    for name in ("gru_0", "simple_rnn_1"):
        y = ort_rt.forward(tmp_path / "out.onnx", ck, name, y).astype(np.float32)
    np.testing.assert_allclose(y, orc["y"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name, swap", [("gru_ra", "rz"), ("k3_gru", "rz"), ("k3_lstm", "if"), ("bigru", "zn")])
def test_gate_order_trap(name, swap):
    """The trap: the body's SPLIT holds Keras' order (z r h, i f c o), not the canonical one; a port that took the
    split order (any two gate blocks exchanged) misses the interpreter by far more than the tolerance."""
    orc = _oracle(name)
    la = api.load(TW / f"{name}.tflite").layers[0]
    np.testing.assert_allclose(reference.forward(la, orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)
    H = la.hidden_size
    a, b = (gates.gate_slice(la.cell, g, H) for g in swap)

    def sw(m):
        m = m.copy()
        m[a], m[b] = m[b].copy(), m[a].copy()
        return m

    bad = replace(la, params=[[replace(p, w_ih=sw(p.w_ih), w_hh=sw(p.w_hh), b_ih=sw(p.b_ih), b_hh=sw(p.b_hh))
                               for p in row] for row in la.params])
    assert np.max(np.abs(reference.forward(bad, orc["x"]) - orc["y"])) > 1e-2


@pytest.mark.parametrize("name", ["gru_ra", "gru_rb"])
def test_reset_before_after_trap(name):
    """Reading the reset-before body as reset-after (or the reverse) misses the interpreter."""
    orc = _oracle(name)
    la = api.load(TW / f"{name}.tflite").layers[0]
    flipped = la.with_semantics(reset_after=not la.semantics.reset_after)
    assert np.max(np.abs(reference.forward(flipped, orc["x"]) - orc["y"])) > 1e-3


def _mutating_writer(monkeypatch, fmt: str, mutate):
    """The ``fmt`` writer made to write ``mutate(layer)`` for every layer: a writer with that slip."""
    spec = registry.get(fmt).load()
    real = spec.write

    def write(ckpt, *args, **kw):
        return real(replace(ckpt, layers=[mutate(la) for la in ckpt.layers]), *args, **kw)

    monkeypatch.setattr(spec, "write", write)


def _swap_first_two(la):
    H = la.hidden_size
    g = gates.CANONICAL[la.cell]
    a, b = gates.gate_slice(la.cell, g[0], H), gates.gate_slice(la.cell, g[1], H)

    def sw(m):
        m = m.copy()
        m[a], m[b] = m[b].copy(), m[a].copy()
        return m

    return replace(la, params=[[replace(p, w_ih=sw(p.w_ih)) for p in row] for row in la.params])


@pytest.mark.parametrize("name, fmt", [("gru_ra", "pt"), ("k3_lstm", "pt"), ("bigru", "onnx"), ("gru_rb", "onnx")])
def test_verification_catches_swapped_gate_blocks(tmp_path, monkeypatch, name, fmt):
    """Mutation: a written file whose first two gate blocks are exchanged fails the default verification (no
    output file is left)."""
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    _mutating_writer(monkeypatch, fmt, _swap_first_two)
    with pytest.raises(VerificationError):
        api.convert(TW / f"{name}.tflite", tmp_path / f"out.{fmt}")
    assert not (tmp_path / f"out.{fmt}").exists()


@pytest.mark.parametrize("name", ["gru_ra", "gru_rb", "k3_gru"])
def test_verification_catches_reset_confusion(tmp_path, monkeypatch, name):
    """Mutation: an .onnx written with linear_before_reset flipped (reset before <-> after) fails the
    verification."""
    pytest.importorskip("onnxruntime")
    _mutating_writer(monkeypatch, "onnx",
                     lambda la: la.with_semantics(reset_after=not la.semantics.reset_after))
    with pytest.raises(VerificationError):
        api.convert(TW / f"{name}.tflite", tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


REFUSED = {
    "gru_mask": r"op 4 \(GATHER\) reads a second sequence",
    "gru_tanh_gate": r"op 7 \(TANH\) does not fit a Keras cell \(the update gate is not sig",
    "gru_extra_mul": r"op 15 \(MUL\) multiplies by a constant",
    "gru_dead_op": r"op 26 \(TANH\) is not part of the cell",
    "rnn_relu6": r"op 5 \(ADD\) has the fused activation RELU6",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unrecognised_bodies_refused_naming_op_and_subgraph(tmp_path, name):
    """Bodies that are not exactly a Keras cell: a Keras mask (a second sequence, SELECT_V2), and gru_ra/rnn_relu
    edited with TF's schema API (a TANH update gate, an extra MUL, an
    unused op, a fused RELU6): refused, naming the op and the body subgraph; nothing written."""
    with pytest.raises(UnsupportedError, match=REFUSED[name]) as exc:
        api.convert(TW / f"{name}.tflite", tmp_path / "out.pt")
    assert "while_body' (the body of WHILE op" in str(exc.value)
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("name", ["gru_tanh_gate", "gru_extra_mul"])
def test_edited_bodies_compute_another_function(name):
    """Why guessing is wrong: the interpreter's outputs of the edited files are not the Keras GRU's."""
    orc = _oracle(name)
    assert np.max(np.abs(orc["y"] - orc["keras"])) > 0.1


def test_weights_in_resource_variables_refused():
    """A Keras 3 model converted through from_concrete_functions keeps its weights in resource variables: the body
    reads them with READ_VARIABLE, which is refused by name."""
    with pytest.raises(UnsupportedError, match=r"op 3 \(READ_VARIABLE\) is not an op of a Keras recurrent cell"):
        api.load(TW / "k3_lstm_vars.tflite")
