"""``rnnconvert diagnose`` (issue #32) on a slip corpus of hand ports (fixtures/gen_slips.py: PyTorch state
dicts made with h5py, numpy and ``torch.save`` from the framework-made Keras fixtures, the real-world textgenrnn
and mycroft checkpoints, a TF1 checkpoint read by TensorFlow, a torch-made LSTM; never rnnconvert's writer).

Oracles: the correct ports (controls) are settled by the frameworks -- ``torch.nn`` running the hand-made state
dict reproduces Keras's own outputs stored beside the fixture (``<layer>__out``); a ``--fix`` output likewise
runs in ``torch.nn`` to Keras's outputs. Each slip and each pair must be named exactly (layer, kind, tensor);
the confirmation numbers (the slipped source reproduces DST, the source does not) are asserted as measured.

Issue #43 (``gen_slips.build_issue43``, sources from fixtures/gen_slipsrc.py and tf/bidi_lstm): an unfolded TF1
forget bias in a BiLSTM (.pt, one ONNX direction), reset placement in ONNX GRU nodes of a stacked torch GRU, a
Keras 3 decoder GRU's gate order; the ports run by torch.nn / onnxruntime against the frameworks' outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import fixture_script  # noqa: E402

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
gen_slips = fixture_script("gen_slips")

from rnnconvert import api  # noqa: E402
from rnnconvert.cli import main  # noqa: E402
from rnnconvert.errors import UnsupportedError, VerificationError  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("slips")
    return {c["name"]: c for c in gen_slips.build(out)}


NAMES = ["control_lstm", "control_gru_reset_after", "control_textgenrnn", "control_textgenrnn_summed_biases",
         "lstm_w_hh_onnx_order", "lstm_w_ih_reshaped", "lstm_w_hh_blocks_not_transposed", "gru_keras_gate_order",
         "gru_biases_summed", "gru_b_hh_dropped", "bidi_directions_exchanged", "textgenrnn_layers_exchanged",
         "textgenrnn_cudnn_kernel_transposed", "lstm_hard_sigmoid_as_sigmoid", "gru_reset_before_as_after",
         "lstm_go_backwards_ignored", "torch_stacked_layers_exchanged", "pair_gru_keras_order_b_hh_dropped",
         "pair_bidi_exchanged_w_hh_onnx", "pair_hard_sigmoid_w_ih_reshaped",
         "pair_textgenrnn_onnx_order_b_hh_dropped", "mycroft_keras_order_in_torch"]


def _torch_run(state: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    """``torch.nn`` built from a hand-made state dict's shapes, run on ``x`` (batch first)."""
    sd = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
    w = sd["weight_ih_l0"]
    H = sd["weight_hh_l0"].shape[1]
    cls = {4: torch.nn.LSTM, 3: torch.nn.GRU}[w.shape[0] // H]
    m = cls(w.shape[1], H, batch_first=True, bidirectional=any(k.endswith("_reverse") for k in sd))
    m.load_state_dict(sd)
    with torch.no_grad():
        return m(torch.from_numpy(np.ascontiguousarray(x, np.float32)))[0].numpy()


def test_corpus_is_complete(corpus):
    assert sorted(corpus) == sorted(NAMES)


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("control_") and "summed" not in n])
def test_controls_reproduce_the_frameworks_outputs(corpus, name):
    """The generator's correct ports are right by Keras's own numbers (oracle: Keras outputs in the fixture's
    .npz, torch.nn running the port)."""
    c = corpus[name]
    npz, layer = c["oracle"]
    z = np.load(ROOT / "fixtures" / npz)
    y = _torch_run(torch.load(c["dst"], weights_only=True), layer, z[f"{layer}__in"])
    want = z[f"{layer}__out"]
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("name", NAMES)
def test_each_slip_is_named(corpus, name):
    c = corpus[name]
    rep = api.diagnose(c["src"], c["dst"], run_verify=False)
    got = sorted({(s.layer, s.kind, s.tensor) for ld in rep.layers for s in ld.slips})
    assert got == sorted(tuple(e) for e in c["expect"])
    assert rep.verdict == ("ok" if c["ok"] else "slip")
    for ld in rep.layers:
        e = ld.errors
        if ld.verdict == "slip":  # confirmed: the slipped source gives DST's outputs, the source does not
            # (layers exchanged across shapes: the layer's own source cannot even run on DST's sizes)
            assert e["slipped"] <= e["tolerance"] < e.get("source", np.inf)
            assert all(s.message for s in ld.slips)
        else:
            assert e["source"] <= e["tolerance"]


