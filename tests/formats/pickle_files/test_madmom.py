"""madmom networks (pickled ``madmom.ml.nn`` objects: per-gate ``Gate`` objects, LSTM with peepholes, GRU with
madmom's inverted update gate and reset after the product, simple RNNs, bidirectional wrappers, learned initial
states), read by :mod:`rnnconvert.conventions.madmom_layers`.

Oracle: madmom's own numpy forward (``fixtures/gen_madmom.py`` ran the pickled networks with madmom 0.16.1 and
stored every layer's output); the converted files are run by PyTorch (``nn.LSTM``/``nn.GRU``/``nn.RNN`` with the
carried learned initial state as ``h0``/``c0``) and onnxruntime, never by rnnconvert. Sequences are 7 steps of
float32 on both sides: the differences are float32 evaluation-order roundings (~1e-7); the tolerance 1e-5 is
100x that and 100x below the smallest effect of a wrong convention checked here (dropping the initial state).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rnnconvert
from rnnconvert.errors import FormatError

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "madmom"
TOL = 1e-5
CELLS = {"LSTM": "LSTM", "GRU": "GRU", "RNN_TANH": "RNN", "RNN_RELU": "RNN"}


def _oracle(name: str) -> dict[str, np.ndarray]:
    with np.load(FIX / f"{name}.oracle.npz") as z:
        return {k: z[k] for k in z.files}


def _torch_layer(torch, layer, state: dict, prefix: str):
    cls = getattr(torch.nn, CELLS[layer.cell.value])
    kw = {"nonlinearity": "relu"} if layer.cell.value == "RNN_RELU" else {}
    m = cls(layer.input_size, layer.hidden_size, batch_first=True, bidirectional=layer.bidirectional, **kw)
    m.load_state_dict({k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")})
    return m


@pytest.mark.parametrize("name", ["lstm_init", "gru_init", "rnn"])
def test_pt_matches_madmom_with_learned_initial_states(name, tmp_path):
    """Every layer of the written .pt, run by torch on madmom's own input to that layer (with the carried
    learned initial state), gives madmom's output; the dense head (carried transposed) gives madmom's ``y``."""
    torch = pytest.importorskip("torch")
    src, dst = FIX / f"{name}.pkl", tmp_path / f"{name}.pt"
    report = rnnconvert.convert(src, dst)
    assert report.verification is None or report.verification.ok
    ckpt = rnnconvert.load(src)
    state = torch.load(dst, weights_only=True)
    oracle = _oracle(name)
    h = oracle["x"]
    with torch.no_grad():
        for i, layer in enumerate(ckpt.layers):
            assert layer.name == f"layers_{i}"
            m = _torch_layer(torch, layer, state, layer.name)
            init = {k: torch.from_numpy(ckpt.tensors[f"{layer.name}_state.{k}"]).unsqueeze(1)
                    for k in ("h0", "c0") if f"{layer.name}_state.{k}" in ckpt.tensors}
            assert init.keys() == {k for k in ("h0", "c0") if f"{layer.name}_state.{k}" in state}  # carried into the .pt
            x = torch.from_numpy(h)[None]
            zeros = torch.zeros(2 if layer.bidirectional else 1, 1, layer.hidden_size)
            if layer.cell.value == "LSTM":
                y, _ = m(x, (init.get("h0", zeros), init.get("c0", zeros)))
            else:
                y, _ = m(x, init.get("h0", zeros))
            want = oracle[layer.name]
            assert np.abs(y[0].numpy() - want).max() <= TOL
            if init and layer.cell.value != "RNN_RELU":  # the state matters (relu may clip it away at step 0)
                y0 = m(x)[0]
                assert np.abs(y0[0].numpy() - want).max() > 100 * TOL
            h = want
        last = f"layers_{len(ckpt.layers)}"
        z = torch.nn.functional.linear(torch.from_numpy(h), state[f"{last}.weight"], state[f"{last}.bias"]).numpy()
    y = oracle["y"].reshape(z.shape[0], -1)
    head = {"lstm_init": z, "rnn": z, "gru_init": 1 / (1 + np.exp(-z))}[name]
    assert np.abs(head - y).max() <= TOL


def test_onnx_peephole_lstm_matches_madmom(tmp_path):
    """madmom's peephole LSTMs (i, f see the old c, o the new c) as ONNX LSTM nodes with P, run by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    src, dst = FIX / "blstm_peep.pkl", tmp_path / "o.onnx"
    rnnconvert.convert(src, dst)
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    oracle = _oracle("blstm_peep")
    feeds = {"layers_0__in": oracle["x"][None], "layers_1__in": oracle["layers_0"][None]}
    for i, y in enumerate(sess.run(["layers_0__out", "layers_1__out"], feeds)):
        want = oracle[f"layers_{i}"]
        assert np.abs(y.reshape(want.shape) - want).max() <= TOL


def test_pt_refuses_peepholes_naming_the_way_out(tmp_path):
    with pytest.raises(rnnconvert.UnsupportedError, match="peephole.*onnx"):
        rnnconvert.convert(FIX / "blstm_peep.pkl", tmp_path / "o.pt")
    assert list(tmp_path.iterdir()) == []


def test_readers_notes_name_carried_initial_states():
    ckpt = rnnconvert.load(FIX / "gru_init.pkl")
    notes = " ".join(ckpt.meta["notes"])
    assert "layers_0_state.h0" in notes and "layers_1_state" not in notes  # zero init: nothing to carry
    assert ckpt.tensors["layers_0_state.h0"].shape == (2, 3)
    assert [layer.source["class_name"] for layer in ckpt.layers] == ["BidirectionalLayer(GRULayer)", "GRULayer"]


def _retagged(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """The fixture's pickle with a global's module renamed (same length keeps protocol-2 framing valid)."""
    data = src.read_bytes()
    assert old in data and len(old) == len(new)
    dst.write_bytes(data.replace(old, new))
    return dst


def test_foreign_class_with_madmom_structure_is_named(tmp_path):
    p = _retagged(FIX / "rnn.pkl", tmp_path / "f.pkl", b"madmom.ml.nn.layers", b"acme_x.ml.nn.layers")
    ckpt = rnnconvert.load(p)
    assert "acme_x.ml.nn.layers.RecurrentLayer" in " ".join(ckpt.meta["notes"])


def test_unknown_activation_is_refused_by_name(tmp_path):
    p = _retagged(FIX / "rnn.pkl", tmp_path / "a.pkl", b"\nrelu\n", b"\nelu_\n")
    with pytest.raises(FormatError, match="layers_1.*elu_"):
        rnnconvert.load(p)


def test_code_in_an_activation_is_refused_without_running(tmp_path):
    """A network whose activation_fn names a standard-library callable: refused at unpickling, nothing run."""
    data = (FIX / "rnn.pkl").read_bytes()
    assert b"cmadmom.ml.nn.activations\ntanh\n" in data  # protocol 2: GLOBAL opcodes, no frames
    p = tmp_path / "c.pkl"
    p.write_bytes(data.replace(b"cmadmom.ml.nn.activations\ntanh\n", b"cos\nsystem\n"))
    with pytest.raises(FormatError, match="os.system"):
        rnnconvert.load(p)
