"""PaddlePaddle ``.pdparams``: the oracle is Paddle -- fixtures saved by ``paddle.save`` with Paddle's own outputs
(``fixtures/gen_paddle.py``, run with paddlepaddle 3.3.1, the ``paddle`` extra, 721 MiB, not in ``test``). Files
rnnconvert writes are loaded and run by Paddle itself (in this process when paddle imports, else in a child
process when ``RNNCONVERT_PADDLE_PYTHON`` names a Python with paddlepaddle; skipped otherwise), and verified by
the ``paddle`` runtime (rnnconvert.runtimes.paddle: paddle.load into paddle.nn), whose fallback without Paddle is
torch on the tensors read back; PyTorch and onnxruntime run the converted ``.pt``/``.onnx``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES, manifest
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError
from rnnconvert.formats.paddle import pdparams_read, pdparams_write
from rnnconvert.runtimes import paddle as paddle_rt

torch = pytest.importorskip("torch")
ENTRIES = manifest("paddle")
RTOL = 2e-5
HAS_PADDLE = importlib.util.find_spec("paddle") is not None
PADDLE_PYTHON = os.environ.get("RNNCONVERT_PADDLE_PYTHON") or (sys.executable if HAS_PADDLE else None)


def _paddle_here() -> bool:
    """Whether Paddle can run in this process: installed, and not imported after TensorFlow (a segmentation
    fault with PaddlePaddle 3.3.1 and TensorFlow 2.21: rnnconvert.runtimes.paddle.framework)."""
    return HAS_PADDLE and ("paddle" in sys.modules or "tensorflow" not in sys.modules)


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def _oracle(entry):
    o = np.load(FIXTURES / entry["oracle"])
    return {k[:-len("__out")]: (o[f"{k[:-len('__out')]}__in"], o[k]) for k in o.files if k.endswith("__out")}


def test_gen_paddle_is_the_producer():
    assert {e["file"] for e in ENTRIES} == {f"paddle/{p.name}" for p in (FIXTURES / "paddle").iterdir()
                                            if ".oracle." not in p.name}
    assert all(e["producer"].startswith("paddlepaddle ") for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
@pytest.mark.parametrize("ext", [".pt", ".onnx"])
def test_pdparams_converts_reproducing_paddle(entry, ext, tmp_path):
    """A file saved by paddle.save converts (verified) to .pt / .onnx, and torch / onnxruntime running the result
    reproduce Paddle's outputs within 2e-5 relative, or the conversion is refused naming the feature (an LSTM
    projection into ONNX)."""
    if ext == ".onnx":
        pytest.importorskip("onnx")
    src = FIXTURES / entry["file"]
    assert registry.detect(src).name == "paddle"
    opts = entry.get("read_opts", {})
    dst = tmp_path / f"out{ext}"
    if ext == ".onnx" and any(layer.proj_size for layer in api.load(src, **opts).layers):
        with pytest.raises(UnsupportedError, match="projection"):
            api.convert(src, dst, read_opts=opts)
        assert not dst.exists()
        return
    api.convert(src, dst, read_opts=opts)
    for name, (x, want) in _oracle(entry).items():
        if ext == ".pt":
            with torch.no_grad():
                got = api.torch_modules(dst, **opts)[name](torch.from_numpy(x))[0].numpy()
        else:
            ort = pytest.importorskip("onnxruntime")
            sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
            got = sess.run([f"{name}__out"], {f"{name}__in": x})[0]
        assert _rel(got, want) < RTOL, (name, _rel(got, want))


# ------------------------------------------------------------------ the traps a naive port falls into

def test_every_parameter_twice_is_one_layer():
    """The state dict holds each parameter under a flat and a per-cell name: one layer (2 stacked, bidirectional),
    not two, and the Linear head carried along."""
    ck = api.load(FIXTURES / "paddle/encoder.pdparams")
    assert [(la.name, la.num_layers, la.bidirectional) for la in ck.layers] == [("lstm", 2, True)]
    assert set(ck.tensors) == {"head.weight", "head.bias"}


def test_projection_traps():
    """weight_ho is (H, P), PyTorch's weight_hr transposed; and the flat names of a projected LSTM are shifted
    (RNNBase zips four names per cell with five parameters): a naive port reading the flat names as a PyTorch
    state dict gets weight_ih_l1 = cell 0's weight_ho and fails; one that keeps weight_ho untransposed does not
    fit torch's (P, H)."""
    entry = next(e for e in ENTRIES if e["file"] == "paddle/lstm_proj.pdparams")
    sd = pdparams_read.arrays(FIXTURES / entry["file"])
    layer = api.load(FIXTURES / entry["file"]).layer("lstm")
    x, want = _oracle(entry)["lstm"]
    assert _rel(reference.forward(layer, x.astype(np.float64)), want) < RTOL
    assert np.array_equal(sd["weight_ih_l1"], sd["0.cell.weight_ho"])  # the shift, as Paddle saved it
    lstm = torch.nn.LSTM(3, 5, num_layers=2, proj_size=2, batch_first=True)
    flat = {k: torch.from_numpy(v) for k, v in sd.items() if "cell" not in k}
    with pytest.raises(RuntimeError):
        lstm.load_state_dict(flat, strict=False)
    naive = {f"{n}_l{k}": torch.from_numpy(sd[f"{k}.cell.{p}"]) for k in (0, 1)
             for n, p in (("weight_ih", "weight_ih"), ("weight_hh", "weight_hh"), ("bias_ih", "bias_ih"),
                          ("bias_hh", "bias_hh"), ("weight_hr", "weight_ho"))}
    with pytest.raises(RuntimeError, match="size mismatch"):
        lstm.load_state_dict(naive)


