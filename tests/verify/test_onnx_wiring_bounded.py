"""Issue #38: verification's wiring check (issue #39: the whole written stacked layer run by onnxruntime, every node
and the ``Transpose``/``Reshape`` wiring between them) ran the layer in ONE onnxruntime session, which mapped every
stacked node's weights at once: 3.4 GB peak RSS for the 3 GB benchmark model against 0.75-1.0 GB before. It now runs
the same pruned graph part by part (:func:`rnnconvert.runtimes.onnxruntime.stages` / ``staged``), one session per
stacked node and the wiring into it.

The memory bound is proved structurally, not by timing or RSS: every onnxruntime session that verification builds
(recorded by wrapping ``onnxruntime.InferenceSession``) holds the initializers of at most one recurrent node of the
written file (which initializers a node reads is the file's own graph, read with the ``onnx`` library). That the
parts together are still the whole wiring: every node the layer's output depends on (pruned as onnxruntime prunes
it) is in exactly one part, and the parts chained give bit for bit what onnxruntime computes running the written
file whole (the oracle: ``onnxruntime.InferenceSession`` on the file, weights not pre-packed as in verification).
The wiring slips stay caught: tests/verify/test_onnx_wiring.py, tests/verify/test_slip_corpus.py.
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

RECURRENT = {"LSTM", "GRU", "RNN"}


def _written(tmp_path, kind: str, L: int, bi: bool, external: bool):
    mod = torch_rnn(kind, 5, 4, seed=38, num_layers=L, bidirectional=bi)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    dst = tmp_path / "out.onnx"
    api.convert(tmp_path / "src.pt", dst, verify=False, write_opts={"external_data": external})
    return tmp_path / "src.pt", dst


def _weights_of(model) -> dict[str, str]:
    """initializer name -> the recurrent node of the file that reads it (the file's own graph)."""
    inits = {t.name for t in model.graph.initializer}
    return {i: n.name for n in model.graph.node if n.op_type in RECURRENT for i in n.input if i in inits}


CASES = [("LSTM", 3, True, True), ("GRU", 4, False, False), ("RNN", 2, True, False)]


@pytest.mark.parametrize("kind,L,bi,external", CASES, ids=[f"{c[0]}x{c[1]}{'-bi' if c[2] else ''}"
                                                            f"{'-external' if c[3] else ''}" for c in CASES])
def test_each_part_holds_one_stacked_node_and_all_parts_are_the_graph(tmp_path, kind, L, bi, external):
    _, dst = _written(tmp_path, kind, L, bi, external)
    model = onnx.load(str(dst), load_external_data=False)
    owner = _weights_of(model)
    assert len(set(owner.values())) == L
    parts = ort_runtime.stages(model, "rnn", L)
    for p in parts:  # the bound: one stacked node's weights per part (issue #38)
        assert len({owner[i] for i in p.initializers if i in owner}) <= 1, p.initializers
        assert sum(n.op_type in RECURRENT for n in p.nodes) <= 1
    # every node of the written graph (all on the path to rnn__out here) is in exactly one part, in the file's order
    ran = [n.name for p in parts for n in p.nodes]
    assert sorted(ran) == sorted(n.name for n in model.graph.node)
    assert any("merge_dirs" in n for n in ran) and any(n.endswith("__to_batch_major") for n in ran)
    # chained, they compute what onnxruntime computes running the written file whole (the oracle), bit for bit
    x = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(np.float32)
    opts = ort.SessionOptions()  # as verification runs it: weights read as stored, not pre-packed (its kernels differ)
    opts.add_session_config_entry("session.disable_prepacking", "1")
    whole = ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"])
    want = whole.run(["rnn__out"], {"rnn__in": x})[0]
    np.testing.assert_array_equal(ort_runtime.staged(dst, "rnn", L, x), want.astype(np.float64))


def test_no_session_of_verification_holds_two_stacked_nodes(tmp_path, monkeypatch):
    """Every onnxruntime session built while verifying a stacked BiLSTM (the slab checks, the one steps, the wiring
    check) holds the weights of at most one recurrent node, and the wiring check still ran."""
    src, dst = _written(tmp_path, "LSTM", 3, True, True)
    owner = _weights_of(onnx.load(str(dst), load_external_data=False))
    held: list[set] = []
    real = ort.InferenceSession

    def recording(model, *a, **kw):
        m = onnx.load(str(model), load_external_data=False) if not isinstance(model, bytes) else \
            onnx.load_from_string(model)
        held.append({owner[t.name] for t in m.graph.initializer if t.name in owner})
        return real(model, *a, **kw)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    rep = api.verify(src, dst)
    assert rep.verdict == "ok", [(c.verdict, c.reason) for c in rep.layers]
    assert "whole layer's graph" in rep.layers[0].target_route  # the wiring ran
    assert held and max(len(h) for h in held) == 1, held
    assert set().union(*held) == set(owner.values())  # every stacked node ran
