"""The whole-model ONNX graph with ``states`` (issue #41, CLI ``--states``): every unidirectional recurrent layer's
initial states are graph inputs and its final states outputs, so a sequence runs in two chunks and gives the one
pass' outputs.

Oracle: tf_keras 2.21's outputs of the whole sequence in one pass, stored with the fixture
(``fixtures/gen_keras_whole.py``: ``whole_masked_stack``, Masking -> GRU -> GRU(hard_sigmoid) -> LSTM -> Dense,
row 1 padded at its end); the target is onnxruntime running the written graph on the first chunk from zero states
and on the second from the first's final states (tf_keras keeps the state over masked steps, so the chunks'
masks carry over; the split leaves every row an unmasked step in the second chunk, whose last output a
``return_sequences=False`` layer gives). Tolerance as ``tests/formats/whole_models/test_whole_masks.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
SRC = FIX / "keras_whole" / "whole_masked_stack.h5"
TOL = 2e-5


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    """Fixtures read in this process (``RNNCONVERT_ISOLATE=0``), as ``tests/formats/whole_models/test_whole_states.py``."""
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _graph(path):
    ckpt = rnnconvert.load(path)
    full = keras_whole.read_full_model(ckpt)
    return keras_graph.build(full.config, full.weights, ckpt)


def _err(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) / max(1.0, float(np.max(np.abs(ref))))


def _chunks(sess, x, split: int):
    """output_0 after running ``x`` in two chunks, the second from the first's final states."""
    ins = [i.name for i in sess.get_inputs() if i.name.startswith("state_in:")]
    feeds = {n: np.zeros((len(x), sess.get_inputs()[[i.name for i in sess.get_inputs()].index(n)].shape[-1]),
                         np.float32) for n in ins}
    outs = ["output_0"] + [n.replace("state_in:", "state_out:") for n in ins]
    first = dict(zip(outs, sess.run(outs, {"feats": x[:, :split], **feeds})))
    second = sess.run(outs, {"feats": x[:, split:], **{n: first[n.replace("state_in:", "state_out:")] for n in ins}})
    return second[0]


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_two_chunks_match_one_tf_keras_pass(runtime):
    import onnxruntime as ort

    g = _graph(SRC)
    z = np.load(SRC.with_suffix(".npz"))
    model = model_write.build(g, states=True, runtime=runtime)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    assert {"state_in:gru_a:h", "state_in:gru_b:h", "state_in:lstm:h", "state_in:lstm:c"} <= names
    x = z["in__feats"]
    assert _err(_chunks(sess, x, 3), z["out__0"]) <= TOL
    # from zero states, the first chunk alone is not the whole sequence: the states carry the difference
    zero = {n: np.zeros((len(x), sess.get_inputs()[[i.name for i in sess.get_inputs()].index(n)].shape[-1]),
                        np.float32) for n in names if n.startswith("state_in:")}
    alone = sess.run(["output_0"], {"feats": x[:, 3:], **zero})[0]
    assert _err(alone, z["out__0"]) > 10 * TOL
    meta = json.loads({p.key: p.value for p in model.metadata_props}[model_write.META_KEY])
    assert meta["state_outputs"] == [n.replace("state_in:", "state_out:") for n in meta["state_inputs"]]


def test_openvino_runs_the_chunks():
    """The ``openvino`` profile with states: OpenVINO itself, two chunks, against tf_keras' one pass."""
    ov = pytest.importorskip("openvino")
    g = _graph(SRC)
    z = np.load(SRC.with_suffix(".npz"))
    core = ov.Core()
    c = core.compile_model(core.read_model(model_write.build(g, states=True, runtime="openvino").SerializeToString(),
                                           b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = z["in__feats"]
    ins = [p.get_any_name() for p in c.inputs if p.get_any_name().startswith("state_in:")]
    sizes = {p.get_any_name(): p.get_partial_shape()[1].get_length() for p in c.inputs if p.get_any_name() in ins}
    first = c({"feats": x[:, :3], **{n: np.zeros((len(x), sizes[n]), np.float32) for n in ins}})
    carry = {n: first[c.output(n.replace("state_in:", "state_out:"))] for n in ins}
    second = c({"feats": x[:, 3:], **carry})
    assert _err(second[c.output("output_0")], z["out__0"]) <= TOL


def test_bidirectional_is_refused_by_name():
    g = _graph(FIX / "keras_whole" / "whole_embed_conv_bilstm.h5")
    with pytest.raises(rnnconvert.errors.UnsupportedError, match="'bilstm'.*Bidirectional"):
        model_write.build(g, states=True)


def test_cli_states_converts_and_verifies(tmp_path):
    """``--states``: the conversion verifies (zero states fed, as the source starts) and its note says how to run
    chunks; the written file has the state inputs and outputs."""
    import onnx

    dst = tmp_path / "s.onnx"
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "convert", str(SRC), str(dst), "--states"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "RNNCONVERT_ISOLATE": "0"})
    assert r.returncode == 0, r.stderr + r.stdout
    assert "state_in:<layer>:h" in r.stdout + r.stderr
    m = onnx.load(str(dst))
    assert "state_out:lstm:c" in [o.name for o in m.graph.output]
