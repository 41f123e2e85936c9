"""A Keras 1/2 full model as a flat graph of whitelisted layer calls (issue #30), for the whole-model writers.

Input: the model's ``model_config`` (parsed JSON, as a Keras 1/2 / tf.keras / tf_keras full-model HDF5 file
stores it: tf_keras ``saving/legacy/hdf5_format.py``), every layer's stored weights in ``@weight_names``
order (``{top-level layer: [(weight name, array)]}``), and the canonical checkpoint read from the same file
(the recurrent layers, by dotted path: ``outer.inner`` for nested models). Output: :class:`Graph`, the
layer calls in an order where every input is computed first, tensors named by strings, nested
Sequential/Functional models flattened, shared layers called once per use. No framework is imported;
the ONNX (:mod:`rnnconvert.formats.onnx.model_write`) and ``torch.export``
(:mod:`rnnconvert.formats.torch.pt2_write`) writers turn it into their own graphs.

Masks (tf_keras ``engine/base_layer.py`` ``compute_mask``; checked with tf_keras 2.21, see
``tests/test_whole_graph.py``): ``Embedding(mask_zero=True)`` makes ``ids != 0``, ``Masking(v)`` makes
``any(x != v, axis=-1)``; layers in :data:`MASK_PASS` hand their input's mask on; a recurrent layer with
``return_sequences`` hands it on, without it ends it; every other layer ends it (``Conv1D``, pooling,
``Flatten``...: tf_keras 2.21 drops the mask there without an error). The consumers of a mask:
recurrent layers (a masked step keeps the state; a unidirectional layer's output at a masked step is the
previous output, a ``Bidirectional`` one's is zero: tf_keras sets ``zero_output_for_mask`` in
``Bidirectional``) and ``GlobalAveragePooling1D`` (the mean over unmasked steps).

States (:func:`_states`, checked with tf_keras 2.21 in ``tests/formats/test_whole_states.py``): a unidirectional
recurrent layer with ``return_state=True`` has the outputs ``<name>:0`` (its output), ``<name>:1`` (``h``) and,
for an LSTM, ``<name>:2`` (``c``), each state ``(batch, units)`` and unmasked; a call ``layer(x,
initial_state=[h, c])`` is stored by tf_keras as inputs ``[x, h, c]`` and becomes a node of those inputs (the
writers feed them as the initial state). A Bidirectional layer returning or taking states is refused by name.

Layers outside :data:`LAYERS` (custom classes, ``Lambda``, attention...) are refused by name with the way
out (``--recurrent-only``): never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.model import Checkpoint, RNNLayer
from ..errors import UnsupportedError

#: the recurrent classes (CuDNN ones are read by the canonical reader with their fixed activations)
RECURRENT = ("LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU")
#: identity at inference (tf_keras: noise and dropout only in training; an activity penalty)
IDENTITY = ("Dropout", "SpatialDropout1D", "GaussianNoise", "GaussianDropout", "AlphaDropout",
            "ActivityRegularization")
MERGE = ("Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")
#: every class the whole-model writers build
LAYERS = set(RECURRENT) | set(IDENTITY) | set(MERGE) | {
    "InputLayer", "Embedding", "Masking", "Dense", "Activation", "Conv1D", "MaxPooling1D", "AveragePooling1D",
    "GlobalMaxPooling1D", "GlobalAveragePooling1D", "Flatten", "Reshape", "Permute", "RepeatVector",
    "BatchNormalization", "LayerNormalization", "TimeDistributed", "Bidirectional", "ReLU", "LeakyReLU", "ELU",
    "Softmax", "ZeroPadding1D", "Cropping1D"}
#: layers whose output carries their input's mask (tf_keras 2.21, checked in tests/test_whole_graph.py)
MASK_PASS = set(IDENTITY) | {"Dense", "Activation", "BatchNormalization", "LayerNormalization", "TimeDistributed",
                             "ReLU", "LeakyReLU", "ELU", "Softmax", "Masking"}
#: Keras 2 activations the writers build (tf_keras ``activations.py``: hard_sigmoid = clip(0.2 x + 0.5, 0, 1))
ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh", "softmax", "softplus", "softsign", "elu", "selu",
               "exponential", "hard_sigmoid")
#: how every whole-model refusal ends
WAY_OUT = "write option recurrent_only=True (CLI --recurrent-only) converts the recurrent layers alone"


@dataclass
class Node:
    """One layer call.

    Attributes:
        name: unique per call (the layer path; ``path#k`` for the k-th further call of a shared layer).
        path: the layer's dotted path (nested models joined with ``.``).
        cls: the Keras class (``TimeDistributed``: ``inner`` holds the wrapped layer's class and config).
        config: the layer's config as stored.
        inputs: tensor names (a recurrent layer's ``initial_state`` tensors after its input); ``masks``: the mask
            tensor name of each input (``None``: unmasked).
        outputs: tensor names (one; a recurrent layer with ``return_state`` adds its states ``h`` (and ``c``));
            ``mask_out``: the mask its (first) output carries, or ``None``.
        weights: the stored weights in ``@weight_names`` order (recurrent layers: ``[]``, see ``layer``).
        layer: the canonical recurrent layer (``LSTM``/``GRU``/``SimpleRNN``/``Bidirectional``/CuDNN).
    """

    name: str
    path: str
    cls: str
    config: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    masks: list[str | None] = field(default_factory=list)
    mask_out: str | None = None
    weights: list[np.ndarray] = field(default_factory=list)
    layer: RNNLayer | None = None
    inner: tuple[str, dict] | None = None
    #: the rank of the first input (batch included), ``None`` when not known
    rank: int | None = None


@dataclass
class Graph:
    """``inputs``: ``[(tensor name, shape without batch (None: free), dtype str, feeds an Embedding of
    input_dim or None)]``; ``nodes`` in evaluation order; ``outputs``: tensor names; ``masks``: mask tensor
    name -> how it is made, ``("ids", tensor)`` (``tensor != 0``) or ``("value", tensor, v)``."""

    name: str
    inputs: list[tuple[str, tuple, str, int | None]]
    nodes: list[Node]
    outputs: list[str]
    masks: dict[str, tuple] = field(default_factory=dict)


def refuse(path: str, cls: str, why: str) -> None:
    """Raise the one-line whole-model refusal naming the layer, its class and the way out."""
    head = f"layer '{path}' ({cls}) cannot be written as a whole model: {why}; "
    raise UnsupportedError(head + WAY_OUT, cli=head + "--recurrent-only converts the recurrent layers alone")


def _records(cfg: dict) -> list[dict]:
    inner = cfg.get("config")
    layers = inner if isinstance(inner, list) else (inner or {}).get("layers") if isinstance(inner, dict) else None
    if not isinstance(layers, list) or not all(isinstance(r, dict) for r in layers):
        raise UnsupportedError("model_config is not a Sequential/Functional model with a list of layers")
    return layers


def _check_act(path: str, cls: str, conf: dict) -> None:
    for key in ("activation", "recurrent_activation"):
        a = conf.get(key)
        if a is not None and (not isinstance(a, str) or a not in ACTIVATIONS):
            refuse(path, cls, f"{key}={a!r} is not a Keras built-in activation the writers build")


class _Builder:
    def __init__(self, weights: dict, ckpt: Checkpoint):
        self.weights, self.ckpt = weights, ckpt
        self.nodes: list[Node] = []
        self.masks: dict[str, tuple] = {}
        self.mask_of: dict[str, str | None] = {}
        self.calls: dict[str, int] = {}
        self.inputs: list[tuple[str, tuple, str, int | None]] = []
        self.rank: dict[str, int | None] = {}
        #: a layer call's first output -> its further outputs (return_state)
        self.more: dict[str, list[str]] = {}

    # weights of layer at dotted path (top-level group, then inner names: _source_weights of keras_whole)
    def stored(self, path: str) -> list[np.ndarray]:
        parts = path.split(".")
        ws = self.weights.get(parts[0], [])
        for name in parts[1:]:
            ws = [(wn.split("/", 1)[1], a) for wn, a in ws if wn.split("/", 1)[0] == name and "/" in wn]
        return [np.asarray(a) for _, a in ws]

    def add_input(self, name: str, shape, dtype) -> str:
        shp = tuple(None if d is None else int(d) for d in (shape or [None])[1:])
        self.inputs.append((name, shp, str(dtype or "float32"), None))
        self.mask_of[name] = None
        self.rank[name] = 1 + len(shp)
        return name

    def call(self, rec: dict, prefix: str, ins: list[str]) -> str:
        cls = rec.get("class_name")
        conf = rec.get("config") if isinstance(rec.get("config"), dict) else {}
        name = conf.get("name")
        if not isinstance(cls, str) or not isinstance(name, str):
            raise UnsupportedError(f"a layer record under '{prefix or 'the model'}' has no class name or name")
        path = prefix + name
        if cls in ("Sequential", "Functional", "Model"):
            return self.model(rec, path + ".", ins)
        if cls not in LAYERS:
            refuse(path, cls, "not a built-in layer the whole-model writers build (custom classes and Lambda "
                   "layers are never deserialized)")
        k = self.calls.get(path, 0)
        self.calls[path] = k + 1
        uid = path if k == 0 else f"{path}#{k}"
        masks = [self.mask_of.get(i) for i in ins]
        node = Node(uid, path, cls, conf, list(ins), [uid + ":0"], masks)
        _check_act(path, cls, conf)
        if conf.get("stateful") or conf.get("time_major") or conf.get("data_format") not in (None, "channels_last"):
            refuse(path, cls, "stateful / time_major / channels_first layers are not built")
        _states(node, ins)
        if cls in RECURRENT or cls == "Bidirectional":
            try:
                node.layer = self.ckpt.layer(path)
            except KeyError:
                raise UnsupportedError(f"layer '{path}' ({cls}): the reader found no recurrent layer of that "
                                       "name") from None
            if node.layer.num_layers != 1 or node.layer.proj_size:
                refuse(path, cls, "a stacked or projected recurrent layer")
            if cls == "Bidirectional" and conf.get("backward_layer") is not None:
                refuse(path, cls, "a Bidirectional with its own backward_layer config")
        else:
            node.weights = self.stored(path)
        if cls == "TimeDistributed":
            inner = conf.get("layer") or {}
            icls, iconf = inner.get("class_name"), inner.get("config") or {}
            if icls not in ("Dense", "Activation") + IDENTITY:
                refuse(path, cls, f"TimeDistributed({icls}) is not built (Dense, Activation, Dropout are)")
            _check_act(path, str(icls), iconf)
            node.inner = (icls, iconf)
        if cls in MERGE:
            got = {m for m in masks if m is not None}
            if len(got) > 1:
                refuse(path, cls, "it merges inputs with different masks")
            node.mask_out = next(iter(got), None)
        elif cls == "Embedding" and conf.get("mask_zero"):
            node.mask_out = uid + ":mask"
            self.masks[node.mask_out] = ("ids", ins[0])
        elif cls == "Masking":
            node.mask_out = uid + ":mask"
            self.masks[node.mask_out] = ("value", ins[0], float(conf.get("mask_value", 0.0)))
        elif cls in MASK_PASS or ((cls in RECURRENT or cls == "Bidirectional") and conf.get(
                "return_sequences", (conf.get("layer") or {}).get("config", {}).get("return_sequences"))):
            node.mask_out = masks[0] if masks else None
        self.mask_of[node.outputs[0]] = node.mask_out
        node.rank = self.rank.get(ins[0]) if ins else None
        self.rank[node.outputs[0]] = _rank_out(node)
        for extra in node.outputs[1:]:  # return_state: the states (batch, units), unmasked
            self.mask_of[extra], self.rank[extra] = None, 2
            self.more[node.outputs[0]] = node.outputs[1:]
        if cls in ("BatchNormalization", "LayerNormalization"):
            axis = conf.get("axis", -1)
            axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
            if not isinstance(axis, int) or node.rank is None or axis % node.rank != node.rank - 1:
                refuse(path, cls, f"axis={conf.get('axis')!r} is not the last axis (the last axis is built)")
            node.config = {**conf, "axis": -1}
        self.nodes.append(node)
        return node.outputs[0]

    def model(self, rec: dict, prefix: str, ins: list[str] | None) -> str | list[str]:
        cls = rec.get("class_name")
        recs = _records(rec)
        if cls == "Sequential":
            cur = ins[0] if ins else None
            for r in recs:
                rc = r.get("config") if isinstance(r.get("config"), dict) else {}
                if r.get("class_name") == "InputLayer":
                    if cur is None:
                        cur = self.add_input(rc.get("name", "input"), rc.get("batch_input_shape")
                                             or rc.get("batch_shape"), rc.get("dtype"))
                    continue
                if cur is None:
                    shape = rc.get("batch_input_shape")
                    if shape is None:
                        raise UnsupportedError("the Sequential model's first layer has no batch_input_shape: "
                                               "its input is unknown")
                    cur = self.add_input(f"{rc.get('name', 'input')}_input", shape, rc.get("dtype"))
                cur = self.call(r, prefix, [cur])
            return cur
        conf = rec.get("config") or {}
        produced: dict[tuple, str] = {}
        nested = {r["config"]["name"] for r in recs if r.get("class_name") in ("Sequential", "Functional", "Model")
                  and isinstance(r.get("config"), dict)}
        shift = {n: 1 for n in nested}  # tf_keras: a nested model's node 0 is its own; calls count from 1
        outer_in = list(ins or [])
        for pos, spec in enumerate(conf.get("input_layers") or []):
            r = next((x for x in recs if (x.get("config") or {}).get("name") == spec[0]), None)
            if r is None:
                raise UnsupportedError(f"input layer '{spec[0]}' is not among the layers")
            rc = r.get("config") or {}
            if ins is not None:
                produced[(spec[0], 0, 0)] = outer_in[pos]
            else:
                produced[(spec[0], 0, 0)] = self.add_input(
                    rc.get("name"), rc.get("batch_input_shape") or rc.get("batch_shape"), rc.get("dtype"))
        pending = [r for r in recs if r.get("class_name") != "InputLayer"]
        while pending:
            progress = False
            for r in list(pending):
                nodes = r.get("inbound_nodes") or []
                lname = r["config"]["name"]
                done = sum(1 for key in produced if key[0] == lname)
                if done >= len(nodes):
                    pending.remove(r)
                    progress = True
                    continue
                node = nodes[done]
                if isinstance(node, dict):
                    refuse(prefix + lname, r.get("class_name"), "inbound nodes in a form this reader does not know")
                keys = [(i[0], int(i[1]), int(i[2] if len(i) > 2 else 0)) for i in node]
                if any(isinstance(i[3] if len(i) > 3 else {}, dict) and (i[3] if len(i) > 3 else {}) for i in node):
                    refuse(prefix + lname, r.get("class_name"), "it is called with keyword arguments "
                           "(e.g. initial_state, mask)")
                if not all(k in produced for k in keys):
                    continue
                out = self.call(r, prefix, [produced[k] for k in keys])
                produced[(lname, done + shift.get(lname, 0), 0)] = out if isinstance(out, str) else out[0]
                for t, more in enumerate(self.more.get(out, []) if isinstance(out, str) else [], 1):
                    produced[(lname, done + shift.get(lname, 0), t)] = more
                if shift.get(lname) and done == 0:
                    produced[(lname, 0, 0)] = produced[(lname, 1, 0)]  # counted as done
                progress = True
            if not progress:
                raise UnsupportedError("model_config: layers whose inputs are never computed (a cycle or a "
                                       "missing layer)")
        outs = []
        for spec in conf.get("output_layers") or []:
            key = (spec[0], int(spec[1]), int(spec[2] if len(spec) > 2 else 0))
            if key not in produced:
                raise UnsupportedError(f"model output {spec!r} is never computed")
            outs.append(produced[key])
        return outs if ins is None else (outs[0] if len(outs) == 1 else outs)


#: the states of each recurrent class, in Keras' order (``return_state`` outputs after the output, the tensors of
#: ``initial_state``): tf_keras ``layers/rnn/lstm.py`` ``[h, c]``, GRU and SimpleRNN ``[h]``
STATES = {"LSTM": ("h", "c"), "CuDNNLSTM": ("h", "c"), "GRU": ("h",), "CuDNNGRU": ("h",), "SimpleRNN": ("h",)}


def _states(node: Node, ins: list[str]) -> None:
    """``return_state`` and ``initial_state`` of a recurrent layer call (issue #30). tf_keras stores a call
    ``layer(x, initial_state=[h, c])`` as a node of inputs ``[x, h, c]`` (``layers/rnn/base_rnn.py``
    ``__call__`` adds the state tensors to the inputs); ``return_state=True`` makes the outputs
    ``[output, h, c]`` (LSTM) or ``[output, h]`` (GRU, SimpleRNN), each state ``(batch, units)``. Both are
    built for a unidirectional layer; ``node.outputs`` gets ``<name>:1``... for the states. Refused by name: a
    Bidirectional layer returning or taking states, a layer called with other extra inputs (``constants``)."""
    cls, conf = node.cls, node.config
    inner = (conf.get("layer") or {}).get("config") or {} if cls == "Bidirectional" else conf
    if cls == "Bidirectional":
        if inner.get("return_state") or conf.get("return_state") or len(ins) > 1:
            refuse(node.path, cls, "a Bidirectional layer returning or taking states (return_state / "
                   "initial_state) is not built")
        return
    if cls not in STATES:
        if conf.get("return_state"):
            refuse(node.path, cls, "return_state outside a recurrent layer")
        return
    if len(ins) > 1 and len(ins) != 1 + len(STATES[cls]):
        refuse(node.path, cls, f"called with {len(ins) - 1} extra input(s); initial_state takes "
               f"{len(STATES[cls])} ({', '.join(STATES[cls])}), other extra inputs (constants) are not built")
    if conf.get("return_state"):
        node.outputs += [f"{node.name}:{i}" for i in range(1, 1 + len(STATES[cls]))]


def _rank_out(node: Node) -> int | None:
    """The rank of a layer call's output (batch included) from its input's (tf_keras shape rules)."""
    r, cls, conf = node.rank, node.cls, node.config
    if cls == "Embedding":
        return None if r is None else r + 1
    if cls in RECURRENT or cls == "Bidirectional":
        inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
        return 3 if inner.get("return_sequences") else 2
    if cls in ("Flatten", "GlobalMaxPooling1D", "GlobalAveragePooling1D"):
        return 2
    if cls == "Reshape":
        return 1 + len(conf.get("target_shape") or [])
    if cls == "RepeatVector":
        return 3
    return r


def build(model_config: dict, weights: dict[str, list[tuple[str, np.ndarray]]], ckpt: Checkpoint) -> Graph:
    """The :class:`Graph` of a Keras 1/2 full model (module docstring).

    Raises:
        UnsupportedError: a layer outside :data:`LAYERS` or a feature the writers do not build (one line naming
            the layer path, its class and the way out), or a config that is not a model.
    """
    if not isinstance(model_config, dict) or model_config.get("class_name") not in ("Sequential", "Functional",
                                                                                       "Model"):
        raise UnsupportedError("model_config is not a Sequential or Functional model")
    b = _Builder(weights, ckpt)
    try:
        out = b.model(model_config, "", None)
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise UnsupportedError(f"malformed model_config ({type(exc).__name__}: {str(exc)[:160]})") from exc
    outs = [out] if isinstance(out, str) else list(out)
    name = (model_config.get("config") or {}).get("name") if isinstance(model_config.get("config"), dict) else None
    g = Graph(str(name or "model"), b.inputs, b.nodes, outs, b.masks)
    feeds = {n.inputs[0]: n for n in g.nodes if n.cls == "Embedding"}
    g.inputs = [(nm, shp, dt, int(feeds[nm].config["input_dim"]) if nm in feeds else None)
                for nm, shp, dt, _ in g.inputs]
    return g
