"""Read the fused LSTM ops of a TensorFlow Lite / LiteRT flatbuffer (``.tflite``) without running the model.

Layout facts (``tensorflow/lite/kernels/lstm_shared.h`` tensor indices, ``tensorflow/lite/schema/schema.fbs``;
the flatbuffer is parsed with the ``tflite`` package's generated schema, no interpreter):

* ``UNIDIRECTIONAL_SEQUENCE_LSTM`` (builtin 44) has 24 inputs (20 before layer normalisation): 0 the input
  ``(B, T, I)`` (``(T, B, I)`` when ``time_major``); 1-4 ``input_to_{input,forget,cell,output}_weights``
  ``(H, I)``; 5-8 ``recurrent_to_{input,forget,cell,output}_weights`` ``(H, P or H)``; 9-11
  ``cell_to_{input,forget,output}_weights`` ``(H,)`` (peepholes, optional); 12-15
  ``{input,forget,cell,output}_gate_bias`` ``(H,)``; 16 ``projection_weights`` ``(P, H)`` and 17
  ``projection_bias`` ``(P,)`` (optional); 18 ``output_state``, 19 ``cell_state`` (variable tensors, the
  initial state); 20-23 layer-norm coefficients (optional). ``-1`` marks an absent input. Options
  (``UnidirectionalSequenceLSTMOptions``): ``fused_activation_function`` (the cell activation, TANH),
  ``cell_clip``, ``proj_clip`` (0: none), ``time_major``, ``diagonal_recurrent_tensors``.
* The gates are ``sigmoid(W x + R h + p * c + b)`` in the order i, f, c(g), o with one bias per gate
  (``lstm_eval.cc``): canonical ``w_ih`` is the four input weights stacked (``core/gates.TABLE['tflite']``,
  ``out_in``), ``b_ih`` the four biases, ``b_hh`` zero.
* TF 2.21's converter writes a Keras ``Bidirectional(LSTM)`` as the forward op on ``X`` and
  ``REVERSE_V2(X, time axis) -> LSTM -> REVERSE_V2 -> CONCATENATION([forward, backward], last axis)``: that
  pattern is read as one bidirectional layer (``merge_mode='concat'``); every other op stands alone.
* GRU, SimpleRNN and Keras 3 LSTM/GRU layers come out of the converter as a ``WHILE`` loop whose body subgraph
  holds the cell's ops: read by :mod:`.tflite_while`, which recognises the cell in the body exactly or refuses,
  naming the op and the subgraph (layers ``gru_<k>``, ``simple_rnn_<k>``, ``lstm_<k>``; ``k`` counts every layer
  read). Refused, naming the op: ``BIDIRECTIONAL_SEQUENCE_LSTM``, the sequence RNN ops, the single-step ``LSTM``
  op, ``SVDF``.

Refused with one line (:class:`~rnnconvert.errors.UnsupportedError`): a coupled input-forget gate (CIFG, no input
gate weights), a non-zero projection bias (no format rnnconvert writes has one: PyTorch's ``proj_size`` and
TF1's ``num_proj`` project without bias), layer-norm coefficients, quantised (int8/uint8) weights, a cell
activation other than tanh, diagonal recurrent weights. A non-zero initial state stored in the variable tensors
is carried as tensors ``<layer>_state.h0``/``c0`` with a note (not applied). Bounds: tensor, op and subgraph
counts against the ``names``/``graph_nodes`` limits, every buffer inside the file; subgraph, operator, tensor,
buffer and operator-code entries that alias one table refused, the records walked (operators' index vectors
counted where used) and the loops' work counted against ``graph_nodes`` before any walk (:func:`structure`).
"""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates, names
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ...errors import DependencyError, FormatError, UnrecognisedError, UnsupportedError, require
from ...safety import budget
from . import tflite_while

LSTM_OP = "UNIDIRECTIONAL_SEQUENCE_LSTM"
#: ops that hold a recurrence rnnconvert does not read (refused, named)
REFUSED_OPS = {
    "BIDIRECTIONAL_SEQUENCE_LSTM": "the BIDIRECTIONAL_SEQUENCE_LSTM op",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "the UNIDIRECTIONAL_SEQUENCE_RNN op",
    "BIDIRECTIONAL_SEQUENCE_RNN": "the BIDIRECTIONAL_SEQUENCE_RNN op",
    "LSTM": "the single-step LSTM op",
    "RNN": "the single-step RNN op",
    "SVDF": "the SVDF op",
}
_DTYPES = {0: np.float32, 1: np.float16, 10: np.float64}  # TensorType FLOAT32, FLOAT16, FLOAT64
_TYPE_NAMES = {2: "int32", 3: "uint8", 4: "int64", 7: "int16", 9: "int8", 17: "int4"}
_ACT = {4: "tanh"}  # ActivationFunctionType TANH; NONE/RELU/... refused


