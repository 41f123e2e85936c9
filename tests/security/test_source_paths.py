"""Multi-file sources read from inside their folder only (issue 40, HIGH 2 and 3, and OpenVINO's LOW items): one
case per reader, each built by ``bench/fuzz/attack_paths.py`` from a framework-made fixture copied into a
temporary folder and given to the real CLI in a subprocess (a 120 s timeout: a FIFO must not block; an 8 GB
address-space limit, as the tester ran; a private empty ``TMPDIR``). A refusal asserts: the documented exit code,
exactly one ``rnnconvert: error:`` line naming the cause, nothing in DST's folder or ``TMPDIR``, no byte of the
outside ("secret") file in stdout, stderr or anything written. The rule under test is
``rnnconvert/safety/paths.py`` (docs/security.md, "Multi-file sources").
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "fuzz"))
import attack_paths as gen  # noqa: E402

FIXTURES = ROOT / "fixtures"
MEMORY = 8 << 30
TIMEOUT = 120


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def cli(*args: str, tmpdir: Path, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    e = {**os.environ, "PYTHONPATH": path, "OPENBLAS_NUM_THREADS": "1",
         "TMPDIR": str(tmpdir), **(env or {})}
    e.pop("RNNCONVERT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rnnconvert", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=e, preexec_fn=_limit, cwd=cwd)


def refused(r: subprocess.CompletedProcess, code: int, says: str, out: Path, tmpdir: Path, secret: bytes) -> None:
    """The rules of every refusal (module docstring)."""
    lines = r.stderr.splitlines()
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and lines[0].startswith("rnnconvert: error: "), r.stderr
    assert says in lines[0], r.stderr
    assert list(out.iterdir()) == [], list(out.iterdir())
    assert list(tmpdir.iterdir()) == [], list(tmpdir.iterdir())
    if secret:
        assert secret.hex() not in r.stdout + r.stderr
        assert secret.decode("latin-1") not in r.stdout + r.stderr
        assert str(np.frombuffer(secret[:4], np.float32)[0]) not in r.stdout + r.stderr


@pytest.fixture
def dirs(tmp_path):
    out, tmpdir, outside = tmp_path / "out", tmp_path / "tmp", tmp_path / "outside"
    for d in (out, tmpdir, outside):
        d.mkdir()
    return out, tmpdir, outside


def made(fn: str, *args: Path | str) -> Path:
    """``gen.<fn>(*args)`` run in a child process: the Orbax generators use tensorstore, and tensorstore used in
    this process would leave its thread pool's state to every forked child (rnnconvert reads Orbax folders in a
    forked child, ``safety/guard.py``: such a child aborts); returns ``args[0]``."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench' / 'fuzz')!r}); import attack_paths as g; "
            f"from pathlib import Path; g.{fn}(*[Path(a) if '/' in a else a for a in sys.argv[1:]])")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return Path(args[0])


def _secret(outside: Path) -> bytes:
    files = sorted(p for p in outside.rglob("*") if p.is_file())
    return files[0].read_bytes()[:64] if files else b""


