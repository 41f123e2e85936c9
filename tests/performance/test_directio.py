"""speed/directio.py: large outputs written with O_DIRECT in whole aligned blocks, the tail buffered.

The bytes must be exactly what was written, whether O_DIRECT is used, refused at open, or refused at the
first write; the .pt and ONNX writers that use it stay byte-identical to torch.save / the embedded model
(tests/formats/torch_files/test_pt_stream.py, tests/formats/onnx_files/test_onnx.py run them with a small block so that O_DIRECT is exercised)."""

from __future__ import annotations

import contextlib
import errno
import os

import numpy as np
import pytest

from rnnconvert.speed import directio


def _chunks(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 4095, 4096, 4097, 12288, 70000, 3, 8191] + list(rng.integers(0, 20000, 40))
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


def _refuse_direct_writes(w, monkeypatch) -> None:
    """Make every write through ``w``'s O_DIRECT descriptor fail as a file system that refuses it does."""
    if not w.direct:
        return
    real = os.pwrite

    def pwrite(fd, data, offset):
        if fd == w.dfd:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)
    monkeypatch.setattr(directio.os, "pwrite", pwrite)


@pytest.mark.parametrize("mode", ["direct", "refused_at_open", "refused_at_write"])
def test_bytes_are_what_was_written(mode, tmp_path, monkeypatch):
    path = tmp_path / "out.bin"
    if mode == "refused_at_open":
        monkeypatch.setattr(directio.os, "O_DIRECT", 0, raising=False)
    w = directio.DirectWriter(path, block=4096)
    if mode == "refused_at_write":
        _refuse_direct_writes(w, monkeypatch)
    chunks = _chunks(1)
    with w:
        for c in chunks:
            assert w.write(memoryview(c)) == len(c)
        assert w.tell() == sum(map(len, chunks))
    assert path.read_bytes() == b"".join(chunks)
    if mode != "direct":
        assert not w.direct


@pytest.mark.parametrize("writer", ["DirectWriter", "ScatterWriter"])
def test_other_errors_are_raised(writer, tmp_path, monkeypatch):
    """A failing write (a full disk) is raised in the writer's thread: at once when written here, by the next
    write or by ``close`` when it was an O_DIRECT block written in the background (speed/directio._InFlight);
    after it nothing more is written."""
    calls = []

    def full(fd, data, offset):
        calls.append(offset)
        raise OSError(errno.ENOSPC, "No space left on device")
    if writer == "DirectWriter":
        w = directio.DirectWriter(tmp_path / "out.bin", block=4096)
        monkeypatch.setattr(directio.os, "pwrite", full)
        with pytest.raises(OSError, match="No space"):
            for _ in range(8):
                w.write(b"x" * 5000)
            w.close()
    else:
        w = directio.ScatterWriter(tmp_path / "out.bin", 8 * 4096 + 10, block=4096)
        monkeypatch.setattr(directio.os, "pwrite", full)
        with pytest.raises(OSError, match="No space"):
            for pos in range(0, 8 * 4096, 4096):
                w.pwrite(b"x" * 4096, pos)
            w.pwrite(b"y" * 10, 8 * 4096)
            w.close()
    n = len(calls)
    assert 1 <= n <= directio.IN_FLIGHT + 1  # the writes already in flight when the first failed, at most
    monkeypatch.undo()
    w.close()  # closing again: nothing more written, nothing raised
    assert len(calls) == n


def test_verified_conversions_write_through_the_page_cache(tmp_path, monkeypatch):
    """A verified conversion reads its output back at once, so it writes through the page cache; an
    unverified one goes around it. Same bytes either way (torch.save's, tests/formats/torch_files/test_pt_stream.py)."""
    import torch

    from rnnconvert import api
    from conftest import torch_rnn

    torch.save(torch_rnn("LSTM", 5, 7, num_layers=2).state_dict(), tmp_path / "src.pt")
    made = []
    real = directio.DirectWriter.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        made.append(self.direct)
    monkeypatch.setattr(directio.DirectWriter, "__init__", spy)
    api.convert(tmp_path / "src.pt", tmp_path / "v.pt")
    api.convert(tmp_path / "src.pt", tmp_path / "n.pt", verify=None)
    probe = directio.DirectWriter(tmp_path / "probe.bin")
    probe.close()
    assert made[0] is False and made[1] is made[2]  # the unverified one as O_DIRECT as this file system allows
    assert (tmp_path / "v.pt").read_bytes() == (tmp_path / "n.pt").read_bytes()


