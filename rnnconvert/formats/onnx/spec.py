"""The ONNX family's format record: read by :mod:`.onnx_read`, written by :mod:`.onnx_write` (a whole Keras model
by :mod:`rnnconvert.whole.formats.onnx.model_write`, loaded only then), run by the ``onnxruntime`` runtime
(:mod:`rnnconvert.runtimes.onnxruntime`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import onnx_write, onnx_read

ONNX = FormatSpec(
    "onnx", read=onnx_read.read, lazy=True, refusals=onnx_write.refusals, check=onnx_write.container_check,
    write=onnx_write.container_write, open_stream=onnx_write.open_stream,
    write_options=("external_data", "external_min_bytes", "recurrent_only", "whole_model", "mask_layout",
                   "runtime", "states"),
    runtime="onnxruntime", route=onnx_write.ROUTE)
