"""Fast ``.pt2`` programs and emitted modules with a free time axis (issue #41).

The recurrent layers of a ``.pt2`` program run as torch's own LSTM kernel where it computes the Keras cell (a Keras
mask by moving each row's unmasked steps together), else as one ``scan`` for both directions; the emitted module
runs ``nn.LSTM``/``nn.GRU``/``nn.RNN`` where exact, masks included (``masked_run``), else ``KerasRecurrent``. The
time axis is free, a declared one included.

Oracle: tf_keras 2.21 running the source model (``keras_whole.source_model``: the fixture's config rebuilt, its
weights loaded by tf_keras) on generated inputs of a length no fixture was made at, padded at the end, the front,
inside (``keras_whole.make_inputs``) and everywhere (an all-padded row added). Fixtures made by tf_keras through
``fixtures/gen_whole_masks.py``, ``gen_whole_graph.py``, ``gen_keras_whole.py``. Tolerance as
``tests/formats/whole_models/test_whole_graph.py``: ``2e-5 * max(1, max|ref|)``, float32 rounding of a few dozen steps at
unit scale (float32's spacing at 1 is 1.2e-7: the rule leaves two orders of magnitude for summation order, which
differs between tf_keras, oneDNN and torch's products on any CPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tf_keras")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.whole.formats.torch import module_write, pt2_write  # noqa: E402
from rnnconvert.whole.runtimes import torch_export  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
MASKED = [FIX / "whole_masks" / f"masks_{n}.h5" for n in ("bidir", "gru_stack", "masking_backwards", "states")] + [
    FIX / "whole_graph" / "whole30_masked_bidir.h5", FIX / "keras_whole" / "whole_masked_stack.h5"]
TOL = 2e-5
STEPS = 23  # no fixture was made at this length (9, 12, 20...)


def _err(got, ref) -> float:
    """The scaled max |got - ref|; NaN where tf_keras gives NaN (a masked mean over an all-padded row: 0 / 0) must
    be NaN in ``got`` too (else the error is infinite)."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if not np.array_equal(np.isnan(ref), np.isnan(got)):
        return float("inf")
    ok = ~np.isnan(ref)
    return float(np.max(np.abs(got[ok] - ref[ok]), initial=0.0)) / max(1.0, float(np.max(np.abs(ref[ok]), initial=0.0)))


def _setup(path):
    ckpt = rnnconvert.load(path)
    full = keras_whole.read_full_model(ckpt)
    g = keras_graph.build(full.config, full.weights, ckpt)
    tfm = keras_whole.source_model(str(path), full.config)
    return g, full, tfm


def _inputs(g, full, tfm, steps):
    """``make_inputs`` at ``steps`` (rows: none, end, front + inside padding) and a fourth row all padding."""
    xs = keras_whole.make_inputs(tfm, full.config, 0, steps)
    out = {}
    for name, shape, _, emb in g.inputs:
        x = np.asarray(xs[name])
        pad = np.zeros_like(x[:1])  # token 0 (mask_zero) / the Masking value (0.0 in every fixture here)
        out[name] = np.concatenate([x, pad if x.ndim > 1 and shape[0] is None or emb is not None else x[:1]])
    return out


def _ref(tfm, xs, g):
    y = tfm.predict_on_batch([xs[n] for n, *_ in g.inputs] if len(g.inputs) > 1 else xs[g.inputs[0][0]])
    return [np.asarray(v) for v in (y if isinstance(y, list) else [y])]


def _args(g, xs):
    return [torch.from_numpy(np.asarray(xs[n]).astype(np.int32 if e is not None else np.float32))
            for n, _, _, e in g.inputs]


@pytest.mark.parametrize("path", MASKED, ids=lambda p: p.stem)
def test_pt2_any_padding_other_length_matches_tf_keras(path, tmp_path):
    """Every masked fixture as a ``.pt2`` program, saved and loaded, at a length no fixture was made at, padded
    at the end, the front, inside and everywhere: tf_keras' outputs."""
    g, full, tfm = _setup(path)
    torch.export.save(pt2_write.export(g), str(tmp_path / "p.pt2"))
    prog = torch.export.load(str(tmp_path / "p.pt2")).module()
    steps = STEPS if all(shape[0] is None for _, shape, _, _ in g.inputs) else None
    xs = _inputs(g, full, tfm, steps or 9)
    with torch.no_grad():
        got = prog(*_args(g, xs))
    for i, (y, r) in enumerate(zip(got, _ref(tfm, xs, g))):
        assert _err(y.numpy(), r) <= TOL, (path.stem, i)


