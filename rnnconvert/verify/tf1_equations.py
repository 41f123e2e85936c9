"""TF1 cell equations on the TF1 tensors as stored: the source side of verification for TF checkpoints (the
``tf_equations`` runtime, :data:`RUNTIME`), and the target side of a written TF1 checkpoint read back by
TensorFlow (:func:`forward`).

Independent of the conversion code: it never uses the canonical parameters or the permutations of
:mod:`rnnconvert.core.gates`, only the gate *letters* of the ``tf1``/``tf1_gates`` table entries. It
applies TF's ``[x, h] @ kernel + bias`` forms (tf_keras ``layers/rnn/legacy_cells.py`` =
TF1 ``rnn_cell_impl.py``; LAYOUTS §8.1-8.4, §9.3):

* LSTMCell/BasicLSTMCell/LSTMBlockCell/CudnnCompatibleLSTMCell: ``i, j, f, o`` columns;
  ``c = σ(f + forget_bias + p_f c) c + σ(i + p_i c) tanh(j)``; clip; ``m = σ(o + p_o c) tanh(c)``;
  ``m = m @ projection`` then ``proj_clip``.
* GRUCell: ``r, u = σ([x, h] @ gates/kernel + gates/bias)``; ``c = tanh([x, r h] @ candidate/kernel + b)``;
  ``h = u h + (1 - u) c``. CudnnCompatibleGRUCell: ``c = tanh(x W_i + b_i + r (h W_h + b_h))``.
* BasicRNNCell: ``h = act([x, h] @ kernel + bias)``.
"""

from __future__ import annotations

import numpy as np

from ..core.gates import convention
from ..core.model import Cell, RNNLayer
from ..core.reference import ACT
from ..engine.protocol import Runtime
from ..formats.tf import naming as n
from . import keras_equations

sig = ACT["sigmoid"]


def _cols(m: np.ndarray, order: str, H: int) -> dict[str, np.ndarray]:
    return {g: m[..., j * H:(j + 1) * H] for j, g in enumerate(order)}


def _run(cname: str, raw: dict, layer: RNNLayer, x: np.ndarray, reverse: bool, dt) -> np.ndarray:
    s, H = layer.semantics, layer.hidden_size
    act = ACT[s.activation]
    v = {k: np.asarray(a, dt) for k, a in raw.items()}
    B, T, _ = x.shape
    h = np.zeros((B, layer.output_size), dt)
    c = np.zeros((B, H), dt)
    out = np.zeros((B, T, layer.output_size), dt)
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        xt = x[:, t]
        if "lstm" in cname:
            z = _cols(np.concatenate([xt, h], 1) @ v[n.KERNEL] + v[n.BIAS], convention("tf1", Cell.LSTM).gate_order, H)
            pi, pf, po = (v.get(n.peephole(g), 0.0) for g in "ifo")
            c = sig(z["f"] + s.forget_bias + pf * c) * c + sig(z["i"] + pi * c) * act(z["g"])
            if s.cell_clip is not None:
                c = np.clip(c, -s.cell_clip, s.cell_clip)
            h = sig(z["o"] + po * c) * act(c)
            if n.PROJECTION_KERNEL in v:
                h = h @ v[n.PROJECTION_KERNEL]
                if s.proj_clip is not None:
                    h = np.clip(h, -s.proj_clip, s.proj_clip)
        elif "gru" in cname:
            g = _cols(sig(np.concatenate([xt, h], 1) @ v[n.GATES_KERNEL] + v[n.GATES_BIAS]),
                      convention("tf1_gates", Cell.GRU).gate_order, H)
            r, u = g["r"], g["z"]
            if cname.startswith("cudnn"):
                cand = act(xt @ v[n.CAND_INPUT_KERNEL] + v[n.CAND_INPUT_BIAS]
                           + r * (h @ v[n.CAND_HIDDEN_KERNEL] + v[n.CAND_HIDDEN_BIAS]))
            else:
                cand = act(np.concatenate([xt, r * h], 1) @ v[n.CANDIDATE_KERNEL] + v[n.CANDIDATE_BIAS])
            h = u * h + (1.0 - u) * cand
        else:
            h = act(np.concatenate([xt, h], 1) @ v[n.KERNEL] + v[n.BIAS])
        out[:, t] = h
    return out


def tf1_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64, raw: list | None = None) -> np.ndarray:
    """Run a TF1-checkpoint layer from its stored TF1 tensors (``raw``, else ``layer.source['raw']``: one
    mapping per pseudo-layer); output convention of :func:`rnnconvert.core.reference.forward`. ``layer`` is
    not changed."""
    raws, cname = layer.source["raw"] if raw is None else raw, layer.source["class_name"]
    y = np.asarray(x, dtype=dtype)
    for k in range(layer.num_layers):
        outs = [_run(cname, raws[k * layer.num_directions + d], layer, y, d == 1, dtype)
                for d in range(layer.num_directions)]
        y = np.concatenate(outs, axis=-1)
    return y


def source_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64, raw: list | None = None) -> np.ndarray:
    """A TF checkpoint's layer on its own equations: the source side of verification, from the tensors as stored (``raw``, else ``layer.source['raw']``):
    TF1 cell equations (:func:`tf1_forward`) for TF1 cells, Keras equations (:mod:`.keras_equations`) for TF2
    Keras layers."""
    if layer.source.get("class_name") in n.CELL_SCOPES:
        fwd = tf1_forward
    else:
        fwd = keras_equations.source_forward
    return fwd(layer, x, dtype, raw)


def source_forward_multi(layer: RNNLayer, xs: list[np.ndarray], raw: list | None = None,
                         record: list[dict] | None = None) -> list[np.ndarray]:
    """:func:`source_forward` of each input of ``xs`` in its own dtype: a TF2 Keras layer's in lockstep
    (:func:`rnnconvert.verify.keras_equations.source_forward_multi`: each stored tensor turned once and read once
    per product for all dtypes, and ``record`` filled with the states of ``xs[0]``'s run), a TF1 cell's one dtype
    after the other (``record`` left empty)."""
    if layer.source.get("class_name") in n.CELL_SCOPES:
        fwd = tf1_forward
        return [fwd(layer, x, x.dtype, raw) for x in xs]
    return keras_equations.source_forward_multi(layer, xs, raw, record)


def forward(path, ckpt, name: str, x: np.ndarray, load) -> np.ndarray:
    """A written TF1 checkpoint's layer ``name``: its tensors as TensorFlow reads them back (the container's
    ``load(path, ckpt, name) -> RNNLayer``, with the TF1 source's run-time clips) through the TF1 cell equations
    (:func:`tf1_forward`); float64. Its one-step check is the numpy reference on those arrays (no TF1 cell runs in
    TensorFlow 2 without tf_keras' legacy layers)."""
    return tf1_forward(load(path, ckpt, name), x, np.float64)


RUNTIME = Runtime("tf_equations", engine="tensorflow", forward=forward, source_forward=source_forward,
                  source_forward_multi=source_forward_multi)
