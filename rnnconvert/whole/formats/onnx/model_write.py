"""A whole Keras model as one runnable ONNX graph (issue #30): the :class:`rnnconvert.whole.conventions.keras_graph.Graph`
of a full-model file, built node by node in ONNX op set 14 (:data:`.onnx_write.OPSET`).

Graph inputs are the model's inputs (their names, ``batch`` and ``time`` dimensions symbolic: a sequence input's
time axis is free even where the model declares a length, unless a layer ties it
(:mod:`rnnconvert.whole.conventions.time_axis`; the metadata's ``time_axis`` and the notes say which layer, or
the shortest length a strided layer allows); an input
feeding an ``Embedding`` is ``int32`` token ids, everything else ``float32``); graph outputs the model outputs
(``output_0``, ``output_1``, ... in the model's order) and every layer call's output ``layer:<name>``, so that
a runtime can compare each layer (:mod:`rnnconvert.runtimes.onnxruntime` ``verify_whole``).

Recurrent layers are native ONNX ``LSTM`` / ``GRU`` / ``RNN`` nodes built by :mod:`.onnx_write` (gate orders
from :data:`rnnconvert.core.gates.TABLE`, ``HardSigmoid`` alpha 0.2 / beta 0.5 for Keras 2's hard_sigmoid,
``Affine`` 1/0 for linear, ``linear_before_reset`` = Keras ``reset_after``). A Keras mask reaching a recurrent
layer is exact for any padding by default (``mask_layout='any'``, :mod:`.masks`: the unmasked steps compacted to
the front, the node's ``sequence_lens``, the outputs put back with tf_keras' masked-step rules, issue #41); with
``mask_layout='end'`` it is the node's ``sequence_lens`` alone (the count of unmasked steps per sequence): exact
when each sequence's padding is at its end (ONNX runs steps ``0 .. len-1``; tf_keras keeps the state at masked
steps), which the written notes say; a unidirectional layer's outputs past the end repeat the last one
(tf_keras), a Bidirectional's are zero (tf_keras ``zero_output_for_mask``). ``return_state`` is the node's ``Y_h`` /
``Y_c`` as ``(B, H)``, ``initial_state`` its ``initial_h`` / ``initial_c`` (:mod:`rnnconvert.whole.conventions.keras_graph`
"States"; tf_keras' outputs in ``tests/formats/whole_models/test_whole_states.py``). Other layers (ONNX operator spec):
``Embedding`` ``Gather``; ``Dense`` ``MatMul`` + ``Add``; ``Conv1D`` ``Conv`` on channels-first (kernel
``(k, in, out)`` -> ``(out, in, k)``; ``same``: ``auto_pad=SAME_UPPER`` = TensorFlow's split, ``causal``:
``(k-1)*dilation`` zeros before); ``BatchNormalization`` as ``x * (gamma / sqrt(var + eps)) + (beta - mean *
...)`` computed in float64 and stored float32; ``LayerNormalization`` ``ReduceMean`` arithmetic; pooling
``MaxPool`` / ``AveragePool`` / ``Reduce*``; dropout-like layers are the identity (inference); ``Conv2D`` and
2-D pooling (channels_last) on NCHW between two ``Transpose`` (:func:`_conv2d`, :func:`_pool2d`); ``Attention`` /
``AdditiveAttention`` by :mod:`.attention` (issue #41).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ...conventions import keras_graph, time_axis
from ....core.model import Cell
from ....errors import OptionError, require
from ....formats.onnx import onnx_write
from ....formats.onnx.onnx_write import WEIGHTS_ONLY
from . import attention as attention_onnx
from . import small_layers
from . import masks as mask_forms
from . import profiles, scan_cells

META_KEY = onnx_write.META_KEY
class _G:
    """The graph being built: nodes, initializers, fresh names."""

    def __init__(self, helper, numpy_helper, TensorProto):
        self.h, self.nh, self.TP = helper, numpy_helper, TensorProto
        self.nodes: list = []
        self.inits: list = []
        self.n = 0
        self.profile = profiles.profile(None)
        self.scans: list[str] = []  # the recurrent layer calls written as Scans (a runtime profile)
        self.native: dict[str, dict] = {}  # their native node (op, W R B names, attributes) by layer name
        self.carried: set[str] = set()  # write option states: the recurrent layer calls whose states are carried
        self.state_ins: list[tuple[str, int]] = []  # (graph input, units)
        self.state_outs: list[tuple[str, str, int]] = []  # (graph output, tensor, units)

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}__{self.n}"

    def const(self, arr: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.inits.append(self.nh.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op: str, ins: list[str], base: str, out: str | None = None, n_out: int = 1,
           node_name: str | None = None, **attrs) -> Any:
        outs = [out] if out is not None else [self.fresh(base) for _ in range(n_out)]
        self.nodes.append(self.h.make_node(op, ins, outs, name=node_name or self.fresh(base + "_" + op), **attrs))
        return outs[0] if n_out == 1 else outs


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def activation(g: _G, x: str, act: str | None, base: str) -> str:
    """Keras 2 activation ``act`` on ``x`` (tf_keras ``activations.py``)."""
    if act in (None, "linear"):
        return x
    simple = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softplus": "Softplus", "softsign": "Softsign",
              "exponential": "Exp"}
    if act in simple:
        return g.op(simple[act], [x], base)
    if act == "softmax":
        return g.op("Softmax", [x], base, axis=-1)
    if act == "elu":
        return g.op("Elu", [x], base, alpha=1.0)
    if act == "selu":  # tf: scale 1.0507009873554805, alpha 1.6732632423543772
        return g.op("Selu", [x], base, alpha=1.6732632423543772, gamma=1.0507009873554805)
    if act == "hard_sigmoid":  # Keras 2: clip(0.2 x + 0.5, 0, 1)
        return g.op("HardSigmoid", [x], base, alpha=0.2, beta=0.5)
    if act == "hard_sigmoid_k3":  # Keras 3: relu6(x + 3) / 6 = clip(x / 6 + 0.5, 0, 1)
        return g.op("HardSigmoid", [x], base, alpha=1.0 / 6.0, beta=0.5)
    raise AssertionError(act)


def _dense(g: _G, x: str, ws: list, conf: dict, base: str) -> str:
    y = g.op("MatMul", [x, g.const(_f32(ws[0]), base + ".kernel")], base)
    if conf.get("use_bias", True) and len(ws) > 1:
        y = g.op("Add", [y, g.const(_f32(ws[1]), base + ".bias")], base)
    return activation(g, y, conf.get("activation"), base)


def _reduce(g: _G, op: str, x: str, axes: list[int], keepdims: int, base: str) -> str:
    """``op`` (ReduceSum/Mean/Max/Prod) over ``axes``: op set 13-17 take ReduceSum's axes as an input, the
    others' as an attribute."""
    if op == "ReduceSum":
        return g.op(op, [x, g.const(_int64(axes), "axes")], base, keepdims=keepdims)
    return g.op(op, [x], base, axes=axes, keepdims=keepdims)


