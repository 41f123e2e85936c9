"""The command line: exit codes, one-line errors, no clobbered outputs, no heavy imports for --help."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rnnconvert.cli import main

from conftest import torch_rnn

torch = pytest.importorskip("torch")


@pytest.fixture
def lstm_pt(tmp_path):
    src = tmp_path / "src.pt"
    torch.save({f"enc.{k}": v for k, v in torch_rnn("LSTM", 3, 4, num_layers=2).state_dict().items()}, src)
    return src


def test_convert_prints_modules_and_verification(lstm_pt, tmp_path, capsys):
    dst = tmp_path / "out.pt"
    assert main([str(lstm_pt), str(dst), "-v"]) == 0  # -v: the long verdict lines (issue #42's short ones: below)
    out = capsys.readouterr().out
    assert "enc: nn.LSTM(input_size=3, hidden_size=4, num_layers=2, batch_first=True)" in out
    assert "verified enc: one step: max abs error" in out and "torch" in out
    assert dst.exists()


def test_existing_output_is_kept_without_force(lstm_pt, tmp_path, capsys):
    dst = tmp_path / "out.pt"
    dst.write_bytes(b"precious")
    assert main([str(lstm_pt), str(dst)]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err
    assert dst.read_bytes() == b"precious"
    assert main([str(lstm_pt), str(dst), "--force"]) == 0
    assert dst.read_bytes() != b"precious"


@pytest.mark.parametrize("dst_name", ["out.pt", "out.safetensors", "out_ckpt"])
def test_output_permissions_are_what_cp_gives(lstm_pt, tmp_path, dst_name):
    """A new output gets the umask's default mode (not mkstemp's 0600); a replaced one keeps its mode."""
    import os
    import stat

    dst = tmp_path / dst_name
    old = os.umask(0o027)
    try:
        to = ["--to", "tf_checkpoint"] if dst_name == "out_ckpt" else []
        assert main([str(lstm_pt), str(dst), *to]) == 0
    finally:
        os.umask(old)
    want = (0o777 if dst.is_dir() else 0o666) & ~0o027
    assert stat.S_IMODE(dst.stat().st_mode) == want
    if not dst.is_dir():
        dst.chmod(0o604)
        assert main([str(lstm_pt), str(dst), "--force"]) == 0
        assert stat.S_IMODE(dst.stat().st_mode) == 0o604


@pytest.mark.parametrize("payload", [b"", b"\x89HDF\r\n\x1a\n" + b"\0" * 100, b"PK\x03\x04garbage", b"hello"])
def test_bad_input_is_one_line_and_nonzero(tmp_path, capsys, payload):
    src = tmp_path / "bad.h5"
    src.write_bytes(payload)
    dst = tmp_path / "out.pt"
    code = main([str(src), str(dst)])
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("rnnconvert: error:") and err.count("\n") == 1 and "Traceback" not in err
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.h5"]


def test_missing_source(tmp_path, capsys):
    assert main([str(tmp_path / "nope.h5"), str(tmp_path / "o.pt")]) == 3
    assert "no such file" in capsys.readouterr().err


def test_unknown_output_extension(lstm_pt, tmp_path, capsys):
    assert main([str(lstm_pt), str(tmp_path / "o.xyz")]) == 3
    assert "--to" in capsys.readouterr().err


def test_inspect_json(lstm_pt, capsys):
    assert main(["inspect", str(lstm_pt), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "pt"
    (layer,) = info["layers"]
    assert (layer["cell"], layer["input_size"], layer["hidden_size"], layer["num_layers"]) == ("LSTM", 3, 4, 2)


def test_verify_command_fails_on_a_wrong_file(lstm_pt, tmp_path, capsys):
    dst = tmp_path / "out.pt"
    assert main([str(lstm_pt), str(dst), "--no-verify"]) == 0
    assert main(["verify", str(lstm_pt), str(dst)]) == 0
    sd = torch.load(dst, weights_only=True)
    sd["enc.bias_hh_l1"] = sd["enc.bias_hh_l1"].flip(0)
    torch.save(sd, dst)
    capsys.readouterr()
    assert main(["verify", str(lstm_pt), str(dst), "--json"]) == 5
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False


def test_help_imports_no_framework():
    code = ("import sys; from rnnconvert.cli import main; rc = main(['--help']); "
            "bad = [m for m in ('torch', 'tensorflow', 'tf_keras', 'keras', 'onnx', 'onnxruntime') if m in sys.modules]; "
            "print(bad); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]"), out


def test_pickle_payload_never_runs(tmp_path, capsys):
    """A .pt whose pickle would create a marker file: weights_only loading refuses it, nothing runs."""
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    src = tmp_path / "evil.pt"
    torch.save({"rnn.weight_ih_l0": torch.zeros(4, 2), "x": Evil()}, src, pickle_module=pickle)
    assert main([str(src), str(tmp_path / "o.pt")]) == 3
    assert "weights_only" in capsys.readouterr().err
    assert not marker.exists()
    assert np.all([p.name != "o.pt" for p in tmp_path.iterdir()])


def test_batch_directory(tmp_path, capsys):
    """A directory of three files: two convert, a damaged one is reported, and the exit code says so."""
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    torch.save({f"a.{k}": v for k, v in torch_rnn("GRU", 3, 4).state_dict().items()}, src / "one.pt")
    torch.save({f"b.{k}": v for k, v in torch_rnn("LSTM", 3, 4, bidirectional=True).state_dict().items()},
               src / "sub" / "two.pt")
    (src / "broken.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    out = tmp_path / "out"
    assert main([str(src), str(out), "--to", "pt", "-j", "2", "--json"]) == 8
    res = {r["src"].rsplit("/", 1)[-1]: r for r in json.loads(capsys.readouterr().out)}
    assert res["one.pt"]["status"] == res["two.pt"]["status"] == "converted"
    assert res["broken.h5"]["status"] == "failed"
    assert (out / "one.pt").exists() and (out / "sub" / "two.pt").exists() and not (out / "broken.pt").exists()
    a = torch.load(src / "sub" / "two.pt", weights_only=True)
    b = torch.load(out / "sub" / "two.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("argv", [["a.h5", "b.pt", "--verify", "bogus"], ["inspect"], ["a.h5", "b.pt", "--nope"]])
def test_usage_errors_exit_2_without_traceback(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


def test_verify_device_cuda_without_gpu_is_a_clear_error(lstm_pt, tmp_path, capsys):
    """On this CPU-only machine the cuDNN route must say what it needs, exit 7, and not pretend."""
    from rnnconvert.verify.cudnn_layout import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present: tests/formats/cudnn_buffers/test_cudnn.py runs the real cuDNN routes")
    dst = tmp_path / "out.pt"
    assert main([str(lstm_pt), str(dst)]) == 0
    capsys.readouterr()
    assert main(["verify", str(lstm_pt), str(dst), "--device", "cuda"]) == 7
    err = capsys.readouterr().err
    assert "NVIDIA GPU" in err and err.count("\n") == 1


def test_batch_to_a_directory_format_names_each_output_by_its_stem(tmp_path, capsys):
    """``--to tf2_checkpoint`` (a format that is a directory, no extension): each file's output is the
    directory ``OUT/<stem>`` (was an internal error: IndexError on the missing extension). TF restores it
    (the TF2 writer's own tests: tests/formats/tf_files/test_tf_write.py); here, rnnconvert reads it back as the same layer."""
    pytest.importorskip("tensorflow")
    from rnnconvert import api

    src = tmp_path / "in"
    src.mkdir()
    torch.save({f"a.{k}": v for k, v in torch_rnn("GRU", 3, 4).state_dict().items()}, src / "one.pt")
    out = tmp_path / "out"
    rc = main([str(src), str(out), "--to", "tf2_checkpoint", "--json"])
    (res,) = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["status"] == "converted" and res["dst"].endswith("one")
    assert (out / "one").is_dir()
    assert api.load(out / "one").layers[0].cell.value == "GRU"


def test_npz_without_class_name_to_keras3(tmp_path):
    """An ``.npz`` rnnconvert wrote from a source without a Keras class name converts to ``.keras`` (was an
    AttributeError in keras3.check on ``class_name = None``); Keras 3 itself loads the result."""
    pytest.importorskip("keras")
    from rnnconvert import api

    torch.save({f"a.{k}": v for k, v in torch_rnn("LSTM", 3, 4).state_dict().items()}, tmp_path / "m.pt")
    assert main([str(tmp_path / "m.pt"), str(tmp_path / "m.npz")]) == 0
    rep = api.convert(tmp_path / "m.npz", tmp_path / "m.keras")
    assert rep.verification.ok


def test_command_line_ends_without_teardown_and_loses_no_output(tmp_path):
    """``rnnconvert`` ends with ``os._exit`` once a command is done (``cli.leave``: no interpreter teardown of
    torch): everything it printed still arrives (a verified conversion's report, JSON on a pipe), the exit
    code is the command's, and a reader that goes away early gets no traceback."""
    pytest.importorskip("torch")
    from conftest import FIXTURES

    src = FIXTURES / "keras" / "bidi_gru_sum.h5"
    run = subprocess.run([sys.executable, "-m", "rnnconvert", str(src), str(tmp_path / "o.pt"), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["verification"]["verdict"] == "ok" and (tmp_path / "o.pt").exists()
    bad = subprocess.run([sys.executable, "-m", "rnnconvert", str(tmp_path / "none.h5"), str(tmp_path / "x.pt")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.startswith("rnnconvert: error:") and not bad.stdout
    head = subprocess.run(f"'{sys.executable}' -m rnnconvert formats | head -c 10", shell=True,
                          capture_output=True, text=True)
    assert head.returncode == 0 and len(head.stdout) == 10 and "Traceback" not in head.stderr
