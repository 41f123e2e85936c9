"""The PyTorch family's format record: ``.pt``/``.pth`` read by :mod:`.torch_pt` (torch-free zip reader
:mod:`.torch_zip`, TorchScript :mod:`.torchscript`), written by :mod:`.pt_writer` (zip :mod:`.pt_zip`), run by the
``torch`` runtime (:mod:`rnnconvert.runtimes.torch`); the state-dict convention is
:mod:`rnnconvert.conventions.torch_state`."""

from __future__ import annotations

from ...conventions import torch_state
from ...engine.protocol import FormatSpec
from . import torch_pt

PT = FormatSpec(
    "pt", read=torch_pt.read, read_options=("nonlinearity", "map"), lazy=True,
    refusals=torch_state.refusals, check=torch_state.check, write=torch_pt.write, open_stream=torch_pt.open_stream,
    runtime="torch", load=torch_pt.load, release=torch_pt.release, route=torch_pt.ROUTE)
