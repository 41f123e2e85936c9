"""Which model inputs' time axis a whole-model graph may leave free (issue #41), from the layer graph alone.

A Keras model declared with a fixed length (``Input((1000, F))``) computes the same at any length as long as
no layer ties a weight or a shape to it: recurrent layers, ``Dense`` / ``TimeDistributed`` over features,
normalization over the last axis, convolutions and pooling (their output length is a function of the input's,
tf_keras ``utils/conv_utils.py`` ``conv_output_length``) all run at any length. What fixes it (the input keeps
its declared length, and the writer says which layer): ``Flatten``, ``Reshape`` or a ``Permute`` moving the time
axis (the following weights see ``time x features`` as one axis), an attention layer's (``MultiHeadAttention``'s)
scores fed to another
layer (their last axis is the value's time axis), a merge of time axes computed differently
(``Add`` of a pooled and an unpooled branch: equal only at some lengths), a 2-D layer on a sequence, any layer
not listed here. Convolutions and pooling set a shortest length (every output length at least 1):

- ``valid``: ``floor((L - d*(k-1) - 1) / s) + 1`` (pooling: ``d = 1``, ``k`` = pool size);
- ``same``: ``ceil(L / s)``; ``causal``: ``ceil(L / s)`` (tf_keras pads ``d*(k-1)`` before, then ``valid``);
- ``ZeroPadding1D((a, b))``: ``L + a + b``; ``Cropping1D((a, b))``: ``L - a - b``.

A strided layer makes no length impossible (the lengths floor or ceil as Keras' do); only the shortest one
matters. The inputs analysed are the sequences: rank 3 float inputs ``(batch, time, features)`` and rank 2 token
inputs feeding an ``Embedding`` ``(batch, time)``; other inputs keep their declared shape. Checked against
tf_keras at other lengths in ``tests/formats/whole_models/test_whole_free_axis.py``. A ``RepeatVector``'s output has a time
axis of its own (``n`` steps); merged with an input's, it fixes that input's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import keras_graph

#: layers that keep the time axis as it is (recurrent layers: with ``return_sequences``)
KEEP = set(keras_graph.IDENTITY) | {"Masking", "Dense", "TimeDistributed", "Activation", "ReLU", "LeakyReLU", "ELU",
                                    "Softmax", "BatchNormalization", "LayerNormalization", "Embedding",
                                    "Rescaling", "UnitNormalization"}
#: layers that end the time axis (their output has none)
END = {"GlobalMaxPooling1D", "GlobalAveragePooling1D"}
#: the time axis of a ``RepeatVector``'s output: its ``n`` steps, whatever the inputs' lengths (merged with an input's
#: time axis, it fixes that input's length)
REPEAT = ("#repeat", ())
#: the longest length searched for a shortest one (kernels and strides are small; bounded whatever the file says)
SEARCH = 1 << 16


@dataclass
class Axis:
    """One input's time axis: ``free`` (any length from ``min_length``), else fixed at ``length`` by
    ``fixed_by`` (a sentence naming the layer)."""

    input: str
    free: bool
    length: int | None
    min_length: int = 1
    fixed_by: str = ""

    def meta(self) -> dict[str, Any]:
        """The graph metadata entry (``metadata_props`` JSON ``time_axis``)."""
        if self.free:
            return {"free": True, "min_length": self.min_length, "declared": self.length}
        return {"free": False, "length": self.length, "fixed_by": self.fixed_by}


def _int(v, i: int = 0) -> int:
    return int(v[i] if isinstance(v, (list, tuple)) else v)


def _step(node: keras_graph.Node) -> tuple | None:
    """The length map of a 1-D convolution, pooling, padding, cropping or up-sampling layer, ``None`` for the
    others."""
    conf, cls = node.config, node.cls
    if cls == "Conv1D":
        k = int(node.weights[0].shape[0]) if node.weights else _int(conf.get("kernel_size", 1))
        return ("conv", k, _int(conf.get("strides", 1)), _int(conf.get("dilation_rate", 1)),
                conf.get("padding", "valid"))
    if cls in ("MaxPooling1D", "AveragePooling1D"):
        p = _int(conf.get("pool_size", 2))
        return ("conv", p, _int(conf.get("strides") or p), 1, conf.get("padding", "valid"))
    if cls in ("ZeroPadding1D", "Cropping1D"):
        v = conf.get("padding" if cls == "ZeroPadding1D" else "cropping", 1)
        a, b = (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
        return ("add", (a + b) if cls == "ZeroPadding1D" else -(a + b))
    if cls == "UpSampling1D":
        return ("mul", int(conf.get("size", 2)))
    return None


def length(n: int, chain: tuple) -> int | None:
    """The length after the layers of ``chain`` from an input of ``n`` steps, ``None`` where one is below 1."""
    for st in chain:
        if st[0] == "add":
            n = n + st[1]
        elif st[0] == "mul":
            n = n * st[1]
        else:
            _, k, s, d, pad = st
            n = -(-n // s) if pad in ("same", "causal") else (n - d * (k - 1) - 1) // s + 1
        if n < 1:
            return None
    return n


def analyse(graph: keras_graph.Graph) -> dict[str, Axis]:
    """Every sequence input's :class:`Axis` (module docstring), by input name."""
    track: dict[str, tuple[str, tuple] | None] = {}
    seq = {}
    for name, shape, _, emb in graph.inputs:
        if len(shape) == 2 or (len(shape) == 1 and emb is not None):
            seq[name] = shape[0]
            track[name] = (name, ())
        else:
            track[name] = None
    fixed: dict[str, str] = {}
    chains: dict[str, set] = {n: {()} for n in seq}

    def fix(t, why: str) -> None:
        if t is not None:
            fixed.setdefault(t[0], why)

    consumed = {i for n in graph.nodes for i in n.inputs}
    for node in graph.nodes:
        xs = [track.get(i) for i in node.inputs]
        x = xs[0] if xs else None
        cls, conf = node.cls, node.config
        who = f"layer '{node.path}' ({cls})"
        out = None
        if cls in keras_graph.RECURRENT or cls == "Bidirectional":
            inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
            out = x if inner.get("return_sequences") else None
        elif cls in KEEP:
            out = x
        elif cls in END:
            out = None
        elif cls in keras_graph.ATTENTION or cls in keras_graph.MHA:  # any Tq, Tv: the query's time axis
            out = x
            if len(node.outputs) > 1 and node.outputs[1] in consumed and len(xs) > 1:
                fix(xs[1], f"{who}: its scores (last axis: the value's time axis) feed another layer")
        elif cls == "EinsumDense" and "spec" in conf:  # keeps the time axis where it keeps its letter second
            xs_, _, os_ = conf["spec"]
            if len(xs_) > 1 and len(os_) > 1 and xs_[1] == os_[1]:
                out = x
            else:
                fix(x, f"{who}: its equation does not keep the time axis")
        elif cls == "PReLU":  # an alpha per step (shared_axes without the time axis) ties it
            out = x
            if node.weights and node.weights[0].ndim == 2 and node.weights[0].shape[0] != 1:
                fix(x, f"{who}: its alpha holds one row per step (shared_axes without axis 1)")
        elif cls == "RepeatVector":
            out = REPEAT
        elif _step(node) is not None:
            out = None if x is None else (x[0], x[1] + (_step(node),))
        elif cls in keras_graph.MERGE:
            got = {t for t in xs if t is not None}
            if len(got) > 1:
                for t in got:
                    fix(t, f"{who} merges time axes computed differently (equal at some lengths only)")
            out = next(iter(got)) if len(got) == 1 else None
        elif cls == "Permute" and [int(d) for d in conf.get("dims", [])] == [1, 2]:
            out = x
        else:  # Flatten, Reshape, Permute, 2-D layers, anything else on a sequence
            fix(x, f"{who} ties the following layers to the time axis' length")
            out = None
        for t in node.outputs:
            track[t] = out if t == node.outputs[0] else None
        if out is not None and out[0] in chains:
            chains[out[0]].add(out[1])
    result = {}
    for name, declared in seq.items():
        if name in fixed and declared is not None:
            result[name] = Axis(name, False, declared, fixed_by=fixed[name])
            continue
        top = declared if declared is not None else SEARCH
        m = next((n for n in range(1, top + 1) if all(length(n, c) is not None for c in chains[name])), top)
        result[name] = Axis(name, True, declared, min_length=m)
    return result


def notes(axes: dict[str, Axis]) -> list[str]:
    """One line per sequence input whose length is fixed or has a shortest value above 1."""
    out = []
    for a in axes.values():
        if not a.free:
            out.append(f"input '{a.input}': time axis fixed at its declared length {a.length}: {a.fixed_by}")
        elif a.min_length > 1:
            out.append(f"input '{a.input}': time axis free (declared {a.length}), at least {a.min_length} steps "
                       "(shorter ones leave a convolution or pooling no output step)")
    return out
