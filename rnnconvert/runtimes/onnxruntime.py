"""The onnxruntime runtime: a written ONNX model run by onnxruntime on CPU, for verification's target side.

The model is opened from its path (no :attr:`~rnnconvert.engine.protocol.FormatSpec.load`): a layer's sequence
runs in the written graph pruned to that layer's output (:func:`pruned`, :func:`session`; a stacked layer's part
by part, one stacked node and the wiring into it per session: :func:`stages`, :func:`staged`); a slab and its one
steps run in a one-node graph of the written node (:func:`one_node`). Weights in external data stay in the
file, mapped by onnxruntime (:func:`options`). onnx and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..core.model import Checkpoint
from ..engine.protocol import Runtime, located
from ..errors import FormatError, require
from ..speed import filerows


#: the distribution whose version verification reports for the target side


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load=None) -> np.ndarray:
    """Run layer ``name`` of the written model in onnxruntime (CPU) on ``x`` ``(B, T, I)``.

    Returns the full output sequence ``(B, T, dirs*H)`` as float64, directions concatenated, forward
    first; ``go_backwards`` layers in processing order (as :func:`rnnconvert.core.reference.forward`).
    Only the nodes that ``{name}__out`` depends on run (the written graph pruned to that output: a
    multi-layer model's other layers are neither loaded nor run); weights in external data stay in the
    file, mapped by onnxruntime (:func:`session`). A stacked layer of ``ckpt`` (``num_layers > 1``:
    verification's wiring check, issue #39) runs the same pruned graph part by part (:func:`staged`), one
    stacked node's weights mapped at a time (issue #38).
    """
    meta = whole_meta(path)
    if meta is not None:  # a whole model (issue #30): the layer's nodes, chained, from zero states
        layer = ckpt.layer(name)
        y = _chained(path, ckpt, name, x)
        return y[:, ::-1] if layer.semantics.go_backwards and not layer.bidirectional else y
    if ckpt is not None and ckpt.layer(name).num_layers > 1:  # a stacked layer: one stacked node at a time
        return staged(path, name, ckpt.layer(name).num_layers, x)
    return run(session(path, f"{name}__out"), path, name, x)


#: :func:`whole_meta` per file identity (path, size, modification time): verification asks once per layer, and
#: parsing a model held inline (no external data) reads all its weights
_WHOLE: dict[tuple, dict | None] = {}


def whole_meta(path: str | Path) -> dict | None:
    """rnnconvert's metadata of a whole-model graph written by :mod:`rnnconvert.whole.formats.onnx.model_write`
    (``{"whole": true, "inputs": [...], "outputs": [...]}``), else ``None``; parsed once per file."""
    key = filerows.identity(path)
    if key not in _WHOLE:
        if len(_WHOLE) > 16:
            _WHOLE.clear()
        _WHOLE[key] = _whole_meta(path)
    return _WHOLE[key]


def _whole_meta(path: str | Path) -> dict | None:
    import json

    onnx = require("onnx", "onnx")
    model = onnx.load(str(path), load_external_data=False)
    for p in model.metadata_props:
        if p.key == "rnnconvert":
            try:
                meta = json.loads(p.value)
            except ValueError:
                return None
            return meta if isinstance(meta, dict) and meta.get("whole") is True else None
    return None


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load=None) -> list:
    """Verification's one-step check in onnxruntime: the written LSTM/GRU/RNN node of stacked layer ``k``
    of layer ``name`` (its attributes and weight initializers, external data included, as written), alone
    in a one-node graph fed ``x`` ``(N, I)`` as ``N`` sequences of length 1 with ``initial_h`` (and
    ``initial_c``) ``(D, N, H)`` from ``states`` (:func:`one_node`). Returns ``[(Y_h[d], Y_c[d] or None)]``
    per direction, float64. Only that node's weights are read: external data stays in the file, mapped by
    onnxruntime."""
    sess, lstm, dt = one_node(path, ckpt, name, k, states=True)
    feeds = {"X": np.asarray(x, dt)[None], "initial_h": np.stack([np.asarray(st[0], dt) for st in states])}
    if lstm:
        feeds["initial_c"] = np.stack([np.asarray(st[1], dt) for st in states])
    got = sess.run(["Y", "Y_h"] + (["Y_c"] if lstm else []), feeds)
    return [(np.asarray(got[1][d], np.float64), np.asarray(got[2][d], np.float64) if lstm else None)
            for d in range(len(states))]


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load=None) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` of the written model alone, in onnxruntime: its node in a one-node
    graph (:func:`one_node`) fed ``x`` ``(B, T, I_k)`` from zero states. Returns ``(B, T, dirs*H)``
    float64, directions concatenated, forward first (what the model's ``Transpose``+``Reshape`` after the
    node give the next stacked layer). Only that node's weights are mapped, and unmapped when this
    returns: a stacked layer of a multi-GB model is checked without all its slabs in memory."""
    sess, _, dt = one_node(path, ckpt, name, k, states=False)
    y = sess.run(["Y"], {"X": np.ascontiguousarray(np.asarray(x, dt).transpose(1, 0, 2))})[0]  # (T, D, B, H)
    T, D, B, H = y.shape
    return np.asarray(y, np.float64).transpose(2, 0, 1, 3).reshape(B, T, D * H)


def one_node(path: str | Path, ckpt: Checkpoint, name: str, k: int, states: bool):
    """``(session, is_lstm, dtype)``: the written node of stacked layer ``k`` of layer ``name`` (attributes and
    weight initializers as written; external data left in the file, mapped by onnxruntime: :func:`options`)
    alone in a graph with input ``X`` ``(T, N, I)`` and, when ``states``, ``initial_h`` (and ``initial_c``)
    ``(D, N, H)``; outputs ``Y``, ``Y_h`` (, ``Y_c``). Float64 initializers are run as float32 (onnxruntime's
    RNN kernels are float32 only, see :func:`session`). A layer written as Scans by a runtime profile
    (:mod:`rnnconvert.whole.formats.onnx.profiles`) is its native node rebuilt from the metadata's
    ``native_nodes`` (op, ``W`` / ``R`` / ``B`` initializer names, attributes)."""
    ort = require("onnxruntime", "onnx")
    onnx = require("onnx", "onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    layer = ckpt.layer(name)
    node_name = name if layer.num_layers == 1 else f"{name}.l{k}"
    model = onnx.load(str(path), load_external_data=False)
    node = next((n for n in model.graph.node if n.name == node_name), None)
    spec = ((whole_meta(path) or {}).get("native_nodes") or {}).get(node_name)
    if node is None and isinstance(spec, dict):  # a runtime profile wrote the layer as Scans (issue #41): its
        # native node, from the metadata's op, attributes and the initializers the Scans read
        node = helper.make_node(spec["op"], [""] + list(spec["inputs"]), [], name=node_name, **spec["attrs"])
    if node is None:
        raise FormatError(f"{path}: no node '{node_name}' (not written by rnnconvert?)")
    lstm = node.op_type == "LSTM"
    ins = list(node.input) + [""] * (8 - len(node.input))
    ins[0], ins[4], ins[5] = "X", "", "initial_h" if states else ""
    if lstm:
        ins[6] = "initial_c" if states else ""
    ins = ins[:8 if lstm else 6]
    while ins and not ins[-1]:
        ins.pop()
    by_name = {t.name: t for t in model.graph.initializer}
    tensors = []
    for n in ins:
        if n in by_name:
            t = by_name[n]  # external data stays a reference: onnxruntime maps it (options)
            if t.data_type == TensorProto.DOUBLE:  # onnxruntime's RNN kernels are float32 only (see session)
                t = onnx.TensorProto()
                t.CopyFrom(by_name[n])
                if uses_external_data(t):
                    load_external_data_for_tensor(t, str(Path(path).resolve().parent))
                t = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), n)
            tensors.append(t)
    dt = np.float16 if any(t.data_type == TensorProto.FLOAT16 for t in tensors) else np.float32
    elem = TensorProto.FLOAT16 if dt == np.float16 else TensorProto.FLOAT
    outs = ["Y", "Y_h"] + (["Y_c"] if lstm else [])
    step = helper.make_node(node.op_type, ins, outs, name=node.name)
    step.attribute.extend(node.attribute)
    H, D = layer.hidden_size, layer.num_directions
    feeds = [helper.make_tensor_value_info("X", elem, ["T", "N", None])]
    if states:
        feeds += [helper.make_tensor_value_info(key, elem, [D, "N", H])
                  for key in (["initial_h", "initial_c"] if lstm else ["initial_h"])]
    graph = helper.make_graph([step], "rnnconvert_step", feeds,
                              [helper.make_tensor_value_info(o, elem, None) for o in outs], initializer=tensors)
    m = helper.make_model(graph, opset_imports=model.opset_import)
    m.ir_version = model.ir_version
    return ort.InferenceSession(m.SerializeToString(), options(path), providers=["CPUExecutionProvider"]), lstm, dt


#: One onnxruntime session, keyed by the file's identity and the output it computes: verification runs
#: one layer at a time, and a session maps (or, inline, holds) the weights it needs.
#: :func:`release` (called by verification when it is done) drops it.
_SESSION: dict[tuple, Any] = {}


def release() -> None:
    """Drop the cached onnxruntime session (and the weights it holds)."""
    _SESSION.clear()


def options(path: str | Path):
    """Session options of verification's runs: no pre-packing (the LSTM/GRU kernels otherwise re-lay every
    weight matrix for their GEMMs when the session is built: 8 s and a private copy of the weights for the 3
    GB benchmark model; without it they read the weights as stored, at the same outputs,
    docs/performance.md), and external data found beside ``path`` for a model given as bytes
    (``session.model_external_initializers_file_folder_path``: onnxruntime maps the data file, no copy)."""
    ort = require("onnxruntime", "onnx")
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                  str(Path(path).resolve().parent))
    return opts


