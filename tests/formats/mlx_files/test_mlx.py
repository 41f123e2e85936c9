"""MLX (``mlx.nn.LSTM``/``GRU``/``RNN`` weights, ``save_weights``): the oracle is MLX itself -- fixtures saved by
MLX's own ``save_weights`` with MLX's outputs (``fixtures/gen_mlx.py``), and written files loaded by ``mx.load``
into ``mlx.nn`` modules and run by MLX. PyTorch and onnxruntime run the converted ``.pt``/``.onnx``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, manifest
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError

torch = pytest.importorskip("torch")
ENTRIES = manifest("mlx")
RTOL = 2e-5  # relative to the output's largest magnitude: float32 evaluation differs by ~1e-7


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def _oracle(entry):
    o = np.load(FIXTURES / entry["oracle"])
    return {k[:-len("__out")]: (o[f"{k[:-len('__out')]}__in"], o[k]) for k in o.files if k.endswith("__out")}


def _run_pt(dst, name, x, **opts):
    mod = api.torch_modules(dst, **opts)[name]  # a .pt does not store an RNN's nonlinearity: told as for MLX
    with torch.no_grad():
        return mod(torch.from_numpy(x))[0].numpy()


def _run_onnx(dst, name, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    feeds = {i.name: (x if i.name == f"{name}__in" else np.zeros((x.shape[0], x.shape[1], i.shape[2]), np.float32))
             for i in sess.get_inputs()}
    return sess.run([f"{name}__out"], feeds)[0]


def test_gen_mlx_is_the_producer():
    """Every file in fixtures/mlx is in the manifest, made by fixtures/gen_mlx.py with mlx."""
    assert {e["file"] for e in ENTRIES} == {f"mlx/{p.name}" for p in (FIXTURES / "mlx").iterdir()
                                            if ".oracle." not in p.name}
    assert all(e["producer"].startswith("mlx ") for e in ENTRIES)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if not e.get("ambiguous")], ids=lambda e: e["file"])
@pytest.mark.parametrize("ext", [".pt", ".onnx"])
def test_mlx_file_converts_reproducing_mlx(entry, ext, tmp_path):
    """A file saved by MLX's save_weights converts (verified) to .pt / .onnx, and torch / onnxruntime running
    the result reproduce MLX's own outputs within 2e-5 relative."""
    if ext == ".onnx":
        pytest.importorskip("onnx")
    src = FIXTURES / entry["file"]
    assert registry.detect(src).name == "mlx"
    dst = tmp_path / f"out{ext}"
    api.convert(src, dst, read_opts=entry.get("read_opts"))  # verified (the default) before it is renamed
    for name, (x, want) in _oracle(entry).items():
        got = _run_pt(dst, name, x, **entry.get("read_opts", {})) if ext == ".pt" else _run_onnx(dst, name, x)
        assert _rel(got, want) < RTOL, (name, _rel(got, want))


def test_mlx_files_are_not_claimed_by_safetensors(tmp_path):
    """The two safetensors sniffers exclude each other: MLX key sets are mlx, torch.nn keys are safetensors."""
    for e in ENTRIES:
        assert [f.name for f in registry._sniffed(b"", FIXTURES / e["file"]) if f.name != "mlx"] == []
        head = (FIXTURES / e["file"]).read_bytes()[:64]
        assert [f.name for f in registry._sniffed(head, FIXTURES / e["file"])] == ["mlx"]
    sf = pytest.importorskip("safetensors.numpy")
    p = tmp_path / "t.safetensors"
    sf.save_file({k: v.numpy() for k, v in torch.nn.LSTM(3, 4).state_dict().items()}, str(p))
    assert registry.detect(p).name == "safetensors"
    # hand-written Wx/Wh/b cells are no MLX module (MLX's GRU stores b with bhn): left to the foreign-name table
    sf.save_file({"cell.Wx": np.zeros((3, 16), np.float32), "cell.Wh": np.zeros((4, 16), np.float32),
                  "cell.b": np.zeros(16, np.float32)}, str(p))
    assert registry.detect(p).name == "safetensors"


