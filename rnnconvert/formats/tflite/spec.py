"""The TensorFlow Lite / LiteRT family's record: ``.tflite`` flatbuffers whose fused
``UNIDIRECTIONAL_SEQUENCE_LSTM`` ops and the Keras cells in ``WHILE`` loops are read by :mod:`.tflite_read`
and :mod:`.tflite_while` (the ``tflite`` schema package, no interpreter) and written by :mod:`.tflite_write`; a
written file is run by the ``tflite`` runtime (:mod:`rnnconvert.runtimes.tflite`: ``tf.lite.Interpreter``), which
opens the file itself (no ``load``)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import tflite_read, tflite_write

TFLITE = FormatSpec(
    "tflite", read=tflite_read.read, read_options=("cell_clip",), refusals=tflite_write.refusals,
    check=tflite_write.check, write=tflite_write.write, write_options=("batch",), runtime="tflite",
    route=tflite_write.ROUTE)
