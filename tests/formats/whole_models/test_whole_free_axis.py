"""A free time axis in the whole-model ONNX graph (issue #41): a Keras model declared with a fixed length runs at
shorter and longer lengths in onnxruntime and gives tf_keras' outputs at those lengths; a layer that ties the
length (Flatten before a Dense) keeps it fixed, and the note and the graph's metadata say which layer; a strided
convolution's shortest length is stated.

Oracle: tf_keras 2.21's outputs of the same layers and weights at each length (``fixtures/gen_whole_free_axis.py``:
``in__<input>__<n>`` / ``out__<i>__<n>``); the target is onnxruntime on the written graph. Tolerance as
``tests/formats/whole_models/test_whole_masks.py``: ``2e-5 * max(1, max|ref|)``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.whole.conventions import time_axis  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

from conftest import WHOLE_TOL as TOL, whole_err as _err, whole_graph as _graph  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "whole_free_axis"
FREE = sorted(FIX.glob("free_*.h5"))


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    """Fixtures read in this process (``RNNCONVERT_ISOLATE=0``), as ``tests/formats/whole_models/test_whole_states.py``: the
    forked isolated HDF5 read did not finish within 60 s here after onnxruntime sessions ran in this process.
    The forked reader is tested by tests/security; this module tests the free axis."""
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(sess, g, z, n):
    kinds = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in sess.get_inputs()}
    return sess.run([f"output_{i}" for i in range(len(g.outputs))],
                    {name: z[f"in__{name}__{n}"].astype(kinds[name]) for name, *_ in g.inputs})


def _meta(model) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}[model_write.META_KEY])


def test_fixtures_present():
    assert len(FREE) == 3 and (FIX / "fixed_flatten.h5").exists()


@pytest.mark.parametrize("path", FREE, ids=lambda p: p.stem)
def test_other_lengths_match_tf_keras(path):
    """Declared, shorter (down to the shortest a convolution allows) and longer lengths: tf_keras' outputs."""
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    lengths = [int(n) for n in z["lengths"]]
    model = model_write.build(g)
    sess = _session(model)
    name = g.inputs[0][0]
    assert sess.get_inputs()[0].shape[1] == "time"
    assert _meta(model)["time_axis"][name]["free"] is True
    for n in lengths:
        assert n != lengths[0] or n == g.inputs[0][1][0]
        for i, y in enumerate(_run(sess, g, z, n)):
            assert _err(y, z[f"out__{i}__{n}"]) <= TOL, (path.stem, n, i)
    assert min(lengths) < lengths[0] < max(lengths)


def test_strided_convolution_states_its_shortest_length():
    """Conv1D(k=3, stride 2, valid) then MaxPooling1D(2): tf_keras' shape rule gives 2 pooled inputs from 5 steps
    and fewer from 4, so the shortest length is 5 (the fixture's oracle runs at 5); note and metadata say so."""
    g = _graph(FIX / "free_conv_stack.h5")
    model = model_write.build(g)
    assert _meta(model)["time_axis"]["feats"] == {"free": True, "min_length": 5, "declared": 12}
    assert any("at least 5 steps" in n for n in model_write.notes(g))
    assert 5 in [int(n) for n in np.load(FIX / "free_conv_stack.npz")["lengths"]]


def test_flatten_keeps_the_declared_length():
    """GRU -> Flatten -> Dense: the Dense's kernel is (6*3, 2), so the graph keeps length 6 (tf_keras' outputs
    there), names the Flatten in the note and the metadata, and onnxruntime refuses another length."""
    path = FIX / "fixed_flatten.h5"
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    model = model_write.build(g)
    sess = _session(model)
    assert sess.get_inputs()[0].shape[1] == 6
    (y,) = _run(sess, g, z, 6)
    assert _err(y, z["out__0__6"]) <= TOL
    meta = _meta(model)["time_axis"]["feats"]
    assert meta["free"] is False and meta["length"] == 6 and "'flat' (Flatten)" in meta["fixed_by"]
    assert any("fixed at its declared length 6" in n and "'flat'" in n for n in model_write.notes(g))
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        sess.run(["output_0"], {"feats": np.zeros((1, 7, 3), np.float32)})


def test_length_rule_is_keras_conv_output_length():
    """:func:`time_axis.length` against tf_keras' own ``conv_utils.conv_output_length`` over lengths, kernels,
    strides, dilations and paddings."""
    conv_utils = pytest.importorskip("tf_keras.src.utils.conv_utils")
    for pad in ("valid", "same", "causal"):
        for k in (1, 2, 3, 5):
            for s in (1, 2, 3):
                for d in (1, 2):
                    for n in range(1, 30):
                        ref = conv_utils.conv_output_length(n, k, pad, s, d)
                        got = time_axis.length(n, (("conv", k, s, d, pad),))
                        assert got == (ref if ref >= 1 else None), (pad, k, s, d, n)


def test_convert_writes_a_free_axis_and_says_so(tmp_path):
    """``rnnconvert.convert`` of a model declared at 12 steps: the written file's input is free (``time``), the
    conversion verifies, and the note states the shortest length."""
    import onnx

    src = FIX / "free_conv_stack.h5"
    rep = rnnconvert.convert(src, tmp_path / "m.onnx")
    assert rep.verification.ok
    assert any("time axis free (declared 12), at least 5 steps" in n for n in rep.notes)
    m = onnx.load(str(tmp_path / "m.onnx"))
    assert m.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "time"


def test_rules_on_layer_graphs():
    """The analysis on small layer graphs (the rules of :mod:`time_axis`; its lengths are checked against tf_keras'
    shape rule above): a merge with a RepeatVector's fixed steps, a merge of a pooled and an unpooled branch, and a Permute
    moving the time axis fix the length; a Permute keeping it and a global pooling leave it free."""
    from rnnconvert.whole.conventions.keras_graph import Graph, Node

    def graph(*nodes):
        return Graph("m", [("x", (8, 4), "float32", None)], list(nodes), [nodes[-1].outputs[0]])

    def n(name, cls, ins, **conf):
        return Node(name, name, cls, conf, ins, [name + ":0"])

    rep = graph(n("g", "GlobalMaxPooling1D", ["x"]), n("r", "RepeatVector", ["g:0"], n=8),
                n("c", "Concatenate", ["x", "r:0"]))
    assert time_axis.analyse(rep)["x"].free is False and "'c' (Concatenate)" in time_axis.analyse(rep)["x"].fixed_by
    # ceil(L / 2) and floor(L / 2) steps: equal at even lengths only
    pooled = graph(n("p", "MaxPooling1D", ["x"], pool_size=2, padding="same"),
                   n("q", "AveragePooling1D", ["x"], pool_size=2, padding="valid"), n("a", "Add", ["p:0", "q:0"]))
    assert "'a' (Add) merges time axes" in time_axis.analyse(pooled)["x"].fixed_by
    assert time_axis.analyse(graph(n("t", "Permute", ["x"], dims=[2, 1])))["x"].free is False
    free = time_axis.analyse(graph(n("t", "Permute", ["x"], dims=[1, 2]), n("g", "GlobalAveragePooling1D", ["t:0"])))
    assert free["x"].free is True and free["x"].min_length == 1
