"""Flax linen/NNX msgpack files (issue 31 A; rnnconvert/formats/jax, docs/jax.md): files written by
``flax.serialization`` from cells Flax initialised (fixtures/gen_jax.py).

Oracle: Flax ran each layer on a fixed input (``jax/<name>.oracle.npz``: ``<layer>__in``, ``<layer>__out``);
here torch (``nn.LSTM/GRU/RNN`` from the converted .pt by ``load_state_dict``) or onnxruntime (the converted
.onnx) runs the conversion on the same inputs.

Tolerance: 2e-5 relative plus 1e-6 absolute (issue 31's criterion): H <= 5, T = 5, weights below 0.4, so the
two sides differ by float32 rounding only; the mutations below move outputs by more than 1e-3.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError

JX = FIXTURES / "jax"
RTOL, ATOL = 2e-5, 1e-6
pytest.importorskip("msgpack")
torch = pytest.importorskip("torch")


def _oracle(name: str):
    return np.load(JX / f"{name}.oracle.npz")


def _layers(orc) -> list[str]:
    return sorted(k[: -len("__out")] for k in orc.files if k.endswith("__out"))


def test_detected():
    assert registry.detect(JX / "linen.msgpack").name == "flax_msgpack"


@pytest.mark.parametrize("name", ["linen", "nnx"])
def test_flax_to_pt_and_onnx(tmp_path, name):
    """linen OptimizedLSTMCell, Bidirectional GRUCell, LSTMCell, SimpleCell; NNX OptimizedLSTMCell (fused),
    GRUCell (no b_hn), LSTMCell (``if_``), SimpleCell."""
    orc = _oracle(name)
    api.convert(JX / f"{name}.msgpack", tmp_path / "out.pt")
    mods = api.torch_modules(tmp_path / "out.pt")
    assert sorted(mods) == _layers(orc)
    for layer in _layers(orc):
        with torch.no_grad():
            y = mods[layer](torch.from_numpy(orc[f"{layer}__in"]))[0].numpy()
        np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    api.convert(JX / f"{name}.msgpack", tmp_path / "out.onnx")
    ckpt = api.load(tmp_path / "out.onnx")
    for layer in _layers(orc):
        y = ort_rt.forward(tmp_path / "out.onnx", ckpt, layer, orc[f"{layer}__in"])
        np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)


def test_gru_hidden_bias_trap():
    """Flax's GRU adds b_hn inside r * (h W_hn + b_hn); a port that folds it into the input bias (one bias per
    gate, as for the LSTM) is wrong -- the oracle tells them apart."""
    orc = _oracle("linen")
    layer = next(la for la in api.load(JX / "linen.msgpack").layers if la.name == "bigru")
    y = reference.forward(layer, orc["bigru__in"])
    np.testing.assert_allclose(y, orc["bigru__out"], rtol=1e-5, atol=1e-6)
    H = layer.hidden_size
    naive = []
    for p in layer.params[0]:
        b_ih, b_hh = p.b_ih.copy(), np.zeros_like(p.b_hh)
        b_ih[2 * H:] += p.b_hh[2 * H:]
        naive.append(replace(p, b_ih=b_ih, b_hh=b_hh))
    y_naive = reference.forward(replace(layer, params=[naive]), orc["bigru__in"])
    assert np.max(np.abs(y_naive - orc["bigru__out"])) > 1e-3


def test_swapped_gates_are_caught():
    """Mutation: the LSTM's i and f blocks swapped moves the outputs far from Flax's."""
    orc = _oracle("nnx")
    layer = next(la for la in api.load(JX / "nnx.msgpack").layers if la.name == "lstm")
    p = layer.params[0][0]
    H = layer.hidden_size
    perm = np.r_[H:2 * H, 0:H, 2 * H:4 * H]
    bad = replace(layer, params=[[replace(p, w_ih=p.w_ih[perm], w_hh=p.w_hh[perm], b_hh=p.b_hh[perm])]])
    assert np.max(np.abs(reference.forward(bad, orc["lstm__in"]) - orc["lstm__out"])) > 1e-3


def test_mgu_refused(tmp_path):
    with pytest.raises(UnsupportedError, match="MGUCell"):
        api.convert(JX / "mgu.msgpack", tmp_path / "out.pt")


def test_bad_msgpack(tmp_path):
    data = (JX / "linen.msgpack").read_bytes()
    cases = {"trunc": data[: len(data) // 2], "trailing": data + b"\xc1", "list": b"\x93\x01\x02\x03",
             "ext9": b"\x81\xa1w\xd4\x09\x00"}
    for name, blob in cases.items():
        src = tmp_path / f"{name}.msgpack"
        src.write_bytes(blob)
        with pytest.raises(FormatError):
            api.load(src, "flax_msgpack")


# --- the writer: .pt / .onnx sources into Flax msgpack, run by Flax itself


def _flax_run(path, name: str, cell: str, hidden: int, layers: int, bidi: bool, x: np.ndarray) -> np.ndarray:
    """Flax (not rnnconvert) restores the written file and applies linen cells to it."""
    import jax.numpy as jnp
    from flax import linen as nn
    from flax import serialization

    tree = serialization.msgpack_restore(path.read_bytes())["params"][name]
    mk = lambda: nn.RNN(getattr(nn, cell)(hidden))  # noqa: E731
    mod = nn.Bidirectional(mk(), mk()) if bidi else mk()
    h = jnp.asarray(x)
    for k in range(layers):
        h = mod.apply({"params": tree[f"layers_{k}"] if layers > 1 else tree}, h)
    return np.asarray(h)


@pytest.mark.parametrize("via", ["pt", "onnx"])
def test_pt_and_onnx_sources_run_in_flax(tmp_path, via):
    """torch's own nn.LSTM (2 layers, bidirectional) and nn.GRU, saved by torch.save; the .msgpack written from
    the .pt (or from the .onnx written from it) reproduces torch's outputs in Flax."""
    pytest.importorskip("flax")
    if via == "onnx":
        pytest.importorskip("onnxruntime")
    torch.manual_seed(31)
    lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    gru = torch.nn.GRU(5, 3, batch_first=True)
    sd = {f"enc.{k}": v for k, v in lstm.state_dict().items()} | {f"dec.{k}": v for k, v in gru.state_dict().items()}
    torch.save(sd, tmp_path / "src.pt")
    x = np.random.default_rng(0).standard_normal((2, 6, 3)).astype(np.float32)
    xg = np.random.default_rng(1).standard_normal((2, 6, 5)).astype(np.float32)
    with torch.no_grad():
        y, yg = lstm(torch.from_numpy(x))[0].numpy(), gru(torch.from_numpy(xg))[0].numpy()
    src = tmp_path / "src.pt"
    if via == "onnx":
        api.convert(src, tmp_path / "src.onnx")
        src = tmp_path / "src.onnx"
    rep = api.convert(src, tmp_path / "out.msgpack")
    assert [c.name for c in rep.verification.layers] == ["enc", "dec"]
    np.testing.assert_allclose(_flax_run(tmp_path / "out.msgpack", "enc", "LSTMCell", 4, 2, True, x), y,
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_flax_run(tmp_path / "out.msgpack", "dec", "GRUCell", 3, 1, False, xg), yg,
                               rtol=RTOL, atol=ATOL)
    back = api.load(tmp_path / "out.msgpack")
    assert [(la.name, la.num_layers, la.bidirectional) for la in back.layers] == [("enc", 2, True), ("dec", 1, False)]


