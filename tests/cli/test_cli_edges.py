"""The rough edges a first-time user hits (issue 15): command typos, -h/--version, --json errors,
unknown reader options, batch skips, torch's unsafe advice, contradictory options, made-up versions,
API errors in the API's words, TensorFlow's C++ log lines kept off the terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import rnnconvert
from rnnconvert.engine import registry
from rnnconvert.cli import main
from rnnconvert.errors import OptionError, OutputExistsError

from conftest import FIXTURES, REALWORLD, ROOT

H5 = FIXTURES / "keras" / "cudnn_lstm.h5"


def _cli(args, env=None, timeout=300):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rnnconvert", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


# ------------------------------------------------------------------------------------------ commands
def test_mistyped_command_names_the_closest(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(H5, tmp_path / "model.h5")
    assert main(["inspct", "model.h5"]) == 2
    err = capsys.readouterr().err
    assert "no such command 'inspct'; did you mean 'inspect'?" in err
    assert not (tmp_path / "inspct").exists()
    # an existing file of that name is a source, not a typo
    shutil.copy(H5, tmp_path / "inspct")
    assert main(["inspct", "out.pt", "--no-verify"]) == 0
    # far from every command: taken as a source path that does not exist
    assert main(["zzzzzz", "model.pt"]) == 3


def test_short_help_and_version(capsys):
    assert main(["-h"]) == 0
    assert "inspect" in capsys.readouterr().out
    assert main(["inspect", "-h"]) == 0
    assert "--from" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rnnconvert {rnnconvert.__version__}"


def test_json_errors_are_json_on_stdout(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.h5"), "--json"]) == 3
    out = capsys.readouterr()
    err = json.loads(out.out)["error"]
    assert err["exit_code"] == 3 and err["type"] == "FormatError" and "no such file" in err["message"]
    assert out.err == ""
    assert main(["convert", str(H5), str(tmp_path / "o.pt"), "--json", "--bogus"]) == 2  # usage error
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == 2
    assert main(["inspct", "x.h5", "--json"]) == 2
    assert "did you mean 'inspect'" in json.loads(capsys.readouterr().out)["error"]["message"]


# ------------------------------------------------------------------------------------- reader options
def test_unknown_reader_option_refused_naming_the_valid_ones(tmp_path, capsys):
    ckpt_dir = FIXTURES / "tf" / "lstm_cell"
    assert main(["inspect", str(ckpt_dir), "--read-opt", "forget_bais=0"]) == 2
    err = capsys.readouterr().err
    assert "'forget_bais'" in err and "forget_bias" in err and "cell_clip" in err
    assert main(["inspect", str(ckpt_dir), "--read-opt", "forget_bias=0"]) == 0
    with pytest.raises(OptionError, match="keras_h5 reader takes no option 'forget_bias'; valid: gate_activation, map, nonlinearity"):
        rnnconvert.load(H5, forget_bias=1.0)
    assert main([str(H5), str(tmp_path / "o.pt"), "--read-opt", "forget_bias=1"]) == 2
    assert not (tmp_path / "o.pt").exists()


def test_formats_lists_read_options():
    got = {f["name"]: f for f in rnnconvert.list_formats()}
    assert [f.name for f in registry.FORMATS] == list(got)
    assert got["tf_checkpoint"]["read_options"][:2] == ["forget_bias", "gate_activation"]
    assert got["onnx"]["read_options"] == [] and got["pt"]["write"] is True
    assert callable(rnnconvert.load_inputs) and "load_inputs" in rnnconvert.__all__


def test_formats_command_json_has_read_options(capsys):
    assert main(["formats", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows == {f["name"]: f for f in rnnconvert.list_formats()}


# ---------------------------------------------------------------------------------------------- batch
def test_batch_skips_unrecognised_files_and_resumes(tmp_path, capsys):
    src, dst = tmp_path / "models", tmp_path / "out"
    src.mkdir()
    shutil.copy(H5, src / "a.h5")
    shutil.copy(FIXTURES / "keras" / "cudnn_gru.h5", src / "b.h5")
    (src / "notes.txt").write_text("trained on the 2019 data\n")
    (src / "vocab.json").write_text('{"a": 1}')
    (src / "broken.h5").write_bytes(b"not hdf5 at all")  # a model file that is damaged: a failure
    assert main([str(src), str(dst), "--to", "pt", "--no-verify", "--json"]) == 8
    rows = {os.path.basename(r["src"]): r for r in json.loads(capsys.readouterr().out)}
    assert {k: r["status"] for k, r in rows.items()} == {
        "a.h5": "converted", "b.h5": "converted", "broken.h5": "failed", "notes.txt": "skipped",
        "vocab.json": "skipped"}
    (src / "broken.h5").unlink()
    before = (dst / "a.pt").stat().st_mtime_ns
    (dst / "b.pt").unlink()
    assert main([str(src), str(dst), "--to", "pt", "--no-verify", "--skip-existing", "--json"]) == 0
    rows = {os.path.basename(r["src"]): r for r in json.loads(capsys.readouterr().out)}
    assert rows["a.h5"]["status"] == "skipped" and rows["b.h5"]["status"] == "converted"
    assert (dst / "a.pt").stat().st_mtime_ns == before and (dst / "b.pt").exists()
    assert main([str(src), str(dst), "--to", "pt", "--skip-existing", "--force"]) == 2


# ------------------------------------------------------------------------------------- contradictions
def test_no_verify_with_verify_refused(tmp_path, capsys):
    assert main([str(H5), str(tmp_path / "o.pt"), "--no-verify", "--verify", "framework"]) == 2
    assert "contradict" in capsys.readouterr().err
    assert not (tmp_path / "o.pt").exists()


def test_damaged_pt_never_passes_on_torchs_unsafe_advice(tmp_path, capsys):
    pytest.importorskip("torch")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage, not a pickle")
    assert main([str(bad), str(tmp_path / "o.npz")]) == 3
    err = capsys.readouterr().err
    assert "weights_only=False" not in err and "trust" not in err and "will likely succeed" not in err
    assert "never runs code" in err


def test_inspect_shows_no_made_up_keras_version():
    for path in (REALWORLD / "mycroft-precise-gru" / "hey-mycroft.pb",
                 *[FIXTURES / e["file"] for e in json.loads((FIXTURES / "manifest.json").read_text())["tf"]
                   if e.get("kind") == "tf2_object"][:1]):
        assert "keras_version" not in rnnconvert.inspect(path)["meta"], path
    assert rnnconvert.inspect(H5)["meta"]["keras_version"]  # a Keras file names its own


def test_api_errors_speak_the_api(tmp_path, capsys):
    dst = tmp_path / "o.pt"
    dst.write_bytes(b"x")
    with pytest.raises(OutputExistsError) as exc:
        rnnconvert.convert(H5, dst)
    assert "--" not in str(exc.value) and "force=True" in str(exc.value)
    assert main([str(H5), str(dst)]) == 6
    assert "pass --force" in capsys.readouterr().err


# ------------------------------------------------------------------------------- TensorFlow's C++ logs
def test_tensorflow_cpp_log_lines_kept_off_stderr(tmp_path):
    """A conversion that runs tf_keras (Keras 2 .h5 output): stderr holds nothing, stdout the report;
    the C++ lines TensorFlow wrote went to the RNNCONVERT_NATIVE_LOG file instead."""
    pytest.importorskip("tf_keras")
    log = tmp_path / "native.log"
    env = {"RNNCONVERT_NATIVE_LOG": str(log)}
    env_base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(H5), str(tmp_path / "o.h5")], capture_output=True,
                       text=True, env={**env_base, "PYTHONPATH": str(ROOT), **env}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert "verified rnn_1" in r.stdout
    # our own error lines still reach stderr after TensorFlow was imported
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(H5), str(tmp_path / "o.h5")], capture_output=True,
                       text=True, env={**env_base, "PYTHONPATH": str(ROOT), **env}, timeout=600)
    assert r.returncode == 6 and r.stderr.startswith("rnnconvert: error:")


def test_native_log_diversion_catches_fd2_writes(tmp_path):
    """The diversion itself (able to fail): writes to descriptor 2 before it reach stderr, after it land
    in the log file, while Python's sys.stderr still reaches the real stderr."""
    code = ("import os, sys; from rnnconvert.process import native_log; native_log.install(); "
            "assert 'tensorflow' not in sys.modules; os.write(2, b'BEFORE\\n'); native_log.divert(); "
            "os.write(2, b'NATIVE LINE\\n'); print('OURS', file=sys.stderr)")
    log = tmp_path / "n.log"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "RNNCONVERT_NATIVE_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert r.stderr == "BEFORE\nOURS\n" and log.read_text() == "NATIVE LINE\n"


