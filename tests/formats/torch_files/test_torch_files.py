"""PyTorch-family files: .pt variants (cells, wrapped checkpoints, legacy, TorchScript, no extension),
safetensors and the canonical .npz, each checked against torch (or onnxruntime) running the real modules."""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert.runtimes import onnxruntime as ort_rt
from rnnconvert.runtimes import torch as torch_rt
from rnnconvert import api
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError
from rnnconvert.formats.onnx import onnx_write as onnx_fmt
from rnnconvert.formats.torch import pt_read as torch_pt

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

from conftest import assert_within_float32_spread  # noqa: E402
from conftest import TORCH_IDS as IDS, TORCH_SPECS as SPECS, torch_gate_distinct as _gate_distinct  # noqa: E402
from conftest import torch_module as _torch_module, torch_x as _x  # noqa: E402


def _out(mod, x):
    with torch.no_grad():
        y = mod(torch.from_numpy(x))
    return (y[0] if isinstance(y, tuple) else y).double().numpy()


def _assert_same_sd(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        v = v.numpy() if hasattr(v, "numpy") else v
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k


@pytest.mark.parametrize("cls,kw", SPECS, ids=IDS)
def test_pt_safetensors_npz_round_trips(cls, kw, tmp_path):
    mod = _torch_module(cls, kw, seed=11)
    sd = {f"enc.rnn.{k}": v for k, v in mod.state_dict().items()}
    torch.save(sd, tmp_path / "a.pt")
    opts = {"nonlinearity": kw.get("nonlinearity", "tanh")}
    x = _x(seed=12)
    want = _out(mod, x)
    # .pt -> .safetensors: loads with safetensors.torch into the same module, bit-exact tensors
    api.convert(tmp_path / "a.pt", tmp_path / "a.safetensors", read_opts=opts)
    loaded = st_torch.load_file(str(tmp_path / "a.safetensors"))
    _assert_same_sd({k: v.numpy() for k, v in loaded.items()}, sd)
    m2 = getattr(torch.nn, cls)(input_size=5, hidden_size=4, batch_first=True, **kw).eval()
    m2.load_state_dict({k[len("enc.rnn."):]: v for k, v in loaded.items()})
    assert np.array_equal(_out(m2, x), want)
    # .safetensors -> .npz -> .pt: permutation-free copies, bit-exact
    api.convert(tmp_path / "a.safetensors", tmp_path / "a.npz", read_opts=opts)
    api.convert(tmp_path / "a.npz", tmp_path / "b.pt")
    _assert_same_sd({k: v.numpy() for k, v in torch.load(tmp_path / "b.pt", weights_only=True).items()}, sd)
    # .npz -> .onnx runs in onnxruntime like torch
    api.convert(tmp_path / "a.npz", tmp_path / "a.onnx")
    assert np.abs(ort_rt.forward(tmp_path / "a.onnx", None, "enc.rnn", x) - want).max() <= 1e-5


CELLS = [("LSTMCell", {}), ("GRUCell", {"bias": False}), ("RNNCell", {"nonlinearity": "relu"})]


@pytest.mark.parametrize("cls,kw", CELLS, ids=[c for c, _ in CELLS])
def test_cells(cls, kw, tmp_path):
    rng = np.random.default_rng(21)
    cell = getattr(torch.nn, cls)(5, 4, **kw).eval()
    G = {"LSTMCell": 4, "GRUCell": 3, "RNNCell": 1}[cls]
    cell.load_state_dict({k: torch.from_numpy(_gate_distinct(tuple(v.shape), G, rng)) for k, v in cell.state_dict().items()})
    torch.save({"cell": cell.state_dict()}, tmp_path / "c.pt")
    ckpt = api.load(tmp_path / "c.pt", nonlinearity=kw.get("nonlinearity", "tanh"))
    assert ckpt.layers[0].source["class_name"] == f"nn.{cls}"
    x = _x(seed=22)
    # torch's own cell stepped over time is the truth
    h = torch.zeros(2, 4)
    c = torch.zeros(2, 4)
    ys = []
    with torch.no_grad():
        for t in range(x.shape[1]):
            xt = torch.from_numpy(x[:, t])
            if cls == "LSTMCell":
                h, c = cell(xt, (h, c))
            else:
                h = cell(xt, h)
            ys.append(h.double().numpy())
    want = np.stack(ys, axis=1)
    api.convert(tmp_path / "c.pt", tmp_path / "c.onnx", read_opts={"nonlinearity": kw.get("nonlinearity", "tanh")})
    assert np.abs(ort_rt.forward(tmp_path / "c.onnx", None, "cell", x) - want).max() <= 1e-5
    # written back as cell keys, bit-exact
    api.save(ckpt, tmp_path / "d.pt")
    _assert_same_sd({k: v.numpy() for k, v in torch.load(tmp_path / "d.pt", weights_only=True).items()},
                    {f"cell.{k}": v for k, v in cell.state_dict().items()})
    assert np.abs(torch_rt.forward(tmp_path / "d.pt", ckpt, "cell", x, torch_pt.load) - want).max() <= 1e-5


def _model():
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.rnn = _torch_module("LSTM", dict(num_layers=2, bidirectional=True), seed=31)
    m.head = torch.nn.Linear(16, 2)
    return m


def _check_read(path, mod, name="rnn"):
    ckpt = api.load(path)
    x = _x(seed=32)
    got = torch_rt.modules(ckpt)[name]
    assert np.array_equal(_out(got, x), _out(mod, x))
    return ckpt


def test_wrapped_checkpoint_with_dataparallel_prefix_and_no_extension(tmp_path):
    m = _model()
    sd = {f"module.{k}": v for k, v in m.state_dict().items()}
    opt = torch.optim.Adam(m.parameters())
    torch.save({"epoch": 3, "model_state_dict": sd, "optimizer": opt.state_dict()}, tmp_path / "checkpoint")
    assert registry.detect(tmp_path / "checkpoint").name == "pt"
    ckpt = _check_read(tmp_path / "checkpoint", m.rnn)
    assert sorted(ckpt.tensors) == ["head.bias", "head.weight"]


def test_legacy_non_zip_file(tmp_path):
    m = _model()
    torch.save(m.state_dict(), tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)
    assert registry.detect(tmp_path / "legacy.bin").name == "pt"
    _check_read(tmp_path / "legacy.bin", m.rnn)


def test_torchscript_archive_read_without_running_code(tmp_path):
    m = _model()
    torch.jit.script(m).save(str(tmp_path / "ts.pt"))
    with pytest.raises(Exception):  # what torch itself does with weights_only=True
        torch.load(tmp_path / "ts.pt", weights_only=True)
    ckpt = _check_read(tmp_path / "ts.pt", m.rnn)
    assert ckpt.meta["container"] == "TorchScript"
    for k, v in m.state_dict().items():
        arr = ckpt.tensors.get(k)
        if arr is not None:
            assert np.array_equal(arr, v.numpy())


def test_torchscript_with_unknown_global_is_refused(tmp_path):
    import zipfile

    m = _model()
    torch.jit.script(m).save(str(tmp_path / "ts.pt"))
    with zipfile.ZipFile(tmp_path / "ts.pt") as zin, zipfile.ZipFile(tmp_path / "evil.pt", "w") as zout:
        for n in zin.namelist():
            data = zin.read(n)
            if n.endswith("/data.pkl"):
                # same length, still a well-formed stream (a damaged one is refused before any global is looked at)
                data = data.replace(b"collections\nOrderedDict", b"os\nsystem" + b"_" * 14)
            zout.writestr(n, data)
    with pytest.raises(FormatError, match="does not resolve"):
        api.load(tmp_path / "evil.pt")


def test_pickled_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"x": Evil()}, tmp_path / "e.pt")
    with pytest.raises(FormatError, match="weights_only"):
        api.load(tmp_path / "e.pt")


