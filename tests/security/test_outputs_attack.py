"""The outputs of issue #40's third attack corpus (MEDIUM 1-5): ``--report`` and ``diagnose --fix`` follow DST's
rules (never SRC, DST, the file diagnosed or an emitted file, by path, symlink or hard link; never an existing
file without ``--force``); ``--force`` replaces only a folder rnnconvert wrote (its manifest, by content), never a
user's folder that merely has an output's name; folder outputs and ``--emit-module``'s set of files are replaced
as one, whatever moment a SIGKILL lands (every step of the commit, deterministically); report text from a file
(``$...$`` mathtext, lone surrogates) is plain text. Each refusal: its exit code, one line on stderr, no
traceback, SRC and the other files untouched (sha256)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from rnnconvert.cli import main
from rnnconvert.engine import commit
from rnnconvert.errors import OutputExistsError

from conftest import FIXTURES

H5 = FIXTURES / "keras" / "lstm.h5"
WHOLE = FIXTURES / "keras_whole" / "whole_multi_io.h5"


def _sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def _tree(folder: Path) -> dict[str, str]:
    """``{relative name: sha256}`` of every file under ``folder`` (the state of a folder output)."""
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(capsys, rc: int, code: int, words: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and words in lines[0] and "Traceback" not in err, (rc, err)
    assert lines[0].startswith("rnnconvert: error: ")
    return lines[0]


@pytest.fixture
def converted(tmp_path):
    """SRC (a copy of a Keras fixture), DST converted from it, their sums."""
    pytest.importorskip("matplotlib")
    src, dst = tmp_path / "m.h5", tmp_path / "m.npz"
    shutil.copyfile(H5, src)
    assert main([str(src), str(dst), "-q", "--no-verify"]) == 0
    return src, dst, _sha(src), _sha(dst)


# ----------------------------------------------------------------------------- (1) --report follows DST's rules
@pytest.mark.parametrize("command", ["convert", "verify", "diagnose"])
@pytest.mark.parametrize("target", ["src", "dst", "src_symlink", "src_hardlink"])
def test_report_is_never_src_or_dst(tmp_path, capsys, converted, command, target):
    src, dst, src_sum, dst_sum = converted
    report = {"src": src, "dst": dst, "src_symlink": tmp_path / "r.html", "src_hardlink": tmp_path / "h.html"}[target]
    if target == "src_symlink":
        report.symlink_to(src)
    if target == "src_hardlink":
        os.link(src, report)
    args = ([] if command == "convert" else [command]) + [str(src), str(dst), "--report", str(report), "--force"]
    rc = main(args + (["--no-verify"] if command == "convert" else []))
    _one_line(capsys, rc, OutputExistsError.exit_code, "--report")
    assert _sha(src) == src_sum and _sha(dst) == dst_sum
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["m.h5", "m.npz"] + ([report.name] if target.startswith("src_") else []))


@pytest.mark.parametrize("command", ["convert", "verify", "diagnose"])
def test_report_never_overwrites_without_force(tmp_path, capsys, converted, command):
    src, dst, src_sum, _ = converted
    report = tmp_path / "mine.html"
    report.write_bytes(b"my notes")
    out = tmp_path / "o.npz" if command == "convert" else dst
    args = ([] if command == "convert" else [command]) + [str(src), str(out), "--report", str(report)]
    _one_line(capsys, main(args), OutputExistsError.exit_code, "--force")
    assert report.read_bytes() == b"my notes" and not (tmp_path / "o.npz").exists()
    assert main(args + ["--force"]) in (0, 5)  # diagnose of a right DST: 0
    assert report.read_bytes().startswith(b"<!DOCTYPE html>") and _sha(src) == src_sum
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp + rename, nothing left


def test_report_is_never_an_emitted_file_or_inside_a_folder_output(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc = main([str(WHOLE), str(tmp_path / "w.npz"), "--emit-module", str(tmp_path / "w.py"), "--no-verify",
               "--report", str(tmp_path / "w_state.pt")])
    _one_line(capsys, rc, OutputExistsError.exit_code, "the emitted state dict")
    rc = main([str(H5), str(tmp_path / "ck"), "--to", "tf_checkpoint", "--report", str(tmp_path / "ck" / "r.html")])
    _one_line(capsys, rc, OutputExistsError.exit_code, "inside the output")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- (4) diagnose --fix
@pytest.mark.parametrize("target", ["src", "dst", "dst_symlink"])
def test_fix_is_never_src_or_the_file_diagnosed(tmp_path, capsys, converted, target):
    src, dst, src_sum, dst_sum = converted
    fix = {"src": src, "dst": dst, "dst_symlink": tmp_path / "f.npz"}[target]
    if target == "dst_symlink":
        fix.symlink_to(dst)
    rc = main(["diagnose", str(src), str(dst), "--fix", str(fix), "--force"])
    _one_line(capsys, rc, OutputExistsError.exit_code, "--fix output")
    assert _sha(src) == src_sum and _sha(dst) == dst_sum


# ----------------------------------------------------------------------------- (2) --force and users' folders
def _gru_pt(path: Path, seed: int) -> Path:
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    torch.save(torch.nn.GRU(3, 4).state_dict(), path)
    return path


@pytest.mark.parametrize("to, inner", [("openvino", "model.bin"), ("tf_checkpoint", "checkpoint")])
def test_force_never_empties_a_users_folder_named_like_an_entry(tmp_path, capsys, to, inner):
    """``ir/model.bin/precious.txt`` (``--to openvino``), ``ck/checkpoint/precious.txt`` (``--to tf_checkpoint``):
    entry names alone matched before; now the folder has no manifest of rnnconvert: refused, naming the entry."""
    src = _gru_pt(tmp_path / "g.pt", 0)
    out = tmp_path / "out"
    (out / inner).mkdir(parents=True)
    (out / inner / "precious.txt").write_text("mine")
    rc = main([str(src), str(out), "--to", to, "--force", "--no-verify"])
    _one_line(capsys, rc, OutputExistsError.exit_code, f"'{inner}/'")
    assert (out / inner / "precious.txt").read_text() == "mine" and sorted(os.listdir(out)) == [inner]


def test_force_replaces_only_what_rnnconvert_wrote_unchanged(tmp_path, capsys):
    pytest.importorskip("openvino")
    src = _gru_pt(tmp_path / "g.pt", 0)
    ir = tmp_path / "ir"
    assert main([str(src), str(ir), "--to", "openvino", "--no-verify", "-q"]) == 0
    assert (ir / commit.MANIFEST).is_file()
    (ir / "notes.txt").write_text("mine")  # a file added by its user
    _one_line(capsys, main([str(src), str(ir), "--to", "openvino", "--force", "--no-verify"]), 6, "'notes.txt'")
    (ir / "notes.txt").unlink()
    with open(ir / "model.bin", "r+b") as fh:  # same size, other bytes: judged by content, not names or sizes
        fh.write(b"\x00\x01\x02\x03")
    before = _tree(ir)
    _one_line(capsys, main([str(src), str(ir), "--to", "openvino", "--force", "--no-verify"]), 6, "changed since")
    assert _tree(ir) == before
    shutil.rmtree(ir)
    assert main([str(src), str(ir), "--to", "openvino", "--no-verify", "-q"]) == 0
    assert main([str(_gru_pt(tmp_path / "g2.pt", 1)), str(ir), "--to", "openvino", "--force", "--no-verify",
                 "-q"]) == 0
    assert commit.foreign_entry(ir) is None and sorted(p.name for p in tmp_path.iterdir()) == ["g.pt", "g2.pt", "ir"]


# ----------------------------------------------------------------------------- (3) sets replaced as one
def _killed_at(k: int, args: list[str], exchange: bool = True, interrupt: bool = False) -> int:
    """Run the CLI in a forked child that SIGKILLs itself (``interrupt``: raises ``KeyboardInterrupt``, as
    SIGTERM and Ctrl-C do) just before its ``k``-th file-system step while a set of outputs is being put in
    place (each rename, replace, exchange, unlink and removal of :func:`rnnconvert.engine.commit.commit_set`):
    every moment of the commit, deterministically. Returns the child's wait status (``-9`` killed, else its
    exit code)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        rc = 1
        try:
            n, active = [0], [False]

            def hook(fn):
                def step(*a, **kw):
                    if active[0]:
                        n[0] += 1
                        if n[0] == k:
                            if interrupt:
                                raise KeyboardInterrupt
                            os.kill(os.getpid(), signal.SIGKILL)
                    return fn(*a, **kw)
                return step

            os.rename, os.replace, os.unlink = hook(os.rename), hook(os.replace), hook(os.unlink)
            shutil.rmtree = hook(shutil.rmtree)
            commit.exchange = hook(commit.exchange if exchange else (lambda a, b: False))
            whole = commit.commit_set

            def in_commit(*a, **kw):
                active[0] = True
                try:
                    return whole(*a, **kw)
                finally:
                    active[0] = False
            commit.commit_set = in_commit
            rc = main(args)
        finally:
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _leftovers_are_temporaries(folder: Path, names: list[str]) -> None:
    for p in folder.iterdir():
        assert p.name in names or (p.name.endswith(".rnnconvert-tmp") and any(
            p.name.startswith(f".{n}.") for n in names)), p.name


