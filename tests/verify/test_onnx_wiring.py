"""Issue #39: a stacked PyTorch layer written as ONNX is compared slab by slab (each node alone, in a one-node graph),
so the graph's own wiring between its nodes (``Transpose``+``Reshape`` merging the directions, the chain from one
node to the next) never ran in verification. Verification now also runs the whole written layer (every node and
the wiring) on the short sequence and compares it with the source's float64 run chained over the slabs.

Each case converts a torch ``nn.LSTM``/``nn.GRU`` (gate-distinct weights) to ONNX, then edits the written graph
with the ``onnx`` library the way a wiring slip would: a layer's output reshaped without its transpose, the
directions interleaved instead of concatenated, a stacked node skipped. The oracle is torch: the edited graph run
by onnxruntime against ``torch.nn.LSTM``/``GRU`` holding the source state dict gives the true error, which must be
a sizeable part of the output (the edit breaks the function; the unedited file agrees with torch), and
verification must then FAIL, not pass nor be inconclusive.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api

from conftest import assert_wiring_slip_seen, torch_rnn

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _node(model, suffix: str):
    return next(n for n in model.graph.node if n.name.endswith(suffix))


def _reshape_without_transpose(model, D: int, H: int) -> None:
    """Slab 0's ``Y`` ``(T, D, B, H)`` reshaped straight to ``(T, B, D*H)``: its ``Transpose`` dropped."""
    from onnx import numpy_helper

    t, r = _node(model, ".l0__merge_dirs_t"), _node(model, ".l0__merge_dirs")
    model.graph.node.remove(t)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, -1, D * H], np.int64), "bad_shape"))
    r.input[0], r.input[1] = t.input[0], "bad_shape"


def _directions_interleaved(model, D: int, H: int) -> None:
    """Slab 0's directions interleaved element by element instead of concatenated (``(T, B, H, D)`` reshaped)."""
    t = _node(model, ".l0__merge_dirs_t")
    for a in t.attribute:
        if a.name == "perm":
            a.ints[:] = [0, 2, 3, 1]


def _node_skipped(model, D: int, H: int) -> None:
    """Stacked layer 1 skipped: layer 2 reads layer 0's output (their shapes agree); layer 1's node stays in the
    file, run by nothing. (Removed, the slab checks do not find it: a FormatError, exit 2.)"""
    l1, l2 = _node(model, ".l1"), _node(model, ".l2")
    l2.input[0] = l1.input[0]


CASES = [  # (torch module kind, input size, hidden, layers, bidirectional, edit)
    ("LSTM", 5, 4, 2, True, _reshape_without_transpose),
    ("GRU", 5, 3, 2, True, _directions_interleaved),
    ("LSTM", 6, 6, 3, False, _node_skipped),
    ("GRU", 6, 6, 3, False, _node_skipped),
]


def _onnx_run(path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["rnn__out"], {"rnn__in": x})[0]


@pytest.mark.parametrize("kind,I,H,L,bi,edit", CASES, ids=[f"{c[0]}x{c[3]}{'-bi' if c[4] else ''}-{c[5].__name__[1:]}"
                                                         for c in CASES])
def test_a_wiring_edit_fails_verification(tmp_path, kind, I, H, L, bi, edit):
    mod = torch_rnn(kind, I, H, seed=39, num_layers=L, bidirectional=bi)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    good = tmp_path / "good.onnx"
    api.convert(tmp_path / "src.pt", good)
    model = onnx.load(str(good))
    edit(model, 2 if bi else 1, H)
    onnx.checker.check_model(model)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    # the oracle: the unedited graph computes torch's layer, the edited one does not
    assert_wiring_slip_seen(mod, tmp_path / "src.pt", good, bad, _onnx_run, I)
