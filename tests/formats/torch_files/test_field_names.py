"""Files from the field (issue 15): tensors under their owner's own names (rnnconvert/core/names.py) and deep
TorchScript archives, made by the real frameworks (fixtures/gen_field.py).

Oracle: the framework that made each file ran the original modules on fixed inputs (``field/*.oracle.npz``:
torch for the .npz, the hand-written .pt and the scripted archive, tf_keras for the Keras-named
safetensors); here torch (``nn.LSTM/GRU`` built from the converted .pt) or onnxruntime (the converted
.onnx) runs the conversion on the same inputs.

Tolerance: 1e-5 absolute, what verification uses for float32 agreement (rnnconvert/verify.py). The
layers are small (H <= 7, T = 5), weights below 0.4 and every activation is sigmoid/tanh, so the two sides
differ by rounding only (measured here: <= 2e-7); a different CPU or BLAS reorders sums, which moves
results by a few float32 ulps (~1e-7), far inside 1e-5. A wrong gate order moves them by > 1e-2 (the
mutation tests below check that).
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from conftest import FIXTURES, ROOT
from rnnconvert.runtimes import onnxruntime as ort_rt
from rnnconvert import api
from rnnconvert.core import names
from rnnconvert.errors import FormatError, UnsupportedError

FIELD = FIXTURES / "field"
ATOL = 1e-5
torch = pytest.importorskip("torch")


def _oracle(name: str):
    return np.load(FIELD / f"{name}.oracle.npz")


def _run_pt(dst, layer: str, x: np.ndarray) -> np.ndarray:
    """torch.nn running the converted .pt (modules rebuilt from its tensors by torch's load_state_dict)."""
    mod = api.torch_modules(dst)[layer]
    with torch.no_grad():
        return mod(torch.from_numpy(x))[0].numpy()


def _layers(oracle) -> list[str]:
    return sorted(k[:-len("__out")] for k in oracle.files if k.endswith("__out"))


def test_npz_with_own_names_several_rnns(tmp_path):
    """``<prefix>_w_ih_l0_reverse``-style names, two RNNs and a head in one np.savez file."""
    dst = tmp_path / "out.pt"
    rep = api.convert(FIELD / "multi_rnn.npz", dst)
    assert [c.name for c in rep.verification.layers] == ["encoder", "decoder"]
    orc = _oracle("multi_rnn")
    for name in _layers(orc):
        np.testing.assert_allclose(_run_pt(dst, name, orc[f"{name}__in"]), orc[f"{name}__out"], atol=ATOL, rtol=0)
    info = api.inspect(FIELD / "multi_rnn.npz")
    assert set(info["tensors"]) == {"head_W", "head_b"}
    line = next(r for r in info["recognised"] if r.startswith("encoder"))
    assert "family torch" in line and "gate order i f g o" in line and "out_in" in line


def test_npz_to_onnx_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    from rnnconvert.formats.onnx import onnx_write as onnx_fmt

    dst = tmp_path / "out.onnx"
    api.convert(FIELD / "multi_rnn.npz", dst)
    ckpt = api.load(FIELD / "multi_rnn.npz")
    orc = _oracle("multi_rnn")
    for name in _layers(orc):
        y = ort_rt.forward(dst, ckpt, name, orc[f"{name}__in"])
        np.testing.assert_allclose(y, orc[f"{name}__out"], atol=ATOL, rtol=0)


def test_keras_names_in_safetensors(tmp_path):
    """tf_keras variable names (kernel in_out, gates i f c o / z r h, GRU bias (3H,) or (2, 3H))."""
    pytest.importorskip("onnxruntime")
    from rnnconvert.formats.onnx import onnx_write as onnx_fmt

    src = FIELD / "keras_names.safetensors"
    dst = tmp_path / "out.onnx"
    api.convert(src, dst)
    ckpt = api.load(src)
    orc = _oracle("keras_names")
    for name in _layers(orc):
        y = ort_rt.forward(dst, ckpt, name, orc[f"{name}__in"])
        np.testing.assert_allclose(y, orc[f"{name}__out"], atol=ATOL, rtol=0)
    ra = {layer.name.split("/")[0]: layer.semantics.reset_after for layer in ckpt.layers if layer.cell.value == "GRU"}
    assert ra == {"gru_a": False, "gru_b": True}
    with pytest.raises(UnsupportedError, match="gru_a.*reset_after=False"):  # torch cannot express it
        api.convert(src, tmp_path / "out.pt")


def test_handwritten_cell_needs_the_gate_order(tmp_path):
    """Wx/Wh/b do not tell the gate order: refused without --map, right with it, wrong with a wrong one."""
    src = FIELD / "handwritten.pt"
    with pytest.raises(FormatError, match="gate_order"):
        api.load(src)
    orc = _oracle("handwritten")
    x, want = orc["cell__in"], orc["cell__out"]
    api.convert(src, tmp_path / "ok.pt", map=["gate_order=ifog"])
    np.testing.assert_allclose(_run_pt(tmp_path / "ok.pt", "cell", x), want, atol=ATOL, rtol=0)
    api.convert(src, tmp_path / "bad.pt", map=["gate_order=ifgo"])  # consistent with itself, so verified ...
    assert np.abs(_run_pt(tmp_path / "bad.pt", "cell", x) - want).max() > 1e-2  # ... but not the original


def test_scripted_archive_deep_submodules(tmp_path):
    """torch.jit.save of a wrapper: LSTMCell three levels deep, a GRUCell in a mangled twin class, a
    private nn.LSTM, and a hand-written GRU cell with PyTorch's doc names -- read without running code."""
    src = FIELD / "scripted.pt"
    with zipfile.ZipFile(src) as z:
        assert any("___torch_mangle" in n for n in z.namelist())  # the fixture has a mangled class
    ckpt = api.load(src)
    assert sorted(layer.name for layer in ckpt.layers) == ["_rnn", "aux.cell", "post.0", "speller.decoder.cell"]
    assert not any("_flat_weights" in k for k in ckpt.tensors)  # private copies of the LSTM's weights
    dst = tmp_path / "out.pt"
    api.convert(src, dst)
    orc = _oracle("scripted")
    for name in _layers(orc):
        np.testing.assert_allclose(_run_pt(dst, name, orc[f"{name}__in"]), orc[f"{name}__out"], atol=ATOL, rtol=0)


def _renamed(tmp_path, mapping: dict[str, str], extra: dict | None = None):
    """multi_rnn.npz with some keys renamed (the same torch-made arrays)."""
    with np.load(FIELD / "multi_rnn.npz") as z:
        arrays = {mapping.get(k, k): z[k] for k in z.files}
    arrays.update(extra or {})
    p = tmp_path / "renamed.npz"
    np.savez(p, **arrays)
    return p


def test_two_names_for_one_role_is_an_error_listing_both(tmp_path):
    with np.load(FIELD / "multi_rnn.npz") as z:
        dup = {"encoder_weight_ih_l0": z["encoder_w_ih_l0"]}
    p = _renamed(tmp_path, {}, dup)
    with pytest.raises(FormatError, match="encoder_w_ih_l0.*encoder_weight_ih_l0|encoder_weight_ih_l0.*encoder_w_ih_l0"):
        api.load(p)


def test_square_shapes_need_the_orientation(tmp_path):
    """A simple RNN with I == H under W/U names fits both orientations: refused, listing both readings."""
    rnn = torch.nn.RNN(4, 4)
    w = {"W": rnn.weight_ih_l0.detach().numpy(), "U": rnn.weight_hh_l0.detach().numpy()}
    p = tmp_path / "sq.npz"
    np.savez(p, **w)
    with pytest.raises(FormatError, match="out_in H=4 G=1.*in_out H=4 G=1"):
        api.load(p)
    ckpt = api.load(p, map=["orientation=out_in"])
    assert np.array_equal(ckpt.layers[0].params[0][0].w_ih, w["W"])
    ckpt = api.load(p, map=["orientation=in_out"])
    assert np.array_equal(ckpt.layers[0].params[0][0].w_ih, w["W"].T)


DEC = {"decoder_w_ih_l0": "dec/A", "decoder_w_hh_l0": "dec/B", "decoder_b_ih_l0": "dec/C", "decoder_b_hh_l0": "dec/D"}


@pytest.mark.parametrize("how", ["pairs", "json", "toml"])
def test_map_names_roles_gate_order(tmp_path, how):
    """Names no rule knows, said once by the user: PATTERN=ROLE pairs, a JSON or a TOML file."""
    p = _renamed(tmp_path, DEC)
    assert [layer.name for layer in api.load(p).layers] == ["encoder"]  # dec/A.. are no known names
    rules = {"dec/A": "decoder.w_ih", "dec/B": "decoder.w_hh", "dec/C": "decoder.b_ih", "dec/D": "decoder.b_hh"}
    opts = {"gate_order": "rzn", "reset_after": True}  # for the decoder only: the encoder is an LSTM
    if how == "pairs":
        m = [f"{k}={v}" for k, v in rules.items()] + ["decoder.gate_order=rzn", "decoder.reset_after=true"]
    elif how == "json":
        m = tmp_path / "map.json"
        m.write_text(json.dumps({"tensors": rules, "layers": {"decoder": opts}}))
    else:
        m = tmp_path / "map.toml"
        m.write_text("[tensors]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in rules.items())
                     + "[layers.decoder]\ngate_order = 'rzn'\nreset_after = true\n")
    dst = tmp_path / "out.pt"
    api.convert(p, dst, map=m)
    orc = _oracle("multi_rnn")
    np.testing.assert_allclose(_run_pt(dst, "decoder", orc["decoder__in"]), orc["decoder__out"], atol=ATOL, rtol=0)


def test_map_without_gate_order_is_refused(tmp_path):
    p = _renamed(tmp_path, DEC)
    with pytest.raises(FormatError, match="gate_order"):
        api.load(p, map=[f"dec/{k}=decoder.{r}" for k, r in zip("ABCD", ("w_ih", "w_hh", "b_ih", "b_hh"))])


def test_map_wildcards_name_the_layer():
    nm = names.parse_map(["*/A=w_ih", "x=other"])
    assert nm.role_of("dec/A") == ("dec", "w_ih", None, False)
    assert nm.role_of("x") == ("rnn", "other", None, False)
    with pytest.raises(FormatError, match="role"):
        names.parse_map(["a=w_xx"])
    with pytest.raises(FormatError, match="not an order"):
        names.recognise({"W": np.zeros((8, 3)), "U": np.zeros((8, 2))}, "f", "npz", map=["gate_order=ifgx"])


def test_name_table_parses_field_names():
    hit = names.classify("bidirectional/backward_lstm/lstm_cell/recurrent_kernel:0")
    assert (hit.role, hit.rev, hit.family) == ("w_hh", True, "keras")
    hit = names.classify("rnn/layer_1/bw/kernel")
    assert (hit.layer, hit.k, hit.rev, hit.role) == ("rnn", 1, True, "w_ih")
    hit = names.classify("encoder_b_hh_l1_reverse")
    assert (hit.layer, hit.k, hit.rev, hit.role, hit.family) == ("encoder", 1, True, "b_hh", "torch")
    assert names.classify("head.weight") is None


def test_hdf5_with_own_names(tmp_path):
    """An HDF5 file that is not Keras: groups and datasets named by their owner (h5py)."""
    h5py = pytest.importorskip("h5py")
    p = tmp_path / "own.h5"
    with np.load(FIELD / "multi_rnn.npz") as z, h5py.File(p, "w") as f:
        for k in z.files:
            prefix, _, rest = k.partition("_")
            f.create_dataset(f"{prefix}/{rest}", data=z[k])
    dst = tmp_path / "out.pt"
    api.convert(p, dst)
    orc = _oracle("multi_rnn")
    for name in _layers(orc):
        np.testing.assert_allclose(_run_pt(dst, name, orc[f"{name}__in"]), orc[f"{name}__out"], atol=ATOL, rtol=0)


def test_cli_inspect_and_map(tmp_path, capsys):
    from rnnconvert.cli import main

    assert main(["inspect", str(FIELD / "multi_rnn.npz"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [r.split(":")[0] for r in info["recognised"]] == ["encoder", "decoder"]
    assert main(["inspect", str(FIELD / "handwritten.pt"), "--map", "gate_order=ifog"]) == 0
    assert "recognised cell: LSTM H=6" in capsys.readouterr().out
    assert main([str(FIELD / "handwritten.pt"), str(tmp_path / "a.pt")]) == 3
    assert not (tmp_path / "a.pt").exists()
    assert main([str(FIELD / "handwritten.pt"), str(tmp_path / "a.pt"), "--map", "gate_order=ifog"]) == 0


def test_gen_field_is_the_producer():
    """The fixtures are the committed script's output (manifest), not hand-made."""
    man = json.loads((FIXTURES / "manifest.json").read_text())["field"]
    assert {e["file"] for e in man} == {f"field/{p.name}" for p in FIELD.iterdir() if ".oracle." not in p.name}
    assert (ROOT / "fixtures" / "gen_field.py").exists()


def test_attention_weights_beside_rnns(tmp_path):
    """Bahdanau-style W/U (square) beside the RNNs: refused as ambiguous when the table must read the
    file, with the way out (``=other``); carried along untouched beside torch.nn keys."""
    rnn = torch.nn.RNN(4, 4)
    att = {"attn_W": rnn.weight_ih_l0.detach().numpy(), "attn_U": rnn.weight_hh_l0.detach().numpy()}
    p = _renamed(tmp_path, {}, att)
    with pytest.raises(FormatError, match="attn_.*=other"):
        api.load(p)
    ckpt = api.load(p, map=["attn_*=other"])
    assert [layer.name for layer in ckpt.layers] == ["encoder", "decoder"] and set(att) <= set(ckpt.tensors)
    lstm = torch.nn.LSTM(3, 4)
    sd = {**lstm.state_dict(), "attn.W": torch.from_numpy(att["attn_W"]), "attn.U": torch.from_numpy(att["attn_U"])}
    torch.save(sd, tmp_path / "with_attn.pt")
    ckpt = api.load(tmp_path / "with_attn.pt")
    assert [layer.name for layer in ckpt.layers] == ["rnn"] and {"attn.W", "attn.U"} <= set(ckpt.tensors)
    assert any(line.startswith("attn: not read") for line in ckpt.meta["recognised"])


def test_report_says_the_reading_is_not_verified(tmp_path):
    rep = api.convert(FIELD / "handwritten.pt", tmp_path / "a.pt", map=["gate_order=ifog"])
    assert any("cell: read by its tensor names" in n and "inconclusive" in n and "i f o g" in n for n in rep.notes)


def test_projection_under_abbreviated_names(tmp_path):
    """nn.LSTM(proj_size=3) saved by numpy as w_ih_l0/w_hh_l0/w_hr_l0/...: torch runs the original module
    (the oracle) and the converted .pt on the same inputs."""
    torch.manual_seed(3)
    lstm = torch.nn.LSTM(4, 6, proj_size=3, batch_first=True)
    p = tmp_path / "proj.npz"
    np.savez(p, **{f"lm_{k.replace('weight_', 'w_').replace('bias_', 'b_')}": v.numpy()
                   for k, v in lstm.state_dict().items()})
    api.convert(p, tmp_path / "out.pt")
    x = np.random.default_rng(3).standard_normal((2, 5, 4)).astype(np.float32)
    with torch.no_grad():
        want = lstm(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(_run_pt(tmp_path / "out.pt", "lm", x), want, atol=ATOL, rtol=0)


def test_peepholes_by_role(tmp_path):
    """TF1's peephole names (w_i_diag, w_f_diag, w_o_diag) land in the canonical peep rows p_i, p_f, p_o."""
    rng = np.random.default_rng(5)
    # gate-distinct and unit-distinct (a constant within a gate would hide a reversed or transposed diagonal)
    diag = {g: (k + 1 + rng.uniform(-0.2, 0.2, 2)).astype(np.float32) for k, g in enumerate("ifo")}
    t = {"c/kernel": rng.random((3, 8), np.float32), "c/recurrent_kernel": rng.random((2, 8), np.float32),
         "c/bias": rng.random(8, np.float32), "c/w_f_diag": diag["f"], "c/w_i_diag": diag["i"],
         "c/w_o_diag": diag["o"]}
    layer = names.recognise(t, "f", "npz").layer("c")
    assert np.array_equal(layer.params[0][0].peep, np.stack([diag["i"], diag["f"], diag["o"]]))
    t.pop("c/w_o_diag")
    with pytest.raises(FormatError, match="peep_o"):
        names.recognise(t, "f", "npz")
