"""The PaddlePaddle record (``paddle``): ``paddle.save`` state dicts of ``paddle.nn.LSTM``/``GRU``/``SimpleRNN``
(:mod:`.pdparams_read`, :mod:`.pdparams_write`). PaddlePaddle is not an rnnconvert dependency (~720 MiB): a
written file is verified by the ``torch`` runtime on its tensors as rnnconvert's reader reads them back
(Paddle's cells compute PyTorch's equations), or by the numpy reference without torch."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import pdparams_read, pdparams_write

PADDLE = FormatSpec(
    "paddle", read=pdparams_read.read, read_options=("nonlinearity",),
    refusals=pdparams_write.refusals, check=pdparams_write.check, write=pdparams_write.write,
    runtime="torch", load=pdparams_read.load, route=pdparams_write.ROUTE)