def test_verification_catches_swapped_gates_in_the_written_file(tmp_path, monkeypatch):
    """Mutation: a writer that swapped the LSTM's hi/hf Dense is caught by the Flax runtime's verification."""
    pytest.importorskip("flax")
    from rnnconvert.errors import VerificationError
    from rnnconvert.formats.jax import msgpack_write

    real = msgpack_write.cell_params

    def swapped(layer, p):
        d = real(layer, p)
        if "hi" in d:
            d["hi"], d["hf"] = d["hf"], d["hi"]
        return d

    monkeypatch.setattr(msgpack_write, "cell_params", swapped)
    with pytest.raises(VerificationError):
        api.convert(FIXTURES / "pickle" / "torch_dicts.pkl", tmp_path / "out.msgpack")
    assert not (tmp_path / "out.msgpack").exists()


def test_writer_refusals(tmp_path):
    """What linen cells cannot compute is refused naming the feature: a ReLU RNN (activation_fn is not
    stored), an LSTM projection, TF's cell_clip."""
    torch.manual_seed(0)
    torch.save({f"r.{k}": v for k, v in torch.nn.RNN(3, 4, nonlinearity="relu").state_dict().items()},
               tmp_path / "relu.pt")
    with pytest.raises(UnsupportedError, match="ReLU"):
        api.convert(tmp_path / "relu.pt", tmp_path / "a.msgpack", read_opts={"nonlinearity": "relu"})
    torch.save({f"p.{k}": v for k, v in torch.nn.LSTM(3, 4, proj_size=2).state_dict().items()}, tmp_path / "p.pt")
    with pytest.raises(UnsupportedError, match="projection"):
        api.convert(tmp_path / "p.pt", tmp_path / "b.msgpack")
    with pytest.raises(UnsupportedError, match="cell_clip"):
        api.convert(FIXTURES / "tflite" / "lstm.tflite", tmp_path / "c.msgpack")


