"""The third attack corpus's budget families (issue 40: HIGH 4 pickle DAGs, HIGH 5 aliased TFLite tables, the
``.pdparams`` and msgpack LOW items), each file regenerated from plain bytes by
``bench/fuzz/attack_corpus3_budgets.py`` (nothing binary committed, no payload ever unpickled here) and given to the
real CLI in a subprocess under a 3 GiB address-space limit and a 60 s timeout (each ran until SIGKILL before:
2**64 hashes in one C call, 10**8 operator records), with its own empty ``TMPDIR``. Every case asserts the
documented exit code, exactly one ``rnnconvert: error:`` line, nothing left in DST's folder or ``TMPDIR``.

Then the pre-pass (:mod:`rnnconvert.safety.pickle_scan`) on what real pickles hold: every protocol of Python's own
pickler, ``torch.save`` zip and legacy files, read back by their own loaders after the scan passed them.
"""

from __future__ import annotations

import collections
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rnnconvert.errors import BudgetError, FormatError
from rnnconvert.safety import pickle_scan

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "fuzz"))
import attack_corpus3_budgets as gen  # noqa: E402

MEMORY = 3 << 30
TIMEOUT = 60


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def cli(*args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "TMPDIR": str(tmpdir)}
    e.pop("RNNCONVERT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rnnconvert", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=e, preexec_fn=_limit, cwd=ROOT)


EXPANDED = "pickle object size"
# (file name in gen.CASES, exit code, words of the one line)
CASES = [
    ("dag_key.pkl", 11, EXPANDED),
    ("dag_message.pkl", 11, EXPANDED),
    ("dag_key_small.pkl", 3, "as a dict key"),
    ("dag_message_small.pkl", 3, "numpy dtype [["),
    ("dag_key.pdparams", 11, EXPANDED),
    ("dag_message.pdparams", 11, EXPANDED),
    ("dag_message_small.pdparams", 3, "array dtype [["),
    ("trailing.pdparams", 3, "data after the pickle's STOP"),
    ("dag_key_zip.pt", 11, EXPANDED),
    ("dag_key_legacy.pt", 11, EXPANDED),
    ("aliased.tflite", 3, "subgraph entries point at a subgraph another entry points at"),
    ("shared_inputs.tflite", 11, "operator inputs and outputs"),
    ("dotted.msgpack", 3, "both give the name 'head.w'"),
    ("slash.msgpack", 3, "both give the name 'head.w'"),
    ("duplicate.msgpack", 3, "holds the key 'head' twice"),
]


@pytest.mark.parametrize("name,code,says", CASES, ids=[c[0] for c in CASES])
def test_budget_attacks_end_with_one_line(name, code, says, tmp_path):
    if name.endswith(".tflite"):
        pytest.importorskip("tflite")
    if name.endswith(".msgpack"):
        pytest.importorskip("msgpack")
    src = gen.CASES[name](tmp_path / name)
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmpdir.mkdir()
    t0 = time.monotonic()
    r = cli("convert", str(src), str(out / "o.npz"), "--no-verify", tmpdir=tmpdir)
    took = time.monotonic() - t0
    lines = r.stderr.splitlines()
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and lines[0].startswith("rnnconvert: error: ") and says in lines[0], r.stderr
    assert len(lines[0]) < 600, lines[0]
    assert list(out.iterdir()) == [] and list(tmpdir.iterdir()) == []
    assert took < TIMEOUT


# -- the pre-pass on real pickles -----------------------------------------------------------------------------

class Net:  # a project's class, pickled by reference (the scan never resolves it)
    def __init__(self):
        self.w = np.arange(6, dtype=np.float32).reshape(2, 3)
        self.layers = [{"b": np.ones(3)}, {"b": np.zeros(2)}]


