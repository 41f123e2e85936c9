"""The whole-model check's fully masked row (session 18): for a model whose inputs carry a mask (Embedding
``mask_zero``, ``Masking``) the check also runs a second, small batch whose first row has every step masked
(``keras_whole.fully_masked_inputs``), the case where tf_keras' ``backend.rnn`` outputs zeros (and returns the
initial state) and a masked ``GlobalAveragePooling1D`` divides 0 by 0 (NaN). The main batch's rows are untouched,
so a correct conversion's verdicts are the ones it had.

Oracle: tf_keras 2.21 running the fixture files (made by tf_keras through ``fixtures/gen_whole_masked_init.py`` and
``fixtures/gen_whole_graph.py``), loaded by ``tf_keras.models.load_model`` (the committed fixtures are trusted) on the
fully masked row; the written files run by their own runtimes (onnxruntime, torch). The hand-made wrong files are
shown wrong against tf_keras first, then judged by ``rnnconvert verify``. Bounds: tf_keras' zeros and the initial
state differ by more than 0.3 (the initial states are drawn in [0.3, 0.8]), far from float32 rounding.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tf_keras")
torch = pytest.importorskip("torch")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.verify.whole_rule import WholeFindings, decide_whole  # noqa: E402
from rnnconvert.whole.runtimes import torch_export  # noqa: E402
from rnnconvert.whole.verify import keras_whole_check  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
INIT = ROOT / "fixtures" / "whole_masked_init" / "masked_init.h5"
MEAN = ROOT / "fixtures" / "whole_graph" / "whole30_masked_bidir.h5"


def _tf_keras(path: Path):
    import json

    import h5py
    import tf_keras

    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["model_config"])
    return tf_keras.models.load_model(str(path), compile=False), cfg


def _tf_keras_run(m, xs: dict) -> list[np.ndarray]:
    args = [xs[t.node.layer.name] for t in m.inputs]
    y = m(args if len(args) > 1 else args[0], training=False)
    return [np.asarray(a, np.float64) for a in (y if isinstance(y, (list, tuple)) else [y])]


def _ort_run(path: Path, xs: dict) -> list[np.ndarray]:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    kinds = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in s.get_inputs()}
    outs = sorted((o.name for o in s.get_outputs() if o.name.startswith("output_")), key=lambda n: int(n[7:]))
    return [np.asarray(a, np.float64) for a in s.run(outs, {k: np.asarray(xs[k]).astype(t) for k, t in kinds.items()})]


def _whole(rep) -> dict:
    return {c.name: (c.verdict, c.max_abs_err, c.tolerance, c.reason) for c in rep.layers
            if c.name.startswith(("model", "module"))}


@pytest.fixture(scope="module")
def init_onnx(tmp_path_factory):
    dst = tmp_path_factory.mktemp("full_mask") / "init.onnx"
    rep = rnnconvert.convert(INIT, dst)
    return dst, rep


@pytest.fixture(scope="module")
def mean_onnx(tmp_path_factory):
    dst = tmp_path_factory.mktemp("full_mask") / "mean.onnx"
    rep = rnnconvert.convert(MEAN, dst)
    return dst, rep


def test_fully_masked_batch_leaves_the_main_rows_alone():
    """Row 0 has every step masked on every masked input, row 1 is the main batch's unpadded row 0; the other
    inputs (initial states) as generated; no batch for a model without a masked input."""
    m, cfg = _tf_keras(INIT)
    xs = keras_whole.make_inputs(m, cfg, 0)
    xf = keras_whole.fully_masked_inputs(m, cfg, 0)
    assert set(xf) == set(xs) == {"x", "h0", "c0"}
    assert (xf["x"][0] == 0).all() and (xf["x"][1] == xs["x"][0]).all() and (xs["x"][0] != 0).any(-1).all()
    for k in ("h0", "c0"):
        assert (xf[k][0] == xs[k][0]).all() and (xf[k][1] == xs[k][0]).all()
    assert keras_whole.padded_steps(3, 9) == [(1, [6, 7, 8]), (2, [0, 1, 5])]  # the main batch's rows, as before
    plain, pcfg = _tf_keras(ROOT / "fixtures" / "whole_tflite" / "wt_gru.h5")
    assert keras_whole.fully_masked_inputs(plain, pcfg, 0) is None


def _initial_state_bug(src: Path, dst: Path) -> None:
    """The session-17 bug put back into a correct graph: the LSTM's last output on a row with no unmasked step is
    the initial state ``h0`` (the ``Where`` that gives zeros there now gives ``h0``)."""
    m = onnx.load(str(src))
    ident = next(n for n in m.graph.node if list(n.output) == ["layer:lstm"])
    where = next(n for n in m.graph.node if list(n.output) == [ident.input[0]])
    assert where.op_type == "Where"
    where.input[2] = "h0"
    onnx.save(m, str(dst))


def test_initial_state_bug_fails_on_the_fully_masked_row(init_onnx, tmp_path, monkeypatch):
    dst, rep = init_onnx
    assert set(v for v, *_ in _whole(rep.verification).values()) == {"ok"}
    bad = tmp_path / "bad.onnx"
    _initial_state_bug(dst, bad)
    m, cfg = _tf_keras(INIT)
    xs, xf = keras_whole.make_inputs(m, cfg, 0), keras_whole.fully_masked_inputs(m, cfg, 0)
    want, got = _tf_keras_run(m, xf), _ort_run(bad, xf)
    # tf_keras: the wholly masked row's last output is zeros, its returned h the initial state
    assert np.abs(want[0][0]).max() == 0 and np.abs(want[1][0] - xf["h0"][0]).max() == 0
    assert np.abs(got[0][0] - want[0][0]).max() > 0.3  # the edited graph is wrong there (h0 in [0.3, 0.8])
    # ... and right on every row of the main batch, which has no wholly masked row: the old check passed it
    main_want, main_got = _tf_keras_run(m, xs), _ort_run(bad, xs)
    assert max(float(np.abs(a - b).max()) for a, b in zip(main_want, main_got)) < 1e-5
    with monkeypatch.context() as mp:
        mp.setattr(keras_whole, "fully_masked_inputs", lambda *a, **k: None)
        assert set(v for v, *_ in _whole(rnnconvert.verify(INIT, bad)).values()) == {"ok"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "verify", str(INIT), str(bad)], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 5, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "fully masked row" in r.stdout + r.stderr


def test_emitted_module_initial_state_bug_fails(tmp_path):
    """The same bug in the emitted module's source (the line session 17 added, removed again): FAIL."""
    py, state = tmp_path / "init_mod.py", tmp_path / "init.pt"
    rnnconvert.convert(INIT, state, verify=None, emit_module=py)
    from rnnconvert.whole.formats.torch import module_write

    text = py.read_text()
    fixed = "lstm = torch.where(mask_x.any(1, keepdim=True), lstm_h[0], 0.0)"
    assert fixed in text
    py.write_text(text.replace(fixed, "lstm = lstm_h[0]"))
    ckpt = rnnconvert.load(INIT)
    checks = torch_export.verify_module(ckpt, INIT, py, module_write.state_path(py))
    by = {c.name: c for c in checks}
    assert by["module output 0"].verdict == "fail" and by["module output 0"].reason.startswith(
        keras_whole_check.FULLY_MASKED), by["module output 0"]
    assert all(c.verdict == "ok" for n, c in by.items() if n != "module output 0"), checks


