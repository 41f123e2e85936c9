"""Write canonical LSTM layers as fused ``UNIDIRECTIONAL_SEQUENCE_LSTM`` ops in a ``.tflite`` flatbuffer (built
with the ``flatbuffers`` package from the ``tflite`` schema's field layout, no TensorFlow), so that the LiteRT /
TensorFlow Lite interpreter runs it: the ``tflite`` runtime (:mod:`rnnconvert.runtimes.tflite`) is the target
side of verification.

Layout (the reader's facts, :mod:`.tflite_read`, ``lstm_shared.h``): one subgraph ``main``; per layer a graph
input ``<layer>__in`` ``(batch, T, I)`` (``shape_signature`` ``[batch, -1, I]``: any length) and a graph output
``<layer>__out``; per stacked layer one op (per direction: the bidirectional pattern TF's converter writes,
``REVERSE_V2 -> LSTM -> REVERSE_V2`` beside the forward op, ``CONCATENATION`` on the last axis), its 24 inputs:
the four per-gate input and recurrent weights ``(H, in)`` (canonical blocks i f g o as they are: bit-exact),
peepholes, ``b_ih + b_hh`` per gate (one float32 rounding where both are non-zero), projection weights (no
projection bias), and two variable state tensors ``(batch, P or H)``, ``(batch, H)`` that start at zero. Options:
``fused_activation_function`` TANH, ``cell_clip``/``proj_clip`` (0: none), batch-major.

``batch`` (write option, default 1): the batch the state tensors are sized for (TFLite's LSTM kernel requires
the input's batch to equal the states'). Float32 weights; float16 ones are written as float32 (exact, a note).

Refused (:func:`refusals`): GRU and simple RNN layers (TF's converter writes them as ``WHILE`` loops, which this
writer does not build), gate activations other than sigmoid, a cell activation other than tanh, ``go_backwards``,
float64 weights (the kernel computes in float32: rounding them would change the model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer
from ...engine import refusal
from ...engine.protocol import located
from ...errors import OptionError, require

ROUTE = "the TensorFlow Lite interpreter (tf.lite.Interpreter) running the written .tflite"
# BuiltinOperator codes and BuiltinOptions union types (tensorflow/lite/schema/schema.fbs)
LSTM_CODE, REVERSE_V2_CODE, CONCAT_CODE = 44, 105, 2
LSTM_OPTIONS, CONCAT_OPTIONS = 71, 10
TANH, FLOAT32, INT32 = 4, 0, 2


def refusals(layer: RNNLayer) -> list[str]:
    """What a fused TFLite LSTM op cannot express about ``layer`` (empty when it can)."""
    s, why = layer.semantics, []
    if layer.cell is not Cell.LSTM:
        why.append(f"a {layer.cell.value} layer (TF's converter writes GRU and simple RNNs as WHILE loops; "
                   "rnnconvert writes only the fused UNIDIRECTIONAL_SEQUENCE_LSTM op)")
        return why
    if s.gate_activation != "sigmoid":
        why.append(f"recurrent_activation={s.gate_activation} (TFLite's LSTM gates are sigmoid)")
    if s.activation != "tanh":
        why.append(f"activation={s.activation} (written as fused_activation_function; only tanh is verified)")
    if s.go_backwards and not layer.bidirectional:
        why.append("go_backwards=True")
    if layer.dtype == np.float64:
        why.append("float64 weights (TFLite's LSTM kernel computes in float32)")
    return why


def check(ckpt: Checkpoint, batch: Any = 1, **_: Any) -> list[str]:
    """Refuse what the fused op cannot compute (one line per layer, with the way out); return notes."""
    _batch(batch)
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "tflite", "TFLite UNIDIRECTIONAL_SEQUENCE_LSTM")
        if layer.dtype == np.float16:
            notes.append(f"{layer.name}: float16 weights written as float32 (exact)")
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': '{layer.name}__out' holds both "
                         "directions concatenated; apply the merge to it")
    if ckpt.tensors:
        notes.append(f"{len(ckpt.tensors)} non-recurrent tensor(s) are not written: the .tflite holds the recurrent "
                     "layers only")
    return notes


def _batch(batch: Any) -> int:
    try:
        b = int(batch)
    except (TypeError, ValueError):
        b = 0
    if b < 1 or b > 1 << 20:
        raise OptionError(f"tflite writer: batch={batch!r}: expected a positive integer")
    return b


class _Graph:
    """Tensors, buffers and ops of the one subgraph, built then serialised by :func:`_serialise`."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = [b""]  # buffer 0: the empty sentinel
        self.tensors: list[dict] = []
        self.ops: list[tuple[int, list[int], list[int], Any]] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def tensor(self, name: str, shape: list[int], *, data: bytes | None = None, dtype: int = FLOAT32,
               variable: bool = False, signature: list[int] | None = None) -> int:
        buf = 0
        if data is not None:
            self.buffers.append(data)
            buf = len(self.buffers) - 1
        self.tensors.append({"name": name, "shape": shape, "type": dtype, "buffer": buf, "variable": variable,
                             "signature": signature})
        return len(self.tensors) - 1

    def const(self, name: str, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a, dtype="<f4")
        return self.tensor(name, list(a.shape), data=a.tobytes())


