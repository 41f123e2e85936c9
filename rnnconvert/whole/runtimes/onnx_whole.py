"""The whole-model check of the ``onnxruntime`` runtime (its ``verify_whole``, named by location in
:data:`rnnconvert.runtimes.onnxruntime.RUNTIME`): a whole Keras model written as one ONNX graph
(:mod:`rnnconvert.whole.formats.onnx.model_write`) run by onnxruntime against the source model, with float32 and float64
torch runs of the source's graph rebuilt for the spreads of the one rule of whole models. Moved here from :mod:`rnnconvert.runtimes.onnxruntime`
(issue #38): ``runtimes/`` imports nothing of ``whole/``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.model import Checkpoint
from ...errors import require
from ...runtimes.onnxruntime import whole_meta


def verify_whole(ckpt: Checkpoint, src_path: str | Path, dst_path: str | Path, inputs: dict | None = None,
                 seed: int = 0) -> list:
    """Whole-model verification of a written whole-model ONNX graph (issue #30): the source Keras model (its graph
    evaluated in numpy where :mod:`rnnconvert.whole.verify.numpy_source` covers it, :func:`source_graph`; else run
    by tf_keras) against onnxruntime running ``dst_path`` on the model inputs, every model output and every
    top-level layer's output (the graph's ``layer:<name>`` outputs), by the one rule of whole models; one more
    float32 evaluation order of the source (and its float64 reference where tf_keras cannot rebuild it) from the
    source's graph rebuilt as a torch program run in float32 and float64 (:func:`rnnconvert.whole.formats.torch.pt2_write.build_module`). ``[]`` when the
    file holds the recurrent layers only (:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`). A graph
    written with states (``state_inputs`` in its metadata) is fed zero states, as the source model starts."""
    from ..verify import keras_whole_check

    meta = whole_meta(dst_path)
    if meta is None:
        return []
    full = keras_whole_check.whole_of(ckpt)
    if full is None:
        return []
    ort = require("onnxruntime", "onnx")
    sess = ort.InferenceSession(str(dst_path), providers=["CPUExecutionProvider"])
    kinds = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]

    carried = {i.name: i.shape[-1] for i in sess.get_inputs() if i.name in meta.get("state_inputs", [])}

    def target(xs):
        feeds = {k: np.asarray(v).astype(kinds[k]) for k, v in xs.items()}
        batch = len(next(iter(feeds.values())))
        feeds.update({k: np.zeros((batch, h), np.float32) for k, h in carried.items()})  # the source's zero states
        got = sess.run(names, feeds)
        by = dict(zip(names, got))
        return ([by[o] for o in meta["outputs"]],
                {n[len("layer:"):]: a for n, a in by.items() if n.startswith("layer:")})

    return keras_whole_check.compare_whole(str(src_path), full, target, f"onnxruntime {ort.__version__} (whole graph)",
                                     inputs=inputs, seed=seed, run64=source_graph_run(ckpt, full),
                                     run32=source_graph_run(ckpt, full, double=False),
                                     padding=meta.get("mask_layout", "any"), graph=source_graph(ckpt, full))


def source_graph(ckpt: Checkpoint, full):
    """The source's whole-model graph, built when asked (the numpy source side of the check,
    :func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`'s ``graph``): from the SOURCE's config and
    weights, never from the written file."""
    def build():
        from ..conventions import keras_graph

        return keras_graph.build(full.config, full.weights, ckpt)
    return build


def source_graph_run(ckpt: Checkpoint, full, double: bool = True):
    """The whole model as a float64 torch module (``double=False``: the same module in float32; the rule of
    whole models measures the model's conditioning with the two, never with the written file), or ``None`` without torch (the
    source's own spreads alone decide)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None

    def run64(xs):  # imported only when the rule asks for the spreads
        from ..conventions import keras_graph
        from ..formats.torch import pt2_write

        return pt2_write.run_float64(keras_graph.build(full.config, full.weights, ckpt), xs, double)
    return run64
