"""The isolated reader when a runtime with native worker threads is loaded (``rnnconvert.safety.guard``).

A plain fork after TensorFlow and torch ran in the same process hung the forked HDF5 read of a valid file until
the deadline (reproduced in the suite: tests/formats/whole_models/test_whole_savedmodel.py then a whole-model read in the
same pytest process), which was then reported as a damaged file. Once such a runtime is loaded the reader runs
in a fresh interpreter: these tests force that route and check it answers as the in-process read does, keeps
the deadline, reports a crash and refuses a looping file as the fork does."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from rnnconvert.errors import FormatError
from rnnconvert.safety import guard

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "data" / "bad"


@pytest.fixture
def spawned(monkeypatch):
    monkeypatch.setattr(guard, "fork_unsafe", lambda: True)
    made = []
    real = guard._Spawned

    def counting(*a):
        made.append(1)
        return real(*a)

    monkeypatch.setattr(guard, "_Spawned", counting)
    return made


def test_threaded_runtime_means_spawned_child():
    import sys

    assert guard.fork_unsafe() == any(m in sys.modules for m in guard.THREADED_RUNTIMES)


def test_spawned_read_answers_as_in_process(spawned, monkeypatch):
    import rnnconvert

    src = ROOT / "fixtures" / "keras" / "bidi_lstm_concat.h5"
    got = rnnconvert.load(src)
    assert spawned, "the read did not take the spawned route"
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")
    want = rnnconvert.load(src)
    assert [l.name for l in got.layers] == [l.name for l in want.layers]
    for a, b in zip(got.layers, want.layers):
        for ka, kb in zip(a.params, b.params):
            for da, db in zip(ka, kb):
                for k, x in da.arrays().items():
                    assert np.array_equal(x, db.arrays()[k]), (a.name, k)


def test_spawned_child_keeps_the_deadline_and_reports_a_crash(spawned, monkeypatch):
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "1")
    t0 = time.monotonic()
    with pytest.raises(FormatError, match="did not finish"):
        guard.isolated(time.sleep, (30,), BAD / "h5_nan.h5", "test")
    assert time.monotonic() - t0 < 15
    with pytest.raises(FormatError, match="crashed"):
        guard.isolated(guard.os.abort, (), BAD / "h5_nan.h5", "test")
    assert len(spawned) == 2


def test_spawned_child_refuses_the_fuzz_found_loop(spawned, monkeypatch, tmp_path, capsys):
    from rnnconvert.cli import main

    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "2")
    src = ROOT / "tests" / "data" / "fuzz_found" / "h5_libhdf5_loop.h5"
    assert main([str(src), str(tmp_path / "o.npz")]) == 3
    assert "did not finish" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert spawned