OBJECTS = [
    {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": [1, 2.5, "x", None, True, b"raw", 10 ** 40],
     "c": (1, (2, 3)), "d": {1, 2, "s"}, "e": frozenset({(1, 2)}), ("lstm", 0): np.float64(3.0)},
    collections.OrderedDict(x=np.zeros(3, np.float16)), [[]] * 5, collections.Counter("hello"),
    collections.defaultdict(list, a=[1]), Net(), bytearray(b"ab"), 3 + 4j, list(range(3000)),
    {"shared": [np.ones(2)] * 100, "s": "é" * 300},
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_scan_passes_what_pythons_pickler_writes(protocol):
    """Every protocol of CPython's own pickler: the scan passes and ends exactly at ``STOP`` (the oracle:
    ``pickle.dumps``' length, and ``pickle.loads`` reading the same bytes back)."""
    for obj in OBJECTS:
        data = pickle.dumps(obj, protocol=protocol)
        assert pickle_scan.scan(data, "x") == len(data)
        pickle.loads(data)


def test_scan_passes_torch_save_zip_and_legacy(tmp_path):
    torch = pytest.importorskip("torch")
    from rnnconvert.formats.torch import pt_read

    m = torch.nn.LSTM(3, 4, 2, bidirectional=True)
    opt = torch.optim.Adam(m.parameters())
    m(torch.zeros(2, 1, 3))[0].sum().backward()
    opt.step()
    ck = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "losses": [0.5] * 3000}
    for zipped in (True, False):
        f = tmp_path / f"ck{zipped}.pt"
        torch.save(ck, f, _use_new_zipfile_serialization=zipped)
        pt_read.prescan(f, zipped)
        assert set(torch.load(f, weights_only=True)) == set(ck)


def test_scan_limits():
    with pytest.raises(BudgetError, match="RNNCONVERT_MAX_PICKLE_EXPANDED"):
        pickle_scan.scan(gen.dag_key_pickle(40), "x")
    with pytest.raises(FormatError, match="as a dict key"):
        pickle_scan.scan(gen.dag_key_pickle(8), "x")
    deep: list = []
    for _ in range(300):
        deep = [deep]
    nested = pickle.dumps(deep)
    with pytest.raises(FormatError, match="deeper than"):
        pickle_scan.scan(nested, "x")
    with pytest.raises(FormatError, match="memo index"):
        pickle_scan.scan(b"\x80\x02N" + b"r" + (10 ** 9).to_bytes(4, "little") + b".", "x")
    with pytest.raises(FormatError, match="calls builtins.frozenset"):  # frozenset([t]) hashes t
        pickle_scan.scan(b"\x80\x02cbuiltins\nfrozenset\n" + gen.tuple_dag(10) + b"\x85\x85R.", "x")
    small = gen.dag_key_pickle(4)
    assert pickle_scan.scan(small, "x") == len(small)  # a 31-node tuple key is fine
    assert pickle.loads(small) == {gen_tuple(4): 1}


def gen_tuple(levels: int):
    t = ()
    for _ in range(levels):
        t = (t, t)
    return t


def test_brief_is_bounded_on_a_shared_dag():
    """A list DAG of 2**60 nodes formats in a few dozen steps (``repr`` would never end)."""
    a: list = []
    for _ in range(60):
        a = [a, a]
    t0 = time.monotonic()
    text = pickle_scan.brief(a, 60)
    assert time.monotonic() - t0 < 1 and len(text) <= 60 and text.startswith("[[")


def test_tflite_loop_work_is_counted_before_the_loops_are_read(monkeypatch):
    """Loops may share a body (subgraphs are named by index), and each walks its own subgraph: the work is their sum,
    checked before any loop is read. ``bigru.tflite`` (two loops in a 70-record main graph, TF's converter) holds
    411 records and asks for 2 * 70 + 2 * (11 + 157) = 476 steps: a limit between the two refuses it at the loops."""
    pytest.importorskip("tflite")
    from rnnconvert.formats.tflite import tflite_read

    src = ROOT / "fixtures" / "tflite_while" / "bigru.tflite"
    monkeypatch.setenv("RNNCONVERT_MAX_GRAPH_NODES", "420")
    with pytest.raises(BudgetError, match="2 WHILE loops"):
        tflite_read.read(src)
    monkeypatch.setenv("RNNCONVERT_MAX_GRAPH_NODES", "480")
    assert len(tflite_read.read(src).layers) == 1
