"""The ``.pt2`` container's record (``pt2``, output only): a ``torch.export`` program of a whole Keras model or
of the recurrent layers, written by :mod:`.pt2_write`, run by the ``torch_export`` runtime
(:mod:`rnnconvert.whole.runtimes.torch_export`). Named by the registry (:mod:`rnnconvert.engine.registry`),
loaded only for a ``.pt2`` target."""

from __future__ import annotations

from ....engine.protocol import FormatSpec
from . import pt2_write

PT2 = FormatSpec(
    "pt2", refusals=pt2_write.refusals, check=pt2_write.check, write=pt2_write.write,
    write_options=("recurrent_only", "whole_model", "states"), runtime="torch_export", route=pt2_write.ROUTE)