def pruned(model, outputs: list[str]):
    """``model`` (an ``onnx.ModelProto``, external data not loaded) reduced to what ``outputs`` depend on:
    the nodes on a path to them (walking the topologically sorted node list backwards), the initializers
    and graph inputs those nodes read; external data references kept as they are."""
    from onnx import helper

    need, keep = set(outputs), []
    for node in reversed(model.graph.node):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    keep.reverse()
    inits = [t for t in model.graph.initializer if t.name in need]
    names = {t.name for t in inits}
    graph = helper.make_graph(keep, model.graph.name or "rnnconvert",
                              [v for v in model.graph.input if v.name in need and v.name not in names],
                              [v for v in model.graph.output if v.name in outputs], initializer=inits)
    m = helper.make_model(graph, opset_imports=model.opset_import)
    m.ir_version = model.ir_version
    return m


def session(path: str | Path, output: str):
    """A session computing graph output ``output`` of the written model (:func:`pruned`), cached."""
    ort = require("onnxruntime", "onnx")
    onnx = require("onnx", "onnx")
    from onnx import TensorProto, numpy_helper

    key = (*filerows.identity(path), output)
    if key in _SESSION:
        return _SESSION[key]
    _SESSION.clear()
    model = onnx.load(str(path), load_external_data=False)
    doubles = any(t.data_type == TensorProto.DOUBLE for t in model.graph.initializer)
    if doubles:
        # onnxruntime's CPU LSTM/GRU/RNN kernels are float32 only ("does not support double yet"):
        # run a float32 copy; the verification tolerance already allows for float32 evaluation.
        model = onnx.load(str(path))
        for t in list(model.graph.initializer):
            if t.data_type == TensorProto.DOUBLE:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        for v in list(model.graph.input) + list(model.graph.output):
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    small = pruned(model, [output])
    if len(small.graph.node) == len(model.graph.node) and not doubles:  # nothing to prune: onnxruntime
        sess = ort.InferenceSession(str(path), options(path), providers=["CPUExecutionProvider"])  # reads the file
    else:
        sess = ort.InferenceSession(small.SerializeToString(), options(path), providers=["CPUExecutionProvider"])
    _SESSION[key] = sess
    return sess


