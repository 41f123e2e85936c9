"""``report=`` of :func:`rnnconvert.convert`, :func:`rnnconvert.verify` and :func:`rnnconvert.diagnose` (issue #42):
the HTML report the CLI's ``--report`` writes, with the CLI's rules (checked before any work, never SRC or DST,
an existing file replaced only with ``force``; a refused conversion's report holds the error)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("torch")

import rnnconvert  # noqa: E402
from rnnconvert.cli import main  # noqa: E402

KERAS = Path(__file__).resolve().parents[2] / "fixtures" / "keras"


def _same_page(a: str, b: str, paths: dict[str, str]) -> None:
    """Two reports that differ only by the paths they name (each replaced by its label), the time verification
    took (``seed 0, 0.23 s``), and the run's command line and date."""
    for p, label in paths.items():
        a, b = a.replace(p, label), b.replace(p, label)
    took = re.compile(r"seed (\d+), [0-9.]+ s<")
    a, b = took.sub(r"seed \1, T s<", a), took.sub(r"seed \1, T s<", b)
    run = re.compile(r"<tr><th>(command|date)</th><td class='mono'>[^<]*</td></tr>")  # how and when it ran
    a, b = run.sub("", a), run.sub("", b)
    assert a == b


def test_convert_report_is_the_cli_report(tmp_path):
    """The same conversion from the API and from the CLI: the same page (paths aside), plots included."""
    (tmp_path / "api").mkdir()
    (tmp_path / "cli").mkdir()
    a_out, a_rep = tmp_path / "api" / "lstm.pt", tmp_path / "api" / "r.html"
    c_out, c_rep = tmp_path / "cli" / "lstm.pt", tmp_path / "cli" / "r.html"
    rep = rnnconvert.convert(KERAS / "lstm.h5", a_out, report=a_rep)
    assert rep.verification.ok and a_out.exists()
    assert main([str(KERAS / "lstm.h5"), str(c_out), "--report", str(c_rep), "-q"]) == 0
    text = a_rep.read_text()
    assert "conversion report" in text and "badge ok" in text and "w_ih</code>: bit-exact" in text
    _same_page(text, c_rep.read_text(), {str(a_out): "DST", str(c_out): "DST"})


def test_verify_and_diagnose_reports(tmp_path):
    out = tmp_path / "lstm.pt"
    rnnconvert.convert(KERAS / "lstm.h5", out, verify=None)
    v_rep, d_rep = tmp_path / "v.html", tmp_path / "d.html"
    rep = rnnconvert.verify(KERAS / "lstm.h5", out, report=v_rep)
    text = v_rep.read_text()
    assert rep.ok and "verification report" in text and "one-step max abs error" in text
    c = rep.layers[0]
    assert f"<td>{c.step_err:.3g}</td>" in text  # the numbers this verification measured
    drep = rnnconvert.diagnose(KERAS / "lstm.h5", out, report=d_rep)
    assert drep.verdict == "ok" and "diagnosis report" in d_rep.read_text()
    with pytest.raises(rnnconvert.OutputExistsError):  # an existing report: only with force
        rnnconvert.verify(KERAS / "lstm.h5", out, report=v_rep)
    rnnconvert.verify(KERAS / "lstm.h5", out, report=v_rep, force=True)


def test_refused_conversion_report_holds_the_error(tmp_path):
    """A Keras 2 ``hard_sigmoid`` LSTM to ``.pt`` is refused (torch cannot express it): the error is raised and the
    report says it; DST is not written."""
    out, page = tmp_path / "o.pt", tmp_path / "r.html"
    with pytest.raises(rnnconvert.UnsupportedError) as e:
        rnnconvert.convert(KERAS / "lstm_hard_sigmoid.h5", out, report=page)
    assert not out.exists()
    text = page.read_text()
    first = re.escape(str(e.value).split(";")[0][:40].replace("'", "&#x27;"))
    assert re.search(first, text), text[:2000]


def test_report_path_checked_before_any_work(tmp_path):
    out = tmp_path / "o.pt"
    with pytest.raises(rnnconvert.OutputExistsError):  # the report would be the source
        rnnconvert.convert(KERAS / "lstm.h5", out, report=KERAS / "lstm.h5")
    with pytest.raises(rnnconvert.OutputExistsError):  # ... or DST
        rnnconvert.convert(KERAS / "lstm.h5", out, report=out)
    with pytest.raises(rnnconvert.FormatError, match="output directory does not exist"):
        rnnconvert.convert(KERAS / "lstm.h5", out, report=tmp_path / "no" / "r.html")
    assert not list(tmp_path.iterdir())