OUT = "leads outside"
# (id, make(case folder, outside folder) -> SRC, extra CLI args, env, needs tensorstore, exit code, words)
CASES = [
    # OpenVINO (HIGH 2): model.bin -> a file outside; FIFO / directory .bin; LOW: UTF-16 DTD, other digits
    ("ir_bin_outside", lambda p, o: gen.openvino_bin_outside(p, o / "secret.bin") / "model.xml", [], None, False, 3, OUT),
    ("ir_bin_outside_gru_f16", lambda p, o: gen.openvino_bin_outside(p, o / "secret.bin", "torch_gru_f16") / "model.xml",
     [], None, False, 3, OUT),
    ("ir_bin_fifo", lambda p, o: gen.openvino_bin_special(p, "fifo") / "model.xml", [], None, False, 3, "is a FIFO"),
    ("ir_bin_dir", lambda p, o: gen.openvino_bin_special(p, "dir") / "model.xml", [], None, False, 3, "is a directory"),
    ("ir_utf16_dtd", lambda p, o: gen.openvino_utf16_dtd(p) / "model.xml", ["--from", "openvino"], None, False, 3,
     "declares a DTD"),
    ("ir_utf16be_dtd", lambda p, o: gen.openvino_utf16_dtd(p, encoding="utf-16-be") / "model.xml",
     ["--from", "openvino"], None, False, 3, "XML"),
    ("ir_utf8_dtd", lambda p, o: gen.openvino_utf16_dtd(p, encoding="utf-8") / "model.xml", ["--from", "openvino"],
     None, False, 3,
     "declares a DTD"),
    ("ir_arabic_digits", lambda p, o: gen.openvino_unicode_digits(p) / "model.xml", [], None, False, 3,
     "not a decimal number"),
    ("ir_fullwidth_digits", lambda p, o: gen.openvino_unicode_digits(p, digits="０１２３４５６７８９") / "model.xml",
     [], None, False, 3, "not a decimal number"),
    # ONNX external data
    ("onnx_data_outside", lambda p, o: gen.onnx_external_outside(p, o / "secret.bin"), [], None, False, 3, OUT),
    ("onnx_data_fifo", lambda p, o: gen.onnx_external_fifo(p), [], None, False, 3, "is a FIFO"),
    # TF checkpoints: FIFO shard / index, both readers
    ("tf_data_fifo", lambda p, o: gen.tf_special(p, "data"), [], None, False, 3, "is a FIFO"),
    ("tf_data_fifo_tensorflow", lambda p, o: gen.tf_special(p, "data"), [], {"RNNCONVERT_TF_READER": "tensorflow"},
     False, 3, "is a FIFO"),
    ("tf_index_fifo", lambda p, o: gen.tf_special(p, "index"), ["--from", "tf_checkpoint"], None, False, 3, "is a FIFO"),
    # Orbax (HIGH 3): chunk, leaf folder, OCDBT data files out of the folder; a FIFO chunk
    ("orbax_chunk_outside", lambda p, o: made("orbax_chunk_outside", p, o / "secret.bin"), [], None, True, 3, OUT),
    ("orbax_leaf_outside", lambda p, o: made("orbax_leaf_outside", p, o / "leaf"), [], None, True, 3, OUT),
    ("orbax_haiku_leaf_outside", lambda p, o: made("orbax_leaf_outside", p, o / "leaf", "haiku"), [], None, True, 3, OUT),
    ("orbax_ocdbt_data_outside", lambda p, o: gen.orbax_ocdbt_data_outside(p, o / "d"), [], None, False, 3, OUT),
    ("orbax_chunk_fifo", lambda p, o: made("orbax_chunk_fifo", p), [], None, True, 3, "is a FIFO"),
    ("orbax_item_outside", lambda p, o: gen.orbax_item_outside(p, o / "ck"), [], None, False, 3, OUT),
]


@pytest.mark.parametrize("name,make,extra,env,ts,code,says", CASES, ids=[c[0] for c in CASES])
def test_side_file_is_refused_in_one_line(name, make, extra, env, ts, code, says, dirs, tmp_path):
    if ts:
        pytest.importorskip("tensorstore")
    out, tmpdir, outside = dirs
    src = make(tmp_path / name, outside)
    r = cli(str(src), str(out / "o.npz"), "--no-verify", *extra, tmpdir=tmpdir, env=env)
    refused(r, code, says, out, tmpdir, _secret(outside))


def test_inspect_and_verify_refuse_an_ir_bin_outside(dirs, tmp_path):
    """``inspect`` SRC and ``verify`` with the IR as DST go through the same reader."""
    out, tmpdir, outside = dirs
    xml = gen.openvino_bin_outside(tmp_path / "ir", outside / "secret.bin") / "model.xml"
    secret = _secret(outside)
    refused(cli("inspect", str(xml), tmpdir=tmpdir), 3, OUT, out, tmpdir, secret)
    pt = tmp_path / "src.pt"
    good = gen.openvino_copy(tmp_path / "good") / "model.xml"
    r = cli(str(good), str(pt), "--no-verify", "-q", tmpdir=tmpdir)
    assert r.returncode == 0, r.stderr
    refused(cli("verify", str(pt), str(xml), tmpdir=tmpdir), 3, OUT, out, tmpdir, secret)


def test_ir_folder_whose_xml_or_bin_leads_outside(tmp_path):
    """An IR given as its folder: the one ``.xml`` in it and its ``.bin`` are both held to the folder."""
    from rnnconvert import api
    from rnnconvert.errors import FormatError

    (tmp_path / "o").mkdir()
    folder = gen.openvino_xml_outside(tmp_path / "ir", tmp_path / "elsewhere")
    with pytest.raises(FormatError, match="IR file 'model.xml' leads outside"):
        api.load(folder, "openvino")
    folder = gen.openvino_bin_outside(tmp_path / "ir2", tmp_path / "o" / "secret.bin")
    with pytest.raises(FormatError, match="weights file 'model.bin' leads outside"):
        api.load(folder, "openvino")


