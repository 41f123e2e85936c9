"""Recognise the recurrent cell in a TFLite ``WHILE`` loop (TF 2.21's converter writes Keras ``GRU``,
``SimpleRNN`` and Keras 3 ``LSTM``/``GRU`` layers this way) and read its constant weights, never guessing.

Layout facts (``tensorflow/lite/schema/schema.fbs`` ``WhileOptions {cond_subgraph_index, body_subgraph_index}``;
``tensorflow/lite/kernels/while.cc``: the loop variables are the op's inputs, the body subgraph's inputs and
outputs, and the op's outputs, in one order; the body runs while the cond subgraph returns true;
``tensorflow/compiler/mlir/lite/transforms/lower_static_tensor_list.cc``: the converter lowers the Keras loop's
``TensorList`` to a plain tensor, ``GetItem`` to ``GATHER`` and ``SetItem`` to ``SLICE``/``CONCATENATION``). What TF
2.21's converter writes for a Keras recurrent layer (``fixtures/gen_tflite_while.py``; tf_keras
``backend.rnn``, Keras 3 ``keras/src/backend/tensorflow/rnn.py``):

* main graph: ``TRANSPOSE(x, [1, 0, 2])`` (time-major; ``REVERSE_V2`` on axis 0 after it when
  ``go_backwards``) -> ``WHILE(iteration, t, outputs, h[, c], sequence)`` -> ``TRANSPOSE`` of the outputs
  (``return_sequences``) or ``STRIDED_SLICE`` of the ``(1, B, H)`` last output (``return_sequences=False``);
* cond: ``LESS(t, T)`` (Keras 3: ``LOGICAL_AND`` of it and ``LESS(iteration, T)``);
* body: ``iteration + 1``, ``t + 1``, ``x_t = GATHER(sequence, t)``, the cell, and the outputs' update: the
  ``(T, B, H)`` tensor with row ``t`` replaced by ``h'`` (``CONCATENATION(SLICE(.., :t), RESHAPE(h'),
  SLICE(.., t+1:))``), or ``RESHAPE(h', (1, B, H))`` for the last output only.

The cell is read by evaluating the body's ops symbolically: ``FULLY_CONNECTED`` (weights ``(out, in)``, optional
bias) and ``BATCH_MATMUL`` with a constant ``(in, out)`` right side are affine maps of their input; ``ADD`` of
affine maps (or of a constant vector) is one affine map, each bias kept with the matmul it came with;
``SPLIT``/``SPLIT_V``/``STRIDED_SLICE`` on the last axis cut an affine map's rows; ``LOGISTIC``, ``TANH``,
``RELU`` (or a ``RELU`` fused activation), ``MUL``, ``SUB(1, z)`` and the remaining ``ADD`` build the cell's
expression. A gate may also be Keras' ``hard_sigmoid``: scalar ``MUL``/``DIV``/``ADD`` and ``MINIMUM``/
``MAXIMUM``/``RELU``/``RELU6`` (or a fused ``RELU``/``RELU6``) of a gate's matmul compose into one
``clip(s x + b, lo, hi)`` (kind ``pw``), accepted only when its constants are Keras 2's ``(0.2, 0.5, 0, 1)``
(tf_keras ``backend.hard_sigmoid``: the converter writes ``MUL 0.2, ADD 0.5, MINIMUM 1, RELU``; issue
#42's on-device files ``MAXIMUM 0``) or Keras 3's ``(1/6, 0.5, 0, 1)`` (``relu6(x + 3) / 6``: ``ADD 3`` with
a fused ``RELU6``, ``MUL 0.16666667``), within one float32 rounding (:func:`gate_kind`); which one is recorded
(``hard_sigmoid`` or ``hard_sigmoid_k3``). A ``MUL`` by a float32 constant of ones (Keras' dropout mask at
inference, which TF 2.21 folds away but issue #42's on-device files hold) is the identity, exact, counted in
:attr:`Loop.ones`. The expression must be exactly one of (gates identified by their place in the equations,
never by the split order; canonical order ``core/gates.CANONICAL``; gate activation sigmoid or one of the
hard_sigmoids, the same for every gate):

* SimpleRNN: ``h' = act(W x + b + U h)``, act tanh, relu or none (linear);
* LSTM: ``c' = f * c + i * tanh(g)``, ``h' = o * tanh(c')``, i f o = ``LOGISTIC``;
* GRU, reset after the matmul (Keras 2 ``reset_after=True``, Keras 3): ``h' = z * h + (1 - z) *
  tanh(W_n x + b_in + r * (U_n h + b_hn))``;
* GRU, reset before (``reset_after=False``): ``h' = z * h + (1 - z) * tanh(W_n x + b_in + U_n (r * h))``;
* either GRU with ``activation='linear'`` (no op around the candidate; the wake-word GRUs of Mycroft Precise).

Anything else -- an op outside these, an op no output depends on, a fused activation other than relu, a
second sequence (a Keras mask: ``SELECT_V2``), weights in resource variables (``READ_VARIABLE``), a gate
activation other than ``LOGISTIC`` or a Keras hard_sigmoid (a clip with other constants names them), a non-zero
or non-constant initial state -- raises :class:`~rnnconvert.errors.UnsupportedError` naming the op and the
subgraph. Weights are float32 constants, taken bit-exact (rows of the ``(out, in)`` matrices), or float16 constants
behind ``DEQUANTIZE`` (the converter's float16 quantisation), read as the float32 values the op computes (exact).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, DirectionParams, Semantics
from ...errors import FormatError, UnsupportedError
from ...safety import budget

_FUSED = {0: None, 1: "relu"}  # ActivationFunctionType NONE, RELU; others refused
_FUSED_NAMES = {2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}


@dataclass(eq=False)
class _N:
    """A symbolic value of the loop body: ``kind`` in x, state, t, iter, seq, acc, const, aff, sig, tanh, relu,
    mul, add, one_minus, pw. ``aff``: ``terms`` {source node: (out, in) matrix}, ``bias`` {source node or None (a
    bias added on its own): (out,) vector}. ``pw``: ``clip(s * args[0] + b, lo, hi)`` of an ``aff`` node,
    ``value`` ``(s, b, lo, hi)`` (float64)."""

    kind: str
    args: tuple = ()
    op: int = -1
    terms: dict = field(default_factory=dict)
    bias: dict = field(default_factory=dict)
    value: Any = None
    var: int = -1


@dataclass
class Loop:
    """One recognised ``WHILE`` recurrence: a direction's canonical parameters and where it sits in the graph.

    ``x`` / ``out``: the main graph's tensors of the layer input (``(B, T, I)`` before the ``TRANSPOSE``, or the
    previous loop's time-major outputs) and of its output (after the ``TRANSPOSE`` or ``STRIDED_SLICE``; ``-1`` when
    the outputs are used otherwise)."""

    cell: Cell
    params: DirectionParams
    semantics: Semantics
    x: int
    out: int
    return_sequences: bool
    op: int
    body: str
    input_size: int
    hidden_size: int
    ones: int = 0  #: MUL ops by a constant of ones read as the identity (Keras' dropout mask at inference)


def ops(flat, sg) -> list[tuple[str, list[int], list[int], Any]]:
    """``(op name, input tensor indices, output tensor indices, operator)`` of every operator of subgraph ``sg``
    (the main graph, or a loop's body), in order; their count within the resource budget (``graph_nodes``)."""
    budget.check_count(flat.path, "graph_nodes", sg.OperatorsLength(), "operators")
    out = []
    for j in range(sg.OperatorsLength()):
        op = sg.Operators(j)
        ins = [int(v) for v in op.InputsAsNumpy()] if op.InputsLength() else []
        outs = [int(v) for v in op.OutputsAsNumpy()] if op.OutputsLength() else []
        out.append((flat.op_name(op), ins, outs, op))
    return out


def _options(flat, op, cls: str):
    o = getattr(flat.tfl, cls)()
    t = op.BuiltinOptions()
    if t is None:
        return None
    o.Init(t.Bytes, t.Pos)
    return o


def subgraph_indices(flat, op) -> tuple[int, int]:
    """``(cond, body)`` subgraph indices of a ``WHILE`` op (``WhileOptions``)."""
    o = _options(flat, op, "WhileOptions")
    if o is None:
        raise FormatError(f"{flat.path}: a WHILE op without WhileOptions")
    n = flat.model.SubgraphsLength()
    c, b = int(o.CondSubgraphIndex()), int(o.BodySubgraphIndex())
    if not (0 <= c < n and 0 <= b < n):
        raise FormatError(f"{flat.path}: a WHILE op names subgraphs {c}, {b}; the model has {n}")
    return c, b


class _Body:
    """The symbolic evaluation of one body subgraph (see the module docstring)."""

    def __init__(self, flat, sg, tag: str, leaves: dict[int, _N]) -> None:
        self.flat, self.sg, self.tag = flat, sg, tag
        self.ops = ops(flat, sg)
        self.made = {o: j for j, (_, _, outs, _) in enumerate(self.ops) for o in outs}
        self.memo: dict[int, _N] = dict(leaves)
        self.seen: set[int] = set()
        self.ones: list[int] = []  # MUL ops by a constant of ones (Keras' dropout mask at inference)

    def refuse(self, j: int, why: str) -> UnsupportedError:
        where = f"op {j} ({self.ops[j][0]}) " if 0 <= j < len(self.ops) else ""
        return UnsupportedError(f"{self.flat.path}: {self.tag}: {where}{why}; rnnconvert reads a WHILE loop only when "
                                "its body is exactly a Keras SimpleRNN, GRU or LSTM cell; refused (convert the Keras "
                                "model itself)")

    def const(self, t: int) -> np.ndarray | None:
        """Constant tensor ``t`` (float32, int32/int64), or None when it is computed or a loop variable; a
        ``DEQUANTIZE`` of a float16 constant (the converter's float16 quantisation) is that constant widened to
        float32 -- exactly what the op computes -- and the op counts as read."""
        if not 0 <= t < self.sg.TensorsLength() or t in self.memo:
            return None
        if t in self.made:
            j = self.made[t]
            name, ins, _, _ = self.ops[j]
            if name != "DEQUANTIZE" or len(ins) != 1 or not 0 <= ins[0] < self.sg.TensorsLength() \
                    or ins[0] in self.made or self.sg.Tensors(ins[0]).Type() != 1:
                return None
            a = self.flat.array(self.sg, ins[0], f"tensor {ins[0]}")
            if a is None:
                return None
            self.seen.add(j)
            return a.astype(np.float32)
        tt = self.sg.Tensors(t)
        raw = self.flat.data(tt)
        if not raw:
            return None
        dt = {0: "<f4", 2: "<i4", 4: "<i8"}.get(tt.Type())
        if dt is None:
            return self.flat.array(self.sg, t, f"tensor {t}")  # refuses quantised weights, names the type
        shape = tuple(int(s) for s in tt.ShapeAsNumpy()) if tt.ShapeLength() else ()
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if n * np.dtype(dt).itemsize != len(raw):
            raise FormatError(f"{self.flat.path}: {self.tag}: tensor {t} of shape {shape} holds {len(raw)} bytes")
        return np.frombuffer(raw, dtype=dt).reshape(shape).astype(np.dtype(dt).newbyteorder("="))

    def shape(self, t: int) -> tuple[int, ...]:
        tt = self.sg.Tensors(t)
        return tuple(int(s) for s in tt.ShapeAsNumpy()) if tt.ShapeLength() else ()

    def ev(self, t: int, depth: int = 0) -> _N:
        if t in self.memo:
            return self.memo[t]
        if depth > 200:
            raise FormatError(f"{self.flat.path}: {self.tag}: the loop body nests deeper than 200 ops")
        c = self.const(t)
        if c is not None:
            n = _N("const", value=c)
            self.memo[t] = n
            return n
        if t not in self.made:
            raise FormatError(f"{self.flat.path}: {self.tag}: tensor {t} is neither computed, a loop variable nor a "
                              "constant")
        j = self.made[t]
        name, ins, outs, op = self.ops[j]
        self.seen.add(j)
        res = self._op(j, name, ins, outs, op, depth)
        for o, n in zip(outs, res):
            self.memo[o] = n
        if t not in self.memo:
            raise self.refuse(j, "has an output the cell does not use")
        return self.memo[t]

    def _fused(self, j: int, op, cls: str, n: _N) -> _N:
        o = _options(self.flat, op, cls)
        code = 0 if o is None else int(o.FusedActivationFunction())
        if code not in _FUSED:
            raise self.refuse(j, f"has the fused activation {_FUSED_NAMES.get(code, code)}, not a Keras cell's")
        return n if _FUSED[code] is None else _N(_FUSED[code], (n,), j)

    def _op(self, j, name, ins, outs, op, depth) -> list[_N]:
        ev = lambda k: self.ev(ins[k], depth + 1)  # noqa: E731
        if name == "GATHER":
            a, i = ev(0), ev(1)
            o = _options(self.flat, op, "GatherOptions")
            if a.kind != "seq" or i.kind != "t" or (o is not None and (o.Axis() != 0 or o.BatchDims() != 0)):
                raise self.refuse(j, "is not the step's GATHER(sequence, t) on axis 0")
            return [_N("x", (), j)]
        if name in ("FULLY_CONNECTED", "BATCH_MATMUL"):
            if len(ins) < 2:
                raise self.refuse(j, "has fewer than two inputs")
            a = ev(0)
            w = self.const(ins[1])
            if w is None and ins[1] in self.made:
                ev(1)  # a computed right side: refused naming the op that computes it (READ_VARIABLE...)
            if a.kind in ("const", "aff", "seq", "acc", "t", "iter", "pass") or w is None or w.ndim != 2 \
                    or w.dtype != np.float32:
                raise self.refuse(j, "is not a float32 matmul of the step's values by a constant matrix")
            if name == "FULLY_CONNECTED":
                o = _options(self.flat, op, "FullyConnectedOptions")
                if o is not None and o.WeightsFormat() != 0:
                    raise self.refuse(j, "has shuffled weights (weights_format)")
                b = self.const(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
                if len(ins) > 2 and ins[2] >= 0 and (b is None or b.shape != (w.shape[0],) or b.dtype != np.float32):
                    raise self.refuse(j, "has a bias that is not a constant float32 (out,) vector")
                n = _N("aff", (), j, {a: w}, {} if b is None else {a: b})
                return [self._fused(j, op, "FullyConnectedOptions", n)]
            o = _options(self.flat, op, "BatchMatMulOptions")
            if len(ins) != 2 or (o is not None and o.AdjX()):
                raise self.refuse(j, "is not x @ W with a constant W")
            return [_N("aff", (), j, {a: w if (o is not None and o.AdjY()) else np.ascontiguousarray(w.T)}, {})]
        if name == "ADD":
            a, b = ev(0), ev(1)
            if a.kind == "const" and b.kind != "const":
                a, b = b, a
            if a.kind == "aff" and b.kind == "aff":
                if set(a.terms) & set(b.terms) or set(a.bias) & set(b.bias):
                    raise self.refuse(j, "adds two matmuls of the same value")
                if _width(a) != _width(b):
                    raise self.refuse(j, f"adds {_width(a)} columns to {_width(b)}")
                n = _N("aff", (), j, a.terms | b.terms, a.bias | b.bias)
            elif b.kind == "const" and b.value.size == 1 and (a.kind == "pw" or a.kind == "aff" and (
                    b.value.ndim == 0 or _width(a) != 1)):  # a scalar: hard_sigmoid's shift, not a bias vector
                return [self._chain(j, op, "AddOptions", a, "add", b.value)]
            elif a.kind == "aff" and b.kind == "const":
                v = b.value
                width = _width(a)
                if v.dtype != np.float32 or v.reshape(-1).shape != (width,) or v.ndim > 2 or None in a.bias:
                    raise self.refuse(j, "adds a constant that is not one float32 bias vector")
                n = _N("aff", (), j, a.terms, a.bias | {None: v.reshape(-1)})
            elif "const" in (a.kind, b.kind) or a.kind in ("t", "iter"):
                raise self.refuse(j, "adds a constant to a non-linear value")
            else:
                n = _N("add", (a, b), j)
            return [self._fused(j, op, "AddOptions", n)]
        if name == "MUL":
            a, b = ev(0), ev(1)
            if a.kind == "const" and b.kind != "const":
                a, b, ins = b, a, [ins[1], ins[0], *ins[2:]]
            if b.kind == "const" and a.kind not in ("const", "t", "iter", "seq", "acc", "pass") \
                    and b.value.dtype == np.float32 and bool(np.all(b.value == 1.0)) \
                    and self.shape(outs[0]) == self.shape(ins[0]):
                self.ones.append(j)  # Keras' inference-time dropout: times a mask of ones (exact)
                return [self._fused(j, op, "MulOptions", a)]
            if b.kind == "const" and a.kind in ("aff", "pw") and b.value.size == 1:
                return [self._chain(j, op, "MulOptions", a, "mul", b.value)]
            if "const" in (a.kind, b.kind) or "aff" in (a.kind, b.kind) \
                    and not {a.kind, b.kind} <= {"aff", "sig", "pw", "one_minus"}:
                raise self.refuse(j, "multiplies by a constant or a bare matmul")
            return [self._fused(j, op, "MulOptions", _N("mul", (a, b), j))]
        if name in ("MINIMUM", "MAXIMUM", "DIV"):
            a, b = ev(0), ev(1)
            if a.kind == "const" and name != "DIV":
                a, b = b, a
            if a.kind not in ("aff", "pw") or b.kind != "const" or b.value.size != 1:
                raise self.refuse(j, f"is not a {name} of a gate's pre-activation by a constant scalar (Keras "
                                  "hard_sigmoid)")
            return [self._chain(j, op, "DivOptions" if name == "DIV" else None, a,
                                {"MINIMUM": "min", "MAXIMUM": "max", "DIV": "div"}[name], b.value)]
        if name in ("RELU6", "RELU_0_TO_1", "RELU_N1_TO_1") or name == "RELU" and ins and self._is_chain(ins[0], depth):
            a = ev(0)
            if a.kind not in ("aff", "pw"):
                raise self.refuse(j, "is not a clip of a gate's pre-activation (Keras hard_sigmoid)")
            lo, hi = {"RELU": (0.0, np.inf), "RELU6": (0.0, 6.0), "RELU_0_TO_1": (0.0, 1.0),
                      "RELU_N1_TO_1": (-1.0, 1.0)}[name]
            n = self._chain(j, None, None, a, "max", np.float32(lo))
            return [self._chain(j, None, None, n, "min", np.float32(hi))]
        if name == "SUB":
            a, b = ev(0), ev(1)
            ones = a.kind == "const" and a.value.dtype == np.float32 and bool(np.all(a.value == 1.0)) \
                and (a.value.size == 1 or a.value.shape == self.shape(outs[0]))
            if not ones or b.kind == "const":
                raise self.refuse(j, "is not 1 - z")
            return [self._fused(j, op, "SubOptions", _N("one_minus", (b,), j))]
        if name in ("LOGISTIC", "TANH", "RELU"):
            a = ev(0)
            if a.kind == "const":
                raise self.refuse(j, "acts on a constant")
            return [_N({"LOGISTIC": "sig", "TANH": "tanh", "RELU": "relu"}[name], (a,), j)]
        if name in ("SPLIT", "SPLIT_V"):
            src_k, axis_k = (1, 0) if name == "SPLIT" else (0, 2)
            a = ev(src_k)
            axis = self.const(ins[axis_k])
            if a.kind != "aff" or axis is None or axis.size != 1 or int(axis.reshape(-1)[0]) not in (-1, 1):
                raise self.refuse(j, "is not a split of a matmul's output along its last axis")
            width = _width(a)
            if name == "SPLIT":
                if width % len(outs):
                    raise self.refuse(j, f"splits {width} columns in {len(outs)}")
                sizes = [width // len(outs)] * len(outs)
            else:
                sz = self.const(ins[1])
                if sz is None or sz.ndim != 1 or len(sz) != len(outs) or np.sum(sz == -1) > 1:
                    raise self.refuse(j, "has size_splits that are not a constant")
                sizes = [int(s) for s in sz]
                if -1 in sizes:
                    sizes[sizes.index(-1)] = width - (sum(sizes) + 1)
                if sum(sizes) != width or min(sizes) < 0:
                    raise self.refuse(j, f"splits {width} columns as {sizes}")
            res, start = [], 0
            for s in sizes:
                res.append(self._rows(a, start, start + s, j))
                start += s
            return res
        if name == "STRIDED_SLICE":
            a = ev(0)
            b, e, s = (self.const(ins[k]) if len(ins) > k else None for k in (1, 2, 3))
            o = _options(self.flat, op, "StridedSliceOptions")
            if a.kind != "aff" or o is None or any(v is None or v.shape != (2,) for v in (b, e, s)) \
                    or np.any(s != 1) or o.EllipsisMask() or o.NewAxisMask() or o.ShrinkAxisMask() \
                    or getattr(o, "Offset", lambda: False)() or not (o.BeginMask() & 1 and o.EndMask() & 1):
                raise self.refuse(j, "is not a constant slice of a matmul's columns")
            width = _width(a)
            lo = 0 if o.BeginMask() & 2 else int(b[1])
            hi = width if o.EndMask() & 2 else int(e[1])
            lo, hi = (lo + width if lo < 0 else lo), (hi + width if hi < 0 else hi)
            if not 0 <= lo < hi <= width:
                raise self.refuse(j, f"slices columns {lo}:{hi} of {width}")
            return [self._rows(a, lo, hi, j)]
        raise self.refuse(j, "is not an op of a Keras recurrent cell")

    def _is_chain(self, t: int, depth: int) -> bool:
        """Whether tensor ``t`` is a ``pw`` chain (a RELU after it continues the chain, not a SimpleRNN's relu)."""
        return t in self.made and self.ev(t, depth + 1).kind == "pw"

    def _chain(self, j: int, op, cls: str | None, a: _N, step: str, c: np.ndarray) -> _N:
        """``a`` (an affine map or a ``pw`` chain over one) followed by the scalar step ``step`` by ``c``, as one
        ``pw`` node ``clip(s * pre + b, lo, hi)`` over the affine map ``pre`` (``value``: ``(s, b, lo, hi)`` in
        float64, the constants' float32 values composed); the op's fused activation (RELU, RELU6, RELU_N1_TO_1)
        continues the chain."""
        if c.dtype != np.float32:
            raise self.refuse(j, "scales, shifts or clips by a constant that is not float32")
        v = float(c.reshape(-1)[0])
        pre, (s, b, lo, hi) = (a, (1.0, 0.0, -np.inf, np.inf)) if a.kind == "aff" else (a.args[0], a.value)
        if step in ("mul", "div"):
            if not v > 0 or not np.isfinite(v):
                raise self.refuse(j, f"scales by {v:g}; a Keras hard_sigmoid scales by a positive constant")
            f = v if step == "mul" else 1.0 / v
            s, b, lo, hi = s * f, b * f, lo * f, hi * f
        elif step == "add":
            b, lo, hi = b + v, lo + v, hi + v
        elif step == "min":
            lo, hi = min(lo, v), min(hi, v)
        else:
            lo, hi = max(lo, v), max(hi, v)
        n = _N("pw", (pre,), j, value=(s, b, lo, hi))
        if cls is None:
            return n
        o = _options(self.flat, op, cls)
        code = 0 if o is None else int(o.FusedActivationFunction())
        clip = {0: None, 1: (0.0, np.inf), 2: (-1.0, 1.0), 3: (0.0, 6.0)}.get(code, False)
        if clip is False:
            raise self.refuse(j, f"has the fused activation {_FUSED_NAMES.get(code, code)}, not a Keras cell's")
        if clip is not None:
            n = self._chain(j, None, None, n, "max", np.float32(clip[0]))
            n = self._chain(j, None, None, n, "min", np.float32(clip[1]))
        return n

    @staticmethod
    def _rows(a: _N, lo: int, hi: int, j: int) -> _N:
        return _N("aff", (), j, {k: v[lo:hi] for k, v in a.terms.items()},
                  {k: v[lo:hi] for k, v in a.bias.items()})


def _width(a: _N) -> int:
    """Output columns of an affine node."""
    return next(iter(a.terms.values())).shape[0]


def _pair(n: _N, kind: str, test) -> tuple[_N, _N] | None:
    """``(a, b)`` of a commutative ``kind`` node with ``test(a)`` true (either order), else None."""
    if n.kind != kind:
        return None
    a, b = n.args
    if test(a):
        return a, b
    if test(b):
        return b, a
    return None


class _NoMatch(Exception):
    def __init__(self, node: _N, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


def _lin(n: _N, srcs: tuple, what: str) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """The matrices and biases of an affine node over exactly ``srcs`` (free bias goes with ``srcs[0]``)."""
    if n.kind != "aff" or set(n.terms) != set(srcs) or not set(n.bias) <= set(srcs) | {None}:
        raise _NoMatch(n, f"{what} is not a matmul of {'and '.join(s.kind for s in srcs)} plus bias")
    if None in n.bias and srcs[0] in n.bias:
        raise _NoMatch(n, f"{what} has two biases on one side")
    bs = [n.bias.get(s) for s in srcs]
    if None in n.bias:
        bs[0] = n.bias[None]
    return [n.terms[s] for s in srcs], bs


#: Keras' hard_sigmoid definitions as ``clip(s * x + b, lo, hi)``: Keras 2 (tf_keras ``backend.hard_sigmoid``:
#: ``clip(0.2 x + 0.5, 0, 1)``) and Keras 3 (``keras/src/backend/tensorflow/nn.py``: ``relu6(x + 3) / 6``), the
#: names :class:`~rnnconvert.core.model.Semantics` gives them
HARD_SIGMOIDS = {"hard_sigmoid": (float(np.float32(0.2)), 0.5, 0.0, 1.0),
                 "hard_sigmoid_k3": (1.0 / 6.0, 0.5, 0.0, 1.0)}


def gate_kind(n: _N) -> str | None:
    """The gate activation ``n`` applies: ``sigmoid`` (``LOGISTIC``), ``hard_sigmoid`` / ``hard_sigmoid_k3`` (a
    ``pw`` chain whose composed constants are Keras 2's or Keras 3's within one float32 rounding: 2^-23
    relative, so ``x * float32(1/6)`` and ``x / 6`` are both Keras 3's), or None."""
    if n.kind == "sig":
        return "sigmoid"
    if n.kind != "pw":
        return None
    for name, want in HARD_SIGMOIDS.items():
        if all(abs(g - w) <= 2.0 ** -23 * max(abs(w), 1e-30) if w else g == 0 for g, w in zip(n.value, want)):
            return name
    return None


def _pw_text(n: _N) -> str:
    s, b, lo, hi = n.value
    return f"clip({s:.9g} x + {b:.9g}, {lo:g}, {hi:g})"


def _gate(n: _N, kind: str, x: _N, h: _N, what: str):
    """``(W_x, W_h, b_x, b_h)`` of gate ``n``: ``kind`` ``"sig"`` takes any gate activation (:func:`gate_kind`),
    else ``n`` must be ``kind(...)``."""
    if kind == "sig" and n.kind == "pw" and gate_kind(n) is None:
        raise _NoMatch(n, f"{what} is {_pw_text(n)}, neither Keras 2's hard_sigmoid clip(0.2 x + 0.5, 0, 1) nor "
                          "Keras 3's relu6(x + 3) / 6")
    if (gate_kind(n) is None) if kind == "sig" else n.kind != kind:
        raise _NoMatch(n, f"{what} is not {kind}(...)")
    (wx, wh), (bx, bh) = _lin(n.args[0], (x, h), what)
    return wx, wh, bx, bh


def _one_gate_kind(nodes: list[_N]) -> str:
    kinds = {gate_kind(n) for n in nodes}
    if len(kinds) != 1:
        raise _NoMatch(nodes[0], f"the gates use different activations ({', '.join(sorted(map(str, kinds)))})")
    return kinds.pop()


def _cell(outs: dict[int, _N], x: _N, states: list[_N]):
    """Match the state outputs to a cell. Returns (cell, {gate: (W_x, W_h, b_x, b_h)}, activation, reset_after,
    h state index, gate activation)."""
    if len(states) == 2:
        for hs, cs in ((states[0], states[1]), (states[1], states[0])):
            hn, cn = outs[hs.var], outs[cs.var]
            p = _pair(hn, "mul", lambda a: a.kind == "tanh" and a.args[0] is cn)
            if p is None:
                continue
            g = {"o": _gate(p[1], "sig", x, hs, "the output gate")}
            gnodes = [p[1]]
            if cn.kind != "add":
                raise _NoMatch(cn, "c' is not f * c + i * g")
            fc = [a for a in cn.args if a.kind == "mul" and cs in a.args]
            if len(fc) != 1:
                raise _NoMatch(cn, "c' is not f * c + i * g")
            other = cn.args[1] if cn.args[0] is fc[0] else cn.args[0]
            f = fc[0].args[1] if fc[0].args[0] is cs else fc[0].args[0]
            g["f"] = _gate(f, "sig", x, hs, "the forget gate")
            ig = _pair(other, "mul", lambda a: gate_kind(a) is not None)
            if ig is None or ig[1].kind != "tanh":
                raise _NoMatch(other, "i * tanh(g) not found")
            g["i"] = _gate(ig[0], "sig", x, hs, "the input gate")
            g["g"] = _gate(ig[1], "tanh", x, hs, "the cell candidate")
            return Cell.LSTM, g, "tanh", True, hs.var, _one_gate_kind(gnodes + [f, ig[0]])
        raise _NoMatch(outs[states[0].var], "neither state output is o * tanh(c')")
    h = states[0]
    hn = outs[h.var]
    if hn.kind in ("tanh", "relu"):
        return (Cell.RNN_TANH if hn.kind == "tanh" else Cell.RNN_RELU,
                {"h": _gate(hn, hn.kind, x, h, "the SimpleRNN step")}, hn.kind, True, h.var, "sigmoid")
    if hn.kind == "aff":  # SimpleRNN(activation=None): linear (Cell.RNN_TANH with activation 'linear', as Keras')
        (wx, wh), (bx, bh) = _lin(hn, (x, h), "the SimpleRNN step")
        return Cell.RNN_TANH, {"h": (wx, wh, bx, bh)}, "linear", True, h.var, "sigmoid"
    if hn.kind != "add":
        raise _NoMatch(hn, "h' is neither act(W x + U h + b) nor z * h + (1 - z) * n")
    zh = [a for a in hn.args if a.kind == "mul" and h in a.args]
    if len(zh) != 1:
        raise _NoMatch(hn, "h' has no z * h term")
    z = zh[0].args[1] if zh[0].args[0] is h else zh[0].args[0]
    rest = hn.args[1] if hn.args[0] is zh[0] else hn.args[0]
    p = _pair(rest, "mul", lambda a: a.kind == "one_minus" and a.args[0] is z)
    if p is None or p[1].kind not in ("tanh", "add", "aff"):
        raise _NoMatch(rest, "h' has no (1 - z) * tanh(...) (or linear) term with the same z")
    g = {"z": _gate(z, "sig", x, h, "the update gate")}
    act, inner = ("tanh", p[1].args[0]) if p[1].kind == "tanh" else ("linear", p[1])  # activation='linear': no op
    if inner.kind == "add":  # reset after: W_n x + b_in + r * (U_n h + b_hn)
        m = [a for a in inner.args if a.kind == "mul"]
        rp = _pair(m[0], "mul", lambda a: gate_kind(a) is not None) if len(m) == 1 else None
        ax = inner.args[1] if m and inner.args[0] is m[0] else inner.args[0]
        if rp is None or ax.kind != "aff":
            raise _NoMatch(inner, "the candidate is not W_n x + r * (U_n h + b_hn)")
        g["r"] = _gate(rp[0], "sig", x, h, "the reset gate")
        (wx,), (bx,) = _lin(ax, (x,), "the candidate's input side")
        (wh,), (bh,) = _lin(rp[1], (h,), "the candidate's recurrent side")
        g["n"] = (wx, wh, bx, bh)
        return Cell.GRU, g, act, True, h.var, _one_gate_kind([z, rp[0]])
    rh = [s for s in inner.terms if s.kind == "mul" and h in s.args] if inner.kind == "aff" else []
    if len(rh) != 1:
        raise _NoMatch(inner, "the candidate is neither W_n x + r * (U_n h) nor W_n x + U_n (r * h)")
    r = rh[0].args[1] if rh[0].args[0] is h else rh[0].args[0]
    g["r"] = _gate(r, "sig", x, h, "the reset gate")
    (wx, wh), (bx, bh) = _lin(inner, (x, rh[0]), "the candidate")
    g["n"] = (wx, wh, bx, bh)
    return Cell.GRU, g, act, False, h.var, _one_gate_kind([z, r])


def read_loop(flat, s: int, sg, ops: list, j: int) -> Loop:
    """The ``WHILE`` op ``j`` of subgraph ``s`` (``ops``: its ``(name, inputs, outputs, op)`` list) as one
    direction of a canonical layer.

    Raises:
        UnsupportedError: the loop is not exactly a Keras cell (module docstring), naming the op and subgraph.
        FormatError: a damaged loop (indices, shapes).
    """
    p = flat.path
    sname = lambda k: (flat.model.Subgraphs(k).Name() or b"").decode("utf-8", "replace") or str(k)  # noqa: E731
    cond_i, body_i = subgraph_indices(flat, ops[j][3])
    body_sg, cond_sg = flat.model.Subgraphs(body_i), flat.model.Subgraphs(cond_i)
    tag = f"subgraph '{sname(body_i)}' (the body of WHILE op {j} in subgraph '{sname(s)}')"
    w_ins, w_outs = ops[j][1], ops[j][2]
    b_in = [int(v) for v in body_sg.InputsAsNumpy()] if body_sg.InputsLength() else []
    b_out = [int(v) for v in body_sg.OutputsAsNumpy()] if body_sg.OutputsLength() else []
    nv = len(w_ins)
    if not (len(b_in) == len(b_out) == len(w_outs) == nv) or not 4 <= nv <= 32:
        raise FormatError(f"{p}: {tag}: {nv} loop variables, the body has {len(b_in)} inputs, {len(b_out)} outputs")
    body = _Body(flat, body_sg, tag, {})
    gathers = [k for k, o in enumerate(body.ops) if o[0] == "GATHER"]
    if len(gathers) != 1:
        raise body.refuse(gathers[1] if gathers else -1, "reads a second sequence (a mask?)" if gathers else
                          "no GATHER reads a step of the sequence")
    g_ins = body.ops[gathers[0]][1]
    if len(g_ins) != 2 or g_ins[0] not in b_in or g_ins[1] not in b_in:
        raise body.refuse(gathers[0], "does not read a loop variable at a loop variable")
    seq_v, t_v = b_in.index(g_ins[0]), b_in.index(g_ins[1])
    if b_out[seq_v] != b_in[seq_v]:
        raise body.refuse(gathers[0], "reads a sequence the body changes")
    main = _Body(flat, sg, f"subgraph '{sname(s)}'", {})

    def step(v: int) -> int:  # the op making out[v] = in[v] + 1
        k = body.made.get(b_out[v], -1)
        ins = body.ops[k][1] if k >= 0 else []
        one = [i for i in ins if i != b_in[v]]
        c = body.const(one[0]) if len(ins) == 2 and len(one) == 1 else None
        if k < 0 or body.ops[k][0] != "ADD" or c is None or c.reshape(-1).tolist() != [1]:
            raise body.refuse(k, f"does not advance loop variable {v} by 1")
        return k

    bk: set[int] = {gathers[0], step(t_v)}
    roles = {seq_v: "seq", t_v: "t"}
    for v in range(nv):
        if v in roles:
            continue
        shp = main.shape(w_ins[v])
        if b_out[v] == b_in[v]:  # passed through unchanged (a resource handle...): no op of the cell may read it
            roles[v] = "pass"
        elif shp == () and body.shape(b_in[v]) == ():
            bk.add(step(v))
            roles[v] = "iter"
        elif len(shp) == 3:
            if "acc" in roles.values():
                raise body.refuse(body.made.get(b_out[v], -1), "writes a second output sequence")
            roles[v] = "acc"
        elif len(shp) == 2:
            roles[v] = "state"
        else:
            raise FormatError(f"{p}: {tag}: loop variable {v} of shape {shp}")
    states = [_N("state", var=v) for v in range(nv) if roles[v] == "state"]
    if len(states) not in (1, 2):
        raise UnsupportedError(f"{p}: {tag}: {len(states)} state variables; a Keras cell has 1 (GRU, SimpleRNN) or "
                               "2 (LSTM); refused")
    for st in states:
        body.memo[b_in[st.var]] = st
    body.memo[b_in[seq_v]] = _N("seq")
    body.memo[b_in[t_v]] = _N("t")
    for v, r in roles.items():
        if r in ("iter", "acc", "pass"):
            body.memo[b_in[v]] = _N(r, var=v)
    if b_out[t_v] in body.made:
        body.memo[b_out[t_v]] = _N("t+1", op=body.made[b_out[t_v]])
    outs = {st.var: body.ev(b_out[st.var]) for st in states}
    x = next((n for n in body.memo.values() if n.kind == "x"), None)
    if x is None:
        raise body.refuse(gathers[0], "is not used by the cell")
    try:
        cell, gm, act, reset_after, hv, gate_act = _cell(outs, x, states)
    except _NoMatch as exc:
        raise body.refuse(exc.node.op, f"does not fit a Keras cell ({exc.why})") from None
    # the outputs' update
    acc_v = next((v for v, r in roles.items() if r == "acc"), None)
    if acc_v is None:
        raise UnsupportedError(f"{p}: {tag}: no loop variable collects the outputs; refused")
    T = main.shape(w_ins[seq_v])[0] if len(main.shape(w_ins[seq_v])) == 3 else -1
    B, H = main.shape(w_ins[hv])
    rs = _acc_update(body, b_in, b_out, acc_v, t_v, hv, (B, H), bk)
    if main.shape(w_ins[acc_v]) != ((T, B, H) if rs else (1, B, H)):
        raise UnsupportedError(f"{p}: {tag}: the outputs (loop variable {acc_v}) have shape "
                               f"{main.shape(w_ins[acc_v])}, not {(T, B, H) if rs else (1, B, H)}; refused")
    extra = [k for k in range(len(body.ops)) if k not in body.seen and k not in bk]
    if extra:
        raise body.refuse(extra[0], "is not part of the cell or the loop's bookkeeping (no loop output uses it)")
    _check_cond(flat, cond_sg, f"subgraph '{sname(cond_i)}' (the condition of WHILE op {j} in subgraph '{sname(s)}')",
                roles, T)
    # the main graph around the loop: zero initial states, TRANSPOSE (and REVERSE_V2) before
    for v, r in roles.items():
        c = main.const(w_ins[v])
        if r in ("t", "iter") and (c is None or c.reshape(-1).tolist() != [0]):
            raise UnsupportedError(f"{p}: subgraph '{sname(s)}' WHILE op {j}: loop variable {v} does not start at 0; "
                                   "refused")
        if r == "state" and (c is None or np.any(c != 0)):
            raise UnsupportedError(f"{p}: subgraph '{sname(s)}' WHILE op {j}: a non-zero or computed initial state "
                                   f"(loop variable {v}), which the written layer would drop; refused")
    x_in, backwards = _sequence_input(main, w_ins[seq_v], f"{p}: subgraph '{sname(s)}' WHILE op {j}")
    out_t = _output(main, w_outs[acc_v], rs)
    conv_order = gates.CANONICAL[cell]
    wx, wh, bx, bh = ([gm[gk][k] for gk in conv_order] for k in range(4))
    I = wx[0].shape[1]
    if any(a.shape != (H, I) for a in wx) or any(a.shape != (H, H) for a in wh):
        raise FormatError(f"{p}: {tag}: gate weights {[a.shape for a in wx + wh]} do not fit H={H}, I={I}")
    z = np.zeros(H, np.float32)
    dp = DirectionParams(np.concatenate(wx), np.concatenate(wh), np.concatenate([z if b is None else b for b in bx]),
                         np.concatenate([z if b is None else b for b in bh]))
    return Loop(cell, dp, Semantics(gate_activation=gate_act, activation=act, reset_after=reset_after,
                                    go_backwards=backwards), x_in, out_t, rs, j, sname(body_i), I, H, len(body.ones))


def _acc_update(body: _Body, b_in, b_out, acc_v: int, t_v: int, hv: int, bh: tuple, bk: set) -> bool:
    """Match the outputs' update; True for the whole sequence, False for the last output only."""
    out = b_out[acc_v]
    k = body.made.get(out, -1)
    acc = b_in[acc_v]

    def reshape_of(t: int, tgt: int, shape: list[int]) -> int:
        r = body.made.get(t, -1)
        if r < 0 or body.ops[r][0] != "RESHAPE" or body.ops[r][1][0] != tgt:
            raise body.refuse(r, "is not the RESHAPE of the value the loop writes")
        shp = body.const(body.ops[r][1][1]) if len(body.ops[r][1]) > 1 else None
        if shp is None or shp.reshape(-1).tolist() != shape:
            raise body.refuse(r, f"reshapes to {None if shp is None else shp.tolist()}, not {shape}")
        return r

    if k >= 0 and body.ops[k][0] == "RESHAPE":
        bk.add(reshape_of(out, b_out[hv], [1, *bh]))
        return False
    if k < 0 or body.ops[k][0] != "CONCATENATION" or len(body.ops[k][1]) != 3:
        raise body.refuse(k, "is not the update of the output sequence at row t")
    o = _options(body.flat, body.ops[k][3], "ConcatenationOptions")
    if o is None or o.Axis() != 0 or o.FusedActivationFunction():
        raise body.refuse(k, "does not concatenate along time")
    pre, mid, post = body.ops[k][1]
    bk.add(k)
    bk.add(reshape_of(mid, b_out[hv], [1, *bh]))
    t_next = b_out[t_v]
    for part, first in ((pre, True), (post, False)):
        s_ = body.made.get(part, -1)
        if s_ < 0 or body.ops[s_][0] != "SLICE" or body.ops[s_][1][0] != acc:
            raise body.refuse(s_, "is not a SLICE of the output sequence")
        bk.add(s_)
        _, begin, size = body.ops[s_][1]
        fixed, built = (begin, size) if first else (size, begin)
        c = body.const(fixed)
        want = 0 if first else -1
        if c is None or not np.all(c == want):
            raise body.refuse(s_, "does not slice rows :t / t+1: of the output sequence")
        cat = body.made.get(built, -1)
        if cat < 0 or body.ops[cat][0] != "CONCATENATION" or len(body.ops[cat][1]) != 2:
            raise body.refuse(s_, "does not slice rows :t / t+1: of the output sequence")
        bk.add(cat)
        tail = body.const(body.ops[cat][1][1])
        if tail is None or not np.all(tail == (-1 if first else 0)):
            raise body.refuse(cat, "does not build a row index")
        bk.add(reshape_of(body.ops[cat][1][0], b_in[t_v] if first else t_next, [1]))
    return True


def _check_cond(flat, cond_sg, tag: str, roles: dict[int, str], T: int) -> None:
    c = _Body(flat, cond_sg, tag, {})
    c_in = [int(v) for v in cond_sg.InputsAsNumpy()] if cond_sg.InputsLength() else []
    c_out = [int(v) for v in cond_sg.OutputsAsNumpy()] if cond_sg.OutputsLength() else []
    if len(c_in) != len(roles) or len(c_out) != 1:
        raise FormatError(f"{flat.path}: {tag}: {len(c_in)} inputs, {len(c_out)} outputs")
    less = {}
    for k, (name, ins, _, _) in enumerate(c.ops):
        if name == "LESS" and len(ins) == 2 and ins[0] in c_in and c.const(ins[1]) is not None:
            less[k] = (roles.get(c_in.index(ins[0])), c.const(ins[1]).reshape(-1).tolist())
        elif name != "LOGICAL_AND":
            raise c.refuse(k, "is not the loop's LESS(t, T)")
    tl = [k for k, (r, v) in less.items() if r == "t"]
    if len(tl) != 1 or less[tl[0]][1] != [T]:
        raise c.refuse(tl[0] if tl else 0, f"does not run the loop over the {T} time steps")
    if len(c.ops) == 1:
        if c.ops[0][2] != c_out:
            raise c.refuse(0, "is not the condition's output")
        return
    it = [k for k, (r, v) in less.items() if r == "iter" and len(v) == 1 and v[0] >= T]
    ands = [k for k, o in enumerate(c.ops) if o[0] == "LOGICAL_AND"]
    if len(c.ops) != 3 or len(it) != 1 or len(ands) != 1 or c.ops[ands[0]][2] != c_out \
            or sorted(c.ops[ands[0]][1]) != sorted([c.ops[tl[0]][2][0], c.ops[it[0]][2][0]]):
        raise c.refuse(ands[0] if ands else 0, "is not LESS(t, T) and LESS(iteration, T)")


def _sequence_input(main: _Body, t: int, where: str) -> tuple[int, bool]:
    """The layer input behind the loop's sequence, reversed on axis 0 when ``go_backwards``: ``x`` of
    ``TRANSPOSE(x, [1, 0, 2])``, or the time-major output sequence of the ``WHILE`` loop before it (the converter
    folds the ``TRANSPOSE`` pair between two stacked loops)."""
    backwards = False
    k = main.made.get(t, -1)
    if k >= 0 and main.ops[k][0] == "REVERSE_V2":
        ax = main.const(main.ops[k][1][1])
        if ax is None or ax.reshape(-1).tolist() != [0]:
            raise UnsupportedError(f"{main.flat.path}: {where}: the sequence is reversed on an axis other than time; "
                                   "refused")
        backwards, t = True, main.ops[k][1][0]
        k = main.made.get(t, -1)
    if k >= 0 and main.ops[k][0] == "WHILE" and len(main.shape(t)) == 3:
        return t, backwards
    if k < 0 or main.ops[k][0] != "TRANSPOSE" or main.const(main.ops[k][1][1]) is None \
            or main.const(main.ops[k][1][1]).tolist() != [1, 0, 2]:
        raise UnsupportedError(f"{main.flat.path}: {where}: the sequence is neither TRANSPOSE(x, [1, 0, 2]) of a "
                               "(batch, time, features) input nor a loop's output sequence (a time-major layer?); "
                               "refused")
    return main.ops[k][1][0], backwards


def _output(main: _Body, acc_out: int, rs: bool) -> int:
    users = [k for k, o in enumerate(main.ops) if acc_out in o[1]]
    if len(users) != 1:  # the loop's outputs used otherwise: the layer is still read, its output not matched
        return -1
    name, ins, outs, _ = main.ops[users[0]]
    if rs and name == "TRANSPOSE" and main.const(ins[1]) is not None and main.const(ins[1]).tolist() == [1, 0, 2]:
        return outs[0]
    if not rs and name == "STRIDED_SLICE":
        return outs[0]
    return -1


def bidirectional_pairs(flat, sg, ops: list, loops: dict[int, Loop]) -> dict[int, int]:
    """``{backward WHILE op: forward WHILE op}`` for Keras ``Bidirectional``: the backward loop (``go_backwards``)
    on the same input, its output ``REVERSE_V2`` on axis 1, then ``CONCATENATION([forward, backward], -1)``; with
    ``return_sequences=False`` the two last outputs concatenated (no ``REVERSE_V2``). Same cell and sizes."""
    main = _Body(flat, sg, "", {})
    pairs = {}
    for b, lb in loops.items():
        if not lb.semantics.go_backwards or lb.out < 0:
            continue
        if not lb.return_sequences:  # last outputs: CONCATENATION([forward last, backward last], -1)
            cats = [k for k, o in enumerate(ops) if o[0] == "CONCATENATION" and lb.out in o[1]]
            fwd = [f for f, lf in loops.items() if not lf.semantics.go_backwards and not lf.return_sequences
                   and lf.x == lb.x and len(cats) == 1 and ops[cats[0]][1] == [lf.out, lb.out]]
            o = _options(flat, ops[cats[0]][3], "ConcatenationOptions") if len(cats) == 1 else None
            if len(fwd) == 1 and o is not None and o.Axis() in (-1, 1) and not o.FusedActivationFunction() \
                    and _same_cell(loops[fwd[0]], lb):
                pairs[b] = fwd[0]
            continue
        users = [k for k, o in enumerate(ops) if lb.out in o[1]]
        if len(users) != 1 or ops[users[0]][0] != "REVERSE_V2":
            continue
        ax = main.const(ops[users[0]][1][1])
        if ax is None or ax.reshape(-1).tolist() != [1]:
            continue
        rev = ops[users[0]][2][0]
        cats = [k for k, o in enumerate(ops) if o[0] == "CONCATENATION" and rev in o[1]]
        if len(cats) != 1:
            continue
        c_ins = ops[cats[0]][1]
        o = _options(flat, ops[cats[0]][3], "ConcatenationOptions")
        fwd = [f for f, lf in loops.items() if not lf.semantics.go_backwards and lf.return_sequences
               and lf.x == lb.x and c_ins == [lf.out, rev]]
        if len(fwd) != 1 or o is None or o.Axis() not in (-1, 2) or o.FusedActivationFunction():
            continue
        if _same_cell(loops[fwd[0]], lb):
            pairs[b] = fwd[0]
    return pairs


def _same_cell(a: Loop, b: Loop) -> bool:
    """Two loops one layer can hold: same cell, sizes and semantics (the gate activation too: a pair whose
    directions differ in it stays two layers, never one with the forward's gates)."""
    return (a.cell, a.semantics.gate_activation, a.semantics.activation, a.semantics.reset_after, a.hidden_size,
            a.input_size) == (b.cell, b.semantics.gate_activation, b.semantics.activation, b.semantics.reset_after,
                              b.hidden_size, b.input_size)