def _schema():
    return require("tflite", "tflite")


#: vtable offsets of the fields :func:`structure` follows (``schema.fbs`` field order: 4 + 2 * field id)
_MODEL_CODES, _MODEL_SUBGRAPHS, _MODEL_BUFFERS = 6, 8, 12
_SG_TENSORS, _SG_OPERATORS = 4, 10
_OP_INPUTS, _OP_OUTPUTS = 6, 8


def _tables(buf: bytes, pos: int, field: int, where: object, what: str) -> np.ndarray:
    """The absolute positions of the tables a vector-of-tables field of the table at ``pos`` points at."""
    import flatbuffers

    t = flatbuffers.table.Table(buf, pos)
    o = t.Offset(field)
    if not o:
        return np.zeros(0, np.int64)
    start, n = t.Vector(o), t.VectorLen(o)
    if start + 4 * n > len(buf):
        raise FormatError(f"{where}: the {what} vector reaches past the end of the file")
    rel = np.frombuffer(buf, "<u4", n, start).astype(np.int64)
    return start + 4 * np.arange(n, dtype=np.int64) + rel


def _vector_len(buf: bytes, pos: int, field: int) -> int:
    import flatbuffers

    t = flatbuffers.table.Table(buf, pos)
    o = t.Offset(field)
    return t.VectorLen(o) if o else 0


def structure(buf: bytes, where: object) -> int:
    """Check the flatbuffer's shape before anything walks it, and return the records a read walks.

    The schema (``schema.fbs``) shares no table: each subgraph, operator, tensor, buffer and operator code is its
    own. A forged file can point 1,000 subgraph entries at one subgraph whose 100,000 operator entries point at one
    operator (0.4 MB asking for 10**8 records); so every such vector's entries must be distinct tables, across the
    whole file, and the records a read walks -- subgraphs, operators, tensors, and each operator's input and output
    indices (vectors of indices may be shared, so they are counted where used) -- must stay within the
    ``graph_nodes`` limit. Both are checked here, before any walk, in time linear in the tables.

    Raises:
        FormatError: entries of one of these vectors that alias one table, a vector past the end of the file.
        BudgetError: more records than the ``graph_nodes`` limit."""
    import flatbuffers

    root = flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)
    seen: dict[str, list[np.ndarray]] = {"subgraph": [], "operator": [], "tensor": [], "buffer": [],
                                         "operator code": []}
    sgs = _tables(buf, root, _MODEL_SUBGRAPHS, where, "subgraphs")
    seen["subgraph"].append(sgs)
    seen["buffer"].append(_tables(buf, root, _MODEL_BUFFERS, where, "buffers"))
    seen["operator code"].append(_tables(buf, root, _MODEL_CODES, where, "operator codes"))
    limit = budget.limit("graph_nodes")
    records = len(sgs)
    for sg in sgs.tolist():
        ts, ops = (_tables(buf, sg, _SG_TENSORS, where, "tensors"), _tables(buf, sg, _SG_OPERATORS, where, "operators"))
        seen["tensor"].append(ts)
        seen["operator"].append(ops)
        records += len(ts) + len(ops)
        if records > limit:
            break
    for what, parts in seen.items():
        allpos = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if len(allpos) and len(np.unique(allpos)) != len(allpos):
            counts = np.unique(allpos, return_counts=True)[1]
            raise FormatError(f"{where}: {int((counts - 1).sum()):,} {what} entries point at a {what} another entry "
                              f"points at (the schema shares no {what}; a forged file makes one table count many "
                              "times); refused")
    if records > limit:
        raise budget.exceeded(where, "graph_nodes", f"more than {limit:,} subgraphs, operators and tensors")
    for ops in seen["operator"]:
        for op in ops.tolist():
            records += _vector_len(buf, op, _OP_INPUTS) + _vector_len(buf, op, _OP_OUTPUTS)
        if records > limit:
            raise budget.exceeded(where, "graph_nodes", f"more than {limit:,} records (subgraphs, operators, "
                                  "tensors, operator inputs and outputs)")
    return records


