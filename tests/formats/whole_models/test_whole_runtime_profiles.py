"""The ``tensorrt`` runtime profile of the whole-model ONNX graph (issue #41): which recurrent nodes
stay native, and that the graphs compute tf_keras' outputs.

Oracle: tf_keras 2.21's outputs stored with each fixture (``fixtures/gen_keras_whole.py``, ``gen_whole_masks.py``,
``gen_whole_free_axis.py``: Keras 2 hard_sigmoid / reset-before GRUs, hard_sigmoid LSTMs, masks padded anywhere,
Bidirectional, go_backwards). The target is onnxruntime on the written graph: TensorRT cannot run here (no GPU), so
TensorRT itself never checked these graphs; its part is the op list (every op in onnx-tensorrt's
``docs/operators.md`` matrix, TensorRT 8.4+). Tolerance ``2e-5 * max(1, max|ref|)`` as ``test_whole_runtime_openvino.py`` (the Scans'
float32 spread against tf_keras measured there: about 1.3e-7 relative).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from conftest import ort_run, whole_close, whole_graph  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
ONE = ["keras_whole/whole_embed_conv_bilstm.h5", "whole_masks/masks_gru_stack.h5", "whole_masks/masks_bidir.h5",
       "whole_masks/masks_masking_backwards.h5"]
#: onnx-tensorrt docs/operators.md (TensorRT 8.4, op set 13; later matrices keep these): the ops marked Y that
#: rnnconvert's whole-model graphs use
TENSORRT_OPS = {
    "Add", "And", "Cast", "Clip", "Concat", "Conv", "Div", "Equal", "Expand", "Flatten", "Gather", "GatherElements",
    "GatherND", "Gemm", "GreaterOrEqual", "Greater", "GRU", "HardSigmoid", "Identity", "Less", "LessOrEqual", "LSTM",
    "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "Not", "Or", "Pad", "Range", "ReduceMax", "ReduceMean",
    "ReduceSum", "ReduceProd", "Relu", "Reshape", "RNN", "Scan", "ScatterElements", "ScatterND", "Shape",
    "Sigmoid", "Slice", "Softmax", "Softplus", "Softsign", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh",
    "Tile", "Transpose", "Unsqueeze", "Where", "CumSum", "Concat", "ConstantOfShape", "AveragePool", "Elu",
    "LeakyRelu", "Selu", "Exp", "TopK", "ArgMax", "Constant"}


def _ops(graph) -> set[str]:
    out = set()
    for n in graph.node:
        out.add(n.op_type)
        for a in n.attribute:
            if a.g is not None and a.g.node:
                out |= _ops(a.g)
    return out


def _build(path, runtime):
    from rnnconvert.whole.formats.onnx import model_write

    g = whole_graph(FIX / path)
    return g, model_write.build(g, runtime=runtime)


@pytest.mark.parametrize("runtime", ["tensorrt"])
@pytest.mark.parametrize("path", ONE)
def test_profile_matches_tf_keras(path, runtime):
    """The profile's graph on onnxruntime: tf_keras' outputs (padding anywhere, hard_sigmoid gates, both
    directions)."""
    g, model = _build(path, runtime)
    z = np.load((FIX / path).with_suffix(".npz"))
    got = ort_run(model, {n: z[f"in__{n}"] for n, *_ in g.inputs}, [f"output_{i}" for i in range(len(g.outputs))])
    for i, y in enumerate(got):
        assert whole_close(y, z[f"out__{i}"]), (path, runtime, i)


@pytest.mark.parametrize("path", ONE)
def test_tensorrt_profile_nodes(path):
    """``tensorrt``: no recurrent node keeps HardSigmoid (or another activation but Sigmoid/Tanh/Relu), and every op,
    inside the Scans too, is in onnx-tensorrt's supported matrix."""
    _, model = _build(path, "tensorrt")
    for n in model.graph.node:
        if n.op_type in ("LSTM", "GRU", "RNN"):
            acts = next(a.strings for a in n.attribute if a.name == "activations")
            assert {s.decode() for s in acts} <= {"Sigmoid", "Tanh", "Relu"}, (path, n.name)
    assert _ops(model.graph) <= TENSORRT_OPS, _ops(model.graph) - TENSORRT_OPS


def test_no_onnx2tf_profile():
    """No ``onnx2tf`` profile (profiles.py: onnx2tf 1.29.24 converted none of the forms tried correctly): one line,
    exit 2's OptionError, naming the profiles there are."""
    from rnnconvert.errors import OptionError
    from rnnconvert.whole.formats.onnx import profiles

    with pytest.raises(OptionError, match="tensorrt"):
        profiles.profile("onnx2tf")


def test_default_profile_keeps_native_nodes_and_names_tensorrt():
    """The default graph of a hard_sigmoid model keeps native nodes, and its notes name TensorRT's rejection and the
    profile that avoids it."""
    from rnnconvert.whole.formats.onnx import model_write

    g, model = _build("keras_whole/whole_embed_conv_bilstm.h5", None)
    assert _ops(model.graph) & {"LSTM", "GRU", "RNN"}
    assert any("TensorRT" in line and "--runtime tensorrt" in line for line in model_write.notes(g))