def _torch_model(cell: str, layers: int):
    torch.manual_seed(7)
    mod = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(cell)
    m = (mod(3, 4, num_layers=layers, batch_first=True) if mod else
         torch.nn.RNN(3, 4, num_layers=layers, nonlinearity="relu", batch_first=True))
    rng = np.random.default_rng(11)
    with torch.no_grad():  # gate-distinct: block k of each weight around 0.3 k
        for _, p in m.named_parameters():
            g = p.shape[0] // 4
            p.copy_(torch.from_numpy((np.repeat(np.arange(p.shape[0] // g), g).reshape(-1, *([1] * (p.dim() - 1)))
                                      * 0.3 + rng.uniform(-0.2, 0.2, tuple(p.shape))).astype(np.float32)))
    return m


def _run_mlx(path, name, cell, layers, x, relu=False):
    """MLX's own modules loading the written file (mx.load, load_weights strict), chained."""
    mx = pytest.importorskip("mlx.core")
    nn = pytest.importorskip("mlx.nn")
    t = mx.load(str(path))
    y = mx.array(x)
    for k in range(layers):
        pre = name if layers == 1 else f"{name}.layers.{k}"
        i = x.shape[-1] if k == 0 else 4
        m = {"LSTM": nn.LSTM, "GRU": nn.GRU}.get(cell)
        m = m(i, 4) if m else nn.RNN(i, 4, nonlinearity=nn.relu)
        m.load_weights([(key[len(pre) + 1:], v) for key, v in t.items() if key.rsplit(".", 1)[0] == pre], strict=True)
        y = m(y)
        y = y[0] if isinstance(y, tuple) else y
    return np.asarray(y)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("src_ext", [".pt", ".onnx"])
def test_pt_and_onnx_sources_into_mlx_run_by_mlx(cell, src_ext, tmp_path):
    """torch.nn modules (2 stacked layers) saved as .pt (and converted to .onnx) convert into MLX safetensors
    (verified by the mlx runtime), and MLX's own modules loading the file reproduce torch's outputs."""
    pytest.importorskip("mlx.core")
    m = _torch_model(cell, 2)
    src = tmp_path / "m.pt"
    torch.save(m.state_dict(), src)
    if src_ext == ".onnx":
        pytest.importorskip("onnx")
        api.convert(src, tmp_path / "m.onnx")
        src = tmp_path / "m.onnx"
    dst = tmp_path / "out.mlx.safetensors"
    api.convert(src, dst)  # verified by the mlx runtime before it is renamed
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x))[0].numpy()
    assert _rel(_run_mlx(dst, "rnn", cell, 2, x), want) < RTOL


def test_mlx_to_mlx_keeps_every_tensor(tmp_path):
    """LSTM bias and GRU b/bhn come back bit-exact (b_hh is 0 where MLX has no recurrent bias: no rounding)."""
    src = FIXTURES / "mlx/model.safetensors"
    dst = tmp_path / "m.mlx.safetensors"
    api.convert(src, dst, read_opts={"nonlinearity": "relu"})
    a, b = api.load(src, nonlinearity="relu"), api.load(dst, nonlinearity="relu")
    for la, lb in zip(a.layers, b.layers):
        for f in ("w_ih", "w_hh", "b_ih", "b_hh"):
            assert np.array_equal(getattr(la.params[0][0], f), getattr(lb.params[0][0], f))
    assert set(a.tensors) == set(b.tensors) == {"head.weight", "head.bias"}


# ------------------------------------------------------------------ the traps a naive port falls into