def _int64(v) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


def _lens(g: _G, mask_name: str, masks: dict, made: dict, env: dict) -> str:
    """``sequence_lens`` (int32, (batch,)) of the mask ``mask_name``: its count of unmasked steps."""
    key = mask_name + ":lens"
    if key not in made:
        kind = masks[mask_name]
        src = env[kind[1]]
        if kind[0] == "ids":
            m = g.op("Not", [g.op("Equal", [src, g.const(np.zeros((), np.int32), "zero")], "mask")], "mask")
        else:
            ne = g.op("Not", [g.op("Equal", [src, g.const(np.full((), kind[2], np.float32), "mask_value")], "mask")],
                      "mask")
            m = g.op("Cast", [g.op("ReduceMax", [g.op("Cast", [ne], "mask", to=g.TP.INT32)], "mask",
                                   axes=[-1], keepdims=0)], "mask", to=g.TP.BOOL)
        made[mask_name] = m
        made[key] = g.op("ReduceSum", [g.op("Cast", [m], "lens", to=g.TP.INT32), g.const(_int64([1]), "ax")], "lens",
                         keepdims=0)
    return made[key]


#: the 1-D global poolings (``keepdims=True`` keeps the time axis as one step: tf_keras ``GlobalPooling1D``)
POOL1D = ("GlobalMaxPooling1D", "GlobalAveragePooling1D")


def _bool_mask(g: _G, mask_name: str, masks: dict, made: dict, env: dict) -> str:
    """The bool ``(batch, time)`` tensor of the mask ``mask_name`` (made once, with its :func:`_lens`)."""
    _lens(g, mask_name, masks, made, env)
    return made[mask_name]


def _recurrent(g: _G, node: keras_graph.Node, x: str, lens: str | None, initial: list[str] | None = None,
               cp: mask_forms.Compaction | None = None):
    """The recurrent layer call ``node`` on ``x``: its output, or with ``return_state`` ``[output, h(, c)]``
    (:func:`_states`); ``initial``: the ``initial_state`` tensors (Keras ``[h, c]`` / ``[h]``, each ``(B, H)``), fed
    as the node's ``initial_h`` / ``initial_c`` ``(1, B, H)``; ``cp``: the mask in its general form
    (:mod:`.masks`, any padding; ``lens`` is then its ``sequence_lens``), else ``lens`` alone (padding at the end)."""
    layer = node.layer
    s = layer.semantics
    base = node.name
    H = layer.hidden_size
    conf = node.config
    inner = (conf.get("layer") or {}).get("config", {}) if node.cls == "Bidirectional" else conf
    seqs = bool(inner.get("return_sequences"))
    reverse = s.go_backwards and not layer.bidirectional
    if node.name in g.carried:  # write option states: the initial states are graph inputs
        initial = [f"state_in:{node.name}:{key}" for key in keras_graph.STATES[node.cls]]
        g.state_ins += [(t, H) for t in initial]
    if cp is not None:  # any mask: the node runs on each sequence's unmasked steps moved to the front
        lens = cp.lens
        x = mask_forms.compact(g, x, cp, base)
    elif lens is not None and reverse and seqs:
        keras_graph.refuse(node.path, node.cls, "a masked go_backwards layer returning sequences under "
                           "mask_layout='end' (ONNX sequence_lens runs it from each sequence's end, Keras from the "
                           "padding; the default mask_layout='any' builds it)")
    from onnx import helper

    init = onnx_write.Initializers(g.nh, helper, g.TP)
    made, more = onnx_write.slab_inits(layer, 0, layer.params[0], init)
    for t in made:
        t.name = f"{base}.{t.name.rsplit('.', 1)[1]}"
    more = [f"{base}.{m.rsplit('.', 1)[1]}" if m else "" for m in more]
    g.inits += made
    ins = [g.op("Transpose", [x], base + "_tm", perm=[1, 0, 2])] + more[:3]
    if lens is not None:
        ins += [lens]
    elif len(more) > 3 or initial:
        ins += [""]
    if initial:  # X W R B seq_lens initial_h initial_c: Keras' (B, H) states as (num_directions=1, B, H)
        ins += [g.op("Unsqueeze", [t, g.const(_int64([0]), "ax")], base) for t in initial]
    if len(more) > 3:  # peepholes: X W R B seq_lens initial_h initial_c P
        ins += [""] * (7 - len(ins)) + [more[-1]]
    acts, alpha, beta = onnx_write.rnn_activations(layer)
    attrs: dict[str, Any] = {"hidden_size": H, "activations": acts,
                             "direction": "bidirectional" if layer.bidirectional else
                             ("reverse" if reverse else "forward")}
    if alpha:
        attrs.update(activation_alpha=alpha, activation_beta=beta)
    if layer.cell is Cell.GRU:
        attrs["linear_before_reset"] = 1 if s.reset_after else 0
    op = onnx_write.OP[layer.cell]
    if not profiles.native(g.profile, acts, op, bool(lens)):
        g.scans.append(node.name)
        if node.name == node.path:  # the per-layer checks run the native node of these inputs and attributes
            g.native[layer.name] = {"op": op, "inputs": ins[1:4], "attrs": attrs}
    # the layer's first call is named after it (the runtime's one-node checks find it); further calls of a
    # shared layer after the call
    if profiles.native(g.profile, acts, op, bool(lens)):
        y, yh, *yc = g.op(op, ins, base, n_out=3 if layer.cell is Cell.LSTM else 2,
                          node_name=layer.name if node.name == node.path else node.name, **attrs)
    else:  # a runtime profile (issue #41): the node as Scans of elementwise ops
        y, yh, *yc = scan_cells.node(g, op, ins, attrs, base)
    merge = s.merge_mode if layer.bidirectional else "concat"
    if merge not in ("concat", "sum", "ave", "mul"):
        keras_graph.refuse(node.path, node.cls, f"merge_mode={merge!r} (several outputs) is not built")
    red = {"sum": "ReduceSum", "ave": "ReduceMean", "mul": "ReduceProd"}
    if cp is not None:
        out = _general_output(g, node, y, yh, cp, seqs, merge, reverse, red)
        return _states(g, node, out, yh, yc, cp, initial)
    out = _sequence_or_last(g, node, y, yh, lens, seqs, merge, reverse, red)
    return _states(g, node, out, yh, yc, initial=initial, lens=lens)