class Flat:
    """A parsed ``.tflite`` flatbuffer: op names, tensors and buffers by index, every access checked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tfl = _schema()
        self.buf = path.read_bytes()
        if len(self.buf) < 8 or self.buf[4:8] != b"TFL3":
            raise FormatError(f"{path}: not a TensorFlow Lite flatbuffer (no TFL3 identifier)")
        self.model = self.tfl.Model.GetRootAs(self.buf, 0)
        op_enum = self.tfl.BuiltinOperator
        self.op_names = {v: k for k, v in vars(op_enum).items() if not k.startswith("_") and isinstance(v, int)}
        self.codes = []
        budget.check_count(path, "names", self.model.OperatorCodesLength(), "operator codes")
        budget.check_count(path, "names", self.model.SubgraphsLength(), "subgraphs")
        for j in range(self.model.OperatorCodesLength()):
            oc = self.model.OperatorCodes(j)
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            name = self.op_names.get(code, f"builtin {code}")
            if name == "CUSTOM":
                name = f"custom op '{(oc.CustomCode() or b'?').decode('utf-8', 'replace')}'"
            self.codes.append(name)
        budget.check_count(path, "names", self.model.BuffersLength(), "buffers")
        self.nbuf = self.model.BuffersLength()
        self.records = structure(self.buf, path)

    def subgraphs(self) -> list[Any]:
        return [self.model.Subgraphs(i) for i in range(self.model.SubgraphsLength())]

    def op_name(self, op: Any) -> str:
        i = op.OpcodeIndex()
        if not 0 <= i < len(self.codes):
            raise FormatError(f"{self.path}: an operator names opcode {i}, the model has {len(self.codes)}")
        return self.codes[i]

    def data(self, tensor: Any) -> bytes:
        """The bytes of ``tensor``'s buffer (inside the flatbuffer, or at ``offset``/``size`` after it)."""
        b = tensor.Buffer()
        if not 0 <= b < self.nbuf:
            raise FormatError(f"{self.path}: a tensor names buffer {b}, the model has {self.nbuf}")
        buf = self.model.Buffers(b)
        off, size = buf.Offset(), buf.Size()
        if off > 1:  # stored after the flatbuffer (models over 2 GB)
            if off + size > len(self.buf):
                raise FormatError(f"{self.path}: buffer {b} reaches past the end of the file")
            return self.buf[off:off + size]
        n = buf.DataLength()
        if n == 0:
            return b""
        return buf.DataAsNumpy().tobytes()

    def array(self, sg: Any, idx: int, what: str) -> np.ndarray | None:
        """Tensor ``idx`` of subgraph ``sg`` as a float array, or None for an absent input (-1) or an empty
        buffer (a variable tensor without initial value)."""
        if idx < 0:
            return None
        if idx >= sg.TensorsLength():
            raise FormatError(f"{self.path}: an operator names tensor {idx}, the subgraph has {sg.TensorsLength()}")
        t = sg.Tensors(idx)
        shape = tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        if any(s < 0 for s in shape):
            raise FormatError(f"{self.path}: tensor {idx} ({what}) has a dynamic shape {shape}")
        raw = self.data(t)
        if not raw:
            return None
        ttype = t.Type()
        if ttype not in _DTYPES:
            raise UnsupportedError(f"{self.path}: {what} is {_TYPE_NAMES.get(ttype, f'type {ttype}')} (quantised "
                                   "weights); rnnconvert reads float32/float16 LSTM weights only; refused (convert "
                                   "the model without quantisation)")
        dt = np.dtype(_DTYPES[ttype]).newbyteorder("<")
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if n * dt.itemsize != len(raw):
            raise FormatError(f"{self.path}: tensor {idx} ({what}) of shape {shape} holds {len(raw)} bytes")
        return np.frombuffer(raw, dtype=dt).reshape(shape).astype(dt.newbyteorder("="))

    def ints(self, sg: Any, idx: int) -> list[int] | None:
        """An int32/int64 constant (an axis), or None when absent or not one."""
        if not 0 <= idx < sg.TensorsLength():
            return None
        t = sg.Tensors(idx)
        dt = {2: "<i4", 4: "<i8"}.get(t.Type())
        raw = self.data(t)
        if dt is None or not raw or len(raw) % np.dtype(dt).itemsize or len(raw) > 64:
            return None
        return [int(v) for v in np.frombuffer(raw, dtype=dt)]

    def dequantized(self, sg: Any, idx: int, what: str, producers: dict[int, Any]) -> np.ndarray | None:
        """:meth:`array`, or the float16 constant a ``DEQUANTIZE`` op turns into tensor ``idx`` (the
        converter's float16 quantisation)."""
        a = self.array(sg, idx, what)
        if a is None and idx >= 0 and idx in producers and self.op_name(producers[idx]) == "DEQUANTIZE":
            src = int(producers[idx].Inputs(0))
            if src >= 0 and sg.Tensors(src).Type() == 1:
                a = self.array(sg, src, what)
                a = None if a is None else a.astype(np.float32)  # what the op sees (exact widening)
        return a


