"""The whole-model check of the ``tflite`` runtime (its ``verify_whole``, named by location in
:data:`rnnconvert.runtimes.tflite.RUNTIME`): a whole Keras 1/2 model written as one ``.tflite``
(:mod:`rnnconvert.whole.formats.tflite.model_write`) run by ``tf.lite.Interpreter`` (its signature runner) against
the source model in tf_keras, every model output and every exposed top-level layer's output
(:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`: the one rule of whole models,
:func:`rnnconvert.verify.whole_rule.decide_whole`)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.model import Checkpoint
from ...errors import require
from ...runtimes.tflite import whole_signature


def run(path: str | Path, xs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of the whole-model file's signature on the model inputs ``xs`` (by input name), float64; a
    file whose batch is fixed runs the batch in chunks of it (the last chunk padded with its first row), each in a
    fresh interpreter: a fused LSTM op keeps its state in variable tensors, which carry over to the next
    invocation of the same interpreter (``reset_all_variables`` clears them)."""
    from ...runtimes.tflite import interpreter

    details = interpreter(path).get_signature_runner().get_input_details()
    kinds = {k: d["dtype"] for k, d in details.items()}
    fixed = {int(d["shape_signature"][0]) for d in details.values() if int(d["shape_signature"][0]) > 0}
    n = int(np.shape(next(iter(xs.values())))[0])
    step = min(fixed) if fixed else n
    parts: dict[str, list] = {}
    for s in range(0, n, step):
        feed = {}
        for k, v in xs.items():
            part = np.asarray(v)[s:s + step].astype(kinds[k])
            if len(part) < step:
                part = np.concatenate([part, np.repeat(part[:1], step - len(part), axis=0)])
            feed[k] = part
        got = interpreter(path).get_signature_runner()(**feed)
        for k, v in got.items():
            parts.setdefault(k, []).append(np.asarray(v, np.float64)[:min(step, n - s)])
    return {k: np.concatenate(v, axis=0) for k, v in parts.items()}


def verify_whole(ckpt: Checkpoint, src_path: str | Path, dst_path: str | Path, inputs: dict | None = None,
                 seed: int = 0) -> list:
    """Whole-model verification of a written whole-model ``.tflite`` (module docstring); ``[]`` when the file
    holds the recurrent layers only."""
    from ..verify import keras_whole_check

    if whole_signature(dst_path) is None:
        return []
    full = keras_whole_check.whole_of(ckpt)
    if full is None:
        return []
    tf = require("tensorflow", "tensorflow")

    def target(xs):
        by = run(dst_path, xs)
        outs = [by[f"output_{i}"] for i in range(sum(k.startswith("output_") for k in by))]
        return outs, {k[len("layer_"):]: v for k, v in by.items() if k.startswith("layer_")}

    from .onnx_whole import source_graph_run

    # one more float32 evaluation order of the source: its graph rebuilt in torch (float32 and float64)
    return keras_whole_check.compare_whole(str(src_path), full, target,
                                           f"tf.lite.Interpreter {tf.__version__} (whole model)",
                                           inputs=inputs, seed=seed, run64=source_graph_run(ckpt, full),
                                           run32=source_graph_run(ckpt, full, double=False))