def test_npz_holds_keras_only_semantics(realworld, tmp_path):
    o = np.load(realworld / "mycroft-precise-gru" / "oracle_out.npz")
    api.convert(realworld / "mycroft-precise-gru" / "hey-mycroft.net", tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert "__rnnconvert__" in z.files
    api.convert(tmp_path / "m.npz", tmp_path / "m.onnx")
    y = ort_rt.forward(tmp_path / "m.onnx", None, "net", o["net__in"])[:, -1]
    # ill-conditioned layer: bound as in test_onnx.test_mycroft_gru_reproduces_oracle
    layer = api.load(realworld / "mycroft-precise-gru" / "hey-mycroft.net").layer("net")
    assert_within_float32_spread(layer, o["net__in"], y, last_step=True, what="onnxruntime")


def test_npz_deterministic_and_object_arrays_refused(tmp_path):
    mod = _torch_module("GRU", {}, seed=41)
    torch.save({f"g.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "g.pt")
    api.convert(tmp_path / "g.pt", tmp_path / "a.npz")
    api.convert(tmp_path / "g.pt", tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    np.savez(tmp_path / "o.npz", __rnnconvert__=np.array([{"a": 1}], dtype=object))
    with pytest.raises(FormatError, match="pickle"):
        api.load(tmp_path / "o.npz", format="npz")


def test_cuda_tagged_storages_map_to_cpu(tmp_path):
    """A file whose storages are tagged 'cuda:0' (as torch.save writes for GPU tensors). No GPU here, so
    the tag is set in the pickle; torch itself refuses to load it without map_location (checked)."""
    import zipfile

    mod = _torch_module("GRU", dict(num_layers=2), seed=51)
    torch.save({f"g.{k}": v for k, v in mod.state_dict().items()}, tmp_path / "c.pt")
    with zipfile.ZipFile(tmp_path / "c.pt") as zin, zipfile.ZipFile(tmp_path / "cuda.pt", "w") as zout:
        for n in zin.namelist():
            data = zin.read(n)
            if n.endswith("/data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            zout.writestr(n, data)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(tmp_path / "cuda.pt", weights_only=True)
    ckpt = _check_read(tmp_path / "cuda.pt", mod, name="g")
    assert ckpt.layers[0].num_layers == 2


@pytest.mark.parametrize("kind, kw", [("LSTM", {"bidirectional": True}), ("GRU", {"bidirectional": True}),
                                      ("LSTM", {"proj_size": 3}), ("RNN", {})])
def test_one_packed_call_gives_the_sequence_and_the_steps(kind, kw, tmp_path):
    """torch_rt.run_both (verification's target side: a packed batch of the short sequences from zero states
    and of one-step sequences from given states) returns what the two plain calls return, torch computing
    both (run_module: the sequence; run_step: one step from each state), up to the order of GEMM sums
    (~1e-7 here: the values are O(1))."""
    from rnnconvert import api
    from rnnconvert.formats.torch import pt_read as torch_pt

    m = getattr(torch.nn, kind)(6, 5, batch_first=True, **kw)
    sd = {f"rnn.{k}": v.detach().clone() for k, v in m.state_dict().items()}
    torch.save(sd, tmp_path / "m.pt")
    layer = api.load(tmp_path / "m.pt").layers[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 6)).astype(np.float32)
    xf = rng.standard_normal((7, 6)).astype(np.float32)
    states = [(rng.standard_normal((7, layer.output_size)).astype(np.float32),
               rng.standard_normal((7, 5)).astype(np.float32) if kind == "LSTM" else None)
              for _ in range(layer.num_directions)]
    y, steps = torch_rt.run_both(layer, sd, x, xf, states)
    y1 = torch_rt.run_module(layer, sd, x)
    s1 = torch_rt.run_step(layer, sd, xf, states)
    assert y.shape == y1.shape and np.abs(y - y1).max() <= 1e-5
    for (h, c), (h1, c1) in zip(steps, s1):
        assert np.abs(h - h1).max() <= 1e-5 and (c is None) == (c1 is None)
        if c is not None:
            assert np.abs(c - c1).max() <= 1e-5
