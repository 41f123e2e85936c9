"""TensorFlow Lite / LiteRT flatbuffers (issue 31 A; rnnconvert/formats/tflite, docs/tflite.md): files made by
TensorFlow's own converter from tf_keras models (fixtures/gen_tflite.py).

Oracle: ``tf.lite.Interpreter`` ran each file on fixed inputs (``tflite/<name>.oracle.npz``: ``x``, ``y``; ``keras``:
what tf_keras computed before conversion). Here torch (``nn.LSTM`` built from the converted .pt by
``load_state_dict``) or onnxruntime (the converted .onnx) runs the conversion on the same inputs.

Tolerance: 2e-5 relative plus 1e-6 absolute (issue 31's criterion); H <= 5, T = 5, weights below 0.4, so the
sides differ by float32 rounding and TFLite's activation kernels (measured: <= 8e-7 relative). The clip trap
compares numbers that differ by more than 0.5.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError

TF = FIXTURES / "tflite"
RTOL, ATOL = 2e-5, 1e-6
NOCLIP = {"cell_clip": "none"}
pytest.importorskip("tflite")
torch = pytest.importorskip("torch")


def _oracle(name: str):
    return np.load(TF / f"{name}.oracle.npz")


def _chain_pt(dst, x: np.ndarray) -> np.ndarray:
    """The converted layers in torch, one after the other (lstm_0, lstm_1, ...)."""
    mods = api.torch_modules(dst)
    h = torch.from_numpy(x)
    with torch.no_grad():
        for name in sorted(mods):
            h = mods[name](h)[0]
    return h.numpy()


def _chain_onnx(dst, x: np.ndarray) -> np.ndarray:
    from rnnconvert.runtimes import onnxruntime as ort_rt

    ckpt = api.load(dst)
    for layer in ckpt.layers:
        x = ort_rt.forward(dst, ckpt, layer.name, x).astype(np.float32)
    return x


def test_detected():
    assert registry.detect(TF / "lstm.tflite").name == "tflite"


@pytest.mark.parametrize("name", ["lstm", "bilstm_stack"])
def test_converter_output_to_pt_and_onnx(tmp_path, name):
    """A Keras LSTM and a Bidirectional LSTM + LSTM stack, as TF's converter writes them (cell_clip dropped)."""
    orc = _oracle(name)
    rep = api.convert(TF / f"{name}.tflite", tmp_path / "out.pt", read_opts=NOCLIP)
    assert any("cell_clip 10" in n for n in rep.notes)
    np.testing.assert_allclose(_chain_pt(tmp_path / "out.pt", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)
    pytest.importorskip("onnxruntime")
    api.convert(TF / f"{name}.tflite", tmp_path / "out.onnx", read_opts=NOCLIP)
    np.testing.assert_allclose(_chain_onnx(tmp_path / "out.onnx", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)


def test_bidirectional_pattern_is_one_layer():
    ckpt = api.load(TF / "bilstm_stack.tflite")
    assert [(la.name, la.bidirectional, la.hidden_size) for la in ckpt.layers] == [("lstm_0", True, 4),
                                                                                    ("lstm_1", False, 5)]


def test_converter_cell_clip_kept_by_default_and_refused(tmp_path):
    """TF's converter writes cell_clip=10 into every Keras LSTM; read as stored, .pt cannot express it."""
    ckpt = api.load(TF / "lstm.tflite")
    assert ckpt.layers[0].semantics.cell_clip == 10.0
    with pytest.raises(UnsupportedError, match="cell_clip"):
        api.convert(TF / "lstm.tflite", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_cell_clip_trap():
    """Where the cell state passes 10, the TFLite model is not the Keras model: a port that drops the clip
    silently computes Keras' numbers, not the file's. Read as stored, the layer reproduces the interpreter."""
    orc = _oracle("clip_trap")
    assert np.max(np.abs(orc["y"] - orc["keras"])) > 0.5  # the framework's own two runs differ
    kept = reference.forward(api.load(TF / "clip_trap.tflite").layers[0], orc["x"])
    dropped = reference.forward(api.load(TF / "clip_trap.tflite", **NOCLIP).layers[0], orc["x"])
    assert np.max(np.abs(kept - orc["y"])) < 1e-3
    assert np.max(np.abs(dropped - orc["y"])) > 0.5


def test_projection_to_pt_exact_and_refused_for_onnx(tmp_path):
    orc = _oracle("proj")
    api.convert(TF / "proj.tflite", tmp_path / "out.pt", read_opts=NOCLIP)
    np.testing.assert_allclose(_chain_pt(tmp_path / "out.pt", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)
    pytest.importorskip("onnx")
    with pytest.raises(UnsupportedError, match="projection"):
        api.convert(TF / "proj.tflite", tmp_path / "out.onnx", read_opts=NOCLIP)


def test_projection_bias_refused():
    """The trap: TFLite's projection has a bias (input 17) that PyTorch's proj_size lacks; a port that drops it
    is silently wrong, so a non-zero one is refused, naming it."""
    with pytest.raises(UnsupportedError, match="non-zero projection bias"):
        api.load(TF / "proj_bias.tflite")


def test_gru_while_loop_read(tmp_path):
    """A tf_keras GRU comes out of the converter as a WHILE loop: its cell is recognised in the loop body
    (tflite_while; tests/formats/tflite_files/test_tflite_while.py covers the other cells and the refusals) and the .pt
    reproduces the interpreter."""
    orc = _oracle("gru")
    rep = api.convert(TF / "gru.tflite", tmp_path / "out.pt")
    assert rep.verification.verdict == "ok"
    np.testing.assert_allclose(_chain_pt(tmp_path / "out.pt", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)


def test_damaged(tmp_path):
    data = (TF / "lstm.tflite").read_bytes()
    for name, blob in {"trunc": data[: len(data) // 3], "zeros": data[:8] + bytes(len(data) - 8)}.items():
        src = tmp_path / f"{name}.tflite"
        src.write_bytes(blob)
        with pytest.raises(FormatError):
            api.load(src)


# --- the writer: .pt / .onnx sources into fused TFLite LSTM ops, run by the TFLite interpreter itself


def _interpret(path, name: str, x: np.ndarray) -> np.ndarray:
    """tf.lite.Interpreter (not rnnconvert) on the written file: input '<name>__in', output '<name>__out'."""
    import tensorflow as tf

    it = tf.lite.Interpreter(model_path=str(path))
    inp = next(d for d in it.get_input_details() if d["name"] == f"{name}__in")
    it.resize_tensor_input(inp["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(inp["index"], x)
    it.invoke()
    return it.get_tensor(next(d["index"] for d in it.get_output_details() if d["name"] == f"{name}__out"))


@pytest.fixture(scope="module")
def torch_src(tmp_path_factory):
    """torch's own nn.LSTM (2 layers, bidirectional) and nn.LSTM(proj_size=2), saved by torch.save, and their
    outputs on a batch of 2 (the oracle)."""
    d = tmp_path_factory.mktemp("tfl_src")
    torch.manual_seed(3)
    lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    proj = torch.nn.LSTM(4, 5, proj_size=2, batch_first=True)
    torch.save({f"enc.{k}": v for k, v in lstm.state_dict().items()}
               | {f"proj.{k}": v for k, v in proj.state_dict().items()}, d / "src.pt")
    rng = np.random.default_rng(3)
    x, xp = rng.standard_normal((2, 6, 3)).astype(np.float32), rng.standard_normal((2, 6, 4)).astype(np.float32)
    with torch.no_grad():
        return d / "src.pt", {"enc": (x, lstm(torch.from_numpy(x))[0].numpy()),
                              "proj": (xp, proj(torch.from_numpy(xp))[0].numpy())}


@pytest.mark.parametrize("via", ["pt", "onnx"])
def test_pt_and_onnx_sources_run_in_the_interpreter(tmp_path, torch_src, via):
    pytest.importorskip("tensorflow")
    src, orc = torch_src
    if via == "onnx":  # ONNX has no projection: the projected layer stays in the .pt route
        pytest.importorskip("onnxruntime")
        ckpt = api.load(src)
        from dataclasses import replace as _r

        api.save(_r(ckpt, layers=[la for la in ckpt.layers if la.name == "enc"]), tmp_path / "src.onnx")
        src, orc = tmp_path / "src.onnx", {"enc": orc["enc"]}
    rep = api.convert(src, tmp_path / "out.tflite", write_opts={"batch": 2})
    assert [c.name for c in rep.verification.layers] == list(orc)
    for name, (x, y) in orc.items():
        np.testing.assert_allclose(_interpret(tmp_path / "out.tflite", name, x), y, rtol=RTOL, atol=ATOL)
    back = api.load(tmp_path / "out.tflite")
    assert [(la.name, la.num_layers, la.bidirectional) for la in back.layers][:1] == [("enc", 2, True)]


def test_verification_catches_swapped_gates_in_the_written_file(tmp_path, torch_src, monkeypatch):
    """Mutation: a writer that stored the forget gate's weights as the input gate's is caught by the
    interpreter's run."""
    pytest.importorskip("tensorflow")
    from rnnconvert.errors import VerificationError
    from rnnconvert.formats.tflite import tflite_write

    real = tflite_write.gates.from_canonical

    def swapped(mat, conv, cell, **kw):
        m = real(mat, conv, cell, **kw).copy()
        H = m.shape[0] // 4
        m[:H], m[H:2 * H] = m[H:2 * H].copy(), m[:H].copy()
        return m

    monkeypatch.setattr(tflite_write.gates, "from_canonical", swapped)
    with pytest.raises(VerificationError):
        api.convert(torch_src[0], tmp_path / "out.tflite")
    assert not (tmp_path / "out.tflite").exists()


def test_writer_refuses_gru(tmp_path):
    with pytest.raises(UnsupportedError, match="WHILE loops"):
        api.convert(FIXTURES / "pickle" / "torch_dicts.pkl", tmp_path / "out.tflite")


@pytest.mark.parametrize("feature", ["peep", "proj"])
def test_peepholes_projection_and_cell_clip_as_the_interpreter_computes_them(tmp_path, feature):
    """TFLite's peepholes (the output one on the new c), projection and cell_clip are the canonical (TF1/ONNX)
    ones: the interpreter running the written op agrees with the float64 equations, and the clip is active."""
    pytest.importorskip("tensorflow")
    from dataclasses import replace as _r

    from rnnconvert.core.model import Cell, Checkpoint
    from rnnconvert.engine import matrix

    layer = matrix.gate_distinct_layer("t", Cell.LSTM, **{feature: True if feature == "peep" else 2})
    layer = _r(layer, semantics=_r(layer.semantics, cell_clip=0.3))
    api.save(Checkpoint(layers=[layer]), tmp_path / "p.tflite", batch=3)
    x = np.random.default_rng(0).standard_normal((3, 7, layer.input_size)).astype(np.float32)
    y = _interpret(tmp_path / "p.tflite", layer.name, x)
    np.testing.assert_allclose(y, reference.forward(layer, x), rtol=RTOL, atol=1e-6)
    unclipped = reference.forward(_r(layer, semantics=_r(layer.semantics, cell_clip=None)), x)
    assert np.max(np.abs(unclipped - y)) > 1e-3


def test_float16_weights_behind_dequantize(tmp_path):
    """The converter's float16 quantisation stores weights as float16 constants that DEQUANTIZE ops widen for
    the LSTM op: read as float32 (exact), they reproduce the interpreter."""
    orc = _oracle("lstm_f16")
    ckpt = api.load(TF / "lstm_f16.tflite", **NOCLIP)
    assert ckpt.layers[0].params[0][0].w_ih.dtype == np.float32
    api.convert(TF / "lstm_f16.tflite", tmp_path / "out.pt", read_opts=NOCLIP)
    np.testing.assert_allclose(_chain_pt(tmp_path / "out.pt", orc["x"]), orc["y"], rtol=RTOL, atol=ATOL)


def test_int8_weights_refused():
    """Dynamic-range quantisation (the converter's Optimize.DEFAULT) stores int8 weights: refused, named."""
    with pytest.raises(UnsupportedError, match="int8 .quantised weights."):
        api.load(TF / "lstm_int8.tflite")
