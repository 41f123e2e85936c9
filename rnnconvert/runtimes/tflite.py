"""The TensorFlow Lite runtime: ``tf.lite.Interpreter`` (TensorFlow's LiteRT interpreter) running a written
``.tflite`` file (verification's target side for ``tflite``).

It opens the file itself (the container's ``load`` is ``None``): layer ``name`` is the graph input
``<name>__in`` and output ``<name>__out`` (:mod:`rnnconvert.formats.tflite.tflite_write`). Each run uses a fresh
interpreter, so the LSTM ops' variable state tensors start at zero; inputs are cut into chunks of the file's batch
(the states' first dimension) and the last chunk padded. No one-step runner: the state tensors are internal to
the op, so verification's one-step comparison uses the arrays read back from the written file (the report says
so). TensorFlow is imported inside the functions.

A whole Keras model written whole (:mod:`rnnconvert.whole.formats.tflite.model_write`: one signature whose inputs
are the model's) runs whole only: its layers are compared inside the model by ``verify_whole``
(:mod:`rnnconvert.whole.runtimes.tflite_whole`); :func:`forward` refuses to run one of them alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.model import Checkpoint
from ..engine.protocol import Runtime, located
from ..errors import UnsupportedError, require


def interpreter(path: str | Path):
    """A ``tf.lite.Interpreter`` of the file at ``path`` (its LiteRT migration warning silenced)."""
    tf = require("tensorflow", "tensorflow")
    import warnings

    with warnings.catch_warnings():  # tf.lite.Interpreter's LiteRT migration notice
        warnings.simplefilter("ignore")
        return tf.lite.Interpreter(model_path=str(path))


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Layer ``name`` of the written file in the TFLite interpreter on ``x`` ``(B, T, I)`` from zero states;
    float64 ``(B, T, dirs*out)``."""
    probe = interpreter(path)
    inp = next((d for d in probe.get_input_details() if d["name"] == f"{name}__in"), None)
    if inp is None:
        raise UnsupportedError(f"{Path(path).name}: a whole-model .tflite runs whole only (no input '{name}__in'); "
                               "its layers are checked inside the model by the whole-model check")
    out_name = f"{name}__out"
    batch = int(inp["shape"][0])
    B, T, n_in = x.shape
    ys = []
    for s in range(0, B, batch):
        chunk = np.zeros((batch, T, n_in), np.float32)
        part = np.asarray(x[s:s + batch], np.float32)
        chunk[:len(part)] = part
        it = interpreter(path)
        it.resize_tensor_input(inp["index"], [batch, T, n_in])
        it.allocate_tensors()
        it.set_tensor(inp["index"], chunk)
        it.invoke()
        out = next(d for d in it.get_output_details() if d["name"] == out_name)
        ys.append(np.array(it.get_tensor(out["index"])[:len(part)], dtype=np.float64))
    return np.concatenate(ys, axis=0)


def whole_signature(path: str | Path) -> dict | None:
    """The ``serving_default`` signature (``{'inputs': [...], 'outputs': [...]}``) of a whole-model file
    (:mod:`rnnconvert.whole.formats.tflite.model_write`: outputs ``output_<i>``), else ``None`` (a file of
    recurrent layers, whose graph inputs are ``<layer>__in``)."""
    sig = interpreter(path).get_signature_list().get("serving_default")
    if not sig or not any(o.startswith("output_") for o in sig.get("outputs", [])):
        return None
    return sig


RUNTIME = Runtime("tflite", engine="tensorflow", forward=forward,
                  verify_whole=located("rnnconvert.whole.runtimes.tflite_whole:verify_whole"))
