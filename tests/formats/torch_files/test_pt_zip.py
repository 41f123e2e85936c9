"""Our ``.pt`` zip writer (rnnconvert/formats/torch/zip_write.py) against torch's own bytes.

Oracle: ``torch.save(state_dict, fileobj)`` of the same arrays (``torch.from_numpy``), and
``torch._C.PyTorchFileWriter`` itself for the container alone. Every file must be the same bytes, pass
``zipfile``'s CRC check and load with ``torch.load(weights_only=True)``. The > 4 GiB zip64 case runs
only with ``RNNCONVERT_BIG_TESTS=1`` (it needs ~9 GB of memory and disk).
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile

import numpy as np
import pytest

from rnnconvert.conventions import torch_state
import rnnconvert
from rnnconvert.errors import UnsupportedError
from rnnconvert.formats.torch import pt_write as pt_writer, zip_write as pt_zip, pt_read as torch_pt
from rnnconvert.core.model import Checkpoint

from conftest import FIXTURES

torch = pytest.importorskip("torch")


def torch_save_bytes(sd: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(np.array(v, order="C")) for k, v in sd.items()}, buf)
    return buf.getvalue()


def stream_bytes(sd: dict[str, np.ndarray], path, fast: bool = True) -> bytes:
    """``sd`` written by the streaming writer as carried tensors; asserts which zip writer ran."""
    st = pt_writer.PtStream(Checkpoint(tensors=sd), path, fast_zip=fast)
    assert isinstance(st.zw, pt_zip.ZipWriter) == fast
    st.close()
    return path.read_bytes()


def check_readable(path, sd):
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every record's CRC-32 is right
    got = torch.load(path, weights_only=True)
    assert list(got) == list(sd)
    for k, v in sd.items():
        assert got[k].numpy().dtype == v.dtype and np.array_equal(got[k].numpy(), v)


def _cases():
    rng = np.random.default_rng(7)
    dtypes = [np.float16, np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_, np.complex64]
    yield "dtypes_and_sizes", {f"t{i}.{np.dtype(dt).name}": (rng.standard_normal(n) * 50).astype(dt)
                               for i, (n, dt) in enumerate((n, dt) for dt in dtypes for n in (1, 15, 16, 17, 64, 65))}
    yield "empty_and_0d", {"e0": np.zeros(0, np.float32), "e1": np.zeros((3, 0), np.float64), "e2": np.zeros((0, 4), np.int64),
                           "s": np.array(2.5, np.float64), "s16": np.array(-1, np.float16), "after": np.arange(5, dtype=np.float32)}
    # data that starts with the data-descriptor signature: torch folds bytes 4..8 into serialization_id
    yield "dd_signature_data", {"x": np.frombuffer(b"PK\x07\x08\x01\x02\x03\x04" + bytes(range(24)), np.uint8).copy(),
                                "y": np.frombuffer(b"PK\x07\x08abcd", np.uint8).copy(), "z": np.frombuffer(b"PK\x07\x08", np.uint8).copy()}
    yield "300_records", {f"layer{i}." + "w" * (i % 71): rng.standard_normal(i % 130).astype(np.float32) for i in range(300)}
    # names of every length 1..130: every padding size 0..63 (the "FB" field when no 'Z' fits, too)
    for n in range(1, 131, 1):
        yield f"name_{n}", {"k" * n: rng.standard_normal(3).astype(np.float32), "v": np.ones(n % 7, np.float16)}


CASES = dict(_cases())


def test_state_dicts_are_torch_save_byte_for_byte(tmp_path):
    for name, sd in CASES.items():
        want = torch_save_bytes(sd)
        assert stream_bytes(sd, tmp_path / "fast.pt") == want, name
        if not name.startswith("name_"):
            check_readable(tmp_path / "fast.pt", sd)
            assert stream_bytes(sd, tmp_path / "slow.pt", fast=False) == want, name  # torch's writer, same bytes


def test_every_fixture_written_as_pt_is_torch_save(tmp_path):
    srcs = sorted(FIXTURES.glob("keras/*.h5")) + sorted(p for p in FIXTURES.glob("tf/*") if p.is_dir())
    done = 0
    for src in srcs:
        ckpt = rnnconvert.load(src)
        try:
            rnnconvert.save(ckpt, tmp_path / "out.pt", force=True)
        except UnsupportedError:
            continue  # what .pt cannot express
        sd = torch_state.state_dict(ckpt)
        assert (tmp_path / "out.pt").read_bytes() == torch_save_bytes(sd), src.name
        done += 1
    assert done >= 10


@pytest.mark.parametrize("alignment", [64, 1, 8, 100, 128, 4096])
def test_container_matches_pytorchfilewriter(alignment):
    rng = np.random.default_rng(alignment)
    recs = [("data.pkl", b"\x80\x02pickle"), ("n" * 37, rng.integers(0, 256, 1000, dtype=np.uint8)), ("empty", b""),
            ("sig", np.frombuffer(b"PK\x07\x08abcdefgh", np.uint8)), ("big", rng.standard_normal(300_000).astype(np.float32))]
    ref = pt_zip._Sink()
    w = torch._C.PyTorchFileWriter(ref, True, alignment)
    for name, data in recs:
        b = bytes(pt_zip._as_bytes(data))
        w.write_record(name, b, len(b))
    w.write_end_of_file()
    tail = pt_zip.torch_tail(torch, [n for n, _ in recs], alignment)
    assert tail is not None
    mine = pt_zip._Sink()
    zw = pt_zip.ZipWriter(mine, alignment)
    old = pt_zip.CHUNK
    try:
        pt_zip.CHUNK = 1 << 16  # several CRC/write steps for 'big'
        for name, data in recs:
            zw.write_record(name, data)
    finally:
        pt_zip.CHUNK = old
    tail.write(zw)
    assert mine.value() == ref.value()


def test_more_than_65535_records(tmp_path):
    """The end record's counts are capped at 0xFFFF (the zip64 end record has the real count)."""
    sd = {f"t{i}": np.full(i % 3, i, np.int32) for i in range(65540)}
    assert stream_bytes(sd, tmp_path / "many.pt") == torch_save_bytes(sd)
    with zipfile.ZipFile(tmp_path / "many.pt") as z:
        assert len(z.infolist()) == 65540 + 6