def _states(g: _G, node: keras_graph.Node, out: str, yh: str, yc: list[str],
            cp: mask_forms.Compaction | None = None, initial: list[str] | None = None, lens: str | None = None):
    """``out``, or with ``return_state`` (``node.outputs`` beyond the first) ``[out, h, c]`` / ``[out, h]``: the
    node's ``Y_h`` / ``Y_c`` ``(1, B, H)`` as Keras' ``(B, H)`` (with ``sequence_lens``, the state at each
    sequence's last step, as tf_keras keeps it over masked steps; with ``cp``, the initial state where a sequence
    has no unmasked step, :func:`.masks.state`; with ``lens`` alone, ``mask_layout='end'``, the same: onnxruntime
    gives zero states for a sequence of length 0, tf_keras its initial state, measured in session 18)."""
    if node.name in g.carried:  # write option states: the final states are graph outputs
        for key, t in zip(keras_graph.STATES[node.cls], _squeezed(g, node, yh, yc, cp, initial, lens)):
            g.state_outs.append((f"state_out:{node.name}:{key}", t, node.layer.hidden_size))
    if len(node.outputs) == 1:
        return out
    return [out] + _squeezed(g, node, yh, yc, cp, initial, lens)[:len(node.outputs) - 1]


def _squeezed(g: _G, node: keras_graph.Node, yh: str, yc: list[str], cp: mask_forms.Compaction | None,
              initial: list[str] | None, lens: str | None = None) -> list[str]:
    """The node's ``Y_h`` (, ``Y_c``) as Keras' ``(B, H)`` states (:func:`_states`)."""
    sq = [g.op("Squeeze", [t, g.const(_int64([0]), "ax")], node.name) for t in [yh] + yc]
    if cp is not None:
        sq = [mask_forms.state(g, t, initial[i] if initial else None, cp, node.name) for i, t in enumerate(sq)]
    elif lens is not None and initial:  # a sequence of length 0: its initial state (the node's are zeros)
        seen = g.op("Unsqueeze", [g.op("Greater", [lens, g.const(np.zeros((), np.int32), "zero")], node.name),
                                  g.const(_int64([1]), "ax")], node.name)
        sq = [g.op("Where", [seen, t, initial[i]], node.name) for i, t in enumerate(sq)]
    return sq


def _general_output(g: _G, node: keras_graph.Node, y: str, yh: str, cp: mask_forms.Compaction, seqs: bool,
                    merge: str, reverse: bool, red: dict) -> str:
    """The Keras output of a recurrent node run on compacted steps (:mod:`.masks`): the last state(s), zero for a
    sequence with no unmasked step, or the sequence scattered back to the original steps."""
    base = node.name
    if not seqs:
        t = g.op("Transpose", [yh], base, perm=[1, 0, 2])  # (B, D, H)
        out = (g.op("Reshape", [t, g.const(_int64([0, -1]), "shape")], base) if merge == "concat"
               else _reduce(g, red[merge], t, [1], 0, base))
        return mask_forms.last(g, out, cp, base)
    t = g.op("Transpose", [y], base, perm=[2, 0, 1, 3])  # (T, D, B, H) -> (B, T, D, H)
    out = (g.op("Reshape", [t, g.const(_int64([0, 0, -1]), "shape")], base) if merge == "concat"
           else _reduce(g, red[merge], t, [2], 0, base))
    return mask_forms.sequence(g, out, cp, bidirectional=node.layer.bidirectional, go_backwards=reverse, base=base)


