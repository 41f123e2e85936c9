"""Issue #28, whole-model migration (``.h5`` -> ``.keras``) of real-shaped Keras 2 models.

Oracles: tf_keras 2.21 (the fixtures' outputs, fixtures/gen_keras_whole.py; and tf_keras loading the source
file as stored where it can), Keras 3.15 running the written ``.keras`` (``keras.saving.load_model``)."""

from __future__ import annotations

import json
import re
import shutil

import h5py
import numpy as np
import pytest

import rnnconvert
from conftest import FIXTURES
from rnnconvert.cli import main
from rnnconvert.errors import UnsupportedError

TOL = 2e-5
WHOLE = FIXTURES / "keras_whole"


def _close(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max()), what


def _converted(tmp_path, stem):
    dst = tmp_path / f"{stem}.keras"
    rep = rnnconvert.convert(WHOLE / f"{stem}.h5", dst)  # default verification
    assert rep.verification.verdict == "ok"
    assert any(c.name == "model output 0" for c in rep.verification.layers)
    return dst, rep


def test_keras_2_0_2_dropout_lstm_migrates(tmp_path, k3):
    """The Keras 2.0.2 Sequential of issue #28 (Embedding dtype int32 + input_length, LSTM dropout 0.2 /
    recurrent_dropout 0.2 / implementation 0 / hard_sigmoid, Dense): it migrates, verdict ok, and Keras 3
    running the written file gives tf_keras' outputs; the int32 is the input's, the embeddings stay float32."""
    with h5py.File(WHOLE / "whole_keras202_dropout_lstm.h5") as f:  # the fixture is in the 2.0.2 form
        cfg = json.loads(f.attrs["model_config"])
        assert f.attrs["keras_version"] in (b"2.0.2", "2.0.2") and isinstance(cfg["config"], list)
        emb, lstm = cfg["config"][0]["config"], cfg["config"][1]["config"]
        assert (emb["dtype"], emb["input_length"], lstm["implementation"]) == ("int32", 8, 0)
        assert (lstm["dropout"], lstm["recurrent_dropout"], lstm["recurrent_activation"]) == (0.2, 0.2, "hard_sigmoid")
    dst, rep = _converted(tmp_path, "whole_keras202_dropout_lstm")
    assert any("integer 'dtype'" in n and "emb" in n for n in rep.notes)
    m = k3.saving.load_model(dst, compile=False)
    assert m.inputs[0].dtype == "int32" and m.get_layer("emb").embeddings.dtype == "float32"
    assert m.get_layer("lstm").dropout == 0.2 and m.get_layer("lstm").recurrent_dropout == 0.2
    ora = np.load(WHOLE / "whole_keras202_dropout_lstm.npz")
    _close(k3.ops.convert_to_numpy(m(ora["in__tokens"], training=False)), ora["out__0"], "model output")


def test_masked_gru_activity_regularization_migrates(tmp_path, k2, k3):
    """Stacked masked reset-before GRUs (hard_sigmoid) with an ActivityRegularization layer between them:
    written whole with Keras 3's ActivityRegularization, verdict ok; Keras 3 running the written file equals
    tf_keras running the source file as stored, on the fixture's inputs and on fresh ones with masked steps."""
    dst, _ = _converted(tmp_path, "whole_masked_gru_actreg")
    m3 = k3.saving.load_model(dst, compile=False)
    lay = m3.get_layer("act_reg")
    assert type(lay).__name__ == "ActivityRegularization" and (lay.l1, lay.l2) == pytest.approx((1e-4, 1e-3))
    assert [m3.get_layer(n).get_config()["reset_after"] for n in ("gru_a", "gru_b")] == [False, False]
    m2 = k2.models.load_model(WHOLE / "whole_masked_gru_actreg.h5", compile=False)
    ora = np.load(WHOLE / "whole_masked_gru_actreg.npz")
    rng = np.random.default_rng(28)
    fresh = rng.standard_normal((4, 7, 5)).astype(np.float32)
    fresh[0, -4:] = 0.0  # masked steps (Masking(0.0))
    fresh[2, 3:5] = 0.0
    for x, what in ((ora["in__feats"], "fixture inputs"), (fresh, "fresh inputs")):
        want = m2(x, training=False).numpy()
        _close(k3.ops.convert_to_numpy(m3(x, training=False)), want, what)
    _close(m2(ora["in__feats"], training=False).numpy(), ora["out__0"], "tf_keras against its stored outputs")


