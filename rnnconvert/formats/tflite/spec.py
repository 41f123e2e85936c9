"""The TensorFlow Lite / LiteRT family's record: ``.tflite`` flatbuffers whose fused
``UNIDIRECTIONAL_SEQUENCE_LSTM`` ops and the Keras cells in ``WHILE`` loops are read by :mod:`.tflite_read`
and :mod:`.tflite_while` (the ``tflite`` schema package, no interpreter) and written by :mod:`.tflite_write`; a
written file is run by the ``tflite`` runtime (:mod:`rnnconvert.runtimes.tflite`: ``tf.lite.Interpreter``), which
opens the file itself (no ``load``). A whole Keras 1/2 model (the write option ``whole_model``) is written by
TensorFlow Lite's converter (:mod:`rnnconvert.whole.formats.tflite.model_write`, loaded only then) and checked by
the runtime's ``verify_whole`` (:mod:`rnnconvert.whole.runtimes.tflite_whole`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import tflite_read, tflite_write

TFLITE = FormatSpec(
    "tflite", read=tflite_read.read, read_options=("cell_clip",), refusals=tflite_write.refusals,
    check=tflite_write.container_check, write=tflite_write.container_write,
    write_options=("batch", "recurrent_only", "whole_model"), runtime="tflite",
    route=tflite_write.ROUTE)
