"""The PyTorch family's format record: ``.pt``/``.pth`` read by :mod:`.torch_pt` (torch-free zip reader
:mod:`.torch_zip`, TorchScript :mod:`.torchscript`), written by :mod:`.pt_writer` (zip :mod:`.pt_zip`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import torch_pt

PT = FormatSpec(
    "pt", sniff=torch_pt.sniff, read=torch_pt.read, read_options=("nonlinearity", "map"), lazy=True,
    refusals=torch_pt.refusals, check=torch_pt.check, write=torch_pt.write, open_stream=torch_pt.open_stream,
    target_forward=torch_pt.target_forward, target_forward_slab=torch_pt.target_forward_slab,
    target_step=torch_pt.target_step, target_slab_check=torch_pt.target_slab_check, release=torch_pt.release,
    route=torch_pt.ROUTE, engine=torch_pt.ENGINE)
