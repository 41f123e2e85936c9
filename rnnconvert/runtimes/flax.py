"""The Flax runtime: Flax linen cells (JAX on the CPU) applied to a written Flax msgpack file (verification's
target side for ``flax_msgpack``).

A container hands this runtime a written file through its :attr:`~rnnconvert.engine.protocol.FormatSpec.load`:
``load(path) -> tree``, the file as ``flax.serialization.msgpack_restore`` reads it; layer ``name`` is
``tree['params'][name]``: ``cell`` (``nn.RNN(cell)``), ``forward_rnn``/``backward_rnn`` (``nn.Bidirectional``,
the backward one run with ``reverse=True, keep_order=True``, outputs concatenated) or ``layers_<k>`` of those
(stacked, applied in order). The cell class comes from the canonical layer (``LSTMCell``, ``GRUCell``,
``SimpleCell``; ``features`` = H); every step is the Flax cell's own ``apply`` on the file's parameters, the
carry threaded through time here as ``nn.RNN`` threads it (eagerly: ``nn.RNN`` compiles a scan per input shape,
seconds each). JAX is imported inside the functions.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..core.model import Cell, Checkpoint
from ..engine.protocol import Runtime
from ..errors import require

LAYERS = "layers_"


def _nn():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    require("jax", "jax")
    return require("flax.linen", "jax")


def _cell(nn, cell: Cell, hidden: int, dtype):
    cls = {Cell.LSTM: nn.LSTMCell, Cell.GRU: nn.GRUCell, Cell.RNN_TANH: nn.SimpleCell}[cell]
    return cls(features=hidden, param_dtype=dtype, dtype=dtype)


_STEPPERS: dict = {}


def _stepper(nn, cell: Cell, hidden: int, dt):
    """``jax.jit`` of the Flax cell's ``apply(params, carry, x)`` (compiled once per shape, not per op)."""
    key = (cell, hidden, np.dtype(dt).str)
    if key not in _STEPPERS:
        import jax

        mod = _cell(nn, cell, hidden, dt)
        _STEPPERS[key] = jax.jit(lambda params, carry, x: mod.apply({"params": params}, carry, x))
    return _STEPPERS[key]


def _slabs(tree: dict, name: str, n: int) -> list[dict]:
    sub = tree["params"][name]
    return [sub[f"{LAYERS}{k}"] for k in range(n)] if n > 1 else [sub]


def _run_dir(nn, layer, params: dict, x: np.ndarray, reverse: bool) -> np.ndarray:
    """One direction: the Flax cell applied step by step from a zero carry (what ``nn.RNN`` scans, without
    compiling a scan per shape); outputs in input time order."""
    import jax.numpy as jnp

    dt = np.dtype(layer.dtype)
    run = _stepper(nn, layer.cell, layer.hidden_size, dt)
    B, T = x.shape[:2]
    h = jnp.zeros((B, layer.hidden_size), dt)
    carry = (h, h) if layer.cell is Cell.LSTM else h
    xs = jnp.asarray(np.asarray(x, dtype=dt))
    out = [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        carry, y = run(params, carry, xs[:, t])
        out[t] = np.asarray(y, dtype=np.float64)
    return np.stack(out, axis=1) if T else np.zeros((B, 0, layer.hidden_size))


def _run_slab(nn, layer, slab: dict, x: np.ndarray) -> np.ndarray:
    if layer.bidirectional:  # nn.Bidirectional: backward with reverse=True, keep_order=True; concatenated
        return np.concatenate([_run_dir(nn, layer, slab["forward_rnn"]["cell"], x, False),
                               _run_dir(nn, layer, slab["backward_rnn"]["cell"], x, True)], axis=-1)
    return _run_dir(nn, layer, slab["cell"], x, False)


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Layer ``name`` of the written file in Flax on ``x`` ``(B, T, I)`` from zero states; float64
    ``(B, T, dirs*H)``."""
    nn = _nn()
    layer = ckpt.layer(name)
    h = x
    for slab in _slabs(load(path), name, layer.num_layers):
        h = _run_slab(nn, layer, slab, h)
    return h


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` alone on its input ``x``."""
    layer = ckpt.layer(name)
    return _run_slab(_nn(), layer, _slabs(load(path), name, layer.num_layers)[k], x)


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """One step of stacked layer ``k`` through the Flax cell from each state (linen LSTM carries are
    ``(c, h)``); ``[(h1, c1 or None)]`` per direction, float64."""
    nn = _nn()  # DependencyError (verification then falls back, saying so) where JAX/Flax are not installed
    import jax.numpy as jnp
    layer = ckpt.layer(name)
    slab = _slabs(load(path), name, layer.num_layers)[k]
    dt = np.dtype(layer.dtype)
    cells = [slab["forward_rnn"]["cell"], slab["backward_rnn"]["cell"]] if layer.bidirectional else [slab["cell"]]
    run = _stepper(nn, layer.cell, layer.hidden_size, dt)
    xs = jnp.asarray(np.asarray(x, dtype=dt))
    out = []
    for params, (h0, c0) in zip(cells, states):
        h = jnp.asarray(np.asarray(h0, dtype=dt))
        carry = (jnp.asarray(np.asarray(c0, dtype=dt)), h) if layer.cell is Cell.LSTM else h
        new, _ = run(params, carry, xs)
        if layer.cell is Cell.LSTM:
            out.append((np.asarray(new[1], np.float64), np.asarray(new[0], np.float64)))
        else:
            out.append((np.asarray(new, np.float64), None))
    return out


RUNTIME = Runtime("flax", engine="flax", forward=forward, forward_slab=forward_slab, step=step)
