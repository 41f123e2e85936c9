"""Whole Keras models to one ONNX graph and a torch.export ``.pt2`` program (issue #30).

Oracles: tf_keras 2.21 (``fixtures/gen_keras_whole.py`` made every fixture and its outputs ``out__<i>`` on
``in__<name>``), TensorFlow running Mycroft's own frozen graph (``fixtures/realworld/mycroft-precise-gru/
oracle_out.npz`` ``model_out``, made by ``oracle.py``); the targets are onnxruntime on the written graph and
torch on the loaded program. Tolerance: ``2e-5 * max(1, max|ref|)`` (issue #17/#30).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.errors import UnsupportedError  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

from conftest import ort_run as _ort, whole_close as _close, whole_feeds, whole_graph as _graph  # noqa: E402
from conftest import assert_whole_outputs, whole_mutated_check, whole_onnx_outputs, whole_pt2_program  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
WHOLE = sorted((FIX / "keras_whole").glob("whole_*.h5")) + sorted((FIX / "whole_graph").glob("whole30_*.h5"))
#: issue #30's fixtures (fixtures/gen_whole_graph.py): every layer class the writers build
WHOLE30 = sorted((FIX / "whole_graph").glob("whole30_*.h5"))
MYCROFT = FIX / "realworld" / "mycroft-precise-gru"


def _feeds(g, z):
    return whole_feeds(g, z, first_if_unnamed=True)


@pytest.mark.parametrize("path", WHOLE, ids=lambda p: p.stem)
def test_onnx_graph_matches_tf_keras(path):
    """Every whole fixture as one ONNX graph, run by onnxruntime, gives tf_keras' outputs (oracle npz)."""
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    assert_whole_outputs(whole_onnx_outputs(g, _feeds(g, z)), z, path.name)


def test_onnx_recurrent_layers_are_native_nodes():
    """No Loop/Scan: the recurrent layers are ONNX LSTM/GRU/RNN nodes (hard_sigmoid, reset-before included)."""
    ops = [n.op_type for n in model_write.build(_graph(FIX / "keras_whole" / "whole_embed_conv_bilstm.h5")).graph.node]
    assert "LSTM" in ops and "GRU" in ops and "Loop" not in ops and "Scan" not in ops


def test_mycroft_onnx_and_pt2_reproduce_model_out(tmp_path):
    """hey-mycroft.net (Keras 2.1.4: GRU linear activation, hard_sigmoid, reset-before -> Dense sigmoid) through
    the CLI path with default verification, then run by onnxruntime and torch: ``model_out`` of the frozen-graph
    oracle."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("tf_keras")
    z = np.load(MYCROFT / "oracle_out.npz")
    rep = rnnconvert.convert(MYCROFT / "hey-mycroft.net", tmp_path / "m.onnx")
    assert any(c.name == "model output 0" and c.ok for c in rep.verification.layers)
    (y,) = _ort(__import__("onnx").load(str(tmp_path / "m.onnx")), {"net_input": z["x"]}, ["output_0"])
    assert _close(y, z["model_out"])
    rep = rnnconvert.convert(MYCROFT / "hey-mycroft.net", tmp_path / "m.pt2")
    assert [c.name for c in rep.verification.layers] == ["model output 0"] and rep.verification.ok
    (y,) = torch.export.load(str(tmp_path / "m.pt2")).module()(torch.from_numpy(z["x"]))
    assert _close(y.detach().numpy(), z["model_out"])


def test_pt2_follows_masks_and_runs_other_lengths(tmp_path):
    """The .pt2 program of a masked reset-before GRU stack: tf_keras' outputs on the oracle inputs, and a
    batch/time of other sizes runs (dynamic dimensions)."""
    torch = pytest.importorskip("torch")
    from rnnconvert.whole.formats.torch import pt2_write

    path = FIX / "keras_whole" / "whole_masked_gru_actreg.h5"
    g = _graph(path)
    torch.export.save(pt2_write.export(g), str(tmp_path / "p.pt2"))
    prog = torch.export.load(str(tmp_path / "p.pt2")).module()
    z = np.load(path.with_suffix(".npz"))
    (y,) = prog(*[torch.from_numpy(v) for v in _feeds(g, z).values()])
    assert _close(y.detach().numpy(), z["out__0"])
    assert prog(torch.zeros(1, 7, 5))[0].shape == (1, 2)
    # leading padding and a gap (which ONNX sequence_lens cannot express): the program follows tf_keras
    pytest.importorskip("tf_keras")
    x = _feeds(g, z)["feats"].copy()
    x[0, :2] = 0.0
    x[2, 3] = 0.0
    ref = keras_whole.source_model(str(path), keras_whole.read_full_model(rnnconvert.load(path)).config)(x)
    assert _close(prog(torch.from_numpy(x))[0].detach().numpy(), np.asarray(ref))


@pytest.mark.parametrize("path", WHOLE30, ids=lambda p: p.stem)
def test_pt2_program_matches_tf_keras(path, tmp_path):
    """issue #30's fixtures (masked Bidirectional 'ave', masked mean pooling, go_backwards, every pooling,
    normalisation, merge and reshaping layer) as .pt2 programs, loaded and run by torch: tf_keras' outputs."""
    torch = pytest.importorskip("torch")
    g = _graph(path)
    prog = whole_pt2_program(g, tmp_path)
    z = np.load(path.with_suffix(".npz"))
    assert_whole_outputs(prog(*[torch.from_numpy(v) for v in _feeds(g, z).values()]), z, path.name)


