"""The canonical runtime: a written file read back by rnnconvert's own reader (the archive round-trips the
canonical model) and run in ``torch.nn`` where torch can express the layer, else in the numpy reference
(:mod:`rnnconvert.core.reference`); used for files no framework of their own runs (rnnconvert's ``.npz``,
raw cuDNN buffers). This is a re-read check, not an independent framework: the report's route says so.

A container hands it a written file through its :attr:`~rnnconvert.engine.protocol.FormatSpec.load`:
``load(path, name, k) -> RNNLayer``, layer ``name`` read back (``k`` ``None``), or its stacked layer ``k`` alone
as a one-layer layer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ..conventions import torch_state
from ..core import reference
from ..core.model import Checkpoint, RNNLayer
from ..engine.protocol import Runtime
from ..errors import require
from ..speed.kernels import FAST
from . import torch as torch_rt


def run(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    """``layer`` on ``x`` ``(B, T, I)`` in ``torch.nn`` when torch can express it, else the numpy reference;
    float64 ``(B, T, dirs*out)``."""
    if torch_state.refusals(layer):
        return reference.forward(layer, x, kernels=FAST)
    torch = require("torch", "torch")
    sd = torch_state.state_dict(Checkpoint(layers=[layer]))
    return torch_rt.run_module(layer, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, x)


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Layer ``name`` read back from ``path`` and run (:func:`run`)."""
    return run(load(path, name, None), x)


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` alone, read back (only its members are read), on its input ``x``;
    the output in input time order (:func:`rnnconvert.core.reference.forward_slab`)."""
    layer = load(path, name, k)
    if layer.semantics.go_backwards and not layer.bidirectional:
        return reference.forward_slab(layer, layer.params[0], x, kernels=FAST)  # forward() would flip the time axis
    return run(layer, x)


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """One step of stacked layer ``k`` of layer ``name`` read back, from each state: in ``torch.nn`` when torch can
    express it and is installed, else the numpy reference step on the re-read arrays."""
    layer = load(path, name, k)  # stacked layer k alone, as a one-layer layer
    if torch_state.refusals(layer) or importlib.util.find_spec("torch") is None:
        return [reference.step(layer, p, x, s[0], s[1], kernels=FAST) for p, s in zip(layer.params[0], states)]
    return torch_rt.step_canonical(layer, 0, x, states)


RUNTIME = Runtime("canonical", engine="torch", forward=forward, forward_slab=forward_slab, step=step)