def test_pt2_declared_time_axis_is_free(tmp_path):
    """``whole_masked_stack`` declares 7 steps (``Input((7, 5))``); its program runs 31 and 5 steps with tf_keras'
    outputs at those lengths, and the write note says the time axis is free."""
    path = FIX / "keras_whole" / "whole_masked_stack.h5"
    g, full, _ = _setup(path)
    (name, shape, _, _), = g.inputs
    assert shape[0] is not None
    # the oracle: tf_keras building the same config with the time axis undeclared (its Sequential input_spec refuses
    # other lengths), the file's weights loaded by tf_keras
    config = json.loads(json.dumps(full.config))
    for layer in config["config"]["layers"]:
        if "batch_input_shape" in layer.get("config", {}):
            layer["config"]["batch_input_shape"][1] = None
    tfm = keras_whole.source_model(str(path), config)
    ep = pt2_write.export(g)
    assert pt2_write.free_dims(ep) == [[True, True, False]]
    assert f"'{name}' (B, T, {shape[1]})" in pt2_write.dims_note(g, ep)
    torch.export.save(ep, str(tmp_path / "p.pt2"))
    prog = torch.export.load(str(tmp_path / "p.pt2")).module()
    rng = np.random.default_rng(3)
    for steps in (31, 5):
        x = rng.standard_normal((3, steps, shape[1])).astype(np.float32)
        x[1, steps - 2:] = 0.0
        x[2, :2] = 0.0
        with torch.no_grad():
            (y,) = prog(torch.from_numpy(x))
        assert _err(y.numpy(), tfm.predict_on_batch(x)) <= TOL, steps


def test_pt2_exact_lstm_is_torch_kernel_with_free_time():
    """A masked Bidirectional sigmoid/tanh LSTM runs as ``aten.mkldnn_rnn_layer`` (no per-step loop for it); the
    time dimension of the program stays symbolic."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN: the scan form is used")
    g, _, _ = _setup(FIX / "whole_masks" / "masks_bidir.h5")
    ep = pt2_write.export(g)
    ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any("mkldnn_rnn_layer" in o for o in ops)
    assert pt2_write.free_dims(ep) == [[True, True]]


def test_pt2_keras_only_cell_is_one_scan_for_both_directions():
    """A reset-before GRU (torch.nn cannot compute it) in a Bidirectional: one scan for both directions."""
    g, _, _ = _setup(FIX / "whole_masks" / "masks_bidir.h5")
    ep = pt2_write.export(g)
    scans = [n for n in ep.graph.nodes if n.op == "call_function" and "scan" in str(n.target)]
    rnns = [n for n in g.nodes if n.layer is not None]
    native = [n for n in rnns if pt2_write.native_lstm(n.layer)]
    assert len(scans) == len(rnns) - len(native)


@pytest.mark.parametrize("path", MASKED, ids=lambda p: p.stem)
def test_emitted_module_any_padding_other_length_matches_tf_keras(path, tmp_path):
    """The emitted module (source written, imported from its file, state dict loaded) on the same inputs:
    tf_keras' outputs; exact LSTM/GRU/RNN layers are torch.nn modules even under a mask."""
    g, full, tfm = _setup(path)
    em = module_write.emit(g, path.name, "m", "m_state.pt")
    (tmp_path / "m.py").write_text(em.source)
    (tmp_path / "m_state.pt").write_bytes(module_write.state_bytes(em.state))
    m = torch_export.load_module(tmp_path / "m.py", tmp_path / "m_state.pt")
    steps = STEPS if all(shape[0] is None for _, shape, _, _ in g.inputs) else None
    xs = _inputs(g, full, tfm, steps or 9)
    with torch.no_grad():
        got = m(*_args(g, xs))
    got = got if isinstance(got, tuple) else (got,)
    for i, (y, r) in enumerate(zip(got, _ref(tfm, xs, g))):
        assert _err(y.numpy(), r) <= TOL, (path.stem, i)
    exact = [n for n in g.nodes if n.layer is not None and n.masks and n.masks[0] is not None
             and pt2_write.native_lstm(n.layer)]
    if exact:
        assert "masked_run(self." in em.source and "nn.LSTM(" in em.source


def test_pt2_write_states_the_input_dims(tmp_path):
    """The conversion's note and the file itself (``extra_files``) say the declared time axis is free."""
    rep = rnnconvert.convert(FIX / "keras_whole" / "whole_masked_stack.h5", tmp_path / "m.pt2", verify=None)
    assert any("'feats' (B, T, 5)" in n for n in rep.modules), rep.modules  # the writer's lines
    xf = {"rnnconvert_inputs.txt": ""}
    torch.export.load(str(tmp_path / "m.pt2"), extra_files=xf)
    assert "'feats' (B, T, 5)" in xf["rnnconvert_inputs.txt"]
