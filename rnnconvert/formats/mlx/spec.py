"""The MLX record (``mlx``): ``mlx.nn`` recurrent modules' weights (:mod:`.mlx_read`, :mod:`.mlx_write`), run by
the ``mlx`` runtime (:mod:`rnnconvert.runtimes.mlx`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import mlx_read, mlx_write

MLX = FormatSpec(
    "mlx", read=mlx_read.read, read_options=("orientation", "nonlinearity"),
    refusals=mlx_write.refusals, check=mlx_write.check, write=mlx_write.write,
    runtime="mlx", route=mlx_write.ROUTE)
