"""The ONNX family's format record: read by :mod:`.onnx_read`, written and run (onnxruntime) by
:mod:`.onnx_fmt`."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import onnx_fmt, onnx_read

ONNX = FormatSpec(
    "onnx", sniff=onnx_fmt.sniff, read=onnx_read.read, lazy=True, refusals=onnx_fmt.refusals, check=onnx_fmt.check,
    write=onnx_fmt.write, open_stream=onnx_fmt.open_stream, write_options=("external_data", "external_min_bytes"),
    target_forward=onnx_fmt.target_forward, target_forward_slab=onnx_fmt.target_forward_slab,
    target_step=onnx_fmt.target_step, release=onnx_fmt.release,
    route=onnx_fmt.ROUTE, engine=onnx_fmt.ENGINE)