def _direction(flat: Flat, sg: Any, ins: list[int], op: Any, producers: dict[int, Any], tag: str,
               notes: list[str], tensors: dict[str, np.ndarray], lname: str, d: int
               ) -> tuple[DirectionParams, Semantics, dict]:
    """One direction's canonical parameters from a ``UNIDIRECTIONAL_SEQUENCE_LSTM`` op's inputs."""
    p = flat.path
    if len(ins) < 20:
        raise FormatError(f"{p}: {tag}: {len(ins)} inputs, the op has 20 or 24")
    get = lambda k, what: flat.dequantized(sg, ins[k], what, producers)  # noqa: E731
    if ins[1] < 0:
        raise UnsupportedError(f"{p}: {tag}: a coupled input-forget gate (CIFG: no input gate weights), which no "
                               "format rnnconvert writes computes; refused")
    if len(ins) > 20 and any(i >= 0 for i in ins[20:24]):
        raise UnsupportedError(f"{p}: {tag}: layer-normalised LSTM (layer-norm coefficients, inputs 20-23), which "
                               "no format rnnconvert writes computes; refused")
    gnames = ("input", "forget", "cell", "output")
    wi = [get(1 + g, f"{tag} input_to_{n}_weights") for g, n in enumerate(gnames)]
    wr = [get(5 + g, f"{tag} recurrent_to_{n}_weights") for g, n in enumerate(gnames)]
    bs = [get(12 + g, f"{tag} {n}_gate_bias") for g, n in enumerate(gnames)]
    if any(a is None or a.ndim != 2 for a in wi + wr):
        raise FormatError(f"{p}: {tag}: gate weights missing or not matrices")
    H, I = wi[0].shape
    if any(a.shape != (H, I) for a in wi) or len({a.shape for a in wr}) != 1 or wr[0].shape[0] != H:
        raise FormatError(f"{p}: {tag}: gate weights of shapes {[a.shape for a in wi + wr]} do not fit one LSTM")
    if any(b is not None and b.shape != (H,) for b in bs):
        raise FormatError(f"{p}: {tag}: gate biases of shapes {[None if b is None else b.shape for b in bs]}")
    dtype = wi[0].dtype
    bs = [np.zeros(H, dtype) if b is None else b for b in bs]
    peeps = [get(k, f"{tag} cell_to_{n}_weights") for k, n in zip((9, 10, 11), ("input", "forget", "output"))]
    peep = None
    if any(x is not None for x in peeps):
        if any(x is None or x.shape != (H,) for x in peeps):
            raise FormatError(f"{p}: {tag}: peephole weights of shapes {[None if x is None else x.shape for x in peeps]}")
        peep = np.stack(peeps)
    w_hr = get(16, f"{tag} projection_weights")
    proj_b = get(17, f"{tag} projection_bias")
    if proj_b is not None and np.any(proj_b != 0):
        raise UnsupportedError(f"{p}: {tag}: a non-zero projection bias (input 17), which no format rnnconvert writes "
                               "holds (PyTorch proj_size and TF1 num_proj project without a bias, ONNX LSTM has no "
                               "projection); refused")
    P = 0
    if w_hr is not None:
        P = w_hr.shape[0]
        if w_hr.shape != (P, H) or wr[0].shape != (H, P):
            raise FormatError(f"{p}: {tag}: projection {w_hr.shape} and recurrent weights {wr[0].shape} do not fit")
    elif wr[0].shape != (H, H):
        raise FormatError(f"{p}: {tag}: recurrent weights {wr[0].shape} without a projection (H={H})")
    opt = flat.tfl.UnidirectionalSequenceLSTMOptions()
    table = op.BuiltinOptions()
    if table is None:
        raise FormatError(f"{p}: {tag}: no UnidirectionalSequenceLSTMOptions")
    opt.Init(table.Bytes, table.Pos)
    act = _ACT.get(opt.FusedActivationFunction())
    if act is None:
        raise UnsupportedError(f"{p}: {tag}: cell activation {opt.FusedActivationFunction()} (ActivationFunctionType), "
                               "not tanh; refused")
    if opt.DiagonalRecurrentTensors():
        raise UnsupportedError(f"{p}: {tag}: diagonal recurrent weights, which no format rnnconvert writes computes; "
                               "refused")
    sem = Semantics(cell_clip=float(opt.CellClip()) or None, proj_clip=float(opt.ProjClip()) or None)
    for k, s in ((18, "h0"), (19, "c0")):
        st = flat.array(sg, ins[k], f"{tag} {'output' if k == 18 else 'cell'}_state")
        if st is not None and np.any(st != 0):
            key = f"{lname}_state.{s}" + ("_reverse" if d else "")
            tensors[key] = st
            notes.append(f"{lname}: a non-zero initial state ({'output' if k == 18 else 'cell'}_state) carried as "
                         f"'{key}', not applied: the written layer starts from zero states")
    conv = gates.convention("tflite", Cell.LSTM)
    w_ih = gates.to_canonical(np.concatenate(wi, 0), conv, Cell.LSTM)
    w_hh = gates.to_canonical(np.concatenate(wr, 0), conv, Cell.LSTM)
    b_ih = gates.vec_to_canonical(np.concatenate(bs), conv, Cell.LSTM)
    src = {"time_major": bool(opt.TimeMajor()), "inputs": ins}
    return DirectionParams(w_ih, w_hh, b_ih, np.zeros_like(b_ih), w_hr, peep), sem, src


