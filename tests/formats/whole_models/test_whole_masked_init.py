"""Keras ``initial_state`` under a mask, rows wholly masked (session 17): tf_keras' ``backend.rnn`` starts the
previous output at zeros, so a wholly masked row's last output is zeros while its returned state is the initial
one. The ``.pt2`` program and the emitted module returned the initial state as the output (0.5 off here); the ONNX
graph was right. Oracle: tf_keras' own outputs stored by ``fixtures/gen_whole_masked_init.py``; each written file
run by its own runtime (onnxruntime, ``torch.export.load``, the emitted module imported). The bound 1e-4 is
three orders above float32 rounding of these 7-step, 4-unit layers and three below the error it guards against.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "fixtures" / "whole_masked_init" / "masked_init.h5"
ORACLE = np.load(ROOT / "fixtures" / "whole_masked_init" / "masked_init.npz")
INPUTS = [ORACLE["in__x"], ORACLE["in__h0"], ORACLE["in__c0"]]
WANT = [ORACLE[f"out__{i}"] for i in range(5)]


def _convert(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(SRC), *args, "--force"], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


def _check(got: list) -> None:
    assert np.abs(WANT[3][4]).max() == 0 and np.abs(WANT[1][4] - INPUTS[1][4]).max() == 0  # the oracle's own case
    for g, w in zip(got, WANT):
        assert np.asarray(g).shape == w.shape
        assert np.abs(np.asarray(g) - w).max() <= 1e-4


def test_onnx(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "m.onnx"
    _convert(str(out))
    s = ort.InferenceSession(str(out))
    feed = {i.name: v for i, v in zip(s.get_inputs(), INPUTS)}
    _check(s.run(None, feed)[:5])


def test_pt2(tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "m.pt2"
    _convert(str(out))
    prog = torch.export.load(str(out)).module()
    with torch.no_grad():
        _check([o.numpy() for o in prog(*[torch.from_numpy(v) for v in INPUTS])[:5]])


def test_emitted_module(tmp_path):
    torch = pytest.importorskip("torch")
    py, state = tmp_path / "m.py", tmp_path / "m.pt"
    _convert(str(state), "--emit-module", str(py))
    spec = importlib.util.spec_from_file_location("masked_init_module", py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.Model()
    m.load_state_dict(torch.load(state))
    m.eval()
    with torch.no_grad():
        _check([o.numpy() for o in m(*[torch.from_numpy(v) for v in INPUTS])[:5]])
