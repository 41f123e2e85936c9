"""TF1 frozen GraphDef (``.pb``): weights stored as ``Const`` nodes; reader.

Frozen graphs keep each variable's value in a ``Const`` node named like the variable
(``net/kernel``, ``rnn/lstm_cell/kernel``; ``tf.compat.v1.graph_util.convert_variables_to_constants``).
Two kinds of names are recognised:

* TF1 cell scopes (``lstm_cell``, ``gru_cell``, ...): read exactly like a TF1 name-based checkpoint
  (:mod:`.checkpoint_read`), with its gate conventions and ``forget_bias`` defaults.
* Keras layers (``<layer>/kernel``, ``recurrent_kernel``, ``bias``; Bidirectional ``forward_*`` /
  ``backward_*``): read by the Keras interpreter of :mod:`rnnconvert.conventions.keras_interpreter` (kind from the shapes). The
  activations are not stored as data; they are taken from the graph's ops under the layer's scope:
  ``Sigmoid`` ops -> sigmoid gates, ``Minimum``+``Maximum`` without ``Sigmoid`` -> Keras 2
  ``hard_sigmoid`` (``clip(0.2x+0.5, 0, 1)``, tf_keras ``backend.hard_sigmoid``); ``Tanh`` -> tanh,
  ``Relu`` -> relu, neither -> linear. ``gate_activation``/``activation`` options override.

Protobuf is parsed with TensorFlow's ``GraphDef`` (no code is executed); TensorFlow is imported lazily.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any


from ...errors import FormatError, require
from ...core.model import Checkpoint

_WEIGHT_NAMES = ("kernel", "recurrent_kernel", "bias", "embeddings")


def _consts(path: Path):
    tf = require("tensorflow", "tensorflow")
    g = tf.compat.v1.GraphDef()
    try:
        g.ParseFromString(path.read_bytes())
    except Exception as exc:  # google.protobuf DecodeError and friends
        raise FormatError(f"{path}: not a TensorFlow GraphDef ({exc})") from exc
    consts, ops = {}, defaultdict(Counter)
    for n in g.node:
        top = n.name.split("/")[0]
        ops[top][n.op] += 1
        if n.op == "Const" and n.attr["value"].tensor.dtype in (1, 2, 19):  # float32, float64, float16
            arr = _const_array(tf, n, path)
            if arr.ndim >= 1:
                consts[n.name] = arr
    return tf, consts, ops


#: a Const whose values are fewer than its declared elements is filled by TensorFlow (a splat,
#: e.g. a zero bias); beyond this many elements such a fill is refused (a forged shape would make
#: ``make_ndarray`` allocate it whole)
MAX_SPLAT = 1 << 24
_ITEMSIZE = {1: 4, 2: 8, 19: 2}


def _const_array(tf, node, path: Path):
    """The value of a float ``Const`` node, after checking its declared shape against the stored values.

    Raises:
        FormatError: negative dims, ``tensor_content`` of another length than the shape says, or a
            fill of more than :data:`MAX_SPLAT` elements from fewer stored values.
    """
    t = node.attr["value"].tensor
    dims = [d.size for d in t.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise FormatError(f"{path}: Const '{node.name}' declares a negative dimension {dims}")
    count = 1
    for d in dims:
        count *= d
    if t.tensor_content:
        if len(t.tensor_content) != count * _ITEMSIZE[t.dtype]:
            raise FormatError(f"{path}: Const '{node.name}' declares shape {dims} ({count} elements) but holds "
                              f"{len(t.tensor_content)} bytes")
    else:
        stored = len(t.half_val) if t.dtype == 19 else len(t.float_val) if t.dtype == 1 else len(t.double_val)
        if stored > count or (stored < count and count > MAX_SPLAT):
            raise FormatError(f"{path}: Const '{node.name}' declares shape {dims} ({count} elements) but stores "
                              f"{stored} values")
    try:
        return tf.make_ndarray(t)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"{path}: Const '{node.name}' cannot be decoded ({exc})") from exc


def _activations(ops: Counter) -> dict[str, str]:
    cfg = {}
    if ops["Sigmoid"]:
        cfg["recurrent_activation"] = "sigmoid"
    elif ops["Minimum"] and ops["Maximum"]:
        cfg["recurrent_activation"] = "hard_sigmoid"
    if "recurrent_activation" in cfg:  # the recurrence is in the graph: decide the activation too
        cfg["activation"] = "tanh" if ops["Tanh"] else "relu" if ops["Relu"] else "linear"
    return cfg


def read(path: str | Path, *, gate_activation: str | None = None, activation: str | None = None,
         **opts: Any) -> Checkpoint:
    """Read the recurrent layers of a frozen GraphDef.

    Args:
        path: the ``.pb`` file.
        gate_activation, activation: override what the graph's ops say (Keras layers).
        **opts: TF1-cell options of :func:`.checkpoint_read.read` (``forget_bias``, ``cell_clip``, ...).

    Raises:
        FormatError: not a GraphDef, or no recurrent weights among its Const nodes (a SavedModel's
            ``saved_model.pb`` holds none: read its ``variables/`` checkpoint instead).
        UnsupportedError: an activation or cell rnnconvert cannot represent.
    """
    from . import naming, checkpoint_read as tfc
    from ...conventions.keras_interpreter import LayerEntry, Interpreter

    path = Path(path)
    tf, consts, ops = _consts(path)
    meta = {"path": str(path), "tensorflow": tf.__version__, "kind": "tf1_frozen_graph"}
    if any(naming.CELL_RE.match(k) for k in consts):
        ck = tfc.read_tf1(path, consts, consts.__getitem__, meta, forget_bias=opts.get("forget_bias"),
                           opts={k: opts.get(k) for k in ("num_layers", "hidden_size", "bidirectional")},
                           cell_clip=opts.get("cell_clip"), proj_clip=opts.get("proj_clip"))
        return replace(ck, format="tf_graph")
    groups: dict[str, list[str]] = defaultdict(list)
    for k in consts:
        if "/" in k and k.rsplit("/", 1)[1] in _WEIGHT_NAMES:
            groups[k.split("/")[0]].append(k)
    rank = {n: i for i, n in enumerate(_WEIGHT_NAMES)}
    kr = Interpreter(str(path), "2.4.0", gate_activation)
    # "2.4.0" only selects the TF2 Keras defaults (sigmoid gates, reset_after); the file names no Keras version
    kr.ckpt.meta.pop("keras_version", None)
    kr.ckpt = replace(kr.ckpt, format="tf_graph")
    kr.ckpt.meta.update(meta)
    for top in sorted(groups, key=tfc.natural_key):
        names = sorted(groups[top], key=lambda k: ("backward_" in k, k.rsplit("/", 1)[0], rank[k.rsplit("/", 1)[1]]))
        cfg = _activations(ops[top])
        if activation:
            cfg["activation"] = activation
        if gate_activation:
            cfg["recurrent_activation"] = gate_activation
        rel = [k.split("/", 1)[1] for k in names]
        has_rnn = any(n.endswith("recurrent_kernel") for n in rel)
        kr.entry(LayerEntry(top, rel, [consts[k] for k in names], cfg if has_rnn else None), "")
    if not kr.ckpt.layers:
        raise FormatError(f"{path}: no recurrent weights among the graph's Const nodes (a frozen graph keeps "
                          "them as Const; for a SavedModel read its variables/variables checkpoint)")
    for lay in kr.ckpt.layers:
        lay.source["format"] = "tf_graph"
    return kr.ckpt
