"""A Keras 1/2 full model as a flat graph of whitelisted layer calls (issue #30), for the whole-model writers.

Input: the model's ``model_config`` (parsed JSON, as a Keras 1/2 / tf.keras / tf_keras full-model HDF5 file
stores it: tf_keras ``saving/legacy/hdf5_format.py``), every layer's stored weights in ``@weight_names``
order (``{top-level layer: [(weight name, array)]}``), and the canonical checkpoint read from the same file
(the recurrent layers, by dotted path: ``outer.inner`` for nested models). Output: :class:`Graph`, the
layer calls in an order where every input is computed first, tensors named by strings, nested
Sequential/Functional models flattened, shared layers called once per use. No framework is imported;
the ONNX (:mod:`rnnconvert.whole.formats.onnx.model_write`) and ``torch.export``
(:mod:`rnnconvert.whole.formats.torch.pt2_write`) writers turn it into their own graphs.

Masks (tf_keras ``engine/base_layer.py`` ``compute_mask``; checked with tf_keras 2.21, see
``tests/test_whole_graph.py``): ``Embedding(mask_zero=True)`` makes ``ids != 0``, ``Masking(v)`` makes
``any(x != v, axis=-1)``; layers in :data:`MASK_PASS` hand their input's mask on; a recurrent layer with
``return_sequences`` hands it on, without it ends it; every other layer ends it (``Conv1D``, pooling,
``Flatten``...: tf_keras 2.21 drops the mask there without an error). The consumers of a mask:
recurrent layers (a masked step keeps the state; a unidirectional layer's output at a masked step is the
previous output, a ``Bidirectional`` one's is zero: tf_keras sets ``zero_output_for_mask`` in
``Bidirectional``) and ``GlobalAveragePooling1D`` (the mean over unmasked steps).

States (:func:`_states`, checked with tf_keras 2.21 in ``tests/formats/whole_models/test_whole_states.py``): a unidirectional
recurrent layer with ``return_state=True`` has the outputs ``<name>:0`` (its output), ``<name>:1`` (``h``) and,
for an LSTM, ``<name>:2`` (``c``), each state ``(batch, units)`` and unmasked; a call ``layer(x,
initial_state=[h, c])`` is stored by tf_keras as inputs ``[x, h, c]`` and becomes a node of those inputs (the
writers feed them as the initial state). A Bidirectional layer returning or taking states is refused by name.

Attention layers (``Attention`` / ``AdditiveAttention``, issue #41: :func:`_attention`) read the query's and the
value's masks and hand on the query's; their call keywords ``use_causal_mask`` / ``return_attention_scores`` are
read from the stored call (:func:`attention_call`). ``MultiHeadAttention`` (:func:`_mha`) reads the query's, the
value's and the key's masks and hands on the query's; its ``value`` / ``key`` tensors and call keywords come from
the stored call (:func:`mha_call`). Layers outside :data:`LAYERS` (custom classes, ``Lambda``,
``GroupNormalization``...) are refused by name with the way out (``--recurrent-only``): never dropped.

Keras 3 ``.keras`` configs (:func:`build_keras3`, chosen by :func:`build` for a ``keras3`` checkpoint) give the
same :class:`Graph`: their records are normalised by :func:`keras3_record` and their masks are explicit (the
``NotEqual``/``Any`` op layers and each call's ``mask=`` keyword), checked against Keras 3.15's outputs in
``tests/formats/whole_models/test_whole_keras3.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.model import Checkpoint, RNNLayer
from ...errors import UnsupportedError, WholeModelError

from ...conventions.full_model import (  # noqa: F401 - the whitelist and FullModel, read here as keras_graph.*
    ACTIVATIONS, ATTENTION, IDENTITY, LAYERS, MASK_PASS, MERGE, MHA, RECURRENT, SMALL, WAY_OUT, FullModel)


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
    raise WholeModelError(head + WAY_OUT, cli=head + "--recurrent-only converts the recurrent layers alone",
                          layer=path, layer_class=cls, reason=head[:-2])


def streamed(graph: "Graph", what: str) -> list:
    """The recurrent layer calls (graph nodes) whose states a writer's option ``states`` carries from one chunk to
    the next: every unidirectional one that does not take its initial state from the model (one input). ``what``:
    the written thing in the refusal's words (``'graph'``, ``'model'``).

    Raises:
        UnsupportedError: a Bidirectional or go_backwards layer (its run starts at the sequence's end: a chunk
            cannot hand its state to the next), naming it."""
    out = []
    for n in graph.nodes:
        if n.layer is None:
            continue
        if n.layer.bidirectional or n.layer.semantics.go_backwards:
            refuse(n.path, n.cls, "states=True carries states from one chunk to the next, and a "
                   f"Bidirectional or go_backwards layer runs from the sequence's end (write the {what} "
                   "without states)")
        if len(n.inputs) == 1:
            out.append(n)
    return out


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
        if cls in ATTENTION:
            _attention(node, ins)
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
        if cls in MHA:
            _mha(node, ins, self.rank.get(ins[0]), keras3=isinstance(self, _Keras3Builder))
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
        if cls in ATTENTION and len(node.outputs) > 1:  # the attention scores (batch, Tq, Tv)
            self.rank[node.outputs[1]] = node.rank
        if cls in MHA and len(node.outputs) > 1:  # the attention scores (batch, heads, Tq, Tv)
            self.rank[node.outputs[1]] = 4
        if cls in SMALL:
            _small(node)
            self.rank[node.outputs[0]] = _rank_out(node)
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
                kw = {k: v for i in node if len(i) > 3 and isinstance(i[3], dict) for k, v in i[3].items()}
                if kw and r.get("class_name") in ATTENTION:  # tf_keras repeats a call's keywords on each input
                    r = attention_call(r, prefix + lname, kw)
                elif r.get("class_name") in MHA:  # value= / key= tensors among the call keywords
                    r, more = mha_call(r, prefix + lname, kw, _k2_tensor)
                    keys += more
                elif any(isinstance(i[3] if len(i) > 3 else {}, dict) and (i[3] if len(i) > 3 else {}) for i in node):
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


#: the call keywords of an attention layer the writers follow (tf_keras / keras 3 ``Attention.call``); ``training``
#: is inference here whatever it says (dropout on the attention weights is training only)
ATTENTION_CALL = ("use_causal_mask", "return_attention_scores", "training")


def attention_call(rec: dict, path: str, kwargs: dict) -> dict:
    """``rec`` (an ``Attention`` / ``AdditiveAttention`` record) with its call keywords folded into its config as
    ``call_causal`` / ``call_scores`` (read by :func:`_attention`).

    Raises:
        WholeModelError: a keyword other than :data:`ATTENTION_CALL`, or one that is not a bool (an explicit
            ``mask=`` tensor list, ``training`` as a tensor...), by layer name with the way out."""
    cls = str(rec.get("class_name"))
    extra = sorted(set(kwargs) - set(ATTENTION_CALL))
    if extra:
        refuse(path, cls, f"it is called with keyword arguments {extra} (use_causal_mask and "
               "return_attention_scores are built)")
    for k, v in kwargs.items():
        if v is not None and not isinstance(v, bool):
            refuse(path, cls, f"call keyword {k} is not a plain true/false")
    conf = dict(rec.get("config") or {})
    conf["call_causal"] = bool(kwargs.get("use_causal_mask"))
    conf["call_scores"] = bool(kwargs.get("return_attention_scores"))
    return {**rec, "config": conf}


def _attention(node: Node, ins: list[str]) -> None:
    """An ``Attention`` / ``AdditiveAttention`` call (tf_keras 2.21 ``layers/attention/base_dense_attention.py``,
    keras 3.15 ``layers/attention/attention.py``): inputs ``[query, value]`` or ``[query, value, key]``; masks: the
    query's and the value's (``node.masks[0]``, ``[1]``; the key's is not read); its output carries the query's
    mask (``compute_mask``). ``node.config`` gets ``causal`` (the Keras 2 config key, or the call's
    ``use_causal_mask``) and ``scores`` (``return_attention_scores``: ``node.outputs`` gets ``<name>:1``, the
    softmax weights ``(batch, Tq, Tv)``). Refused by name: another input count, an unknown ``score_mode``."""
    conf = node.config
    if len(ins) not in (2, 3):
        refuse(node.path, node.cls, f"called on {len(ins)} inputs ([query, value] or [query, value, key] are built)")
    mode = conf.get("score_mode", "dot") if node.cls == "Attention" else "additive"
    if mode not in ("dot", "concat", "additive"):
        refuse(node.path, node.cls, f"score_mode={mode!r}")
    scores = bool(conf.get("call_scores"))
    node.config = {**conf, "causal": bool(conf.get("causal") or conf.get("call_causal")), "scores": scores,
                   "mode": mode}
    if scores:
        node.outputs.append(f"{node.name}:1")


def attention_weights(node: Node) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(scale, concat_score_weight)`` of an attention call (each ``None`` where the layer has none), float32, in
    the order tf_keras / keras 3 ``build`` creates them: ``Attention``: ``scale`` ``()`` when ``use_scale``, then
    ``concat_score_weight`` ``()`` when ``score_mode='concat'``; ``AdditiveAttention``: ``scale`` ``(dim,)`` when
    ``use_scale`` (default True).

    Raises:
        UnsupportedError: stored weights of another count or shape than the config says (layer named)."""
    conf, ws = node.config, [np.asarray(w, np.float32) for w in node.weights]
    additive = node.cls == "AdditiveAttention"
    want = ["scale"] * bool(conf.get("use_scale", additive)) + ["concat"] * (conf.get("mode") == "concat")
    if len(ws) != len(want) or any(w.ndim != (1 if additive else 0) for w in ws):
        raise UnsupportedError(f"layer '{node.path}' ({node.cls}): {len(ws)} stored weight(s) of shapes "
                               f"{[w.shape for w in ws]}, where its config makes {want or 'none'}")
    got = dict(zip(want, ws))
    return got.get("scale"), got.get("concat")


#: the call keywords of a ``MultiHeadAttention`` call the writers follow (tf_keras 2.21 / keras 3.15
#: ``MultiHeadAttention.call``): the ``value`` / ``key`` tensors, ``use_causal_mask``, ``return_attention_scores``;
#: ``training`` is inference here whatever it says; Keras 3 writes its masks' keywords as null
MHA_CALL = ("value", "key", "use_causal_mask", "return_attention_scores", "training", "query_mask", "value_mask",
            "key_mask")


def _k2_tensor(obj: Any) -> tuple[str, int, int] | None:
    """``(layer, node index, tensor index)`` of a tf_keras call keyword's tensor (``["layer", node, index]``)."""
    if isinstance(obj, list) and len(obj) in (3, 4) and isinstance(obj[0], str):
        return obj[0], int(obj[1]), int(obj[2])
    return None


def mha_call(rec: dict, path: str, kwargs: dict, tensor) -> tuple[dict, list[tuple[str, int, int]]]:
    """A ``MultiHeadAttention`` record with its call keywords folded into its config (``call_causal`` /
    ``call_scores``, read by :func:`_mha`) and the keys of its ``value`` (tf_keras passes it by keyword) and
    ``key`` tensors, in that order (``tensor``: the reader's tensor reference parser).

    Raises:
        WholeModelError: a keyword other than :data:`MHA_CALL` (``attention_mask``...), a mask keyword that is
            not null, a flag that is not a plain true/false, by layer name with the way out."""
    cls = str(rec.get("class_name"))
    if not isinstance(kwargs, dict):
        refuse(path, cls, "call keywords in a form this reader does not know")
    extra = sorted(str(k) for k in set(kwargs) - set(MHA_CALL))
    if extra:
        refuse(path, cls, f"it is called with keyword arguments {extra} (value, key, use_causal_mask and "
               "return_attention_scores are built)")
    more = []
    for k in ("value", "key"):
        if kwargs.get(k) is not None:
            t = tensor(kwargs[k])
            if t is None:
                refuse(path, cls, f"call keyword {k} is not a tensor reference")
            more.append(t)
    for k in ("query_mask", "value_mask", "key_mask"):
        if kwargs.get(k) is not None:
            refuse(path, cls, f"it is called with an explicit {k}")
    for k in ("use_causal_mask", "return_attention_scores", "training"):
        if kwargs.get(k) is not None and not isinstance(kwargs[k], bool):
            refuse(path, cls, f"call keyword {k} is not a plain true/false")
    conf = dict(rec.get("config") or {})
    conf["call_causal"] = bool(kwargs.get("use_causal_mask"))
    conf["call_scores"] = bool(kwargs.get("return_attention_scores"))
    return {**rec, "config": conf}, more


def _mha(node: Node, ins: list[str], rank: int | None, keras3: bool) -> None:
    """A ``MultiHeadAttention`` call (tf_keras 2.21 / keras 3.15 ``layers/attention/multi_head_attention.py``) on
    ``[query, value]`` or ``[query, value, key]``, each ``(batch, time, features)``: masks ``node.masks`` of the
    query, the value and the key (the value's when no key); its output carries the query's mask. ``node.config``
    gets ``causal``, ``scores`` (``node.outputs`` gets ``<name>:1``, the softmax weights
    ``(batch, heads, Tq, Tv)``) and ``masked``, how the framework hides a step before the softmax:

    * ``'add'``: tf_keras' ``Softmax`` (``softmax_robust_masking=False``): ``s + (1 - m) * -1e9`` in float32;
    * ``'fill'``: tf_keras with ``softmax_robust_masking=True``, and Keras 3's ``ops.dot_product_attention`` (the
      path it takes without scores and dropout): the hidden score replaced by a large negative number (-1e9 and
      -0.7 * 3.38953e38: the same softmax, a row with every step hidden uniform);
    * ``'zero'``: Keras 3 returning the scores or with dropout (its own ``Softmax``): ``'fill'``, then hidden
      weights 0.

    ``node.weights`` becomes ``[Wq (Dq, H, K), bq (H, K), Wk (Dk, H, K), bk, Wv (Dv, H, V), bv (H, V),
    Wo (H, V, O), bo (O,)]`` (zero biases without ``use_bias``; :func:`mha_weights` checks them).

    Raises:
        WholeModelError: inputs not of rank 3 or of another count, ``attention_axes`` other than the time axis,
            ``use_gate``, ``sliding_window``, an ``output_shape`` of several axes, by layer name."""
    conf = node.config
    if len(ins) not in (2, 3):
        refuse(node.path, node.cls, f"called on {len(ins)} inputs ([query, value] or [query, value, key] are "
               "built)")
    if rank is not None and rank != 3:
        refuse(node.path, node.cls, f"a query of rank {rank} ((batch, time, features) is built)")
    axes = conf.get("attention_axes")
    if axes not in (None, 1, [1], -2, [-2]):
        refuse(node.path, node.cls, f"attention_axes={axes!r} (the default, the time axis, is built)")
    if conf.get("use_gate") or conf.get("sliding_window") is not None:
        refuse(node.path, node.cls, "use_gate / sliding_window are not built")
    shape = conf.get("output_shape")
    if isinstance(shape, list) and len(shape) == 1:
        shape = shape[0]
    if shape is not None and (not isinstance(shape, int) or isinstance(shape, bool)):
        refuse(node.path, node.cls, f"output_shape={conf.get('output_shape')!r} (one size is built)")
    scores = bool(conf.get("call_scores"))
    if keras3:
        masked = "zero" if scores or float(conf.get("dropout") or 0.0) > 0.0 else "fill"
    else:
        masked = "fill" if conf.get("softmax_robust_masking") else "add"
    node.config = {**conf, "causal": bool(conf.get("call_causal")), "scores": scores, "masked": masked,
                   "output_shape": shape}
    node.weights = mha_weights(node)
    if scores:
        node.outputs.append(f"{node.name}:1")


def mha_weights(node: Node) -> list[np.ndarray]:
    """The weights of a ``MultiHeadAttention`` call as :func:`_mha` orders them, float32, from the stored ones in
    the order tf_keras / keras 3 create them (query, key, value, output ``EinsumDense``: kernel then bias each;
    biases only with ``use_bias``), checked against ``num_heads``, ``key_dim``, ``value_dim``, ``output_shape``
    and each other.

    Raises:
        UnsupportedError: stored weights of another count or shape than the config says (layer named)."""
    conf = node.config
    ws = [np.asarray(w, np.float32) for w in node.weights]
    bias = bool(conf.get("use_bias", True))
    h, kd = conf.get("num_heads"), conf.get("key_dim")
    vd = conf.get("value_dim") or kd
    out = conf.get("output_shape")

    def bad():
        raise UnsupportedError(f"layer '{node.path}' ({node.cls}): {len(ws)} stored weight(s) of shapes "
                               f"{[w.shape for w in ws]}, unlike num_heads={h}, key_dim={kd}, value_dim={vd}, "
                               f"use_bias={bias}")

    if len(ws) != (8 if bias else 4):
        bad()
    if not bias:  # zero biases shaped by the stored kernels (never by the config's sizes alone)
        wq, wk, wv, wo = ws
        if any(w.ndim != 3 for w in ws):
            bad()
        bq, bk, bv = (np.zeros(w.shape[1:], np.float32) for w in (wq, wk, wv))
        bo = np.zeros(wo.shape[-1:], np.float32)
    else:
        wq, bq, wk, bk, wv, bv, wo, bo = ws
    o = wo.shape[-1] if wo.ndim == 3 else -1
    want = [(wq, (None, h, kd)), (bq, (h, kd)), (wk, (None, h, kd)), (bk, (h, kd)), (wv, (None, h, vd)),
            (bv, (h, vd)), (wo, (h, vd, out if out is not None else o)), (bo, (o,))]
    for w, shp in want:
        if w.ndim != len(shp) or any(s is not None and d != s for d, s in zip(w.shape, shp)):
            bad()
    if out is None and wq.shape[0] != o:
        bad()
    return [wq, bq, wk, bk, wv, bv, wo, bo]


def _small(node: Node) -> None:
    """The settings of a :data:`SMALL` layer call, checked and normalised in ``node.config`` (tf_keras 2.21 /
    keras 3.15 ``call``): ``PReLU``: one weight ``alpha`` of the input's shape without the batch, 1 on the
    ``shared_axes`` (``relu(x) - alpha * relu(-x)``); ``Rescaling``: ``scale`` / ``offset`` numbers or last-axis
    lists, as float32 arrays (``x * scale + offset``); ``UnitNormalization``: ``axis`` the last one
    (``x / sqrt(max(sum(x^2), 1e-12))``); ``UpSampling1D``: ``size`` ``>= 1`` on a sequence (each step repeated).

    Raises:
        WholeModelError: another axis, rank or size; UnsupportedError: a PReLU weight unlike its input."""
    conf, cls, r = node.config, node.cls, node.rank
    if cls == "PReLU":
        ws = [np.asarray(w, np.float32) for w in node.weights]
        if len(ws) != 1 or (r is not None and ws[0].ndim != r - 1):
            raise UnsupportedError(f"layer '{node.path}' ({cls}): {len(ws)} stored weight(s) of shapes "
                                   f"{[w.shape for w in ws]}, where its input makes one alpha of rank {r and r - 1}")
        node.weights = ws
    elif cls == "Rescaling":
        sc, off = np.asarray(conf.get("scale", 1.0), np.float32), np.asarray(conf.get("offset", 0.0), np.float32)
        if sc.ndim > 1 or off.ndim > 1:
            refuse(node.path, cls, "scale / offset of more than one axis")
        node.config = {**conf, "scale": sc, "offset": off}
    elif cls == "UnitNormalization":
        axis = conf.get("axis", -1)
        axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
        if not isinstance(axis, int) or r is None or axis % r != r - 1:
            refuse(node.path, cls, f"axis={conf.get('axis')!r} is not the last axis (the last axis is built)")
    elif cls == "EinsumDense":
        _einsum(node)
    elif cls == "UpSampling1D":
        size = conf.get("size", 2)
        size = size[0] if isinstance(size, list) and len(size) == 1 else size
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1 << 16 or r != 3:
            refuse(node.path, cls, f"size={conf.get('size')!r} on an input of rank {r} (a size of 1 to 65536 on "
                   "a sequence is built)")
        node.config = {**conf, "size": size}


def _einsum(node: Node) -> None:
    """An ``EinsumDense`` call (tf_keras 2.21 / keras 3.15 ``einsum_dense.py``: ``einsum(equation, x, kernel)``
    plus ``bias`` (stored in the shape that broadcasts against the output from its first bias axis on), then
    ``activation``), its equation checked: ``<x>,<kernel>-><out>`` of distinct lowercase letters (at most 8 each;
    no ellipsis), ``<x>`` of the input's rank, the batch letter first in ``<x>`` and ``<out>``, every letter of
    ``<kernel>`` and ``<out>`` in another spec, the kernel of ``<kernel>``'s rank. ``node.config`` gets
    ``spec`` ``(x, kernel, out)``.

    Raises:
        WholeModelError: another equation; UnsupportedError: weights unlike it (layer named)."""
    conf, r = node.config, node.rank
    eq = conf.get("equation")
    m = re.fullmatch(r"([a-z]{1,8}),([a-z]{1,8})->([a-z]{1,8})", eq) if isinstance(eq, str) else None
    if m is None:
        refuse(node.path, node.cls, "an equation other than '<x>,<kernel>-><output>' of lowercase letters")
    xs, ks, os_ = m.groups()
    if (any(len(set(t)) != len(t) for t in (xs, ks, os_)) or xs[0] != os_[0] or xs[0] in ks
            or set(ks) - set(xs) - set(os_) or set(os_) - set(xs) - set(ks) or (r is not None and len(xs) != r)):
        refuse(node.path, node.cls, f"equation {eq!r} (the batch first, each letter once per operand, the input's "
               "rank)")
    ws = [np.asarray(w, np.float32) for w in node.weights]
    if not ws or len(ws) > 2 or ws[0].ndim != len(ks) or (len(ws) == 2) != bool(conf.get("bias_axes")) or (
            len(ws) == 2 and ws[1].ndim > len(os_) - 1):
        raise UnsupportedError(f"layer '{node.path}' ({node.cls}): {len(ws)} stored weight(s) of shapes "
                               f"{[w.shape for w in ws]}, unlike equation {eq!r} / bias_axes "
                               f"{conf.get('bias_axes')!r}")
    node.weights = ws
    node.config = {**conf, "spec": (xs, ks, os_)}


def _rank_out(node: Node) -> int | None:
    """The rank of a layer call's output (batch included) from its input's (tf_keras shape rules)."""
    r, cls, conf = node.rank, node.cls, node.config
    if cls == "Embedding":
        return None if r is None else r + 1
    if cls in RECURRENT or cls == "Bidirectional":
        inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
        return 3 if inner.get("return_sequences") else 2
    if cls in ("Flatten", "GlobalMaxPooling1D", "GlobalAveragePooling1D", "GlobalMaxPooling2D",
               "GlobalAveragePooling2D"):
        return r if conf.get("keepdims") else 2
    if cls == "Reshape":
        return 1 + len(conf.get("target_shape") or [])
    if cls == "RepeatVector":
        return 3
    if cls == "EinsumDense" and "spec" in conf:
        return len(conf["spec"][2])
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
    if ckpt.format == "keras3":  # a Keras 3 .keras archive: its own config form (build_keras3)
        return build_keras3(model_config, weights, ckpt)
    b = _Builder(weights, ckpt)
    try:
        out = b.model(model_config, "", None)
    except CONFIG_ERRORS as exc:
        raise UnsupportedError(f"malformed model_config ({type(exc).__name__}: {str(exc)[:160]})") from exc
    outs = [out] if isinstance(out, str) else list(out)
    name = (model_config.get("config") or {}).get("name") if isinstance(model_config.get("config"), dict) else None
    return _finish(Graph(str(name or "model"), b.inputs, b.nodes, outs, b.masks))


# --------------------------------------------------------------------------------------------
# Keras 3 ``.keras`` configs (issue #30)
# --------------------------------------------------------------------------------------------
#: Keras 3 op layers a functional model records for its masks (keras 3.15 ``src/ops/numpy.py``; made by
#: ``Embedding(mask_zero=True)`` (``NotEqual(ids, 0)``) and ``Masking(v)`` (``Any(NotEqual(x, v), axis=-1)``))
K3_MASK_OPS = ("NotEqual", "Any")
#: layers whose Keras 3 call takes a ``mask`` that the writers follow (recurrent, masked mean) or that it does not
#: change at inference (dropout-like, BatchNormalization's moving statistics, TimeDistributed over Dense)
K3_MASK_TAKERS = set(RECURRENT) | set(IDENTITY) | {"Bidirectional", "GlobalAveragePooling1D", "BatchNormalization",
                                                   "TimeDistributed"}


def _k3_strip(obj: Any) -> Any:
    """A Keras 3 config without its per-object ``shared_object_id`` and ``name`` (for comparing two layers)."""
    if isinstance(obj, dict):
        return {k: _k3_strip(v) for k, v in obj.items() if k not in ("shared_object_id", "name")}
    if isinstance(obj, list):
        return [_k3_strip(v) for v in obj]
    return obj


def keras3_record(rec: dict, path: str, wrapped: bool = False) -> dict:
    """A Keras 3 layer record (``module``/``class_name``/``config``/``registered_name``/``build_config``) in the
    form :class:`_Builder` reads (keras 3.15 ``get_config`` of each layer; checked against Keras 3's outputs in
    ``tests/formats/whole_models/test_whole_keras3.py``): ``hard_sigmoid`` -> ``hard_sigmoid_k3`` (Keras 3 redefined it as
    clip(x/6 + 1/2, 0, 1)), ``LeakyReLU(negative_slope)`` -> ``alpha``, a ``Bidirectional``'s ``backward_layer``
    dropped when it mirrors ``layer`` (Keras 3 always writes it).

    Raises:
        UnsupportedError: Keras 3 features the writers do not build (a non-float32 dtype policy, LoRA or
            quantized layers, RMS layer normalization, a unidirectional ``zero_output_for_mask``, a
            Bidirectional with a backward layer of its own), by layer name with the way out.
    """
    cls = rec.get("class_name")
    conf = dict(rec.get("config")) if isinstance(rec.get("config"), dict) else {}
    name = path + str(conf.get("name", rec.get("name", "?")))
    if cls in ("Sequential", "Functional", "Model"):
        return rec
    dt = conf.get("dtype")
    dname = (dt.get("config") or {}).get("name") if isinstance(dt, dict) else dt
    if dname not in (None, "float32") and cls != "InputLayer":
        refuse(name, str(cls), f"dtype policy {dname!r} (float32 is built)")
    if conf.get("lora_rank") or conf.get("quantization_config") or conf.get("rms_scaling"):
        refuse(name, str(cls), "LoRA, quantized or RMS-scaled layers are not built")
    for key in ("activation", "recurrent_activation"):
        if conf.get(key) == "hard_sigmoid":
            conf[key] = "hard_sigmoid_k3"
    if cls == "LeakyReLU" and "negative_slope" in conf:
        conf["alpha"] = conf.pop("negative_slope")
    if cls in RECURRENT and conf.get("zero_output_for_mask") and not wrapped:  # Bidirectional: zero (as built)
        refuse(name, str(cls), "zero_output_for_mask=True on a unidirectional layer")
    if cls in ("TimeDistributed", "Bidirectional") and isinstance(conf.get("layer"), dict):
        conf["layer"] = keras3_record(conf["layer"], path, wrapped=True)
    if cls == "Bidirectional":
        fw, bw = conf.get("layer") or {}, conf.get("backward_layer")
        if isinstance(bw, dict):
            a = _k3_strip({**fw, "config": {**(fw.get("config") or {}), "go_backwards": None}})
            b = _k3_strip({**bw, "config": {**(bw.get("config") or {}), "go_backwards": None}})
            if a != b:
                refuse(name, str(cls), "a Bidirectional with a backward_layer unlike its forward layer")
            conf.pop("backward_layer")
    return {**rec, "config": conf}


def _k3_tensor(obj: Any) -> tuple[str, int, int] | None:
    """``(layer, node index, tensor index)`` of a Keras 3 ``__keras_tensor__`` reference, else ``None``."""
    if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
        h = (obj.get("config") or {}).get("keras_history")
        if isinstance(h, list) and len(h) == 3:
            return str(h[0]), int(h[1]), int(h[2])
        raise UnsupportedError("a Keras 3 tensor reference without a keras_history [layer, node, index]")
    return None


class _Keras3Builder(_Builder):
    """:class:`_Builder` for Keras 3 configs: records normalised by :func:`keras3_record`; a functional model's
    inbound nodes are ``{'args': [...], 'kwargs': {...}}`` with ``__keras_tensor__`` references, its masks
    explicit: the ``NotEqual``/``Any`` op layers of :data:`K3_MASK_OPS` and each call's ``mask`` keyword (Keras 3
    hands a mask only to the layers whose ``call`` takes one; a Sequential's masks follow the Keras 2 rules,
    as Keras 3 builds it the same way)."""

    def __init__(self, weights: dict, ckpt: Checkpoint):
        super().__init__(weights, ckpt)
        #: tensor -> the mask Keras 3 attaches to it at run time (``_keras_mask``), read by attention layers only
        self.implicit: dict[str, str | None] = {}
        #: (MultiHeadAttention call, an input whose implicit mask its call erases): :func:`_k3_erased`
        self.erased: list[tuple[Node, str]] = []

    def call(self, rec: dict, prefix: str, ins: list[str]) -> str:
        return super().call(keras3_record(rec, prefix), prefix, ins)

    def model(self, rec: dict, prefix: str, ins: list[str] | None) -> str | list[str]:
        if rec.get("class_name") == "Sequential":
            return super().model(rec, prefix, ins)
        recs = _records(rec)
        conf = rec.get("config") or {}
        produced: dict[tuple, str] = {}
        ops: dict[tuple, tuple] = {}  # mask op outputs: ("ne", tensor, value) / ("any", tensor, value)

        def spec_key(spec) -> tuple:
            if isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str):
                return spec[0], int(spec[1]), int(spec[2])
            raise UnsupportedError(f"model input/output {spec!r} is not a [layer, node, index] reference")

        in_specs = conf.get("input_layers") or []
        in_specs = [in_specs] if in_specs and isinstance(in_specs[0], str) else in_specs
        for pos, spec in enumerate(in_specs):
            key = spec_key(spec)
            r = next((x for x in recs if (x.get("config") or {}).get("name") == key[0]), None)
            if r is None:
                raise UnsupportedError(f"input layer '{key[0]}' is not among the layers")
            rc = r.get("config") or {}
            produced[key] = (list(ins)[pos] if ins is not None else
                             self.add_input(rc.get("name"), rc.get("batch_shape") or rc.get("batch_input_shape"),
                                            rc.get("dtype")))
        pending = [r for r in recs if r.get("class_name") != "InputLayer"]
        done: dict[str, int] = {}
        while pending:
            progress = False
            for r in list(pending):
                lname = (r.get("config") or {}).get("name") or r.get("name")
                nodes = r.get("inbound_nodes") or []
                k = done.get(lname, 0)
                if k >= len(nodes):
                    pending.remove(r)
                    progress = True
                    continue
                node = nodes[k]
                if not isinstance(node, dict):
                    refuse(prefix + str(lname), str(r.get("class_name")), "inbound nodes in a form this reader "
                           "does not know (a Keras 3 config names its inputs in 'args')")
                args, kwargs = node.get("args") or [], node.get("kwargs") or {}
                flat = [a for arg in args for a in (arg if isinstance(arg, list) else [arg])]
                keys = [t for t in (_k3_tensor(a) for a in flat) if t is not None]
                if r.get("class_name") in MHA:  # key= among the call keywords; its masks are implicit
                    r, more = mha_call(r, prefix + str(lname), kwargs, _k3_tensor)
                    keys, kwargs = keys + more, {}
                mkey = _k3_tensor(kwargs.get("mask"))
                if not all(t in produced or t in ops for t in keys + ([mkey] if mkey else [])):
                    continue
                out_key = (lname, k, 0)
                done[lname] = k + 1
                progress = True
                cls = r.get("class_name")
                if cls in K3_MASK_OPS:
                    ops[out_key] = self._mask_op(prefix + str(lname), cls, r.get("config") or {}, flat, produced,
                                                 ops)
                    continue
                if cls in ATTENTION:  # its masks are the ones Keras 3 attaches to its inputs (_k3_implicit)
                    if kwargs.get("mask") is not None:
                        refuse(prefix + str(lname), str(cls), "it is called with an explicit mask= list")
                    r = attention_call(r, prefix + str(lname), {k: v for k, v in kwargs.items() if k != "mask"})
                    kwargs = {}
                extra = set(kwargs) - {"training", "mask"}
                if extra or (kwargs.get("mask") is not None and mkey is None):
                    refuse(prefix + str(lname), str(cls), f"it is called with keyword arguments {sorted(extra)} "
                           "(e.g. initial_state)")
                if any(t in ops for t in keys):
                    refuse(prefix + str(lname), str(cls), "a mask operation feeds it as an input")
                mask = None
                if mkey is not None:
                    if cls not in K3_MASK_TAKERS:
                        refuse(prefix + str(lname), str(cls), "it is handed a mask, which the writers do not "
                               "follow for this layer")
                    mask = self._mask_tensor(prefix + str(lname), cls, ops.get(mkey))
                before = len(self.nodes)
                ins_here = [produced[t] for t in keys]
                if cls in ATTENTION or cls in MHA:
                    for i in ins_here:
                        self.mask_of[i] = self.implicit.get(i)
                        if self.mask_of[i] == _CONFLICT:
                            refuse(prefix + str(lname), str(cls), "its input carries a mask merged from different "
                                   "masks")
                out = self.call(r, prefix, ins_here)
                if cls in MHA:
                    self.erased += [(self.nodes[-1], i) for i in dict.fromkeys(ins_here) if self.implicit.get(i)]
                if cls in ATTENTION or cls in MHA:
                    for i in ins_here:
                        self.mask_of[i] = None
                if mask is not None:
                    if len(self.nodes) != before + 1:
                        refuse(prefix + str(lname), str(cls), "a mask handed to a nested model")
                    self.nodes[-1].masks = [mask] + [None] * (len(keys) - 1)
                for t in self.nodes[before:]:
                    self.implicit[t.outputs[0]] = _k3_implicit(t, [self.implicit.get(i) for i in t.inputs])
                for t in self.nodes[before:]:  # Keras 3 names every mask it hands on (no implicit ones)
                    t.mask_out = None
                    self.mask_of[t.outputs[0]] = None
                produced[out_key] = out if isinstance(out, str) else out[0]
                for t, more in enumerate(self.more.get(out, []) if isinstance(out, str) else [], 1):
                    produced[(lname, k, t)] = more  # an attention layer's scores
            if not progress:
                raise UnsupportedError("model config: layers whose inputs are never computed (a cycle or a "
                                       "missing layer)")
        out_specs = conf.get("output_layers") or []
        out_specs = [out_specs] if out_specs and isinstance(out_specs[0], str) else out_specs
        outs = []
        for spec in out_specs:
            key = spec_key(spec)
            if key not in produced:
                raise UnsupportedError(f"model output {spec!r} is never computed")
            outs.append(produced[key])
        return outs if ins is None else (outs[0] if len(outs) == 1 else outs)

    def _mask_op(self, path: str, cls: str, conf: dict, flat: list, produced: dict, ops: dict) -> tuple:
        src = _k3_tensor(flat[0]) if flat else None
        if cls == "NotEqual":
            val = flat[1] if len(flat) == 2 else None
            if src is None or src not in produced or isinstance(val, (dict, list)) or not isinstance(val, (int, float)):
                refuse(path, cls, "a NotEqual op other than a tensor against a number (a mask)")
            return ("ne", produced[src], float(val))
        if src not in ops or ops[src][0] != "ne" or conf.get("axis") not in (-1, [-1]) or conf.get("keepdims"):
            refuse(path, cls, "an Any op other than Masking's any(x != v, axis=-1)")
        return ("any", ops[src][1], ops[src][2])

    def _mask_tensor(self, path: str, cls: str, op: tuple | None) -> str:
        """The graph mask (``Graph.masks``) of a mask op's output: ``x != 0`` on int token ids, ``any(x != v, -1)``."""
        if op is None:
            refuse(path, cls, "its mask is not made by a NotEqual/Any op (Embedding mask_zero or Masking)")
        kind, src, val = op
        dtype = next((d for n, _, d, _ in self.inputs if n == src), None)
        if kind == "ne" and val == 0.0 and dtype is not None and "int" in dtype:
            name = f"{src}:mask_ids"
            self.masks[name] = ("ids", src)
        elif kind == "any":
            name = f"{src}:mask_value_{val!r}"
            self.masks[name] = ("value", src, val)
        else:
            refuse(path, cls, "its mask is x != v on a tensor other than integer token ids")
        return name


