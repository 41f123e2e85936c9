"""The OpenVINO IR writer: canonical layers as ``LSTMSequence-5``/``GRUSequence-5``/``RNNSequence-5`` nodes, built
with OpenVINO's own Python API (``openvino.opset13``) and saved by ``openvino.save_model`` (f32/f16/f64 constants
as the layer's dtype, ``compress_to_fp16=False``), into a folder ``DST/`` holding ``model.xml`` and ``model.bin``
(the engine puts one path in place: an IR is two files).

Graph per layer ``name``: a ``Parameter`` ``name__in`` ``[batch, seq, I]`` (f32), zero initial states and full
sequence lengths computed from its shape (``ShapeOf``, ``Gather``, ``Broadcast``), one sequence node per stacked
layer (friendly name :func:`.naming.node_name`), each ``Y [batch, D, seq, H]`` turned into ``[batch, seq, D*H]``
(``Transpose``, ``Reshape``), the last one the ``Result`` ``name__out``; float16 weights reach the node through a
``Convert`` to f32, as OpenVINO's f16 IRs do.

Arrays (``core/gates.py`` rows ``("openvino", cell)``): ``W[d] = w_ih``, ``R[d] = w_hh`` in gate order LSTM
``f i c o``, GRU ``z r h`` (permutations: bit-exact); LSTM and RNN ``B = b_ih + b_hh``; GRU reset-after
(``linear_before_reset=true``) ``B = [b_z, b_r (summed), b_in, b_hn]``; GRU reset-before ``B = b_ih + b_hh``
(3H). One float rounding per summed element, exact where one term is 0.

Refused (:func:`refusals`): peepholes and projections (opset 5 sequences have neither), TF1 cell/projection
clipping (OpenVINO's ``clip`` clips the gates' inputs), gate activations other than sigmoid, activations other
than tanh/relu, a lone ``go_backwards``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, Checkpoint, RNNLayer
from ...engine import refusal
from ...errors import require
from . import naming

ROUTE = "OpenVINO runtime (CPU, f32 inference precision)"
OP = {Cell.LSTM: "LSTMSequence", Cell.GRU: "GRUSequence", Cell.RNN_TANH: "RNNSequence", Cell.RNN_RELU: "RNNSequence"}


def refusals(layer: RNNLayer) -> list[str]:
    """What an OpenVINO sequence node cannot compute about ``layer`` (empty when it can)."""
    s, why = layer.semantics, []
    if layer.cell in (Cell.LSTM, Cell.GRU) and s.gate_activation != "sigmoid":
        why.append(f"recurrent_activation={s.gate_activation} (OpenVINO sequences here: sigmoid gates)")
    if s.activation not in ("tanh", "relu"):
        why.append(f"activation={s.activation} (OpenVINO sequences take sigmoid, tanh, relu)")
    if any(p.peep is not None for dirs in layer.params for p in dirs):
        why.append("peephole connections (LSTMSequence-5 has none)")
    if layer.proj_size:
        why.append(f"LSTM projection proj_size={layer.proj_size} (LSTMSequence has none)")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("TF1 cell_clip/proj_clip (OpenVINO's clip clips the gates' inputs)")
    if s.go_backwards and not layer.bidirectional:
        why.append("go_backwards=True (reverse the sequence yourself and convert the layer without it)")
    if layer.dtype not in (np.float16, np.float32, np.float64):
        why.append(f"dtype {layer.dtype}")
    return why


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse what OpenVINO cannot express (:func:`refusals`); no notes.

    Raises:
        UnsupportedError (:class:`rnnconvert.engine.refusal.Refused`).
    """
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "openvino", f"OpenVINO {OP[layer.cell]}")
    return []


