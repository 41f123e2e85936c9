"""The numpy source evaluator of whole models (rnnconvert/whole/verify/numpy_source.py, issue #39) against its
oracle, tf_keras running the framework-made fixtures (fixtures/keras_whole, whole_graph, whole_masks, whole_conv,
whole_states, whole_attention, whole_free_axis, loose; their gen_*.py scripts; Mycroft Precise's real GRU model,
fixtures/realworld) and the framework outputs stored
beside them (``*.npz``: ``in__<input>`` / ``out__<i>``).

Tolerance, derived from rounding measured on the same inputs (never a fixed constant): each side's float32 spread
``S = max|y32 - y64|`` (numpy: both its float32 orders; tf_keras: its float32 run against its float64 twin,
``keras_whole_check.source_float64``). Where both compute the same function, ``|tf32 - np64| <= |tf32 - tf64| +
|tf64 - np64|``, the first at most ``S`` and the second float64 rounding, far below it; the test allows twice the
larger spread plus one float32 unit of the output's scale (an output float32 represents exactly has ``S = 0``). A
wrong equation (a mask step, a merge, a padding rule) moves outputs by orders of magnitude more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf_keras")

import rnnconvert  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.whole.verify import keras_whole_check as kw, numpy_source  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
FILES = sorted(p for d in ("keras_whole", "whole_graph", "whole_masks", "whole_conv", "whole_states",
                           "whole_attention", "whole_free_axis", "loose") for p in (FIX / d).glob("*.h5")
               if not p.name.startswith("refuse_")) + [FIX / "realworld" / "mycroft-precise-gru" / "hey-mycroft.net"]


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    """Fixtures read in this process (``RNNCONVERT_ISOLATE=0``), as the other whole-model modules."""
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _tol(s_np: float, s_tf: float, scale: float) -> float:
    return 2.0 * max(s_np, s_tf) + 2.0 ** -23 * max(1.0, scale)


def _stored_inputs(path: Path, names: list[str]) -> dict | None:
    npz = path.with_suffix(".npz")
    if not npz.exists():
        return None
    z = np.load(npz)
    if not all(f"in__{n}" in z for n in names):
        return None
    return {n: z[f"in__{n}"] for n in names}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_numpy_source_agrees_with_tf_keras(path):
    ckpt = rnnconvert.load(path)
    full = kw.whole_of(ckpt)
    g = keras_graph.build(full.config, full.weights, ckpt)
    assert not numpy_source.uncovered(g)  # every layer the writers build is evaluated
    tfm, names, xs = kw._source_and_inputs(str(path), full, None, 0)
    gen = kw.graph_inputs(g, full, None, 0, kw.keras_whole.STEPS, "any")  # the inputs the numpy path generates are the same
    assert list(gen) == names and all(np.array_equal(gen[n], xs[n]) and gen[n].dtype == xs[n].dtype for n in names)
    stored = _stored_inputs(path, names)
    for feed in [xs] + ([stored] if stored is not None else []):
        _agree(path, full, tfm, g, names, feed, stored is not None and feed is stored)


def _agree(path, full, tfm, g, names, xs, with_stored: bool) -> None:
    args = [xs[n] for n in names]
    layers = [n for n in kw.compared_layers(g) if n in {lay.name for lay in tfm.layers}]
    y2, probed = kw._source_run(full, tfm, args if len(args) > 1 else args[0], layers)
    twin = kw.source_float64(full, tfm)
    assert twin is not None
    keys = list(range(len(y2))) + [n for n in layers if n in probed and not isinstance(probed[n], (list, tuple))]
    t64 = kw._twin_outputs(full, twin, keys, args)
    o32, l32 = numpy_source.run(g, xs, np.float32)
    o32b, l32b = numpy_source.run(g, xs, np.float32, order=1)
    o64, l64 = numpy_source.run(g, xs, np.float64)
    assert len(o64) == len(y2)
    compared = 0
    for key in keys:
        tf32 = np.asarray(y2[key] if isinstance(key, int) else probed[key], np.float64)
        n32, n32b, n64 = (o32[key], o32b[key], o64[key]) if isinstance(key, int) else (l32[key], l32b[key], l64[key])
        assert n64.shape == tf32.shape, (key, n64.shape, tf32.shape)
        s_np = max(float(np.max(np.abs(n32 - n64), initial=0)), float(np.max(np.abs(n32b - n64), initial=0)))
        s_tf = float(np.max(np.abs(tf32 - t64[key]), initial=0))
        tol = _tol(s_np, s_tf, float(np.max(np.abs(n64), initial=0)))
        assert np.max(np.abs(tf32 - n64), initial=0) <= tol, (path.name, key)
        assert np.max(np.abs(n32 - t64[key]), initial=0) <= tol, (path.name, key)
        assert np.max(np.abs(n64 - t64[key]), initial=0) <= tol, (path.name, key)
        if with_stored and isinstance(key, int):  # the framework's outputs stored with the fixture
            z = np.load(path.with_suffix(".npz"))
            if f"out__{key}" in z:
                assert np.max(np.abs(z[f"out__{key}"] - n64), initial=0) <= tol, (path.name, "stored", key)
        compared += 1
    assert compared >= len(y2)


def test_uncovered_graph_names_the_layer():
    """A graph with a call the evaluator does not compute (here a class the writers might add later) is refused
    by name, before anything runs; the check then runs tf_keras (kw.numpy_graph gives None)."""
    path = FIX / "whole_conv" / "conv_crnn.h5"
    ckpt = rnnconvert.load(path)
    full = kw.whole_of(ckpt)
    g = keras_graph.build(full.config, full.weights, ckpt)
    assert not numpy_source.uncovered(g) and kw.numpy_graph(lambda: g, full) is g
    g.nodes[1].cls = "PReLU"
    assert f"'{g.nodes[1].path}' (PReLU)" in numpy_source.uncovered(g)
    assert kw.numpy_graph(lambda: g, full) is None
    with pytest.raises(numpy_source.Uncovered):
        numpy_source.run(g, kw.graph_inputs(g, full, None, 0, kw.keras_whole.STEPS, "any"), np.float64)


_CONVERT = """
import sys, rnnconvert
rep = rnnconvert.convert(sys.argv[1], sys.argv[2])
outs = [c for c in rep.verification.layers if c.name.startswith("model")]
print(rep.verification.ok, len(outs), sorted({c.source_route for c in outs}), "tensorflow" in sys.modules)
"""


@pytest.mark.parametrize("oracle", ["numpy", "framework"])
def test_whole_onnx_conversion_source_side(tmp_path, oracle):
    """A whole .h5 -> .onnx verified conversion of a covered model runs its source in numpy and imports no
    TensorFlow; RNNCONVERT_SOURCE_ORACLE=framework runs tf_keras as before; both verify ok."""
    import os
    import subprocess
    import sys

    pytest.importorskip("onnxruntime")
    env = {**os.environ, "RNNCONVERT_SOURCE_ORACLE": oracle}
    src = FIX / "keras_whole" / "whole_multi_io.h5"
    r = subprocess.run([sys.executable, "-c", _CONVERT, str(src), str(tmp_path / "m.onnx")], env=env,
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("True ")
    if oracle == "numpy":
        assert kw.NUMPY_ROUTE in line and line.endswith("False")
    else:
        assert "tf_keras (whole model)" in line and kw.NUMPY_ROUTE not in line


def test_a_bad_source_oracle_value_is_refused_by_name(monkeypatch):
    """RNNCONVERT_SOURCE_ORACLE takes numpy or framework; another value is one line naming it (exit 2)."""
    from rnnconvert.errors import SettingError
    from rnnconvert.process import settings

    monkeypatch.setenv("RNNCONVERT_SOURCE_ORACLE", "tf")
    with pytest.raises(SettingError, match="RNNCONVERT_SOURCE_ORACLE"):
        settings.check_all()
