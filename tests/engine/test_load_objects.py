"""``rnnconvert.load`` of objects in memory (issue #42): a ``torch.nn.Module``, its state dict (torch tensors or
numpy arrays), the bytes of a file. Oracles: the torch module's own output; tf_keras' stored outputs of a Keras
fixture (``fixtures/gen_keras.py``). ``rnnconvert.Refused``: exported, with a short repr."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import rnnconvert
from conftest import FIXTURES

torch = pytest.importorskip("torch")


def _gru():
    torch.manual_seed(7)
    return torch.nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True)


def _x():
    return torch.from_numpy(np.random.default_rng(1).normal(0, 1, (2, 5, 3)).astype(np.float32))


@pytest.mark.parametrize("kind", ["module", "state_dict", "numpy", "bytes", "training"])
def test_load_in_memory_torch(kind, tmp_path):
    """Each in-memory form of one nn.GRU loads as one layer whose torch module computes the original's output
    exactly (its parameters are the original's)."""
    m = _gru()
    sd = m.state_dict()
    if kind == "bytes":
        torch.save(sd, tmp_path / "m.pt")
        obj = (tmp_path / "m.pt").read_bytes()
    else:
        obj = {"module": m, "state_dict": sd, "numpy": {k: v.numpy() for k, v in sd.items()},
               "training": {"model": sd, "epoch": 3}}[kind]
    ckpt = rnnconvert.load(obj)
    assert ckpt.format == "pt" and [layer.num_layers for layer in ckpt.layers] == [2]
    assert ckpt.meta["path"].startswith("<") and "rnnconvert-load" not in str(ckpt.meta)
    (mod,) = rnnconvert.torch_modules(ckpt).values()
    with torch.no_grad():
        assert torch.equal(mod(_x())[0], m(_x())[0])


def test_load_bytes_of_a_keras_file_reproduces_tf_keras():
    """The bytes of an HDF5 file (detected by its magic number) read as the file: torch runs the layer to
    tf_keras' stored output."""
    ckpt = rnnconvert.load((FIXTURES / "keras/lstm.h5").read_bytes())
    assert ckpt.format == "keras_h5"
    z = np.load(FIXTURES / "keras/lstm.npz")
    (mod,) = rnnconvert.torch_modules(ckpt).values()
    with torch.no_grad():
        y = mod(torch.from_numpy(z["lstm__in"]))[0].numpy()
    want = z["lstm__out"]
    y = y if y.shape == want.shape else y[:, -1]  # return_sequences=False: the last step
    assert float(np.max(np.abs(y - want))) <= 2e-6 * max(1.0, float(np.max(np.abs(want))))


def test_load_objects_refused_clearly(tmp_path):
    with pytest.raises(rnnconvert.FormatError, match=r"^<bytes: 11>: no format recognised these bytes") as info:
        rnnconvert.load(b"hello world")
    assert "rnnconvert-load" not in str(info.value)
    with pytest.raises(TypeError, match="a path, the bytes of a file, a state dict .* or a torch.nn.Module, not int"):
        rnnconvert.load(3)
    with pytest.raises(rnnconvert.FormatError, match=r"^<state dict>: no recurrent weights recognised"):
        rnnconvert.load({"a": np.zeros((2, 2), np.float32)})
    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"x": print}))  # a global outside the allow-list
    with pytest.raises(rnnconvert.FormatError):
        rnnconvert.load((tmp_path / "evil.pt").read_bytes())


def test_refused_is_exported_with_a_short_repr(tmp_path):
    torch.save(torch.nn.GRU(3, 4).state_dict(), tmp_path / "g.pt")
    with pytest.raises(rnnconvert.Refused) as info:
        rnnconvert.convert(tmp_path / "g.pt", tmp_path / "g.tflite")  # the TFLite writer writes LSTM layers only
    exc = info.value
    assert isinstance(exc, rnnconvert.UnsupportedError) and "Refused" in rnnconvert.__all__
    r = repr(exc)
    assert r.startswith("Refused(layer='rnn', target=") and "\n" not in r and len(r) < 600 and "nan" not in r
