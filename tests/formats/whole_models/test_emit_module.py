"""``--emit-module``: whole Keras models as readable ``nn.Module`` source plus a state dict (issue #30).

Oracle: tf_keras 2.21 (``fixtures/gen_keras_whole.py``, ``fixtures/gen_whole_graph.py`` saved each fixture's
outputs ``out__<i>`` on ``in__<name>``); the target is torch running the emitted source imported from its file
with the written state dict loaded (``torch.load(weights_only=True)``). Tolerance ``2e-5 * max(1, max|ref|)``
(issue #17/#30), as the ``.pt2`` and ONNX checks.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.errors import FormatError, UnsupportedError  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.formats.torch import module_write  # noqa: E402
from rnnconvert.whole.runtimes import torch_export  # noqa: E402

from conftest import whole_close as _close, whole_model  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
WHOLE = (sorted((FIX / "keras_whole").glob("whole_*.h5")) + sorted((FIX / "whole_graph").glob("whole30_*.h5"))
         + sorted((FIX / "whole_states").glob("whole_states_*.h5")))


def _graph(path):
    ckpt, full = whole_model(path)
    return ckpt, full, keras_graph.build(full.config, full.weights, ckpt)


def _write(em, tmp_path, stem="model"):
    py, st = tmp_path / f"{stem}.py", tmp_path / f"{stem}_state.pt"
    py.write_text(em.source)
    st.write_bytes(module_write.state_bytes(em.state))
    return py, st


def _feeds(g, z):
    ins = [k for k in z.files if k.startswith("in__")]
    return [torch.from_numpy(z[f"in__{n}"] if f"in__{n}" in z.files else z[ins[0]]) for n, *_ in g.inputs]


@pytest.mark.parametrize("path", WHOLE, ids=lambda p: p.stem)
def test_emitted_module_matches_tf_keras(path, tmp_path):
    """Every whole fixture (masks, Bidirectional merges, go_backwards, reset-before GRU, hard_sigmoid, nested and
    shared layers, every pooling/normalisation/merge layer) as nn.Module source: imported from the written file,
    the written state dict loaded strictly, run in eval mode: tf_keras' saved outputs."""
    _, _, g = _graph(path)
    py, st = _write(module_write.emit(g, path.name), tmp_path)
    m = torch_export.load_module(py, st)
    z = np.load(path.with_suffix(".npz"))
    with torch.no_grad():
        ys = m(*_feeds(g, z))
    ys = ys if isinstance(ys, tuple) else (ys,)
    assert len(ys) == len(g.outputs)
    for i, y in enumerate(ys):
        assert _close(y.numpy(), z[f"out__{i}"]), (path.name, i)


def test_emitted_source_is_deterministic_and_readable():
    """Two emissions give the same bytes; layers are attributes named after the Keras layers; nn.LSTM where torch
    computes the cell (under a mask too, issue #41), the KerasRecurrent class where it cannot (hard_sigmoid gates,
    reset-before GRU)."""
    _, _, g = _graph(FIX / "whole_graph" / "whole30_masked_bidir.h5")
    a, b = module_write.emit(g, "x.h5"), module_write.emit(g, "x.h5")
    assert a.source == b.source and module_write.state_bytes(a.state) == module_write.state_bytes(b.state)
    assert "self.bilstm = nn.LSTM(5, 3, batch_first=True, bidirectional=True)" in a.source
    assert "self.gru = KerasRecurrent('GRU', 3, 4, reset_after=False)" in a.source
    assert "self.head = nn.Linear(5, 2)" in a.source and "def forward(self, tokens):" in a.source
    _, _, g = _graph(FIX / "whole_graph" / "whole30_layer_zoo.h5")
    src = module_write.emit(g).source
    assert "self.bigru = nn.GRU(8, 3, batch_first=True, bidirectional=True)" in src
    assert "        max_1 = torch.maximum(avg, elu)" in src  # the layer 'max' does not shadow the builtin
    compile(src, "model.py", "exec")


def test_state_dict_keys_are_torch_names_and_load_with_weights_only(tmp_path):
    """The state dict is plain tensors in torch.nn's names (nn.LSTM weight_ih_l0 ..., nn.Linear weight (out, in) =
    the Keras kernel transposed, bit for bit)."""
    _, full, g = _graph(FIX / "whole_graph" / "whole30_embed_conv_lstm.h5")
    py, st = _write(module_write.emit(g), tmp_path)
    sd = torch.load(str(st), weights_only=True)
    assert list(sd) == ["emb.weight", "conv.weight", "conv.bias", "lstm.weight_ih_l0", "lstm.weight_hh_l0",
                        "lstm.bias_ih_l0", "lstm.bias_hh_l0", "probs.weight", "probs.bias"]
    kernel = dict(full.weights["probs"])
    assert np.array_equal(sd["probs.weight"].numpy(), next(v for k, v in kernel.items() if "kernel" in k).T)


def test_emitted_module_trains(tmp_path):
    """The user's path: import the written file, load the state, take an optimiser step (parameters are
    nn.Parameters; gradients reach the KerasRecurrent cells)."""
    _, _, g = _graph(FIX / "whole_graph" / "whole30_masked_bidir.h5")
    py, st = _write(module_write.emit(g), tmp_path)
    m = torch_export.load_module(py, st).train()
    z = np.load(FIX / "whole_graph" / "whole30_masked_bidir.npz")
    before = m.gru.weight_hh_l0.detach().clone()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(*_feeds(g, z)).sum().backward()
    opt.step()
    assert m.gru.weight_hh_l0.grad is not None and not torch.equal(before, m.gru.weight_hh_l0.detach())