def test_summed_lstm_biases_are_ok_and_said(corpus):
    c = corpus["control_textgenrnn_summed_biases"]
    rep = api.diagnose(c["src"], c["dst"], run_verify=False)
    assert rep.verdict == "ok" and all("summed" in ld.note for ld in rep.layers)


def test_gate_order_message_names_the_order(corpus):
    c = corpus["gru_keras_gate_order"]
    ld = api.diagnose(c["src"], c["dst"], run_verify=False).layers[0]
    s = next(s for s in ld.slips if s.tensor == "w_hh")
    assert (s.frm, s.to, s.depth, s.direction) == ("zrn", "rzn", 0, 0)
    assert s.message.startswith("gru (layer 0, forward): weight_hh_l0 gate blocks are in order z,r,n")
    assert "where PyTorch expects r,z,n (z and r exchanged)" in s.message


@pytest.mark.parametrize("name", ["lstm_w_hh_onnx_order", "lstm_w_ih_reshaped", "lstm_w_hh_blocks_not_transposed",
                                  "gru_keras_gate_order", "gru_biases_summed", "pair_gru_keras_order_b_hh_dropped",
                                  "pair_bidi_exchanged_w_hh_onnx", "textgenrnn_layers_exchanged",
                                  "textgenrnn_cudnn_kernel_transposed", "torch_stacked_layers_exchanged"])
def test_fix_is_verified(corpus, name, tmp_path):
    c = corpus[name]
    out = tmp_path / "fixed.pt"
    rep = api.diagnose(c["src"], c["dst"], fix=out, run_verify=False)
    assert rep.fixed == str(out) and rep.fix_verification.verdict == "ok"
    assert api.verify(c["src"], out).verdict == "ok"
    assert api.diagnose(c["src"], out, run_verify=False).verdict == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["fixed.pt"]  # nothing else left beside it
    src = Path(c["src"])
    oracle = src.with_suffix(".npz")
    if oracle.exists() and src.parent.name == "keras":  # Keras's own outputs: torch.nn runs the fixed file to them
        z = np.load(oracle)
        state = torch.load(out, weights_only=True)
        layer = next(k.split(".")[0] for k in state)
        y = _torch_run(state, layer, z[f"{layer}__in"])
        assert np.abs(y - z[f"{layer}__out"]).max() <= 1e-4 * max(1.0, float(np.abs(z[f"{layer}__out"]).max()))


@pytest.mark.parametrize("name", ["lstm_hard_sigmoid_as_sigmoid", "gru_reset_before_as_after"])
def test_fix_refused_where_pytorch_cannot_express_the_source(corpus, name, tmp_path):
    c = corpus[name]
    with pytest.raises(UnsupportedError, match="onnx"):
        api.diagnose(c["src"], c["dst"], fix=tmp_path / "fixed.pt", run_verify=False)
    assert not list(tmp_path.iterdir())


def test_unexplained_names_the_first_diverging_step(corpus, tmp_path):
    """A nudged bias (no known slip) is said unexplained, with where the outputs part; --fix refuses."""
    c = corpus["control_lstm"]
    state = torch.load(c["dst"], weights_only=True)
    state["lstm.bias_ih_l0"] = state["lstm.bias_ih_l0"].clone()
    state["lstm.bias_ih_l0"][1] += 0.25  # the i gate: the outputs part at the first step
    dst = tmp_path / "nudged.pt"
    torch.save(state, dst)
    rep = api.diagnose(c["src"], dst, run_verify=False)
    ld = rep.layers[0]
    assert rep.verdict == "unexplained" and not ld.slips
    assert ld.diverge["step"] == 0 and ld.diverge["direction"] == 0
    assert ld.diverge["max_abs_diff"] > ld.diverge["tolerance"]
    assert "no known slip explains it" in ld.note and "bias_ih_l0" in ld.note and "step 0" in ld.note
    with pytest.raises(VerificationError):
        api.diagnose(c["src"], dst, fix=tmp_path / "fixed.pt", run_verify=False)
    assert not (tmp_path / "fixed.pt").exists()


