"""The ONNX family's format record: read by :mod:`.onnx_read`, written by :mod:`.onnx_fmt`, run by the
``onnxruntime`` runtime (:mod:`rnnconvert.runtimes.onnxruntime`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import onnx_fmt, onnx_read

ONNX = FormatSpec(
    "onnx", read=onnx_read.read, lazy=True, refusals=onnx_fmt.refusals, check=onnx_fmt.check,
    write=onnx_fmt.write, open_stream=onnx_fmt.open_stream, write_options=("external_data", "external_min_bytes"),
    runtime="onnxruntime", route=onnx_fmt.ROUTE)
