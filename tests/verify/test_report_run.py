"""The report as a PR attachment (issue #42): a summary at the top, the run (command line as typed, date, host,
library versions), the sha256 of every file, gate blocks found permuted named as such, tables that wrap instead
of cutting columns, and a print stylesheet. Oracles: ``hashlib`` for the digests, ``importlib.metadata`` for
the versions, torch for the hand-permuted file (its blocks moved with ``torch.cat``, never by rnnconvert)."""

from __future__ import annotations

import hashlib
import html
import re
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
torch = pytest.importorskip("torch")

from rnnconvert.cli import main  # noqa: E402
from rnnconvert.verify import report as html_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERAS = ROOT / "fixtures" / "keras"


def _row(text: str, name: str) -> str:
    m = re.search(rf"<tr><th>{name}</th><td class='mono'>([^<]*)</td></tr>", text)
    assert m, name
    return html.unescape(m.group(1))


def test_report_states_the_run_and_the_files(tmp_path):
    src, dst, rep = KERAS / "lstm.h5", tmp_path / "o.pt", tmp_path / "r.html"
    args = [str(src), str(dst), "--report", str(rep), "-q"]
    assert main(args) == 0
    text = rep.read_text()
    assert _row(text, "command") == "rnnconvert " + " ".join(args)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", _row(text, "date"))
    assert f"numpy {metadata.version('numpy')}" in _row(text, "libraries")
    assert f"torch {metadata.version('torch')}" in _row(text, "libraries")
    for f in (src, dst):
        assert hashlib.sha256(f.read_bytes()).hexdigest() in text
        assert f"{f.stat().st_size:,} bytes" in text
    assert text.index("class='summary'") < text.index("<h2>Run</h2>") < text.index("<h2>Source and target</h2>")
    assert "verdict: <b>ok</b>" in text
    assert html_report.COMMAND == ""  # the CLI's command does not stay for a later API call


def test_api_report_names_the_python_call(tmp_path):
    import rnnconvert

    rep = tmp_path / "r.html"
    rnnconvert.convert(KERAS / "lstm.h5", tmp_path / "o.pt", report=rep)
    assert _row(rep.read_text(), "command") == "rnnconvert.convert(...) (Python API)"


def test_permuted_gate_blocks_are_named(tmp_path):
    """A hand port with the GRU's r and z blocks swapped (torch): the table says which blocks it holds."""
    import rnnconvert

    src = KERAS / "gru_reset_after.h5"
    good = tmp_path / "good.pt"
    rnnconvert.convert(src, good)
    sd = torch.load(good, weights_only=True)
    for k in list(sd):
        if re.search(r"(weight|bias)_(ih|hh)_l0", k):
            r, z, n = sd[k].chunk(3)
            sd[k] = torch.cat([z, r, n])
    bad, rep = tmp_path / "bad.pt", tmp_path / "r.html"
    torch.save(sd, bad)
    main(["verify", str(src), str(bad), "--report", str(rep)])
    text = rep.read_text()
    assert "permuted gates: z, r, n where the source has r, z, n" in text
    assert "rescaled or changed" not in text.split("<h2>Parameters")[1].split("<h2>")[0]


def test_tables_wrap_and_print_keeps_every_column():
    css = html_report.CSS
    assert "overflow-x" not in css and "overflow:hidden" not in css
    assert "overflow-wrap:anywhere" in css and "@media print" in css


def test_tables_follow_the_pairing_when_names_differ(tmp_path):
    """A hand port whose layers are named encoder/decoder (fixtures/slipsrc, z and r exchanged, made by torch):
    the parameter table compares the paired layers and names both."""
    src = ROOT / "fixtures" / "slipsrc" / "k3_bienc_gru.keras"
    dst, rep = ROOT / "fixtures" / "slipsrc" / "k3_bienc_port_zr.pt", tmp_path / "r.html"
    pytest.importorskip("keras")
    main(["verify", str(src), str(dst), "--report", str(rep)])
    params = rep.read_text().split("<h2>Parameters")[1].split("<h2>")[0]
    assert "not compared" not in params
    assert "bidirectional = encoder" in params and "gru_1 = decoder" in params
    assert params.count("permuted gates: z, r, n where the source has r, z, n") == 12


def test_diagnose_fix_report_holds_the_corrected_files_verification(tmp_path):
    pytest.importorskip("keras")
    src = ROOT / "fixtures" / "slipsrc" / "k3_bienc_gru.keras"
    dst, fixed, rep = ROOT / "fixtures" / "slipsrc" / "k3_bienc_port_zr.pt", tmp_path / "fixed.pt", tmp_path / "r.html"
    main(["diagnose", str(src), str(dst), "--fix", str(fixed), "--report", str(rep)])
    text = rep.read_text()
    part = text.split("<h2>Verification of the corrected file</h2>")[1]
    assert str(fixed) in part and "badge ok" in part and "<img class='plot'" in part
