"""OpenVINO IR: the oracle is OpenVINO -- fixtures made by ``ov.convert_model`` (of torch modules and of an ONNX
model) and ``openvino.opset13``, saved by ``ov.save_model``, with the OpenVINO runtime's outputs
(``fixtures/gen_openvino.py``); written IRs read and run by the OpenVINO runtime. PyTorch and onnxruntime run
the converted ``.pt``/``.onnx``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES, manifest
from rnnconvert import api
from rnnconvert.core import gates, reference
from rnnconvert.core.model import Cell
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError

torch = pytest.importorskip("torch")
ENTRIES = manifest("openvino")
RTOL = 2e-5  # relative to the output's largest magnitude


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def _oracle(entry):
    o = np.load(FIXTURES / entry["oracle"])
    x, y = o["x"], o["y"]
    if entry.get("time_major"):
        x, y = x.transpose(1, 0, 2), y.transpose(1, 0, 2)
    return x, y


def _chain_pt(dst, names, x, **opts):
    mods = api.torch_modules(dst, **opts)
    y = torch.from_numpy(x)
    with torch.no_grad():
        for n in names:  # an f16 IR computes in f32 after its Convert: the f16 module widened the same way (exact)
            y = mods[n].float()(y)[0]
    return y.numpy()


def _chain_onnx(dst, names, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    y = x
    for n in names:
        feeds = {i.name: (y if i.name == f"{n}__in" else np.zeros((y.shape[0], y.shape[1], i.shape[2]), np.float32))
                 for i in sess.get_inputs()}
        y = sess.run([f"{n}__out"], feeds)[0]
    return y


def _ov_run(dst, name, x):
    ov = pytest.importorskip("openvino")
    core = ov.Core()
    cm = core.compile_model(str(dst / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    feeds = {i.get_any_name(): (x if i.get_any_name() == f"{name}__in" else
                                np.zeros((x.shape[0], x.shape[1], i.get_partial_shape()[2].get_length()), np.float32))
             for i in cm.inputs}
    return cm(feeds)[cm.output(f"{name}__out")]


def test_gen_openvino_is_the_producer():
    files = {p.name for p in (FIXTURES / "openvino").iterdir()}
    assert {e["file"] for e in ENTRIES} == {f"openvino/{n}" for n in files if n.endswith(".xml")}
    assert all(e["file"][:-4].split("/")[1] + ".bin" in files for e in ENTRIES)
    assert all(e["producer"].startswith("openvino ") for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
@pytest.mark.parametrize("ext", [".pt", ".onnx"])
def test_ir_converts_reproducing_openvino(entry, ext, tmp_path):
    """An IR saved by ov.save_model converts (verified) to .pt / .onnx, and torch / onnxruntime running the
    result reproduce OpenVINO's outputs within 2e-5 relative -- or the conversion is refused naming the feature
    the target lacks (a reset-before GRU into torch.nn)."""
    if ext == ".onnx":
        pytest.importorskip("onnx")
    src = FIXTURES / entry["file"]
    assert registry.detect(src).name == "openvino"
    ckpt = api.load(src)
    names = [layer.name for layer in ckpt.layers]
    assert len(names) == entry["layers"]
    dst = tmp_path / f"out{ext}"
    relu = any(layer.cell is Cell.RNN_RELU for layer in ckpt.layers)
    if ext == ".pt" and any(layer.cell is Cell.GRU and not layer.semantics.reset_after for layer in ckpt.layers):
        with pytest.raises(UnsupportedError, match="reset_after=False"):
            api.convert(src, dst)
        assert not dst.exists()
        return
    api.convert(src, dst)  # verified (the default) before it is renamed
    x, want = _oracle(entry)
    got = (_chain_pt(dst, names, x, **({"nonlinearity": "relu"} if relu else {})) if ext == ".pt"
           else _chain_onnx(dst, names, x))
    assert _rel(got, want) < RTOL


def _torch_model(cell: str):
    torch.manual_seed(5)
    if cell == "LSTM":
        m = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    elif cell == "GRU":
        m = torch.nn.GRU(3, 4, num_layers=2, batch_first=True)
    else:
        m = torch.nn.RNN(3, 4, nonlinearity="relu", batch_first=True)
    rng = np.random.default_rng(13)
    with torch.no_grad():
        for _, p in m.named_parameters():
            g = {"LSTM": 4, "GRU": 3}.get(cell, 1)
            blocks = np.repeat(np.arange(g), p.shape[0] // g).reshape(-1, *([1] * (p.dim() - 1))) * 0.3
            p.copy_(torch.from_numpy((blocks + rng.uniform(-0.2, 0.2, tuple(p.shape))).astype(np.float32)))
    return m


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("src_ext", [".pt", ".onnx"])
def test_pt_and_onnx_sources_into_openvino_run_by_openvino(cell, src_ext, tmp_path):
    """torch.nn modules saved as .pt (and converted to .onnx) convert into an IR (verified by the openvino
    runtime), and the OpenVINO runtime running the IR reproduces torch's outputs."""
    pytest.importorskip("openvino")
    m = _torch_model(cell)
    src = tmp_path / "m.pt"
    torch.save(m.state_dict(), src)
    opts = {"nonlinearity": "relu"} if cell == "RNN" else {}
    if src_ext == ".onnx":
        pytest.importorskip("onnx")
        api.convert(src, tmp_path / "m.onnx", read_opts=opts)
        src, opts = tmp_path / "m.onnx", {}
    dst = tmp_path / "ir"
    api.convert(src, dst, to="openvino", read_opts=opts)
    assert sorted(p.name for p in dst.iterdir()) == [".rnnconvert-manifest.json", "model.bin", "model.xml"]
    assert registry.detect(dst).name == "openvino" and registry.detect(dst / "model.xml").name == "openvino"
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x))[0].numpy()
    assert _rel(_ov_run(dst, "rnn", x), want) < RTOL