def _bidirectional_pairs(flat: Flat, sg: Any, ops: list) -> dict[int, int]:
    """``{backward op index: forward op index}`` for the converter's Bidirectional pattern (module docstring)."""
    made = {o: j for j, (_, _, outs, _) in enumerate(ops) for o in outs}
    used_by: dict[int, list[int]] = {}
    for j, (_, ins, _, _) in enumerate(ops):
        for i in ins:
            used_by.setdefault(i, []).append(j)
    pairs: dict[int, int] = {}
    for b, (name, ins, outs, op) in enumerate(ops):
        if name != LSTM_OP or not ins or ins[0] not in made or len(outs) != 1:
            continue
        r1 = ops[made[ins[0]]]
        if r1[0] != "REVERSE_V2":
            continue
        x = r1[1][0]
        axis = flat.ints(sg, r1[1][1]) if len(r1[1]) > 1 else None
        nxt = used_by.get(outs[0], [])
        if len(nxt) != 1 or ops[nxt[0]][0] != "REVERSE_V2":
            continue
        r2 = ops[nxt[0]]
        axis2 = flat.ints(sg, r2[1][1]) if len(r2[1]) > 1 else None
        cat = used_by.get(r2[2][0], [])
        if len(cat) != 1 or ops[cat[0]][0] != "CONCATENATION":
            continue
        c_ins = ops[cat[0]][1]
        fwd = [f for f, o in enumerate(ops) if o[0] == LSTM_OP and o[1] and o[1][0] == x and len(o[2]) == 1
               and c_ins == [o[2][0], r2[2][0]]]
        if len(fwd) != 1:
            continue
        copt = flat.tfl.ConcatenationOptions()
        t = ops[cat[0]][3].BuiltinOptions()
        if t is None:
            continue
        copt.Init(t.Bytes, t.Pos)
        rank = sg.Tensors(outs[0]).ShapeLength()
        lopt = flat.tfl.UnidirectionalSequenceLSTMOptions()
        lt = op.BuiltinOptions()
        if lt is None:
            continue
        lopt.Init(lt.Bytes, lt.Pos)
        time_axis = 0 if lopt.TimeMajor() else 1
        if copt.Axis() not in (-1, rank - 1) or axis is None or axis2 is None \
                or axis != [time_axis] or axis2 != [time_axis]:
            continue
        pairs[b] = fwd[0]
    return pairs


