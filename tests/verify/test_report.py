"""``--report PATH`` (issue #32): a self-contained HTML report of convert, verify and diagnose, and that a real
browser (headless Chromium, Debian's package) renders its plots."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
torch = pytest.importorskip("torch")

from rnnconvert.cli import main  # noqa: E402
from rnnconvert.errors import UnsupportedError, VerificationError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERAS = ROOT / "fixtures" / "keras"
IMG = re.compile(r"<img [^>]*src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


def _self_contained(text: str) -> None:
    """No resource from elsewhere: no http(s) URL, no external stylesheet or script, images inline."""
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:|//|file:)""", text)
    assert "<link" not in text and "<script" not in text


def test_convert_report(tmp_path):
    out, rep = tmp_path / "lstm.pt", tmp_path / "report.html"
    assert main([str(KERAS / "lstm.h5"), str(out), "--report", str(rep), "-q"]) == 0
    text = rep.read_text()
    _self_contained(text)
    imgs = IMG.findall(text)
    assert len(imgs) == 1 and all(base64.b64decode(d)[:8] == b"\x89PNG\r\n\x1a\n" for d in imgs)
    for want in ("conversion report", "badge ok", "keras_h5", ">pt<", "w_ih</code>: bit-exact",
                 "one-step max abs error", "nn.LSTM(input_size=5, hidden_size=4"):
        assert want in text, want


def test_report_numbers_are_the_measured_ones(tmp_path):
    """The verification table shows the numbers of ``verify --json``, nothing else (no number not measured)."""
    out, rep = tmp_path / "lstm.pt", tmp_path / "report.html"
    assert main([str(KERAS / "lstm.h5"), str(out), "-q"]) == 0
    assert main(["verify", str(KERAS / "lstm.h5"), str(out), "--report", str(rep)]) == 0
    text = rep.read_text()
    from rnnconvert import api

    c = api.verify(KERAS / "lstm.h5", out).layers[0]
    for v in (c.step_err, c.step_ratio, c.seq_err, c.seq_tol):
        assert f"<td>{v:.3g}</td>" in text
    assert c.step_applied_kind == "measured"  # rule E applied (float32, small weights): named with its numbers
    assert (f"<td>error {c.step_applied_err:.3g}, measured tolerance (rule E) {c.step_applied_tol:.3g}: "
            f"{c.step_applied_ratio:.3g} of it</td>") in text
    assert len(c.step_err_t) == len(c.step_bound_t) == len(c.seq_err_t) == 8
    assert all(e <= b for e, b in zip(c.step_err_t, c.step_bound_t))
    assert max(c.seq_err_t) == pytest.approx(c.seq_err, rel=0, abs=0)


def test_verify_json_keeps_its_fields(tmp_path, capsys):
    out = tmp_path / "lstm.pt"
    assert main([str(KERAS / "lstm.h5"), str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["verify", str(KERAS / "lstm.h5"), str(out), "--json"]) == 0
    layer = json.loads(capsys.readouterr().out)["layers"][0]
    old = {"name", "max_abs_err", "tolerance", "max_abs_ref", "source_route", "target_route", "reference",
           "verdict", "reason", "step_err", "step_tol", "step_ratio", "seq_err", "seq_tol", "steps_checked", "ok"}
    assert old <= set(layer) and set(layer) - old == {
        "step_err_t", "step_bound_t", "seq_err_t",  # the per-step plots
        # the one step against the tolerance it applied (rule E's measured one, or the bound), and its plot
        "step_applied_err", "step_applied_tol", "step_applied_ratio", "step_applied_kind", "step_applied_t",
        "states", "constructed", "unexercised", "coverage",  # issue #39: the one-step states and what they exercise
        "resolution", "bias_resolution", "row_resolution", "resolution_at"}  # ... and what they catch


def test_report_of_a_refusal(tmp_path):
    rep = tmp_path / "report.html"
    rc = main([str(KERAS / "lstm_hard_sigmoid.h5"), str(tmp_path / "x.pt"), "--report", str(rep), "-q"])
    assert rc == UnsupportedError.exit_code and not (tmp_path / "x.pt").exists()
    text = rep.read_text()
    assert "Refusal or error" in text and "hard_sigmoid" in text and "<img" not in text


def test_report_of_a_failed_verification(tmp_path):
    """A wrong DST (W_hh gate blocks in ONNX's order, by hand) verified with --report: fail, with its plots."""
    from conftest import fixture_script

    gen_slips = fixture_script("gen_slips")

    ts = gen_slips.keras_tensors(KERAS / "lstm.h5", "lstm")
    p = gen_slips.port_keras_lstm(ts[0])
    p["w_hh"] = gen_slips.perm(p["w_hh"], gen_slips.LSTM_ONNX)
    dst, rep = tmp_path / "bad.pt", tmp_path / "report.html"
    torch.save(gen_slips.torch_state("lstm", [[p]]), dst)
    assert main(["diagnose", str(KERAS / "lstm.h5"), str(dst), "--report", str(rep)]) == VerificationError.exit_code
    text = rep.read_text()
    assert "diagnosis report" in text and "badge fail" in text and "gate blocks are in order i,o,f,g" in text
    assert len(IMG.findall(text)) == 1


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")
def test_report_renders_its_plots_in_chromium(tmp_path):
    """Headless Chromium renders the report: each <img> decodes (naturalWidth > 0) and the screenshot holds a
    plot there (non-white pixels, and the plot's red and blue lines)."""
    from PIL import Image

    out, rep = tmp_path / "lstm.pt", tmp_path / "report.html"
    assert main([str(KERAS / "bidi_lstm_concat.h5"), str(out), "--report", str(rep), "-q"]) == 0
    text = rep.read_text()
    # a copy that reports where the browser laid each image out (the report itself has no script)
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", "<script>document.body.setAttribute('data-rects', JSON.stringify("
                                  "[...document.images].map(i => {const r = i.getBoundingClientRect(); "
                                  "return [r.x, r.y, r.width, r.height, i.naturalWidth];})));</script></body>"))
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--window-size=1200,3000"]
    dom = subprocess.run([*args, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    rects = json.loads(re.search(r'data-rects="([^"]*)"', dom.stdout).group(1).replace("&quot;", '"'))
    assert len(rects) == 1 and all(r[4] > 0 for r in rects)
    shot = tmp_path / "shot.png"
    subprocess.run([*args, f"--screenshot={shot}", rep.as_uri()], capture_output=True, timeout=120, check=True)
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    for x, y, w, h, _ in rects:
        assert y + h <= img.shape[0], "the plot lies below the screenshot"
        region = img[int(y) + 2:int(y + h) - 2, int(x) + 2:int(x + w) - 2]
        assert (region.min(axis=2) < 200).mean() > 0.02  # drawn, not blank
        red = (region[..., 0] > 150) & (region[..., 1] < 90) & (region[..., 2] < 90)
        blue = (region[..., 2] > 150) & (region[..., 0] < 60)
        assert red.sum() > 50 and blue.sum() > 50
    # and outside the images the page is mostly white (the plots are not a full-page artefact)
    assert (img.min(axis=2) > 240).mean() > 0.5
