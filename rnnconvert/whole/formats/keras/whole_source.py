"""The whole Keras model behind a checkpoint, whichever Keras wrote it (issue #30): a Keras 1/2 full-model HDF5
file (:func:`.keras_whole.read_full_model`, run by tf_keras) or a Keras 3 ``.keras`` archive
(:func:`.keras3.read_full_model`, run by Keras 3), for the whole-model writers' checks
(:mod:`rnnconvert.runtimes.onnxruntime`, :mod:`rnnconvert.whole.runtimes.torch_export`)."""

from __future__ import annotations

from ....core.model import Checkpoint
from ....formats.keras import keras3, keras_whole


def whole_source(ckpt: Checkpoint) -> keras_whole.FullModel | None:
    """The :class:`.keras_whole.FullModel` behind ``ckpt`` (``framework`` ``'tf_keras'`` or ``'keras3'``), or
    ``None`` (weights-only files, archives tf_keras wrote, other formats).

    Raises:
        FormatError: a damaged file (the readers' checks)."""
    if ckpt.format == "keras3":
        return keras3.read_full_model(ckpt)
    return keras_whole.read_full_model(ckpt)
