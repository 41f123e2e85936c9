"""Issue #42 (the terminal): a conversion prints one short line per check (name, verdict, largest error against
its tolerance), what it carried beyond the recurrent layers, and a closing line (file, size, overall verdict,
time); ``-v`` prints every measured number and both engines, as ``--json`` gives them. A refusal into ``.pt``
that ``.pt2`` can express names the ``--emit-module`` command.

Sources are framework-made fixtures (fixtures/gen_keras.py: tf_keras); the facts the lines state are checked
against the conversion's own ``--json`` of the same run and against the written file as ``torch.load`` reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rnnconvert.cli import main
from rnnconvert.errors import UnsupportedError

KERAS = Path(__file__).resolve().parents[2] / "fixtures" / "keras"
torch = pytest.importorskip("torch")


def _run(capsys, *argv) -> list[str]:
    assert main([*map(str, argv)]) == 0
    return capsys.readouterr().out.splitlines()


def test_one_short_line_per_check_and_a_closing_line(tmp_path, capsys):
    src = KERAS / "stack_lstm_gru_rnn.h5"
    rep = json.loads("\n".join(_run(capsys, src, tmp_path / "j.pt", "--json", "-q")))
    checks = rep["verification"]["layers"]
    assert len(checks) == 3
    out = _run(capsys, src, tmp_path / "a.pt", "-q")
    lines = [ln for ln in out if ln.strip().startswith("verified ")]
    assert [ln.split()[1].rstrip(":") for ln in lines] == [c["name"] for c in checks]
    for ln, c in zip(lines, checks):
        assert len(ln) - len(c["name"]) <= 115, ln  # within ~120 characters for a short name
        assert f"sequence: max abs error {c['seq_err']:.2e} (tolerance {c['seq_tol']:.1e})" in ln
        # the one step against the tolerance it applied (rule E's measured one here: float32, small weights)
        assert c["step_applied_kind"] == "measured"
        assert ln.endswith(f"; one step {c['step_applied_err']:.2e} (measured tolerance {c['step_applied_tol']:.1e})")
    size = (tmp_path / "a.pt").stat().st_size
    assert re.fullmatch(rf"{re.escape(str(tmp_path / 'a.pt'))}: \d+\.\d kB, verified \(3 checks\), \d+\.\d s", out[-1])
    assert out[-1].split(": ")[1].startswith(f"{size / 1e3:.1f} kB")
    # -v: every number --json has for the check, and both engines
    out = _run(capsys, src, tmp_path / "v.pt", "-q", "-v")
    lines = [ln for ln in out if ln.strip().startswith("verified ")]
    for ln, c in zip(lines, checks):
        for fact in (f"one step: max abs error {c['step_err']:.2e}", f"{c['steps_checked']} steps",
                     f"closest to its tolerance {c['step_applied_err']:.2e} (measured tolerance "
                     f"{c['step_applied_tol']:.1e}, rule E: {c['step_applied_ratio']:.2g} of it), "
                     f"{c['step_ratio']:.2g} of its bound at most",
                     f"responsive in {c['coverage']} or more", f"sequence: max abs error {c['seq_err']:.2e}",
                     f"{c['source_route']} vs {c['target_route']}"):
            assert fact in ln, (fact, ln)
        assert "resolution: any weight" in ln
    assert out[-1].startswith(f"{tmp_path / 'v.pt'}: ")


def test_what_is_carried_beyond_the_recurrent_layers(tmp_path, capsys):
    src = KERAS / "embedding_lstm.h5"
    out = _run(capsys, src, tmp_path / "a.pt", "-q")
    carried = [ln for ln in out if "carried beyond the recurrent layers" in ln]
    written = [k for k in torch.load(tmp_path / "a.pt", weights_only=True) if not k.startswith("lstm.")]
    assert written  # the oracle: the tensors torch finds in the file besides the LSTM's
    owners = {}
    for k in written:
        owner, _, leaf = k.rpartition(".")
        owners.setdefault(owner, []).append(leaf)
    want = ", ".join(f"{o} ({', '.join(v)})" for o, v in owners.items())
    assert carried == [f"  carried beyond the recurrent layers: {len(written)} tensors: {want}"]
    rep = json.loads("\n".join(_run(capsys, src, tmp_path / "j.pt", "--json", "-q")))
    assert sorted(rep["carried"]) == sorted(written) and rep["bytes"] == (tmp_path / "j.pt").stat().st_size
    # into ONNX (recurrent layers only) nothing is carried: a note says so, no carried line
    out = _run(capsys, src, tmp_path / "a.onnx", "-q", "--recurrent-only")
    assert not any("carried beyond" in ln for ln in out)
    assert any("non-recurrent tensor" in ln and "not written" in ln for ln in out)


def test_a_refusal_into_pt_names_pt2_and_emit_module(tmp_path, capsys):
    src = KERAS / "lstm_hard_sigmoid.h5"
    dst = tmp_path / "m.pt"
    assert main([str(src), str(dst)]) == UnsupportedError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be written as PyTorch nn.LSTM" in err[0]
    assert f"For PyTorch code: rnnconvert {src} {tmp_path / 'm.pt2'} --emit-module {tmp_path / 'm.py'}" in err[0]
    assert not dst.exists()