def read(path: str | Path, cell_clip: Any = None) -> Checkpoint:
    """Read every ``UNIDIRECTIONAL_SEQUENCE_LSTM`` op of ``path`` as a canonical LSTM layer.

    Args:
        cell_clip: ``None``/``"keep"`` (default): the op's ``cell_clip`` as stored (TF 2.21's converter writes
            10.0 for every Keras LSTM, which has none: PyTorch and ONNX cannot express it and refuse the
            layer); ``"none"``: drop it -- the layer then computes what the Keras model computed, and what the
            TFLite model computes while ``|c| < cell_clip`` (a note says so).

    Returns:
        one layer per op (``lstm_0``, ``lstm_1``, ... in op order; a Bidirectional pair is one layer), canonical
        gate order i f g o, ``out_in``; float32 (or float16) weights bit-exact; then per subgraph the Keras cells
        of its ``WHILE`` loops (:mod:`.tflite_while`: LSTM i f g o, GRU r z n, simple RNN; float32 bit-exact).

    Raises:
        FormatError: not a ``.tflite`` flatbuffer, damaged, no LSTM op and no ``WHILE`` loop. UnsupportedError: a
        refused op or feature (module docstring), or a loop body that is not exactly a Keras cell, named.
        DependencyError: the ``tflite`` schema package is missing.
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    if cell_clip not in (None, "keep", "none", "drop"):
        raise FormatError(f"{p}: cell_clip={cell_clip!r}: expected 'keep' or 'none'")
    try:
        return _read(p, cell_clip in ("none", "drop"))
    except (FormatError, UnsupportedError, DependencyError):
        raise
    except (struct.error, IndexError, ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise FormatError(f"{p}: damaged TensorFlow Lite flatbuffer ({type(exc).__name__}: {str(exc)[:80]})") \
            from None


def _check_work(flat: Flat, sgs: list, per_sg: list, loops: list[tuple[int, int, int]]) -> None:
    """Refuse, before the work, a file whose layers would take more than the ``graph_nodes`` limit of steps: each
    ``WHILE`` loop walks its own subgraph's ops and its cond and body subgraphs (which loops may share: a subgraph
    is named by index), and each fused LSTM op looks for its Bidirectional partner among its subgraph's ops.

    Raises:
        BudgetError: the sum over loops and LSTM ops passes the ``graph_nodes`` limit."""
    rec = [len(ops) + sum(len(i) + len(o) for _, i, o, _ in ops) + sg.TensorsLength()
           for sg, ops in zip(sgs, per_sg)]
    work = sum(rec[s] + rec[c] + rec[b] for s, c, b in loops)
    work += sum(len(ops) * sum(1 for o in ops if o[0] == LSTM_OP) for ops in per_sg)
    budget.check_count(flat.path, "graph_nodes", work, f"steps to read {len(loops):,} WHILE loops and the LSTM ops "
                       "(each loop walks its subgraph, its cond and its body)")


def _read(p: Path, drop_clip: bool) -> Checkpoint:
    flat = Flat(p)
    sgs = flat.subgraphs()
    budget.check_count(p, "names", len(sgs), "subgraphs")
    per_sg = []
    loop_sgs: set[int] = set()  # the cond and body subgraphs of WHILE ops (read by tflite_while)
    loops: list[tuple[int, int, int]] = []  # (subgraph, cond, body) of every WHILE op
    for s, sg in enumerate(sgs):
        budget.check_count(p, "names", sg.TensorsLength(), "tensors")
        ops = tflite_while.ops(flat, sg)
        for name, _, _, op in ops:
            if name in REFUSED_OPS:
                sname = (sg.Name() or b"").decode("utf-8", "replace") or str(s)
                raise UnsupportedError(f"{p}: subgraph '{sname}' holds {REFUSED_OPS[name]}; rnnconvert reads only "
                                       f"the fused {LSTM_OP} op and Keras cells in WHILE loops; refused (export a "
                                       "tf_keras LSTM, which the converter fuses, or convert the Keras model itself)")
            if name == "WHILE":
                loops.append((s, *tflite_while.subgraph_indices(flat, op)))
                loop_sgs.update(loops[-1][1:])
        per_sg.append(ops)
    _check_work(flat, sgs, per_sg, loops)
    layers: list[RNNLayer] = []
    tensors: dict[str, np.ndarray] = {}
    notes: list[str] = []
    for s, (sg, ops) in enumerate(zip(sgs, per_sg)):
        if s in loop_sgs:
            continue
        producers = {o: op for _, _, outs, op in ops for o in outs}
        pairs = _bidirectional_pairs(flat, sg, ops)
        made = {o: j for j, (_, _, outs, _) in enumerate(ops) for o in outs}
        units = []  # (dirs, row, sem, time_major, input tensor, output tensor)
        for j, (name, ins, outs, op) in enumerate(ops):
            if name != LSTM_OP or j in pairs:
                continue
            lname = f"lstm_{len(layers) + len(units)}"
            dirs = [j] + [b for b, f in pairs.items() if f == j]
            row, sems, srcs = [], [], []
            for d, k in enumerate(dirs):
                tag = f"subgraph {s} op {k} ({LSTM_OP}{', backward' if d else ''})"
                dp, sem, src = _direction(flat, sg, ops[k][1], ops[k][3], producers, tag, notes, tensors, lname, d)
                row.append(dp)
                sems.append(sem)
                srcs.append(src)
            if len(set(sems)) != 1 or len({(x.w_ih.shape, x.w_hh.shape, x.w_hr is None, x.peep is None) for x in row}) != 1:
                raise UnsupportedError(f"{p}: {lname}: the two directions of a Bidirectional pair differ in sizes or "
                                       "options; refused")
            out = outs[0]
            if len(dirs) == 2:  # the CONCATENATION that ends the pattern
                out = next(o[2][0] for o in ops if o[0] == "CONCATENATION" and o[1] and o[1][0] == outs[0])
            units.append((dirs, row, sems[0], srcs[0]["time_major"], ins[0], out))
        # rnnconvert's own files: a chain of units from graph input '<name>__in' to output '<name>__out' is one
        # stacked layer '<name>' (tflite_write); every other unit is a layer of its own
        tname = lambda t: (sg.Tensors(t).Name() or b"").decode("utf-8", "replace")  # noqa: E731
        by_input = {u[4]: u for u in units}
        taken: set[int] = set()
        groups = []
        for u in units:
            if id(u) in taken:
                continue
            chain = [u]
            nm = tname(u[4])
            if nm.endswith("__in") and made.get(u[4]) is None:
                while not tname(chain[-1][5]).endswith("__out") and chain[-1][5] in by_input \
                        and by_input[chain[-1][5]][2] == u[2] and len(chain) <= len(units):
                    chain.append(by_input[chain[-1][5]])
                if tname(chain[-1][5]) == nm[:-4] + "__out" and len({(len(c[0]), c[3]) for c in chain}) == 1:
                    groups.append((nm[:-4], chain))
                    taken.update(id(c) for c in chain)
                    continue
                chain = [u]
            groups.append((None, chain))
            taken.add(id(u))
        for gname, chain in groups:
            lname = gname or f"lstm_{len(layers)}"
            sem = chain[0][2]
            first = chain[0][1][0]
            if drop_clip and sem.cell_clip is not None:
                notes.append(f"{lname}: cell_clip {sem.cell_clip:g} of the TFLite op dropped (--read-opt "
                             "cell_clip=none): equal to the TFLite model while |c| stays below it")
                sem = replace(sem, cell_clip=None)
            try:
                layers.append(RNNLayer(
                    name=lname, cell=Cell.LSTM, input_size=first.w_ih.shape[1], hidden_size=first.w_hh.shape[0] // 4,
                    num_layers=len(chain), bidirectional=len(chain[0][0]) == 2,
                    proj_size=0 if first.w_hr is None else first.w_hr.shape[0], semantics=sem,
                    params=[c[1] for c in chain],
                    source={"format": "tflite",
                            "class_name": LSTM_OP + (" x2 (Bidirectional)" if len(chain[0][0]) == 2 else "")
                            + (f", cell_clip {sem.cell_clip:g}: --read-opt cell_clip=none drops it"
                               if sem.cell_clip is not None else ""),
                            "subgraph": s, "ops": [c[0] for c in chain], "time_major": chain[0][3]}))
            except ValueError as exc:
                raise FormatError(f"{p}: {lname}: {exc}") from exc
        _while_layers(flat, s, sg, ops, layers, notes)
    if not layers:
        listed, total = _constants(flat, sgs, loop_sgs)
        raise UnrecognisedError(f"{p}: no {LSTM_OP} op and no WHILE loop in the model; nothing recurrent to read",
                                tensors=names.listing(listed), total=total, suggested_map=[])
    meta: dict[str, Any] = {"path": str(p), "tflite_version": int(flat.model.Version())}
    if notes:
        meta["notes"] = notes
    return Checkpoint(layers=layers, tensors=tensors, format="tflite", meta=meta)


_KIND = {Cell.LSTM: "lstm", Cell.GRU: "gru", Cell.RNN_TANH: "simple_rnn", Cell.RNN_RELU: "simple_rnn"}

#: ``TensorType`` -> numpy dtype name (``schema.fbs``), for the listing of a file with nothing recurrent
_TYPE_NAMES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8",
               10: "float64", 12: "uint64", 15: "uint32", 16: "uint16"}


class _Listed:
    """A constant tensor as :func:`rnnconvert.core.names.listing` lists it: ``shape``, ``dtype`` (None: a type
    numpy has no name for), nothing read."""

    def __init__(self, shape: tuple[int, ...], dtype: str | None) -> None:
        self.shape, self.dtype = shape, dtype


def _constants(flat: Flat, sgs: list, loop_sgs: set[int]) -> tuple[dict[str, _Listed], int]:
    """The first :data:`rnnconvert.core.names.LISTED` constant tensors (a non-empty buffer) of the subgraphs that
    are not a loop's, by name (``name``, ``name#2``... when names repeat), and how many there are; their bytes
    are not read (the tensor tables are distinct and each within ``RNNCONVERT_MAX_NAMES``, checked before)."""
    out: dict[str, _Listed] = {}
    total = 0
    for s, sg in enumerate(sgs):
        if s in loop_sgs:
            continue
        for t in range(sg.TensorsLength()):
            tt = sg.Tensors(t)
            b = tt.Buffer()
            if not 0 <= b < flat.nbuf:
                continue
            buf = flat.model.Buffers(b)
            if not (buf.DataLength() or buf.Size()):
                continue
            total += 1
            if len(out) >= names.LISTED:
                continue
            name = (tt.Name() or b"").decode("utf-8", "replace") or f"tensor {t}"
            key, k = name, 1
            while key in out:
                k += 1
                key = f"{name}#{k}"
            shape = tuple(int(d) for d in tt.ShapeAsNumpy()) if tt.ShapeLength() else ()
            out[key] = _Listed(shape, _TYPE_NAMES.get(int(tt.Type())))
    return out, total


_GATES = {"hard_sigmoid": "Keras 2 hard_sigmoid gates clip(0.2 x + 0.5, 0, 1)",
          "hard_sigmoid_k3": "Keras 3 hard_sigmoid gates relu6(x + 3) / 6"}


def _while_layers(flat: Flat, s: int, sg: Any, ops: list, layers: list[RNNLayer], notes: list[str]) -> None:
    """Append the Keras cells of subgraph ``s``'s ``WHILE`` loops (:mod:`.tflite_while`) as layers
    ``<gru|lstm|simple_rnn>_<k>`` (``k`` counts every layer read so far); a Bidirectional pair is one layer.
    A ``hard_sigmoid`` gate (which definition, by its constants) is named in ``source['class_name']``; the
    multiplies by ones read as the identity (Keras' dropout at inference) are a note in ``notes``."""
    loops = {j: tflite_while.read_loop(flat, s, sg, ops, j) for j, o in enumerate(ops) if o[0] == "WHILE"}
    pairs = tflite_while.bidirectional_pairs(flat, sg, ops, loops)
    for j, lp in loops.items():
        if j in pairs:
            continue
        back = [loops[b] for b, f in pairs.items() if f == j]
        lname = f"{_KIND[lp.cell]}_{len(layers)}"
        sem = lp.semantics if not back else replace(lp.semantics, go_backwards=False)
        ones = lp.ones + sum(b.ones for b in back)
        if ones:
            notes.append(f"{lname}: {ones} MUL op(s) by a constant of ones in the loop body read as the identity "
                         "(Keras' dropout mask at inference; exact)")
        gates_txt = f", {_GATES[sem.gate_activation]}" if sem.gate_activation in _GATES else ""
        try:
            layers.append(RNNLayer(
                name=lname, cell=lp.cell, input_size=lp.input_size, hidden_size=lp.hidden_size,
                bidirectional=bool(back), semantics=sem, params=[[lp.params] + [b.params for b in back]],
                return_sequences=lp.return_sequences,
                source={"format": "tflite", "class_name": f"WHILE loop ({lp.cell.value} cell{gates_txt})"
                        + (" x2 (Bidirectional)" if back else ""), "subgraph": s,
                        "ops": [j] + [b.op for b in back], "body": [lp.body] + [b.body for b in back],
                        "time_major": False}))
        except ValueError as exc:
            raise FormatError(f"{flat.path}: {lname}: {exc}") from exc
