"""speed/prefetch.py: a written file read ahead into the page cache (a hint: the bytes are never changed)."""

from __future__ import annotations

import os

import pytest

from rnnconvert.speed import prefetch as pf


def test_prefetch_reads_files_and_directories_without_following_links(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.index").write_bytes(b"x" * 100)
    (tmp_path / "d" / "b.data").write_bytes(b"y" * 70)
    (tmp_path / "elsewhere").write_bytes(b"z")
    os.symlink(tmp_path / "elsewhere", tmp_path / "d" / "link")
    read = []
    real = os.sendfile
    monkeypatch.setattr(pf.os, "sendfile", lambda out, fd, pos, n: (read.append((pos, n)), real(out, fd, pos, n))[1])
    monkeypatch.setattr(pf, "CHUNK", 64)
    t = pf.prefetch(tmp_path / "d")
    t.join(10)
    assert sum(n for _, n in read) == 100 + 70  # every byte of both files once, the link skipped
    read.clear()
    pf.prefetch(tmp_path / "d" / "b.data").join(10)
    assert sorted(read) == [(0, 64), (64, 6)]
    assert (tmp_path / "d" / "b.data").read_bytes() == b"y" * 70
    os.mkfifo(tmp_path / "fifo")  # a FIFO in DST's place: skipped, not waited on
    t = pf.prefetch(tmp_path / "fifo")
    t.join(10)
    assert not t.is_alive()


@pytest.mark.parametrize("what", ["missing", "link"])
def test_prefetch_of_nothing_is_quiet(tmp_path, what):
    p = tmp_path / "x"
    if what == "link":
        os.symlink(tmp_path / "nowhere", p)
    t = pf.prefetch(p)
    if t is not None:
        t.join(10)
        assert not t.is_alive()


def test_read_ahead_stays_within_its_window_and_reads_every_byte_once(tmp_path, monkeypatch):
    """ReadAhead reads a source in file order, never more than ``window`` bytes beyond the reader's position
    (the fraction of parameter bytes read, mapped onto the files' bytes), and each byte once."""
    import time

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.data").write_bytes(b"a" * 1000)
    (tmp_path / "d" / "b.data").write_bytes(b"b" * 600)
    read, limits = [], []
    real = os.sendfile

    def sendfile(out, fd, pos, n):
        read.append((os.fstat(fd).st_size, pos, n))
        return real(out, fd, pos, n)

    monkeypatch.setattr(pf.os, "sendfile", sendfile)
    monkeypatch.setattr(pf, "AHEAD_CHUNK", 64)
    ahead = pf.ReadAhead([tmp_path / "d" / "a.data", tmp_path / "d" / "b.data"], window=300).start()

    def settle(upto):
        for _ in range(500):
            if sum(n for *_, n in read) >= upto:
                return
            time.sleep(0.01)

    settle(300)
    time.sleep(0.1)
    assert sum(n for *_, n in read) == 300  # the first window, and no more while the reader has not moved
    ahead.advance(50, 100)  # half of the parameters read: half of the 1600 bytes, plus the window
    settle(1100)
    time.sleep(0.1)
    assert sum(n for *_, n in read) == 1100
    ahead.advance(100, 100)
    settle(1600)
    ahead.stop()
    assert not ahead.thread.is_alive()
    assert sum(n for size, _, n in read if size == 1000) == 1000 and sum(n for size, _, n in read if size == 600) == 600
    assert max(n for *_, n in read) <= 64


def test_read_ahead_stops_while_waiting_and_skips_what_it_cannot_read(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # never opened for reading in a way that could block
    (tmp_path / "x.data").write_bytes(b"x" * 10)
    ahead = pf.ReadAhead([tmp_path / "fifo", tmp_path / "missing"], window=1).start()
    ahead.stop()
    assert ahead.thread is None or not ahead.thread.is_alive()
    ahead = pf.ReadAhead([tmp_path / "x.data"], window=4).start()
    ahead.stop()  # waiting for the reader to move: stop ends it
    assert not ahead.thread.is_alive()
    assert pf.ahead_window(10) == 64 << 20 and pf.ahead_window(1 << 40) <= 1 << 30


def test_a_streamed_conversion_reads_ahead_only_the_files_its_reader_reads(tmp_path, monkeypatch):
    """A TF checkpoint folder may hold older checkpoints and event files: only the named checkpoint's shards
    are read ahead (rnnconvert.engine.pipeline._read_ahead); a single-file source is read ahead as itself."""
    import shutil
    from pathlib import Path

    from rnnconvert import api
    from rnnconvert.engine import pipeline

    root = Path(__file__).resolve().parents[2] / "fixtures"
    src = tmp_path / "ck"
    shutil.copytree(root / "tf" / "keras_lstm_bigru", src)
    (src / "events.out.tfevents.1.host").write_bytes(b"e" * 100)
    (src / "older.data-00000-of-00001").write_bytes(b"o" * 100)
    seen = []
    real = pf.ReadAhead

    class Spy(real):
        def __init__(self, files, window):
            seen.append([Path(f).name for f in files])
            super().__init__(files, window)
    monkeypatch.setattr(pipeline, "ReadAhead", Spy)
    api.convert(src, tmp_path / "a.pt", verify=None)
    api.convert(tmp_path / "a.pt", tmp_path / "b.safetensors", verify=None)
    assert seen == [["ckpt.data-00000-of-00001"], ["a.pt"]]
