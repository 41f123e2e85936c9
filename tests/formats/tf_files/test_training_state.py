"""A training checkpoint's optimizer state is said, not silently left behind (issue #42: "say what is dropped (a
training checkpoint's optimizer state)"): a tf_keras model trained one step with Adam, saved by tf_keras as a full
HDF5 model with its optimizer and as a TF2 object checkpoint (``save_weights``, which holds the optimizer); each conversion's notes
say that the optimizer's tensors are not carried, and the weights still convert (the framework made both files
in the test, with its own ``model.save`` and ``model.save_weights``)."""

from __future__ import annotations

import numpy as np
import pytest

import rnnconvert

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("trained")
    m = tf_keras.Sequential([tf_keras.layers.LSTM(3, input_shape=(5, 2), name="lstm"), tf_keras.layers.Dense(1)])
    m.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).standard_normal((4, 5, 2)).astype(np.float32)
    m.fit(x, np.zeros((4, 1), np.float32), epochs=1, verbose=0)
    m.save(d / "full.h5", include_optimizer=True)
    m.save_weights(str(d / "ckpt"))  # TF format: the model object and its compiled optimizer
    return d


def test_h5_optimizer_weights_are_named_in_the_notes(trained, tmp_path):
    rep = rnnconvert.convert(trained / "full.h5", tmp_path / "o.pt")
    assert any("optimizer_weights" in n and "not carried" in n for n in rep.notes), rep.notes


def test_tf2_optimizer_slots_are_named_in_the_notes(trained, tmp_path):
    ckpt = rnnconvert.load(str(trained / "ckpt") + ".index")
    assert [layer.name for layer in ckpt.layers] and any("optimizer tensor(s)" in n and "not carried" in n for n in ckpt.meta.get("notes", []))