def _lstm(g: _Graph, layer: RNNLayer, p: DirectionParams, x: int, tag: str, batch: int, T: int) -> int:
    """One direction's ``UNIDIRECTIONAL_SEQUENCE_LSTM`` op on tensor ``x``; returns its output tensor."""
    H, P = layer.hidden_size, layer.proj_size
    out = P or H
    conv = gates.convention("tflite", Cell.LSTM)
    w_ih = gates.from_canonical(p.w_ih, conv, Cell.LSTM)
    w_hh = gates.from_canonical(p.w_hh, conv, Cell.LSTM)
    b = gates.vec_from_canonical(p.b_ih + p.b_hh, conv, Cell.LSTM)  # one rounding where both are non-zero
    names = ("input", "forget", "cell", "output")
    ins = [x]
    ins += [g.const(f"{tag}/input_to_{n}_weights", w_ih[k * H:(k + 1) * H]) for k, n in enumerate(names)]
    ins += [g.const(f"{tag}/recurrent_to_{n}_weights", w_hh[k * H:(k + 1) * H]) for k, n in enumerate(names)]
    if p.peep is not None:
        ins += [g.const(f"{tag}/cell_to_{n}_weights", p.peep[r]) for r, n in enumerate(("input", "forget", "output"))]
    else:
        ins += [-1, -1, -1]
    ins += [g.const(f"{tag}/{n}_gate_bias", b[k * H:(k + 1) * H]) for k, n in enumerate(names)]
    ins += [g.const(f"{tag}/projection_weights", p.w_hr) if p.w_hr is not None else -1, -1]
    ins += [g.tensor(f"{tag}/output_state", [batch, out], variable=True),
            g.tensor(f"{tag}/cell_state", [batch, H], variable=True)]
    ins += [-1, -1, -1, -1]
    y = g.tensor(f"{tag}/out", [batch, T, out], signature=[batch, -1, out])
    s = layer.semantics
    g.ops.append((LSTM_CODE, ins, [y], ("lstm", float(s.cell_clip or 0.0), float(s.proj_clip or 0.0))))
    return y


def _layer(g: _Graph, layer: RNNLayer, slabs: list[list[DirectionParams]], batch: int) -> None:
    T = 1
    x = g.tensor(f"{layer.name}__in", [batch, T, layer.input_size], signature=[batch, -1, layer.input_size])
    g.inputs.append(x)
    h = x
    for k, dirs in enumerate(slabs):
        tag = f"{layer.name}/l{k}"
        fw = _lstm(g, layer, dirs[0], h, f"{tag}/fw" if layer.bidirectional else tag, batch, T)
        if not layer.bidirectional:
            h = fw
            continue
        axis = g.tensor(f"{tag}/time_axis", [1], data=np.array([1], "<i4").tobytes(), dtype=INT32)
        out = layer.proj_size or layer.hidden_size
        xr = g.tensor(f"{tag}/bw/in_reversed", [batch, T, h_width(g, h)], signature=[batch, -1, h_width(g, h)])
        g.ops.append((REVERSE_V2_CODE, [h, axis], [xr], None))
        yr = _lstm(g, layer, dirs[1], xr, f"{tag}/bw", batch, T)
        bw = g.tensor(f"{tag}/bw/out", [batch, T, out], signature=[batch, -1, out])
        g.ops.append((REVERSE_V2_CODE, [yr, axis], [bw], None))
        h = g.tensor(f"{tag}/out", [batch, T, 2 * out], signature=[batch, -1, 2 * out])
        g.ops.append((CONCAT_CODE, [fw, bw], [h], ("concat", -1)))
    g.tensors[h]["name"] = f"{layer.name}__out"
    g.outputs.append(h)


