"""The source side's own equations run their float32 and float64 passes in lockstep (one read and turn of each
stored tensor for both: ``Runtime.source_forward_multi`` of the source's equations runtime). The records of the Keras HDF5 and TF checkpoint
formats declare it (lost once in a refactor: verification then ran the two passes one after the other, 0.26 s of
CPU more on the 3 GB benchmark), and the lockstep run gives, bit for bit, what each single run gives. The
equations themselves are checked against Keras and TF in tests/test_keras_math.py and the fixture tests."""

from __future__ import annotations

import numpy as np
import pytest

import rnnconvert
from conftest import FIXTURES
from rnnconvert import runtimes
from rnnconvert.engine import registry

CASES = [("keras_h5", "keras/bidi_lstm_concat.h5"), ("keras_h5", "keras/cudnn_gru.h5"),
         ("keras_h5", "keras/stack_lstm_gru_rnn.h5"), ("keras_h5", "keras/lstm_hard_sigmoid.h5"),
         ("tf_checkpoint", "tf/keras_lstm_bigru/ckpt"), ("tf_checkpoint", "tf/lstm_cell/ckpt"),
         ("tf_checkpoint", "tf/multi_basic_lstm/ckpt")]


@pytest.mark.parametrize("fmt,name", CASES)
def test_lockstep_equals_single_runs(fmt, name):
    spec = runtimes.get(registry.get(fmt).load().equations)  # the source's own equations
    assert spec.source_forward_multi is not None
    ckpt = rnnconvert.load(FIXTURES / name)
    for layer in ckpt.layers:
        if layer.source.get("raw") is None:
            continue
        x = np.random.default_rng(0).normal(size=(3, 5, layer.input_size))
        xs = [x.astype(np.float32), x.astype(np.float64)]
        multi = spec.source_forward_multi(layer, xs)
        for got, xi in zip(multi, xs):
            assert got.dtype == xi.dtype
            assert np.array_equal(got, spec.source_forward(layer, xi, xi.dtype)), (name, layer.name, xi.dtype)


def _recorded_run(layer, seed: int, batch: int, steps: int):
    """``(x, recs)``: the Keras equations' lockstep float32/float64 run of ``layer`` on a random float32 batch
    ``(batch, steps, input_size)`` (``default_rng(seed)``), with one record dict per direction."""
    spec = runtimes.get(registry.get("keras_h5").load().equations)
    x = np.random.default_rng(seed).normal(size=(batch, steps, layer.input_size)).astype(np.float32)
    recs = [{} for _ in layer.params[0]]
    spec.source_forward_multi(layer, [x, x.astype(np.float64)], None, recs)
    return x, recs


@pytest.mark.parametrize("name", ["keras/bidi_lstm_concat.h5", "keras/lstm_go_backwards.h5", "keras/cudnn_gru.h5",
                                  "keras/bidi_gru_sum.h5", "keras/simple_rnn_tanh.h5"])
def test_recorded_states_are_the_trajectory(name):
    """The states the Keras equations record (verification's trajectory for a one-slab Keras layer) are the states
    before each step in input time order, per direction, as the canonical reference records them: the two runs
    compute the same function in float32 in different orders, so they agree to float32 rounding (far below the
    0.5 that any misplaced step or direction moves a state by on these fixtures)."""
    from rnnconvert.core import reference

    ckpt = rnnconvert.load(FIXTURES / name)
    for layer in ckpt.layers:
        x, recs = _recorded_run(layer, seed=1, batch=2, steps=6)
        _, ref = reference.trajectory(layer, layer.params[0], x)
        for got, want in zip(recs, ref):
            assert got["h"].shape == want["h"].shape and got["h"].dtype == np.float32
            assert np.abs(got["h"] - want["h"]).max() < 1e-4, (name, layer.name)
            if want["c"] is not None:
                assert np.abs(got["c"] - want["c"]).max() < 1e-4
                assert np.abs(got["c_last"] - want["c_last"]).max() < 1e-4
            assert np.abs(got["h"][:, 1:]).max() > 0.05  # not trivially zero


@pytest.mark.parametrize("name,own_states", [("keras/bidi_lstm_concat.h5", True), ("tf/keras_lstm_bigru/ckpt", True),
                                             ("tf/lstm_cell/ckpt", False), ("keras/lstm.h5", True)])