@pytest.mark.parametrize("mode", ["direct", "refused_at_open", "refused_at_write", "page_cache"])
def test_scattered_pieces_in_any_order_make_the_same_bytes(mode, tmp_path, monkeypatch):
    """ScatterWriter (safetensors): pieces of a file written in shuffled order, across block boundaries,
    give exactly the file, whichever way each block went out; at most a few staging buffers stay alive."""
    rng = np.random.default_rng(2)
    want = rng.integers(0, 256, 4096 * 9 + 123, dtype=np.uint8).tobytes()
    cuts = sorted(set([0, len(want)] + list(rng.integers(0, len(want), 30))))
    pieces = [(a, want[a:b]) for a, b in zip(cuts, cuts[1:])]
    rng.shuffle(pieces)
    if mode == "refused_at_open":
        monkeypatch.setattr(directio.os, "O_DIRECT", 0, raising=False)
    path = tmp_path / "out.bin"
    with directio.through_page_cache() if mode == "page_cache" else contextlib.nullcontext():
        w = directio.ScatterWriter(path, len(want), block=4096)
    if mode == "refused_at_write":
        _refuse_direct_writes(w, monkeypatch)
    for pos, data in pieces:
        w.pwrite(data, pos)
    assert not w.filling  # every block complete, and sent
    w.close()
    assert path.read_bytes() == want
    assert w.direct == (mode == "direct" and bool(getattr(os, "O_DIRECT", 0)) and w.direct)


def test_scatter_writer_refuses_missing_and_stray_bytes(tmp_path):
    w = directio.ScatterWriter(tmp_path / "a.bin", 10000, block=4096)
    with pytest.raises(ValueError, match="do not fit"):
        w.pwrite(b"x" * 10, 9995)
    w.pwrite(b"y" * 9000, 0)
    with pytest.raises(ValueError, match="1000 bytes were never written"):
        w.close()


def test_page_cache_writes_start_their_writeback_at_once(tmp_path, monkeypatch):
    """Bytes written through the page cache (a verified output) have their writeback started as they are
    written (``start_writeback``), every byte of the file once; O_DIRECT blocks need none. The kernel call
    itself is exercised on this file too (it must not disturb the bytes)."""
    calls = []
    real = directio.start_writeback
    monkeypatch.setattr(directio, "start_writeback", lambda fd, pos, n: (calls.append((pos, n)), real(fd, pos, n)))
    data = np.random.default_rng(0).integers(0, 256, 5 * 4096 + 77, dtype=np.uint8).tobytes()
    with directio.through_page_cache():
        w = directio.DirectWriter(tmp_path / "a", block=4096)
        w.write(data)
        w.close()
        s = directio.ScatterWriter(tmp_path / "b", len(data), block=4096)
        s.pwrite(data[4096:], 4096)
        s.pwrite(data[:4096], 0)
        s.close()
    assert (tmp_path / "a").read_bytes() == data and (tmp_path / "b").read_bytes() == data
    covered = sorted(calls)
    assert sum(n for _, n in covered) == 2 * len(data)
    calls.clear()
    w = directio.DirectWriter(tmp_path / "c", block=4096)
    w.write(data)
    w.close()
    if w.direct or calls:  # O_DIRECT where the file system allows it: only the partial tail is buffered
        assert sum(n for _, n in calls) <= 4096


def test_a_block_that_cannot_be_handed_off_stays_staged(tmp_path, monkeypatch):
    """When no thread can be started for a block (or the wait for a slot is interrupted), ``write`` raises and
    the block stays staged: ``close`` still works (no released view, no slot lost) and writes it."""
    import threading

    probe = directio.DirectWriter(tmp_path / "probe.bin", block=4096)
    probe.close()
    if not probe.direct:
        pytest.skip("O_DIRECT is not available on this file system: no background writes")
    real = threading.Thread.start

    def start(self):
        if self.name == "rnnconvert-odirect":
            raise RuntimeError("can't start new thread")
        return real(self)
    w = directio.DirectWriter(tmp_path / "out.bin", block=4096)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="new thread"):
        w.write(b"x" * 5000)
    monkeypatch.undo()
    assert w.flight.slots._value == directio.IN_FLIGHT
    w.close()
    assert (tmp_path / "out.bin").read_bytes() == b"x" * 4096
