"""``return_state`` and ``initial_state`` in whole Keras models (issue #30): an LSTM encoder's ``[h, c]`` feeding a
decoder's ``initial_state``, a masked reset-before GRU's ``h`` feeding a SimpleRNN and a GRU, the states as model
outputs; written as one ONNX graph (``Y_h``/``Y_c``, ``initial_h``/``initial_c``), a ``.pt2`` program and an
emitted ``nn.Module``.

Oracle: tf_keras 2.21 (``fixtures/gen_whole_states.py`` saved every model output ``out__<i>``, the states
included, on ``in__<name>``); targets onnxruntime, torch on the loaded program, torch on the emitted module.
Tolerance ``2e-5 * max(1, max|ref|)`` (issue #17/#30).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.errors import UnsupportedError  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402

from conftest import whole_close, whole_graph as _graph  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
STATES = sorted((FIX / "whole_states").glob("whole_states_*.h5"))


def _close(got, ref):
    return got.shape == ref.shape and whole_close(got, ref)


def _oracle(path, g):
    z = np.load(path.with_suffix(".npz"))
    return {n: z[f"in__{n}"] for n, *_ in g.inputs}, [z[f"out__{i}"] for i in range(len(g.outputs))]


def test_states_are_graph_outputs():
    """The encoder's call has three outputs; the decoder's three inputs are x, h, c (tf_keras stores
    ``initial_state`` as further inputs of the call)."""
    g = _graph(FIX / "whole_states" / "whole_states_lstm_seq2seq.h5")
    enc = next(n for n in g.nodes if n.path == "encoder")
    dec = next(n for n in g.nodes if n.path == "decoder")
    assert enc.outputs == ["encoder:0", "encoder:1", "encoder:2"] and dec.inputs[1:] == enc.outputs[1:]
    assert g.outputs[1:] == enc.outputs[1:]


@pytest.mark.parametrize("path", STATES, ids=lambda p: p.stem)
def test_onnx_states_match_tf_keras(path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from rnnconvert.whole.formats.onnx import model_write

    g = _graph(path)
    feeds, refs = _oracle(path, g)
    s = ort.InferenceSession(model_write.build(g).SerializeToString(), providers=["CPUExecutionProvider"])
    outs = s.run([f"output_{i}" for i in range(len(g.outputs))], feeds)
    assert all(_close(y, r) for y, r in zip(outs, refs)), [float(np.abs(y - r).max()) for y, r in zip(outs, refs)]


@pytest.mark.parametrize("path", STATES, ids=lambda p: p.stem)
def test_pt2_states_match_tf_keras(path):
    torch = pytest.importorskip("torch")
    from rnnconvert.whole.formats.torch import pt2_write

    g = _graph(path)
    feeds, refs = _oracle(path, g)
    buf = io.BytesIO()
    torch.export.save(pt2_write.export(g), buf)
    buf.seek(0)
    outs = torch.export.load(buf).module()(*[torch.from_numpy(v) for v in feeds.values()])
    assert all(_close(y.detach().numpy(), r) for y, r in zip(outs, refs))


@pytest.mark.parametrize("path", STATES, ids=lambda p: p.stem)
def test_emitted_module_states_match_tf_keras(path, tmp_path):
    torch = pytest.importorskip("torch")
    from rnnconvert.whole.formats.torch import module_write
    from rnnconvert.whole.runtimes import torch_export

    g = _graph(path)
    feeds, refs = _oracle(path, g)
    em = module_write.emit(g)
    (tmp_path / "m.py").write_text(em.source)
    (tmp_path / "m_state.pt").write_bytes(module_write.state_bytes(em.state))
    m = torch_export.load_module(tmp_path / "m.py", tmp_path / "m_state.pt")
    with torch.no_grad():
        outs = m(*[torch.from_numpy(v) for v in feeds.values()])
    assert len(outs) == len(refs) and all(_close(y.numpy(), r) for y, r in zip(outs, refs))


def _layer(config, name):
    return next(r for r in config["config"]["layers"] if r["config"]["name"] == name)


def test_bidirectional_states_refused_by_name():
    def edit(c):
        _layer(c, "bilstm")["config"]["layer"]["config"]["return_state"] = True

    with pytest.raises(UnsupportedError) as e:
        _graph(FIX / "whole_graph" / "whole30_masked_bidir.h5", edit)
    assert "'bilstm' (Bidirectional)" in str(e.value) and "return_state" in str(e.value) \
        and "recurrent_only" in str(e.value)


def test_constants_refused_by_name():
    """A recurrent call with extra inputs that are not its states (a cell's ``constants``) is refused."""
    def edit(c):
        dec = _layer(c, "decoder")
        dec["inbound_nodes"][0].append(["enc_in", 0, 0, {}])

    with pytest.raises(UnsupportedError) as e:
        _graph(FIX / "whole_states" / "whole_states_lstm_seq2seq.h5", edit)
    assert "'decoder' (LSTM)" in str(e.value) and "initial_state takes 2" in str(e.value)


def test_convert_verifies_states_end_to_end(tmp_path):
    """rnnconvert.convert to .onnx with the default verification: tf_keras against onnxruntime, every model
    output (the states included)."""
    pytest.importorskip("tf_keras")
    pytest.importorskip("onnxruntime")
    rep = rnnconvert.convert(FIX / "whole_states" / "whole_states_lstm_seq2seq.h5", tmp_path / "s.onnx")
    outs = [c for c in rep.verification.layers if c.name.startswith("model output")]
    assert [c.name for c in outs] == ["model output 0", "model output 1", "model output 2"]
    assert rep.verification.ok


@pytest.mark.parametrize("kind", ["drop_initial_state", "swap_h_c"])
def test_state_mutations_fail(kind):
    """The whole-model check (tf_keras vs onnxruntime) fails when the decoder loses its initial state or gets
    h and c swapped."""
    pytest.importorskip("tf_keras")
    ort = pytest.importorskip("onnxruntime")
    from rnnconvert.whole.formats.onnx import model_write
    from rnnconvert.whole.verify import keras_whole_check

    path = FIX / "whole_states" / "whole_states_lstm_seq2seq.h5"
    ckpt = rnnconvert.load(path)
    full = keras_whole.read_full_model(ckpt)
    model = model_write.build(keras_graph.build(full.config, full.weights, ckpt))
    node = next(n for n in model.graph.node if n.op_type == "LSTM" and n.name == "decoder")
    if kind == "drop_initial_state":
        node.input[5] = node.input[6] = ""
    else:
        node.input[5], node.input[6] = node.input[6], node.input[5]
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [f"output_{i}" for i in range(3)]
    checks = keras_whole_check.compare_whole(str(path), full, lambda xs: (s.run(outs, xs), {}), "onnxruntime (mutated)")
    assert any(c.verdict == "fail" for c in checks)