def test_pt2_carries_cells_torch_nn_cannot(tmp_path):
    """A TF1 LSTMCell with peepholes, cell_clip and forget_bias (refused as .pt) as a .pt2 program of the
    recurrent layers: TensorFlow's own outputs (fixtures/tf/lstm_peep_clip.npz, made by gen_tf.py)."""
    torch = pytest.importorskip("torch")
    rep = rnnconvert.convert(FIX / "tf" / "lstm_peep_clip" / "ckpt", tmp_path / "c.pt2",
                             read_opts={"cell_clip": 0.3, "forget_bias": 0.5})
    assert rep.verification.ok
    z = np.load(FIX / "tf" / "lstm_peep_clip.npz")
    (y,) = torch.export.load(str(tmp_path / "c.pt2")).module()(torch.from_numpy(z["x"]))
    assert _close(y.detach().numpy(), z["enc__out"])


def test_lambda_refused_by_name():
    with pytest.raises(UnsupportedError) as e:
        _graph(FIX / "keras_whole" / "refuse_lambda.h5")
    assert "'double' (Lambda)" in str(e.value) and "recurrent_only" in str(e.value)


def test_recurrent_only_keeps_the_layer_graph(tmp_path):
    rnnconvert.convert(MYCROFT / "hey-mycroft.net", tmp_path / "r.onnx", verify=None,
                       write_opts={"recurrent_only": True})
    import onnx

    assert [i.name for i in onnx.load(str(tmp_path / "r.onnx")).graph.input] == ["net__in"]


def test_weights_only_file_keeps_the_recurrent_layers(tmp_path):
    """A weights-only Keras file holds no architecture: the recurrent layers, with the note saying why."""
    rep = rnnconvert.convert(FIX / "keras" / "lstm_weights.h5", tmp_path / "w.onnx", verify=None)
    assert any(n.startswith("weights-only Keras file") for n in rep.notes)
    import onnx

    assert [i.name for i in onnx.load(str(tmp_path / "w.onnx")).graph.input] == \
        [f"{layer.name}__in" for layer in rnnconvert.load(FIX / "keras" / "lstm_weights.h5").layers]


# ----------------------------------------------------------------------------- mutations: the check must FAIL
def _mutated_check(tmp_path, path, mutate):
    """compare_whole (tf_keras vs onnxruntime) on a written graph after ``mutate(model)``."""
    return whole_mutated_check(path, mutate, cast=True)


def _init(model, name):
    return next(t for t in model.graph.initializer if t.name == name)


def _set(t, fn):
    from onnx import numpy_helper

    t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), t.name))


@pytest.mark.parametrize("kind", ["swap_gates", "dense_bias", "drop_mask", "conv_padding"])
def test_mutations_fail(tmp_path, kind):
    pytest.importorskip("tf_keras")
    if kind == "swap_gates":  # LSTM W rows: gate blocks 0 and 1 swapped
        path = FIX / "keras_whole" / "whole_masked_stack.h5"

        def mutate(m):
            def swap(a):
                H = a.shape[1] // 4
                a[:, :H], a[:, H:2 * H] = a[:, H:2 * H].copy(), a[:, :H].copy()
                return a
            _set(_init(m, "lstm.W"), swap)
    elif kind == "dense_bias":
        path = FIX / "keras_whole" / "whole_masked_stack.h5"

        def mutate(m):
            _set(next(t for t in m.graph.initializer if t.name.startswith("dense.bias")),
                 lambda a: a + np.float32(1e-3))
    elif kind == "drop_mask":  # the recurrent nodes lose sequence_lens
        path = FIX / "keras_whole" / "whole_masked_stack.h5"

        def mutate(m):
            for n in m.graph.node:
                if n.op_type in ("GRU", "LSTM") and len(n.input) > 4:
                    n.input[4] = ""
    else:  # Conv1D "same" (pads 1, 1) written with both zero pads at the start (causal)
        path = FIX / "keras_whole" / "whole_embed_conv_bilstm.h5"

        def mutate(m):
            from onnx import helper

            for n in m.graph.node:
                if n.op_type == "Conv":
                    keep = [a for a in n.attribute if a.name not in ("auto_pad", "pads")]
                    del n.attribute[:]
                    n.attribute.extend(keep + [helper.make_attribute("pads", [2, 0])])
    checks = _mutated_check(tmp_path, path, mutate)
    assert any(c.verdict == "fail" for c in checks), [(c.name, c.max_abs_err) for c in checks]