def test_orientation_trap_legacy_layout():
    """MLX < 0.18 stored (in, G*H): the reader tells it from the LSTM's Wh shape and reads the file's square
    RNN (I == H, shapes fit both) the same way; MLX's outputs are reproduced. A naive port taking the current
    (out, in) layout is wrong on the RNN (and does not fit the LSTM's shapes at all)."""
    entry = next(e for e in ENTRIES if e["file"] == "mlx/legacy.safetensors")
    ck = api.load(FIXTURES / entry["file"])
    for name, (x, want) in _oracle(entry).items():
        assert _rel(reference.forward(ck.layer(name), x.astype(np.float64)), want) < RTOL
    with pytest.raises(FormatError):
        api.load(FIXTURES / entry["file"], orientation="out_in")  # the LSTM's shapes contradict it
    x, want = _oracle(entry)["dec"]
    naive = api.load(FIXTURES / entry["file"], orientation="in_out").layer("dec")
    assert _rel(reference.forward(naive, x.astype(np.float64)), want) < RTOL
    flipped = naive.params[0][0]
    from dataclasses import replace

    wrong = replace(naive, params=[[replace(flipped, w_ih=flipped.w_ih.T.copy(), w_hh=flipped.w_hh.T.copy())]])
    assert _rel(reference.forward(wrong, x.astype(np.float64)), want) > 1e-2


def test_orientation_ambiguous_is_refused_naming_the_option():
    """A lone square RNN fits both layouts: refused (one line naming orientation=), read when told."""
    entry = next(e for e in ENTRIES if e.get("ambiguous"))
    with pytest.raises(FormatError, match="orientation=out_in or orientation=in_out") as info:
        api.load(FIXTURES / entry["file"])
    assert "\n" not in str(info.value)
    x, want = _oracle(entry)["rnn"]
    good = api.load(FIXTURES / entry["file"], orientation="out_in").layer("rnn")
    bad = api.load(FIXTURES / entry["file"], orientation="in_out").layer("rnn")
    assert _rel(reference.forward(good, x.astype(np.float64)), want) < RTOL
    assert _rel(reference.forward(bad, x.astype(np.float64)), want) > 1e-2


def test_gru_bias_trap():
    """MLX's GRU b holds the r/z biases of both sides and n's input bias; bhn sits inside the reset product.
    A naive port that puts b in b_ih and bhn's rows nowhere (or b_hh = b) misses MLX's outputs."""
    entry = next(e for e in ENTRIES if e["file"] == "mlx/gru.npz")
    layer = api.load(FIXTURES / entry["file"]).layer("gru")
    x, want = _oracle(entry)["gru"]
    assert _rel(reference.forward(layer, x.astype(np.float64)), want) < RTOL
    from dataclasses import replace

    p = layer.params[0][0]
    for naive in (replace(p, b_hh=np.zeros_like(p.b_hh)), replace(p, b_hh=p.b_ih.copy())):
        assert _rel(reference.forward(replace(layer, params=[[naive]]), x.astype(np.float64)), want) > 1e-3


# ------------------------------------------------------------------ refusals and bad input

def test_refusals_name_the_feature(tmp_path):
    torch.save(torch.nn.LSTM(3, 4, bidirectional=True).state_dict(), tmp_path / "bi.pt")
    torch.save(torch.nn.LSTM(3, 4, proj_size=2).state_dict(), tmp_path / "p.pt")
    for src, what in (("bi.pt", "bidirectional"), ("p.pt", "projection")):
        with pytest.raises(UnsupportedError, match=what) as info:
            api.convert(tmp_path / src, tmp_path / "o.mlx.safetensors")
        assert "\n" not in str(info.value) and not (tmp_path / "o.mlx.safetensors").exists()


def test_bfloat16_is_one_line(tmp_path):
    mx = pytest.importorskip("mlx.core")
    nn = pytest.importorskip("mlx.nn")
    m = nn.LSTM(3, 4)
    m.set_dtype(mx.bfloat16)
    m.save_weights(str(tmp_path / "bf.safetensors"))
    with pytest.raises(FormatError, match="BF16") as info:
        api.load(tmp_path / "bf.safetensors")
    assert "\n" not in str(info.value)


def test_header_offsets_outside_the_file_are_refused(tmp_path):
    src = (FIXTURES / "mlx/lstm.safetensors").read_bytes()
    n = int.from_bytes(src[:8], "little")
    head = json.loads(src[8:8 + n])
    head["Wx"]["data_offsets"] = [0, 10 ** 9]
    js = json.dumps(head).encode()
    (tmp_path / "bad.safetensors").write_bytes(len(js).to_bytes(8, "little") + js + src[8 + n:])
    with pytest.raises(FormatError, match="bad header record"):
        api.load(tmp_path / "bad.safetensors", "mlx")