def _sequence_or_last(g: _G, node: keras_graph.Node, y: str, yh: str, lens: str | None, seqs: bool, merge: str,
                      reverse: bool, red: dict) -> str:
    """The Keras output of a recurrent node: the last state(s) or the sequence (merged, masked steps as
    tf_keras has them)."""
    layer, base = node.layer, node.name
    if not seqs:
        t = g.op("Transpose", [yh], base, perm=[1, 0, 2])  # (B, D, H)
        if merge == "concat":
            return g.op("Reshape", [t, g.const(_int64([0, -1]), "shape")], base)
        return _reduce(g, red[merge], t, [1], 0, base)
    t = g.op("Transpose", [y], base, perm=[2, 0, 1, 3])  # (T, D, B, H) -> (B, T, D, H)
    out = (g.op("Reshape", [t, g.const(_int64([0, 0, -1]), "shape")], base) if merge == "concat"
           else _reduce(g, red[merge], t, [2], 0, base))
    if reverse:  # processing order, as Keras returns a go_backwards layer's sequence
        out = g.op("Slice", [out, g.const(_int64([-1]), "s"), g.const(_int64([-(2 ** 63)]), "e"),
                             g.const(_int64([1]), "a"), g.const(_int64([-1]), "st")], base)
    if lens is not None and not layer.bidirectional:  # tf_keras: a masked step repeats the previous output
        T = g.op("Gather", [g.op("Shape", [out], base), g.const(_int64(1), "one")], base)
        steps = g.op("Range", [g.const(_int64(0), "zero"), T, g.const(_int64(1), "one")], base)  # (T,)
        last = g.op("Sub", [g.op("Cast", [lens], base, to=g.TP.INT64), g.const(_int64(1), "one")], base)
        idx = g.op("Max", [g.op("Min", [g.op("Unsqueeze", [steps, g.const(_int64([0]), "ax")], base),
                                        g.op("Unsqueeze", [last, g.const(_int64([1]), "ax")], base)], base),
                           g.const(_int64(0), "zero")], base)  # (B, T): min(t, len-1), 0 for an all-padding row
        idx = g.op("Expand", [g.op("Unsqueeze", [idx, g.const(_int64([2]), "ax")], base),
                              g.op("Shape", [out], base)], base)
        out = g.op("GatherElements", [out, idx], base, axis=1)
    return out


def _conv1d(g: _G, x: str, node: keras_graph.Node) -> str:
    conf, ws, base = node.config, node.weights, node.name
    k = int(ws[0].shape[0])
    dil = conf.get("dilation_rate", 1)
    dil = int(dil[0] if isinstance(dil, (list, tuple)) else dil)
    st = conf.get("strides", 1)
    st = int(st[0] if isinstance(st, (list, tuple)) else st)
    if int(conf.get("groups", 1) or 1) != 1:
        keras_graph.refuse(node.path, node.cls, "grouped convolution")
    pad = conf.get("padding", "valid")
    xc = g.op("Transpose", [x], base, perm=[0, 2, 1])
    attrs: dict[str, Any] = {"dilations": [dil], "strides": [st], "kernel_shape": [k]}
    if pad == "valid":
        attrs["pads"] = [0, 0]
    elif pad == "same" and st == 1:  # TensorFlow's split: (k-1)*dilation, the odd one at the end
        tot = (k - 1) * dil
        attrs["pads"] = [tot // 2, tot - tot // 2]
    elif pad == "same":  # strides > 1 (TF allows no dilation then): the pads depend on the length
        attrs["auto_pad"] = "SAME_UPPER"  # TensorFlow's split: the odd pad at the end
    elif pad == "causal":
        attrs["pads"] = [(k - 1) * dil, 0]
    else:
        keras_graph.refuse(node.path, node.cls, f"padding={pad!r}")
    ins = [xc, g.const(_f32(np.transpose(ws[0], (2, 1, 0))), base + ".kernel")]
    if conf.get("use_bias", True) and len(ws) > 1:
        ins.append(g.const(_f32(ws[1]), base + ".bias"))
    y = g.op("Transpose", [g.op("Conv", ins, base, **attrs)], base, perm=[0, 2, 1])
    return activation(g, y, conf.get("activation"), base)


def _pool1d(g: _G, x: str, node: keras_graph.Node) -> str:
    conf, base = node.config, node.name
    size = conf.get("pool_size", 2)
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    st = conf.get("strides") or size
    st = int(st[0] if isinstance(st, (list, tuple)) else st)
    pad = conf.get("padding", "valid")
    attrs: dict[str, Any] = {"kernel_shape": [size], "strides": [st]}
    if pad == "same":
        if node.cls == "AveragePooling1D":  # TF averages over the valid elements only
            attrs["count_include_pad"] = 0
        attrs["auto_pad"] = "SAME_UPPER"
    xc = g.op("Transpose", [x], base, perm=[0, 2, 1])
    y = g.op("MaxPool" if node.cls == "MaxPooling1D" else "AveragePool", [xc], base, **attrs)
    return g.op("Transpose", [y], base, perm=[0, 2, 1])


def _pair(v, n: int = 2) -> list[int]:
    """A Keras int-or-tuple argument (``kernel_size``, ``strides``...) as ``n`` ints."""
    return [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)] * n


