"""The Keras 3 runtime: Keras 3 runs a written ``.keras`` / ``.weights.h5`` (verification's target side) and
whole Keras 2 models migrated to Keras 3 (its ``verify_whole``: :func:`rnnconvert.whole.runtimes.keras3_whole.verify_whole`).

A container hands this runtime a written file through its :attr:`~rnnconvert.engine.protocol.FormatSpec.load`:
``load(path, ckpt, name, k) -> (chain, whole)``, the Keras 3 layers to run in a chain for layer ``name`` (``k``
``None``), or for its stacked layer ``k`` alone, from the written file loaded in Keras 3; ``whole``: the file is a
whole model, whose recurrent layer (at its dotted path) is run as a copy returning the full sequence
(:func:`sequence_run`). Keras 3 is imported inside the functions (``keras_config.import_keras3``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.model import Checkpoint
from ..engine.protocol import Runtime, located
from ..formats.keras.keras_config import import_keras3
from .tf_keras import cell_step


def sequence_run(k, lay, h: np.ndarray) -> np.ndarray:
    """Run a Keras 3 recurrent layer of a whole model on ``h`` as a copy returning the full sequence."""
    from ..safety import keras_sanitize

    cfg = keras_sanitize.layer_config(type(lay).__name__, lay.get_config(), "the written model", lay.name)
    cfg.update(return_sequences=True, return_state=False, stateful=False)
    twin = type(lay).from_config(cfg)
    twin.build((None, None, h.shape[-1]))
    twin.set_weights(lay.get_weights())
    return k.ops.convert_to_numpy(twin(h))


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Run layer ``name`` of a written Keras 3 file in Keras 3 on ``x`` ``(B, T, I)``; ``(B, T, dirs*H)`` float64
    (a Bidirectional's backward direction in input time order)."""
    k = import_keras3()
    layer = ckpt.layer(name)
    chain, whole = load(path, ckpt, name, None)
    h = np.asarray(x, dtype=layer.dtype)
    for lay in chain[:-1]:
        h = lay(h)
    last = chain[-1]

    def run(lay, h):
        return sequence_run(k, lay, h) if whole else k.ops.convert_to_numpy(lay(h))

    if layer.bidirectional:
        y = np.concatenate([run(last.forward_layer, h), run(last.backward_layer, h)[:, ::-1]], axis=-1)
    else:
        y = run(last, h)
    return np.asarray(y, dtype=np.float64)


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """Verification's one-step check: stacked layer ``k`` of layer ``name`` of the written file, loaded in
    Keras 3, one step through its cell from each state (Bidirectional: each direction's layer from its own
    states); ``[(h1, c1 or None)]`` per direction, float64."""
    layer = ckpt.layer(name)
    chain, _ = load(path, ckpt, name, k)
    last = chain[-1]
    subs = [last.forward_layer, last.backward_layer] if layer.bidirectional else [last]
    to_tensor = import_keras3().ops.convert_to_tensor
    return [cell_step(sub, x, st, layer.dtype, to_tensor) for sub, st in zip(subs, states)]


RUNTIME = Runtime("keras3", engine="keras", forward=forward, step=step,
                  verify_whole=located("rnnconvert.whole.runtimes.keras3_whole:verify_whole"))