def test_emitted_set_whole_after_a_kill_at_every_step(tmp_path):
    """DST, ``model.py`` and ``model_state.pt``: after a SIGKILL at any step of their commit, the three are the
    old set or the new set, or a journal says the set is half replaced; the next run's look at any of them
    completes it (the new set). SRC untouched."""
    pytest.importorskip("torch")
    src = tmp_path / "src.h5"
    shutil.copyfile(WHOLE, src)
    names = ["w.npz", "w.py", "w_state.pt"]
    ref = tmp_path / "ref"
    ref.mkdir()
    assert main([str(src), str(ref / "w.npz"), "--emit-module", str(ref / "w.py"), "--no-verify", "-q"]) == 0
    new = {n: _sha(ref / n) for n in names}
    shutil.rmtree(ref)
    out = tmp_path / "out"
    out.mkdir()
    args = [str(src), str(out / "w.npz"), "--emit-module", str(out / "w.py"), "--no-verify", "--force", "-q"]
    src_sum, seen = _sha(src), set()
    for k in range(1, 60):
        for n in names:
            (out / n).write_bytes(b"old " + n.encode())
        old = {n: _sha(out / n) for n in names}
        rc = _killed_at(k, args)
        state = {n: _sha(out / n) for n in names}
        journal = any(p.name.endswith(commit.JOURNAL) for p in out.iterdir())
        assert state in (old, new) or journal, (k, state)
        for n in names:  # what the next run does first (check_destination)
            commit.recover(out / n)
        state = {n: _sha(out / n) for n in names}
        assert state in (old, new), k
        assert not journal or state == new
        _leftovers_are_temporaries(out, names)
        assert _sha(src) == src_sum
        seen.add("new" if state == new else "old")
        if rc == 0:
            break
    assert k > 5 and seen == {"old", "new"}, (k, seen)


