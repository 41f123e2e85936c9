"""Usage errors and the environment (issue #40, LOW): every usage error is one ``rnnconvert: error: ...`` line
(click printed a 3-line block), exit 2; a SRC starting with ``-`` is accepted after ``--`` and refused clearly
otherwise; every ``RNNCONVERT_*`` variable holding a value it cannot use is one line naming it (exit 2), never a
traceback, never blamed on the file; nothing is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from rnnconvert.cli import main
from rnnconvert.errors import SettingError
from rnnconvert.process import settings

from conftest import FIXTURES, ROOT

H5 = FIXTURES / "keras" / "lstm.h5"


def _one_line(capsys, rc: int, code: int, words: str = "") -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and lines[0].startswith("rnnconvert: error: "), (rc, err)
    assert words in lines[0] and "Traceback" not in err and "Usage:" not in err, err
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["--bogus"], "no such option: --bogus"),
    (["convert"], "missing argument 'src'"),
    (["convert", "a.h5"], "missing argument 'dst'"),
    (["inspect", "--frm", "x", "a.h5"], "no such option: --frm"),
    (["convert", "a.h5", "b.npz", "--threads", "0"], "--threads"),
    (["convert", "a.h5", "b.npz", "--skip-existing", "--force"], "contradict"),
    (["verify", "a.h5", "b.npz", "--device", "gpu"], "--device is cpu or cuda"),
    (["convert", "a.h5", "b.npz", "--jobs", "x"], "--jobs"),
])
def test_usage_errors_are_one_line(capsys, tmp_path, args, words):
    line = _one_line(capsys, main(args), 2, words)
    assert "-h" in line  # where help is


def test_no_arguments_still_print_the_help(capsys):
    main([])
    assert "Usage" in capsys.readouterr().out


def test_a_src_starting_with_a_dash(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(H5, tmp_path / "-odd.h5")
    _one_line(capsys, main(["-odd.h5", "out.npz", "--no-verify"]), 2, "after '--'")
    assert sorted(os.listdir(tmp_path)) == ["-odd.h5"]
    assert main(["--", "-odd.h5", "out.npz"]) == 0  # options go before '--'
    assert main(["--no-verify", "-q", "--", "-odd.h5", "out2.npz"]) == 0
    assert main(["convert", "-q", "--", "-odd.h5", "out3.npz"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["-odd.h5", "out.npz", "out2.npz", "out3.npz"]


@pytest.mark.parametrize("name, raw", [
    ("RNNCONVERT_BLAS_THREADS", "abc"), ("RNNCONVERT_BLOCK_BYTES", "abc"), ("RNNCONVERT_READ_TIMEOUT", "abc"),
    ("RNNCONVERT_READ_TIMEOUT", "nan"), ("RNNCONVERT_THREADS", "0"), ("RNNCONVERT_ISOLATE", "yes"),
    ("RNNCONVERT_TF_READER", "tf"), ("RNNCONVERT_SPEED", "turbo"), ("RNNCONVERT_MAX_LAYERS", "many"),
    ("RNNCONVERT_BLAS_THREADS", "\u0663"),  # an Arabic-Indic 3: int() takes it, the variable does not
])
def test_a_bad_environment_value_is_a_usage_error_naming_it(tmp_path, monkeypatch, capsys, name, raw):
    monkeypatch.setenv(name, raw)
    line = _one_line(capsys, main([str(H5), str(tmp_path / "o.npz")]), SettingError.exit_code, name)
    assert "malformed" not in line and str(H5) not in line  # the environment's fault, not the file's
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SettingError, match=name):
        settings.check_all()


def test_good_environment_values_are_taken(monkeypatch):
    for name, raw, want in [("RNNCONVERT_BLAS_THREADS", " 2 ", 2), ("RNNCONVERT_READ_TIMEOUT", "1.5", 1.5),
                            ("RNNCONVERT_SPEED", "PLAIN", "plain"), ("RNNCONVERT_THREADS", "", None)]:
        monkeypatch.setenv(name, raw)
        assert settings.value(name) == want
    monkeypatch.setenv("RNNCONVERT_MAX_LAYERS", "1e3")  # as the budget reads it (int(float(text)))
    settings.check_all()


def test_variables_read_at_import_are_one_line_from_the_command(tmp_path):
    """``RNNCONVERT_BLAS_THREADS`` and ``RNNCONVERT_BLOCK_BYTES`` were read when modules were imported: a
    traceback before the CLI could catch it. A real process, stderr whole."""
    for name in ("RNNCONVERT_BLAS_THREADS", "RNNCONVERT_BLOCK_BYTES"):
        r = subprocess.run([sys.executable, "-m", "rnnconvert", str(H5), str(tmp_path / "o.npz")],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT), name: "abc"})
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and name in r.stderr, r.stderr
        assert list(tmp_path.iterdir()) == []
