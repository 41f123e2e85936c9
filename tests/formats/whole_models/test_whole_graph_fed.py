"""The per-layer check of a whole Keras model's recurrent layers runs on the inputs the model's graph feeds each
layer too (issue #39: "the per-layer rule applied to each layer on the inputs the graph feeds it"), besides the
engine's own batch (rnnconvert/whole/pipeline.py ``graph_fed``, rnnconvert/verify/sample.py ``fed_rows``), at their
full length and with Keras' mask applied as Keras applies it (test_whole_graph_fed_exact.py: the layer's outputs).

Oracle: tf_keras, the source framework, running the framework-made fixtures (fixtures/gen_keras_whole.py): a
sub-model from the model's inputs to the recurrent layer's input, on the whole-model check's generated model
inputs (the engine's graph-fed rows must be that input, every step of it; a masked row, its unmasked steps in
order, at their own length). Where the input is a float32 computation (a Conv1D), the two sides may round differently: the test
allows the rigorous float32 bound of that computation, ``2 * gamma_(n+1) * (|b| + n * max|x| * max|w|)`` with
``gamma_m = m u / (1 - m u)``, ``u = 2**-24`` (any summation order, any CPU), never a measured or fixed constant.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf_keras")
pytest.importorskip("onnxruntime")

import rnnconvert  # noqa: E402
from rnnconvert.verify import sample  # noqa: E402
from rnnconvert.whole.verify import keras_whole_check as kw  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras_whole"


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    """Fixtures read in this process (``RNNCONVERT_ISOLATE=0``), as the other whole-model modules."""
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _converted(path: Path, tmp_path: Path, monkeypatch) -> tuple[object, dict]:
    """``path`` converted to a whole-model ONNX file, verified; returns the report and, per layer, its own batch and
    the graph-fed rows as the per-layer engine received them (:func:`rnnconvert.verify.sample.batches` and
    :func:`rnnconvert.verify.sample.fed_rows`, recorded)."""
    seen: dict = {}
    real, real_fed = sample.batches, sample.fed_rows

    def recording(ckpt, batch, steps, seed, inputs):
        out = real(ckpt, batch, steps, seed, inputs)
        seen.update({layer.name: (x, batch, steps) for layer, x in zip(ckpt.layers, out)})
        return out

    def recording_fed(ckpt, added):
        out = real_fed(ckpt, added)
        seen.update({f"{layer.name} fed": rows for layer, rows in zip(ckpt.layers, out)})
        return out

    monkeypatch.setattr(sample, "batches", recording)
    monkeypatch.setattr(sample, "fed_rows", recording_fed)
    rep = rnnconvert.convert(path, tmp_path / "out.onnx")
    return rep, seen


def _tf_layer_input(path: Path, layer: str) -> tuple[np.ndarray, dict, object]:
    """tf_keras' input of ``layer`` on the whole-model check's generated model inputs (seed 0), the inputs, and
    the tf_keras model."""
    import tf_keras

    ckpt = rnnconvert.load(path)
    full = kw.whole_of(ckpt)
    tfm, names, xs = kw._source_and_inputs(str(path), full, None, 0)
    sub = tf_keras.Model(tfm.inputs, tfm.get_layer(layer).input)
    args = [xs[n] for n in names]
    return np.asarray(sub(args if len(args) > 1 else args[0], training=False)), xs, tfm


def test_embedding_conv_feed_the_bilstm(tmp_path, monkeypatch):
    path = FIX / "whole_embed_conv_bilstm.h5"
    rep, seen = _converted(path, tmp_path, monkeypatch)
    assert rep.verification.verdict == "ok"  # a correct conversion stays ok
    x, batch, steps = seen["bilstm"]
    want, xs, tfm = _tf_layer_input(path, "bilstm")  # Embedding -> Conv1D(relu) -> Dropout (inference)
    assert x.shape == (batch, steps, want.shape[-1])  # the engine's own batch, as without a whole model
    (fed,) = seen["bilstm fed"]  # no mask: one group of every row, every step (9, the engine's own batch has 8)
    got = fed.x
    assert fed.rows == tuple(range(want.shape[0])) and got.shape == want.shape and want.shape[1] > steps
    table = np.abs(tfm.get_layer("emb").get_weights()[0]).max()
    kernel, bias = tfm.get_layer("conv").get_weights()
    n = kernel.shape[0] * kernel.shape[1]  # products per output (taps x input channels), plus the bias
    u = 2.0 ** -24
    gamma = (n + 1) * u / (1 - (n + 1) * u)
    tol = 2 * gamma * (np.abs(bias).max() + n * float(table) * float(np.abs(kernel).max()))
    assert float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) <= tol
    assert any(n.startswith("bilstm: checked per layer on its own batch plus the 3 rows") and "all 9 steps" in n
               for n in rep.notes)


def test_masked_rows_give_their_unmasked_steps(tmp_path, monkeypatch):
    path = FIX / "whole_masked_stack.h5"
    rep, seen = _converted(path, tmp_path, monkeypatch)
    assert rep.verification.verdict == "ok"
    want, xs, tfm = _tf_layer_input(path, "gru_a")  # the Masking layer's output: the input, exactly
    mask_value = tfm.get_layer("mask").get_config()["mask_value"]
    keep = np.any(xs["feats"] != mask_value, axis=-1)  # Keras Masking: a step is masked where every feature is it
    assert not keep.all()  # the generated inputs are padded
    rows = {b: r.x[j] for r in seen["gru_a fed"] for j, b in enumerate(r.rows)}
    assert sorted(rows) == list(range(want.shape[0]))
    for i, k in enumerate(keep):
        assert np.array_equal(rows[i], want[i][k])  # the unmasked steps in order, all of them, nothing added
    assert any(n.startswith("gru_a: checked per layer") and "masked steps" in n for n in rep.notes)


def test_verify_checks_the_same_rows(tmp_path, monkeypatch):
    """``verify SRC DST`` of the whole-model file runs the per-layer check on the same graph-fed rows as the
    conversion, and its report's notes say so."""
    path = FIX / "whole_embed_conv_bilstm.h5"
    _, seen = _converted(path, tmp_path, monkeypatch)
    at_convert = dict(seen)
    seen.clear()
    rep = rnnconvert.verify(path, tmp_path / "out.onnx")
    assert rep.verdict == "ok"
    assert set(seen) == set(at_convert) and any(k.endswith(" fed") and seen[k] for k in seen)
    for k, v in seen.items():
        if k.endswith(" fed"):
            assert [(r.rows, r.call) for r in v] == [(r.rows, r.call) for r in at_convert[k]]
            assert all(np.array_equal(a.x, b.x) for a, b in zip(v, at_convert[k]))
        else:
            assert np.array_equal(v[0], at_convert[k][0])
    assert any(n.startswith("gru: checked per layer on its own batch plus the 3 rows") for n in rep.notes)