def _killed_after(seconds: float, args: list[str]) -> int:
    """The CLI in a forked child, SIGKILLed after ``seconds`` (or finished before): its wait status."""
    import time

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        rc = 1
        try:
            rc = main(args)
        finally:
            os._exit(rc)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def test_emitted_set_whole_after_kills_at_random_moments(tmp_path):
    """As tests/security/test_kill.py, for DST and ``--emit-module``'s two files: SIGKILL at 12 seeded random
    moments of a whole run (reading, writing, committing); after the next run's look, the old set or the new
    one, and only temporaries beside them."""
    import random
    import time

    pytest.importorskip("torch")
    names = ["w.npz", "w.py", "w_state.pt"]
    out = tmp_path / "out"
    out.mkdir()
    args = [str(WHOLE), str(out / "w.npz"), "--emit-module", str(out / "w.py"), "--no-verify", "--force", "-q"]
    t0 = time.monotonic()
    assert _killed_after(600, args) == 0
    full = time.monotonic() - t0
    new = {n: _sha(out / n) for n in names}
    rng, seen = random.Random(20261129), set()
    for _ in range(12):
        for n in names:
            (out / n).write_bytes(b"old " + n.encode())
        old = {n: _sha(out / n) for n in names}
        _killed_after(rng.uniform(0.3, 1.1) * full, args)
        for n in names:
            commit.recover(out / n)
        state = {n: _sha(out / n) for n in names}
        assert state in (old, new)
        _leftovers_are_temporaries(out, names)
        seen.add("new" if state == new else "old")
    assert "old" in seen


