"""The rows the model's graph feeds a recurrent layer are checked as the graph computes them (issue #39): each row's
unmasked steps at their full length, nothing cut and nothing completed, so that a masked row's states, and a
backward direction's start, are Keras' own (rnnconvert/whole/pipeline.py ``graph_fed``).

Oracle: tf_keras. The model's own recurrent layer, cloned in float64 (its config with every dtype float64, its
weights set), runs (1) on the layer's input in the graph with the mask tf_keras itself gives that input (``_keras_mask``
of the sub-model's output: Embedding ``mask_zero``, Masking), as the graph runs it, and (2) unmasked on the rows the
per-layer engine received. At every unmasked step the two must agree: in float64 they differ by float64 rounding
only (the same numbers in, the same layer), far below ``1e-9`` of the output's scale on any CPU; the rows the engine
got before (cut to 8 steps, zero steps added) miss by a sizeable part of the scale, which the test shows too.
Fixtures: fixtures/gen_whole_masks.py (Bidirectional layers of each merge mode, ``go_backwards`` layers, padding
at the end, the front and inside) and fixtures/gen_keras_whole.py (an unmasked Bidirectional LSTM on 9 steps).
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

FIX = Path(__file__).resolve().parents[3] / "fixtures"
CASES = [("whole_masks/masks_bidir.h5", ["bilstm", "bigru", "birnn", "bilstm_last"]),
         ("whole_masks/masks_masking_backwards.h5", ["srnn", "lstm_back", "gru_back", "srnn_back"]),
         ("keras_whole/whole_embed_conv_bilstm.h5", ["bilstm"])]
#: float64 rounding of a few steps of a small layer is ~1e-15 of its scale; a misplaced step moves it by ~1e-1
EXACT = 1e-9


@pytest.fixture(autouse=True)
def _read_in_process(monkeypatch):
    monkeypatch.setenv("RNNCONVERT_ISOLATE", "0")


def _f64(conf):
    """A layer config with every ``dtype`` float64 (nested layers too)."""
    if isinstance(conf, dict):
        return {k: ("float64" if k == "dtype" and v == "float32" else _f64(v)) for k, v in conf.items()}
    if isinstance(conf, list):
        return [_f64(v) for v in conf]
    return conf


def _float64_layer(layer, x64):
    """tf_keras' ``layer`` cloned in float64, built on ``x64``, the layer's weights set (cast exactly)."""
    import tf_keras

    clone = tf_keras.layers.deserialize({"class_name": type(layer).__name__, "config": _f64(layer.get_config())})
    clone(x64[:1, :1])
    clone.set_weights([np.asarray(w, np.float64) for w in layer.get_weights()])
    return clone


def _graph_side(path: Path, layers: list[str]) -> dict:
    """Per layer and call ``(name, k)``: its input in the graph as tf_keras computes it on the whole-model check's
    generated inputs (seed 0), the mask tf_keras attaches to it (None: unmasked), and the tf_keras layer; and (key
    ``None``) the numpy evaluator's input and mask of each call of each layer (what the rows are made of)."""
    import tf_keras

    ckpt = rnnconvert.load(path)
    full = kw.whole_of(ckpt)
    tfm, names, xs = kw._source_and_inputs(str(path), full, None, 0)
    args = [xs[n] for n in names]
    out = {}
    out[None] = kw.graph_fed(full.renamed(ckpt.materialize()), full, None, 0)
    for name in layers:
        for k in range(len(out[None][name])):
            sub = tf_keras.Model(tfm.inputs, tfm.get_layer(name).get_input_at(k))
            y = sub(args if len(args) > 1 else args[0], training=False)
            mask = getattr(y, "_keras_mask", None)
            out[name, k] = (np.asarray(y), None if mask is None else np.asarray(mask, bool), tfm.get_layer(name))
    return out


def _engine_rows(path: Path, tmp_path: Path, monkeypatch):
    """``path`` converted to a whole-model ONNX file; the report and the graph-fed rows each layer's per-layer check
    received (:func:`rnnconvert.verify.sample.fed_rows`, recorded)."""
    seen: dict = {}
    real = sample.fed_rows

    def recording(ckpt, added):
        out = real(ckpt, added)
        seen.update({layer.name: rows for layer, rows in zip(ckpt.layers, out)})
        return out

    monkeypatch.setattr(sample, "fed_rows", recording)
    return rnnconvert.convert(path, tmp_path / "out.onnx"), seen


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """A Bidirectional LSTM called twice (a shared layer), on two inputs each behind its own Masking(0.0): made by
    tf_keras, gate-distinct random weights (each gate block in its own range)."""
    keras = pytest.importorskip("tf_keras")
    L = keras.layers
    keras.backend.clear_session()
    a, b = keras.Input((None, 3), name="a"), keras.Input((None, 3), name="b")
    bilstm = L.Bidirectional(L.LSTM(3, return_sequences=True), name="bilstm")
    model = keras.Model([a, b], [bilstm(L.Masking(0.0, name="mask_a")(a)), bilstm(L.Masking(0.0, name="mask_b")(b))])
    rng = np.random.default_rng(18)

    def distinct(w):  # each gate block (i, f, c, o: a quarter of the last axis) in its own range, random signs
        q = w.shape[-1] // 4
        blocks = [rng.uniform(0.1 + 0.15 * g, 0.3 + 0.15 * g, (*w.shape[:-1], q)) for g in range(4)]
        return (np.concatenate(blocks, axis=-1) * rng.choice([-1.0, 1.0], w.shape)).astype(np.float32)

    bilstm.set_weights([distinct(w) for w in bilstm.get_weights()])
    path = tmp_path_factory.mktemp("shared") / "shared_bilstm.h5"
    model.save(path, save_format="h5")
    return path


