"""The PyTorch family's format record: ``.pt``/``.pth`` read by :mod:`.pt_read` (torch-free zip reader
:mod:`.zip_read`, TorchScript :mod:`.torchscript_read`), written by :mod:`.pt_write` (zip :mod:`.zip_write`), run
by the ``torch`` runtime (:mod:`rnnconvert.runtimes.torch`); the state-dict convention is
:mod:`rnnconvert.conventions.torch_state`. The ``.pt2`` record is the whole-model compiler's
(:mod:`rnnconvert.whole.formats.torch.spec`)."""

from __future__ import annotations

from ...conventions import torch_state
from ...engine.protocol import FormatSpec
from . import pt_write, pt_read

PT = FormatSpec(
    "pt", read=pt_read.read, read_options=("nonlinearity", "map"), lazy=True,
    refusals=torch_state.refusals, check=torch_state.check, write=pt_write.write, open_stream=pt_write.open_stream,
    runtime="torch", load=pt_read.load, release=pt_read.release, route=pt_read.ROUTE)
