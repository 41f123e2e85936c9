"""Issue #38: verification of a stacked layer written as ONNX runs three short sequences through the written nodes:
each node alone from the source's float32 input of it (the slab checks), the whole written layer with the file's
wiring (issue #39's wiring check) and the nodes alone chained from the layer's input (what the wiring is compared
with). Run one after another they read each node's weights three times (the 3 GB benchmark: +20% wall time after
#39). :func:`rnnconvert.runtimes.onnxruntime.forward_wired` runs them in one pass: each part of the staged graph
runs its stacked node once, on the file's rows and the slab check's rows together (a ``Concat`` before the node, a
``Gather`` of the file's rows after it); where each node's input is exactly the previous node's output joined, the
file's rows are the nodes chained, else the chain is run apart.

Oracle: torch. The source is a ``torch.nn.LSTM``/``GRU``/``RNN`` with gate-distinct weights; the whole run and the
chain must equal the module's output, and node ``k``'s run its layer ``k`` alone (a one-layer torch module holding
``weight_ih_l{k}``...), within ``1e-5`` of the output's scale (the float32 results differ from torch by ~1e-7 of it).
The wiring slips stay caught through the fused run: tests/verify/test_onnx_wiring.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.runtimes import onnxruntime as ort_runtime

from conftest import torch_rnn

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CASES = [("LSTM", 5, 4, 3, True), ("GRU", 5, 6, 2, True), ("RNN", 4, 3, 3, False), ("LSTM", 6, 8, 2, False)]


def _written(tmp_path, kind, I, H, L, bi):
    mod = torch_rnn(kind, I, H, seed=38, num_layers=L, bidirectional=bi)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    dst = tmp_path / "out.onnx"
    api.convert(tmp_path / "src.pt", dst, verify=False)
    return mod, api.load(tmp_path / "src.pt"), dst


def _torch_layer(mod, k: int, I: int):
    """Layer ``k`` of ``mod`` alone: a one-layer module of the same kind holding that layer's weights."""
    one = type(mod)(I, mod.hidden_size, batch_first=True, bidirectional=mod.bidirectional)
    sd = mod.state_dict()
    one.load_state_dict({name: sd[name.replace("_l0", f"_l{k}")] for name in one.state_dict()})
    return one.eval()


def _close(got, want) -> None:
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-5 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("kind,I,H,L,bi", CASES, ids=[f"{c[0]}x{c[3]}{'-bi' if c[4] else ''}" for c in CASES])
def test_one_pass_gives_the_three_runs(tmp_path, monkeypatch, kind, I, H, L, bi):
    mod, ckpt, dst = _written(tmp_path, kind, I, H, L, bi)
    rng = np.random.default_rng(7)
    D = 2 if bi else 1
    x = rng.standard_normal((3, 4, I)).astype(np.float32)
    slab_xs = [x] + [rng.standard_normal((3, 4, D * H)).astype(np.float32) for _ in range(L - 1)]
    sessions = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: sessions.append(1) or real(*a, **k))
    whole, ys, joined = ort_runtime.forward_wired(dst, ckpt, "rnn", x, slab_xs)
    parts = ort_runtime.stages(onnx.load(str(dst), load_external_data=False), "rnn", L)
    assert len(sessions) == len(parts)  # one session per part: each node built and run once for the three runs
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
        _close(whole, want)
        _close(joined, want)
        for k in range(L):
            _close(ys[k], _torch_layer(mod, k, I if k == 0 else D * H)(torch.from_numpy(slab_xs[k]))[0].numpy())


def test_a_node_outside_the_wiring_runs_the_three_runs_apart(tmp_path):
    """Stacked node 1 skipped by the wiring (node 2 reads node 0's output): the fused run cannot extend a node that
    runs in no part, so the three runs are made one by one, node 1 included (as tests/verify/test_onnx_wiring.py's
    slip needs: its slab check runs node 1 alone)."""
    mod, ckpt, dst = _written(tmp_path, "GRU", 6, 6, 3, False)
    model = onnx.load(str(dst))
    l1, l2 = (next(n for n in model.graph.node if n.name == f"rnn.l{k}") for k in (1, 2))
    l2.input[0] = l1.input[0]
    onnx.save(model, str(dst))
    x = np.random.default_rng(3).standard_normal((2, 5, 6)).astype(np.float32)
    assert ort_runtime._staged(dst, "rnn", 3, x, [x, x, x])[1] is None
    whole, ys, joined = ort_runtime.forward_wired(dst, ckpt, "rnn", x, [x, x, x])
    with torch.no_grad():
        l0 = _torch_layer(mod, 0, 6)(torch.from_numpy(x))[0]
        _close(whole, _torch_layer(mod, 2, 6)(l0)[0].numpy())  # the edited file's own function
        _close(joined, mod(torch.from_numpy(x))[0].numpy())
        for k in range(3):
            _close(ys[k], _torch_layer(mod, k, 6)(torch.from_numpy(x))[0].numpy())


def test_a_wiring_that_is_not_the_join_gets_the_chain_run_apart(tmp_path):
    """The wiring between nodes 0 and 1 interleaves the directions (a ``Transpose`` perm edited): node 1's input in
    the fused run is not node 0's output joined, so ``joined`` is the nodes run apart and chained (torch's module
    output), while ``whole`` is the edited file's own function (not torch's): the wiring check sees the slip."""
    mod, ckpt, dst = _written(tmp_path, "LSTM", 5, 4, 2, True)
    model = onnx.load(str(dst))
    t = next(n for n in model.graph.node if n.name.endswith(".l0__merge_dirs_t"))
    next(a for a in t.attribute if a.name == "perm").ints[:] = [0, 2, 3, 1]
    onnx.save(model, str(dst))
    x = np.random.default_rng(5).standard_normal((3, 6, 5)).astype(np.float32)
    assert ort_runtime._staged(dst, "rnn", 2, x, [x, np.zeros((3, 6, 8), np.float32)])[2] is None
    whole, _, joined = ort_runtime.forward_wired(dst, ckpt, "rnn", x, [x, np.zeros((3, 6, 8), np.float32)])
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
    _close(joined, want)
    assert float(np.abs(whole - want).max()) > 1e-2 * float(np.abs(want).max())