def test_every_call_of_a_shared_layer(shared, tmp_path, monkeypatch):
    """A layer called twice: the rows of each call are checked (two notes), each as the graph computes it."""
    _check_rows(shared, ["bilstm"], tmp_path, monkeypatch, calls=2)


@pytest.mark.parametrize("rel,layers", CASES, ids=[c[0].split("/")[1][:-3] for c in CASES])
def test_rows_give_the_layer_output_of_the_graph(rel, layers, tmp_path, monkeypatch):
    _check_rows(FIX / rel, layers, tmp_path, monkeypatch)


def _check_rows(path: Path, layers: list[str], tmp_path: Path, monkeypatch, calls: int = 1) -> None:
    rep, seen = _engine_rows(path, tmp_path, monkeypatch)
    assert rep.verification.verdict == "ok"
    side = _graph_side(path, layers)
    for name in layers:
        assert len(side[None][name]) == calls
        assert sum(n.startswith(f"{name}: checked per layer") for n in rep.notes) == calls
        for k in range(calls):
            _check_call(name, k, side, [r for r in seen[name] if r.call == k])


def _check_call(name: str, k: int, side: dict, rows: list) -> None:
    """Call ``k`` of layer ``name``: its graph-fed rows ``rows`` run unmasked by tf_keras' layer give the layer's
    output in the graph at every unmasked step."""
    _, mask, layer = side[name, k]
    x, our_mask = side[None][name][k]  # the numpy evaluator's input of the layer: the rows' source
    keep = np.ones(x.shape[:2], bool) if mask is None else mask
    assert our_mask is None if mask is None else np.array_equal(our_mask, mask)
    x64 = np.asarray(x, np.float64)
    clone = _float64_layer(layer, x64)
    graph = np.asarray(clone(x64, mask=None if mask is None else keep))  # as the graph runs it
    seqs = graph.ndim == 3
    backwards = getattr(layer, "go_backwards", False)  # outputs in processing order (reversed time)
    assert sorted(b for r in rows for b in r.rows) == [b for b in range(len(x)) if keep[b].any()]
    worst = scale = wrong = 0.0
    for r in rows:
        ours = np.asarray(clone(np.asarray(r.x, np.float64)))  # unmasked, as the per-layer check runs them
        for j, b in enumerate(r.rows):
            assert r.x.shape[1] == keep[b].sum()  # every unmasked step, at the row's full length
            at = (keep[b][::-1] if backwards else keep[b]) if seqs else slice(None)
            want = graph[b][at]
            worst = max(worst, float(np.abs(ours[j] - want).max()))
            scale = max(scale, float(np.abs(want).max()))
        # the rows as the engine got them before: cut to 8 steps, completed with zero steps to 8
        cut = np.zeros((len(r.rows), 8, x.shape[-1]))
        cut[:, :min(8, r.x.shape[1])] = r.x[:, :8]
        before = np.asarray(clone(cut))
        for j, b in enumerate(r.rows):
            if seqs:
                n = min(8, r.x.shape[1])
                at = keep[b][::-1] if backwards else keep[b]
                wrong = max(wrong, float(np.abs(before[j][:n] - graph[b][at][:n]).max()))
            else:
                wrong = max(wrong, float(np.abs(before[j] - graph[b]).max()))
    assert worst <= EXACT * max(1.0, scale), (name, worst, scale)
    # the cut or completed rows missed what the graph computes where a step after them counts: a backward
    # direction (it starts at the row's end), a last output (a forward sequence agrees on the steps it has)
    if any(r.x.shape[1] != 8 for r in rows) and (backwards or not seqs or hasattr(layer, "backward_layer")):
        assert wrong > 1e3 * EXACT * max(1.0, scale), (name, wrong)


def test_states_and_notes_count_every_unmasked_step(tmp_path, monkeypatch):
    """The one-step states of a masked layer: the engine's batch (3 x 8), every unmasked step of the graph-fed rows
    (Keras' mask from tf_keras), the 3 probes and the constructed ones; the note says how the mask was applied."""
    path = FIX / "whole_masks/masks_bidir.h5"
    rep, seen = _engine_rows(path, tmp_path, monkeypatch)
    _, mask, _ = _graph_side(path, ["bilstm"])["bilstm", 0]
    c = next(c for c in rep.verification.layers if c.name == "bilstm")
    assert c.states == 24 + int(mask.sum()) + 3 + c.constructed
    note = next(n for n in rep.notes if n.startswith("bilstm: checked per layer"))
    assert f"its {int((~mask).sum())} masked steps" in note and "as Keras runs them" in note


def test_long_rows_join_the_one_step_comparison_in_part(tmp_path, monkeypatch):
    """Above :data:`rnnconvert.verify.sample.FED_STATES` states (long given model inputs), that many of the graph-fed
    rows' states, spread evenly, join the one-step comparison; the sequences still run every step of every row, and
    a note says so."""
    monkeypatch.setattr(sample, "FED_STATES", 10)
    path = FIX / "whole_masks/masks_bidir.h5"
    rep, seen = _engine_rows(path, tmp_path, monkeypatch)
    assert rep.verification.verdict == "ok"
    c = next(c for c in rep.verification.layers if c.name == "bilstm")
    total = sum(r.x.shape[0] * r.x.shape[1] for r in seen["bilstm"])
    assert total > 10 and c.states == 24 + 10 + 3 + c.constructed
    assert any(n.startswith(f"bilstm: 10 of the {total} states") for n in rep.verification.notes)
