"""Writing TF1 name-based checkpoints (the ``write`` verb of the ``tf_checkpoint`` format).

The output is a directory holding ``ckpt.index``, ``ckpt.data-00000-of-00001`` and a ``checkpoint``
file, written by TensorFlow's own ``tf.compat.v1.train.Saver``. Per layer ``N`` the cell chosen is the
one that expresses the layer exactly (names: LAYOUTS §8, §9.3):

======================================  =====================================================
layer                                   TF1 cell scope written
======================================  =====================================================
LSTM (no peepholes/projection/clip)     ``cudnn_compatible_lstm_cell`` (forget_bias 0; what
                                        ``CudnnLSTM`` checkpoints hold and LSTMBlockCell restores)
LSTM with peepholes, projection, clip   ``lstm_cell`` (LSTMCell; forget bias stored minus 1.0 so
                                        ``LSTMCell``'s default ``forget_bias=1.0`` reproduces it)
GRU ``reset_after=True``                ``cudnn_compatible_gru_cell``
GRU ``reset_after=False``               ``gru_cell`` (GRUCell)
RNN                                     ``basic_rnn_cell``
======================================  =====================================================

Scopes: ``N/rnn/multi_rnn_cell/cell_k/<cell>`` (unidirectional; also for one layer, as the CudnnRNN
saveable writes it) and ``N/stack_bidirectional_rnn/cell_k/bidirectional_rnn/{fw,bw}/<cell>``.
Kernels are ``(in + H_rec, G*H)`` with TF1 gate columns (``("tf1", LSTM)`` i, j, f, o; GRU gates r, u);
single biases are ``b_ih + b_hh`` (one rounding).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ...core import gates
from ...errors import FormatError, require
from ...core.model import Cell, Checkpoint, RNNLayer
from . import naming
from ...speed import transpose


def refusals(layer: RNNLayer) -> list[str]:
    """What TF1 cells cannot express about ``layer`` (empty when a TF1 checkpoint can hold it)."""
    s = layer.semantics
    why = []
    if layer.cell in (Cell.LSTM, Cell.GRU) and s.gate_activation != "sigmoid":
        why.append(f"gate activation {s.gate_activation} (TF1 cells use sigmoid)")
    if layer.cell is not Cell.RNN_RELU and s.activation != "tanh":
        why.append(f"activation {s.activation} (the TF1 cells written use their default tanh)")
    if layer.cell is Cell.RNN_RELU:
        why.append("relu activation (not recorded in a checkpoint)")
    if s.go_backwards and not layer.bidirectional:
        why.append("go_backwards=True")
    return why


def _cell_for(layer: RNNLayer) -> str:
    from ...engine import refusal

    s = layer.semantics
    refusal.refuse(layer, refusals(layer), "tf_checkpoint", "a TF1 checkpoint")
    peep = layer.params[0][0].peep is not None
    if layer.cell is Cell.LSTM:
        plain = not (peep or layer.proj_size or s.cell_clip is not None or s.proj_clip is not None)
        return "cudnn_compatible_lstm_cell" if plain else "lstm_cell"
    if layer.cell is Cell.GRU:
        return "cudnn_compatible_gru_cell" if s.reset_after else "gru_cell"
    return "basic_rnn_cell"


def fresh_directory(path: str | Path) -> Path:
    """Make ``path`` an empty directory (a directory-format writer's temporary output), removing what is there."""
    p = Path(path)
    if p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    p.mkdir()
    return p


def check(ckpt: Checkpoint, **_) -> list[str]:
    """Refuse what TF1 cells cannot express; notes for run-time options the user must set."""
    notes = []
    for layer in ckpt.layers:
        cell = _cell_for(layer)
        s = layer.semantics
        if cell == "lstm_cell" and (s.cell_clip is not None or s.proj_clip is not None):
            notes.append(f"{layer.name}: build LSTMCell(cell_clip={s.cell_clip}, proj_clip={s.proj_clip}): "
                         "clipping is not stored in checkpoints")
    return notes


def _variables(layer: RNNLayer, cell: str) -> dict[str, np.ndarray]:
    """``{variable name: value}`` of one layer in TF1 layout."""
    if cell == "lstm_cell":  # LSTMCell's default forget_bias=1.0 is added at run time: stored as b_f - 1.0
        sl = gates.gate_slice(Cell.LSTM, "f", layer.hidden_size)
    out = {}
    H = layer.hidden_size
    for k, dirs in enumerate(layer.params):
        for d, p in enumerate(dirs):
            scope = naming.cell_scope(layer.name, k, d, cell, layer.bidirectional)
            b = p.b_ih + p.b_hh
            if layer.cell is Cell.LSTM:
                conv = gates.convention("tf1", Cell.LSTM)
                if cell == "lstm_cell":
                    b = b.copy()
                    b[sl] = b[sl] - np.asarray(1.0, b.dtype)
                out[f"{scope}/{naming.KERNEL}"] = np.concatenate([transpose.from_canonical(p.w_ih, conv, Cell.LSTM),
                                                         transpose.from_canonical(p.w_hh, conv, Cell.LSTM)], axis=0)
                out[f"{scope}/{naming.BIAS}"] = gates.vec_from_canonical(b, conv, Cell.LSTM)
                if p.w_hr is not None:
                    out[f"{scope}/{naming.PROJECTION_KERNEL}"] = np.ascontiguousarray(p.w_hr.T)
                if p.peep is not None:
                    for j, g in enumerate("ifo"):
                        out[f"{scope}/{naming.peephole(g)}"] = p.peep[j].copy()
            elif layer.cell is Cell.GRU:
                order = gates.convention("tf1_gates", Cell.GRU).gate_order  # r, u(z)
                rows = {g: gates.gate_slice(Cell.GRU, g, H) for g in "rzn"}
                gk = np.concatenate([np.concatenate([p.w_ih[rows[g]] for g in order]).T,
                                     np.concatenate([p.w_hh[rows[g]] for g in order]).T], axis=0)
                out[f"{scope}/{naming.GATES_KERNEL}"] = np.ascontiguousarray(gk)
                out[f"{scope}/{naming.GATES_BIAS}"] = np.concatenate([b[rows[g]] for g in order])
                n = rows["n"]
                if cell == "gru_cell":
                    out[f"{scope}/{naming.CANDIDATE_KERNEL}"] = np.ascontiguousarray(
                        np.concatenate([p.w_ih[n], p.w_hh[n]], axis=1).T)
                    out[f"{scope}/{naming.CANDIDATE_BIAS}"] = b[n].copy()
                else:
                    out[f"{scope}/{naming.CAND_INPUT_KERNEL}"] = np.ascontiguousarray(p.w_ih[n].T)
                    out[f"{scope}/{naming.CAND_INPUT_BIAS}"] = p.b_ih[n].copy()
                    out[f"{scope}/{naming.CAND_HIDDEN_KERNEL}"] = np.ascontiguousarray(p.w_hh[n].T)
                    out[f"{scope}/{naming.CAND_HIDDEN_BIAS}"] = p.b_hh[n].copy()
            else:
                conv = gates.convention("tf1", layer.cell)
                out[f"{scope}/{naming.KERNEL}"] = np.concatenate([transpose.from_canonical(p.w_ih, conv, layer.cell),
                                                         transpose.from_canonical(p.w_hh, conv, layer.cell)], axis=0)
                out[f"{scope}/{naming.BIAS}"] = b.copy()
    return out


def write(ckpt: Checkpoint, path: str | Path, **_) -> list[str]:
    """Write ``ckpt``'s recurrent layers as a TF1 checkpoint directory at ``path`` (replacing a file there).

    Returns one line per layer naming the cell and scope to build for ``Saver.restore``.

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).

    Raises:
        FormatError: two variables with one name.
    """
    tf = require("tensorflow", "tensorflow")
    values: dict[str, np.ndarray] = {}
    lines = []
    for layer in ckpt.layers:
        cell = _cell_for(layer)
        vs = _variables(layer, cell)
        dup = set(vs) & set(values)
        if dup:
            raise FormatError(f"variable name {sorted(dup)[0]!r} is used twice")
        values.update(vs)
        lines.append(f"{layer.name}: TF1 {cell} x {layer.num_layers} layer(s)"
                     f"{' bidirectional (stack_bidirectional_rnn)' if layer.bidirectional else ' (MultiRNNCell)'}, "
                     f"scope '{layer.name}'" + (", forget_bias=1.0 (LSTMCell default)" if cell == "lstm_cell" else ""))
    p = fresh_directory(path)
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        variables = [v1.Variable(val, name=name, trainable=False) for name, val in values.items()]
        with v1.Session() as s:
            s.run(v1.variables_initializer(variables))
            v1.train.Saver(variables).save(s, str(p / "ckpt"), write_meta_graph=False)
    (p / "checkpoint").write_text('model_checkpoint_path: "ckpt"\nall_model_checkpoint_paths: "ckpt"\n')
    return lines


#: Verification runs a written TF1 checkpoint as TensorFlow reads it back, through the TF1 cell equations
#: (the ``tf_equations`` runtime, :mod:`rnnconvert.verify.tf1_equations`, numpy).
ROUTE = "TensorFlow read-back + TF1 cell equations (numpy)"


def load(path: str | Path, ckpt: Checkpoint, name: str) -> RNNLayer:
    """The ``tf_equations`` runtime's view of a written TF1 checkpoint
    (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`): layer ``name`` as the checkpoint reader gives it back
    (TensorFlow's reading), with the source layer's run-time clips (not stored in a TF1 checkpoint)."""
    from .checkpoint_read import read

    src = ckpt.layer(name)
    return read(path).layer(name).with_semantics(cell_clip=src.semantics.cell_clip, proj_clip=src.semantics.proj_clip)