def test_in_folder_symlinks_are_read(tmp_path):
    """A symlink to another file of the same folder is not an escape: read as the file it names."""
    from rnnconvert import api

    folder = gen.openvino_copy(tmp_path / "ir")
    (folder / "weights").mkdir()
    (folder / "model.bin").rename(folder / "weights" / "w.bin")
    (folder / "model.bin").symlink_to("weights/w.bin")
    ref = api.load(FIXTURES / "openvino" / "torch_lstm.xml")
    got = api.load(folder / "model.xml")
    for a, b in zip(ref.layers, got.layers):
        for da, db in zip(a.params[0], b.params[0]):
            for f in ("w_ih", "w_hh", "b_ih", "b_hh"):
                assert np.array_equal(getattr(da, f), getattr(db, f))


def test_tf_state_file_outside_is_not_followed(tmp_path):
    """A ``checkpoint`` state file that is a symlink out of the folder is not read: the folder has no state file
    (the CLI then sees a folder of files, not a checkpoint); the checkpoint's ``.index`` still names it."""
    from rnnconvert import api
    from rnnconvert.errors import FormatError

    folder = gen.tf_state_outside(tmp_path / "ck", tmp_path / "state")
    with pytest.raises(FormatError, match="not a TensorFlow checkpoint"):
        api.load(folder, "tf_checkpoint")
    assert api.load(folder / "ckpt.index").layers


def test_savedmodel_metadata_outside_is_refused(tmp_path):
    from rnnconvert import api
    from rnnconvert.errors import FormatError
    from rnnconvert.formats.tf import savedmodel_keras

    folder = gen.savedmodel_metadata_outside(tmp_path / "sm", tmp_path / "elsewhere")
    with pytest.raises(FormatError, match="metadata file 'keras_metadata.pb' leads outside the SavedModel folder"):
        savedmodel_keras.read_full_model(api.load(folder))


# ------------------------------------------------------------------------------- Orbax: the working directory


def test_orbax_plain_folder_reads_its_own_arrays_from_any_working_directory(dirs, tmp_path):
    """HIGH 3: a clean checkpoint in Orbax's other layout (one zarr folder per leaf, copied by tensorstore from the
    Orbax-made fixture), converted from a working directory that holds other arrays under the same leaf names:
    onnxruntime on the converted ``.onnx`` reproduces what Flax computed (the fixture's oracle), so the
    checkpoint's arrays were read, not the decoys (which would shift every weight by 0.5); and it converts from
    anywhere else too (it failed there: the leaves were looked up in the working directory)."""
    pytest.importorskip("tensorstore")
    pytest.importorskip("onnxruntime")
    from rnnconvert import api
    from rnnconvert.runtimes import onnxruntime as ort_rt

    out, tmpdir, _ = dirs
    ck = made("orbax_plain", tmp_path / "ck")
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    gen.orbax_decoys(decoys, ck)
    orc = np.load(FIXTURES / "orbax" / "flax.oracle.npz")
    for i, cwd in enumerate((decoys, tmpdir.parent)):
        dst = out / f"o{i}.onnx"
        r = cli(str(ck), str(dst), "-q", tmpdir=tmpdir, cwd=cwd)
        assert r.returncode == 0, r.stderr
        ckpt = api.load(dst)
        for layer in sorted(k[: -len("__out")] for k in orc.files if k.endswith("__out")):
            y = ort_rt.forward(dst, ckpt, layer, orc[f"{layer}__in"])
            np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=2e-5, atol=1e-6, err_msg=layer)


def test_orbax_leaf_key_paths_stay_in_the_folder(tmp_path):
    """A ``_METADATA`` key with an empty, ``.`` or ``..`` path part is refused before any store is opened."""
    import json

    pytest.importorskip("tensorstore")
    from rnnconvert import api
    from rnnconvert.errors import FormatError

    ck = made("orbax_plain", tmp_path / "ck")
    meta = json.loads((ck / "_METADATA").read_text())
    entry = next(iter(meta["tree_metadata"].values()))
    for bad in ("../../x", "a/../../x", "/abs", "a//b"):
        entry["key_metadata"][0]["key"] = bad
        (ck / "_METADATA").write_text(json.dumps(meta))
        with pytest.raises(FormatError, match="leaf key path"):
            api.load(ck, "orbax")


