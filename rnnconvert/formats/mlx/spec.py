"""The MLX record (``mlx``): ``mlx.nn`` recurrent modules' weights (:mod:`.mlx_read`, :mod:`.mlx_write`), run by
the ``mlx`` runtime (:mod:`rnnconvert.runtimes.mlx`), which also runs an MLX source file for ``--verify framework``."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import mlx_read, mlx_write

MLX = FormatSpec(
    "mlx", read=mlx_read.read, read_options=("orientation", "nonlinearity"),
    refusals=mlx_write.refusals, check=mlx_write.check, write=mlx_write.write,
    runtime="mlx", route=mlx_write.ROUTE, framework="mlx")
