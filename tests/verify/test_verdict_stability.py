"""Issue #39: the same per-layer verdict on every machine, whatever the float32 evaluation.

A verdict must not change with the CPU, the BLAS kernels, the summation order or the thread count: a tolerance that
another correct rounding can break is a bug in the rule (docs/cli.md "Verdicts"). Each case is a correct conversion
(written by rnnconvert with ``verify=None``; the written files are run by their own frameworks: onnxruntime, torch)
of every fixture in fixtures/loose/ (tf_keras and TensorFlow made them: fixtures/gen_loose.py) and of real-shaped
models (stacked, bidirectional, hard_sigmoid, reset-before GRU: fixtures/keras, made by tf_keras; the Mycroft GRU of
fixtures/realworld). Each is verified once as it is, then under perturbed float32 evaluation:

* threads: numpy's BLAS in verification on 2 threads (``RNNCONVERT_BLAS_THREADS``, read by
  ``rnnconvert.speed.threads.one_blas_thread``) and torch on another thread count;
* order: the target's sequences and one steps replaced by a float32 run of the source's equations whose every
  product is summed in blocks added last block first (``rnnconvert.verify.orders``' blocked order): a correct target
  that sums in another order;
* ulp: every number the target returns moved by one float32 ulp up or down at random (``np.nextafter``);
* other: the target's one steps a float32 run whose products are summed in 7 column blocks added first
  block first and whose every activation is 4 ulps off in a random direction: an evaluation order that is NOT one
  of those the one-step comparison's measured tolerance is measured over (``orders.ORDERS``), with activations less
  accurate than the measured ones (a framework's vectorised ``exp``/``tanh``), so that the measured tolerance is
  tested against a rounding it did not see.

Every layer's verdict must be identical to the unperturbed one (whatever it is: the chaotic TF1 stack is
``inconclusive`` by design). The source side is computed once per case for the last two (the target side is what
they perturb); the thread case runs both sides afresh. Cost: about 2.5 verifications per case.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import rnnconvert
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.engine import registry
from rnnconvert.verify import engine, orders
from rnnconvert.verify.target_run import TargetRun

from conftest import FIXTURES, REALWORLD

LOOSE, KERAS = FIXTURES / "loose", FIXTURES / "keras"
#: (source, target format): every loose fixture into a target its framework runs, and real-shaped models
CASES = [
    (LOOSE / "keras_bidi_gru_before.h5", "onnx"),  # stacked Bidirectional reset-before hard_sigmoid GRU, loose bound
    (LOOSE / "keras_simple_rnn_stack.h5", "onnx"),  # SimpleRNN relu / linear / tanh stack
    (LOOSE / "tf1_gru_stack.pb", "onnx"),  # TF1 3 x GRUCell(80), reset-before, loose bound
    (LOOSE / "tf1_gru_chaotic" / "ckpt", "onnx"),  # ill-conditioned: inconclusive by design
    (LOOSE / "tf1_lstm_proj_peep.pb", "npz"),  # projected peephole LSTM (read back: no framework expresses it)
    (KERAS / "stack_lstm_gru_rnn.h5", "onnx"),  # stacked LSTM, GRU, SimpleRNN
    (KERAS / "bidi_gru_sum.h5", "pt"),  # bidirectional GRU, torch
    (KERAS / "lstm_hard_sigmoid.h5", "onnx"),
    (KERAS / "gru_reset_before.h5", "onnx"),
    (REALWORLD / "mycroft-precise-gru" / "hey-mycroft.net", "onnx"),
]

#: the blocked, reversed summation order of rnnconvert.verify.orders, as reference kernels
BLOCKED = orders._kernels(orders._blocked)


def _forward_blocks(w, vs, blocks: int = 7):
    """``w @ v`` as ``blocks`` partial products over column blocks of ``w``, added first block first."""
    out = []
    for v in vs:
        wv = w.astype(v.dtype, copy=False)
        edges = np.linspace(0, w.shape[1], blocks + 1).astype(int)
        acc = np.zeros((w.shape[0], v.shape[1]), v.dtype)
        for lo, hi in zip(edges[:-1], edges[1:]):
            acc = acc + wv[:, lo:hi] @ v[lo:hi]
        out.append(acc)
    return out


#: a summation order outside orders.ORDERS, as reference kernels
OTHER = orders._kernels(_forward_blocks)


def _acts_off(rng, ulps: int = 4) -> dict:
    """Every activation's float32 result moved by ``ulps`` units of roundoff of ``1 + |act(z)|``, up or down."""
    u = 2.0 ** -24

    def off(f):
        def g(z):
            t = f(z)
            sign = rng.choice(np.array([-1.0, 1.0], t.dtype), t.shape)
            return (t + sign * ulps * u * (1 + np.abs(t))).astype(t.dtype)
        return g
    return {k: off(f) for k, f in reference.ACT.items()}


