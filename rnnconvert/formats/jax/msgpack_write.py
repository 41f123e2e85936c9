"""Write canonical layers as a Flax linen parameter tree in ``flax.serialization``'s msgpack (what
``flax.serialization.to_bytes({'params': ...})`` writes), without JAX or Flax; run by the ``flax`` runtime
(:mod:`rnnconvert.runtimes.flax`), which loads the file with ``flax.serialization.msgpack_restore`` and applies
linen cells to it.

Layout (:mod:`.naming`, ``docs/jax.md``): ``params/<layer>/cell`` for a one-layer layer (``nn.RNN(cell)``),
``params/<layer>/forward_rnn/cell`` and ``backward_rnn/cell`` for a bidirectional one (``nn.Bidirectional``),
``params/<layer>/layers_<k>/...`` per stacked layer (``nn.Sequential``'s names); the cells are linen
``LSTMCell``/``OptimizedLSTMCell`` (``ii..io`` kernels, ``hi..ho`` kernels + biases), ``GRUCell`` (``ir iz in``
+ biases, ``hr hz``, ``hn`` + bias), ``SimpleCell`` (``i`` + bias, ``h``); kernels ``(in, H)`` (the canonical
``(G*H, in)`` blocks transposed, bit-exact). Carried tensors go to ``params/<name>`` as they are.

Biases: Flax's LSTM has one bias per gate on the hidden side, so ``b_ih + b_hh`` is written there (one float32
rounding, "R"); the GRU's r and z gates likewise get ``b_ih + b_hh`` on the input side, while ``b_in`` and
``b_hn`` stay apart (exact). Refused (:func:`refusals`): what the cuDNN equations cannot compute
(:func:`rnnconvert.core.cudnn.refusals`: other activations, GRU ``reset_after=False``, peepholes, clips,
``go_backwards``), a projection, and a ReLU simple RNN (Flax's ``activation_fn`` is not stored in the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...core import cudnn, gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer
from ...engine import refusal
from ...errors import require
from . import naming

ROUTE = "Flax linen cells applied to the written file (flax.serialization.msgpack_restore)"
_CLASS = {Cell.LSTM: "LSTMCell", Cell.GRU: "GRUCell", Cell.RNN_TANH: "SimpleCell", Cell.RNN_RELU: "SimpleCell"}


def refusals(layer: RNNLayer) -> list[str]:
    """What Flax's linen cells cannot express about ``layer`` (empty when they can)."""
    why = cudnn.refusals(layer)
    if layer.proj_size:
        why.append("an LSTM projection (Flax's cells have none)")
    if layer.cell is Cell.RNN_RELU:
        why.append("a ReLU simple RNN (SimpleCell's activation_fn is not stored in a Flax file: it would load as tanh)")
    return why


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse what Flax cannot express (one line per layer, with the way out); return notes."""
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "flax_msgpack", f"Flax linen {_CLASS[layer.cell]}")
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': build nn.Bidirectional "
                         "with the matching merge_fn (the file holds parameters only)")
    return notes


def _dense(kernel: np.ndarray, bias: np.ndarray | None = None) -> dict:
    d = {"kernel": np.ascontiguousarray(kernel)}
    if bias is not None:
        d["bias"] = np.ascontiguousarray(bias)
    return d


def cell_params(layer: RNNLayer, p: DirectionParams) -> dict:
    """One direction as a linen cell's parameter map (module docstring)."""
    cell, H = layer.cell, layer.hidden_size
    conv = gates.convention("flax", cell)
    k_i = gates.from_canonical(p.w_ih, conv, cell)  # (in, G*H)
    k_h = gates.from_canonical(p.w_hh, conv, cell)
    b_i = gates.vec_from_canonical(p.b_ih, conv, cell)
    b_h = gates.vec_from_canonical(p.b_hh, conv, cell)
    block = lambda a, g: a[..., g * H:(g + 1) * H]  # noqa: E731
    if cell is Cell.LSTM:
        b = b_i + b_h  # Flax adds one bias per gate, on the hidden side: one rounding
        out = {i: _dense(block(k_i, g)) for g, (i, _) in enumerate(naming.LSTM_GATES)}
        out.update({h: _dense(block(k_h, g), block(b, g)) for g, (_, h) in enumerate(naming.LSTM_GATES)})
        return out
    if cell is Cell.GRU:
        (ir, hr), (iz, hz), (in_, hn) = naming.GRU_GATES
        return {ir: _dense(block(k_i, 0), block(b_i, 0) + block(b_h, 0)),
                iz: _dense(block(k_i, 1), block(b_i, 1) + block(b_h, 1)),
                in_: _dense(block(k_i, 2), block(b_i, 2)),
                hr: _dense(block(k_h, 0)), hz: _dense(block(k_h, 1)),
                hn: _dense(block(k_h, 2), block(b_h, 2))}
    i, h = naming.SIMPLE
    return {i: _dense(k_i, b_i + b_h), h: _dense(k_h)}


def layer_tree(layer: RNNLayer, slabs: list[list[DirectionParams]]) -> dict:
    """``params/<layer>``'s map: ``cell``, ``forward_rnn``/``backward_rnn``, or ``layers_<k>`` of those."""
    def one(dirs: list[DirectionParams]) -> dict:
        if layer.bidirectional:
            return {naming.FORWARD: {naming.CELL: cell_params(layer, dirs[0])},
                    naming.BACKWARD: {naming.CELL: cell_params(layer, dirs[1])}}
        return {naming.CELL: cell_params(layer, dirs[0])}

    if len(slabs) == 1:
        return one(slabs[0])
    return {f"{naming.LAYERS}{k}": one(dirs) for k, dirs in enumerate(slabs)}


def _ext(obj: Any, msgpack: Any) -> Any:
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        return msgpack.ExtType(1, msgpack.packb((list(a.shape), a.dtype.name, a.tobytes("C")), use_bin_type=True))
    raise TypeError(f"cannot write {type(obj).__name__}")


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as ``{'params': {...}}`` in Flax's msgpack (module docstring); assumes :func:`check` passed.
    Returns one line per layer."""
    msgpack = require("msgpack", "jax")
    params: dict[str, Any] = {}
    lines = []
    for i, layer in enumerate(ckpt.layers):
        slabs = [ckpt.slab(i, k) for k in range(layer.num_layers)]
        params[layer.name] = layer_tree(layer, slabs)
        lines.append(f"{layer.name}: Flax linen {_CLASS[layer.cell]} x {layer.num_layers} layer(s)"
                     f"{' (Bidirectional)' if layer.bidirectional else ''} under params/{layer.name}")
    for key, arr in ckpt.tensors.items():
        params.setdefault(key, np.asarray(arr))
    blob = msgpack.packb({"params": params}, default=lambda o: _ext(o, msgpack), use_bin_type=True)
    Path(path).write_bytes(blob)
    return lines


def load(path: str | Path) -> dict:
    """The written file as Flax reads it (``flax.serialization.msgpack_restore``): the ``flax`` runtime's load."""
    serialization = require("flax.serialization", "jax")
    return serialization.msgpack_restore(Path(path).read_bytes())
