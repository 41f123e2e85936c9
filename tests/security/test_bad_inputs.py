"""Untrusted input: the crafted corpus in tests/data/bad (bench/fuzz/make_bad_corpus.py) is refused with
one line and the documented exit code; pickle payloads never run; the API's last line of defence;
deterministic output bytes; libhdf5 loops are cut off."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
import zipfile
from pathlib import Path

import pytest

from rnnconvert import api
from rnnconvert.safety import guard
from rnnconvert.cli import main
from rnnconvert.errors import FormatError

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "data" / "bad"
EXPECTED = json.loads((BAD / "expected.json").read_text())


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_is_refused_with_one_line(name, tmp_path, capsys):
    src = BAD / name
    before = _sha(src)
    for ext in (".npz", ".pt"):
        dst = tmp_path / f"out{ext}"
        assert main([str(src), str(dst)]) == EXPECTED[name]
        err = capsys.readouterr().err
        assert err.startswith("rnnconvert: error: ") and err.count("\n") == 1, err
        assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left behind
    assert _sha(src) == before
    with pytest.raises(FormatError):
        api.load(src)


@pytest.mark.parametrize("name,tensor", [("h5_nan.h5", "kernel"), ("h5_inf.h5", "recurrent_kernel"),
                                         ("pt_nan.pt", "w_hh"), ("st_inf.safetensors", "b_ih"),
                                         ("tfck_nan.index", "lstm_cell/kernel")])
def test_non_finite_weights_name_the_tensor(name, tensor):
    with pytest.raises(FormatError, match=f"{tensor}.*NaN or Inf"):
        api.load(BAD / name)


def test_links_and_external_datasets_are_refused():
    for name in ("h5_softlink.h5", "h5_extlink.h5", "h5_extdataset.h5"):
        with pytest.raises(FormatError, match="links outside the file"):
            api.load(BAD / name)


def test_onnx_external_data_outside_folder():
    with pytest.raises(FormatError, match="outside"):
        api.load(BAD / "onnx_external_escape.onnx")


@pytest.mark.parametrize("name,why", [
    ("keras3_dotdot_member.keras", "unsafe name '../../evil.txt'"),
    ("keras3_zip_bomb.keras", "zip bomb"),
    ("tfck_short_data.index", "shorter than its .index says"),
    ("tfck_flipped_data.index", "'rnn/lstm_cell/kernel': checksum does not match"),
    ("tfck_truncated_index.index", "damaged TensorFlow checkpoint index: no table magic number"),
    ("pb_huge_shape.pb", r"declares shape \[1048576, 1048576\].*holds 96 bytes"),
    ("pb_huge_splat.pb", "stores 1 values"),
    ("cudnn_spec_vs_buffer.cudnn.npz", "has 40 elements.*needs 72"),
    # forged .index files that abort TensorFlow's C++ reader: refused by rnnconvert's own bundle reader
    ("tfck_index_negative_dim.index", "'rnn/lstm_cell/kernel': negative dimension -5"),
    ("tfck_index_overflow_shape.index", r"shape \[2147483648, 2147483648, 2147483648\] has too many elements"),
    ("tfck_index_shape_vs_data.index", r"shape \[1048576, 1048576\] float32 needs 4398046511104 bytes"),
])
def test_refusal_says_why(name, why):
    with pytest.raises(FormatError, match=why) as info:
        api.load(BAD / name)
    assert str(BAD / name) in str(info.value)


def test_tensorflow_abort_is_contained_to_one_line(tmp_path):
    """TensorFlow's C++ reader aborts (SIGABRT, a stack dump on stderr) on a forged .index shape: the real
    CLI process survives, prints exactly one line and writes nothing. (rnnconvert's own bundle reader
    refuses this file before TensorFlow sees it; RNNCONVERT_TF_READER=tensorflow forces TensorFlow's,
    the path still taken for partitioned variables.)"""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT), RNNCONVERT_TF_READER="tensorflow")
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(BAD / "tfck_index_negative_dim.index"),
                        str(tmp_path / "o.npz")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 3
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("rnnconvert:")]
    assert len(lines) == 1 and "crashed" in lines[0]
    assert not any("cfunction_call" in ln or "Check failed" in ln for ln in r.stderr.splitlines())
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ pickle payloads
class _Evil:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payload_pickle(marker: Path) -> bytes:
    return pickle.dumps({"rnn.weight_ih_l0": [0.0], "x": _Evil(marker)}, protocol=2)


def test_legacy_pt_payload_never_runs(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.pt"
    torch.save({"rnn.weight_ih_l0": torch.zeros(4, 2), "x": _Evil(marker)}, src, pickle_module=pickle,
               _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(src)
    assert main([str(src), str(tmp_path / "o.pt")]) == 3
    assert capsys.readouterr().err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "o.pt").exists()


def test_plain_pickle_pkl_payload_never_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.pkl"
    src.write_bytes(_payload_pickle(marker))
    assert main([str(src), str(tmp_path / "o.pt"), "--from", "pt"]) == 3
    assert capsys.readouterr().err.count("\n") == 1
    assert not marker.exists()


def test_torchscript_looking_archive_payload_never_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    src = tmp_path / "evil_ts.pt"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("archive/data.pkl", _payload_pickle(marker))
        z.writestr("archive/code/__torch__.py", "def forward(self): pass\n")
        z.writestr("archive/constants.pkl", pickle.dumps(()))
        z.writestr("archive/version", "6\n")
    assert main([str(src), str(tmp_path / "o.npz")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "never runs code" in err
    assert not marker.exists()


# ------------------------------------------------------------------------------ last line of defence
@pytest.mark.parametrize("exc", [ZeroDivisionError("boom"), MemoryError(), RecursionError("deep")])
def test_api_load_translates_leaked_errors(monkeypatch, exc):
    from rnnconvert.engine import registry

    def bad_read(*_a, **_k):
        raise exc

    monkeypatch.setattr(registry.get("npz").load(), "read", bad_read)
    with pytest.raises(FormatError) as info:
        api.load(BAD / "npz_truncated.npz", "npz")
    assert info.value.__cause__ is exc and "\n" not in str(info.value)


def test_isolated_read_is_cut_off_and_crash_is_reported(monkeypatch):
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "1")
    t0 = time.monotonic()
    with pytest.raises(FormatError, match="did not finish"):
        guard.isolated(time.sleep, (30,), BAD / "h5_nan.h5", "test")
    assert time.monotonic() - t0 < 10
    # the crash case gets time to crash: under a load of 12 a forked child can take more than 1 s to get there
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "60")
    with pytest.raises(FormatError, match="crashed"):
        guard.isolated(_segfault_self, (), BAD / "h5_nan.h5", "test")


def _segfault_self():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)  # runs in the forked child: its own pid (as a segfault would)


@pytest.mark.parametrize("full_read", [True, False], ids=["child-reads-all", "child-probes-metadata"])
def test_fuzz_found_libhdf5_loop_is_refused(tmp_path, monkeypatch, capsys, full_read):
    """A mutated Keras file found by bench/fuzz on which libhdf5 loops forever holding the GIL; small files
    are read wholly in the isolated child, large ones only probed there (as if this one were large)."""
    from rnnconvert.formats.keras import h5_read as keras_h5

    if not full_read:
        monkeypatch.setattr(keras_h5, "FULL_ISOLATION_MAX", 0)
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "2")
    src = ROOT / "tests" / "data" / "fuzz_found" / "h5_libhdf5_loop.h5"
    t0 = time.monotonic()
    assert main([str(src), str(tmp_path / "o.npz")]) == 3
    assert time.monotonic() - t0 < 30
    assert "did not finish" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_fuzz_found_keras3_store_loop_is_refused(tmp_path, monkeypatch, capsys):
    """A mutated Keras 3 .weights.h5 found by bench/fuzz (keras3, case 6764 of seed 0) on which libhdf5
    loops: keras3 reads its HDF5 store in the isolated child too."""
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "2")
    src = ROOT / "tests" / "data" / "fuzz_found" / "keras3_libhdf5_loop.weights.h5"
    t0 = time.monotonic()
    assert main([str(src), str(tmp_path / "o.npz")]) == 3
    assert time.monotonic() - t0 < 30
    assert "did not finish" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ deterministic output
def _tree(p: Path) -> dict[str, bytes]:
    """A file's bytes, or a directory's files' bytes by relative path."""
    if p.is_dir():
        return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}
    return {"": p.read_bytes()}