def _conv2d(g: _G, x: str, node: keras_graph.Node) -> str:
    """``Conv2D`` (channels_last) as ``Conv`` on NCHW: kernel ``(kh, kw, in, out)`` -> ``(out, in, kh, kw)``
    (tf_keras ``convolutional/conv2d.py`` stores HWIO; ONNX ``Conv`` takes OIHW); ``same``: TensorFlow's split
    (``pad_total = max((ceil(L/s)-1)*s + (k-1)*d + 1 - L, 0)``, the odd one at the end), explicit pads at
    stride 1, ``auto_pad=SAME_UPPER`` (the same split) at strides > 1."""
    conf, ws, base = node.config, node.weights, node.name
    kh, kw = int(ws[0].shape[0]), int(ws[0].shape[1])
    dil, st = _pair(conf.get("dilation_rate", 1)), _pair(conf.get("strides", 1))
    if int(conf.get("groups", 1) or 1) != 1:
        keras_graph.refuse(node.path, node.cls, "grouped convolution")
    pad = conf.get("padding", "valid")
    attrs: dict[str, Any] = {"dilations": dil, "strides": st, "kernel_shape": [kh, kw]}
    if pad == "valid":
        attrs["pads"] = [0, 0, 0, 0]
    elif pad == "same" and st == [1, 1]:
        th, tw = (kh - 1) * dil[0], (kw - 1) * dil[1]
        attrs["pads"] = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
    elif pad == "same":
        attrs["auto_pad"] = "SAME_UPPER"
    else:
        keras_graph.refuse(node.path, node.cls, f"padding={pad!r}")
    xc = g.op("Transpose", [x], base, perm=[0, 3, 1, 2])
    ins = [xc, g.const(_f32(np.transpose(ws[0], (3, 2, 0, 1))), base + ".kernel")]
    if conf.get("use_bias", True) and len(ws) > 1:
        ins.append(g.const(_f32(ws[1]), base + ".bias"))
    y = g.op("Transpose", [g.op("Conv", ins, base, **attrs)], base, perm=[0, 2, 3, 1])
    return activation(g, y, conf.get("activation"), base)


def _pool2d(g: _G, x: str, node: keras_graph.Node) -> str:
    """``MaxPooling2D`` / ``AveragePooling2D`` (channels_last) as ``MaxPool`` / ``AveragePool`` on NCHW; ``same``:
    ``auto_pad=SAME_UPPER`` (TensorFlow's split), an average over the valid elements only (``count_include_pad=0``,
    as TensorFlow's ``avg_pool`` computes it)."""
    conf, base = node.config, node.name
    size = _pair(conf.get("pool_size", 2))
    st = _pair(conf.get("strides") or size)
    attrs: dict[str, Any] = {"kernel_shape": size, "strides": st}
    if conf.get("padding", "valid") == "same":
        if node.cls == "AveragePooling2D":
            attrs["count_include_pad"] = 0
        attrs["auto_pad"] = "SAME_UPPER"
    xc = g.op("Transpose", [x], base, perm=[0, 3, 1, 2])
    y = g.op("MaxPool" if node.cls == "MaxPooling2D" else "AveragePool", [xc], base, **attrs)
    return g.op("Transpose", [y], base, perm=[0, 2, 3, 1])


def _merge(g: _G, xs: list[str], node: keras_graph.Node) -> str:
    cls, base = node.cls, node.name
    if cls == "Concatenate":
        return g.op("Concat", xs, base, axis=int(node.config.get("axis", -1)))
    if cls == "Subtract":
        return g.op("Sub", xs, base)
    op = {"Add": "Add", "Multiply": "Mul", "Maximum": "Max", "Minimum": "Min", "Average": "Sum"}[cls]
    y = xs[0]
    if op in ("Max", "Min", "Sum"):
        y = g.op(op, xs, base)
    else:
        for x in xs[1:]:
            y = g.op(op, [y, x], base)
    if cls == "Average":
        y = g.op("Div", [y, g.const(np.full((), float(len(xs)), np.float32), "n")], base)
    return y