# ------------------------------------------------------------------------------------------ the helper itself


def test_paths_never_depend_on_the_working_directory(tmp_path, monkeypatch):
    from rnnconvert.errors import FormatError
    from rnnconvert.safety import paths

    folder, cwd = tmp_path / "f", tmp_path / "cwd"
    folder.mkdir()
    cwd.mkdir()
    (folder / "a.bin").write_bytes(b"mine")
    (cwd / "a.bin").write_bytes(b"decoy")
    (cwd / "only_here.bin").write_bytes(b"decoy")
    monkeypatch.chdir(cwd)
    with paths.open_inside(folder, "a.bin", "t") as fh:
        assert fh.read() == b"mine"
    with pytest.raises(FormatError, match="is missing"):
        paths.inside(folder, "only_here.bin", "t")
    (folder / "loop").symlink_to("loop")
    with pytest.raises(FormatError, match="symlink loop"):
        paths.inside(folder, "loop", "t")
    (folder / "up").symlink_to("..", target_is_directory=True)
    with pytest.raises(FormatError, match="leads outside"):
        paths.inside(folder, "up/cwd/a.bin", "t")
    with pytest.raises(FormatError, match="leads outside"):
        paths.check_tree(folder, "t")


# ------------------------------------------------------------------------------ OpenVINO writer: a full disk


def _ir_cli(tmp_path, monkeypatch, capsys, save_model):
    pytest.importorskip("openvino")
    import openvino

    from rnnconvert.cli import main

    monkeypatch.setattr(openvino, "save_model", save_model)
    code = main([str(FIXTURES / "openvino" / "torch_lstm.xml"), str(tmp_path / "o" / "ir"), "--to", "openvino",
                 "--no-verify"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("how", ["oserror", "iostream"])
def test_openvino_writer_on_a_full_disk_is_exit_10(tmp_path, monkeypatch, capsys, how):
    """LOW: ``openvino.save_model`` failing for lack of space is the environment (exit 10, one line, nothing left),
    whether it raises ``OSError(ENOSPC)`` or, as OpenVINO's C++ streams do, ``RuntimeError("basic_ios::clear:
    iostream error")`` on a file system with no room (``statvfs`` reports none)."""
    (tmp_path / "o").mkdir()

    def full(model, path, **_):
        Path(path).write_bytes(b"<net")  # a partial file, as a full disk leaves
        if how == "oserror":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real = os.statvfs
        monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((4096, 4096, 10, 0, 0, 10, 0, 0, 0, 255)) if
                            str(p).startswith(str(tmp_path)) else real(p))
        raise RuntimeError("basic_ios::clear: iostream error")

    code, err = _ir_cli(tmp_path, monkeypatch, capsys, full)
    assert code == 10, err
    assert len(err.strip().splitlines()) == 1 and "no space left" in err, err
    assert list((tmp_path / "o").iterdir()) == []


def test_openvino_writer_other_failures_stay_internal_errors(tmp_path, monkeypatch, capsys):
    """A save_model failure with room on the disk is not blamed on the environment."""
    (tmp_path / "o").mkdir()

    def broken(model, path, **_):
        raise RuntimeError("basic_ios::clear: iostream error")

    code, err = _ir_cli(tmp_path, monkeypatch, capsys, broken)
    assert code == 1, err
    assert list((tmp_path / "o").iterdir()) == []


def test_openvino_writer_on_a_real_full_tmpfs(tmp_path):
    """The same on a real 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    pytest.importorskip("openvino")
    import torch

    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        torch.manual_seed(0)
        src = tmp_path / "big.pt"
        torch.save(torch.nn.LSTM(64, 64).state_dict(), src)  # 133 KB of weights: more than the tmpfs holds
        tmpdir = tmp_path / "tmp"
        tmpdir.mkdir()
        r = cli(str(src), str(mnt / "ir"), "--to", "openvino", "--no-verify", tmpdir=tmpdir)
        assert r.returncode == 10, r.stderr
        assert len(r.stderr.splitlines()) == 1 and "no space left" in r.stderr, r.stderr
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
