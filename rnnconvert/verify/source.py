"""Verification's source side (:mod:`.engine`): the source's own equations on its stored tensors where its
container declares them (:attr:`rnnconvert.engine.protocol.FormatSpec.equations`), else the numpy reference on
the canonical parameters; the source framework itself for ``--verify framework``; the words the report uses."""

from __future__ import annotations

import numpy as np

from ..core import reference
from ..core.model import Checkpoint, RNNLayer
from ..errors import VerificationError
from ..speed.kernels import FAST


def own_equations(src_module, layer: RNNLayer) -> bool:
    """Whether the source format can run ``layer`` from its own stored tensors (``source_forward``)."""
    return src_module.source_forward is not None and layer.source.get("raw") is not None


def run(src_module, layer: RNNLayer, xs: list[np.ndarray], raw: list | None = None,
            record: list[dict] | None = None) -> list[np.ndarray]:
    """The source side of the sequence comparison for ``layer`` on each input of ``xs`` (float32 and float64,
    each computed in its own dtype): the source format's own equations on its stored tensors
    (``source_forward``), else the numpy reference on the canonical parameters. ``record``: one dict per
    direction that a format's ``source_forward_multi`` fills with the states of ``xs[0]``'s run where it can
    (Keras equations), else leaves empty."""
    if own_equations(src_module, layer):
        multi = src_module.source_forward_multi
        if multi is not None:
            return multi(layer, xs, raw, record)
        return [src_module.source_forward(layer, x, x.dtype, raw) for x in xs]
    return reference.forward_multi(layer, xs, kernels=FAST)


def route(src_module, layer: RNNLayer, mode: str) -> str:
    seq = ("source framework" if mode == "framework" else
           "source equations (numpy)" if own_equations(src_module, layer) else "numpy reference")
    return f"numpy float64 equations (one step); {seq} (sequence)"


def framework_run(src_module, src_path, src_ckpt: Checkpoint, layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    fw = src_module.framework_forward
    if fw is None:
        raise VerificationError(f"--verify framework is not available for {src_module.name}")
    return fw(src_path, src_ckpt, layer.name, x)
