"""The OpenVINO record (``openvino``): IR ``LSTMSequence``/``GRUSequence``/``RNNSequence`` nodes (:mod:`.ir_read`,
:mod:`.ir_write`), run by the ``openvino`` runtime (:mod:`rnnconvert.runtimes.openvino`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import ir_read, ir_write

OPENVINO = FormatSpec(
    "openvino", read=ir_read.read, refusals=ir_write.refusals, check=ir_write.check, write=ir_write.write,
    runtime="openvino", route=ir_write.ROUTE)
