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


#: linen cells' parameter names (``flax/linen/recurrent.py``, flax 0.12.8: the names of
#: rnnconvert.formats.jax.naming, which a runtime does not import): LSTMCell/OptimizedLSTMCell, GRUCell, SimpleCell
LINEN_CELLS = (frozenset({"ii", "if", "ig", "io", "hi", "hf", "hg", "ho"}), frozenset({"ir", "iz", "in", "hr", "hz", "hn"}),
               frozenset({"i", "h"}))


def _is_cell(o) -> bool:
    return isinstance(o, dict) and frozenset(o) in LINEN_CELLS


def _source_slabs(o, where: str) -> list[list[dict]]:
    """The linen cells' parameter maps under a source layer's subtree ``o``, one list of directions per stacked
    layer: a cell itself, ``nn.RNN``'s ``{'cell': ...}``, ``nn.Bidirectional``'s ``forward_rnn``/``backward_rnn``
    (beside other parameters too), ``nn.Sequential``'s ``layers_<k>`` of those.

    Raises:
        UnsupportedError: anything else under the path (an NNX state: ``if_``, ``dense_i``/``dense_h``)."""
    from ..errors import UnsupportedError

    if _is_cell(o):
        return [[o]]
    if isinstance(o, dict) and set(o) == {"cell"} and _is_cell(o["cell"]):
        return [[o["cell"]]]
    if isinstance(o, dict) and all(_is_cell((o.get(d) or {}).get("cell")) for d in ("forward_rnn", "backward_rnn")):
        return [[o["forward_rnn"]["cell"], o["backward_rnn"]["cell"]]]
    n = len(o) if isinstance(o, dict) else 0
    if n > 1 and set(o) == {f"{LAYERS}{k}" for k in range(n)}:
        return [_source_slabs(o[f"{LAYERS}{k}"], where)[0] for k in range(n)]
    raise UnsupportedError(f"{where}: --verify framework runs Flax linen cells (LSTMCell, GRUCell, SimpleCell), "
                           "and this is not one (an NNX state?); verify without --verify framework")


def framework_forward(src_path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Layer ``name`` of a Flax msgpack *source* file run by Flax (``--verify framework``): the file restored by
    ``flax.serialization.msgpack_restore``, the layer's subtree found at the keys the reader recorded
    (``layer.source['keys']``, rnnconvert.formats.jax.msgpack_read), each direction's linen cell (``LSTMCell`` -- ``OptimizedLSTMCell`` stores the same
    parameters and computes the same function --, ``GRUCell``, ``SimpleCell``) applied with those parameters as
    they are, step by step from zero carries (as the target side's :func:`forward`; the backward cell of an
    ``nn.Bidirectional`` in reverse, outputs in input order, directions concatenated): float64
    ``(B, T, dirs*H)`` on ``x`` ``(B, T, I)``. The source side then owes nothing to rnnconvert's transposes and
    block stacking of the cells' Dense kernels.

    Raises:
        DependencyError: JAX/Flax are not installed. UnsupportedError: an NNX state or a Haiku tree (no linen
        cells to apply)."""
    nn = _nn()
    from flax import serialization

    from ..errors import UnsupportedError

    layer = ckpt.layer(name)
    src = layer.source
    where, keys = str(src.get("path", name)), src.get("keys")
    if src.get("format") != "flax_msgpack" or keys is None:
        raise UnsupportedError(f"layer '{name}': --verify framework runs Flax linen cells, and this layer was not "
                               "read from a Flax parameter tree; verify without --verify framework")
    o = serialization.msgpack_restore(Path(src_path).read_bytes())
    for key in keys:
        o = o.get(key) if isinstance(o, dict) else None
    h = np.asarray(x)
    for dirs in _source_slabs(o, where):
        h = np.concatenate([_run_dir(nn, layer, params, h, d == 1) for d, params in enumerate(dirs)], axis=-1)
    return h


RUNTIME = Runtime("flax", engine="flax", forward=forward, forward_slab=forward_slab, step=step,
                  framework_forward=framework_forward)
