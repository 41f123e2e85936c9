"""The TensorFlow Lite / LiteRT family's record: ``.tflite`` flatbuffers whose fused
``UNIDIRECTIONAL_SEQUENCE_LSTM`` ops are read by :mod:`.tflite_read` (the ``tflite`` schema package, no
interpreter). A source format here: no writer yet, so no runtime of its own (verification runs the written
target against the numpy reference of the layers as read)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import tflite_read

TFLITE = FormatSpec("tflite", read=tflite_read.read, read_options=("cell_clip",))