@pytest.mark.parametrize("name,to", [("o.pt", None), ("o.safetensors", None), ("o.npz", None), ("o.onnx", None),
                                     ("o.keras", None), ("o.weights.h5", None), ("o.h5", None),
                                     ("o.cudnn.npz", None), ("ck1", "tf_checkpoint"), ("ck2", "tf2_checkpoint")])
def test_output_bytes_are_deterministic(name, to, tmp_path):
    """Two conversions of one input, a second apart, give the same bytes (every writer; docs/security.md)."""
    pytest.importorskip("torch")
    src = ROOT / "fixtures" / "keras" / "bidi_lstm_concat.h5"
    a, b = tmp_path / "a" / name, tmp_path / "b" / name
    a.parent.mkdir()
    b.parent.mkdir()
    api.convert(src, a, to=to, verify=None)
    time.sleep(1.1)  # a timestamp in the file would show
    api.convert(src, b, to=to, verify=None)
    assert _tree(a) == _tree(b)


def test_isolated_reader_dies_with_its_parent(tmp_path):
    """A parent killed while its isolated reader runs (SIGKILL, an OOM kill: no chance to kill the child itself)
    leaves no reader behind looping on the file: the child asked the kernel to kill it with its parent."""
    import signal
    import subprocess
    import sys

    pidfile = tmp_path / "child.pid"
    code = ("import os, time, sys; from rnnconvert.safety import guard\n"
            "def loop(p):\n"
            "    open(p, 'w').write(str(os.getpid()))\n"
            "    time.sleep(120)\n"
            f"guard.isolated(loop, ({str(pidfile)!r},), {str(BAD / 'h5_nan.h5')!r}, 'test')\n")
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RNNCONVERT_READ_TIMEOUT": "300"})
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.1)
        child = int(pidfile.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        for _ in range(100):  # the kernel delivers the child's SIGKILL as the parent exits
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # a zombie until init reaps it: dead
                return
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        pytest.fail("the isolated reader outlived its parent")
    finally:
        parent.kill()