def _k3_erased(nodes: list[Node], erased: list[tuple[Node, str]], implicit: dict[str, str | None]) -> None:
    """Keras 3.15's ``MultiHeadAttention.call`` erases the implicit masks of its inputs
    (``backend.set_keras_mask(query, None)``, the same for value and key; seen in its outputs: a second attention
    layer on the same embedding then runs unmasked). A masked input that another layer call also reads is
    accepted where Keras 3 must run that layer first (an ancestor of the attention call: it saw the mask) or where
    the mask it reads changes nothing (a merge with the attention's output, which carries the same mask);
    elsewhere what that layer sees depends on Keras 3's order of execution: refused by name.

    Raises:
        WholeModelError: such a model, naming the attention layer and the other layer."""
    producer = {o: n for n in nodes for o in n.outputs}

    def closure(start, step):
        seen, stack = set(), list(start)
        while stack:
            for n in step(stack.pop()):
                if id(n) not in seen:
                    seen.add(id(n))
                    stack.append(n)
        return seen

    for mha, t in erased:
        anc = closure([mha], lambda n: [producer[i] for i in n.inputs if i in producer])
        desc = closure([mha], lambda n: [c for c in nodes if set(c.inputs) & set(n.outputs)])
        for n in nodes:
            if n is mha or t not in n.inputs or id(n) in anc:
                continue
            others = {implicit.get(i) for i in n.inputs if i != t} - {None}
            if n.cls in MERGE and id(n) in desc and others == {implicit.get(t)}:
                continue
            refuse(mha.path, mha.cls, f"Keras 3 erases the mask of its input when it runs, and layer '{n.path}' "
                   "also reads that input: what it sees depends on Keras 3's order of execution")


