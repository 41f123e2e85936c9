"""io/prefetch.py: a written file read ahead into the page cache (a hint: the bytes are never changed)."""

from __future__ import annotations

import os

import pytest

from rnnconvert.io import prefetch as pf


def test_prefetch_reads_files_and_directories_without_following_links(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.index").write_bytes(b"x" * 100)
    (tmp_path / "d" / "b.data").write_bytes(b"y" * (pf.CHUNK + 5))
    (tmp_path / "elsewhere").write_bytes(b"z")
    os.symlink(tmp_path / "elsewhere", tmp_path / "d" / "link")
    advised = []
    real = os.posix_fadvise
    monkeypatch.setattr(pf.os, "posix_fadvise", lambda fd, pos, n, how: (advised.append((pos, n)), real(fd, pos, n, how)))
    t = pf.prefetch(tmp_path / "d")
    t.join(10)
    assert sorted(advised) == [(0, 100), (0, pf.CHUNK), (pf.CHUNK, 5)]  # every byte once, the link skipped
    advised.clear()
    pf.prefetch(tmp_path / "d" / "b.data").join(10)
    assert sum(n for _, n in advised) == pf.CHUNK + 5
    assert (tmp_path / "d" / "b.data").read_bytes() == b"y" * (pf.CHUNK + 5)


@pytest.mark.parametrize("what", ["missing", "link"])
def test_prefetch_of_nothing_is_quiet(tmp_path, what):
    p = tmp_path / "x"
    if what == "link":
        os.symlink(tmp_path / "nowhere", p)
    t = pf.prefetch(p)
    if t is not None:
        t.join(10)
        assert not t.is_alive()