def test_f16_ir_is_read_as_stored():
    """compress_to_fp16 stores f16 constants followed by a Convert: read as the stored f16 arrays (exact)."""
    ckpt = api.load(FIXTURES / "openvino/torch_gru_f16.xml")
    assert ckpt.layers[0].dtype == np.float16


# ------------------------------------------------------------------ the traps a naive port falls into

def _naive(layer, order: str):
    """``layer`` read as if its blocks were in gate order ``order`` rather than OpenVINO's."""
    cv = gates.convention("openvino", layer.cell)
    p = layer.params[0][0]
    back = {f: gates.reorder(gates.reorder(getattr(p, f), gates.CANONICAL[layer.cell], cv.gate_order),
                             order, gates.CANONICAL[layer.cell]) for f in ("w_ih", "w_hh", "b_ih", "b_hh")}
    return replace(layer, params=[[replace(p, **back)] + layer.params[0][1:]] + layer.params[1:])


def test_lstm_gate_order_trap():
    """LSTMSequence stores gates f, i, c, o: read in PyTorch's i, f, g, o (a naive port) it misses OpenVINO."""
    entry = next(e for e in ENTRIES if e["file"] == "openvino/torch_lstm.xml")
    ckpt = api.load(FIXTURES / entry["file"])
    x, want = _oracle(entry)

    def run(layers):
        y = x.astype(np.float64)
        for layer in layers:
            y = reference.forward(layer, y)
        return y

    assert _rel(run(ckpt.layers), want) < RTOL
    naive = [_naive(layer, "ifgo") for layer in ckpt.layers]  # OV's f,i,c,o blocks taken as i,f,g,o
    assert _rel(run(naive), want) > 1e-2


def test_gru_summed_bias_trap():
    """GRUSequence with linear_before_reset holds B (4H) = [z, r summed; h input; hn recurrent]: a naive port
    reading the first 3H as b_ih and dropping b_hn (or taking B[3H:] as a full b_hh) misses OpenVINO."""
    entry = next(e for e in ENTRIES if e["file"] == "openvino/torch_gru_f16.xml")
    layer = api.load(FIXTURES / entry["file"]).layers[0]
    x, want = _oracle(entry)
    assert _rel(reference.forward(layer, x.astype(np.float64)), want) < RTOL
    p = layer.params[0][0]
    dropped = replace(layer, params=[[replace(p, b_hh=np.zeros_like(p.b_hh))]])
    assert _rel(reference.forward(dropped, x.astype(np.float64)), want) > 1e-3


