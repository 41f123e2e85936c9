"""Issue #42: ``diagnose``, ``diagnose --fix`` and ``verify`` pair a hand port's layers by one rule
(rnnconvert/verify/pairing.py): by name where the names match, else by position or shape (then parameters).

Fixtures (fixtures/gen_slipsrc.py, never made by rnnconvert): ``slipsrc/k3_bienc_gru.keras``, a Keras 3
encoder-decoder whose layers keep Keras's names (``bidirectional``, ``gru_1``), and its hand ports into a torch
``Seq2Seq`` whose GRUs the user named ``encoder``/``decoder`` (``state_dict`` by ``torch.save``): correct, with
every tensor left in Keras's z,r,h order (12 slips), and the same from a module that registers its decoder first.
Oracle: Keras 3's own outputs (``k3_bienc_gru.npz``); ``torch.nn`` running the correct port reproduces them (so
the layouts are settled by Keras and PyTorch), the slipped port does not, and the ``--fix`` output does.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rnnconvert import api  # noqa: E402
from rnnconvert.cli import main  # noqa: E402
from rnnconvert.errors import VerificationError  # noqa: E402
from rnnconvert.verify import pairing  # noqa: E402

SLIP = Path(__file__).resolve().parents[2] / "fixtures" / "slipsrc"
SRC = SLIP / "k3_bienc_gru.keras"
PORT, ZR, ZR_DECFIRST = (SLIP / f"{n}.pt" for n in ("k3_bienc_port", "k3_bienc_port_zr", "k3_bienc_port_zr_decfirst"))
USER_KEYS = {f"encoder.{s}_l0{r}" for s in ("weight_ih", "weight_hh", "bias_ih", "bias_hh") for r in ("", "_reverse")}
USER_KEYS |= {f"decoder.{s}_l0" for s in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


def _seq2seq(path: Path) -> np.ndarray:
    """The user's model run in torch.nn from the state dict at ``path`` (strict: exactly the user's names): the
    encoder's last states, forward then backward, start the decoder, as Keras's Concatenate([hf, hb]) does."""
    sd = torch.load(path, weights_only=True)
    enc = torch.nn.GRU(4, 4, batch_first=True, bidirectional=True)
    dec = torch.nn.GRU(4, 8, batch_first=True)
    enc.load_state_dict({k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")})
    dec.load_state_dict({k[len("decoder."):]: v for k, v in sd.items() if k.startswith("decoder.")})
    assert set(sd) == USER_KEYS
    with np.load(SLIP / "k3_bienc_gru.npz") as z:
        xe, xd = (torch.from_numpy(z[k]) for k in ("enc_in", "dec_in"))
    with torch.no_grad():
        h = enc(xe)[1]
        return dec(xd, torch.cat([h[0], h[1]], dim=-1)[None])[0].numpy()


def _keras_out() -> np.ndarray:
    with np.load(SLIP / "k3_bienc_gru.npz") as z:
        return z["decoder__out"]


def _close(y: np.ndarray, want: np.ndarray) -> bool:
    # float32 Keras against float32 torch: far above a few roundings, far below a slip's 1e-1
    return float(np.abs(y - want).max()) <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_the_ports_are_settled_by_keras_and_torch():
    assert _close(_seq2seq(PORT), _keras_out())
    assert not _close(_seq2seq(ZR), _keras_out())
    assert not _close(_seq2seq(ZR_DECFIRST), _keras_out())


def test_pairing_rule():
    src = api.load(SRC).layers
    port = api.load(PORT).layers
    first = api.load(ZR_DECFIRST).layers
    got = pairing.pair(src, port)
    assert [(p.src, p.dst, p.how) for p in got.pairs] == [(0, 0, "position"), (1, 1, "position")]
    assert got.names() == {"bidirectional": "encoder", "gru_1": "decoder"} and not got.named
    # the decoder first: by position the shapes differ, by shape they pair
    got = pairing.pair(src, first)
    assert [(src[p.src].name, first[p.dst].name, p.how) for p in got.pairs] == [
        ("gru_1", "decoder", "shape"), ("bidirectional", "encoder", "shape")]
    assert all(line.startswith("DST layer '") for line in got.lines())
    # by name where the names match; the layer left by position
    from dataclasses import replace
    mixed = [replace(port[0], name="bidirectional"), port[1]]
    got = pairing.pair(src, mixed)
    assert [(p.src, p.dst, p.how) for p in got.pairs] == [(0, 0, "name"), (1, 1, "position")]
    assert pairing.pair(src, src).named and pairing.pair(src, src).lines() == []
    with pytest.raises(ValueError, match="SRC holds 2 recurrent layers"):
        pairing.pair(src, port[:1])


def test_diagnose_names_the_twelve_slips_grouped(capsys):
    assert main(["diagnose", str(SRC), str(ZR)]) == VerificationError.exit_code
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "layers paired by position (the names differ): bidirectional -> encoder, gru_1 -> decoder"
    slips = [ln for ln in lines if ln.startswith("SLIP")]
    assert len(slips) == 1 and slips[0].startswith("SLIP 12 slips in 2 layers (encoder, decoder), all z<->r: ")
    assert "Keras's and ONNX's z,r,h order" in slips[0]
    fix = SLIP / "k3_bienc_port_zr_fixed.pt"
    assert lines[-1].endswith(f"rnnconvert diagnose {shlex.quote(str(SRC))} {shlex.quote(str(ZR))} --fix "
                              f"{shlex.quote(str(fix))}")
    # -v: each slip, with its direction and tensor; --json: the pairing
    assert main(["diagnose", str(SRC), str(ZR), "-v"]) == VerificationError.exit_code
    out = capsys.readouterr().out
    assert out.count("SLIP ") == 12 and "SLIP encoder (layer 0, backward): bias_hh_l0_reverse gate blocks" in out
    assert "DST layer 'encoder' paired with source layer 'bidirectional' by position" in out
    assert main(["diagnose", str(SRC), str(ZR), "--json"]) == VerificationError.exit_code
    rep = json.loads(capsys.readouterr().out)
    assert rep["pairing"]["pairs"] == [{"source": "bidirectional", "dst": "encoder", "how": "position"},
                                       {"source": "gru_1", "dst": "decoder", "how": "position"}]
    assert sorted((s["layer"], s["direction"], s["tensor"]) for ld in rep["layers"] for s in ld["slips"]) == sorted(
        [("encoder", d, t) for d in (0, 1) for t in ("w_ih", "w_hh", "b_ih", "b_hh")]
        + [("decoder", 0, t) for t in ("w_ih", "w_hh", "b_ih", "b_hh")])
    assert {s["kind"] for ld in rep["layers"] for s in ld["slips"]} == {"gate_order"}


def test_the_suggested_fix_runs_and_keeps_the_users_names(tmp_path, capsys):
    """The exact suggested command (its --fix path moved to tmp_path) writes a file the user's module loads
    strictly, and torch running it computes what Keras computed."""
    src, dst = tmp_path / SRC.name, tmp_path / ZR.name
    src.write_bytes(SRC.read_bytes())
    dst.write_bytes(ZR.read_bytes())
    assert main(["diagnose", str(src), str(dst)]) == VerificationError.exit_code
    cmd = capsys.readouterr().out.splitlines()[-1].split(": ", 1)[1]
    argv = shlex.split(cmd)
    assert argv[:2] == ["rnnconvert", "diagnose"]
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    fixed = tmp_path / "k3_bienc_port_zr_fixed.pt"
    assert f"fixed: {fixed} written and verified against {src} (DST's layer names kept: encoder, decoder)" in out
    assert _close(_seq2seq(fixed), _keras_out())
    # and verify of SRC against the user's fixed file pairs the same way, and says so
    assert main(["verify", str(src), str(fixed)]) == 0
    out = capsys.readouterr().out
    assert "DST layer 'encoder' paired with source layer 'bidirectional' by position" in out


def test_fix_of_a_decoder_first_port_pairs_by_shape(tmp_path):
    rep = api.diagnose(SRC, ZR_DECFIRST, fix=tmp_path / "fixed.pt", run_verify=False)
    assert [(ld.name, ld.source, ld.verdict) for ld in rep.layers] == [("decoder", "gru_1", "slip"),
                                                                       ("encoder", "bidirectional", "slip")]
    assert [p.how for p in rep.pairing.pairs] == ["shape", "shape"]
    assert rep.fix_verification.verdict == "ok"
    assert rep.fix_verification.pairing.names() == {"gru_1": "decoder", "bidirectional": "encoder"}
    assert list(torch.load(tmp_path / "fixed.pt", weights_only=True))[:1] == ["decoder.weight_ih_l0"]  # DST's order
    assert _close(_seq2seq(tmp_path / "fixed.pt"), _keras_out())


def test_verify_pairs_like_diagnose(capsys):
    """Was exit 3: "the written file has no tensor 'bidirectional.weight_ih_l0'"."""
    assert main(["verify", str(SRC), str(PORT)]) == 0
    out = capsys.readouterr().out
    assert "DST layer 'decoder' paired with source layer 'gru_1' by position" in out
    assert main(["verify", str(SRC), str(ZR), "--json"]) == VerificationError.exit_code
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "fail" and [p["how"] for p in rep["pairing"]["pairs"]] == ["position", "position"]
    rep = api.verify(SRC, PORT)
    assert rep.verdict == "ok" and rep.pairing.names() == {"bidirectional": "encoder", "gru_1": "decoder"}
    assert api.verify(SRC, ZR_DECFIRST).verdict == "fail"


def test_a_file_whose_reader_names_layers_otherwise_verifies_by_name_first(tmp_path):
    """A TF2 object checkpoint is read back as ``layer_with_weights-N``, yet its runtime (tf_keras) finds the
    source's names: verify looks DST's layers up by SRC's names first and pairs only where that fails."""
    pytest.importorskip("tf_keras")
    src = Path(__file__).resolve().parents[2] / "fixtures" / "keras" / "stack_lstm_gru_rnn.h5"
    dst = tmp_path / "tf2"
    api.convert(src, dst, to="tf2_checkpoint", verify=None)
    assert {l.name for l in api.load(dst, "tf2_checkpoint").layers}.isdisjoint({l.name for l in api.load(src).layers})
    rep = api.verify(src, dst, dst_format="tf2_checkpoint")
    assert rep.verdict == "ok" and rep.pairing is None
