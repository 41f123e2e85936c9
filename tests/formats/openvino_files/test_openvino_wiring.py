"""Issue #39 for OpenVINO IR: a stacked layer written as an IR has one ``LSTMSequence``/``GRUSequence`` node per
stacked layer, joined by the IR's own ``Transpose``/``Reshape`` (the directions merged, one node's output fed to
the next). Verification compared the nodes one by one (each rebuilt alone), so that wiring never ran: an IR whose
``Transpose`` interleaves the two directions element by element instead of concatenating them was verified
``ok`` while OpenVINO's own output of it was 0.84 off torch's (measured when this was found). The runtime is now
flagged ``wired`` (:attr:`rnnconvert.engine.protocol.Runtime.wired`): the whole written layer also runs, and is
compared with its nodes run one by one and joined as the source joins its slabs.

The oracle is torch and OpenVINO: each case converts a torch ``nn.LSTM``/``nn.GRU`` (gate-distinct weights) to an
IR, edits the IR's ``Transpose`` permutation in ``model.bin`` the way a wiring slip would, and measures the true
error with the OpenVINO runtime against ``torch.nn`` holding the source state dict (never with rnnconvert's
code): the unedited IR agrees with torch, the edited one is off by a sizeable part of the output, and verification
must then FAIL.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import assert_wiring_slip_seen, torch_rnn
from rnnconvert import api

torch = pytest.importorskip("torch")
ov = pytest.importorskip("openvino")


def _perm_const(xml_path) -> tuple[int, int]:
    """``(offset, size)`` in ``model.bin`` of the permutation of stacked layer 0's merge ``Transpose``: the ``Const``
    wired to port 1 of the first ``Transpose`` after node ``rnn.l0`` (the IR's own edges, read with ElementTree)."""
    root = ET.parse(xml_path).getroot()
    layers = {lay.get("id"): lay for lay in root.iter("layer")}
    edges = [(e.get("from-layer"), e.get("to-layer"), e.get("to-port")) for e in root.iter("edge")]
    node = next(i for i, lay in layers.items() if lay.get("name") == "rnn.l0")
    t = next(to for fr, to, _ in edges if fr == node and layers[to].get("type") == "Transpose")
    port1 = next(lay.find("input").findall("port")[1].get("id") for i, lay in layers.items() if i == t)
    const = next(fr for fr, to, port in edges if to == t and port == port1)
    data = layers[const].find("data")
    return int(data.get("offset")), int(data.get("size"))


def _interleave_directions(ir_dir) -> None:
    """Stacked layer 0's ``(B, D, T, H)`` output transposed to ``(B, T, H, D)`` before the reshape to ``(B, T, D*H)``
    (directions interleaved element by element) instead of ``(B, T, D, H)`` (concatenated)."""
    off, size = _perm_const(ir_dir / "model.xml")
    blob = bytearray((ir_dir / "model.bin").read_bytes())
    assert np.frombuffer(bytes(blob[off:off + size]), np.int64).tolist() == [0, 2, 1, 3]  # as written
    blob[off:off + size] = np.array([0, 2, 3, 1], np.int64).tobytes()
    (ir_dir / "model.bin").write_bytes(bytes(blob))


def _ov_run(ir_dir, x: np.ndarray) -> np.ndarray:
    core = ov.Core()
    c = core.compile_model(core.read_model(str(ir_dir / "model.xml")), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.asarray(c({"rnn__in": x})[c.output("rnn__out")])


@pytest.mark.parametrize("kind,I,H", [("GRU", 5, 3), ("LSTM", 4, 4)])
def test_a_wiring_edit_of_an_ir_fails_verification(tmp_path, kind, I, H):
    import shutil

    mod = torch_rnn(kind, I, H, seed=39, num_layers=2, bidirectional=True)
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "src.pt")
    good = tmp_path / "good"
    api.convert(tmp_path / "src.pt", good, to="openvino")
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    _interleave_directions(bad)
    # the oracle: OpenVINO runs the unedited IR as torch runs the layer, the edited one not
    assert_wiring_slip_seen(mod, tmp_path / "src.pt", good, bad, _ov_run, I)
