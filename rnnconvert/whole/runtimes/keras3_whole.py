"""The whole-model check of the ``keras3`` runtime (its ``verify_whole``, named by location in
:data:`rnnconvert.runtimes.keras3.RUNTIME`): a Keras 2 model written whole as Keras 3, run by Keras 3 against
tf_keras on the source (:func:`rnnconvert.whole.verify.keras_whole_check.verify_model`). Moved here from
:mod:`rnnconvert.runtimes.keras3` (issue #38): ``runtimes/`` imports nothing of ``whole/``."""

from __future__ import annotations

from pathlib import Path

from ...core.model import Checkpoint


def verify_whole(ckpt: Checkpoint, src_path: str | Path, dst_path: str | Path, inputs: dict | None = None,
                 seed: int = 0) -> list:
    """Whole-model verification of a written ``.keras`` (:func:`rnnconvert.whole.verify.keras_whole_check.verify_model`): the source model
    run by tf_keras against Keras 3 running ``dst_path``; ``[]`` when ``ckpt`` is not a whole Keras 2 model
    or the output is a ``.weights.h5``. Returns :class:`rnnconvert.verify.checks.LayerCheck` entries."""
    from ..verify import keras_whole_check
    from ...formats.keras.keras3 import whole_model
    from ...formats.keras.sniff import ZIP_MAGIC

    with open(dst_path, "rb") as fh:
        if fh.read(4) != ZIP_MAGIC:
            return []
    full = whole_model(ckpt, dst_path)
    if full is None:
        return []
    from .onnx_whole import source_graph_run

    # one more float32 evaluation order of the source for the spreads: its graph rebuilt in torch
    return keras_whole_check.verify_model(str(src_path), str(dst_path), full, inputs=inputs, seed=seed,
                                          run32=source_graph_run(ckpt, full, double=False),
                                          run64=source_graph_run(ckpt, full))