def _layer(g: _G, node: keras_graph.Node, xs: list[str], lens: str | None, mask: str | None,
           cp: mask_forms.Compaction | None = None) -> str:
    cls, conf, ws, base = node.cls, node.config, node.weights, node.name
    x = xs[0]
    if cls in keras_graph.IDENTITY:
        return g.op("Identity", [x], base)
    if cls in keras_graph.RECURRENT or cls == "Bidirectional":
        return _recurrent(g, node, x, lens, xs[1:], cp)
    if cls == "Embedding":
        return g.op("Gather", [g.const(_f32(ws[0]), base + ".embeddings"), g.op("Cast", [x], base, to=g.TP.INT64)],
                    base)
    if cls == "Masking":  # tf_keras: x * mask (masked steps become 0)
        ne = g.op("Not", [g.op("Equal", [x, g.const(np.full((), float(conf.get("mask_value", 0.0)), np.float32),
                                                                   "mv")], base)], base)
        keep = g.op("ReduceMax", [g.op("Cast", [ne], base, to=g.TP.FLOAT)], base, axes=[-1], keepdims=1)
        return g.op("Mul", [x, keep], base)
    if cls == "Dense":
        return _dense(g, x, ws, conf, base)
    if cls == "TimeDistributed":
        icls, iconf = node.inner
        if icls == "Dense":
            return _dense(g, x, ws, iconf, base)
        if icls == "Activation":
            return activation(g, x, iconf.get("activation"), base)
        return g.op("Identity", [x], base)
    if cls == "Activation":
        return g.op("Identity", [activation(g, x, conf.get("activation"), base)], base)
    if cls == "ReLU":
        if conf.get("max_value") is not None or float(conf.get("negative_slope", 0) or 0) or float(
                conf.get("threshold", 0) or 0):
            keras_graph.refuse(node.path, cls, "ReLU with max_value / negative_slope / threshold")
        return g.op("Relu", [x], base)
    if cls in keras_graph.SMALL:  # issue #41: PReLU, Rescaling, UnitNormalization, UpSampling1D, EinsumDense
        return small_layers.build(g, node, x, activation)
    if cls == "LeakyReLU":
        return g.op("LeakyRelu", [x], base, alpha=float(conf.get("alpha", 0.3)))
    if cls == "ELU":
        return g.op("Elu", [x], base, alpha=float(conf.get("alpha", 1.0)))
    if cls == "Softmax":
        if conf.get("axis", -1) != -1:
            keras_graph.refuse(node.path, cls, "softmax over an axis other than the last")
        return g.op("Softmax", [x], base, axis=-1)
    if cls == "Conv1D":
        return _conv1d(g, x, node)
    if cls in ("MaxPooling1D", "AveragePooling1D"):
        return _pool1d(g, x, node)
    if cls == "GlobalMaxPooling1D":
        return g.op("ReduceMax", [x], base, axes=[1], keepdims=0)
    if cls == "GlobalAveragePooling1D":
        if mask is None:
            return g.op("ReduceMean", [x], base, axes=[1], keepdims=0)
        m = g.op("Unsqueeze", [g.op("Cast", [mask], base, to=g.TP.FLOAT), g.const(_int64([2]), "ax")], base)
        num = g.op("ReduceSum", [g.op("Mul", [x, m], base), g.const(_int64([1]), "ax")], base, keepdims=0)
        den = g.op("ReduceSum", [m, g.const(_int64([1]), "ax")], base, keepdims=0)
        return g.op("Div", [num, den], base)
    if cls == "Flatten":
        return g.op("Flatten", [x], base, axis=1)
    if cls == "Reshape":
        return g.op("Reshape", [x, g.const(_int64([0] + [int(d) for d in conf["target_shape"]]), "shape")], base)
    if cls == "Permute":
        return g.op("Transpose", [x], base, perm=[0] + [int(d) for d in conf["dims"]])
    if cls == "RepeatVector":
        u = g.op("Unsqueeze", [x, g.const(_int64([1]), "ax")], base)
        return g.op("Tile", [u, g.const(_int64([1, int(conf["n"]), 1]), "reps")], base)
    if cls in keras_graph.MERGE:
        return _merge(g, xs, node)
    if cls == "BatchNormalization":
        it = iter(ws)  # axis: the last (keras_graph checked it)
        gamma = next(it) if conf.get("scale", True) else None
        beta = next(it) if conf.get("center", True) else None
        mean, var = next(it), next(it)
        eps = float(conf.get("epsilon", 1e-3))
        # tf_keras inference: (x - mean) * rsqrt(var + eps) * gamma + beta, in float32
        inv = g.op("Div", [g.const(np.ones((), np.float32), "one"),
                           g.op("Sqrt", [g.op("Add", [g.const(_f32(var), base + ".moving_variance"),
                                                      g.const(np.float32(eps), "eps")], base)], base)], base)
        if gamma is not None:
            inv = g.op("Mul", [inv, g.const(_f32(gamma), base + ".gamma")], base)
        y = g.op("Mul", [g.op("Sub", [x, g.const(_f32(mean), base + ".moving_mean")], base), inv], base)
        if beta is not None:
            y = g.op("Add", [y, g.const(_f32(beta), base + ".beta")], base)
        return y
    if cls == "LayerNormalization":
        it = iter(ws)
        gamma = next(it) if conf.get("scale", True) else None
        beta = next(it) if conf.get("center", True) else None
        mu = g.op("ReduceMean", [x], base, axes=[-1], keepdims=1)
        d = g.op("Sub", [x, mu], base)
        var = g.op("ReduceMean", [g.op("Mul", [d, d], base)], base, axes=[-1], keepdims=1)
        y = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(conf.get("epsilon", 1e-3)), "eps")],
                                                base)], base)], base)
        if gamma is not None:
            y = g.op("Mul", [y, g.const(_f32(gamma), base + ".gamma")], base)
        if beta is not None:
            y = g.op("Add", [y, g.const(_f32(beta), base + ".beta")], base)
        return y
    if cls in ("ZeroPadding1D", "Cropping1D"):
        key = "padding" if cls == "ZeroPadding1D" else "cropping"
        p = conf.get(key, 1)
        a, b = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
        if cls == "ZeroPadding1D":
            return g.op("Pad", [x, g.const(_int64([0, a, 0, 0, b, 0]), "pads")], base)
        return g.op("Slice", [x, g.const(_int64([a]), "s"), g.const(_int64([-b if b else 2 ** 62]), "e"),
                              g.const(_int64([1]), "a")], base)
    if cls == "Conv2D":
        return _conv2d(g, x, node)
    if cls in ("MaxPooling2D", "AveragePooling2D"):
        return _pool2d(g, x, node)
    if cls in ("GlobalMaxPooling2D", "GlobalAveragePooling2D"):
        return g.op("ReduceMax" if cls == "GlobalMaxPooling2D" else "ReduceMean", [x], base, axes=[1, 2],
                    keepdims=1 if conf.get("keepdims") else 0)
    keras_graph.refuse(node.path, cls, "no ONNX builder")  # pragma: no cover - LAYERS and this list agree


def input_dtype(graph: keras_graph.Graph, name: str) -> str:
    """The ONNX input dtype of model input ``name``: ``int32`` when it feeds an Embedding, else ``float32``."""
    spec = next(i for i in graph.inputs if i[0] == name)
    return "int32" if spec[3] is not None else "float32"


def carried(graph: keras_graph.Graph) -> list[str]:
    """The recurrent layer calls whose states the write option ``states`` carries: every unidirectional one that
    does not take its initial state from the model.

    Raises:
        UnsupportedError: a Bidirectional or go_backwards layer (its run starts at the sequence's end: a chunk
            cannot hand its state to the next), naming it."""
    return [n.name for n in keras_graph.streamed(graph, "graph")]


