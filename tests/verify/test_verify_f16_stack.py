"""A deep float16 stack verifies slab by slab (issue #18, session 8).

A float16 framework rounds every stacked layer's output to float16 before the next layer reads it; in an
expansive deep stack that rounding grows from slab to slab. Chained through all slabs, the target's short
sequence parted from the source's float64 run by 0.0126 (the 8-slab float16 benchmark LSTM, one element;
the numpy reference with each slab's output rounded to float16 reproduced it at the same element) or by
0.09 (the 6-slab model below) where the tolerance is 0.01: a correct file FAILED. Each slab of a target that
runs slabs alone (``target_forward_slab``: torch, onnxruntime) now starts from the source's own float32 input
of that slab (:meth:`rnnconvert.verify.engine.StreamedVerification._by_slab`), as each one step starts from
the source's own state. These tests show both sides: the correct float16 file is ``ok`` (it FAILED before),
and layout slips in the same stack still FAIL. Oracle: torch (``torch.load`` of the written file, its own
float16 ``nn.LSTM``) against the numpy float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api

torch = pytest.importorskip("torch")

I, H, L = 16, 32, 6


@pytest.fixture(scope="module")
def f16_stack(tmp_path_factory):
    """A 6-slab bidirectional torch LSTM in float16 whose weights ``N(0, 4/sqrt(fan_in))`` make the stack
    expansive (gate-distinct: drawn per tensor), saved as a state dict, and its conversion to ``.pt``."""
    d = tmp_path_factory.mktemp("f16stack")
    torch.manual_seed(0)
    m = torch.nn.LSTM(I, H, num_layers=L, bidirectional=True, batch_first=True)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 4.0 / np.sqrt(p.shape[1] if p.ndim == 2 else H))
    sd = {f"rnn.{k}": v.half() for k, v in m.state_dict().items()}
    torch.save(sd, d / "src.pt")
    api.convert(d / "src.pt", d / "good.pt", verify=None)
    got = torch.load(d / "good.pt", weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in sd.items())  # torch reads back the very tensors: correct
    return d / "src.pt", d / "good.pt", sd


def test_correct_deep_float16_stack_verifies_ok(f16_stack, tmp_path):
    src, good, _ = f16_stack
    rep = api.verify(src, good)
    assert rep.ok, [(c.name, c.verdict, c.reason) for c in rep.layers]
    assert api.convert(src, tmp_path / "again.pt").verification.ok  # the default conversion keeps it


def _swap_rows(w, a, b, n):
    w = w.clone()
    ra, rb = w[a * n:(a + 1) * n].clone(), w[b * n:(b + 1) * n].clone()
    w[a * n:(a + 1) * n], w[b * n:(b + 1) * n] = rb, ra
    return w


MUTATIONS = {
    "stacked layers 2 and 3 swapped (W_hh, biases)": lambda sd: sd.update(
        {f"rnn.{t}_l{a}{s}": sd[f"rnn.{t}_l{b}{s}"] for t in ("weight_hh", "bias_ih", "bias_hh")
         for s in ("", "_reverse") for a, b in ((2, 3), (3, 2))}),
    "gates f and g swapped in W_hh of layer 4": lambda sd: sd.update(
        {"rnn.weight_hh_l4": _swap_rows(sd["rnn.weight_hh_l4"], 1, 2, H)}),
    "gates i and o swapped in the biases of layer 1 (reverse)": lambda sd: sd.update(
        {k: _swap_rows(sd[k], 0, 3, H) for k in ("rnn.bias_ih_l1_reverse", "rnn.bias_hh_l1_reverse")}),
    "directions swapped in layer 5": lambda sd: sd.update(
        {f"rnn.{t}_l5{s}": sd[f"rnn.{t}_l5{o}"] for t in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
         for s, o in (("", "_reverse"), ("_reverse", ""))}),
}


@pytest.mark.parametrize("what", list(MUTATIONS))
def test_layout_slip_in_deep_float16_stack_fails(f16_stack, tmp_path, what):
    src, good, sd = f16_stack
    bad = {k: v.clone() for k, v in torch.load(good, weights_only=True).items()}
    before = {k: v.clone() for k, v in bad.items()}
    MUTATIONS[what](bad)
    assert any(not torch.equal(bad[k], before[k]) for k in bad)
    torch.save(bad, tmp_path / "bad.pt")
    rep = api.verify(src, tmp_path / "bad.pt")
    assert rep.failed, (what, [(c.verdict, c.reason) for c in rep.layers])
