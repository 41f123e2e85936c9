"""Reading ONNX ``LSTM`` / ``GRU`` / ``RNN`` nodes into the canonical model (the ``onnx`` format's ``read``).

Layout facts: see :mod:`rnnconvert.formats.onnx.onnx_write` and LAYOUTS.md §13. ``activation_alpha`` /
``activation_beta`` hold values only for the activations that take them, consumed in order (how
onnxruntime reads them, ``rnn_helpers.cc``; checked against onnxruntime 1.31 by the test suite).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...errors import FormatError, UnsupportedError, require
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics, placeholder
from ...safety.paths import folder_of, inside, open_inside

META_KEY = "rnnconvert"
# ONNX activation -> default (alpha, beta) per the ONNX activation ops; absent = takes none.
_DEFAULTS = {"affine": (1.0, 0.0), "hardsigmoid": (0.2, 0.5), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
             "scaledtanh": (None, None), "elu": (1.0, None)}
_TAKES = {"affine": (True, True), "hardsigmoid": (True, True), "leakyrelu": (True, False),
          "thresholdedrelu": (True, False), "scaledtanh": (True, True), "elu": (True, False)}


def _every_node(graph, depth: int = 0):
    """Every node of ``graph`` and of its subgraphs (``If`` branches, ``Loop``/``Scan`` bodies), 16 levels deep at
    most (:func:`_rnn_nodes` refuses deeper ones)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") and depth < 16 else []) + (list(a.graphs) if depth < 16 else []):
                yield from _every_node(sub, depth + 1)