@pytest.mark.parametrize("src, py, code, words", [
    ("keras/lstm_weights.h5", "w.py", 4, "holds none"),  # a weights-only file: no whole model to emit
    ("keras_whole/whole_multi_io.h5", "w.txt", 2, "ending in .py"),
    ("keras_whole/whole_multi_io.h5", "my-model.py", 2, "give e.g. my_model.py"),
])
def test_emit_module_refusals_are_one_line_and_write_nothing(tmp_path, capsys, src, py, code, words):
    pytest.importorskip("onnx")
    rc = main(["convert", str(FIXTURES / src), str(tmp_path / "w.onnx"), "--emit-module", str(tmp_path / py),
               "--no-verify"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and words in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_emit_module_keeps_an_existing_state_file(tmp_path, capsys):
    """The state file beside the module follows DST's rule: an existing one is never replaced without --force."""
    (tmp_path / "w_state.pt").write_bytes(b"mine")
    rc = main(["convert", str(FIXTURES / "keras_whole" / "whole_multi_io.h5"), str(tmp_path / "w.onnx"),
               "--emit-module", str(tmp_path / "w.py"), "--no-verify"])
    assert rc == 6 and sorted(p.name for p in tmp_path.iterdir()) == ["w_state.pt"]
    assert (tmp_path / "w_state.pt").read_bytes() == b"mine"


def test_a_py_dst_points_to_emit_module(tmp_path, capsys):
    assert main(["convert", str(FIXTURES / "keras_whole" / "whole_multi_io.h5"), str(tmp_path / "m.py")]) == 3
    assert "--emit-module m.py" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("src,emit", [("keras/keras1_lstm_gru_weights.h5", False), ("realworld/mycroft-precise-gru/hey-mycroft.net", True)])
def test_the_pt_refusal_names_emit_module_only_for_a_full_model(tmp_path, capsys, src, emit):
    """A hard_sigmoid layer refused as ``.pt`` names the ``.pt2`` way out; ``--emit-module`` (which needs the model's
    config) only where the file is a full model, not for a ``save_weights`` file (a real chars2vec ``weights.h5``
    was told to use it, and then refused)."""
    assert main(["convert", str(FIXTURES / src), str(tmp_path / "w.pt")]) == 4
    err = capsys.readouterr().err
    assert ".pt2" in err and ("--emit-module" in err) == emit, err
    assert list(tmp_path.iterdir()) == []
