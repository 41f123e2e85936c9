"""The torch-free ``.pt`` pieces (rnnconvert/formats/torch/pickle_write.py) against torch's own bytes.

Oracle: ``torch.save(state_dict, fileobj)`` (its ``archive/data.pkl`` and ``.data/serialization_id``)
and ``torch._C.PyTorchFileWriter`` for the serialization id of arbitrary record names. The last test
converts with ``import torch`` blocked in a child process and compares the file with ``torch.save``.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from rnnconvert.formats.torch import pickle_write as pt_pickle, zip_write as pt_zip

from conftest import FIXTURES, ROOT

torch = pytest.importorskip("torch")


def _saved(sd: dict[str, np.ndarray]) -> zipfile.ZipFile:
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(np.array(v, order="C")) for k, v in sd.items()}, buf)
    return zipfile.ZipFile(io.BytesIO(buf.getvalue()))


def _key(s: str) -> str:
    return "".join(list(s))  # a new str object, as keys read from a file are (not an interned literal)


def _cases():
    rng = np.random.default_rng(3)
    dts = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_,
           np.complex64, np.complex128]
    yield "one_key", {_key("w"): np.ones((3, 2), np.float32)}
    yield "empty_dict", {}
    yield "dtypes", {_key(f"t.{np.dtype(dt).name}"): np.zeros(5, dt) for dt in dts}
    yield "empty_and_0d", {_key("e0"): np.zeros(0, np.float32), _key("e1"): np.zeros((3, 0), np.float64),
                           _key("e2"): np.zeros((0, 4), np.int64), _key("s"): np.array(2.5, np.float64),
                           _key("5d"): np.zeros((1, 2, 3, 1, 2), np.float16)}
    # keys equal to torch's storage keys and constants; non-ASCII keys
    yield "tricky_keys", {_key(k): np.zeros(2, np.float32) for k in ("0", "1", "cpu", "storage", "ü.wéight", "")}
    # element counts across BININT1/BININT2/BININT, a LONG1 count without the memory (a broadcast view)
    yield "large", {_key("a"): np.zeros(255, np.float32), _key("b"): np.zeros(256, np.float32),
                    _key("c"): np.zeros((300, 300), np.float16), _key("d"): np.zeros(70_000, np.uint8)}
    for n in (2, 3, 255, 256, 257, 999, 1000, 1001, 2000, 2500):  # memo past 255; SETITEMS batches of 1000
        yield f"{n}_keys", {_key(f"layer.{i}.weight_ih_l0"): np.zeros((i % 4 + 1, 2), dts[i % 3]) for i in range(n)}


CASES = dict(_cases())


@pytest.mark.parametrize("name", list(CASES))
def test_data_pkl_and_id_match_torch_save(name):
    sd = CASES[name]
    z = _saved(sd)
    entries = [(k, v.shape, v.dtype) for k, v in sd.items()]
    assert pt_pickle.data_pkl(entries) == z.read("archive/data.pkl")
    names = [n.removeprefix("archive/") for n in z.namelist()]
    assert names[-1] == ".data/serialization_id"
    assert pt_pickle.serialization_id_names(names[:-1]) == z.read(z.namelist()[-1]).decode()[:20]


@pytest.mark.parametrize("v", [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40 + 7, 2**63 - 1, 2**63])
def test_integers_as_cpython_pickles_them(v):
    """Element counts and sizes of any magnitude (BININT1/BININT2/BININT/LONG1): CPython's C pickler
    at protocol 2 is the oracle."""
    p = pt_pickle.Protocol2Writer()
    p.integer(v)
    assert bytes(p.out) == pickle.dumps(v, protocol=2)[:-1]  # both start with PROTO 2


@pytest.mark.parametrize("n", [1, 2, 5, 12, 13, 14, 28, 29, 30, 59, 60, 127, 128, 300, 541, 542, 1200])
def test_serialization_id_of_any_names(n):
    """The name half of ``.data/serialization_id`` across the unordered_set's rehash points, for record
    names of every length mod 8 (libstdc++ ``_Hash_bytes`` tail bytes)."""
    rng = np.random.default_rng(n)
    names = [f"{'x' * int(rng.integers(0, 20))}/{i}" for i in range(n)]
    tail = pt_zip.torch_tail(torch, names, 64)
    assert tail is not None
    full = names + [r for r, _ in tail.records]
    assert pt_pickle.serialization_id_names(full) == tail.name_half


BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
from rnnconvert import cli
rc = cli.main(sys.argv[1:])
assert "torch" not in sys.modules, "torch was imported"
sys.exit(rc)
"""


def test_pt_written_with_torch_blocked(tmp_path):
    """A conversion to .pt in a process where ``import torch`` fails: the same bytes as ``torch.save``
    of the state dict that rnnconvert (with torch) writes, and torch loads it."""
    src = FIXTURES / "keras" / "cudnn_lstm.h5"
    out = tmp_path / "no_torch.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(src), str(out), "--no-verify"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sd = torch.load(out, weights_only=True)
    buf = io.BytesIO()
    torch.save({k: v.clone() for k, v in sd.items()}, buf)
    assert out.read_bytes() == buf.getvalue()
    # and a check that needs torch names the extra that adds it
    r = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(src), str(tmp_path / "v.pt")], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        assert "rnnconvert[torch]" in r.stderr, r.stderr