def test_masked_mean_over_no_step_is_nan_and_not_failed(mean_onnx):
    """tf_keras' masked GlobalAveragePooling1D over a wholly masked row is 0/0 = NaN (so is every output after
    it); onnxruntime running the correct graph gives NaN at the same positions: ``ok``."""
    dst, rep = mean_onnx
    m, cfg = _tf_keras(MEAN)
    xf = keras_whole.fully_masked_inputs(m, cfg, 0)
    want, got = _tf_keras_run(m, xf), _ort_run(dst, xf)
    assert np.isnan(want[0][0]).all() and np.isfinite(want[0][1]).all()
    assert (np.isnan(got[0]) == np.isnan(want[0])).all()
    assert set(v for v, *_ in _whole(rep.verification).values()) == {"ok"}


def test_finite_where_the_source_is_nan_fails(mean_onnx, tmp_path):
    """A graph that gives 0 where tf_keras gives NaN (its outputs' NaN replaced by zeros): FAIL, never ok."""
    from onnx import helper, numpy_helper

    dst, _ = mean_onnx
    m = onnx.load(str(dst))
    out = next(n for n in m.graph.node if list(n.output) == ["output_0"])
    x = out.input[0]
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "nan_zero"))
    out.input[0] = "nan_gone"
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in m.graph.node]
    at = next(i for i, n in enumerate(nodes) if list(n.output) == ["output_0"])
    del m.graph.node[:]
    m.graph.node.extend(nodes[:at] + [helper.make_node("IsNaN", [x], ["nan_is"]),
                                      helper.make_node("Where", ["nan_is", "nan_zero", x], ["nan_gone"])] + nodes[at:])
    onnx.checker.check_model(m)
    bad = tmp_path / "no_nan.onnx"
    onnx.save(m, str(bad))
    mm, cfg = _tf_keras(MEAN)
    xf = keras_whole.fully_masked_inputs(mm, cfg, 0)
    assert np.isnan(_tf_keras_run(mm, xf)[0][0]).all() and np.isfinite(_ort_run(bad, xf)[0][0]).all()
    checks = _whole(rnnconvert.verify(MEAN, bad))
    verdict, _, _, reason = checks["model output 0"]
    assert verdict == "fail" and reason.startswith(keras_whole_check.FULLY_MASKED) and "finite value" in reason