def test_torch_route_gives_the_same_bytes(tmp_path):
    """``fast_zip=False`` (torch's ``_save`` and ``PyTorchFileWriter``) and the default torch-free route
    write the same file; the default reads no torch setting (it writes what torch's defaults write)."""
    sd = CASES["empty_and_0d"]
    want = torch_save_bytes(sd)
    assert stream_bytes(sd, tmp_path / "a.pt", fast=False) == want
    assert stream_bytes(sd, tmp_path / "b.pt") == want


class _HashSink:
    def __init__(self) -> None:
        self.h, self.n = hashlib.sha256(), 0

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        return len(b)

    def flush(self) -> None:
        pass


@pytest.mark.skipif(os.environ.get("RNNCONVERT_BIG_TESTS") != "1", reason="needs ~9 GB: set RNNCONVERT_BIG_TESTS=1")
def test_zip64_over_4gib(tmp_path):
    """A record of 0xFFFFFFFF bytes (zip64 sizes, 24-byte descriptor) and records after the 4 GiB mark
    (zip64 offsets; central directory offset capped in the end record)."""
    big = np.empty(0xFFFFFFFF, np.uint8)
    block = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    whole = big[: len(big) // len(block) * len(block)].reshape(-1, len(block))
    whole[:] = block
    big[whole.size:] = block[: len(big) - whole.size]
    del whole
    sd = {"small": np.arange(10, dtype=np.float32), "big": big, "after": np.arange(7, dtype=np.float64)}
    ref = _HashSink()
    torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, ref)
    out = tmp_path / "big.pt"
    pt_writer.PtStream(Checkpoint(tensors=sd), out).close()
    mine = hashlib.sha256()
    with open(out, "rb") as fh:
        while chunk := fh.read(64 << 20):
            mine.update(chunk)
    assert out.stat().st_size == ref.n and mine.hexdigest() == ref.h.hexdigest()
    got = torch.load(out, weights_only=True, mmap=True)
    assert np.array_equal(got["after"].numpy(), sd["after"]) and np.array_equal(got["big"][-5:].numpy(), big[-5:])