def test_names_from_the_file_cannot_inject_code(tmp_path):
    """A layer name with quotes, newlines and code becomes an identifier and a '?'-sanitised comment."""
    _, full, g = _graph(FIX / "whole_graph" / "whole30_embed_conv_lstm.h5")
    evil = 'probs"""\nimport os; os.system("x")  # '
    for node in g.nodes:
        if node.path == "probs":
            node.path = node.name = evil
    g.name = 'm"""\nraise SystemExit'
    src = module_write.emit(g, 'a"""b.h5').source
    compile(src, "model.py", "exec")
    assert not any(line.lstrip().startswith(("import os", "raise SystemExit")) for line in src.splitlines())
    py, st = _write(module_write.emit(g), tmp_path)
    m = torch_export.load_module(py, st)
    assert any(name.startswith("probs___") for name, _ in m.named_children())


def test_emit_needs_a_whole_model_and_a_py_path(tmp_path):
    with pytest.raises(UnsupportedError, match="holds none"):
        rnnconvert.convert(FIX / "keras" / "lstm_weights.h5", tmp_path / "w.onnx", verify=None,
                           emit_module=tmp_path / "w.py")
    with pytest.raises(FormatError, match="ending in .py"):
        rnnconvert.convert(FIX / "keras" / "lstm_weights.h5", tmp_path / "w.onnx", verify=None,
                           emit_module=tmp_path / "w.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- end to end and mutations
def test_convert_with_emit_module_verifies_it(tmp_path):
    """rnnconvert.convert(..., emit_module=): DST and the module in place, the module checked against tf_keras
    (the checks 'module output <i>'), every output."""
    pytest.importorskip("tf_keras")
    pytest.importorskip("onnxruntime")
    src = FIX / "keras_whole" / "whole_multi_io.h5"
    rep = rnnconvert.convert(src, tmp_path / "m.onnx", emit_module=tmp_path / "m.py")
    names = [c.name for c in rep.verification.layers if c.name.startswith("module")]
    assert names == ["module output 0", "module output 1"] and rep.verification.ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.py", "m_state.pt"]
    assert "from m import Model" in (tmp_path / "m.py").read_text()


def _swap_gates(sd):
    w = sd["lstm.weight_ih_l0"]
    H = w.shape[0] // 4
    w[:H], w[H:2 * H] = w[H:2 * H].clone(), w[:H].clone()


def _nudge_bias(sd):
    sd["probs.bias"][0] += 1e-3  # one logit (a softmax ignores a shift of all of them)


@pytest.mark.parametrize("mutate", [_swap_gates, _nudge_bias], ids=["swap_gates", "dense_bias"])
def test_mutations_fail(tmp_path, mutate):
    """The emitted-module check catches a swapped gate block in the state dict and a nudged Dense bias."""
    pytest.importorskip("tf_keras")
    src = FIX / "whole_graph" / "whole30_embed_conv_lstm.h5"
    ckpt, _, g = _graph(src)
    py, st = _write(module_write.emit(g), tmp_path)
    assert all(c.ok for c in torch_export.verify_module(ckpt, src, py, st))
    sd = torch.load(str(st), weights_only=True)
    mutate(sd)
    torch.save(sd, str(st))
    checks = torch_export.verify_module(ckpt, src, py, st)
    assert any(c.verdict == "fail" for c in checks), [(c.name, c.max_abs_err) for c in checks]


def test_emitted_module_follows_any_mask_and_other_lengths(tmp_path):
    """Leading padding, a gap (which ONNX sequence_lens cannot express), an all-padding row and another batch
    size: the emitted module against tf_keras running the source file on the same inputs."""
    pytest.importorskip("tf_keras")
    path = FIX / "keras_whole" / "whole_masked_gru_actreg.h5"
    _, full, g = _graph(path)
    py, st = _write(module_write.emit(g), tmp_path)
    m = torch_export.load_module(py, st)
    x = np.random.default_rng(7).standard_normal((5, 7, 5)).astype(np.float32)  # the model's time is 7
    x[0, :2] = 0.0
    x[2, 3] = 0.0
    x[3, 4:] = 0.0
    x[4] = 0.0
    ref = keras_whole.source_model(str(path), full.config)(x)
    with torch.no_grad():
        y = m(torch.from_numpy(x))
    assert _close(y.numpy(), np.asarray(ref))


def test_emitted_bidirectional_follows_gaps_at_another_length(tmp_path):
    """Embedding(mask_zero) -> masked Bidirectional 'ave', reset-before GRU, go_backwards SimpleRNN, masked mean:
    token ids with gaps and leading padding, 10 steps (the fixture has 8), against tf_keras on the same ids."""
    pytest.importorskip("tf_keras")
    path = FIX / "whole_graph" / "whole30_masked_bidir.h5"
    _, full, g = _graph(path)
    py, st = _write(module_write.emit(g), tmp_path)
    m = torch_export.load_module(py, st)
    ids = np.random.default_rng(8).integers(1, 25, size=(3, 10)).astype(np.int32)
    ids[0, :3] = 0
    ids[1, [2, 5, 6]] = 0
    ref = keras_whole.source_model(str(path), full.config)(ids)
    with torch.no_grad():
        y = m(torch.from_numpy(ids))
    assert _close(y.numpy(), np.asarray(ref))
