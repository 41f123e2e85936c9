"""The ONNX reader follows recurrent nodes into control-flow subgraphs and folds shape-only operations of
constants (``Slice``/``Concat``/``Unsqueeze``/...: how a torch ``nn.LSTMCell`` exported inside an ``If`` computes
its ``W``). An attacker's file must not turn that into unbounded work: a DAG of ``Concat`` nodes each doubling
the last (2^40 elements from a few bytes) stops at the ``expansion`` budget before anything large is computed;
subgraphs nested 20 deep (protobuf itself stops near 25) stop at 16 levels; both with one clear line (a ``FormatError``, exit 2 or 3), no
traceback. The files are hostile by construction, so they are built with ``onnx.helper``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.errors import BudgetError, FormatError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _lstm(w: str, H: int = 2, I: int = 3):
    r = numpy_helper.from_array(np.ones((1, 4 * H, H), np.float32), "R")
    return helper.make_node("LSTM", ["X", w, "R"], ["Y"], hidden_size=H), r


def _save(tmp_path, nodes, inits, name="m.onnx"):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    p = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    return p


def test_a_doubling_concat_dag_stops_at_the_budget(tmp_path):
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(40)]
    nodes.append(helper.make_node("Reshape", ["c40", "shape"], ["W"]))
    lstm, r = _lstm("W")
    p = _save(tmp_path, nodes + [lstm], [numpy_helper.from_array(np.ones((1,), np.float32), "c0"),
                                         numpy_helper.from_array(np.array([1, 8, 3], np.int64), "shape"), r])
    with pytest.raises(BudgetError, match="expansion"):
        api.load(p)


def test_subgraphs_nested_too_deep_are_refused(tmp_path):
    lstm, r = _lstm("W")
    inner = helper.make_graph([lstm], "b", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((1, 8, 3), np.float32), "W"), r])
    for k in range(20):  # the else branch a constant: two copies of inner per level would double the file
        out = f"Y{k}" if k < 19 else "Y"
        other = helper.make_graph([helper.make_node("Constant", [], [f"E{k}"], value=numpy_helper.from_array(
            np.zeros((1,), np.float32)))], f"e{k}", [], [helper.make_tensor_value_info(f"E{k}", TensorProto.FLOAT, None)])
        node = helper.make_node("If", ["cond"], [out], then_branch=inner, else_branch=other)
        inner = helper.make_graph([node], f"b{k}", [], [helper.make_tensor_value_info(node.output[0],
                                                                                      TensorProto.FLOAT, None)])
    g = helper.make_graph(list(inner.node), "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    p = tmp_path / "deep.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(FormatError, match="nested deeper than 16"):
        api.load(p)
    out = subprocess.run([sys.executable, "-m", "rnnconvert", str(p), str(tmp_path / "o.pt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (2, 3) and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "o.pt").exists()


def test_a_folded_weight_reads_as_its_nodes_compute_it(tmp_path):
    """``W`` = Unsqueeze(Concat(Slice(w), Slice(w))) of a stored ``(8, 3)`` matrix: onnxruntime runs the graph
    (the oracle), and the canonical layer read back gives the same output in torch."""
    ort = pytest.importorskip("onnxruntime")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    consts = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([4], np.int64), "four"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([8], np.int64), "eight"),
              numpy_helper.from_array(np.array([0], np.int64), "axis0"),
              numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "R")]
    nodes = [helper.make_node("Slice", ["w", "four", "eight"], ["hi"]),
             helper.make_node("Slice", ["w", "zero", "four"], ["lo"]),
             helper.make_node("Concat", ["hi", "lo"], ["cat"], axis=0),
             helper.make_node("Unsqueeze", ["cat", "axis0"], ["W"]),
             helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=2)]
    p = _save(tmp_path, nodes, consts)
    x = rng.standard_normal((5, 1, 3)).astype(np.float32)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(["Y"], {"X": x})[0][:, 0]
    api.convert(p, tmp_path / "o.pt")
    sd = torch.load(tmp_path / "o.pt", weights_only=True)
    lstm = torch.nn.LSTM(3, 2, bias=False)
    lstm.load_state_dict({k.split(".", 1)[1]: v for k, v in sd.items()})
    with torch.no_grad():
        got = lstm(torch.from_numpy(x))[0].numpy()
    assert np.abs(got - want).max() < 1e-5