def _pickled(tmp_path, sd, name="t.pdparams"):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(sd, protocol=4))
    return p


def test_disagreeing_copies_are_refused(tmp_path):
    sd = pdparams_read.arrays(FIXTURES / "paddle/gru.pdparams")
    sd["weight_ih_l0"] = sd["weight_ih_l0"] + np.float32(1)
    with pytest.raises(FormatError, match="two copies") as info:
        api.load(_pickled(tmp_path, sd))
    assert "\n" not in str(info.value)


def test_allow_list_only(tmp_path):
    """Nothing from the file runs: a global outside the allow-list and object arrays are refused in one line."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    sd = pdparams_read.arrays(FIXTURES / "paddle/gru.pdparams")
    for bad in ({**sd, "x": Evil()}, {**sd, "o": np.array([{"a": 1}], dtype=object)}):
        with pytest.raises(FormatError) as info:
            api.load(_pickled(tmp_path, bad))
        assert "\n" not in str(info.value)
    assert not (tmp_path / "ran").exists()


# ------------------------------------------------------------------ .pt / .onnx into .pdparams

_RUN = r"""
import json, sys, numpy as np, paddle
spec = json.loads(sys.argv[1])
kw = {"num_layers": spec["layers"], "direction": "bidirect" if spec["bidi"] else "forward"}
if spec["cell"] == "LSTM":
    m = paddle.nn.LSTM(3, spec["H"], proj_size=spec["P"], **kw)
elif spec["cell"] == "GRU":
    m = paddle.nn.GRU(3, spec["H"], **kw)
else:
    m = paddle.nn.SimpleRNN(3, spec["H"], activation="relu", **kw)