#: an implicit mask merged from different masks (:func:`_k3_implicit`; refused where an attention layer reads it)
_CONFLICT = "#conflict"


def _k3_implicit(node: Node, masks: list[str | None]) -> str | None:
    """The mask Keras 3 attaches to ``node``'s output at run time (keras 3.15 ``Layer.__call__``: a layer that
    supports masking hands on ``compute_mask``; the same rules as tf_keras': ``Embedding(mask_zero)`` and
    ``Masking`` make one, :data:`MASK_PASS` layers and recurrent layers returning sequences hand on their first
    input's, merges their inputs' (:data:`_CONFLICT` when they differ), every other layer ends it). Keras 3 hands
    an ``Attention`` layer these masks at run time without writing them in the config's call arguments (checked
    against Keras 3's outputs in ``tests/formats/whole_models/test_whole_attention.py``)."""
    cls, conf = node.cls, node.config
    if cls in ("Embedding", "Masking"):
        return node.mask_out
    if cls in MERGE:
        got = {m for m in masks if m is not None}
        return next(iter(got)) if len(got) == 1 else (_CONFLICT if got else None)
    inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
    if cls in MASK_PASS or cls == "Rescaling" or ((cls in RECURRENT or cls == "Bidirectional")
                                                  and inner.get("return_sequences")):
        return masks[0] if masks else None
    return None


