"""NaN/Inf in Keras HDF5 files is refused on every path, now that ``h5_access.read_dataset`` no longer checks
by itself (issue 16c): the recurrent tensors by the conversion's own row-block read
(``interpreter.convert_direction``, naming the stored tensor), every tensor a reader keeps by
``api.check_finite``. Each case plants one non-finite value into a copy of a fixture made by the real
framework (fixtures/gen_keras.py: tf_keras, Keras 1) and must be refused, eagerly and lazily."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import rnnconvert
from rnnconvert.errors import FormatError

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras"

CASES = [
    # (fixture, dataset, the words the message must hold)
    ("lstm.h5", "model_weights/lstm/lstm/lstm_cell/kernel:0", "lstm_cell kernel: contains NaN or Inf"),
    ("lstm.h5", "model_weights/lstm/lstm/lstm_cell/recurrent_kernel:0", "lstm_cell recurrent_kernel: contains NaN or Inf"),
    ("lstm.h5", "model_weights/lstm/lstm/lstm_cell/bias:0", "lstm_cell bias: contains NaN or Inf"),
    ("embedding_lstm.h5", "model_weights/emb/emb/embeddings:0", "tensor 'emb.weight' contains NaN or Inf"),
    ("embedding_lstm.h5", "model_weights/out/out/kernel:0", "tensor 'out.weight' contains NaN or Inf"),
    ("keras1_lstm_gru_weights.h5", "lstm_1/lstm_1_U_f:0", "/lstm_1 recurrent_kernel: contains NaN or Inf"),
    ("keras1_lstm_gru_weights.h5", "gru_1/gru_1_b_h:0", "/gru_1 bias: contains NaN or Inf"),
]


def _planted(tmp_path: Path, name: str, dataset: str, value: float) -> Path:
    dst = tmp_path / name
    shutil.copyfile(FIX / name, dst)
    with h5py.File(dst, "r+") as f:
        a = np.array(f[dataset])
        a.reshape(-1)[a.size // 2] = value
        f[dataset][...] = a
    return dst


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name,dataset,words", CASES)
def test_non_finite_value_is_refused(name, dataset, words, lazy, value, tmp_path):
    src = _planted(tmp_path, name, dataset, value)
    with pytest.raises(FormatError, match=words):
        ck = rnnconvert.load(src, lazy=lazy)
        for i, layer in enumerate(ck.layers):
            for k in range(layer.num_layers):
                ck.slab(i, k)


@pytest.mark.parametrize("name", sorted({c[0] for c in CASES}))
def test_the_untouched_fixture_loads(name):
    """The control: the same fixtures without the planted value load (so the refusals above are the value's)."""
    ck = rnnconvert.load(FIX / name, lazy=True)
    for i, layer in enumerate(ck.layers):
        for k in range(layer.num_layers):
            ck.slab(i, k)