sd = paddle.load(spec["path"])
pre = spec["name"] + "."
missing, unexpected = m.set_state_dict({k[len(pre):]: v for k, v in sd.items() if k.startswith(pre)})
assert not missing and not unexpected, (missing, unexpected)
x = np.load(spec["x"])
np.save(spec["out"], m(paddle.to_tensor(x))[0].numpy())
"""


@pytest.mark.skipif(not PADDLE_PYTHON,
                    reason="install the paddle extra, or set RNNCONVERT_PADDLE_PYTHON to a Python with paddlepaddle")
@pytest.mark.parametrize("kind", ["LSTM-bi", "LSTM-proj", "GRU", "RNN"])
@pytest.mark.parametrize("src_ext", [".pt", ".onnx"])
def test_pt_and_onnx_sources_into_paddle_run_by_paddle(kind, src_ext, tmp_path):
    """torch.nn modules saved as .pt (and converted to .onnx) convert into .pdparams, and Paddle's own layers
    loading the file (set_state_dict, every key used) reproduce torch's outputs; with Paddle installed the
    conversion's verification ran in Paddle (the report's route names it and its version)."""
    if src_ext == ".onnx" and kind == "LSTM-proj":
        pytest.skip("ONNX has no LSTM projection")
    torch.manual_seed(3)
    cell = kind.split("-")[0]
    bidi, P = kind == "LSTM-bi", 2 if kind == "LSTM-proj" else 0
    if cell == "LSTM":
        m = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=bidi, proj_size=P, batch_first=True)
    elif cell == "GRU":
        m = torch.nn.GRU(3, 5, num_layers=2, batch_first=True)
    else:
        m = torch.nn.RNN(3, 5, nonlinearity="relu", batch_first=True)
    torch.save(m.state_dict(), tmp_path / "m.pt")
    opts = {"nonlinearity": "relu"} if cell == "RNN" else {}
    src = tmp_path / "m.pt"
    if src_ext == ".onnx":
        pytest.importorskip("onnx")
        api.convert(src, tmp_path / "m.onnx", read_opts=opts)
        src, opts = tmp_path / "m.onnx", {}
    dst = tmp_path / "out.pdparams"
    rep = api.convert(src, dst, read_opts=opts).verification
    assert [c.verdict for c in rep.layers] == ["ok"]
    if _paddle_here():
        from importlib import metadata

        assert rep.layers[0].target_route.startswith(f"{pdparams_write.ROUTE} {metadata.version('paddlepaddle')} ")
    x = np.random.default_rng(4).standard_normal((2, 5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    spec = {"cell": cell, "H": 5, "P": P, "layers": m.num_layers, "bidi": bidi, "path": str(dst), "name": "rnn",
            "x": str(tmp_path / "x.npy"), "out": str(tmp_path / "y.npy")}
    if _paddle_here():  # the same script, in this process
        argv = sys.argv
        try:
            sys.argv = ["-c", json.dumps(spec)]
            exec(compile(_RUN, "<paddle run>", "exec"), {})
        finally:
            sys.argv = argv
    else:
        subprocess.run([PADDLE_PYTHON, "-c", _RUN, json.dumps(spec)], check=True, capture_output=True, timeout=300)
    with torch.no_grad():
        want = m(torch.from_numpy(x))[0].numpy()
    assert _rel(np.load(tmp_path / "y.npy"), want) < RTOL


# ------------------------------------------------------------------ verification of written .pdparams

@pytest.fixture(params=["paddle", "torch fallback"])
def runtime(request, monkeypatch):
    """The paddle runtime as it runs: Paddle itself (skipped without it), or with ``import paddle`` failing
    (``sys.modules['paddle'] = None``), the torch runtime in its place."""
    if request.param == "paddle":
        if not _paddle_here():
            pytest.skip("paddle is not installed, or TensorFlow was loaded first in this process")
    else:
        monkeypatch.setitem(sys.modules, "paddle", None)
    monkeypatch.setattr(paddle_rt, "_IMPORTED", [])  # the import is decided again, under this test's conditions
    paddle_rt.release()
    yield request.param
    paddle_rt.release()


def _swap_if(layer):
    """The i and f blocks of w_ih swapped (PyTorch's and Paddle's gate order i f g o)."""
    p, H = layer.params[0][0], layer.hidden_size
    return replace(p, w_ih=np.concatenate([p.w_ih[H:2 * H], p.w_ih[:H], p.w_ih[2 * H:]]))


def _nudge_bias(layer):
    """b_ih of the forget gate nudged by 0.05 (one gate block's bias, as a mis-folded forget_bias would be)."""
    p, H = layer.params[0][0], layer.hidden_size
    b = p.b_ih.copy()
    b[H:2 * H] += np.float32(0.05)
    return replace(p, b_ih=b)


@pytest.mark.parametrize("mutate", [None, _swap_if, _nudge_bias], ids=["intact", "swapped_i_f", "nudged_bias"])
def test_verification_of_a_written_pdparams(runtime, mutate, tmp_path):
    """A .pdparams written from a torch.nn.LSTM saved as .pt is verified against the .pt: ok when intact, and a
    fail when one gate block of the written file is swapped or a bias nudged -- the same verdicts whether Paddle
    runs the file (paddle.load into paddle.nn.LSTM) or, without Paddle, torch on its tensors read back; the
    report's route names which ran. The mutations are written through rnnconvert's writer, so both copies of
    each parameter (per-cell and flat alias) agree, as in a file Paddle saved."""
    torch.manual_seed(5)
    torch.save(torch.nn.LSTM(3, 4, batch_first=True).state_dict(), tmp_path / "m.pt")
    good = api.load(tmp_path / "m.pt")
    layer = good.layers[0]
    ck = good if mutate is None else replace(good, layers=[replace(layer, params=[[mutate(layer)]])])
    api.save(ck, tmp_path / "out.pdparams", "paddle")
    rep = api.verify(tmp_path / "m.pt", tmp_path / "out.pdparams")
    assert [c.verdict for c in rep.layers] == ["ok" if mutate is None else "fail"]
    route = rep.layers[0].target_route
    want = (pdparams_write.ROUTE if runtime == "paddle" else
            paddle_rt.FALLBACK_ROUTE.format(why=paddle_rt.WHY["missing"]))
    assert route.startswith(want), route
    if runtime == "paddle":
        assert "one-step + sequence" in route and "not installed" not in route


def test_paddle_runtime_refuses_a_pickle_outside_the_allow_list(runtime, tmp_path):
    """`rnnconvert verify SRC DST` may be handed a DST rnnconvert did not write: the allow-list reader sees the file
    before paddle.load unpickles it, so nothing in it runs (one-line FormatError)."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    torch.manual_seed(5)
    torch.save(torch.nn.GRU(3, 4, batch_first=True).state_dict(), tmp_path / "m.pt")
    api.save(api.load(tmp_path / "m.pt"), tmp_path / "good.pdparams", "paddle")
    sd = pdparams_read.arrays(tmp_path / "good.pdparams")
    with pytest.raises(FormatError) as info:
        api.verify(tmp_path / "m.pt", _pickled(tmp_path, {**sd, "x": Evil()}, "evil.pdparams"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "ran").exists()


def test_paddle_is_not_imported_after_tensorflow(monkeypatch):
    """With TensorFlow loaded and Paddle not yet, the paddle runtime does not import Paddle (a segmentation fault
    with PaddlePaddle 3.3.1 after TensorFlow 2.21): torch runs the file and the route says why."""
    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow", object()))
    monkeypatch.delitem(sys.modules, "paddle", raising=False)
    monkeypatch.setattr(paddle_rt, "_IMPORTED", [])
    assert paddle_rt.framework() is None
    assert paddle_rt.stand_in() == ("torch", paddle_rt.FALLBACK_ROUTE.format(why=paddle_rt.WHY["tensorflow"]))


def test_float16_pdparams_is_verified(runtime, tmp_path):
    """A float16 .pdparams (PaddlePaddle's CPU build has no float16 kernels for these layers: the paddle runtime
    runs its values in float32) is verified ok, and a swapped gate block in it still fails."""
    torch.manual_seed(6)
    torch.save(torch.nn.GRU(3, 4, num_layers=2, batch_first=True).half().state_dict(), tmp_path / "m.pt")
    good = api.load(tmp_path / "m.pt")
    layer = good.layers[0]
    p, H = layer.params[0][0], layer.hidden_size
    bad = replace(layer, params=[[replace(p, w_hh=np.concatenate([p.w_hh[H:2 * H], p.w_hh[:H], p.w_hh[2 * H:]]))],
                                 layer.params[1]])
    for ck, verdict in ((good, "ok"), (replace(good, layers=[bad]), "fail")):
        api.save(ck, tmp_path / f"{verdict}.pdparams", "paddle")
        rep = api.verify(tmp_path / "m.pt", tmp_path / f"{verdict}.pdparams")
        assert [c.verdict for c in rep.layers] == [verdict]
        assert rep.layers[0].target_route.startswith(
            pdparams_write.ROUTE if runtime == "paddle" else paddle_rt.FALLBACK_ROUTE.format(why=paddle_rt.WHY["missing"]))
