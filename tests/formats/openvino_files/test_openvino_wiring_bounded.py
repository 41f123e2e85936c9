"""Issue #38 for OpenVINO IR: verification's wiring check (issue #39) compiled the whole written stacked layer at once,
every sequence node's weights in one compiled model (and kept every node's compiled one-node models until the end):
2.17 GB peak RSS verifying a 186 MB IR. It now compiles the IR part by part
(:func:`rnnconvert.runtimes.openvino.parts` / ``staged``), one sequence node and the wiring after it per part.

The bound is proved structurally: every model verification compiles (recorded by wrapping
``openvino.Core.compile_model``) holds at most one ``*Sequence`` node of the IR, and the runtime keeps the compiled
one-node models of at most one stacked node at a time; the wiring check ran. That the
parts are still the IR's wiring: chained, they give bit for bit what OpenVINO computes compiling the written IR
whole (the oracle). The wiring slip stays caught: tests/formats/openvino_files/test_openvino_wiring.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import torch_rnn
from rnnconvert import api
from rnnconvert.formats.torch import pt_read as torch_pt
from rnnconvert.runtimes import openvino as ov_runtime

torch = pytest.importorskip("torch")
ov = pytest.importorskip("openvino")


def _sequences(model) -> int:
    return sum(n.get_type_name().endswith("Sequence") for n in model.get_ordered_ops())


@pytest.mark.parametrize("kind,L", [("LSTM", 3), ("GRU", 2)])
def test_parts_hold_one_sequence_node_and_equal_the_whole_ir(tmp_path, kind, L):
    mod = torch_rnn(kind, 5, 4, seed=38, num_layers=L, bidirectional=True)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    ir = tmp_path / "ir"
    api.convert(tmp_path / "src.pt", ir, to="openvino", verify=False)
    core = ov.Core()
    model = core.read_model(str(ir / "model.xml"))
    assert _sequences(model) == L
    parts = ov_runtime.parts(model, "rnn", L)
    assert len(parts) == L
    params = list(model.get_parameters()) + [p for p, _ in parts if p is not None]
    for _, end in parts:
        part = ov.Model([ov.opset13.result(end)], params, "part")
        assert _sequences(part) == 1

    x = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(np.float32)
    whole = core.compile_model(core.read_model(str(ir / "model.xml")), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    want = np.asarray(whole({"rnn__in": x})[whole.output("rnn__out")])
    ckpt = torch_pt.read(tmp_path / "src.pt")  # the layer's name and stacking
    np.testing.assert_array_equal(ov_runtime.staged(ir, ckpt, "rnn", x), want.astype(np.float64))


def test_no_model_compiled_by_verification_holds_two_sequence_nodes(tmp_path, monkeypatch):
    mod = torch_rnn("LSTM", 5, 4, seed=38, num_layers=3, bidirectional=True)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    ir = tmp_path / "ir"
    api.convert(tmp_path / "src.pt", ir, to="openvino", verify=False)
    held: list[int] = []
    kept: list[int] = []  # the stacked nodes whose one-node compiled models the runtime keeps at each compile
    real = ov.Core.compile_model

    def recording(self, model, *a, **kw):
        held.append(_sequences(model))
        kept.append(len({key[:2] for key in ov_runtime._CACHE.get("compiled", {}) if isinstance(key, tuple)}))
        return real(self, model, *a, **kw)

    monkeypatch.setattr(ov.Core, "compile_model", recording)
    rep = api.verify(tmp_path / "src.pt", ir)
    assert rep.verdict == "ok", [(c.verdict, c.reason) for c in rep.layers]
    assert "whole layer's graph" in rep.layers[0].target_route  # the wiring ran
    assert held and max(held) == 1, held
    assert max(kept) <= 1, kept
