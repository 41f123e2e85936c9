"""The storage formats' records: tensors without a framework's structure -- safetensors
(:mod:`.safetensors_fmt`), rnnconvert's canonical ``.npz`` (:mod:`.npz_fmt`) and raw cuDNN buffers
(:mod:`.cudnn_npz`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import cudnn_npz, npz_fmt, safetensors_fmt

SAFETENSORS = FormatSpec(
    "safetensors", sniff=safetensors_fmt.sniff, read=safetensors_fmt.read,
    read_options=("nonlinearity", "map"),  # map: tensors under their owner's own names (rnnconvert.core.names)
    lazy=safetensors_fmt.LAZY, check=safetensors_fmt.check, write=safetensors_fmt.write, open_stream=safetensors_fmt.open_stream,
    target_forward=safetensors_fmt.target_forward, target_forward_slab=safetensors_fmt.target_forward_slab,
    target_step=safetensors_fmt.target_step, target_slab_check=safetensors_fmt.target_slab_check,
    route=safetensors_fmt.ROUTE, engine=safetensors_fmt.ENGINE)

CUDNN_NPZ = FormatSpec(
    "cudnn_npz", sniff=cudnn_npz.sniff, read=cudnn_npz.read, refusals=cudnn_npz.refusals, check=cudnn_npz.check,
    write=cudnn_npz.write, target_forward=cudnn_npz.target_forward, target_step=cudnn_npz.target_step,
    route="cudnn_npz")

NPZ = FormatSpec(
    "npz", sniff=npz_fmt.sniff, read=npz_fmt.read, read_options=("nonlinearity", "map"),
    write=npz_fmt.write, open_stream=npz_fmt.open_stream, forget_bias="keep",
    target_forward=npz_fmt.target_forward, target_forward_slab=npz_fmt.target_forward_slab,
    target_step=npz_fmt.target_step, route=npz_fmt.ROUTE, engine=npz_fmt.ENGINE)