def test_cli_json_carries_the_slip(corpus, capsys):
    c = corpus["pair_gru_keras_order_b_hh_dropped"]
    rc = main(["diagnose", c["src"], c["dst"], "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == VerificationError.exit_code and out["verdict"] == "slip"
    slips = out["layers"][0]["slips"]
    drop = next(s for s in slips if s["kind"] == "bias_dropped")
    assert {k: drop[k] for k in ("layer", "depth", "direction", "tensor", "from", "to")} == {
        "layer": "gru", "depth": 0, "direction": 0, "tensor": "b_hh", "from": "zeros", "to": "b_hh"}
    assert out["verification"]["verdict"] == "fail"  # the ordinary verification, run alongside


def test_cli_ok_and_lines(corpus, capsys):
    c = corpus["control_lstm"]
    assert main(["diagnose", c["src"], c["dst"]]) == 0
    c = corpus["lstm_w_ih_reshaped"]
    assert main(["diagnose", c["src"], c["dst"]]) == VerificationError.exit_code
    assert "SLIP lstm (layer 0, forward): weight_ih_l0 is the (in, 4*H) kernel reshaped" in capsys.readouterr().out


def test_tf1_forget_bias(tmp_path):
    """TF1 LSTMCell (TensorFlow reads the fixture): forget_bias not folded, alone and with TF1's gate order."""
    pytest.importorskip("tensorflow")
    for c in gen_slips.build_tf1(tmp_path):
        rep = api.diagnose(c["src"], c["dst"], run_verify=False)
        got = sorted({(s.layer, s.kind, s.tensor) for ld in rep.layers for s in ld.slips})
        assert got == sorted(tuple(e) for e in c["expect"]), c["name"]
        assert rep.verdict == ("ok" if c["ok"] else "slip"), c["name"]
        if not c["ok"]:
            out = tmp_path / f"fixed_{c['name']}.pt"
            assert api.diagnose(c["src"], c["dst"], fix=out, run_verify=False).fix_verification.verdict == "ok"


# ---------------------------------------------------------------------------------------------------------
# issue #43: an unfolded TF1 forget bias in a BiLSTM (.pt, one ONNX direction), reset placement in ONNX GRU
# nodes of a stacked torch GRU, a Keras 3 decoder GRU's gate order; the smallest explanation preferred

NAMES_43 = ["tf1_bidi_control", "tf1_bidi_unfolded", "tf1_bidi_unfolded_in_b_hh", "tf1_bidi_onnx_control",
            "tf1_bidi_onnx_backward_unfolded", "torch_bigru_onnx_control", "torch_bigru_onnx_reset_before",
            "torch_bigru_onnx_reset_before_dirs_exchanged", "k3_encdec_control", "k3_decoder_keras_order",
            "k3_decoder_keras_order_renamed", "textgenrnn_as_2layer_torch_control",
            "textgenrnn_as_2layer_torch_l1_onnx_order"]


@pytest.fixture(scope="module")
def corpus43(tmp_path_factory):
    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx")
    return {c["name"]: c for c in gen_slips.build_issue43(tmp_path_factory.mktemp("slips43"))}


def _ort_run(path, x: np.ndarray) -> np.ndarray:
    """onnxruntime running an ONNX file on batch-first ``x``: the hand-made graphs read ``X`` time-major
    ``(T, N, I)`` and give ``(T, N, dirs*H)``; rnnconvert's written graphs read and give batch-first."""
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    if name == "X":
        return s.run(None, {name: np.ascontiguousarray(x.transpose(1, 0, 2), np.float32)})[0].transpose(1, 0, 2)
    return s.run(None, {name: np.ascontiguousarray(x, np.float32)})[0]


def _framework_out(path, oracle: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(port's output, the framework's own output)``: the port run by torch.nn (.pt) or onnxruntime (.onnx)
    on the oracle's inputs; the Keras 3 encoder-decoder as two torch.nn.GRU, the decoder started from the
    encoder's last state (layers found by their source names, ``encoder``/``decoder``, or the renamed
    ``enc_rnn``/``dec_rnn``)."""
    npz, kind = oracle
    z = np.load(ROOT / "fixtures" / npz)
    if kind == "encdec":
        sd = torch.load(path, weights_only=True)
        enc, dec = (next(p for p in names if any(k.startswith(p + ".") for k in sd))
                    for names in (("encoder", "enc_rnn"), ("decoder", "dec_rnn")))
        ms = {}
        for p in (enc, dec):
            m = torch.nn.GRU(4, 4, batch_first=True)
            m.load_state_dict({k[len(p) + 1:]: v for k, v in sd.items() if k.startswith(p + ".")})
            ms[p] = m
        with torch.no_grad():
            _, h = ms[enc](torch.from_numpy(z["enc_in"]))
            y = ms[dec](torch.from_numpy(z["dec_in"]), h)[0].numpy()
        return y, z["decoder__out"]
    if kind == "textgen":  # the two stacked CuDNNLSTMs: one 2-layer torch LSTM, or two layers in a row
        sd = torch.load(path, weights_only=True)
        x = z["rnn_1__in"]
        if "rnn.weight_ih_l1" in sd:
            m = torch.nn.LSTM(100, 128, num_layers=2, batch_first=True)
            m.load_state_dict({k[4:]: v for k, v in sd.items()})
            with torch.no_grad():
                return m(torch.from_numpy(x))[0].numpy(), z["rnn_2__out"]
        return _torch_run(sd, "rnn_2", _torch_run(sd, "rnn_1", x)), z["rnn_2__out"]
    if kind == "dino":  # the DinoRNN notebook's prompt 1, as the GRU saw it
        x, want = z["p1_gru__in"][None], z["p1_gru__out"][None]
        if str(path).endswith(".onnx"):
            return _ort_run(path, x), want
        sd = torch.load(path, weights_only=True)
        return _torch_run(sd, next(iter(sd)).split(".")[0], x), want
    x, want = z["x"], z[f"{kind}__out"]
    if str(path).endswith(".onnx"):
        return _ort_run(path, x), want
    return _torch_run(torch.load(path, weights_only=True), kind, x), want


def _close(y: np.ndarray, want: np.ndarray) -> bool:
    return float(np.abs(y - want).max()) <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_corpus43_is_complete(corpus43):
    assert sorted(corpus43) == sorted(NAMES_43)


@pytest.mark.parametrize("name", [n for n in NAMES_43 if "control" in n])
def test_issue43_controls_reproduce_the_frameworks_outputs(corpus43, name):
    """The correct hand ports are right by the frameworks' own numbers (TF1 session, torch.nn.GRU, Keras 3)."""
    c = corpus43[name]
    y, want = _framework_out(c["dst"], c["oracle"])
    assert _close(y, want)


@pytest.mark.parametrize("name", NAMES_43)
def test_issue43_each_slip_is_named(corpus43, name):
    """Each slip named exactly (layer, kind, tensor, direction), nothing more; confirmed by the equations."""
    c = corpus43[name]
    rep = api.diagnose(c["src"], c["dst"], run_verify=False)
    got = sorted({(s.layer, s.kind, s.tensor, s.direction) for ld in rep.layers for s in ld.slips}, key=str)
    assert got == sorted({tuple(e) for e in c["expect"]}, key=str)
    assert rep.verdict == ("ok" if c["ok"] else "slip")
    for ld in rep.layers:
        e = ld.errors
        if ld.verdict == "slip":
            assert e["slipped"] <= e["tolerance"] < e["source"]
        else:
            assert ld.verdict == "ok" and e["source"] <= e["tolerance"]
    if not c["ok"]:  # the port computes something else by the framework's own numbers too
        y, want = _framework_out(c["dst"], c["oracle"])
        assert not _close(y, want)


@pytest.mark.parametrize("name", [n for n in NAMES_43 if "control" not in n])
def test_issue43_fix_is_verified_and_matches_the_framework(corpus43, name, tmp_path):
    c = corpus43[name]
    out = tmp_path / ("fixed" + Path(c["dst"]).suffix)
    rep = api.diagnose(c["src"], c["dst"], fix=out, run_verify=False)
    assert rep.fixed == str(out) and rep.fix_verification.verdict == "ok"
    assert api.diagnose(c["src"], out, run_verify=False).verdict == "ok"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    y, want = _framework_out(out, c["oracle"])
    assert _close(y, want)


def test_messages_name_reset_placement_and_the_fold(corpus43):
    c = corpus43["torch_bigru_onnx_reset_before_dirs_exchanged"]
    ld = api.diagnose(c["src"], c["dst"], run_verify=False).layers[1]
    assert ld.name == "gru_1" and ld.source == "enc.l1"
    msg = next(s.message for s in ld.slips if s.kind == "reset_after")
    assert msg.startswith("gru_1: the GRU is run reset-before") and "linear_before_reset) to True" in msg
    c = corpus43["textgenrnn_as_2layer_torch_l1_onnx_order"]  # a piece of DST's 2-layer LSTM: its own depth
    ld = api.diagnose(c["src"], c["dst"], run_verify=False).layers[1]
    assert (ld.name, ld.source) == ("rnn", "rnn_2") and [(s.depth, s.message) for s in ld.slips] == [
        (1, "rnn (layer 1, forward): weight_ih_l1 gate blocks are in order i,o,f,g (ONNX's i,o,f,c order) where "
            "PyTorch expects i,f,g,o (o, f, g moved)")]
    c = corpus43["tf1_bidi_unfolded_in_b_hh"]
    ld = api.diagnose(c["src"], c["dst"], run_verify=False).layers[0]
    assert [s.message for s in ld.slips] == [
        f"bi (layer 0, {d}): TF1's forget_bias=1 is not folded into bias_hh_l0{sfx}'s f block (add it to b_ih[f])"
        for d, sfx in (("forward", ""), ("backward", "_reverse"))]


def test_renamed_layers_are_paired_by_their_parameters(corpus43):
    """Other names, the decoder first: paired by parameters, no exchange claimed."""
    c = corpus43["k3_decoder_keras_order_renamed"]
    rep = api.diagnose(c["src"], c["dst"], run_verify=False)
    assert [(ld.name, ld.source, ld.verdict) for ld in rep.layers] == [("dec_rnn", "decoder", "slip"),
                                                                       ("enc_rnn", "encoder", "ok")]
    assert rep.layers[1].note == ("enc_rnn: computes the function of source layer 'encoder' (paired by its "
                                  "parameters: the files name and order the layers otherwise)")


def test_a_shotgun_is_unexplained(corpus43, tmp_path):
    """Four kinds at once in one layer (directions exchanged, a kernel reshaped, ONNX gate order, the bias
    unfolded) is no diagnosis: unexplained, the kinds named in the note; three kinds are named as slips."""
    ports, stored = gen_slips.tf1_bidi_lstm(ROOT / "fixtures/tf/bidi_lstm/ckpt")
    fw, bw = ports
    three = [dict(bw, w_hh=gen_slips.perm(bw["w_hh"], gen_slips.LSTM_ONNX), b_ih=stored[1]), fw]
    four = [dict(three[0], w_ih=np.ascontiguousarray(bw["w_ih"].T).reshape(bw["w_ih"].shape)), fw]
    src = ROOT / "fixtures/tf/bidi_lstm"
    torch.save(gen_slips.torch_state("bi", [three]), tmp_path / "three.pt")
    rep = api.diagnose(src, tmp_path / "three.pt", run_verify=False)
    assert rep.verdict == "slip"
    assert {s.kind for s in rep.layers[0].slips} == {"directions_exchanged", "gate_order", "forget_bias_not_folded"}
    torch.save(gen_slips.torch_state("bi", [four]), tmp_path / "four.pt")
    ld = api.diagnose(src, tmp_path / "four.pt", run_verify=False).layers[0]
    assert ld.verdict == "unexplained" and not ld.slips
    assert ("no small set of known slips explains it (the closest takes 4 kinds at once: directions_exchanged, "
            "forget_bias_not_folded, gate_order, reshaped)") in ld.note
    assert ld.diverge["max_abs_diff"] > ld.diverge["tolerance"]


def test_real_dinornn_reset_placement_and_keras_order(dinornn, tmp_path):
    """The real DinoRNN GRU (TF2 checkpoint, reset-after; skipped where the unlicensed checkpoint is absent)
    ported by hand into ONNX without linear_before_reset=1 and into PyTorch in Keras's z,r,h order: each slip
    named alone, each --fix output run by onnxruntime / torch.nn to the notebook's own GRU outputs."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx")
    for c in gen_slips.build_dinornn(tmp_path / "ports", dinornn):
        rep = api.diagnose(c["src"], c["dst"], run_verify=False)
        got = sorted({(s.layer, s.kind, s.tensor, s.direction) for ld in rep.layers for s in ld.slips}, key=str)
        assert got == sorted({tuple(e) for e in c["expect"]}, key=str), c["name"]
        y, want = _framework_out(c["dst"], c["oracle"])
        assert _close(y, want) == c["ok"], c["name"]
        if not c["ok"]:
            out = tmp_path / ("fixed_" + Path(c["dst"]).name)
            assert api.diagnose(c["src"], c["dst"], fix=out, run_verify=False).fix_verification.verdict == "ok"
            y, want = _framework_out(out, c["oracle"])
            assert _close(y, want), c["name"]


def test_cli_names_reset_placement_where_it_exited_3(corpus43, capsys):
    """A 2-layer torch GRU against two hand-written ONNX GRU nodes: named (exit 5, the slip's code), no error
    (``-v``: every slip on its own line; without it the two reset_after slips are one group, issue #42)."""
    c = corpus43["torch_bigru_onnx_reset_before_dirs_exchanged"]
    assert main(["diagnose", c["src"], c["dst"], "-v"]) == VerificationError.exit_code
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SLIP")]  # (then the --fix line)
    assert [ln.split(":")[0] for ln in lines] == ["SLIP gru_0", "SLIP gru_1", "SLIP gru_1 (layer 0, forward)",
                                                   "SLIP gru_1 (layer 0, backward)"]
    assert "the GRU is run reset-before" in lines[0] and "directions exchanged" in lines[3]


def test_stacks_cut_otherwise_are_compared_piece_by_piece(tmp_path):
    """SRC: a 2-layer LSTM ``a`` then a 1-layer ``b`` (torch-made, gate-distinct); DST, by hand: ``x`` = a's
    layer 0, ``y`` = a's layer 1 stacked with b, b's W_hh in ONNX order. Named at y's depth 1; the fix runs in
    torch.nn like the source."""
    torch.manual_seed(43)
    a, b = torch.nn.LSTM(4, 4, num_layers=2, batch_first=True), torch.nn.LSTM(4, 4, batch_first=True)
    with torch.no_grad():
        for m in (a, b):
            for prm in m.parameters():
                prm.copy_(torch.cat([torch.rand(4, *prm.shape[1:]) * 0.25 + 0.3 * j for j in range(4)]))
    src = {**{f"a.{k}": v for k, v in a.state_dict().items()}, **{f"b.{k}": v for k, v in b.state_dict().items()}}
    dst = {f"x.{k}": v for k, v in a.state_dict().items() if k.endswith("_l0")}
    dst.update({f"y.{k[:-1]}0": v for k, v in a.state_dict().items() if k.endswith("_l1")})
    dst.update({f"y.{k[:-1]}1": v for k, v in b.state_dict().items()})
    dst["y.weight_hh_l1"] = torch.from_numpy(gen_slips.perm(dst["y.weight_hh_l1"].numpy(), gen_slips.LSTM_ONNX))
    torch.save(src, tmp_path / "src.pt")
    torch.save(dst, tmp_path / "dst.pt")
    rep = api.diagnose(tmp_path / "src.pt", tmp_path / "dst.pt", fix=tmp_path / "fixed.pt", run_verify=False)
    assert [(ld.name, ld.source, ld.verdict) for ld in rep.layers] == [("x", "a.l0", "ok"), ("y", "a.l1", "ok"),
                                                                       ("y", "b", "slip")]
    assert [(s.layer, s.depth, s.kind, s.tensor) for s in rep.layers[2].slips] == [("y", 1, "gate_order", "w_hh")]
    assert rep.fix_verification.verdict == "ok"
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    fixed = torch.load(tmp_path / "fixed.pt", weights_only=True)  # the source's layers: a (2 layers), b
    a2, b2 = torch.nn.LSTM(4, 4, num_layers=2, batch_first=True), torch.nn.LSTM(4, 4, batch_first=True)
    for m, p in ((a2, "a."), (b2, "b.")):
        m.load_state_dict({k[len(p):]: v for k, v in fixed.items() if k.startswith(p)})
    with torch.no_grad():
        y = b2(a2(torch.from_numpy(x))[0])[0].numpy()
        want = b(a(torch.from_numpy(x))[0])[0].numpy()
    assert _close(y, want)
