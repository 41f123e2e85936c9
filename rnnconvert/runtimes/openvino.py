"""The OpenVINO runtime: a written IR read by OpenVINO (``Core.read_model``) and run on the CPU plugin with
``INFERENCE_PRECISION_HINT=f32`` (the CPU plugin would otherwise run f32 models in bf16 on CPUs that have it),
for verification's target side. The IR is opened from its path (a folder with ``model.xml``/``model.bin``, or
the ``.xml``); no :attr:`~rnnconvert.engine.protocol.FormatSpec.load`. openvino is imported inside the functions.

* ``forward``: the whole written model, fed the layer's input ``name__in`` (zeros for other layers' inputs),
  its output ``name__out``;
* ``forward_slab``/``step``: the written sequence node of stacked layer ``k`` (found by its friendly name,
  :func:`rnnconvert.formats.openvino.naming.node_name` -- the same rule is repeated here as a runtime may not
  import a format) rebuilt with its attributes on new ``Parameter`` inputs for ``X`` and the initial states and OpenVINO's
  own constants for ``W``, ``R``, ``B`` as read from the file, in a one-node model.

Results float64; outputs ``(B, T, D*H)``; steps ``[(h1 (N, H), c1 (N, H) or None)]`` per direction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.model import Checkpoint
from ..engine.protocol import Runtime
from ..errors import FormatError, require
from ..speed import filerows

#: the last IR read, keyed by its identity (:func:`release` drops it)
_CACHE: dict[tuple, Any] = {}
CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


def release() -> None:
    """Drop the cached model and compiled models."""
    _CACHE.clear()


def _xml(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        xmls = sorted(p.glob("*.xml"))
        if len(xmls) != 1:
            raise FormatError(f"{p}: a folder with {len(xmls)} .xml files")
        p = xmls[0]
    return p


def _model(path: str | Path):
    xml = _xml(path)
    key = filerows.identity(xml)
    if _CACHE.get("key") != key:
        ov = require("openvino", "openvino")
        _CACHE.clear()
        core = ov.Core()
        _CACHE.update(key=key, core=core, model=core.read_model(str(xml)), compiled={})
    return _CACHE


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load=None) -> np.ndarray:
    """Layer ``name`` of the written IR in OpenVINO on ``x`` ``(B, T, I)`` from zero states: ``(B, T, D*H)``.
    A stacked layer of ``ckpt`` (``num_layers > 1``: verification's wiring check, issue #39) runs part by part
    (:func:`staged`), one sequence node's weights compiled at a time (issue #38)."""
    if ckpt is not None and ckpt.layer(name).num_layers > 1:
        return staged(path, ckpt, name, x)
    c = _model(path)
    if "whole" not in c["compiled"]:
        c["compiled"]["whole"] = c["core"].compile_model(c["model"], "CPU", CONFIG)
    cm = c["compiled"]["whole"]
    x = np.asarray(x, np.float32)
    feeds = {}
    for inp in cm.inputs:
        nm = inp.get_any_name()
        feeds[nm] = x if nm == f"{name}__in" else np.zeros((x.shape[0], x.shape[1], inp.get_partial_shape()[2].get_length()), np.float32)
    if f"{name}__in" not in feeds:
        raise FormatError(f"{path}: no input '{name}__in' (not written by rnnconvert?)")
    out = cm(feeds)
    return np.asarray(out[cm.output(f"{name}__out")], np.float64)


def parts(model, name: str, num_layers: int) -> list:
    """The IR ``model`` (an ``openvino.Model`` read for this alone: it is edited) of stacked layer ``name`` cut
    before each sequence node but the first: node ``k``'s input ``X`` (the IR's ``Transpose``/``Reshape`` of node
    ``k-1``'s output) is replaced by a new ``Parameter`` ``rnnconvert_cut{k}``. Returns ``[(parameter or None,
    output)]`` per part: part ``k`` computes ``output`` (the next node's input as the IR wires it; for the last part
    the layer's ``{name}__out``) from the graph's own inputs and the parameters of the earlier cuts; in a written
    IR it holds sequence node ``k`` and the wiring after it, nothing of another node (tests/verify/
    test_onnx_wiring_bounded.py). The edges cut are exactly these inputs: every other edge is run as written.

    Raises:
        FormatError: no sequence node ``{name}.l{k}`` or no output ``{name}__out`` (not written by rnnconvert).
    """
    ops = require("openvino.opset13", "openvino")
    by = {n.get_friendly_name(): n for n in model.get_ordered_ops()}
    nodes = []
    for k in range(num_layers):
        want = name if num_layers == 1 else f"{name}.l{k}"
        node = by.get(want)
        if node is None or not node.get_type_name().endswith("Sequence"):
            raise FormatError(f"no sequence node '{want}' (not written by rnnconvert?)")
        nodes.append(node)
    out = next((o for o in model.outputs if f"{name}__out" in o.get_names()), None)
    if out is None:
        raise FormatError(f"no output '{name}__out' (not written by rnnconvert?)")
    cuts = [None]
    ends = []
    for k in range(1, num_layers):
        src = nodes[k].input(0).get_source_output()
        p = ops.parameter(src.get_partial_shape(), src.get_element_type(), name=f"rnnconvert_cut{k}")
        nodes[k].input(0).replace_source_output(p.output(0))
        cuts.append(p)
        ends.append(src)
    return list(zip(cuts, ends + [out.get_node().input(0).get_source_output()]))


def staged(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Stacked layer ``name`` of the written IR on ``x`` ``(B, T, I)`` as :func:`forward` of the whole model
    computes it, but part by part (:func:`parts`): each part compiled, run and dropped before the next, fed the
    graph's inputs (``{name}__in``; zeros for other layers') and the outputs of the earlier parts (passed on
    exactly). Every node and wire of the IR on the way to ``{name}__out`` runs in OpenVINO once (the shapes of
    ``{name}__in`` in each part); a compiled part holds one sequence node's weights instead of the layer's.
    Returns ``(B, T, D*H)`` float64."""
    ov = require("openvino", "openvino")
    ops = require("openvino.opset13", "openvino")
    c = _model(path)
    model = c["core"].read_model(str(_xml(path)))  # its own copy: parts() edits it (the weights stay mapped)
    x = np.asarray(x, np.float32)
    graph = list(model.get_parameters())
    feeds = {}
    for p in graph:
        nm = p.get_friendly_name()
        feeds[nm] = x if nm == f"{name}__in" else np.zeros(
            (x.shape[0], x.shape[1], p.get_partial_shape()[2].get_length()), np.float32)
    if f"{name}__in" not in feeds:
        raise FormatError(f"{path}: no input '{name}__in' (not written by rnnconvert?)")
    y = None
    known = list(graph)
    for cut, end in parts(model, name, ckpt.layer(name).num_layers):
        if cut is not None:
            feeds[cut.get_friendly_name()] = y
            known.append(cut)
        part = ov.Model([ops.result(end)], known, "rnnconvert_part")
        cm = c["core"].compile_model(part, "CPU", CONFIG)
        y = np.asarray(cm({i.get_node().get_friendly_name(): feeds[i.get_node().get_friendly_name()]
                           for i in cm.inputs})[0])
        del cm, part
    return np.asarray(y, np.float64)


def _node(path, ckpt: Checkpoint, name: str, k: int, states: bool):
    """``(compiled one-node model, is_lstm, D)`` of stacked layer ``k`` (module docstring)."""
    ops = require("openvino.opset13", "openvino")
    ov = require("openvino", "openvino")
    c = _model(path)
    key = (name, k, states)
    layer = ckpt.layer(name)
    if key in c["compiled"]:
        return c["compiled"][key]
    want = name if layer.num_layers == 1 else f"{name}.l{k}"
    node = next((n for n in c["model"].get_ordered_ops() if n.get_friendly_name() == want), None)
    if node is None or not node.get_type_name().endswith("Sequence"):
        raise FormatError(f"{path}: no sequence node '{want}' (not written by rnnconvert?)")
    lstm = node.get_type_name() == "LSTMSequence"
    D, H, I = layer.num_directions, layer.hidden_size, layer.layer_input_size(k)
    x = ops.parameter([-1, -1, I], np.float32, name="X")
    params = [x]
    if states:
        h0 = ops.parameter([-1, D, H], np.float32, name="H0")
        params.append(h0)
        if lstm:
            c0 = ops.parameter([-1, D, H], np.float32, name="C0")
            params.append(c0)
    shape = ops.shape_of(x, "i64")
    batch = ops.gather(shape, ops.constant(np.array([0], np.int64)), ops.constant(np.array(0, np.int64)))
    steps = ops.gather(shape, ops.constant(np.array([1], np.int64)), ops.constant(np.array(0, np.int64)))
    if not states:
        zeros = ops.broadcast(ops.constant(np.array(0, np.float32)),
                              ops.concat([batch, ops.constant(np.array([D, H], np.int64))], 0))
        h0 = c0 = zeros
    lengths = ops.broadcast(ops.convert(steps, "i32"), batch)
    W, R, B = list(node.input_values())[4 if lstm else 3:]  # OpenVINO's own constants, as read from the file
    at = node.get_attributes()
    kw = {"activations": at["activations"], "clip": at["clip"]}
    if lstm:
        new = ops.lstm_sequence(x, h0, c0, lengths, W, R, B, at["hidden_size"], at["direction"], **kw)
    elif node.get_type_name() == "GRUSequence":
        new = ops.gru_sequence(x, h0, lengths, W, R, B, at["hidden_size"], at["direction"],
                               linear_before_reset=at["linear_before_reset"], **kw)
    else:
        new = ops.rnn_sequence(x, h0, lengths, W, R, B, at["hidden_size"], at["direction"], **kw)
    outs = [ops.result(new.output(j)) for j in range(len(new.outputs()))]
    for old in [o for o in c["compiled"] if isinstance(o, tuple) and o[:2] != key[:2]]:
        del c["compiled"][old]  # one stacked node's compiled models kept at a time (issue #38)
    compiled = (c["core"].compile_model(ov.Model(outs, params, "rnnconvert_step"), "CPU", CONFIG), lstm, D)
    c["compiled"][key] = compiled
    return compiled


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load=None) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` alone in OpenVINO (its written node, :func:`_node`) on ``x``
    ``(B, T, I_k)`` from zero states: ``(B, T, D*H)`` float64, directions concatenated, forward first."""
    cm, _, D = _node(path, ckpt, name, k, states=False)
    y = np.asarray(cm(np.asarray(x, np.float32))[0], np.float64)  # (B, D, T, H)
    B, _, T, H = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, D * H)


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load=None) -> list:
    """One step of stacked layer ``k`` in OpenVINO from each of ``N`` states (``states[d] = (h0, c0 or None)``),
    ``x`` ``(N, I_k)``: ``[(Y_h[:, d], Y_c[:, d] or None)]`` float64."""
    cm, lstm, D = _node(path, ckpt, name, k, states=True)
    feeds = [np.asarray(x, np.float32)[:, None, :], np.stack([np.asarray(s[0], np.float32) for s in states], 1)]
    if lstm:
        feeds.append(np.stack([np.asarray(s[1], np.float32) for s in states], 1))
    out = cm(feeds)
    yh = np.asarray(out[1], np.float64)
    yc = np.asarray(out[2], np.float64) if lstm else None
    return [(yh[:, d], None if yc is None else yc[:, d]) for d in range(D)]


RUNTIME = Runtime("openvino", engine="openvino", forward=forward, forward_slab=forward_slab, step=step,
                  release=release, wired=True)  # stacked nodes joined by the IR's Transpose/Reshape (issue #39)