def test_which_run_gives_the_trajectory(name, own_states, monkeypatch, tmp_path):
    """A one-slab Keras HDF5 or TF2 layer takes its trajectory from its own equations' float32 run (the numpy
    reference's trajectory is not run); a TF1 cell (no recording) falls back to the reference's. Both verify."""
    from rnnconvert.core import reference

    calls = []
    real = reference.trajectory
    monkeypatch.setattr(reference, "trajectory", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = rnnconvert.convert(FIXTURES / name, tmp_path / "x.npz")
    assert rep.verification is not None and rep.verification.ok
    assert (not calls) == own_states, (name, len(calls))


@pytest.mark.parametrize("name", ["keras/bidi_lstm_concat.h5", "keras/gru_reset_before.h5", "keras/gru_reset_after.h5",
                                  "keras/bidi_gru_sum.h5", "keras/simple_rnn_tanh.h5", "keras/lstm_go_backwards.h5",
                                  "keras/cudnn_gru.h5"])
def test_recorded_input_products(name):
    """The one-step check's ``W_ih x`` taken from the Keras equations' own pass over the stored kernel (``'xk'``,
    issue #33): its value is ``W_ih x`` in canonical gate order (the canonical ``W_ih`` of the reader, whose layout
    the Keras-oracle fixture tests settle) to float64 rounding, and its magnitude bounds ``|W_ih||x|`` from above
    by at most float32's ``gamma_K``. Bounds of rounding, not tolerances: ``|fl64(a.b) - a.b| <= gamma_K(2**-53)
    |a|.|b|`` (Higham eq. 3.5) for each float64 product compared here. CuDNN kernels record none (their per-gate
    matrices take another path), and the check then makes its own pass."""
    def _gamma(n, u):  # Higham's gamma_n
        return n * u / (1.0 - n * u)

    ckpt = rnnconvert.load(FIXTURES / name)
    for layer in ckpt.layers:
        x, recs = _recorded_run(layer, seed=2, batch=3, steps=4)
        for rec, p in zip(recs, layer.params[0]):
            if "cudnn" in name:
                assert "xk" not in rec
                continue
            val, mag = rec["xk"]
            w = p.w_ih.astype(np.float64)
            xv = x.reshape(-1, layer.input_size).astype(np.float64)
            K = w.shape[1]
            g64 = _gamma(K, 2.0 ** -53)
            exact_mag = np.abs(xv) @ np.abs(w).T  # within g64 of the exact |x||W|
            assert np.all(np.abs(val - xv @ w.T) <= 2.2 * g64 * exact_mag + 1e-300), (name, layer.name)
            assert np.all(mag >= exact_mag * (1 + g64)), (name, layer.name)
            assert np.all(mag <= exact_mag * (1 + g64) * (1 + 2.2 * _gamma(K, 2.0 ** -24)) + K * 2.0 ** -140)


def test_one_step_reads_no_turned_w_ih(monkeypatch):
    """With the recorded products, the one-step check of a Keras layer passes the three probes through ``W_ih``
    (zero and one-hot rows: no product) and the states constructed from the weights, never the ``B*T`` states."""
    from rnnconvert.verify import bounds, engine

    seen = []
    real = bounds.lin

    def spy(w, v, rows=None):
        seen.append((w.shape, np.asarray(v).shape))
        return real(w, v, rows)
    monkeypatch.setattr(bounds, "lin", spy)
    ckpt = rnnconvert.load(FIXTURES / "keras/gru_reset_before.h5")
    fmt = registry.get("keras_h5").load()
    check = engine.StreamedVerification(ckpt, fmt, batch=3, steps=5)
    layer = ckpt.layers[0]
    check.source_slab(0, 0, layer.params[0])
    w_ih_rows = [v for s, v in seen if s == layer.params[0][0].w_ih.shape]
    # the three probes, and the states constructed from the weights (verify/states.py: new inputs), never the
    # B*T = 15 trajectory states, whose products were recorded
    assert w_ih_rows and w_ih_rows[0][0] == 3 and all(v[0] != 3 * 5 for v in w_ih_rows), seen