def _numbers(line: str) -> tuple[float, float]:
    m = re.search(r": max abs error (\S+) \(tolerance (\S+?)[;)]", line)
    assert m, line
    return float(m.group(1)), float(m.group(2))


def test_text_report_prints_the_measured_numbers(tmp_path, capsys):
    """The human report of a whole-model check prints the numbers --json gives for the same run (issue #28:
    it printed the sequence fields, never measured there: 0.00e+00 within 0.0e+00)."""
    src = WHOLE / "whole_masked_gru_actreg.h5"
    assert main(["convert", str(src), str(tmp_path / "a.keras"), "--json", "-q"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert main(["convert", str(src), str(tmp_path / "b.keras"), "-q"]) == 0
    text = capsys.readouterr().out
    checks = {c["name"]: c for c in rep["verification"]["layers"]}
    whole = [n for n in checks if n.startswith("model")]
    assert "model output 0" in whole and len(whole) >= 4
    for name in whole:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"verified {name}:"))
        assert "sequence:" not in line and "(tolerance 0.0e+00)" not in line, line
        err, tol = _numbers(line)
        c = checks[name]
        assert err == float(f"{c['max_abs_err']:.2e}") and tol == float(f"{c['tolerance']:.1e}"), (line, c)
        assert tol > 0
    assert any(checks[n]["max_abs_err"] > 0 for n in whole)  # a real measurement, not a zero field
    for name in (n for n in checks if not n.startswith("model")):  # the engine's layers: as before
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"verified {name}:"))
        assert f"sequence: max abs error {checks[name]['seq_err']:.2e}" in line


def _edited(tmp_path, edit) -> str:
    dst = tmp_path / "edited.h5"
    shutil.copyfile(WHOLE / "whole_multi_io.h5", dst)
    with h5py.File(dst, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        for r in cfg["config"]["layers"]:
            edit(r)
        f.attrs["model_config"] = json.dumps(cfg)
    return str(dst)


def _int_embedding(r):  # a tf.keras-style Embedding of dtype int32 (no batch_input_shape): int weights in Keras 3
    if r["config"]["name"] == "emb":
        r["config"]["dtype"] = "int32"
        r["config"].pop("batch_input_shape", None)


def test_error_inside_keras3_build_is_a_refusal_naming_the_layer(tmp_path, capsys):
    """An exception raised inside Keras 3 / TensorFlow while building the translated model (here
    InvalidArgumentError 'Need minval < maxval' of an int32 Embedding) is a one-line refusal naming the layer,
    its class and --recurrent-only, never an internal error; nothing is written (asked for whole: --whole; by default
    the recurrent layers are written alone, issue #41); --recurrent-only then works."""
    src = _edited(tmp_path, _int_embedding)
    dst = tmp_path / "out.keras"
    with pytest.raises(UnsupportedError, match=r"layer 'emb' \(Embedding\).*Keras 3 building.*minval.*recurrent_only"):
        rnnconvert.convert(src, dst, whole=True)
    assert not dst.exists()
    assert main(["convert", src, str(dst), "-q", "--whole"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err and "--recurrent-only" in err and "'emb'" in err
    assert main(["convert", src, str(dst), "-q", "--recurrent-only"]) == 0


def test_keras_2_0_input_dtype_in_a_functional_model(tmp_path, k3):
    """An integer dtype beside a batch_input_shape (Keras 2.0/2.1: the input's dtype) in a Functional model:
    dropped from the layer on both sides (Keras 3 and the tf_keras reference); the migration verifies ok."""
    def int_input_dtype(r):
        if r["config"]["name"] == "emb":
            r["config"]["dtype"] = "int32"
            r["config"]["batch_input_shape"] = [None, None]

    src = _edited(tmp_path, int_input_dtype)
    rep = rnnconvert.convert(src, tmp_path / "out.keras")
    assert rep.verification.verdict == "ok"
    assert k3.saving.load_model(tmp_path / "out.keras", compile=False).get_layer("emb").embeddings.dtype == "float32"
