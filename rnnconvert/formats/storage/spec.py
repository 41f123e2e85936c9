"""The storage formats' records: tensors without a framework's structure -- safetensors
(:mod:`.safetensors_fmt`, PyTorch names, run by the ``torch`` runtime), rnnconvert's canonical ``.npz``
(:mod:`.npz_fmt`) and raw cuDNN buffers (:mod:`.cudnn_npz`), both read back and run by the ``canonical`` runtime."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import cudnn_npz, npz_fmt, safetensors_fmt

SAFETENSORS = FormatSpec(
    "safetensors", read=safetensors_fmt.read,
    read_options=("nonlinearity", "map"),  # map: tensors under their owner's own names (rnnconvert.core.names)
    lazy=safetensors_fmt.LAZY, check=safetensors_fmt.check,
    write=safetensors_fmt.write, open_stream=safetensors_fmt.open_stream,
    runtime="torch", load=safetensors_fmt.load, route=safetensors_fmt.ROUTE)

CUDNN_NPZ = FormatSpec(
    "cudnn_npz", read=cudnn_npz.read, refusals=cudnn_npz.refusals, check=cudnn_npz.check,
    write=cudnn_npz.write, runtime="canonical", load=cudnn_npz.load, route="cudnn_npz")

NPZ = FormatSpec(
    "npz", read=npz_fmt.read, read_options=("nonlinearity", "map"),
    write=npz_fmt.write, open_stream=npz_fmt.open_stream, forget_bias="keep",
    runtime="canonical", load=npz_fmt.load, route=npz_fmt.ROUTE)
