"""Pickled numpy arrays (issue 31 A; rnnconvert/formats/pickle, docs/pickle.md): fixtures made by
fixtures/gen_pickle.py with the real frameworks.

Oracle: torch ran the original ``nn.LSTM``/``nn.GRU`` whose state dicts ``torch_dicts.pkl`` holds as numpy; the
project's own numpy ``forward`` (``gen_pickle.NumpyLSTM``) ran the cell ``numpy_net.pkl`` holds, from zero states
and from its learned ``(h0, c0)``. Here torch (modules rebuilt from the converted .pt by ``load_state_dict``) or
onnxruntime (the converted .onnx) runs the conversion on the same inputs.

Tolerance: 2e-5 relative plus 1e-6 absolute (issue 31's criterion): H <= 7, T = 5, weights below 0.4, sigmoid/
tanh only, so the sides differ by float32 rounding (a few 1e-7); a wrong gate order moves outputs by > 1e-2 (the
mutation test below).

The malicious pickles are built here with ``pickle.dumps`` of objects whose ``__reduce__`` names the attack; each is
refused with one line and its sentinel file is never created.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, ROOT
from rnnconvert import api
from rnnconvert.engine import registry
from rnnconvert.errors import BudgetError, FormatError

PK = FIXTURES / "pickle"
RTOL, ATOL = 2e-5, 1e-6
torch = pytest.importorskip("torch")


def _oracle(name: str):
    return np.load(PK / f"{name}.oracle.npz")


def _run_pt(dst, layer: str, x: np.ndarray, state=None) -> np.ndarray:
    mod = api.torch_modules(dst)[layer]
    with torch.no_grad():
        return mod(torch.from_numpy(x), state)[0].numpy()


def test_detected_as_pickle():
    assert registry.detect(PK / "torch_dicts.pkl").name == "pickle"
    assert registry.detect(PK / "numpy_net.pkl").name == "pickle"


def test_sniff_leaves_other_pickles_alone(tmp_path):
    """A legacy torch.save file (its pickled magic number) and Paddle's .pdparams are other formats' pickles."""
    from rnnconvert.formats.pickle import sniff

    legacy = tmp_path / "old.bin"
    torch.save({"w": torch.zeros(2)}, legacy, _use_new_zipfile_serialization=False)
    assert not sniff.pickle(legacy.read_bytes()[:64], legacy)
    pd = tmp_path / "m.pdparams"
    pd.write_bytes(pickle.dumps({"w": np.zeros(2)}, protocol=4))
    assert not sniff.pickle(pd.read_bytes()[:64], pd)


def test_torch_dicts_to_pt_and_onnx(tmp_path):
    """Nested dicts of arrays under PyTorch's names: one LSTM (2 layers, bidirectional) and one GRU."""
    orc = _oracle("torch_dicts")
    rep = api.convert(PK / "torch_dicts.pkl", tmp_path / "out.pt")
    assert [c.name for c in rep.verification.layers] == ["encoder", "decoder"]
    for name in ("encoder", "decoder"):
        np.testing.assert_allclose(_run_pt(tmp_path / "out.pt", name, orc[f"{name}__in"]), orc[f"{name}__out"],
                                   rtol=RTOL, atol=ATOL)
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    api.convert(PK / "torch_dicts.pkl", tmp_path / "out.onnx")
    ckpt = api.load(tmp_path / "out.onnx")
    for name in ("encoder", "decoder"):
        np.testing.assert_allclose(ort_rt.forward(tmp_path / "out.onnx", ckpt, name, orc[f"{name}__in"]),
                                   orc[f"{name}__out"], rtol=RTOL, atol=ATOL)
    info = api.inspect(PK / "torch_dicts.pkl")
    assert set(info["tensors"]) == {"head.0.W", "head.0.b"}


def test_object_with_learned_state(tmp_path):
    """A project's own class instance: attributes by name, gate order from --map; h0/c0 kept, with a note."""
    orc = _oracle("numpy_net")
    dst = tmp_path / "out.pt"
    rep = api.convert(PK / "numpy_net.pkl", dst, map=["gate_order=ifog"])
    assert any("cell.h0 as cell_state.h0, cell.c0 as cell_state.c0 carried as extra tensors" in n for n in rep.notes)
    x = orc["cell__in"]
    np.testing.assert_allclose(_run_pt(dst, "cell", x), orc["cell__out"], rtol=RTOL, atol=ATOL)
    sd = torch.load(dst, weights_only=True)
    h0, c0 = sd["cell_state.h0"], sd["cell_state.c0"]  # the learned state, carried bit-exact, reproduces the owner's run
    state = (h0.expand(1, x.shape[0], -1).contiguous(), c0.expand(1, x.shape[0], -1).contiguous())
    np.testing.assert_allclose(_run_pt(dst, "cell", x, state), orc["cell__out_h0"], rtol=RTOL, atol=ATOL)
    rep = api.convert(PK / "numpy_net.pkl", tmp_path / "out.onnx", map=["gate_order=ifog"])
    assert any("cell.h0" in n and "initial_h" in n for n in rep.notes)  # never dropped silently


