"""formats/directio.py: large outputs written with O_DIRECT in whole aligned blocks, the tail buffered.

The bytes must be exactly what was written, whether O_DIRECT is used, refused at open, or refused at the
first write; the .pt and ONNX writers that use it stay byte-identical to torch.save / the embedded model
(tests/test_pt_stream.py, tests/test_onnx.py run them with a small block so that O_DIRECT is exercised)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from rnnconvert.formats import directio


def _chunks(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 4095, 4096, 4097, 12288, 70000, 3, 8191] + list(rng.integers(0, 20000, 40))
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("mode", ["direct", "refused_at_open", "refused_at_write"])
def test_bytes_are_what_was_written(mode, tmp_path, monkeypatch):
    path = tmp_path / "out.bin"
    if mode == "refused_at_open":
        monkeypatch.setattr(directio.os, "O_DIRECT", 0, raising=False)
    w = directio.DirectWriter(path, block=4096)
    if mode == "refused_at_write" and w.direct:
        real = os.pwrite

        def pwrite(fd, data, offset):
            if fd == w.dfd:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, data, offset)
        monkeypatch.setattr(directio.os, "pwrite", pwrite)
    chunks = _chunks(1)
    with w:
        for c in chunks:
            assert w.write(memoryview(c)) == len(c)
        assert w.tell() == sum(map(len, chunks))
    assert path.read_bytes() == b"".join(chunks)
    if mode != "direct":
        assert not w.direct


def test_other_errors_are_raised(tmp_path, monkeypatch):
    w = directio.DirectWriter(tmp_path / "out.bin", block=4096)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(directio.os, "pwrite", full)
    with pytest.raises(OSError, match="No space"):
        w.write(b"x" * 5000)
    monkeypatch.undo()
    w.close()


def test_verified_conversions_write_through_the_page_cache(tmp_path, monkeypatch):
    """A verified conversion reads its output back at once, so it writes through the page cache; an
    unverified one goes around it. Same bytes either way (torch.save's, tests/test_pt_stream.py)."""
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
