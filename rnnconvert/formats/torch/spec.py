"""The PyTorch family's format record: ``.pt``/``.pth`` read by :mod:`.torch_pt` (torch-free zip reader
:mod:`.torch_zip`, TorchScript :mod:`.torchscript`), written by :mod:`.pt_writer` (zip :mod:`.pt_zip`), run by the
``torch`` runtime (:mod:`rnnconvert.runtimes.torch`); the state-dict convention is
:mod:`rnnconvert.conventions.torch_state`."""

from __future__ import annotations

from ...conventions import torch_state
from ...engine.protocol import FormatSpec
from . import pt2_write, pt_write, pt_read

PT = FormatSpec(
    "pt", read=pt_read.read, read_options=("nonlinearity", "map"), lazy=True,
    refusals=torch_state.refusals, check=torch_state.check, write=pt_write.write, open_stream=pt_write.open_stream,
    runtime="torch", load=pt_read.load, release=pt_read.release, route=pt_read.ROUTE)

PT2 = FormatSpec(
    "pt2", refusals=pt2_write.refusals, check=pt2_write.check, write=pt2_write.write,
    write_options=("recurrent_only", "whole_model"), runtime="torch_export", route=pt2_write.ROUTE)
