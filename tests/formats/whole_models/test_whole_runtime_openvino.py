"""The ``openvino`` runtime profile of the whole-model ONNX graph (issue #41): recurrent nodes as Scans of
elementwise ops (:mod:`rnnconvert.whole.formats.onnx.scan_cells`), which OpenVINO compiles and computes as tf_keras
does, where the default graph's native nodes with hard_sigmoid gates are refused at ``compile_model``.

Oracle: tf_keras 2.21's outputs stored with each fixture (``fixtures/gen_whole_masks.py``, ``gen_keras_whole.py``,
``gen_whole_states.py``, ``gen_whole_free_axis.py``: masks padded at the end, front and inside; Keras 2's
``GRU(reset_after=False, recurrent_activation='hard_sigmoid')``, hard_sigmoid LSTMs, ``linear`` SimpleRNN,
softsign LSTM, go_backwards, Bidirectional, return_state / initial_state); the target is OpenVINO itself
(``openvino.Core().compile_model`` on the written ONNX, CPU, ``INFERENCE_PRECISION_HINT`` f32: a CPU plugin may
otherwise run in bf16). Tolerance ``2e-5 * max(1, max|ref|)``, the project's float32 tolerance for whole graphs
(``tests/formats/whole_models/test_whole_masks.py``): the float32 spread measured here between tf_keras and OpenVINO (and
onnxruntime) on these fixtures is at most about 1.3e-7 relative, two orders of magnitude below it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ov = pytest.importorskip("openvino")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write, profiles  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
TOL = 2e-5
#: fixtures with one stored length (``in__<name>`` / ``out__<i>``)
ONE = ["keras_whole/whole_embed_conv_bilstm.h5", "keras_whole/whole_masked_stack.h5", "keras_whole/whole_multi_io.h5",
       "whole_masks/masks_gru_stack.h5", "whole_masks/masks_bidir.h5", "whole_masks/masks_masking_backwards.h5",
       "whole_masks/masks_states.h5", "whole_states/whole_states_lstm_seq2seq.h5", "whole_graph/whole30_layer_zoo.h5"]
#: fixtures stored at several lengths (``in__<name>__<n>`` / ``out__<i>__<n>``)
MANY = ["whole_free_axis/free_conv_stack.h5", "whole_free_axis/free_masked_backwards.h5",
        "whole_free_axis/free_embed_gru.h5"]
HARD = FIX / "keras_whole" / "whole_embed_conv_bilstm.h5"


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    """Fixtures read in this process (``RNNCONVERT_ISOLATE=0``), as ``tests/formats/whole_models/test_whole_states.py``; the
    forked reader is tested by tests/security."""
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _graph(path):
    ckpt = rnnconvert.load(path)
    full = keras_whole.read_full_model(ckpt)
    return keras_graph.build(full.config, full.weights, ckpt)


def _compile(model):
    core = ov.Core()
    return core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                              {"INFERENCE_PRECISION_HINT": "f32"})


def _run(compiled, g, feeds):
    res = compiled({k: np.asarray(v).astype(model_write.input_dtype(g, k)) for k, v in feeds.items()})
    return [res[compiled.output(f"output_{i}")] for i in range(len(g.outputs))]


def _err(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) / max(1.0, float(np.max(np.abs(ref))))


@pytest.mark.parametrize("name", ONE, ids=lambda p: Path(p).stem)
def test_openvino_matches_tf_keras(name):
    path = FIX / name
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    model = model_write.build(g, runtime="openvino")
    assert not {n.op_type for n in model.graph.node} & {"LSTM", "GRU", "RNN"}
    ys = _run(_compile(model), g, {n: z[f"in__{n}"] for n, *_ in g.inputs})
    for i, y in enumerate(ys):
        assert _err(y, z[f"out__{i}"]) <= TOL, (name, i)


@pytest.mark.parametrize("name", MANY, ids=lambda p: Path(p).stem)
def test_openvino_matches_tf_keras_at_other_lengths(name):
    """One compiled model, the declared, a shorter and a longer length (the free time axis)."""
    path = FIX / name
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    compiled = _compile(model_write.build(g, runtime="openvino"))
    for n in [int(k) for k in z["lengths"]]:
        for i, y in enumerate(_run(compiled, g, {m: z[f"in__{m}__{n}"] for m, *_ in g.inputs})):
            assert _err(y, z[f"out__{i}__{n}"]) <= TOL, (name, n, i)


def test_default_graph_is_refused_by_openvino_and_the_note_says_so():
    """Why the profile exists: the default graph of a hard_sigmoid reset-before GRU model does not compile in
    OpenVINO; its conversion notes warn, naming OpenVINO and TensorRT's issue."""
    g = _graph(HARD)
    with pytest.raises(Exception, match="Unsupported activation function"):
        _compile(model_write.build(g))
    notes = " ".join(model_write.notes(g))
    assert "HardSigmoid" in notes and "OpenVINO" in notes and "NVIDIA/TensorRT#1417" in notes
    assert "written as Scans" in " ".join(model_write.notes(g, runtime="openvino"))


def test_profile_graph_runs_in_onnxruntime_and_says_its_runtime(tmp_path):
    """``rnnconvert.convert`` with the write option ``runtime='openvino'``: the conversion's own check (onnxruntime
    on the Scans against tf_keras) passes, the metadata names the runtime and the layers written as Scans."""
    import onnx

    rep = rnnconvert.convert(HARD, tmp_path / "ov.onnx", write_opts={"runtime": "openvino"})
    assert rep.verification.ok and any("runtime profile 'openvino'" in n for n in rep.notes)
    meta = json.loads({p.key: p.value for p in onnx.load(str(tmp_path / "ov.onnx")).metadata_props}[
        model_write.META_KEY])
    assert meta["runtime"] == "openvino" and set(meta["scans"]) == {"bilstm", "gru"}


def test_cli_runtime_option(tmp_path):
    """``--runtime openvino`` writes the profile (OpenVINO compiles the file); an unknown runtime is one line and
    exit 2 (OptionError), nothing written."""
    import onnx

    dst = tmp_path / "x.onnx"
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "convert", str(FIX / "whole_masks/masks_gru_stack.h5"),
                        str(dst), "--runtime", "openvino", "--no-verify"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "RNNCONVERT_ISOLATE": "0"})
    assert r.returncode == 0, r.stderr
    assert "GRU" not in {n.op_type for n in onnx.load(str(dst)).graph.node}
    core = ov.Core()
    core.compile_model(core.read_model(str(dst)), "CPU")
    bad = tmp_path / "y.onnx"
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "convert", str(FIX / "whole_masks/masks_gru_stack.h5"),
                        str(bad), "--runtime", "coreml", "--no-verify"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "runtime" in r.stderr and "Traceback" not in r.stderr and not bad.exists()
    assert all(rt in r.stderr for rt in profiles.RUNTIMES)


@pytest.mark.parametrize("name", ["whole_masks/masks_gru_stack.h5", "whole_masks/masks_bidir.h5"],
                         ids=lambda p: Path(p).stem)
def test_end_layout_under_openvino(name):
    """``mask_layout='end'`` (sequence_lens alone) with the profile: the Scans' steps past each length keep the
    state and output zero as the native node's do; tf_keras' outputs on the rows padded at the end."""
    path = FIX / name
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    rows = [0, 1]
    compiled = _compile(model_write.build(g, mask_layout="end", runtime="openvino"))
    for i, y in enumerate(_run(compiled, g, {n: z[f"in__{n}"][rows] for n, *_ in g.inputs})):
        assert _err(y, z[f"out__{i}"][rows]) <= TOL, (name, i)