def test_verification_catches_swapped_gates_in_a_written_mlx_file(tmp_path):
    pytest.importorskip("mlx.core")
    from dataclasses import replace

    torch.save(torch.nn.GRU(3, 4).state_dict(), tmp_path / "m.pt")
    good = api.load(tmp_path / "m.pt")
    layer = good.layers[0]
    p, H = layer.params[0][0], layer.hidden_size
    bad = replace(layer, params=[[replace(p, w_hh=np.concatenate([p.w_hh[H:2 * H], p.w_hh[:H], p.w_hh[2 * H:]]))]])
    api.save(replace(good, layers=[bad]), tmp_path / "bad.mlx.safetensors", "mlx")
    rep = api.verify(tmp_path / "m.pt", tmp_path / "bad.mlx.safetensors")
    assert any(c.verdict != "ok" for c in rep.layers)
    assert "MLX" in rep.layers[0].target_route


# ------------------------------------------------------------------ --verify framework: MLX runs the source file

@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["file"] != "mlx/legacy.safetensors"],
                         ids=lambda e: e["file"])
def test_framework_forward_is_mlx(entry):
    """``--verify framework``'s source side (rnnconvert.runtimes.mlx.framework_forward: mx.load of the source file,
    load_weights(strict=True) into a fresh mlx.nn module) reproduces MLX's own outputs saved with the fixture
    (fixtures/gen_mlx.py) within 2e-5 relative: it is MLX, not rnnconvert's reading of the file."""
    pytest.importorskip("mlx.core")
    from rnnconvert.runtimes import mlx as mlx_rt

    ckpt = api.load(FIXTURES / entry["file"], **entry.get("read_opts", {}))
    for name, (x, want) in _oracle(entry).items():
        assert _rel(mlx_rt.framework_forward(FIXTURES / entry["file"], ckpt, name, x), want) < RTOL, name


def test_verify_framework_runs_mlx_and_catches_a_misread_gate_order(tmp_path, monkeypatch):
    """An MLX source converts to .pt verified with --verify framework (source route: the source framework); and
    a reader that swapped the i and f blocks of Wx (simulated) passes the default verification (the source side
    is then the numpy reference on what was read) but not --verify framework, whose source side is MLX running
    the file itself: the engine calls the parting of MLX's run and the reading a reader's slip (inconclusive) or
    fails it, and writes nothing."""
    pytest.importorskip("mlx.core")
    from dataclasses import replace

    from rnnconvert.errors import InconclusiveError, VerificationError
    from rnnconvert.formats.mlx.spec import MLX

    src = FIXTURES / "mlx/lstm.safetensors"
    rep = api.convert(src, tmp_path / "ok.pt", verify="framework").verification
    assert rep.ok and all(c.source_route.endswith("; source framework (sequence)") for c in rep.layers)

    read = MLX.read

    def misread(path, **opts):
        ck = read(path, **opts)
        layers = []
        for layer in ck.layers:
            p, H = layer.params[0][0], layer.hidden_size
            w = np.concatenate([p.w_ih[H:2 * H], p.w_ih[:H], p.w_ih[2 * H:]])
            layers.append(replace(layer, params=[[replace(p, w_ih=w)]]))
        return replace(ck, layers=layers)

    monkeypatch.setattr(MLX, "read", misread)
    assert api.convert(src, tmp_path / "default.pt").verification.ok  # the default cannot see a misreading
    with pytest.raises((VerificationError, InconclusiveError)) as info:  # never "ok"; the engine names the slip
        api.convert(src, tmp_path / "fw.pt", verify="framework")
    assert "reader's slip" in str(info.value) or isinstance(info.value, VerificationError)
    assert not (tmp_path / "fw.pt").exists()


def test_verify_framework_refuses_the_legacy_layout_in_one_line(tmp_path):
    pytest.importorskip("mlx.core")
    with pytest.raises(UnsupportedError, match="MLX < 0.18") as info:
        api.convert(FIXTURES / "mlx/legacy.safetensors", tmp_path / "o.pt", verify="framework")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o.pt").exists()