class Stage(NamedTuple):
    """One part of a stacked layer's written graph run alone (:func:`stages`): ``nodes`` (``onnx.NodeProto``, in
    the file's order), ``inputs`` (tensor names fed to it: graph inputs and tensors earlier stages computed),
    ``outputs`` (the tensors it computes that later stages read, and the layer's ``{name}__out``) and
    ``initializers`` (the names of the file's initializers its nodes read, nested graphs' included)."""

    nodes: list
    inputs: list
    outputs: list
    initializers: list


def _reads(node) -> set[str]:
    """The tensor names ``node`` reads: its inputs and those of the nodes of its graph attributes (a ``Scan`` or
    ``Loop`` body's outer-scope names; names local to the body are included too, harmlessly: no node outside
    produces them)."""
    from onnx import AttributeProto

    names = {i for i in node.input if i}
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                names |= _reads(n)
    return names


def stages(model, name: str, num_layers: int) -> list[Stage]:
    """The written graph of layer ``name`` (``model``: an ``onnx.ModelProto``, external data not loaded), pruned to
    ``{name}__out`` as :func:`pruned` prunes it, cut into parts run one after another (:func:`staged`): part ``k``
    the nodes that the outputs of stacked node ``{name}.l{k}`` depend on and no earlier part holds (node ``k``
    and, before it, the wiring from node ``k-1``: its ``Transpose``/``Reshape`` merging the directions, or the
    input's transpose before node 0), then one part with the rest (the wiring after the last node to the output).
    Every node of the pruned graph is in exactly one part, as it is in the file; a node the output does not
    depend on (a stacked node the wiring skips) is in none, as onnxruntime would not run it. A part reads only
    its own nodes' initializers: in a file written by rnnconvert one stacked node's weights each (the memory
    bound of the wiring check, issue #38; tests/verify/test_onnx_wiring_bounded.py). Pure graph analysis."""
    out = f"{name}__out"
    need, keep = {out}, []
    for node in reversed(model.graph.node):
        if any(o in need for o in node.output):
            keep.append(node)
            need |= _reads(node)
    keep.reverse()
    reads = [_reads(n) for n in keep]
    made = {o: i for i, n in enumerate(keep) for o in n.output if o}
    part: dict[int, int] = {}  # node index in keep -> part
    names = [name] if num_layers == 1 else [f"{name}.l{k}" for k in range(num_layers)]
    idx = {n.name: i for i, n in enumerate(keep)}
    groups: list[list[int]] = []
    for root in [idx[nm] for nm in names if nm in idx] + [None]:
        todo = [i for i in range(len(keep)) if i not in part] if root is None else [root]
        members: set[int] = set()
        while todo:
            i = todo.pop()
            if i in part or i in members:
                continue
            members.add(i)
            todo.extend(made[t] for t in reads[i] if t in made)
        if members:
            for i in members:
                part[i] = len(groups)
            groups.append(sorted(members))
    inits = {t.name for t in model.graph.initializer}
    fed = {v.name for v in model.graph.input} - inits
    result = []
    for g, members in enumerate(groups):
        own = {o for i in members for o in keep[i].output if o}
        read = set().union(*(reads[i] for i in members)) - own
        later = set().union(set(), *(reads[i] for i in range(len(keep)) if part[i] > g))
        result.append(Stage(nodes=[keep[i] for i in members],
                            inputs=sorted(t for t in read if t in fed or (t in made and part[made[t]] < g)),
                            outputs=sorted(t for t in own if t in later or t == out),
                            initializers=sorted(read & inits)))
    return result