def test_emitted_set_whole_when_interrupted_at_every_step(tmp_path):
    """SIGTERM or Ctrl-C (a ``KeyboardInterrupt``) at any step of the commit: the command exits 130 with the
    old set or the new set in place (completed at once: no journal, nothing for the next run to do)."""
    pytest.importorskip("torch")
    names = ["w.npz", "w.py", "w_state.pt"]
    out = tmp_path / "out"
    out.mkdir()
    args = [str(WHOLE), str(out / "w.npz"), "--emit-module", str(out / "w.py"), "--no-verify", "--force", "-q"]
    seen = set()
    for k in range(1, 60):
        for n in names:
            (out / n).write_bytes(b"old " + n.encode())
        old = {n: _sha(out / n) for n in names}
        rc = _killed_at(k, args, interrupt=True)
        state = {n: _sha(out / n) for n in names}
        assert sorted(os.listdir(out)) == names, (k, os.listdir(out))  # no journal, no temporary
        seen.add("old" if state == old else "new")
        assert state == old or all(state[n] != old[n] for n in names), k
        if rc == 0:
            break
        assert rc == 130, rc
    assert k > 5 and seen == {"old", "new"}, (k, seen)


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "aside-and-journal"])
def test_folder_output_whole_after_a_kill_at_every_step(tmp_path, exchange):
    """An OpenVINO IR folder replaced with ``--force``: with ``RENAME_EXCHANGE`` DST is the old or the new folder
    at every instant; without it (renamed aside, then the new one in) a journal makes the next run complete
    it. Never no DST folder, never half of one."""
    pytest.importorskip("openvino")
    a, b = _gru_pt(tmp_path / "a.pt", 0), _gru_pt(tmp_path / "b.pt", 1)
    old_ir, new_ir, ir = tmp_path / "old", tmp_path / "new", tmp_path / "out" / "ir"
    assert main([str(a), str(old_ir), "--to", "openvino", "--no-verify", "-q"]) == 0
    assert main([str(b), str(new_ir), "--to", "openvino", "--no-verify", "-q"]) == 0
    old, new_bin = _tree(old_ir), _sha(new_ir / "model.bin")
    ir.parent.mkdir()

    def whole() -> str | None:  # the old folder as it was, or a complete new one (the XML's node ids count
        if not ir.is_dir():     # the models built in a process: its bytes are judged by the manifest)
            return None
        if _tree(ir) == old:
            return "old"
        return "new" if commit.foreign_entry(ir) is None and _sha(ir / "model.bin") == new_bin and sorted(
            os.listdir(ir)) == sorted(old) else None

    b_sum, seen = _sha(b), set()
    for k in range(1, 40):
        if ir.exists():
            shutil.rmtree(ir)
        shutil.copytree(old_ir, ir)
        rc = _killed_at(k, [str(b), str(ir), "--to", "openvino", "--force", "--no-verify", "-q"], exchange)
        journal = (ir.parent / f".ir{commit.JOURNAL}").exists()
        if exchange:
            assert whole(), k
        else:
            assert whole() or journal, k
        commit.recover(ir)
        assert whole(), k
        _leftovers_are_temporaries(ir.parent, ["ir"])
        assert _sha(b) == b_sum
        seen.add(whole())
        if rc == 0:
            break
    assert k > 3 and seen == {"old", "new"}, (k, seen)


# ----------------------------------------------------------------------------- (5) names from the file, plain
def test_report_takes_mathtext_and_lone_surrogates_as_text(tmp_path, capsys):
    """A layer named ``enc$\\frac{1}{0}$<lone surrogate>`` (a PyTorch state dict's keys): matplotlib parsed the
    ``$...$`` as mathtext and the surrogate broke the UTF-8 write (an internal error on verify and diagnose,
    no report on convert); now all three write a report showing the name as text (U+FFFD for the surrogate)."""
    pytest.importorskip("matplotlib")
    torch = pytest.importorskip("torch")
    name = "enc$\\frac{1}{0}$\ud800"
    torch.manual_seed(0)
    torch.save({f"{name}.{k}": v for k, v in torch.nn.LSTM(3, 4).state_dict().items()}, tmp_path / "w.pt")
    src, dst = tmp_path / "w.pt", tmp_path / "w.npz"
    assert main([str(src), str(dst), "--report", str(tmp_path / "c.html"), "-q"]) == 0
    assert main(["verify", str(src), str(dst), "--report", str(tmp_path / "v.html")]) == 0
    assert main(["diagnose", str(src), str(dst), "--report", str(tmp_path / "d.html")]) == 0
    err = capsys.readouterr().err
    assert "error" not in err and "warning" not in err, err
    for r in ("c.html", "v.html", "d.html"):
        text = (tmp_path / r).read_text(encoding="utf-8")
        assert "enc$\\frac{1}{0}$\ufffd" in text and "<img" in text or r == "d.html"


def test_a_dst_name_that_is_not_utf8_is_one_line_and_leaves_nothing(tmp_path, capsys):
    dst = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff.npz")
    _one_line(capsys, main([str(H5), dst, "--no-verify"]), 2, "not UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_plot_text_is_never_mathtext():
    """The plots of a layer whose name is invalid mathtext (``$\\frac{$^``) render: the name is plain text."""
    pytest.importorskip("matplotlib")
    from rnnconvert.verify import report
    from rnnconvert.verify.checks import LayerCheck
    from rnnconvert.verify.engine import VerifyReport

    c = LayerCheck("x$\\frac{$^\ud800", 1e-8, 1e-5, 1.0, "a", "b", seq_err=1e-8, seq_tol=1e-5)
    c.seq_err_t = [1e-8, 2e-8]
    text = report.render(report.Content("verification", "s", "d", verification=VerifyReport(layers=[c])))
    assert text.count("<img") == 1 and "x$\\frac{$^" in text