def build(graph: keras_graph.Graph, mask_layout: str = "any", runtime: str | None = None, states: bool = False):
    """The ``onnx.ModelProto`` of ``graph`` (module docstring); deterministic; checked by ``onnx.checker``.
    ``mask_layout``: ``'any'`` (default) builds a mask reaching a recurrent layer exactly for any padding
    (:mod:`.masks`); ``'end'`` passes it as ``sequence_lens`` alone (exact only when every sequence's padding is
    at its end; a smaller graph). ``runtime``: the profile of the recurrent nodes (:mod:`.profiles`; ``None``:
    onnxruntime's, native nodes). ``states``: every unidirectional recurrent layer call (:func:`carried`) takes its
    initial states as graph inputs ``state_in:<call>:h`` (``:c``) ``(batch, units)`` float32 and gives its final
    states as outputs ``state_out:<call>:h`` (``:c``), so a sequence runs in chunks (issue #41).

    Raises:
        OptionError: another ``mask_layout`` (:func:`_layout`) or ``runtime`` (:func:`.profiles.profile`)."""
    _layout(mask_layout)
    prof = profiles.profile(runtime)
    onnx = require("onnx", "onnx")
    from onnx import TensorProto, helper, numpy_helper

    g = _G(helper, numpy_helper, TensorProto)
    g.profile = prof
    if states:
        g.carried = set(carried(graph))
    env: dict[str, str] = {}
    made: dict[str, str] = {}
    ins = []
    axes = time_axis.analyse(graph)
    timed = 0
    for name, shape, _, emb in graph.inputs:
        # each sequence input's time axis its own name (cross-attention: two inputs of different lengths)
        tname = "time" if timed == 0 else f"time_{timed}"
        dims = ["batch"] + [d if d is not None else (tname if i == 0 else f"d{i}") for i, d in enumerate(shape)]
        if name in axes and axes[name].free:  # issue #41: any length the layers allow (:mod:`time_axis`)
            dims[1] = tname
        timed += dims[1] == tname
        ins.append(helper.make_tensor_value_info(name, TensorProto.INT32 if emb is not None else TensorProto.FLOAT,
                                                 dims))
        env[name] = name
    layer_outs = []
    for node in graph.nodes:
        mask = node.masks[0] if node.masks else None
        lens = cp = None
        if mask is not None and (node.cls in keras_graph.RECURRENT or node.cls == "Bidirectional"
                                 or node.cls == "GlobalAveragePooling1D"):
            lens = _lens(g, mask, graph.masks, made, env)
            if mask_layout == "any" and node.cls != "GlobalAveragePooling1D":
                cp = mask_forms.compaction(g, made[mask], lens, made, mask)
        if node.cls in keras_graph.ATTENTION:  # the query's and the value's masks (issue #41)
            y = attention_onnx.build(g, node, [env[i] for i in node.inputs], [
                _bool_mask(g, m, graph.masks, made, env) if m is not None else None for m in node.masks[:2]])
        elif node.cls in keras_graph.MHA:  # the query's, the value's and the key's masks (issue #41)
            y = attention_onnx.build_mha(g, node, [env[i] for i in node.inputs], [
                _bool_mask(g, m, graph.masks, made, env) if m is not None else None for m in node.masks[:3]])
        else:
            y = _layer(g, node, [env[i] for i in node.inputs], lens, made.get(mask) if mask else None, cp)
        if node.cls in POOL1D and node.config.get("keepdims"):  # tf_keras: (B, 1, F)
            y = g.op("Unsqueeze", [y, g.const(_int64([1]), "ax")], node.name)
        if isinstance(y, list):  # return_state: the states are further outputs of the call
            for t, v in zip(node.outputs[1:], y[1:]):
                env[t] = v
            y = y[0]
        out = f"layer:{node.name}"
        g.nodes.append(helper.make_node("Identity", [y], [out], name=f"{node.name}__out"))
        env[node.outputs[0]] = out
        layer_outs.append(out)
    outs = []
    for i, t in enumerate(graph.outputs):
        g.nodes.append(helper.make_node("Identity", [env[t]], [f"output_{i}"], name=f"output_{i}"))
        outs.append(f"output_{i}")
    outs += layer_outs
    ins += [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["batch", h]) for t, h in g.state_ins]
    for name, t, _ in g.state_outs:
        g.nodes.append(helper.make_node("Identity", [t], [name], name=name))
    gp = helper.make_graph(g.nodes, graph.name, ins, [], initializer=g.inits)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(
        gp, opset_imports=[helper.make_opsetid("", onnx_write.OPSET)], ir_version=onnx_write.IR_VERSION))
    known = {v.name: v for v in inferred.graph.value_info}
    for o in outs:  # the outputs with the types and (symbolic) shapes ONNX shape inference gives them
        gp.output.append(known[o] if o in known and known[o].type.tensor_type.HasField("shape")
                         else helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", None, None][:1]))
    gp.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", h])
                     for name, _, h in g.state_outs)
    model = helper.make_model(gp, opset_imports=[helper.make_opsetid("", onnx_write.OPSET)],
                              producer_name="rnnconvert", ir_version=onnx_write.IR_VERSION)
    meta = {"whole": True, "model": graph.name, "inputs": [i[0] for i in graph.inputs],
            "mask_layout": mask_layout, "runtime": prof.name, "scans": g.scans, "native_nodes": g.native,
            "state_inputs": [t for t, _ in g.state_ins], "state_outputs": [t for t, _, _ in g.state_outs],
            "time_axis": {n: a.meta() for n, a in axes.items()},
            "outputs": [f"output_{i}" for i in range(len(graph.outputs))],
            "layers": [{"name": n.layer.name, "nodes": [n.layer.name], "whole_node": n.name, "source_class": n.cls,
                        "go_backwards": bool(n.layer.semantics.go_backwards), "merge_mode": n.layer.semantics.merge_mode,
                        "return_sequences": n.layer.return_sequences}
                       for n in graph.nodes if n.layer is not None and n.name == n.path]}
    helper.set_model_props(model, {META_KEY: json.dumps(meta, sort_keys=True)})
    onnx.checker.check_model(model)
    return model


