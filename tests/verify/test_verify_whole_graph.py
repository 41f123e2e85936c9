"""`rnnconvert verify SRC DST` runs the written whole-model graph as a user will (issue #39): every node, the wiring,
the masks (`sequence_lens`) and the outputs the source exposes, with the model's integer token input.

Oracle: tf_keras' own outputs of the source model, stored by fixtures/gen_whole_graph.py
(`fixtures/whole_graph/whole30_masked_bidir.npz`, `out__0` on `in__tokens`). Each hand edit of the written ONNX
graph (made with the `onnx` library, never with rnnconvert's writer) is run by onnxruntime on the fixture's inputs and
its true error measured against that stored output; every edit whose true error is above 10x the correct file's and
above 2e-5 of the output scale must FAIL `verify`, and the correct file must be `ok`."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tf_keras")

from rnnconvert import api  # noqa: E402

SRC = FIXTURES / "whole_graph" / "whole30_masked_bidir.h5"
ORACLE = FIXTURES / "whole_graph" / "whole30_masked_bidir.npz"


def _nodes(model, op):
    return [n for n in model.graph.node if n.op_type == op]


def _drop_lens(model):
    """The masks dropped: every recurrent node's `sequence_lens` input blanked (runs every padded step)."""
    for n in model.graph.node:
        if n.op_type in ("LSTM", "GRU", "RNN") and len(n.input) > 4:
            n.input[4] = ""


def _y_last_for_y_h(model):
    """The simple RNN's last output taken from `Y[-1]` (the padded last step) instead of `Y_h`."""
    rnn = _nodes(model, "RNN")[0]
    y, y_h = rnn.output[0], rnn.output[1]
    idx = onnx.helper.make_tensor("edit_last", onnx.TensorProto.INT64, [], [-1])
    model.graph.initializer.append(idx)
    gather = onnx.helper.make_node("Gather", [y, "edit_last"], ["edit_y_last"], axis=0)
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            if name == y_h:
                n.input[i] = "edit_y_last"
    model.graph.node.insert(list(model.graph.node).index(rnn) + 1, gather)


def _concat_swapped(model):
    """The Concatenate layer's inputs in the other order (same width: the head still runs)."""
    cat = _nodes(model, "Concat")[0]
    a, b = cat.input[0], cat.input[1]
    cat.input[0], cat.input[1] = b, a


def _gru_time_reversed(model):
    """The GRU's output sequence read in the other time order (its `Y` reversed along time: a backward layer's
    output reversed twice)."""
    gru = _nodes(model, "GRU")[0]
    y = gru.output[0]
    for name, vals in (("edit_starts", [-1]), ("edit_ends", [-(2 ** 62)]), ("edit_axes", [0]), ("edit_steps", [-1])):
        model.graph.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [1], vals))
    rev = onnx.helper.make_node("Slice", [y, "edit_starts", "edit_ends", "edit_axes", "edit_steps"], ["edit_y_rev"])
    for n in model.graph.node:
        if n is not gru:
            for i, name in enumerate(n.input):
                if name == y:
                    n.input[i] = "edit_y_rev"
    model.graph.node.insert(list(model.graph.node).index(gru) + 1, rev)


EDITS = {"sequence_lens dropped": _drop_lens, "Y[-1] for Y_h": _y_last_for_y_h,
         "concatenation order": _concat_swapped, "GRU output time-reversed": _gru_time_reversed}


def _true_error(path) -> float:
    z = np.load(ORACLE)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = sess.run(["output_0"], {"tokens": z["in__tokens"].astype(np.int32)})[0]
    return float(np.max(np.abs(np.asarray(y, np.float64) - z["out__0"].astype(np.float64))))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole_graph") / "model.onnx"
    assert api.convert(SRC, out).verification.ok
    return out


def test_correct_graph_is_ok_with_token_inputs(written):
    """`verify` of the correct whole-model ONNX runs the whole graph (the `model output` checks are there) and
    accepts the model's integer token ids as `--inputs`."""
    z = np.load(ORACLE)
    rep = api.verify(SRC, written, inputs={"tokens": z["in__tokens"]})
    assert rep.ok, [(c.name, c.verdict, c.reason) for c in rep.layers]
    assert any(c.name == "model output 0" for c in rep.layers)


@pytest.mark.parametrize("what", list(EDITS))
def test_graph_edit_fails(written, tmp_path, what):
    model = onnx.load(str(written))
    EDITS[what](model)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    scale = float(np.max(np.abs(np.load(ORACLE)["out__0"])))
    good_err, bad_err = _true_error(written), _true_error(bad)
    if not (bad_err > 10 * good_err and bad_err > 2e-5 * max(1.0, scale)):
        pytest.skip(f"{what}: true error {bad_err:.3g} is within the promise (correct file {good_err:.3g})")
    rep = api.verify(SRC, bad)
    assert rep.failed, (what, bad_err, [(c.name, c.verdict, c.max_abs_err) for c in rep.layers])
