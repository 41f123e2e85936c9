"""Third-party Keras files (fixtures/realworld) against their own code's outputs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import rnnconvert

torch = pytest.importorskip("torch")


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_textgenrnn_cudnnlstm_to_pt_reproduces_oracle(realworld, tmp_path):
    d = realworld / "textgenrnn-reddit-cudnnlstm"
    src = d / "reddit_rarepuppers_politics.hdf5"
    before = _sha(src)
    dst = tmp_path / "textgen.pt"
    rep = rnnconvert.convert(src, dst)
    assert _sha(src) == before
    assert rep.modules == ["rnn_1: nn.LSTM(input_size=100, hidden_size=128, batch_first=True)",
                           "rnn_2: nn.LSTM(input_size=128, hidden_size=128, batch_first=True)"]
    oracle = np.load(d / "oracle_out.npz")
    sd = torch.load(dst, weights_only=True)
    for name in ("rnn_1", "rnn_2"):
        x = oracle[f"{name}__in"]
        mod = torch.nn.LSTM(x.shape[-1], 128, batch_first=True)
        mod.load_state_dict({k[len(name) + 1:]: v for k, v in sd.items() if k.startswith(name + ".")}, strict=True)
        with torch.no_grad():
            y = mod(torch.from_numpy(x))[0].numpy()
        assert np.abs(y - oracle[f"{name}__out"]).max() <= 1e-5
    # Embedding and Dense come along with PyTorch names and orientation.
    assert tuple(sd["embedding.weight"].shape) == (465, 100)
    assert tuple(sd["output.weight"].shape) == (465, 356)


def test_textgenrnn_torch_modules_api(realworld):
    src = realworld / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5"
    oracle = np.load(src.parent / "oracle_out.npz")
    mods = rnnconvert.torch_modules(src)
    with torch.no_grad():
        y = mods["rnn_2"](torch.from_numpy(oracle["rnn_2__in"]))[0].numpy()
    assert np.abs(y - oracle["rnn_2__out"]).max() <= 1e-5


def test_mycroft_gru_refused_into_pt(realworld, tmp_path):
    src = realworld / "mycroft-precise-gru" / "hey-mycroft.net"
    dst = tmp_path / "m.pt"
    with pytest.raises(rnnconvert.UnsupportedError) as e:
        rnnconvert.convert(src, dst)
    msg = str(e.value)
    assert "'net'" in msg and "hard_sigmoid" in msg and "reset_after" in msg and ".onnx" in msg
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_mycroft_reference_matches_frozen_graph_oracle(realworld):
    """Our reading of the .net (hard_sigmoid, linear, reset-before) against TF running Keras 2.1.4's graph.

    This GRU is ill-conditioned (linear activation, inputs up to 36, outputs up to 66): float32 and
    float64 evaluations of the same equations differ by up to 3e-2. The Keras equations on the Keras
    tensors in float32, in Keras' order of operations, match the oracle bit for bit; the canonical
    float64 reference matches within 1e-3 relative."""
    from rnnconvert.core import reference
    from rnnconvert.formats.keras import keras_math

    d = realworld / "mycroft-precise-gru"
    layer = rnnconvert.load(d / "hey-mycroft.net").layer("net")
    oracle = np.load(d / "oracle_out.npz")
    want = oracle["net__out"]
    y32 = keras_math.source_forward(layer, oracle["net__in"], np.float32)[:, -1]
    y64 = reference.forward(layer, oracle["net__in"])[:, -1]
    scale = np.abs(want).max()
    assert np.array_equal(y32, want)
    assert np.abs(y64 - want).max() <= 1e-3 * scale
