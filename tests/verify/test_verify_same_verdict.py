"""Issue #39: the same verdict on every machine.

A verdict must not change with the CPU, the BLAS kernels or the thread count. Each case here is a correct
conversion (written by rnnconvert, run by onnxruntime or torch) of a loose fixture (fixtures/loose: tf_keras and
TensorFlow made them) or of a real model (fixtures/realworld), verified as it is and again under perturbed float32
evaluation: numpy's BLAS and torch with more threads, and every number the target returns (one steps and
sequences) moved by one float32 ulp in a random direction (``np.nextafter``), as another CPU's rounding would.
Every layer's verdict must be identical, whatever it is (the chaotic TF1 stack is ``ok`` since the measured
sequence tolerance: every sequence-level slip moves its output by more than twice that tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.verify.target_run import TargetRun

from conftest import FIXTURES, REALWORLD

LOOSE = FIXTURES / "loose"
CASES = [
    (LOOSE / "keras_bidi_gru_before.h5", "onnx"),
    (LOOSE / "keras_simple_rnn_stack.h5", "onnx"),
    (LOOSE / "tf1_gru_stack.pb", "onnx"),
    (LOOSE / "tf1_gru_chaotic" / "ckpt", "onnx"),
    (REALWORLD / "mycroft-precise-gru" / "hey-mycroft.net", "onnx"),
    (REALWORLD / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5", "pt"),
]


def _ulp(v, rng):
    if v is None:
        return None
    v = np.asarray(v, np.float32)
    return np.nextafter(v, np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf).astype(np.float32))


def _perturb_outputs(monkeypatch):
    """Every number the target returns moved by one float32 ulp, up or down at random."""
    rng = np.random.default_rng(39)
    step, seq = TargetRun._target_step, TargetRun._sequence_target

    def target_step(self, *a, **k):
        got, note = step(self, *a, **k)
        return (None if got is None else [tuple(_ulp(v, rng) for v in g) for g in got]), note

    def sequence_target(self, *a, **k):
        runs, note = seq(self, *a, **k)
        return [(_ulp(y, rng), y32, ref) for y, y32, ref in runs], note
    monkeypatch.setattr(TargetRun, "_target_step", target_step)
    monkeypatch.setattr(TargetRun, "_sequence_target", sequence_target)


def _verdicts(src, dst):
    return [(c.name, c.verdict) for c in api.verify(src, dst).layers]


@pytest.mark.slow
@pytest.mark.parametrize("src,to", CASES,
                         ids=[f"{s.parent.name if s.stem == 'ckpt' else s.stem}-{t}" for s, t in CASES])
def test_verdicts_do_not_change_under_perturbed_float32(src, to, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime" if to == "onnx" else "torch")
    if not (src.exists() or src.with_suffix(".index").exists()):
        pytest.skip(f"{src} is not in this checkout")
    dst = tmp_path / f"out.{to}"
    api.convert(src, dst, write_opts={"recurrent_only": True} if src.suffix == ".h5" else None,
                accept_inconclusive=True)
    base = _verdicts(src, dst)
    monkeypatch.setenv("RNNCONVERT_BLAS_THREADS", "2")  # numpy's BLAS in verification (speed.threads.one_blas_thread)
    if to == "pt":
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1 if threads > 1 else 2)
        try:
            assert _verdicts(src, dst) == base
        finally:
            torch.set_num_threads(threads)
    else:
        assert _verdicts(src, dst) == base
    _perturb_outputs(monkeypatch)
    assert _verdicts(src, dst) == base