def staged(path: str | Path, name: str, num_layers: int, x: np.ndarray) -> np.ndarray:
    """Layer ``name`` of the written model on ``x`` ``(B, T, I)`` as :func:`run` of :func:`session` computes it (the
    graph pruned to ``{name}__out``, fed ``{name}__in`` and zeros for other inputs), but part by part
    (:func:`stages`): one onnxruntime session per part, built, run and dropped before the next, fed the tensors
    earlier parts computed (passed on exactly, as numpy arrays). Every node and every wire of the pruned graph
    runs in onnxruntime, once; a session maps only its part's initializers, so at most one stacked node's weights
    are mapped at a time instead of the whole layer's (issue #38: 3.4 GB peak RSS for the 3 GB benchmark model).
    Float64 initializers run as float32 (as in :func:`session`), converted part by part. Returns ``(B, T,
    dirs*H)`` float64.

    Raises:
        FormatError: the graph has no input ``{name}__in`` (not written by rnnconvert).
    """
    return _staged(path, name, num_layers, x)[0]


def forward_wired(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, slab_xs: list,
                  load=None) -> tuple[np.ndarray, list, np.ndarray]:
    """Verification's three sequence runs of a stacked layer ``name`` (issue #39) in one pass over its weights:
    ``(whole, ys, joined)``, each float64 ``(B, T, dirs*H)`` as :func:`forward` and :func:`forward_slab` return
    them: ``whole`` the written layer on ``x`` (every node and the file's wiring: :func:`staged`), ``ys[k]`` stacked
    node ``k`` alone on ``slab_xs[k]`` ``(B_k, T, I_k)`` (:func:`forward_slab`), ``joined`` the nodes chained from
    ``x`` as the source joins its slabs (node ``k`` on node ``k-1``'s output, directions concatenated; not
    finished).

    Each part of :func:`staged` runs its stacked node once, on a batch extended by the rows of ``slab_xs[k]`` (a
    ``Concat`` before the node, a ``Gather`` of the file's rows after it; the node's attributes and initializers as
    written), and gives back the node's input and output on the file's rows: where every node's input is exactly
    the join of the previous node's output (node 0's, ``x`` time-major), that run IS the nodes chained, and
    ``joined`` is its last node's output joined; where one is not (the file's wiring between two nodes computes
    something else), ``joined`` is run apart, node by node, from ``x`` (:func:`forward_slab`). So a correct file's
    weights are read once for the three runs instead of three times (issue #38: the 3 GB benchmark's verification
    read every node three times). A row in the extended batch is computed by the same equations as in a batch of
    its own, but onnxruntime's LSTM kernel may round it differently in a batch of another size (float32 rounding,
    which the slab checks' tolerances allow for as for any evaluation order; the 3 GB benchmark's rows come out bit
    for bit the same). Oracle: torch, tests/verify/test_onnx_wired_fused.py. Where a node cannot be extended (a
    ``layout=1`` node, one fed ``sequence_lens`` or initial states by the file, a whole-model graph), the three
    runs are made one by one.

    Raises:
        FormatError: the graph has no input ``{name}__in`` (not written by rnnconvert).
    """
    layer = ckpt.layer(name)
    L = layer.num_layers
    ys, joined = None, None
    if whole_meta(path) is None and L > 1:
        whole, ys, joined = _staged(path, name, L, x, slab_xs)
    if ys is None:
        whole = forward(path, ckpt, name, x)
        ys = [forward_slab(path, ckpt, name, k, slab_xs[k]) for k in range(L)]
    if joined is None:
        joined = _chained(path, ckpt, name, x)
    return whole, ys, joined