@pytest.mark.parametrize("which", ["init", "mean"])
def test_correct_conversions_keep_their_verdicts(which, init_onnx, mean_onnx, monkeypatch):
    """``verify SRC DST`` of a correct whole ``.onnx``: every check as without the fully masked batch (verdict,
    error, tolerance, reason), and as the conversion's."""
    src, (dst, rep) = (INIT, init_onnx) if which == "init" else (MEAN, mean_onnx)
    now = _whole(rnnconvert.verify(src, dst))
    with monkeypatch.context() as mp:
        mp.setattr(keras_whole, "fully_masked_inputs", lambda *a, **k: None)
        before = _whole(rnnconvert.verify(src, dst))
    assert now == before == _whole(rep.verification)
    assert set(v for v, *_ in now.values()) == {"ok"}


def test_pt2_of_masked_init_is_ok(tmp_path):
    """The ``.pt2`` program (fixed in session 17) passes the check with its fully masked row."""
    rep = rnnconvert.convert(INIT, tmp_path / "m.pt2")
    assert set(v for v, *_ in _whole(rep.verification).values()) == {"ok"}


@pytest.mark.parametrize("a, b, verdict", [
    ([1.0, math.nan], [1.0, math.nan], "ok"),
    ([1.0, math.inf], [1.0, math.inf], "ok"),
    ([1.0, math.nan], [1.0, 0.0], "fail"),
    ([1.0, 0.0], [1.0, math.nan], "fail"),
    ([1.0, math.inf], [1.0, -math.inf], "fail"),
    ([1.0, math.nan], [1.0, math.inf], "fail"),
    ([1.0, math.nan], [1.5, math.nan], "fail"),
    ([2.0, math.nan], [2.0 + 1e-6, math.nan], "ok"),
])
def test_judge_non_finite_positions(a, b, verdict):
    """Rule 1: the target's non-finite values must be the source's own (same positions, same value); the other
    positions are judged as always (the last case: 0.5 off where both are finite)."""
    checks = keras_whole_check.judge([("model output 0", 0, np.array(a), np.array(b))], "src", "dst",
                                     lambda keys: ({0: np.array(a)}, {0: {}}, ""))
    assert checks[0].verdict == verdict, checks[0]


def test_decide_whole_nonfinite_finding():
    out = decide_whole(WholeFindings(0.0, 1.0, nonfinite="the written model's output has ..."), 2e-5, 1e-2)
    assert out["verdict"] == "fail" and out["reason"].startswith("the written model's output has")


def test_end_layout_returns_the_initial_state_of_a_wholly_masked_row(tmp_path):
    """``mask_layout='end'`` (``sequence_lens`` alone): onnxruntime gives zero states for a sequence of length 0,
    tf_keras its initial state (found by the fully masked row, session 18; fixed in the writer). Oracle: tf_keras'
    outputs stored with the fixture (``fixtures/gen_whole_masked_init.py``), on its rows padded at the end only
    (none, the end, every step); the conversion, verified with the fully masked row, is ``ok``."""
    z = np.load(INIT.with_suffix(".npz"))
    dst = tmp_path / "end.onnx"
    rep = rnnconvert.convert(INIT, dst, write_opts={"mask_layout": "end"})
    assert set(v for v, *_ in _whole(rep.verification).values()) == {"ok"}
    rows = [0, 1, 4]
    assert (z["in__x"][4] == 0).all() and np.abs(z["out__1"][4] - z["in__h0"][4]).max() == 0
    got = _ort_run(dst, {k: z[f"in__{k}"][rows] for k in ("x", "h0", "c0")})
    for i, g in enumerate(got):
        assert np.abs(g - z[f"out__{i}"][rows]).max() <= 1e-4, i