def _ulp(v, rng):
    if v is None:
        return None
    v = np.asarray(v, np.float32)
    return np.nextafter(v, np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf).astype(np.float32))


def _perturb(monkeypatch, how: str) -> None:
    """The target side's numbers perturbed: ``'ulp'`` (each moved by one float32 ulp), ``'order'`` (a float32 run
    of the source's canonical equations, every product summed in reversed blocks) or ``'other'`` (7 blocks added in
    order, activations 4 ulps off)."""
    rng = np.random.default_rng(39)
    kern, acts = (OTHER, _acts_off(np.random.default_rng(7))) if how == "other" else (BLOCKED, None)
    step, seq = TargetRun._target_step, TargetRun._sequence_target

    def target_step(self, layer, k, xf, states):
        got, note = step(self, layer, k, xf, states)
        if got is None:
            return got, note
        if how == "ulp":
            return [tuple(_ulp(v, rng) for v in g) for g in got], note
        one = layer.one_slab(k)
        return [reference.step(one, p, xf, s[0], s[1], np.float32, kernels=kern, acts=acts)
                for p, s in zip(one.params[0], states)], note

    def sequence_target(self, layer, ev, by_slab, ref):
        runs, note = seq(self, layer, ev, by_slab, ref)
        if how == "other":  # the one steps only: what the measured one-step tolerance decides
            return runs, note
        if how == "ulp":
            return [(_ulp(y, rng), y32, r) for y, y32, r in runs], note
        if len(runs) == 1 and not by_slab:
            y = reference.forward_multi(layer, [ev.seq_x().astype(np.float32)], acts, kernels=kern)[0]
            return [(y, runs[0][1], runs[0][2])], note
        out = []
        for k, ((xk, _, _), (_, y32, r)) in enumerate(zip(ev.seq_slabs, runs)):
            y = reference.forward_slab_multi(layer, layer.params[k], [np.asarray(xk, np.float32)], acts,
                                             kernels=kern)[0]
            out.append((reference.finish(layer, y) if k == layer.num_layers - 1 else y, y32, r))
        return out, note
    monkeypatch.setattr(TargetRun, "_target_step", target_step)
    monkeypatch.setattr(TargetRun, "_sequence_target", sequence_target)


def _id(case) -> str:
    src, to = case
    return f"{src.parent.name if src.stem == 'ckpt' else src.stem}-{to}"


@pytest.mark.parametrize("src,to", CASES, ids=[_id(c) for c in CASES])
def test_the_same_verdict_under_perturbed_float32_evaluation(src, to, tmp_path, monkeypatch):
    pytest.importorskip({"onnx": "onnxruntime", "pt": "torch"}.get(to, "numpy"))
    pytest.importorskip("tensorflow")  # the TF1 and Keras sources' own equations need no framework; TF1 .pb reads do
    if not (src.exists() or src.with_suffix(".index").exists()):
        pytest.skip(f"{src} is not in this checkout")
    dst = tmp_path / f"out.{to}"
    api.convert(src, dst, verify=None,
                write_opts={"recurrent_only": True} if src.suffix == ".h5" and to == "onnx" else None)
    ckpt, src_mod, dst_mod = rnnconvert.load(src), registry.detect(src).load(), registry.detect(dst).load()
    base_check = _source_side(ckpt, src_mod, src)
    base = _judged(base_check, dst, dst_mod)
    assert base and all(v != "fail" for _, v in base), base  # correct files: never fail
    got = {}
    with monkeypatch.context() as m:  # the source side too runs its BLAS on 2 threads
        m.setenv("RNNCONVERT_BLAS_THREADS", "2")
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch else None
        if torch:
            torch.set_num_threads(1 if threads > 1 else 2)
        try:
            got["threads"] = _judged(_source_side(ckpt, src_mod, src), dst, dst_mod)
        finally:
            if torch:
                torch.set_num_threads(threads)
    for how in ("order", "ulp", "other"):
        with monkeypatch.context() as m:
            _perturb(m, how)
            got[how] = _judged(base_check, dst, dst_mod)
    assert all(v == base for v in got.values()), (base, got)


def _source_side(ckpt, src_mod, src) -> engine.StreamedVerification:
    check = engine.StreamedVerification(ckpt, src_mod, src_path=src)
    for i, layer in enumerate(ckpt.layers):
        for k in range(layer.num_layers):
            check.source_slab(i, k, layer.params[k])
    return check


def _judged(check, dst, dst_mod) -> list[tuple[str, str]]:
    """The target side run again on the same source side: each layer's verdict."""
    check.rep.layers = []
    return [(c.name, c.verdict) for c in check.target_side(dst, dst_mod).layers]
