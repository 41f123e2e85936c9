"""The whole Keras model of a tf.keras / tf_keras SavedModel folder (``model.save(dir)``, ``save_format='tf'``;
issue #30), read without TensorFlow and without running anything the folder holds.

A SavedModel written by tf.keras / tf_keras holds, beside ``saved_model.pb`` (the traced functions, never read
here) and ``variables/variables.{index,data-*}`` (the TF2 object checkpoint :mod:`.checkpoint_read` reads),
``keras_metadata.pb``: a protobuf ``SavedMetadata {repeated SavedObject nodes = 1}``, ``SavedObject {int32
node_id = 2; string node_path = 3; string identifier = 4; string metadata = 5; VersionDef version = 6}``
(tf_keras ``protobuf/saved_metadata.proto``; docs/LAYOUTS.md §7.4). It is decoded by the wire-format reader of
:mod:`.table_read` (bounded varints, every length checked against its message) under the resource budget
(:mod:`rnnconvert.safety.budget`: ``header_bytes`` for the file, ``names`` for the node count).

* The root node (``node_path`` ``root``) holds the model's JSON metadata: ``class_name`` (``Sequential`` /
  ``Functional`` / ``Model``) and ``config``, the same config as a full-model HDF5 file's ``model_config`` with
  tuples encoded as ``{"class_name": "__tuple__", "items": [...]}`` (turned into lists:
  :func:`rnnconvert.conventions.keras_names.untuple`).
* Each layer node's ``node_path`` (``root.layer_with_weights-0``, ``root.layer-1``, nested:
  ``root.layer_with_weights-0.forward_layer``) names the object path of its variables in the checkpoint
  (``layer_with_weights-0/embeddings``); its metadata's ``name`` is the Keras layer name.
* Every top-level layer's variables are listed in tf_keras' ``layer.weights`` order (= a full-model HDF5 file's
  ``weight_names``; :func:`rnnconvert.conventions.keras_names.saved_weight_key`) under HDF5-style names
  (``bilstm/forward_lstm/lstm_cell/kernel:0``), so that :func:`rnnconvert.whole.conventions.keras_graph.build` gets
  what a full-model HDF5 file gives it.

Verification never loads the SavedModel (its functions could hold file operations): tf_keras rebuilds the model
from the config (built-in classes only) and is given these weights
(:func:`rnnconvert.formats.keras.keras_whole.source_model`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import keras_names as naming
from ...conventions.full_model import FullModel
from ...conventions.keras_interpreter import index_configs
from ...core.model import Checkpoint
from ...errors import FormatError, UnsupportedError
from ...safety import budget, keras_sanitize
from ...safety.paths import folder_of, open_inside
from . import checkpoint_read
from .naming import ATTR
from .table_read import TableError, fields, int64, text
from .tensors import bundle, tensor


def saved_nodes(blob: bytes, where: object) -> list[dict[str, Any]]:
    """The ``SavedObject`` nodes of a ``keras_metadata.pb``: ``{'node_id', 'node_path', 'identifier',
    'metadata'}`` each, ``metadata`` the parsed JSON object.

    Raises:
        FormatError: not such a protobuf (a bad varint, a length past its message, a wrong wire type), a
            metadata string that is not a JSON object. BudgetError: more nodes than the ``names`` limit."""
    nodes: list[dict[str, Any]] = []
    try:
        for num, wt, span in fields(blob):
            if num != naming.SAVED_NODES:
                continue
            if wt != 2:
                raise TableError(f"field {num} of wire type {wt} where a SavedObject message is expected")
            budget.check_count(where, "names", len(nodes) + 1, "keras_metadata.pb nodes")
            node: dict[str, Any] = {"node_id": None, "node_path": "", "identifier": "", "metadata": ""}
            for n2, w2, v2 in fields(blob, *span):
                if n2 == naming.SAVED_NODE_ID and w2 == 0:
                    node["node_id"] = int64(v2)
                elif n2 in (naming.SAVED_NODE_PATH, naming.SAVED_IDENTIFIER, naming.SAVED_METADATA_JSON):
                    if w2 != 2:
                        raise TableError(f"SavedObject field {n2} of wire type {w2} where a string is expected")
                    node[{naming.SAVED_NODE_PATH: "node_path", naming.SAVED_IDENTIFIER: "identifier",
                          naming.SAVED_METADATA_JSON: "metadata"}[n2]] = text(blob, v2)
            nodes.append(node)
    except TableError as exc:
        raise FormatError(f"{where}: damaged keras_metadata.pb ({exc})") from exc
    for node in nodes:
        try:
            md = json.loads(node["metadata"]) if node["metadata"] else {}
        except (json.JSONDecodeError, RecursionError) as exc:
            raise FormatError(f"{where}: damaged keras_metadata.pb: the metadata of node '{node['node_path'][:80]}' "
                              f"is not JSON ({str(exc)[:120]})") from None
        if not isinstance(md, dict):
            raise FormatError(f"{where}: damaged keras_metadata.pb: the metadata of node "
                              f"'{node['node_path'][:80]}' is not a JSON object")
        node["metadata"] = md
    return nodes


def metadata_path(ckpt: Checkpoint) -> Path | None:
    """The ``keras_metadata.pb`` of the SavedModel folder ``ckpt`` was read from, or ``None`` (another TF
    checkpoint, a SavedModel without it: its recurrent layers are read as before)."""
    if ckpt.format != "tf_checkpoint" or ckpt.meta.get("kind") != "tf2_object":
        return None
    path = ckpt.meta.get("path")
    if not path or not Path(path).is_dir():
        return None
    meta = Path(path) / naming.SAVED_METADATA
    return meta if meta.is_file() else None


def _read_blob(meta: Path) -> bytes:
    """``keras_metadata.pb``'s bytes, opened inside the SavedModel folder (``safety/paths``: symlinks resolved,
    a regular file), at most the ``header_bytes`` budget."""
    with open_inside(folder_of(meta), meta.name, meta, "metadata file", scope="SavedModel folder") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > budget.limit("header_bytes"):
            raise budget.exceeded(meta, "header_bytes", f"keras_metadata.pb of {size:,} bytes")
        return fh.read(size + 1)[: budget.limit("header_bytes") + 1]


def read(path: str | Path, **opts: Any) -> Checkpoint:
    """The TF checkpoint records' reader: :func:`.checkpoint_read.read` (every option, ``lazy`` included), then a
    tf.keras / tf_keras SavedModel folder's layers and carried tensors named by the Keras names of its
    ``keras_metadata.pb`` (``lstm_5``, not ``layer_with_weights-0``; issue #42), the object path kept in
    ``source['object_path']`` (:func:`keras_named`).

    Raises: as :func:`.checkpoint_read.read`; BudgetError: a ``keras_metadata.pb`` over the budget."""
    return keras_named(checkpoint_read.read(path, **opts))


#: a Keras layer name rnnconvert puts in state-dict keys (``lstm_5``); others keep the object path
_KERAS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,199}")


def keras_named(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` (a TF2 object checkpoint read from a SavedModel folder, eager or lazy) with its layers and carried
    tensors named by the Keras layer names of its ``keras_metadata.pb`` (``lstm_5`` for ``layer_with_weights-0``,
    the node ``root.layer_with_weights-0``'s metadata ``name``), each layer keeping its object path in
    ``source['object_path']`` (for messages). ``ckpt`` itself when it is no such folder, has no
    ``keras_metadata.pb``, or the file cannot name every top object (damaged, a missing node, a name that is not
    ``[A-Za-z_][A-Za-z0-9_-]*``, two objects of one name): then ``meta['keras_names']`` says why, and the whole-model
    reader (:func:`read_full_model`) refuses the damaged file as before. Source: tf_keras' SavedModel writer
    (``keras_metadata.pb`` node paths ``root.layer_with_weights-N``; fixtures ``fixtures/keras_savedmodel``).

    Raises:
        BudgetError: a ``keras_metadata.pb`` over the ``header_bytes`` budget or with more nodes than ``names``."""
    from dataclasses import replace

    meta = metadata_path(ckpt)
    if meta is None:
        return ckpt
    try:
        by_path = {n["node_path"]: n["metadata"] for n in saved_nodes(_read_blob(meta), meta)}
    except FormatError as exc:
        return replace(ckpt, meta={**ckpt.meta, "keras_names": f"not read: {str(exc)[:200]}"})
    tops = {lay.name.split(".", 1)[0] for lay in ckpt.layers} | {k.split(".", 1)[0] for k in ckpt.tensors}
    names = {}
    for top in tops:
        name = (by_path.get(f"{naming.SAVED_ROOT}.{top}") or {}).get("name")
        if not isinstance(name, str) or not _KERAS_NAME.fullmatch(name):
            return replace(ckpt, meta={**ckpt.meta, "keras_names": f"'{top}' has no usable Keras name"})
        names[top] = name
    if len(set(names.values())) != len(names):
        return replace(ckpt, meta={**ckpt.meta, "keras_names": "two objects share a Keras name"})

    def renamed(key: str) -> str:
        top, _, rest = key.partition(".")
        return names[top] + ("." + rest if rest else "")

    layers = [replace(lay, name=renamed(lay.name), source={**lay.source, "object_path": lay.name})
              for lay in ckpt.layers]
    return replace(ckpt, layers=layers, tensors={renamed(k): v for k, v in ckpt.tensors.items()})


def model_config(nodes: list[dict[str, Any]], where: object) -> dict[str, Any]:
    """The model config (``{'class_name', 'config'}`` as an HDF5 ``model_config``) of the root node.

    Raises:
        FormatError: no root node, or a root that is not a Sequential / Functional model with a config."""
    root = next((n for n in nodes if n["node_path"] == naming.SAVED_ROOT), None)
    if root is None:
        raise FormatError(f"{where}: keras_metadata.pb has no '{naming.SAVED_ROOT}' node")
    md = root["metadata"]
    if md.get("class_name") not in naming.CONTAINERS or not isinstance(md.get("config"), dict):
        raise UnsupportedError(f"{where}: the SavedModel's root object is a {str(md.get('class_name'))[:60]!s}, not "
                               "a Sequential or Functional Keras model with a config; --recurrent-only converts its "
                               "recurrent layers")
    try:
        return {"class_name": md["class_name"], "config": naming.untuple(md["config"])}
    except RecursionError:
        raise FormatError(f"{where}: keras_metadata.pb: the model config is nested too deeply") from None


def read_full_model(ckpt: Checkpoint) -> FullModel | None:
    """The whole Keras model of the SavedModel folder ``ckpt`` was read from (module docstring), or ``None``
    when ``ckpt`` is not such a folder or has no ``keras_metadata.pb``.

    Returns:
        a :class:`~rnnconvert.conventions.full_model.FullModel` with ``origin='weights'`` (tf_keras is given
        the weights, never the SavedModel's functions) and ``layer_names`` (the checkpoint's recurrent layers,
        by Keras name or, when :func:`keras_named` could not name them, ``layer_with_weights-N`` -> their Keras
        names).

    Raises:
        FormatError: a damaged ``keras_metadata.pb`` or checkpoint, a variable under a layer the metadata does not
            name. BudgetError: a file or node count over the budget. UnsupportedError: a root that is not a
            Keras model; a bundle the pure reader declines."""
    meta = metadata_path(ckpt)
    if meta is None:
        return None
    folder = str(meta.parent)
    nodes = saved_nodes(_read_blob(meta), meta)
    config = keras_sanitize.model_config(model_config(nodes, meta), folder, unknown="stub")  # issue #40
    by_path = {n["node_path"]: n["metadata"] for n in nodes}
    pre = ckpt.meta.get("prefix") or str(Path(folder) / "variables" / "variables")
    rd = bundle(pre, folder)
    if rd is None:
        raise UnsupportedError(f"{folder}: the SavedModel's variables are not read without TensorFlow here "
                               "(a bundle rnnconvert's reader declines); --recurrent-only converts its recurrent layers")
    shapes = rd.get_variable_to_shape_map()
    keys = {k[: -len(ATTR)]: k for k in shapes if k.endswith(ATTR) and "/.OPTIMIZER_SLOT/" not in k}
    if any(not n.startswith("layer") for n in keys) and "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes:
        paths = checkpoint_read.object_paths(tensor(rd, "_CHECKPOINTABLE_OBJECT_GRAPH", folder, raw=True), folder)
        keys = {(n if n.startswith("layer") else paths.get(k, n)): k for n, k in keys.items()}
    groups: dict[str, list[str]] = {}
    for obj in keys:
        top = obj.split("/", 1)[0]
        if top.startswith("layer"):
            groups.setdefault(top, []).append(obj)
    weights: dict[str, list[tuple[str, np.ndarray]]] = {}
    names: dict[str, str] = {}
    for top, objs in groups.items():
        md = by_path.get(f"{naming.SAVED_ROOT}.{top}")
        if md is None or not isinstance(md.get("name"), str):
            raise FormatError(f"{meta}: the checkpoint holds variables of '{top}', which keras_metadata.pb does not "
                              "name")
        lname, cls = md["name"], md.get("class_name")
        names[top] = lname
        ranked = []
        for obj in objs:
            parts = obj.split("/")[1:]
            key = naming.saved_weight_key(parts)
            if key is None:
                raise UnsupportedError(f"{folder}: layer '{lname}' ({cls}): variable '{obj}' is not one the "
                                       f"whole-model reader orders (kernel, recurrent_kernel, bias, embeddings, "
                                       f"gamma, beta, moving_mean, moving_variance); --recurrent-only converts the "
                                       "recurrent layers")
            ranked.append((key, obj))
        listed = []
        for _, obj in sorted(ranked):
            parts = obj.split("/")
            shown = [(by_path.get(naming.SAVED_ROOT + "." + ".".join(parts[: i + 1])) or {}).get("name") or p
                     for i, p in enumerate(parts[:-1])]
            if cls in naming.CONTAINERS:  # a nested model: its layers' names first, as HDF5 weight_names
                shown = shown[1:]
            wname = "/".join([*shown, parts[-1]]) + ":0"
            listed.append((wname, tensor(rd, keys[obj], folder)))
        weights[lname] = listed
    version = next((str(n["metadata"].get("keras_version")) for n in nodes
                    if n["node_path"] == naming.SAVED_ROOT and n["metadata"].get("keras_version")), None)
    order = list(index_configs(config))  # the model's layer order (an HDF5 file's layer_names)
    weights = {n: weights[n] for n in sorted(weights, key=lambda n: order.index(n) if n in order else len(order))}
    # the checkpoint's layers are named by Keras name already (:func:`keras_named`) or, when keras_metadata.pb
    # could not name them all, by object path: either way mapped to the Keras name through the object path
    renames = {lay.name: names[lay.source.get("object_path", lay.name)] for lay in ckpt.layers
               if lay.source.get("object_path", lay.name) in names}
    return FullModel(folder, config, version, weights, framework="tf_keras", origin="weights", layer_names=renames,
                     layers=recurrent_layers(folder, config, weights, version))


def recurrent_layers(folder: str, config: dict, weights: dict[str, list[tuple[str, np.ndarray]]],
                     version: str | None) -> list:
    """The recurrent layers of the model read with its config, as from a full-model HDF5 file (the Keras
    interpreter, :class:`rnnconvert.conventions.keras_interpreter.Interpreter`): activations (``hard_sigmoid``),
    ``reset_after``, ``go_backwards``, ``return_sequences``, a Bidirectional's ``merge_mode`` come from the config,
    which the checkpoint alone does not hold (its reader takes TF2 Keras defaults).

    Raises:
        FormatError / UnsupportedError: as the HDF5 reader (weights of unexpected shapes, unsupported cells)."""
    from dataclasses import replace

    from ...conventions.keras_interpreter import Interpreter, LayerEntry

    kr = Interpreter(folder, version or "2.4.0", None)  # a config names every activation; "2.4.0": TF2 defaults
    cfgs = index_configs(config)
    for lname, listed in weights.items():
        rec = cfgs.get(lname, {})
        kr.entry(LayerEntry(lname, [wn for wn, _ in listed], [a for _, a in listed], rec.get("config"),
                            rec.get("class_name")), "")
    out = []
    for lay in kr.ckpt.layers:
        out.append(replace(lay, source={**lay.source, "format": "tf_checkpoint", "savedmodel": True}))
    return out