#: what reading an untrusted model config's values can raise (a number where a dict was, a list too short ...)
CONFIG_ERRORS = (KeyError, TypeError, IndexError, ValueError, AttributeError)


def from_config(fn, *args: Any) -> Any:
    """``fn(*args)`` (a writer building layers from a :class:`Graph`'s configs), with what a malformed config value
    raises (:data:`CONFIG_ERRORS`) turned into one :class:`UnsupportedError` line: the config is untrusted input,
    never a traceback."""
    try:
        return fn(*args)
    except CONFIG_ERRORS as exc:
        raise UnsupportedError(f"malformed model config: a layer's settings could not be read "
                               f"({type(exc).__name__}: {str(exc)[:160]})") from exc


def _finish(g: Graph) -> Graph:
    """``g`` with each input's token range (an Embedding's ``input_dim``) beside its name, shape and dtype."""
    feeds = {n.inputs[0]: n for n in g.nodes if n.cls == "Embedding"}
    try:
        g.inputs = [(nm, shp, dt, int(feeds[nm].config["input_dim"]) if nm in feeds else None)
                    for nm, shp, dt, _ in g.inputs]
    except CONFIG_ERRORS as exc:
        raise UnsupportedError(f"malformed model config: an Embedding's input_dim ({type(exc).__name__}: "
                               f"{str(exc)[:160]})") from exc
    return g


def build_keras3(model_config: dict, weights: dict[str, list[tuple[str, np.ndarray]]], ckpt: Checkpoint) -> Graph:
    """The :class:`Graph` of a Keras 3 model (``config.json`` of a ``.keras`` archive; weights in
    ``layer.weights`` order as the archive's ``vars/0, vars/1, ...`` hold them, nested models' as
    ``inner/var<i>``): :class:`_Keras3Builder`. Same errors as :func:`build`."""
    b = _Keras3Builder(weights, ckpt)
    try:
        out = b.model(model_config, "", None)
    except CONFIG_ERRORS as exc:
        raise UnsupportedError(f"malformed Keras 3 model config ({type(exc).__name__}: {str(exc)[:160]})") from exc
    outs = [out] if isinstance(out, str) else list(out)
    name = (model_config.get("config") or {}).get("name") if isinstance(model_config.get("config"), dict) else None
    _k3_erased(b.nodes, b.erased, b.implicit)
    return _finish(Graph(str(name or "model"), b.inputs, b.nodes, outs, b.masks))