# ------------------------------------------------------------------ verification can fail; bad input

def test_verification_catches_swapped_gates_in_a_written_ir(tmp_path):
    pytest.importorskip("openvino")
    m = _torch_model("LSTM")
    torch.save(m.state_dict(), tmp_path / "m.pt")
    good = api.load(tmp_path / "m.pt")
    layer = good.layers[0]
    H = layer.hidden_size
    swapped = []
    for row in layer.params:
        swapped.append([replace(p, w_ih=np.concatenate([p.w_ih[H:2 * H], p.w_ih[:H], p.w_ih[2 * H:]])) for p in row])
    bad = replace(good, layers=[replace(layer, params=swapped)])
    api.save(bad, tmp_path / "ir", "openvino")
    rep = api.verify(tmp_path / "m.pt", tmp_path / "ir")
    assert any(c.verdict != "ok" for c in rep.layers)


def test_unsafe_and_damaged_ir_is_one_line(tmp_path):
    src = (FIXTURES / "openvino/opset_rnn.xml").read_text()
    (tmp_path / "d.bin").write_bytes((FIXTURES / "openvino/opset_rnn.bin").read_bytes())
    (tmp_path / "d.xml").write_text('<?xml version="1.0"?>\n<!DOCTYPE net [<!ENTITY a "aaaa">]>\n'
                                    + src.split("\n", 1)[1])
    with pytest.raises(FormatError, match="DTD or entities") as info:
        api.load(tmp_path / "d.xml", "openvino")
    assert "\n" not in str(info.value)
    (tmp_path / "d.xml").write_text(src)
    (tmp_path / "d.bin").write_bytes((FIXTURES / "openvino/opset_rnn.bin").read_bytes()[:40])
    with pytest.raises(FormatError, match="declares") as info:
        api.load(tmp_path / "d.xml")
    assert "\n" not in str(info.value)
    (tmp_path / "d.bin").unlink()
    with pytest.raises(FormatError, match="no weights file"):
        api.load(tmp_path / "d.xml", "openvino")


def test_force_replaces_a_written_ir_folder(tmp_path):
    pytest.importorskip("openvino")
    from rnnconvert.errors import OutputExistsError

    torch.save(torch.nn.GRU(3, 4).state_dict(), tmp_path / "m.pt")
    api.convert(tmp_path / "m.pt", tmp_path / "ir", to="openvino")
    with pytest.raises(OutputExistsError):
        api.convert(tmp_path / "m.pt", tmp_path / "ir", to="openvino")
    api.convert(tmp_path / "m.pt", tmp_path / "ir", to="openvino", force=True)
    # the manifest rnnconvert writes in each folder output: what --force may replace (engine/commit.py)
    assert sorted(p.name for p in (tmp_path / "ir").iterdir()) == [".rnnconvert-manifest.json", "model.bin",
                                                                   "model.xml"]


def test_bidirectional_relu_rnn_lists_activations_per_direction(tmp_path):
    """OpenVINO's ONNX frontend writes an ONNX bidirectional relu RNN as ``activations="relu, relu"`` (one per
    direction): read as one relu cell (the .pt/.onnx reproduction of OpenVINO's output is in
    test_ir_converts_reproducing_openvino); a list that differs per direction, or of another length, is refused
    naming what it holds."""
    src = FIXTURES / "openvino/onnx_birnn_relu.xml"
    text = src.read_text()
    assert 'direction="bidirectional"' in text and 'activations="relu, relu"' in text  # as OpenVINO wrote it
    (layer,) = api.load(src).layers
    assert layer.cell is Cell.RNN_RELU and layer.bidirectional
    (tmp_path / "d.bin").write_bytes(src.with_suffix(".bin").read_bytes())
    for acts, match in (("relu, tanh", "differ per direction .forward relu; backward tanh"),
                        ("relu, relu, relu", "3 activations .relu, relu, relu. for a RNNSequence of 2 direction")):
        (tmp_path / "d.xml").write_text(text.replace('activations="relu, relu"', f'activations="{acts}"'))
        with pytest.raises(UnsupportedError, match=match) as info:
            api.load(tmp_path / "d.xml")
        assert "\n" not in str(info.value) and "rnnconvert reads sigmoid, tanh and relu" not in str(info.value)