def h_width(g: _Graph, t: int) -> int:
    return g.tensors[t]["shape"][-1]


def _serialise(g: _Graph) -> bytes:
    flatbuffers = require("flatbuffers", "tflite")
    tfl = require("tflite", "tflite")
    b = flatbuffers.Builder(1024)

    def ivec(vals: list[int]) -> int:
        b.StartVector(4, len(vals), 4)
        for v in reversed(vals):
            b.PrependInt32(int(v))
        return b.EndVector()

    def ovec(offs: list[int]) -> int:
        b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    bufs = []
    for data in g.buffers:
        vec = None
        if data:
            b.StartVector(1, len(data), 16)  # 16-byte aligned, as TF's converter writes buffers
            b.head = b.head - len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            vec = b.EndVector()
        tfl.BufferStart(b)
        if vec is not None:
            tfl.BufferAddData(b, vec)
        bufs.append(tfl.BufferEnd(b))
    tens = []
    for t in g.tensors:
        name = b.CreateString(t["name"])
        shape = ivec(t["shape"])
        sig = ivec(t["signature"]) if t["signature"] else None
        tfl.TensorStart(b)
        tfl.TensorAddShape(b, shape)
        if sig is not None:
            tfl.TensorAddShapeSignature(b, sig)
        tfl.TensorAddType(b, t["type"])
        tfl.TensorAddBuffer(b, t["buffer"])
        tfl.TensorAddName(b, name)
        tfl.TensorAddIsVariable(b, t["variable"])
        tens.append(tfl.TensorEnd(b))
    codes = [LSTM_CODE, REVERSE_V2_CODE, CONCAT_CODE]
    ops = []
    for code, ins, outs, opt in g.ops:
        iv, ov = ivec(ins), ivec(outs)
        opt_off, opt_type = None, 0
        if opt is not None and opt[0] == "lstm":
            tfl.UnidirectionalSequenceLSTMOptionsStart(b)
            tfl.UnidirectionalSequenceLSTMOptionsAddFusedActivationFunction(b, TANH)
            tfl.UnidirectionalSequenceLSTMOptionsAddCellClip(b, opt[1])
            tfl.UnidirectionalSequenceLSTMOptionsAddProjClip(b, opt[2])
            tfl.UnidirectionalSequenceLSTMOptionsAddTimeMajor(b, False)
            opt_off, opt_type = tfl.UnidirectionalSequenceLSTMOptionsEnd(b), LSTM_OPTIONS
        elif opt is not None and opt[0] == "concat":
            tfl.ConcatenationOptionsStart(b)
            tfl.ConcatenationOptionsAddAxis(b, opt[1])
            opt_off, opt_type = tfl.ConcatenationOptionsEnd(b), CONCAT_OPTIONS
        tfl.OperatorStart(b)
        tfl.OperatorAddOpcodeIndex(b, codes.index(code))
        tfl.OperatorAddInputs(b, iv)
        tfl.OperatorAddOutputs(b, ov)
        if opt_off is not None:
            tfl.OperatorAddBuiltinOptionsType(b, opt_type)
            tfl.OperatorAddBuiltinOptions(b, opt_off)
        ops.append(tfl.OperatorEnd(b))
    tv, ov, iv, outv = ovec(tens), ovec(ops), ivec(g.inputs), ivec(g.outputs)
    name = b.CreateString("main")
    tfl.SubGraphStart(b)
    tfl.SubGraphAddTensors(b, tv)
    tfl.SubGraphAddInputs(b, iv)
    tfl.SubGraphAddOutputs(b, outv)
    tfl.SubGraphAddOperators(b, ov)
    tfl.SubGraphAddName(b, name)
    sg = tfl.SubGraphEnd(b)
    occ = []
    for code in codes:
        tfl.OperatorCodeStart(b)
        tfl.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        tfl.OperatorCodeAddBuiltinCode(b, code)
        tfl.OperatorCodeAddVersion(b, 1)
        occ.append(tfl.OperatorCodeEnd(b))
    codes_v, sgs_v, bufs_v = ovec(occ), ovec([sg]), ovec(bufs)
    desc = b.CreateString("rnnconvert")
    tfl.ModelStart(b)
    tfl.ModelAddVersion(b, 3)
    tfl.ModelAddOperatorCodes(b, codes_v)
    tfl.ModelAddSubgraphs(b, sgs_v)
    tfl.ModelAddDescription(b, desc)
    tfl.ModelAddBuffers(b, bufs_v)
    b.Finish(tfl.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def write(ckpt: Checkpoint, path: str | Path, batch: Any = 1, **_: Any) -> list[str]:
    """Write every layer of ``ckpt`` (module docstring); assumes :func:`check` passed. Returns one line per
    layer."""
    n = _batch(batch)
    g = _Graph()
    lines = []
    for i, layer in enumerate(ckpt.layers):
        slabs = [[p if p.w_ih.dtype == np.float32 else _as_f32(p) for p in ckpt.slab(i, k)]
                 for k in range(layer.num_layers)]
        _layer(g, layer, slabs, n)
        lines.append(f"{layer.name}: {layer.num_layers * (2 if layer.bidirectional else 1)} UNIDIRECTIONAL_SEQUENCE_LSTM "
                     f"op(s){' (Bidirectional pattern)' if layer.bidirectional else ''}, input '{layer.name}__in' "
                     f"(batch {n}), output '{layer.name}__out'")
    Path(path).write_bytes(_serialise(g))
    return lines


def _as_f32(p: DirectionParams) -> DirectionParams:
    f = lambda a: None if a is None else np.asarray(a, np.float32)  # noqa: E731  float16 -> float32: exact
    return DirectionParams(f(p.w_ih), f(p.w_hh), f(p.b_ih), f(p.b_hh), f(p.w_hr), f(p.peep))


#: the whole-model writer (:mod:`rnnconvert.whole.formats.tflite.model_write`), loaded when a whole model is written
WHOLE_CHECK = located("rnnconvert.whole.formats.tflite.model_write:check")
WHOLE_WRITE = located("rnnconvert.whole.formats.tflite.model_write:write")


def container_check(ckpt: Checkpoint, *, recurrent_only: bool = False, whole_model: Any = None,
                    **options: Any) -> list[str]:
    """The ``tflite`` container's check: a whole Keras 1/2 model (the engine's write option ``whole_model``, not
    ``recurrent_only``) by the whole-model writer (:data:`WHOLE_CHECK`), else the recurrent layers (:func:`check`).

    Raises:
        UnsupportedError: as :func:`check`, or the whole-model writer's refusals (layer, class, way out)."""
    if whole_model is not None and not recurrent_only:
        return WHOLE_CHECK(ckpt, whole_model=whole_model, **options)
    return check(ckpt, **options)


def container_write(ckpt: Checkpoint, path: str | Path, *, recurrent_only: bool = False, whole_model: Any = None,
                    **options: Any) -> list[str]:
    """The ``tflite`` container's write: a whole model by TensorFlow Lite's converter (:data:`WHOLE_WRITE`), else
    the recurrent layers (:func:`write`). Assumes :func:`container_check` passed."""
    if whole_model is not None and not recurrent_only:
        return WHOLE_WRITE(ckpt, path, whole_model=whole_model, **options)
    return write(ckpt, path, **options)
