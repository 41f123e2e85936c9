"""io/prefetch.py: a written file read ahead into the page cache (a hint: the bytes are never changed)."""

from __future__ import annotations

import os

import pytest

from rnnconvert.io import prefetch as pf


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
