"""The parts of the cuDNN verification target that run without a GPU (rnnconvert/verify/cuda.py).

What cuDNN computes is measured on a GPU (tests/verify/test_cuda_verify.py, bench/gpu_check.py; docs/gpu-validation.md):
its float32 tanh is off by up to CUDNN_TANH_ULPS. Here: the one-step bound with the target's declared accuracy
holds for a step whose every tanh is off by that much, and the written file is read back with the source's
nn.RNN nonlinearity (a state dict does not store it; read as tanh, a SimpleRNN(relu) file failed by 0.87 on
a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert.verify import bounds
import rnnconvert
from conftest import FIXTURES
from rnnconvert.core import cudnn, reference
from rnnconvert.core.model import Cell
from rnnconvert.engine import registry
from rnnconvert.verify.target import Target
from rnnconvert.verify.cuda import CUDNN_ACT_ULPS, CUDNN_TANH_ULPS, CudaTarget
from conftest import random_layer


def _off_tanh(sign):
    u = bounds.unit_roundoff(np.float32)
    return lambda z: np.tanh(z) + sign * CUDNN_TANH_ULPS * u * (1 + np.abs(np.tanh(z)))


@pytest.mark.parametrize("cell", [Cell.LSTM, Cell.GRU, Cell.RNN_TANH])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_declared_accuracy_bounds_a_step_with_tanh_off_by_the_measured_error(cell, sign):
    layer = random_layer(cudnn.Spec(cell, 8, 16), seed=2)
    p = layer.params[0][0]
    x = np.random.default_rng(3).normal(size=(64, 8)).astype(np.float32)
    h0 = np.zeros((64, 16), np.float32)
    c0 = h0 if cell is Cell.LSTM else None
    u = bounds.unit_roundoff(np.float32)
    (h1, _), (dh, _) = bounds.step_with_bound(layer, p, x, h0, c0, u, act_ulps=CUDNN_ACT_ULPS)
    off = reference.forward_multi(layer, [x[:, None, :]], acts={"tanh": _off_tanh(sign)})[0][:, 0]
    assert (np.abs(off - h1) <= dh).all()
    (_, _), (dh16, _) = bounds.step_with_bound(layer, p, x, h0, c0, u)
    assert (np.abs(off - h1) > dh16).any()  # the default 16 ulps would fail this step


def test_target_arithmetic_precisions():
    layer = random_layer(cudnn.Spec(Cell.LSTM, 4, 8, 2, True), seed=1)
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32)
    y64 = reference.forward(layer, x)
    y32 = CudaTarget(None, "module", "float32").target_arithmetic(layer, x)
    y16 = CudaTarget(None, "module", "float16").target_arithmetic(layer, x)
    assert y32.dtype == np.float32 and y16.dtype == np.float16 and y32.shape == y16.shape == y64.shape
    own = np.abs(reference.forward(layer, x, np.float32) - y64).max()
    assert own < np.abs(y32 - y64).max() < np.abs(y16.astype(np.float64) - y64).max()
    assert CudaTarget(None, "buffer", "float32").act_ulps == CUDNN_ACT_ULPS
    assert CudaTarget(None, "buffer", "float16").act_ulps is None


def test_state_dict_read_back_with_the_source_nonlinearity(tmp_path):
    src = FIXTURES / "keras" / "simple_rnn_relu.h5"
    dst = tmp_path / "r.pt"
    rnnconvert.convert(src, dst)
    ckpt = rnnconvert.load(src)
    name = ckpt.layers[0].name
    assert ckpt.layers[0].cell is Cell.RNN_RELU
    assert registry.get("pt").load().read(dst).layer(name).cell is Cell.RNN_TANH  # what the file alone tells
    back = CudaTarget(registry.get("pt").load(), "module", "float32").read_back(dst, ckpt, name)
    assert back.cell is Cell.RNN_RELU
    for a, b in zip(back.params[0][0].arrays().values(), ckpt.layers[0].params[0][0].arrays().values()):
        assert np.array_equal(a, b)


def _shifted_source(tmp_path, delta):
    """The Keras file's canonical parameters with every ``b_ih`` moved by ``delta`` (a reader's slip: the file's
    own tensors, which its own equations run, are unchanged) and a ``.pt`` written from them."""
    from dataclasses import replace

    src = FIXTURES / "keras" / "bidi_lstm_concat.h5"
    ckpt = rnnconvert.load(src)
    layer = ckpt.layers[0]
    params = [[replace(p, b_ih=p.b_ih + np.float32(delta)) for p in row] for row in layer.params]
    bad = replace(ckpt, layers=[replace(layer, params=params)] + ckpt.layers[1:])
    dst = tmp_path / "shifted.pt"
    rnnconvert.save(bad, dst)
    return src, bad, dst


@pytest.mark.parametrize("delta", [1e-3, 3e-2])
def test_target_emulation_cannot_cover_a_reader_slip(tmp_path, delta):
    """Only the sequence comparison (the file's own equations against the written file) sees a reader's
    slip; the emulated target's spread is measured from the canonical float64 run, so it cannot widen the
    tolerance over that gap. (Measured from the source's own run it did: 'ok' at 1e-3, 'inconclusive' at 3e-2.)"""
    from rnnconvert.verify import engine as verify

    src, bad, dst = _shifted_source(tmp_path, delta)
    emu = CudaTarget(None, "module", "float32")
    pt = Target(registry.get("pt").load())
    like_cuda = Target(registry.get("pt").load())
    like_cuda.act_ulps, like_cuda.target_arithmetic = emu.act_ulps, emu.target_arithmetic
    for target in (pt, like_cuda):
        rep = verify.verify(bad, registry.get("keras_h5").load(), dst, target, src_path=src)
        assert rep.layers[0].verdict != "ok", (target.name, rep.layers[0].reason)
        if delta >= 3e-2:
            assert rep.layers[0].verdict == "fail", rep.layers[0].reason


def test_cpu_targets_keep_the_default_accuracy(tmp_path):
    from rnnconvert.verify import engine as verify

    pt = Target(registry.get("pt").load())
    assert pt.act_ulps is None and pt.target_arithmetic is None
    check = verify.StreamedVerification(rnnconvert.load(FIXTURES / "keras" / "lstm.h5"),
                                        registry.get("keras_h5").load(), target=pt)
    assert check.act_ulps is None
    emu = CudaTarget(pt, "module", "float32")
    assert verify.StreamedVerification(rnnconvert.load(FIXTURES / "keras" / "lstm.h5"),
                                       registry.get("keras_h5").load(), target=emu).act_ulps == CUDNN_ACT_ULPS


def test_cudnn_modules_are_built_without_random_initialisation(monkeypatch):
    """Issue #33: the cuDNN route's modules are made on the meta device and given empty storage (no
    ``reset_parameters`` on multi-GB layers): no initialiser runs, and the module has torch's flat weights in the
    order the layout check reads them."""
    import torch

    from rnnconvert.core import cudnn
    from rnnconvert.core.model import Cell
    from rnnconvert.verify import cudnn_layout

    devices = []
    real = torch.nn.init.uniform_
    monkeypatch.setattr(torch.nn.init, "uniform_", lambda t, *a, **k: devices.append(t.device.type) or real(t, *a, **k))
    spec = cudnn.Spec(Cell.GRU, 5, 7, 2, True, 0)
    m = cudnn_layout._module(spec, torch.float32, device="cpu")
    assert list(m._flat_weights_names) == [n for n, *_ in cudnn_layout._names(spec)]
    assert all(w.device.type == "cpu" and w.dtype == torch.float32 for w in m._flat_weights)
    assert devices and set(devices) == {"meta"}  # torch's initialiser ran on meta tensors only: no values made


def test_cudnn_layout_is_checked_once_per_spec(monkeypatch):
    """Issue #33: ``check_layout`` asks cuDNN for a spec's offsets once per process, not once per layer."""
    from rnnconvert.core import cudnn
    from rnnconvert.core.model import Cell
    from rnnconvert.verify import cudnn_layout

    calls = []
    monkeypatch.setattr(cudnn_layout, "compare_offsets", lambda spec, dtype=None: calls.append(spec) or [])
    cudnn_layout._layout_mismatches.cache_clear()
    spec = cudnn.Spec(Cell.LSTM, 3, 4, 1, False, 0)
    for _ in range(3):
        cudnn_layout.check_layout(spec)
    assert calls == [spec]
    cudnn_layout._layout_mismatches.cache_clear()


def test_convert_device_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path):
    """Issue #33: ``rnnconvert SRC DST --device cuda`` verifies the conversion itself through cuDNN; without a GPU it
    says so in one line (exit 7, a missing dependency) before anything is written."""
    import subprocess
    import sys

    from rnnconvert.verify import cudnn_layout

    if cudnn_layout.cuda_available():
        pytest.skip("a GPU is visible: the cuda tests cover this path")
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(FIXTURES / "keras" / "lstm.h5"),
                        str(tmp_path / "out.pt"), "--device", "cuda"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 7 and len(r.stderr.strip().splitlines()) == 1 and "--device cuda" in r.stderr
    assert not (tmp_path / "out.pt").exists() and list(tmp_path.iterdir()) == []


def test_convert_device_cuda_verifies_with_both_routes(tmp_path, monkeypatch):
    """The wiring of ``convert(device='cuda')``: the written file is verified by each cuDNN route (here stand-ins
    that run the file in torch on the CPU, named like the routes), one report holding both routes' layers."""
    from rnnconvert import api
    from rnnconvert.verify import cuda

    class Route(Target):
        def __init__(self, spec, route, dtype):
            super().__init__(spec)
            self.route = f"stand-in for cuDNN {route}"

    monkeypatch.setattr(cuda, "require_cuda", lambda: None)
    monkeypatch.setattr(cuda, "CudaTarget", Route)
    rep = api.convert(FIXTURES / "keras" / "lstm.h5", tmp_path / "out.pt", device="cuda")
    routes = [c.target_route for c in rep.verification.layers]
    assert len(routes) == 2 * len(rnnconvert.load(FIXTURES / "keras" / "lstm.h5").layers)
    assert len({r.split(" (")[0].rsplit(" ", 3)[0] for r in routes}) == 2, routes  # one entry per layer per route
    assert rep.verification.ok and (tmp_path / "out.pt").exists()


@pytest.fixture
def cudnn_on_cpu(monkeypatch):
    """The cuDNN routes with torch's CPU kernels in cuDNN's place (nothing else changed): the real CudaTarget,
    its lazy read back, slab by slab runs and emulation; only ``forward_module``/``forward_buffer``, the layout
    check and the device of the one-step module are stand-ins."""
    import torch

    from rnnconvert.conventions import torch_state
    from rnnconvert.core.model import Checkpoint
    from rnnconvert.runtimes import torch as torch_rt
    from rnnconvert.verify import cuda, cudnn_layout

    def run(layer, x):
        sd = {k: torch.from_numpy(np.ascontiguousarray(v))
              for k, v in torch_state.state_dict(Checkpoint(layers=[layer])).items()}
        return torch_rt.run_module(layer, sd, np.asarray(x, np.float32))
    seen = []
    monkeypatch.setattr(cuda, "require_cuda", lambda: None)
    monkeypatch.setattr(cudnn_layout, "check_layout", lambda spec, dtype=None: None)
    monkeypatch.setattr(cudnn_layout, "forward_module", lambda layer, x: seen.append(layer.num_layers) or run(layer, x))
    monkeypatch.setattr(cudnn_layout, "forward_buffer", lambda layer, x: seen.append(layer.num_layers) or run(layer, x))
    real = torch_rt.step_canonical
    monkeypatch.setattr(torch_rt, "step_canonical", lambda layer, k, x, states, device="cpu": real(layer, k, x, states))
    return seen


def _stacked_pt(tmp_path, seed=0):
    import torch

    torch.manual_seed(seed)
    m = torch.nn.LSTM(6, 8, num_layers=3, bidirectional=True, batch_first=True)
    src = tmp_path / "src.pt"
    torch.save(m.state_dict(), src)
    return src


def test_cuda_routes_stream_slab_by_slab(tmp_path, cudnn_on_cpu):
    """Issue #33: a lazy source and a lazily read-back target: each cuDNN route runs one slab (stacked layer)
    at a time, both routes judged against ONE source side (one report, every layer once per route), ok; the
    same file with two gate blocks exchanged in one slab fails both routes."""
    from rnnconvert import api

    src = _stacked_pt(tmp_path)
    dst = tmp_path / "out.safetensors"
    rep = api.convert(src, dst, device="cuda")
    assert rep.verification.ok and len(rep.verification.layers) == 2
    assert cudnn_on_cpu and set(cudnn_on_cpu) == {1}  # every cuDNN run held one slab
    rep = api.verify(src, dst, device="cuda")
    assert [c.verdict for c in rep.layers] == ["ok", "ok"], [c.reason for c in rep.layers]
    from safetensors.numpy import load_file, save_file

    t = load_file(dst)
    key = next(k for k in t if k.endswith("weight_hh_l1"))
    w = t[key].copy()
    H = w.shape[1]
    w[:H], w[H:2 * H] = t[key][H:2 * H], t[key][:H]  # gates i and f of stacked layer 1 exchanged
    t[key] = w
    bad = tmp_path / "bad.safetensors"
    save_file(t, bad)
    rep = api.verify(src, bad, device="cuda")
    assert [c.verdict for c in rep.layers] == ["fail", "fail"], [c.reason for c in rep.layers]


def test_cuda_emulated_spread_per_slab(tmp_path, cudnn_on_cpu):
    """The emulated cuDNN arithmetic is measured on every slab while it is loaded (a streamed source is not read
    twice): one spread per slab for a layer compared slab by slab, each above the source's own float32 spread."""
    from rnnconvert.engine import registry
    from rnnconvert.verify import engine as verify
    from rnnconvert.verify.cuda import CudaTarget

    src = _stacked_pt(tmp_path, seed=1)
    ckpt = rnnconvert.load(src, lazy=True)
    check = verify.StreamedVerification(ckpt, registry.get("pt").load(),
                                        target=CudaTarget(registry.get("safetensors").load(), "module"))
    for i, layer in enumerate(ckpt.layers):
        for k in range(layer.num_layers):
            dirs = ckpt.slab(i, k)
            check.source_slab(i, k, dirs)
            ckpt.release(i, k)
    spreads = check.evidence[0].spreads
    assert isinstance(spreads, list) and len(spreads) == 3 and all(s > 0 for s in spreads)
    for (_, y32, y64), s in zip(check.evidence[0].seq_slabs, spreads):
        assert s > float(np.abs(np.asarray(y32, np.float64) - y64).max())


@pytest.mark.parametrize("name", ["bidi_lstm_concat.h5", "gru_reset_after.h5", "simple_rnn_relu.h5",
                                  "bidi_gru_sum.h5"])
def test_cuda_routes_keras_sources(tmp_path, cudnn_on_cpu, name):
    """Keras sources (their own equations, streamed from the HDF5 file) through both stand-in routes: ok, with
    the emulated spread measured against the canonical float64 run chained while each slab was loaded."""
    from rnnconvert import api

    src = FIXTURES / "keras" / name
    rep = api.convert(src, tmp_path / "o.pt", device="cuda")
    assert rep.verification.ok, [(c.name, c.reason) for c in rep.verification.layers]
    assert len(rep.verification.layers) == 2 * len(rnnconvert.load(src).layers)