def _all_tensors(graph):
    """Initializers and tensor attributes of every node, subgraphs included."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for sub in a.graphs:
                yield from _all_tensors(sub)


class Stored:
    """An initializer left in its external data file by a lazy read (:func:`_load` ``keep``): its name,
    ``shape``, little-endian ``dtype``, the data file (inside the model's folder, checked) and the byte range
    (inside that file, checked, ``length`` = the shape's bytes)."""

    def __init__(self, name: str, shape: tuple, dtype, file: Path, offset: int, length: int) -> None:
        self.name, self.shape, self.dtype, self.file, self.offset, self.length = name, shape, dtype, file, offset, length
        self.ndim = len(shape)


def _stored(t, target: Path, where: object) -> Stored | None:
    """``t``'s external data record as a :class:`Stored` (float tensors only; ``None`` for others), checked:
    a known dtype, an offset and length inside ``target``, the length of the declared shape."""
    from onnx import helper

    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    except (KeyError, TypeError, ValueError):
        return None
    if dt.kind != "f":
        return None
    info = {e.key: e.value for e in t.external_data}
    shape = tuple(int(d) for d in t.dims)
    try:
        offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else None
    except ValueError:
        raise FormatError(f"{where}: tensor '{t.name}' has a malformed external data record") from None
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    size = target.stat().st_size
    if min(shape, default=0) < 0 or (length is not None and length != n) or not 0 <= offset <= size - n:
        raise FormatError(f"{where}: tensor '{t.name}' of shape {shape} does not fit its external data "
                          f"(offset {offset}, {size} bytes in the file)")
    return Stored(t.name, shape, dt, target, offset, n)


def _load(path: Path, keep: dict | None = None):
    """``onnx.load`` without external data, then external data loaded tensor by tensor, each checked to
    live inside the model's folder (symlinks resolved) before it is opened. ``keep`` (a dict): float
    initializers of at least :data:`LAZY_BYTES` are not loaded but recorded there by name as
    :class:`Stored` (a lazy read)."""
    onnx = require("onnx", "onnx")
    from onnx import external_data_helper as ext

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise FormatError(f"{path}: not an ONNX model: {exc}") from exc
    base = folder_of(path)  # the folder of the model as named (onnx's own loader looks there too)
    n_init = len(model.graph.initializer)  # _all_tensors yields the graph's initializers first
    for j, t in enumerate(_all_tensors(model.graph)):
        if any(d < 0 for d in t.dims):  # numpy would read a negative dim as "whatever fits" (-1)
            raise FormatError(f"{path}: tensor '{t.name}' declares dims {list(t.dims)}; negative dims refused")
        if not ext.uses_external_data(t):
            continue
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts or "\0" in loc:
            raise FormatError(f"{path}: tensor '{t.name}' points to external data '{loc}' outside the model's "
                              "folder; refused (copy the data file beside the model)")
        if not os.path.lexists(base / loc):
            raise FormatError(f"{path}: external data file '{loc}' of tensor '{t.name}' is missing")
        # symlinks resolved inside the folder, a regular file (safety/paths): the real path is what is opened
        target = inside(base, loc, f"{path}: tensor '{t.name}'", "external data file", scope="model's folder")
        if keep is not None and t.name and j < n_init and \
                int(np.prod(tuple(t.dims), dtype=np.int64)) * 4 >= LAZY_BYTES:
            got = _stored(t, target, path)
            if got is not None:
                keep[t.name] = got
                continue
        _load_external(t, target, path)
    return model


def _load_external(t, target: Path, path: Path) -> None:
    """Tensor ``t``'s external data read from ``target`` (its location resolved and checked to be inside the
    model's folder by the caller: an in-folder symlink is followed there, which ``onnx``'s own loader refuses
    outright), its ``offset``/``length`` checked against the file; the tensor then holds the bytes as
    ``raw_data``, as ``onnx.external_data_helper.load_external_data_for_tensor`` leaves it."""
    from onnx import TensorProto

    info = {e.key: e.value for e in t.external_data}
    try:
        offset = int(info.get("offset") or 0)
        length = None if info.get("length") in (None, "") else int(info["length"])
        size = target.stat().st_size
        if offset < 0 or offset > size or (length is not None and (length < 0 or offset + length > size)):
            raise FormatError(f"{path}: external data of '{t.name}' (offset {offset}, length {length}) lies "
                              f"outside its {size}-byte file")
        with open_inside(target.parent, target, f"{path}: tensor '{t.name}'", "external data file",
                         scope="model's folder") as fh:
            fh.seek(offset)
            data = fh.read(size - offset if length is None else length)
    except ValueError as exc:
        raise FormatError(f"{path}: tensor '{t.name}' has a malformed external data record") from exc
    except OSError as exc:
        raise FormatError(f"{path}: cannot load external data of '{t.name}': {exc.strerror or exc}") from exc
    t.raw_data = data
    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT


#: float initializers of at least this many bytes (as float32) stay in their external data file in a lazy read
LAZY_BYTES = 1 << 20


def _consts(graph, numpy_helper, where: object = "ONNX graph", kept: dict | None = None,
            outer: dict | None = None, fold: "_Folder | None" = None) -> dict[str, Any]:
    """Initializers and Constant outputs, followed through Identity nodes: each node's output resolved
    once (a chain of any length and order costs time linear in it), the graph's node count within the
    ``graph_nodes`` limit of :mod:`rnnconvert.safety.budget`. ``outer``: the values of the enclosing graphs (a
    subgraph of ``If``/``Loop``/``Scan`` sees its outer scope's names, ONNX IR "Names Within a Graph");
    ``fold``: then the shape-only operations of constants folded (:class:`_Folder`).

    Raises:
        BudgetError: more nodes than the limit, or more folded bytes than the expansion limit allows."""
    from ...safety import budget

    budget.check_count(where, "graph_nodes", len(graph.node), "nodes in the graph")
    kept = kept or {}
    vals = dict(outer or {})
    vals.update({t.name: kept[t.name] if t.name in kept else numpy_helper.to_array(t) for t in graph.initializer})
    producer: dict[str, Any] = {}
    for n in graph.node:
        if n.op_type in ("Constant", "Identity") and len(n.output) and (n.op_type == "Constant" or len(n.input)):
            producer.setdefault(n.output[0], n)
    for name in list(producer):
        chain: list[str] = []
        seen: set[str] = set()
        cur = name
        while cur not in vals and cur in producer and cur not in seen:  # walk back to a known value
            seen.add(cur)
            chain.append(cur)
            n = producer[cur]
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        vals[cur] = numpy_helper.to_array(a.t)
                break
            cur = n.input[0]
        if cur in vals:  # the chain's outputs all carry that value (a cycle or a Constant without
            for c in chain:  # 'value' leaves them unresolved, as before)
                vals.setdefault(c, vals[cur])
    if fold is not None:
        fold.graph(graph, vals)
    return vals


#: operations that only move or select stored elements, folded where every input is a constant: a PyTorch
#: ``nn.LSTMCell`` exported in a branch (silero-vad) computes ``W``/``R``/``B`` from its stored weights by
#: ``Slice``+``Concat`` (torch's gate order to ONNX's) and ``Unsqueeze`` (the direction axis)
FOLDABLE = ("Identity", "Slice", "Concat", "Unsqueeze", "Squeeze", "Transpose", "Reshape")


class _Folder:
    """Folds :data:`FOLDABLE` nodes whose inputs are all known constants, in graph order, each by onnx's own
    reference implementation of the operation (``onnx.reference.ReferenceEvaluator`` on the one node, the model's
    opset), so their outputs count as stored values. Bounded: every output's bytes (at most the inputs' bytes for
    these operations; a ``Concat`` the sum) are counted before it is computed, and all of them together stay within
    the ``expansion`` limit of the file's size (:func:`rnnconvert.safety.budget.check_expansion`: a DAG of
    ``Concat`` nodes doubling one tensor stops there). Values kept in external data (lazy reads) are not folded."""

    def __init__(self, where: object, opset: int, stored: int) -> None:
        self.where, self.opset, self.stored, self.total = where, opset, max(stored, 1), 0

    def graph(self, graph, vals: dict) -> None:
        from onnx.reference import ReferenceEvaluator

        from ...safety import budget

        for n in graph.node:
            if n.op_type not in FOLDABLE or n.domain not in ("", "ai.onnx") or not n.output or n.output[0] in vals:
                continue
            ins = [vals.get(i) for i in n.input if i]
            if not ins or any(not isinstance(v, np.ndarray) for v in ins):
                continue
            self.total += sum(v.nbytes for v in ins) if n.op_type == "Concat" else ins[0].nbytes
            budget.check_expansion(self.where, self.total, self.stored, "constants folded from graph operations")
            feeds = {i: vals[i] for i in n.input if i}
            try:
                out = ReferenceEvaluator(n, opsets={"": self.opset}).run(None, feeds)
            except Exception:  # noqa: BLE001 - an operation onnx cannot evaluate stays unresolved: "computed at run time"
                continue
            vals[n.output[0]] = np.asarray(out[0])


def _rnn_nodes(graph, vals: dict, numpy_helper, where: object, kept: dict | None, fold: _Folder,
               scope: str = "", depth: int = 0) -> list[tuple[Any, dict, str]]:
    """``(node, values in its scope, scope)`` of every recurrent node: the graph's own, then those of its
    control-flow subgraphs (``If`` branches, ``Loop``/``Scan`` bodies; ``scope`` names the attribute path, e.g.
    ``If_0.then_branch``), each subgraph's values its own constants over its outer scope's.

    Raises:
        FormatError: subgraphs nested deeper than 16 levels."""
    if depth > 16:
        raise FormatError(f"{where}: control-flow subgraphs nested deeper than 16 levels ({scope:.120})")
    out = [(n, vals, scope) for n in graph.node if n.op_type in ("LSTM", "GRU", "RNN") and n.domain in ("", "ai.onnx")]
    for n in graph.node:
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                at = f"{scope + '/' if scope else ''}{n.name or n.op_type}.{a.name}"
                sub_vals = _consts(sub, numpy_helper, where, kept, outer=vals, fold=fold)
                out += _rnn_nodes(sub, sub_vals, numpy_helper, where, kept, fold, at, depth + 1)
    return out


def _activation_names(node, op: str, ndir: int, where: str) -> tuple[str, str]:
    """(gate_activation, activation) in our names from the node's attributes; refuses what we cannot name."""
    from onnx import helper

    at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    per = {"LSTM": 3, "GRU": 2, "RNN": 1}[op]
    default = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[op]
    acts = [a.decode("utf-8", "replace") if isinstance(a, bytes) else a for a in at.get("activations", [])] or default * ndir
    if len(acts) != per * ndir:
        raise FormatError(f"{where}: {len(acts)} activations for {ndir} direction(s) of {op}")
    alphas, betas = list(at.get("activation_alpha", [])), list(at.get("activation_beta", []))
    named = []
    for a in acts:
        low = a.lower()
        al = be = None
        if low in _TAKES:
            ta, tb = _TAKES[low]
            al = alphas.pop(0) if ta and alphas else _DEFAULTS[low][0]
            be = betas.pop(0) if tb and betas else _DEFAULTS[low][1]
        close = lambda u, v: u is not None and abs(u - v) <= 1e-6  # noqa: E731  (float32-stored attributes)
        if low in ("sigmoid", "tanh", "relu", "softsign"):
            named.append(low)
        elif low == "affine" and close(al, 1.0) and close(be, 0.0):
            named.append("linear")
        elif low == "hardsigmoid" and close(al, 0.2) and close(be, 0.5):
            named.append("hard_sigmoid")
        elif low == "hardsigmoid" and close(al, 1 / 6) and close(be, 0.5):
            named.append("hard_sigmoid_k3")
        else:
            raise UnsupportedError(f"{where}: activation {a}(alpha={al}, beta={be}) has no rnnconvert equivalent; "
                                   "only Sigmoid, Tanh, Relu, Softsign, Affine(1,0), HardSigmoid(0.2,0.5) and "
                                   "HardSigmoid(1/6,0.5) are read")
    if acts[:per] != acts[per:] and ndir == 2 and named[:per] != named[per:]:
        raise UnsupportedError(f"{where}: forward and reverse directions use different activations")
    if op == "LSTM" and named[1] != named[2]:
        raise UnsupportedError(f"{where}: LSTM g and h activations differ ({named[1]}, {named[2]})")
    return (named[0], named[1]) if op != "RNN" else ("sigmoid", named[0])


def _node_layer(node, vals: dict, path: Path, name: str) -> RNNLayer:
    from onnx import helper

    op = node.op_type
    where = f"{path}: node '{name}' ({op})"
    at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    direction = at.get("direction", b"forward")
    direction = direction.decode("utf-8", "replace") if isinstance(direction, bytes) else direction
    if direction not in ("forward", "reverse", "bidirectional"):
        raise FormatError(f"{where}: direction {direction!r:.40} is not forward, reverse or bidirectional")
    if at.get("clip") is not None:
        raise UnsupportedError(f"{where}: 'clip' clips the activations' inputs; no other format computes that")
    if at.get("input_forget", 0):
        raise UnsupportedError(f"{where}: input_forget=1 couples the input and forget gates; no other format computes that")
    ins = list(node.input) + [""] * 8

    def get(i: int, what: str, required: bool = False):
        nm = ins[i]
        if not nm:
            if required:
                raise FormatError(f"{where}: input {what} is missing")
            return None
        if nm not in vals:
            raise UnsupportedError(f"{where}: {what} '{nm}' is computed at run time, not stored in the file "
                                   "(initializers and Constant nodes are followed through "
                                   f"{', '.join(FOLDABLE)})")
        return vals[nm]

    W, R, B = get(1, "W", True), get(2, "R", True), get(3, "B")
    for i, what in ((5, "initial_h"), (6, "initial_c")):
        v = get(i, what) if ins[i] and ins[i] in vals else None
        v = _array(v) if isinstance(v, Stored) else v
        if v is not None and np.any(v):
            raise UnsupportedError(f"{where}: a stored non-zero {what}; rnnconvert layers start from zero state")
    P = get(7, "P") if op == "LSTM" else None
    B, P = (np.array(_array(v)) if isinstance(v, Stored) else v for v in (B, P))  # small: read now (a copy)
    ndir = 2 if direction == "bidirectional" else 1
    H = at.get("hidden_size")
    H = R.shape[-1] if H is None else H
    if not isinstance(H, (int, np.integer)) or H <= 0:
        raise FormatError(f"{where}: hidden_size {H!r:.40} is not a positive integer")
    H = int(H)
    gate_act, act = _activation_names(node, op, ndir, where)
    cell = {"LSTM": Cell.LSTM, "GRU": Cell.GRU}.get(op) or (Cell.RNN_RELU if act == "relu" else Cell.RNN_TANH)
    G = cell.gates
    if W.ndim != 3 or W.shape[:2] != (ndir, G * H) or R.shape != (ndir, G * H, H):
        raise FormatError(f"{where}: W {W.shape} / R {R.shape} do not fit hidden_size={H}, {ndir} direction(s)")
    cv = gates.convention("onnx", cell)
    row = []
    lazy = isinstance(W, Stored) or isinstance(R, Stored)
    for d in range(ndir):
        zeros = np.zeros(G * H, W.dtype)
        b_ih = zeros if B is None else gates.vec_to_canonical(B[d, :G * H], cv, cell)
        b_hh = zeros.copy() if B is None else gates.vec_to_canonical(B[d, G * H:], cv, cell)
        peep = None
        if P is not None:
            pi, po, pf = np.split(P[d], 3)
            peep = np.ascontiguousarray(np.stack([pi, pf, po]))
        if lazy:  # read one slab at a time by OnnxSlabs
            w_ih, w_hh = placeholder((G * H, W.shape[2]), W.dtype), placeholder((G * H, H), R.dtype)
        else:
            w_ih, w_hh = gates.to_canonical(W[d], cv, cell), gates.to_canonical(R[d], cv, cell)
        row.append(DirectionParams(w_ih, w_hh, b_ih, b_hh, peep=peep))
    sem = Semantics(gate_activation=gate_act, activation=act, reset_after=bool(at.get("linear_before_reset", 0)),
                    go_backwards=direction == "reverse")
    try:
        return RNNLayer(name=name, cell=cell, input_size=W.shape[2], hidden_size=H, bidirectional=ndir == 2,
                        bias=B is not None, semantics=sem, params=[row],
                        source={"format": "onnx", "class_name": op, "layout": int(at.get("layout", 0)),
                                **({"stored": (W, R)} if lazy else {})})
    except ValueError as exc:
        raise FormatError(f"{path}: {exc}") from exc


def _records(text: str | None, by_node: dict[str, RNNLayer]) -> list[dict]:
    """rnnconvert's layer records, when present and consistent with the nodes found (else none: one layer per node)."""
    if not text:
        return []
    try:
        recs = json.loads(text)["layers"]
        seen: set[str] = set()
        for rec in recs:
            if not (isinstance(rec, dict) and isinstance(rec.get("name"), str) and isinstance(rec.get("nodes"), list)
                    and rec["nodes"] and isinstance(rec.get("merge_mode", "concat"), str)):
                return []
            parts = [by_node[nm] for nm in rec["nodes"]]
            a = parts[0]
            if seen & set(rec["nodes"]) or any((p.cell, p.hidden_size, p.bidirectional, p.bias, p.semantics) !=
                                               (a.cell, a.hidden_size, a.bidirectional, a.bias, a.semantics) for p in parts):
                return []
            seen |= set(rec["nodes"])
        return recs
    except (ValueError, KeyError, TypeError, IndexError):
        return []


def _array(t: Stored, mapped: dict | None = None) -> np.ndarray:
    """The array of a :class:`Stored` initializer: a read-only view of its data file, mapped once per file
    in ``mapped`` (a dict the caller keeps; a fresh map without one)."""
    from ...speed.mapped import MappedFile

    mapped = {} if mapped is None else mapped
    if t.file not in mapped:
        try:
            mapped[t.file] = MappedFile(t.file)
        except OSError as exc:
            raise FormatError(f"{t.file}: cannot read ({exc.strerror})") from exc
    return mapped[t.file].array(t.offset, t.dtype, t.shape)


class OnnxSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a lazily read ONNX model: slab ``(i, k)`` = the ``W``,
    ``R`` of layer ``i``'s node ``k`` (``stored[i][k]``: :class:`Stored` records of the external data file, or
    arrays held in the model) put in canonical gate order per direction (a copy, after which the mapped
    pages are given back at once); ``release`` and ``release_array`` have nothing left to give back."""

    def __init__(self, stored: list, layers: list[RNNLayer]) -> None:
        self.stored, self.layers, self.mapped = stored, layers, {}

    def read(self, i: int, k: int) -> list[DirectionParams]:
        layer = self.layers[i]
        cv = gates.convention("onnx", layer.cell)
        W, R = (_array(t, self.mapped) if isinstance(t, Stored) else t for t in self.stored[i][k])
        out = [replace(p, w_ih=gates.to_canonical(W[d], cv, layer.cell), w_hh=gates.to_canonical(R[d], cv, layer.cell))
               for d, p in enumerate(layer.params[k])]
        for t, a in zip(self.stored[i][k], (W, R)):  # copied: the mapped pages go at once
            if isinstance(t, Stored):
                self.mapped[t.file].release_array(a)
        return out

    def release(self, i: int, k: int) -> None:
        pass  # read() gave the mapped pages back already; the slab's arrays are its own

    def release_array(self, a: np.ndarray) -> None:
        pass  # the slab's arrays are copies (canonical order); release gives the mapped pages back


def read(path: str | Path, *, lazy: bool = False, **_: Any) -> Checkpoint:
    """Read every ``LSTM``/``GRU``/``RNN`` node of an ONNX model (one layer per node, or per rnnconvert record).

    W, R, B, P come from initializers (also through ``Constant`` and ``Identity``). External data is
    loaded only from inside the model's folder.

    ``lazy=True``: ``W`` and ``R`` initializers of :data:`LAZY_BYTES` or more kept in an external data file are
    not read: the layers hold placeholders and :class:`OnnxSlabs` reads one stacked layer at a time (a model
    with its weights inside is read whole either way).

    Raises:
        FormatError: not an ONNX model, malformed weights, external data outside the folder.
        UnsupportedError: ``clip``, ``input_forget``, activations other than Sigmoid/Tanh/Relu/Softsign/
            Affine(1,0)/HardSigmoid(0.2,0.5)/HardSigmoid(1/6,0.5), weights computed at run time,
            quantized ``com.microsoft`` RNN nodes.
    """
    require("onnx", "onnx")
    from onnx import numpy_helper

    path = Path(path)
    kept: dict | None = {} if lazy else None
    model = _load(path, kept)
    g = model.graph
    for n in _every_node(g):
        quantized = n.domain not in ("", "ai.onnx") and any(k in n.op_type.upper() for k in ("LSTM", "GRU", "RNN"))
        if quantized:
            raise UnsupportedError(f"{path}: node '{n.name}' is {n.domain}:{n.op_type}, a quantized recurrent op; "
                                   "dequantizing would change the weights, so it is refused (export the float model)")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    fold = _Folder(path, opset or 21, path.stat().st_size)
    try:
        vals = _consts(g, numpy_helper, path, kept, fold=fold)
        found = _rnn_nodes(g, vals, numpy_helper, path, kept, fold)
    except (ValueError, TypeError, IndexError) as exc:  # raw_data that does not fit dims, bad dtypes
        raise FormatError(f"{path}: a stored tensor does not match its declared shape or type ({exc})") from exc
    rnn = [n for n, _, _ in found]
    if not rnn:
        from ...core import names  # its initializers listed for `inspect` (UnrecognisedError)

        raise names.unrecognised(f"{path}: no LSTM, GRU or RNN node in this ONNX model", vals,
                                 suggest=False)  # the ONNX reader takes no map
    from ...safety import budget

    budget.check_count(path, "layers", len(rnn), "recurrent nodes")  # before any node is read
    singles, taken = [], set()
    for i, (n, scope_vals, _) in enumerate(found):
        name = n.name or f"{n.op_type}_{i}"
        if name in taken:  # node names need not be unique in ONNX
            name = f"{name}_{i}"
        taken.add(name)
        singles.append(_node_layer(n, scope_vals, path, name))
    by_node = {l.name: l for l in singles}
    meta = {p.key: p.value for p in model.metadata_props}
    ckpt = Checkpoint(format="onnx", meta={"path": str(path), "producer": model.producer_name, "opset": opset})
    branched = sorted({scope for _, _, scope in found if scope})
    if branched:
        ckpt.meta["notes"] = [
            f"{sum(1 for *_, sc in found if sc)} recurrent node(s) read from control-flow subgraphs "
            f"({', '.join(branched)[:300]}), each as its own layer: which of them runs depends on the graph's "
            "inputs (an If's condition)"]
    stored: list = []  # per final layer, per slab: (W, R) of a lazily read node, else None
    for rec in _records(meta.get(META_KEY), by_node):
        parts = [by_node.pop(nm) for nm in rec["nodes"]]
        first = parts[0]
        sem = replace(first.semantics, merge_mode=rec.get("merge_mode", "concat"))
        src = {k: v for k, v in first.source.items() if k != "stored"}
        src["class_name"] = rec.get("source_class") or first.source["class_name"]
        stored.append([p.source.get("stored") for p in parts])
        try:
            ckpt.layers.append(RNNLayer(
                name=rec["name"], cell=first.cell, input_size=first.input_size, hidden_size=first.hidden_size,
                num_layers=len(parts), bidirectional=first.bidirectional, bias=first.bias, semantics=sem,
                params=[p.params[0] for p in parts], return_sequences=bool(rec.get("return_sequences", True)),
                source=src))
        except ValueError as exc:
            raise FormatError(f"{path}: layer record '{rec['name']:.60}': {exc}") from exc
    rest = [l for l in singles if l.name in by_node]
    stored += [[l.source.get("stored")] for l in rest]
    ckpt.layers.extend(replace(l, source={k: v for k, v in l.source.items() if k != "stored"}) for l in rest)
    if not any(st is not None for sl in stored for st in sl):
        return ckpt
    if any(st is None for sl in stored for st in sl):  # some nodes' weights in the model, some not: whole
        return read(path)
    return replace(ckpt, slabs=OnnxSlabs(stored, ckpt.layers))