def arrays(layer: RNNLayer, dirs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(W, R, B)`` of one stacked layer, stacked over its directions (module docstring)."""
    cell, H = layer.cell, layer.hidden_size
    cv = gates.convention("openvino", cell)
    W = np.stack([gates.from_canonical(p.w_ih, cv, cell) for p in dirs])
    R = np.stack([gates.from_canonical(p.w_hh, cv, cell) for p in dirs])
    bs = []
    for p in dirs:
        if cell is Cell.GRU and layer.semantics.reset_after:
            n = gates.gate_slice(cell, "n", H)
            b = np.array(p.b_ih, copy=True)
            b[:n.start] = p.b_ih[:n.start] + p.b_hh[:n.start]
            bs.append(np.concatenate([gates.vec_from_canonical(b, cv, cell), p.b_hh[n]]))
        else:
            bs.append(gates.vec_from_canonical(p.b_ih + p.b_hh, cv, cell))
    return W, R, np.stack(bs)


def _const(ops, a: np.ndarray):
    c = ops.constant(np.ascontiguousarray(a))
    return ops.convert(c, "f32") if a.dtype == np.float16 else c


def build(ckpt: Checkpoint):
    """The ``openvino.Model`` of ``ckpt`` (module docstring)."""
    ov = require("openvino", "openvino")
    ops = require("openvino.opset13", "openvino")
    params, results = [], []
    for i, layer in enumerate(ckpt.layers):
        x = ops.parameter([-1, -1, layer.input_size], np.float32, name=naming.input_name(layer.name))
        x.output(0).get_tensor().set_names({naming.input_name(layer.name)})
        params.append(x)
        shape = ops.shape_of(x, "i64")
        batch = ops.gather(shape, ops.constant(np.array([0], np.int64)), ops.constant(np.array(0, np.int64)))
        steps = ops.gather(shape, ops.constant(np.array([1], np.int64)), ops.constant(np.array(0, np.int64)))
        D, H = layer.num_directions, layer.hidden_size
        zeros_shape = ops.concat([batch, ops.constant(np.array([D, H], np.int64))], 0)
        zeros = ops.broadcast(ops.constant(np.array(0, np.float32)), zeros_shape)
        lengths = ops.broadcast(ops.convert(steps, "i32"), batch)
        direction = "bidirectional" if layer.bidirectional else "forward"
        y = x
        for k in range(layer.num_layers):
            W, R, B = (_const(ops, a) for a in arrays(layer, ckpt.slab(i, k)))
            act = layer.semantics.activation
            if layer.cell is Cell.LSTM:
                node = ops.lstm_sequence(y, zeros, zeros, lengths, W, R, B, H, direction,
                                         activations=["sigmoid", act, act])
            elif layer.cell is Cell.GRU:
                node = ops.gru_sequence(y, zeros, lengths, W, R, B, H, direction, activations=["sigmoid", act],
                                        linear_before_reset=layer.semantics.reset_after)
            else:
                node = ops.rnn_sequence(y, zeros, lengths, W, R, B, H, direction, activations=[act])
            node.set_friendly_name(naming.node_name(layer.name, layer.num_layers, k))
            t = ops.transpose(node.output(0), ops.constant(np.array([0, 2, 1, 3], np.int64)))
            y = ops.reshape(t, ops.constant(np.array([0, 0, D * H], np.int64)), special_zero=True)
        res = ops.result(y)
        res.set_friendly_name(naming.output_name(layer.name))
        y.output(0).get_tensor().set_names({naming.output_name(layer.name)})
        results.append(res)
    return ov.Model(results, params, "rnnconvert")


def _environment(folder: Path, ckpt: Checkpoint) -> OSError | None:
    """Why ``openvino.save_model`` failed to write into ``folder``, when the cause is the environment: its C++
    streams report a full disk, a quota or a read-only file system as ``RuntimeError("basic_ios::clear:
    iostream error")`` with no errno, so the same bytes are tried here: fewer free bytes than the constants
    hold is ``ENOSPC``; otherwise a probe file of up to 1 MiB is written, flushed and removed, and its
    ``OSError`` (``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EACCES``...) is the answer. ``None``: the environment
    took the probe (the failure is OpenVINO's own)."""
    import errno
    import os

    need = sum(int(layer.dtype.itemsize) * layer.num_directions * layer.num_layers
               * layer.cell.gates * layer.hidden_size * (layer.input_size + layer.hidden_size + 2)
               for layer in ckpt.layers)
    try:
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < need:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))
        probe = folder / ".rnnconvert-space-probe"
        try:
            with open(probe, "wb") as fh:
                fh.write(b"\0" * min(max(need, 1), 1 << 20))
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return exc
    return None


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as an OpenVINO IR folder ``path/`` (``model.xml``, ``model.bin``; module docstring);
    one line per layer names its graph input and output. Assumes :func:`check` passed.

    Raises:
        DependencyError: openvino is not installed (the ``openvino`` extra). OSError: the file system refused
            the IR (a full disk, a quota, read-only: :func:`_environment`; the engine makes it the one-line
            ``OutputError``, exit 10). RuntimeError: OpenVINO failed for another reason.
    """
    ov = require("openvino", "openvino")
    model = build(ckpt)
    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()
    p.mkdir()
    try:
        ov.save_model(model, str(p / naming.XML), compress_to_fp16=False)
    except RuntimeError as exc:  # OpenVINO's C++ streams say "basic_ios::clear: iostream error", no errno
        raise (_environment(p, ckpt) or exc) from exc
    return [f"{layer.name}: OpenVINO {OP[layer.cell]} node(s) {layer.name}; feed '{naming.input_name(layer.name)}' "
            f"(batch, time, {layer.input_size}), read '{naming.output_name(layer.name)}'" for layer in ckpt.layers]