# ------------------------------------------------------------------ --verify framework: Flax runs the source file

def test_framework_forward_is_flax():
    """``--verify framework``'s source side for a Flax msgpack (rnnconvert.runtimes.flax.framework_forward:
    flax.serialization.msgpack_restore of the source file, the linen cells applied with its parameters as
    stored) reproduces Flax's own outputs saved with the fixture (fixtures/gen_jax.py) within 2e-5 relative."""
    pytest.importorskip("flax")
    from rnnconvert.runtimes import flax as flax_rt

    orc, ck = _oracle("linen"), api.load(JX / "linen.msgpack")
    for name in _layers(orc):
        got, want = flax_rt.framework_forward(JX / "linen.msgpack", ck, name, orc[f"{name}__in"]), orc[f"{name}__out"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)


def test_verify_framework_runs_flax_and_catches_a_misread_gate_order(tmp_path, monkeypatch):
    """A linen source converts to .pt verified with --verify framework (source route: the source framework); a
    reader that swapped the i and f blocks of W_ih (simulated) passes the default verification but not
    --verify framework (Flax running the file itself): never ok, nothing written."""
    pytest.importorskip("flax")
    from rnnconvert.errors import InconclusiveError, VerificationError
    from rnnconvert.formats.jax.spec import FLAX_MSGPACK

    src = JX / "linen.msgpack"
    rep = api.convert(src, tmp_path / "ok.pt", verify="framework").verification
    assert rep.ok and all(c.source_route.endswith("; source framework (sequence)") for c in rep.layers)

    read = FLAX_MSGPACK.read

    def misread(path, **opts):
        ck = read(path, **opts)
        lstm = ck.layer("lstm")
        p, H = lstm.params[0][0], lstm.hidden_size
        bad = replace(lstm, params=[[replace(p, w_ih=np.concatenate([p.w_ih[H:2 * H], p.w_ih[:H], p.w_ih[2 * H:]]))]])
        return replace(ck, layers=[bad if la.name == "lstm" else la for la in ck.layers])

    monkeypatch.setattr(FLAX_MSGPACK, "read", misread)
    assert api.convert(src, tmp_path / "default.pt").verification.ok  # the default cannot see a misreading
    with pytest.raises((VerificationError, InconclusiveError)) as info:
        api.convert(src, tmp_path / "fw.pt", verify="framework")
    assert "reader's slip" in str(info.value) or isinstance(info.value, VerificationError)
    assert not (tmp_path / "fw.pt").exists()


def test_verify_framework_refuses_an_nnx_state_in_one_line(tmp_path):
    pytest.importorskip("flax")
    with pytest.raises(UnsupportedError, match="linen cells") as info:
        api.convert(JX / "nnx.msgpack", tmp_path / "o.pt", verify="framework")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o.pt").exists()
