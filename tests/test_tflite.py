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


def test_while_loop_refused_naming_the_op(tmp_path):
    with pytest.raises(UnsupportedError, match="WHILE loop"):
        api.convert(TF / "gru.tflite", tmp_path / "out.pt")


def test_damaged(tmp_path):
    data = (TF / "lstm.tflite").read_bytes()
    for name, blob in {"trunc": data[: len(data) // 3], "zeros": data[:8] + bytes(len(data) - 8)}.items():
        src = tmp_path / f"{name}.tflite"
        src.write_bytes(blob)
        with pytest.raises(FormatError):
            api.load(src)
