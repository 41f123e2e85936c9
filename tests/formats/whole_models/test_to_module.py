"""``rnnconvert.to_module(src)`` (issue #42): the whole Keras model as a ``torch.nn.Module`` object from the API,
not only files. Oracle: tf_keras' own outputs stored with the fixtures (``fixtures/gen_whole_graph.py``:
``out__0`` on ``in__<name>``), compared with the module run by torch on the same inputs at the whole-model
tolerance (``2e-5 * max(1, max|ref|)``, tests/conftest.py ``WHOLE_TOL``)."""

from __future__ import annotations

import numpy as np
import pytest

import rnnconvert
from conftest import FIXTURES, whole_close, whole_graph

torch = pytest.importorskip("torch")
pytest.importorskip("tf_keras")


@pytest.mark.parametrize("name", ["whole30_masked_bidir", "whole30_embed_conv_lstm"])
def test_module_object_matches_tf_keras(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = FIXTURES / "whole_graph" / f"{name}.h5"
    m = rnnconvert.to_module(src)
    assert isinstance(m, torch.nn.Module) and not m.training
    assert m.rnnconvert_verification.ok
    assert list(tmp_path.iterdir()) == []  # nothing left on disk
    g = whole_graph(src)
    with np.load(src.with_suffix(".npz")) as z:
        args = [torch.from_numpy(z[f"in__{n}"].astype(np.int32 if e is not None else np.float32))
                for n, _, _, e in g.inputs]
        ref = z["out__0"]
    with torch.no_grad():
        y = m(*args)
    y = y[0] if isinstance(y, tuple) else y
    assert whole_close(y.numpy(), ref)


def test_source_without_a_whole_model_is_refused():
    with pytest.raises(rnnconvert.UnsupportedError, match="whole Keras 1/2 model"):
        rnnconvert.to_module(FIXTURES / "madmom" / "rnn.pkl")  # recurrent layers and a head, no Keras model