def _chained(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """The stacked nodes of layer ``name``, each run alone (:func:`forward_slab`), chained from ``x``: node ``k`` on
    node ``k-1``'s output, directions concatenated; float64 ``(B, T, dirs*H)``, not finished."""
    for k in range(ckpt.layer(name).num_layers):
        x = forward_slab(path, ckpt, name, k, x)
    return x


_RECURRENT = ("LSTM", "GRU", "RNN")


def _fusable(node) -> bool:
    """Whether stacked node ``node`` can run extra batch rows beside the file's (:func:`forward_wired`): a recurrent
    op in the default ``layout`` (time first), fed nothing but ``X``, ``W``, ``R``, ``B``."""
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    return node.op_type in _RECURRENT and layout == 0 and not any(node.input[4:]) and bool(node.input[0])


def _extend(st: Stage, k: int, node, rows: int) -> tuple[list, list, str, str]:
    """Stage ``st``'s nodes with stacked node ``node`` (stacked layer ``k``) run on ``rows`` file rows and more:
    ``(nodes, initializers, extra input, extra output)``. Pure graph construction."""
    from onnx import helper, numpy_helper

    tag = f"__rnnconvert_fused{k}"
    ex, cx, main = f"{tag}_x", f"{tag}_cx", f"{tag}_rows"
    outs = [f"{tag}_o{i}" for i in range(max(1, len(node.output)))]
    copy = helper.make_node(node.op_type, [cx] + list(node.input[1:]), outs, name=node.name)
    copy.attribute.extend(node.attribute)
    nodes = [helper.make_node("Concat", [node.input[0], ex], [cx], axis=1, name=f"{tag}_concat"), copy]
    for i, o in enumerate(node.output):
        if o:  # the file's rows under the file's names: Y (T, D, N, H) batch axis 2, Y_h / Y_c (D, N, H) axis 1
            nodes.append(helper.make_node("Gather", [outs[i], main], [o], axis=2 if i == 0 else 1,
                                          name=f"{tag}_gather{i}"))
    out = []
    for n in st.nodes:
        out.extend(nodes if n is node else [n])
    return out, [numpy_helper.from_array(np.arange(rows, dtype=np.int64), main)], ex, outs[0]


def _staged(path: str | Path, name: str, num_layers: int, x: np.ndarray,
            slab_xs: list | None = None) -> tuple[np.ndarray | None, list | None, np.ndarray | None]:
    """:func:`staged` (``slab_xs`` None: ``(whole, None, None)``) or :func:`forward_wired`'s fused run (``(whole, ys,
    joined)``; ``(None, None, None)`` where a stacked node is not :func:`_fusable`, nothing run then; ``joined`` None
    where a node's input is not exactly the previous node's output joined)."""
    ort = require("onnxruntime", "onnx")
    onnx = require("onnx", "onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    doubles = any(t.data_type == TensorProto.DOUBLE for t in model.graph.initializer)
    by_name = {t.name: t for t in model.graph.initializer}
    x = np.asarray(x)
    known: dict[str, np.ndarray] = {}
    specs = {}
    for v in model.graph.input:
        if v.name in by_name:
            continue
        elem = v.type.tensor_type.elem_type
        if doubles and elem == TensorProto.DOUBLE:
            elem = TensorProto.FLOAT
        dt = np.float64 if elem == TensorProto.DOUBLE else np.float32
        dims = v.type.tensor_type.shape.dim
        known[v.name] = x.astype(dt) if v.name == f"{name}__in" else np.zeros(
            (x.shape[0], x.shape[1], dims[2].dim_value if len(dims) > 2 else 0), dt)
        specs[v.name] = elem
    if f"{name}__in" not in known:
        raise FormatError(f"{path}: no graph input '{name}__in' (not written by rnnconvert?)")
    parts = stages(model, name, num_layers)
    fused: dict[int, tuple[int, object]] = {}  # stage index -> (stacked layer k, its node)
    if slab_xs is not None:
        names = {f"{name}.l{k}": k for k in range(num_layers)}
        for s_i, st in enumerate(parts):
            for n in st.nodes:
                if n.name in names:
                    fused[s_i] = (names[n.name], n)
        if sorted(k for k, _ in fused.values()) != list(range(num_layers)) or not all(
                _fusable(n) for _, n in fused.values()):
            return None, None, None
    ys: list = [None] * num_layers
    joined, chained = known[f"{name}__in"], True  # the file's rows: the layer's input, then each node's output
    folder = str(Path(path).resolve().parent)
    for s_i, st in enumerate(parts):
        tensors = []
        for n in st.initializers:
            t = by_name[n]  # external data stays a reference: onnxruntime maps it (options)
            if doubles and t.data_type == TensorProto.DOUBLE:  # float32 kernels only (see session)
                t = onnx.TensorProto()
                t.CopyFrom(by_name[n])
                if uses_external_data(t):
                    load_external_data_for_tensor(t, folder)
                t = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), n)
            tensors.append(t)
        nodes, ins_names, outs_names, feeds = st.nodes, list(st.inputs), list(st.outputs), {}
        ins = [helper.make_tensor_value_info(
            n, specs[n] if n in specs else helper.np_dtype_to_tensor_dtype(known[n].dtype), None) for n in st.inputs]
        if s_i in fused:
            k, node = fused[s_i]
            dt = np.float16 if any(t.data_type == TensorProto.FLOAT16 for t in tensors) else np.float32
            nodes, idx, ex, yx = _extend(st, k, node, x.shape[0])
            tensors = tensors + idx
            ins.append(helper.make_tensor_value_info(ex, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), None))
            feeds[ex] = np.ascontiguousarray(np.asarray(slab_xs[k], dt).transpose(1, 0, 2))  # (T, B_k, I_k)
            outs_names += [yx] + ([] if node.input[0] in known or node.input[0] in st.outputs else [node.input[0]])
        outs = [onnx.ValueInfoProto(name=n) for n in outs_names]  # onnxruntime infers their types
        graph = helper.make_graph(nodes, model.graph.name or "rnnconvert", ins, outs, initializer=tensors)
        m = helper.make_model(graph, opset_imports=model.opset_import)
        m.ir_version = model.ir_version
        sess = ort.InferenceSession(m.SerializeToString(), options(path), providers=["CPUExecutionProvider"])
        got = sess.run(outs_names, {**{n: known[n] for n in ins_names}, **feeds})
        known.update(zip(st.outputs, got[:len(st.outputs)]))
        if s_i in fused:
            n_out = len(st.outputs)
            y = got[n_out]  # (T, D, B + B_k, H): the file's rows, then slab_xs[k]'s
            xk = known[node.input[0]] if node.input[0] in known else got[n_out + 1]  # the node's input, (T, B, I_k)
            B = x.shape[0]
            T, D, _, H = y.shape
            ys[k] = np.asarray(y[:, :, B:], np.float64).transpose(2, 0, 1, 3).reshape(-1, T, D * H)
            # the chain: node k's input is exactly the previous node's output joined (node 0's: x time-major)
            want = joined.transpose(1, 0, 2) if k == 0 else joined.transpose(0, 2, 1, 3).reshape(T, B, -1)
            chained = chained and xk.shape == want.shape and np.array_equal(xk, want.astype(xk.dtype))
            joined = y[:, :, :B]  # (T, D, B, H)
        del sess, m, graph, tensors
    whole = np.asarray(known[f"{name}__out"], dtype=np.float64)
    if slab_xs is None:
        return whole, None, None
    if not chained:
        return whole, ys, None
    T, D, B, H = joined.shape
    return whole, ys, np.asarray(joined, np.float64).transpose(2, 0, 1, 3).reshape(B, T, D * H)


def run(sess, path, name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    feeds = {}
    for i in sess.get_inputs():
        dt = np.float64 if i.type == "tensor(double)" else np.float32
        feeds[i.name] = x.astype(dt) if i.name == f"{name}__in" else np.zeros((x.shape[0], x.shape[1], i.shape[2]), dt)
    if f"{name}__in" not in feeds:
        raise FormatError(f"{path}: no graph input '{name}__in' (not written by rnnconvert?)")
    (y,) = sess.run([f"{name}__out"], feeds)
    return np.asarray(y, dtype=np.float64)


RUNTIME = Runtime("onnxruntime", engine="onnxruntime", forward=forward, forward_slab=forward_slab, step=step,
                  forward_wired=forward_wired, release=release, wired=True,
                  verify_whole=located("rnnconvert.whole.runtimes.onnx_whole:verify_whole"))
