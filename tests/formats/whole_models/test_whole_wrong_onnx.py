"""Whole models written as ONNX, then edited by hand (the ``onnx`` library), judged by ``verify SRC DST`` (issue #39):
every correct whole conversion of a fixtures/keras_whole model is ``ok``; each wrong graph FAILs, after its true
error was measured without rnnconvert: onnxruntime running the edited file on the fixture's inputs against the
outputs tf_keras gave on them (``fixtures/gen_keras_whole.py``: ``in__<name>`` / ``out__<i>``), more than 10x the
correct file's error and above 2e-5 of the output's scale. A chaotic model (tf_keras' own float32 and float64 runs
part by more than 1% of the output's scale, measured here with tf_keras) is ``inconclusive``, never ``fail``; and
``verify SRC DST`` gives the conversion's verdicts.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("tf_keras")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras_whole"
WHOLE = sorted(FIX.glob("whole_*.h5"))


def _whole(rep) -> dict:
    """``{check name: verdict}`` of the whole-model checks (model outputs and top-level layers)."""
    return {c.name: c.verdict for c in rep.layers if c.name.startswith("model")}


def _true_error(path: Path, src: Path) -> tuple[float, float]:
    """``(max error, output scale)`` of onnxruntime running ``path`` on the fixture's inputs against tf_keras'
    outputs (the fixture's npz), over every model output."""
    import onnxruntime as ort

    z = np.load(src.with_suffix(".npz"))
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        a = z[f"in__{i.name}"]
        feeds[i.name] = a.astype(np.int32 if i.type == "tensor(int32)" else np.float32)
    outs = sorted((o.name for o in s.get_outputs() if o.name.startswith("output_")), key=lambda n: int(n[7:]))
    got = s.run(outs, feeds)
    err = max(float(np.abs(np.asarray(y, np.float64) - z[f"out__{k}"]).max()) for k, y in enumerate(got))
    scale = max(float(np.abs(z[f"out__{k}"]).max()) for k in range(len(got)))
    return err, scale


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each fixture converted whole to ONNX, verified: ``{stem: (src, dst, conversion report)}``."""
    tmp = tmp_path_factory.mktemp("whole_onnx")
    out = {}
    for src in WHOLE:
        dst = tmp / f"{src.stem}.onnx"
        out[src.stem] = (src, dst, rnnconvert.convert(src, dst))
    return out


@pytest.mark.parametrize("src", WHOLE, ids=lambda p: p.stem)
def test_correct_whole_conversion_is_ok_and_verify_agrees(written, src):
    _, dst, rep = written[src.stem]
    conv = _whole(rep.verification)
    assert conv and set(conv.values()) == {"ok"}, conv
    again = rnnconvert.verify(src, dst)
    assert _whole(again) == conv  # verify SRC DST runs the conversion's whole-model check
    assert {c.name: c.verdict for c in again.layers} == {c.name: c.verdict for c in rep.verification.layers}


def _init(m, prefix):
    return next(t for t in m.graph.initializer if t.name.startswith(prefix))


def _dense_weight(m):  # one element of the Dense kernel x1.01 (its largest: a smaller one may move the outputs by
    from onnx import numpy_helper  # less than 2e-5 of their scale, not a slip by the measure)

    t = _init(m, "dense.kernel")
    a = numpy_helper.to_array(t).copy()
    a.flat[int(np.argmax(np.abs(a)))] *= np.float32(1.01)
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _drop_lens(m):  # the recurrent nodes lose sequence_lens (the mask)
    for n in m.graph.node:
        if n.op_type in ("GRU", "LSTM", "RNN") and len(n.input) > 4:
            n.input[4] = ""


def _y_for_y_h(m):  # the last LSTM's output taken from Y[-1] instead of Y_h
    from onnx import helper, numpy_helper

    lstm = next(n for n in m.graph.node if n.op_type == "LSTM" and n.output[1])
    last = lstm.output[0] + "__last"
    m.graph.initializer.append(numpy_helper.from_array(np.array(-1, np.int64), "s16__minus1"))
    for n in m.graph.node:
        for i, x in enumerate(n.input):
            if x == lstm.output[1]:
                n.input[i] = last
    at = list(m.graph.node).index(lstm) + 1
    m.graph.node.insert(at, helper.make_node("Gather", [lstm.output[0], "s16__minus1"], [last], axis=0))


def _concat_order(m):  # a non-recurrent layer's wiring: Concatenate's inputs exchanged
    n = next(n for n in m.graph.node if n.op_type == "Concat")
    a, b = n.input[0], n.input[1]
    n.input[0], n.input[1] = b, a


EDITS = [("whole_cudnn_stack", _dense_weight), ("whole_masked_stack", _drop_lens),
         ("whole_masked_stack", _y_for_y_h), ("whole_multi_io", _concat_order)]


@pytest.mark.parametrize("stem,edit", EDITS, ids=[e.__name__.strip("_") for _, e in EDITS])
def test_wrong_whole_graph_fails(written, tmp_path, stem, edit):
    src, good, _ = written[stem]
    base, _ = _true_error(good, src)
    m = onnx.load(str(good))
    edit(m)
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    err, scale = _true_error(bad, src)
    assert err > 10 * base and err > 2e-5 * max(1.0, scale), (err, base, scale)  # a real slip, by tf_keras
    rep = rnnconvert.verify(src, bad)
    assert "fail" in _whole(rep).values(), [(c.name, c.verdict, c.reason) for c in rep.layers]
    assert rep.verdict == "fail"


def _chaotic_model(path: Path, steps: int = 300):
    """A SimpleRNN(64) whose recurrent weights are N(0, 16/64) (gain 4: chaotic) under a Dense head, saved by
    tf_keras; returns long inputs and the largest gap between tf_keras' own float32 and float64 runs on them, with
    the output's scale."""
    import tf_keras as k

    rng = np.random.default_rng(0)
    inp = k.Input((None, 4), name="x")
    y = k.layers.Dense(2, name="head")(k.layers.SimpleRNN(64, return_sequences=True, name="srnn")(inp))
    m = k.Model(inp, y)
    w = m.get_layer("srnn").get_weights()
    w[1] = (rng.standard_normal((64, 64)) * 4 / 8).astype(np.float32)
    m.get_layer("srnn").set_weights(w)
    m.save(path)
    x = rng.standard_normal((3, steps, 4)).astype(np.float32)
    y32 = m.predict(x, verbose=0)
    m64 = k.models.model_from_json(m.to_json().replace('"float32"', '"float64"'))
    m64.set_weights([a.astype(np.float64) for a in m.get_weights()])
    y64 = m64.predict(x.astype(np.float64), verbose=0)
    return x, float(np.abs(y32 - y64).max()), float(np.abs(y64).max())


def test_chaotic_model_is_inconclusive_not_fail(tmp_path):
    src = tmp_path / "chaos.h5"
    x, gap, scale = _chaotic_model(src)
    assert gap > 0.01 * scale  # chaotic on these inputs, by tf_keras alone
    dst = tmp_path / "chaos.onnx"
    rnnconvert.convert(src, dst, verify=None)
    rep = rnnconvert.verify(src, dst, inputs={"x": x})
    whole = _whole(rep)
    assert "fail" not in whole.values() and "inconclusive" in whole.values(), whole
