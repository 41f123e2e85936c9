"""The PaddlePaddle record (``paddle``): ``paddle.save`` state dicts of ``paddle.nn.LSTM``/``GRU``/``SimpleRNN``
(:mod:`.pdparams_read`, :mod:`.pdparams_write`). A written file is verified by the ``paddle`` runtime: Paddle
itself (``paddle.load`` into ``paddle.nn`` layers) with the ``paddle`` extra (paddlepaddle, 721 MiB); without
it, by the ``torch`` runtime on its tensors as rnnconvert's reader reads them back (Paddle's cells compute
PyTorch's equations), the report's route saying so (:mod:`rnnconvert.runtimes.paddle`); by the numpy
reference without either."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import pdparams_read, pdparams_write

PADDLE = FormatSpec(
    "paddle", read=pdparams_read.read, read_options=("nonlinearity",),
    refusals=pdparams_write.refusals, check=pdparams_write.check, write=pdparams_write.write,
    runtime="paddle", load=pdparams_read.load, route=pdparams_write.ROUTE)