def notes(graph: keras_graph.Graph, mask_layout: str = "any", runtime: str | None = None) -> list[str]:
    """What the written graph says about itself (how masks reach recurrent layers, inputs' dtypes, the time axis,
    the runtime profile's decompositions or the runtimes known to reject the default graph's nodes)."""
    out = [f"whole model written: {len(graph.nodes)} layer call(s) in one ONNX graph; inputs "
           + ", ".join(f"'{n}' ({'int32 token ids' if e is not None else 'float32'})" for n, _, _, e in graph.inputs)
           + f"; outputs {', '.join(f'output_{i}' for i in range(len(graph.outputs)))} (each layer's output as "
           "'layer:<name>')"]
    out += time_axis.notes(time_axis.analyse(graph))
    prof = profiles.profile(runtime)
    acts = {n.name: onnx_write.rnn_activations(n.layer)[0] for n in graph.nodes if n.layer is not None}
    done = [n.name for n in graph.nodes if n.layer is not None and not profiles.native(
        prof, acts[n.name], onnx_write.OP[n.layer.cell], bool(n.masks and n.masks[0]))]
    masked = [n.name for n in graph.nodes if n.layer is not None and n.masks and n.masks[0]]
    out += profiles.notes(prof, acts, done, masked)
    if any(n.masks and n.masks[0] and (n.cls in keras_graph.RECURRENT or n.cls == "Bidirectional")
           for n in graph.nodes):
        if mask_layout == "end":
            out.append("mask_layout='end': masks reach recurrent layers as ONNX sequence_lens alone (the count of "
                       "unmasked steps): exact only when each sequence's padding is at its end; a mask with gaps or "
                       "leading padding (Keras pad_sequences' default) computes otherwise in this graph")
        else:
            out.append("masks reach recurrent layers exactly for any padding (front, end, inside): each sequence's "
                       "unmasked steps are moved to the front, run with ONNX sequence_lens and put back; "
                       "mask_layout='end' (CLI --mask-layout end) writes a smaller graph when all padding is at "
                       "the end")
    return out


def whole_graph(ckpt, whole_model: Any, recurrent_only: bool = False) -> keras_graph.Graph | None:
    """The :class:`~rnnconvert.whole.conventions.keras_graph.Graph` of ``whole_model`` (the engine's write option: a Keras
    full model's ``config`` and ``weights``), or ``None`` without one or under ``recurrent_only``."""
    if whole_model is None or recurrent_only:
        return None
    return keras_graph.build(whole_model.config, whole_model.weights, ckpt)


def _layout(mask_layout: Any) -> str:
    """The write option ``mask_layout`` checked: ``'any'`` (default) or ``'end'``.

    Raises:
        OptionError: another value (one line naming the valid ones; exit 2)."""
    if mask_layout not in mask_forms.LAYOUTS:
        raise OptionError(f"write option mask_layout is 'any' (default: any padding exact) or 'end' (padding at the "
                          f"end only, a smaller graph), got {mask_layout!r}")
    return mask_layout


def check(ckpt, *, recurrent_only: bool = False, whole_model: Any = None, mask_layout: str = "any",
          runtime: str | None = None, states: bool = False, **options: Any) -> list[str]:
    """The ``onnx`` container's check: the recurrent layers' refusals (:func:`.onnx_write.check`), then, for a
    whole model, every layer (refused by name when it is not built) and the notes of :func:`notes`.

    Raises:
        UnsupportedError: as :func:`.onnx_write.check`; a layer outside
            :data:`rnnconvert.whole.conventions.keras_graph.LAYERS` or a feature not built (layer, class, way out).
    """
    _layout(mask_layout)
    profiles.profile(runtime)
    out = onnx_write.check(ckpt, recurrent_only=recurrent_only, **options)
    graph = whole_graph(ckpt, whole_model, recurrent_only)
    if graph is None:
        if ckpt.format == "keras_h5" and not recurrent_only:
            out.insert(0, WEIGHTS_ONLY)
        return out
    keras_graph.from_config(build, graph, mask_layout, runtime, bool(states))  # the refusals raised while building
    out = notes(graph, mask_layout, runtime)
    if states:
        names = carried(graph)
        out.append(f"states: the initial states of {', '.join(repr(n) for n in names) or 'no layer'} are graph inputs "
                   "'state_in:<layer>:h' (and ':c'), (batch, units) float32 (zeros for a first chunk), their final "
                   "states outputs 'state_out:<layer>:h' (':c'): feed a chunk's outputs to the next chunk's inputs")
    return out


def write(ckpt, path, *, recurrent_only: bool = False, whole_model: Any = None, mask_layout: str = "any",
          runtime: str | None = None, states: bool = False, **options: Any) -> list[str]:
    """The ``onnx`` container's write: a whole model (``whole_model``, not ``recurrent_only``) as one graph
    (:func:`build`, masks as ``mask_layout`` says), else the recurrent layers (:func:`.onnx_write.write`). One line
    says how to run it. Assumes :func:`check` passed."""
    graph = whole_graph(ckpt, whole_model, recurrent_only)
    if graph is None:
        return onnx_write.write(ckpt, path, **options)
    onnx = require("onnx", "onnx")
    onnx.save_model(build(graph, _layout(mask_layout), runtime, bool(states)), str(path))
    return [f"whole model '{graph.name}': onnxruntime.InferenceSession(path).run(['output_0'], "
            f"{{{', '.join(repr(i[0]) + ': ...' for i in graph.inputs)}}})"]