def test_wrong_gate_order_is_caught_by_the_oracle(tmp_path):
    """Mutation: the map's gate order is an assumption; the owner's outputs tell a wrong one apart."""
    orc = _oracle("numpy_net")
    api.convert(PK / "numpy_net.pkl", tmp_path / "bad.pt", map=["gate_order=ifgo"])
    y = _run_pt(tmp_path / "bad.pt", "cell", orc["cell__in"])
    assert np.max(np.abs(y - orc["cell__out"])) > 1e-2


def test_family_less_names_need_the_gate_order(tmp_path):
    with pytest.raises(FormatError, match="gate_order"):
        api.convert(PK / "numpy_net.pkl", tmp_path / "out.pt")


# --- malicious pickles: refused with one line, nothing executed


class _Call:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _attacks(sentinel) -> dict[str, bytes]:
    cmd = f"touch {sentinel}"
    return {
        "os.system": pickle.dumps({"w": _Call(os.system, cmd)}, protocol=2),
        "builtins.eval": pickle.dumps(_Call(eval, f"__import__('os').system({cmd!r})"), protocol=4),
        "builtins.exec": pickle.dumps([_Call(exec, f"open({str(sentinel)!r}, 'w')")], protocol=0),
        "subprocess.Popen": pickle.dumps(_Call(subprocess.Popen, ["touch", str(sentinel)]), protocol=5),
        "numpy.load": pickle.dumps(_Call(np.load, str(sentinel), None, True), protocol=4),
        "numpy object dtype": pickle.dumps({"w": np.array([_Call(os.system, cmd)], dtype=object)}, protocol=2),
        "bytearray size": pickle.dumps({"w": _Call(bytearray, 1 << 40)}, protocol=2),
    }


@pytest.mark.parametrize("attack", ["os.system", "builtins.eval", "builtins.exec", "subprocess.Popen", "numpy.load",
                                    "numpy object dtype", "bytearray size"])
def test_malicious_pickles_refused(tmp_path, attack):
    sentinel = tmp_path / "PWNED"
    src = tmp_path / "evil.pkl"
    src.write_bytes(_attacks(sentinel)[attack])
    with pytest.raises(FormatError) as exc:
        api.load(src)
    assert "\n" not in str(exc.value) and "refused" in str(exc.value) or "dtype" in str(exc.value)
    assert not sentinel.exists()


def test_malicious_pickle_cli_one_line(tmp_path):
    sentinel = tmp_path / "PWNED"
    src = tmp_path / "evil.pkl"
    src.write_bytes(_attacks(sentinel)["os.system"])
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(src), str(tmp_path / "out.pt")],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "posix.system" in r.stderr and "Traceback" not in r.stderr
    assert not sentinel.exists() and not (tmp_path / "out.pt").exists()


def test_defaultdict_and_builtin_containers(tmp_path):
    """A project's collections.defaultdict of arrays and a set/bytes field read as plain data."""
    import collections

    d = collections.defaultdict(list)
    d["enc"] = {"weight_ih_l0": np.ones((8, 3), np.float32), "weight_hh_l0": np.ones((8, 2), np.float32)}
    src = tmp_path / "dd.pkl"
    src.write_bytes(pickle.dumps({"model": d, "tags": {"a", "b"}, "blob": bytearray(b"xy")}, protocol=2))
    ckpt = api.load(src)
    assert [(la.name, la.cell.value, la.hidden_size) for la in ckpt.layers] == [("model.enc", "LSTM", 2)]


def test_shared_children_bounded(tmp_path, monkeypatch):
    """'Billion laughs': every level holds the same child twice; the walk is bounded by pickle_nodes."""
    node: object = {"w_ih": np.zeros((4, 2), np.float32)}
    for _ in range(60):
        node = {"a": node, "b": node}
    src = tmp_path / "laughs.pkl"
    src.write_bytes(pickle.dumps(node, protocol=4))
    monkeypatch.setenv("RNNCONVERT_MAX_PICKLE_NODES", "10000")
    with pytest.raises((BudgetError, FormatError)):
        api.load(src)


def test_damaged_pickles(tmp_path):
    data = (PK / "torch_dicts.pkl").read_bytes()
    for name, blob in {"truncated": data[: len(data) // 2], "trailing": data + b"junk"}.items():
        src = tmp_path / f"{name}.pkl"
        src.write_bytes(blob)
        with pytest.raises(FormatError):
            api.load(src)
