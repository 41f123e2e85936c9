"""``.pt2``: a whole Keras model, or the recurrent layers of any checkpoint, as a ``torch.export`` program (issue #30).

Output only: rnnconvert never reads a ``.pt2`` (``torch.export.load`` unpickles; a crafted file runs code). Users
load what we write with ``torch.export.load(path).module()`` -- only files they trust, as for any pickle.

The program is ``WholeModule`` (a class :func:`build_module` defines) exported by ``torch.export.export`` with the batch (and a free time)
dimension dynamic; the recurrent layers are exact modules of their own (no ``nn.LSTM``/``nn.GRU``): each
direction a ``torch._higher_order_ops.scan`` over time of the canonical equations of
:mod:`rnnconvert.core.reference` (gate order i f g o / r z n from :data:`rnnconvert.core.gates.TABLE`; any
gate activation and activation of :data:`ACTS`, Keras 2 ``hard_sigmoid`` = ``clip(0.2 x + 0.5, 0, 1)``,
reset-before and reset-after GRU, peepholes, TF1 cell and projection clips, forget bias), so ``.pt2`` refuses
no recurrent layer that ``.onnx`` carries. Keras masks are followed step by step, whatever their shape (a
masked step keeps the state; a unidirectional layer's output there is the previous output, a Bidirectional's
zero, as tf_keras computes); ``return_state`` outputs are the scan's final carries, ``initial_state`` inputs its
first (:mod:`rnnconvert.whole.conventions.keras_graph` "States"). Other layers follow :mod:`rnnconvert.whole.formats.onnx.model_write` (the same
:class:`rnnconvert.whole.conventions.keras_graph.Graph`). Inputs: int32 token ids for an input feeding
an Embedding, float32 otherwise, positional in the model's input order; outputs: a tuple of the model outputs.
Convolutions and pools pad as TensorFlow does (:func:`tf_same_pads`, from the length the program is given);
a program whose strided layers shrink a free time axis runs the lengths at which no layer's time axis is one
step (``torch.export`` specializes sizes of 1; :func:`_example_steps`).

A source without a whole model (weights-only files, other formats) gives a program with one input and one
output per recurrent layer (``(B, T, I)`` -> ``(B, T, dirs*H)``, directions concatenated forward first), the
layers' own semantics as :func:`rnnconvert.core.reference.forward` computes them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...conventions import keras_graph
from ....core.gates import CANONICAL, gate_slice
from ....core.model import Cell, Checkpoint, RNNLayer
from ....errors import RNNConvertError, UnsupportedError, require

ROUTE = "torch.export"
#: activations the recurrent modules compute (our names, :data:`rnnconvert.core.reference.ACT`)
ACTS = ("sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "hard_sigmoid_k3", "softsign")


def _act(torch, name: str | None):
    F = torch.nn.functional
    return {None: lambda x: x, "linear": lambda x: x, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
            "relu": torch.relu, "softsign": F.softsign, "softplus": F.softplus, "elu": F.elu, "selu": torch.selu,
            "exponential": torch.exp, "softmax": lambda x: torch.softmax(x, dim=-1),
            "hard_sigmoid": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0),
            "hard_sigmoid_k3": lambda x: torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)}[name]


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def refusals(layer: RNNLayer) -> list[str]:
    """What the ``.pt2`` recurrent module cannot compute (an activation outside :data:`ACTS`)."""
    s = layer.semantics
    return [f"activation '{a}' is not built" for a in (s.gate_activation, s.activation) if a not in ACTS]


def _module_class():
    torch = require("torch", "torch")
    from torch._higher_order_ops.scan import scan

    class Recurrent(torch.nn.Module):
        """One canonical recurrent layer (every stacked layer, every direction) in exact equations."""

        def __init__(self, layer: RNNLayer):
            super().__init__()
            self.cell, self.H, self.sem = layer.cell, layer.hidden_size, layer.semantics
            self.D, self.L = layer.num_directions, layer.num_layers
            self.proj = bool(layer.proj_size)
            for k, dirs in enumerate(layer.params):
                for d, p in enumerate(dirs):
                    for key, a in p.arrays().items():
                        if a is not None:
                            self.register_buffer(f"l{k}_d{d}_{key}", torch.from_numpy(np.array(a, np.float32)))
            self.keys = {(k, d): set(p.arrays()) for k, dirs in enumerate(layer.params) for d, p in enumerate(dirs)}

        def p(self, k, d, key):
            return getattr(self, f"l{k}_d{d}_{key}", None)

        def direction(self, x, mask, k: int, d: int, reverse: bool, zero_masked: bool, init=None):
            gact, act = _act(torch, self.sem.gate_activation), _act(torch, self.sem.activation)
            H, cell, s = self.H, self.cell, self.sem
            w_hh, b_hh = self.p(k, d, "w_hh"), self.p(k, d, "b_hh")
            b_ih, peep, w_hr = self.p(k, d, "b_ih"), self.p(k, d, "peep"), self.p(k, d, "w_hr")
            if reverse:
                x = x.flip(1)
                mask = mask.flip(1) if mask is not None else None
            xin = x @ self.p(k, d, "w_ih").t()
            if b_ih is not None:
                xin = xin + b_ih
            B = x.shape[0]
            out_size = w_hr.shape[0] if w_hr is not None else H
            h0 = init[0] if init else x.new_zeros(B, out_size)  # Keras initial_state [h, c] / [h]
            c0 = init[1] if init and len(init) > 1 else x.new_zeros(B, H)
            m = (mask if mask is not None else torch.ones_like(x[..., 0], dtype=torch.bool)).unsqueeze(-1)
            sl = {g: gate_slice(cell, g, H) for g in CANONICAL[cell]}

            def rec(h):
                r = h @ w_hh.t()
                return r + b_hh if b_hh is not None else r

            def stepf(carry, inp):
                h, c = carry
                xt, mt = inp
                if cell is Cell.LSTM:
                    zz = xt + rec(h)
                    zi, zf, zg, zo = (zz[:, sl[g]] for g in "ifgo")
                    if peep is not None:
                        zi = zi + peep[0] * c
                        zf = zf + peep[1] * c
                    c1 = gact(zf + s.forget_bias) * c + gact(zi) * act(zg)
                    if s.cell_clip is not None:
                        c1 = torch.clamp(c1, -s.cell_clip, s.cell_clip)
                    if peep is not None:
                        zo = zo + peep[2] * c1
                    h1 = gact(zo) * act(c1)
                    if w_hr is not None:
                        h1 = h1 @ w_hr.t()
                        if s.proj_clip is not None:
                            h1 = torch.clamp(h1, -s.proj_clip, s.proj_clip)
                elif cell is Cell.GRU:
                    hr = rec(h)
                    r = gact(xt[:, sl["r"]] + hr[:, sl["r"]])
                    z = gact(xt[:, sl["z"]] + hr[:, sl["z"]])
                    if s.reset_after:
                        n = act(xt[:, sl["n"]] + r * hr[:, sl["n"]])
                    else:
                        rh = (r * h) @ w_hh[sl["n"]].t()
                        if b_hh is not None:
                            rh = rh + b_hh[sl["n"]]
                        n = act(xt[:, sl["n"]] + rh)
                    h1 = (1.0 - z) * n + z * h
                    c1 = c
                else:
                    h1 = act(xt + rec(h))
                    c1 = c
                hk = torch.where(mt, h1, h)
                ck = torch.where(mt, c1, c)
                y = torch.where(mt, h1, torch.zeros_like(h1)) if zero_masked else hk.clone()
                return (hk, ck), y

            (hT, cT), ys = scan(stepf, (h0, c0), (xin.transpose(0, 1), m.transpose(0, 1)))
            ys = ys.transpose(0, 1)
            return ys, hT, cT

        def forward(self, x, mask=None, sequences: bool = True, processing_order: bool = True, init=None,
                    states: bool = False):
            """``x`` (B, T, I); returns (B, T, D*out) (``sequences``) or the final states (B, D*out); ``init``: Keras'
            ``initial_state`` tensors; ``states``: ``[output, h, c]`` (Keras ``return_state``)."""
            for k in range(self.L):
                reverse = self.sem.go_backwards and self.D == 1
                outs, lasts = [], []
                for d in range(self.D):
                    ys, hT, cT = self.direction(x, mask, k, d, reverse or d == 1, self.D == 2, init)
                    if d == 1 or (reverse and not processing_order):
                        ys = ys.flip(1)
                    outs.append(ys)
                    lasts.append(hT)
                x = torch.cat(outs, -1) if self.D == 2 else outs[0]
            y = x if sequences else (torch.cat(lasts, -1) if self.D == 2 else lasts[0])
            return [y, hT, cT] if states else y  # return_state: one direction (keras_graph refuses two)

    return torch, Recurrent


def _f(torch, a) -> Any:
    return torch.from_numpy(np.array(a, np.float32))


def tf_same_pads(torch, length, k_eff: int, stride: int):
    """TensorFlow's ``SAME`` padding of one dimension (``tensorflow/core/framework/kernel_shape_util.cc``
    ``GetWindowedOutputSize``): ``total = max((ceil(L/s) - 1) * s + k_eff - L, 0)``, ``left = total // 2``, the odd
    one at the end; ``length`` an int or a ``torch.export`` symbolic size (then ``torch.sym_max``, no guard)."""
    total = ((length + stride - 1) // stride - 1) * stride + k_eff - length
    total = max(total, 0) if isinstance(total, int) else torch.sym_max(total, 0)
    left = total // 2
    return left, total - left


def _ints(v, n: int) -> list[int]:
    return [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)] * n


def conv_nd(torch, x, w, b, conf: dict, nd: int):
    """Keras ``Conv1D``/``Conv2D`` (channels_last ``x``; kernel ``(*k, in, out)`` as stored) with TensorFlow's
    padding: ``valid``, ``causal`` (1-D: ``(k-1)*d`` zeros before), ``same`` (:func:`tf_same_pads` on every spatial
    dimension, any stride); activation not applied. Returns channels_last."""
    F = torch.nn.functional
    ks, dil, st = list(w.shape[:nd]), _ints(conf.get("dilation_rate", 1), nd), _ints(conf.get("strides", 1), nd)
    pad = conf.get("padding", "valid")
    xc = x.movedim(-1, 1)  # (B, C, *spatial)
    if pad == "causal":
        xc = F.pad(xc, ((ks[0] - 1) * dil[0], 0))
    elif pad == "same":
        pads: list = []
        for i in reversed(range(nd)):  # F.pad lists the last dimension first
            pads += list(tf_same_pads(torch, xc.shape[2 + i], (ks[i] - 1) * dil[i] + 1, st[i]))
        xc = F.pad(xc, pads)
    wt = w.permute(*range(nd + 1, -1, -1)) if nd == 1 else w.permute(3, 2, 0, 1)  # (out, in, *k)
    conv = F.conv1d if nd == 1 else F.conv2d
    return conv(xc, wt, b, stride=st, dilation=dil).movedim(1, -1)


def pool_nd(torch, x, conf: dict, is_max: bool, nd: int):
    """Keras ``MaxPooling1D/2D`` / ``AveragePooling1D/2D`` (channels_last): ``valid`` as torch's pools (floor),
    ``same`` padded by :func:`tf_same_pads` first, with ``-inf`` for the max and, for the average, divided by the
    count of valid elements in each window (TensorFlow's ``avg_pool``). Returns channels_last."""
    F = torch.nn.functional
    size = _ints(conf.get("pool_size", 2), nd)
    st = _ints(conf.get("strides") or size, nd)
    xc = x.movedim(-1, 1)
    pads: list = []
    if conf.get("padding", "valid") == "same":
        for i in reversed(range(nd)):
            pads += list(tf_same_pads(torch, xc.shape[2 + i], size[i], st[i]))

    def windows(t):  # (B, C, *out, *size) by unfold: torch 2.13's pools specialize a dynamic length when exported
        for i in range(nd):
            t = t.unfold(2 + i, size[i], st[i])
        return t

    dims = tuple(range(-nd, 0))
    if is_max:
        y = windows(F.pad(xc, pads, value=float("-inf")) if pads else xc).amax(dims)
    elif pads:
        ones = F.pad(torch.ones_like(xc), pads)  # full size: no broadcast (export guards on sizes of 1)
        y = windows(F.pad(xc, pads)).sum(dims) / windows(ones).sum(dims)
    else:
        y = windows(xc).mean(dims)
    return y.movedim(1, -1)


def build_module(graph: keras_graph.Graph):
    """The ``torch.nn.Module`` computing ``graph`` (module docstring): ``forward(*inputs) -> tuple of outputs``;
    with ``module.record = True`` (eager runs), ``module.layer_outputs`` holds the last run's
    ``{layer name: output}``."""
    torch, Recurrent = _module_class()
    F = torch.nn.functional

    class WholeModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = graph
            self.rnns = torch.nn.ModuleDict()
            for i, node in enumerate(graph.nodes):
                if node.layer is not None:
                    if _safe(node.path) not in self.rnns:
                        self.rnns[_safe(node.path)] = Recurrent(node.layer)
                else:
                    for j, w in enumerate(node.weights):
                        name = f"w_{_safe(node.path)}_{j}"
                        if not hasattr(self, name):
                            self.register_buffer(name, _f(torch, w))
            self.layer_outputs: dict = {}
            self.record = False

        def w(self, node, j):
            return getattr(self, f"w_{_safe(node.path)}_{j}")

        def dense(self, node, x, conf):
            y = x @ self.w(node, 0)
            if conf.get("use_bias", True) and len(node.weights) > 1:
                y = y + self.w(node, 1)
            return _act(torch, conf.get("activation"))(y)

        def mask_of(self, name, env):
            kind = graph.masks[name]
            src = env[kind[1]]
            if kind[0] == "ids":
                return src != 0
            return (src != kind[2]).any(-1)

        def layer(self, node, xs, mask, env):
            cls, conf = node.cls, node.config
            x = xs[0]
            if cls in keras_graph.IDENTITY:
                return x
            if cls in keras_graph.RECURRENT or cls == "Bidirectional":
                inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
                seqs = bool(inner.get("return_sequences"))
                rnn = self.rnns[_safe(node.path)]
                merge = node.layer.semantics.merge_mode if node.layer.bidirectional else "concat"
                if merge not in ("concat", "sum", "ave", "mul"):
                    keras_graph.refuse(node.path, cls, f"merge_mode={merge!r} (several outputs) is not built")
                if len(xs) > 1 or len(node.outputs) > 1:  # initial_state / return_state (unidirectional)
                    y, h, c = rnn(x, mask, seqs, init=xs[1:], states=True)
                    return [y, h, c][:len(node.outputs)]
                y = rnn(x, mask, seqs)
                if merge != "concat":
                    a, b = y[..., :rnn.H], y[..., rnn.H:]
                    y = a + b if merge == "sum" else (a * b if merge == "mul" else (a + b) / 2)
                return y
            if cls == "Embedding":
                return F.embedding(x.long(), self.w(node, 0))
            if cls == "Masking":
                return x * (x != float(conf.get("mask_value", 0.0))).any(-1, keepdim=True).to(x.dtype)
            if cls == "Dense":
                return self.dense(node, x, conf)
            if cls == "TimeDistributed":
                icls, iconf = node.inner
                if icls == "Dense":
                    return self.dense(node, x, iconf)
                return _act(torch, iconf.get("activation")) (x) if icls == "Activation" else x
            if cls == "Activation":
                return _act(torch, conf.get("activation"))(x)
            if cls == "ReLU":
                return torch.relu(x)
            if cls == "LeakyReLU":
                return F.leaky_relu(x, float(conf.get("alpha", 0.3)))
            if cls == "ELU":
                return F.elu(x, float(conf.get("alpha", 1.0)))
            if cls == "Softmax":
                return torch.softmax(x, -1)
            if cls == "Conv1D":
                k = int(node.weights[0].shape[0])
                dil = conf.get("dilation_rate", 1)
                dil = int(dil[0] if isinstance(dil, (list, tuple)) else dil)
                st = conf.get("strides", 1)
                st = int(st[0] if isinstance(st, (list, tuple)) else st)
                pad = conf.get("padding", "valid")
                xc = x.transpose(1, 2)
                if pad == "causal":
                    xc = F.pad(xc, ((k - 1) * dil, 0))
                elif pad == "same":
                    if st != 1:  # TensorFlow's SAME at strides > 1: pads that depend on the length
                        b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                        return _act(torch, conf.get("activation"))(conv_nd(torch, x, self.w(node, 0), b, conf, 1))
                    tot = (k - 1) * dil
                    xc = F.pad(xc, (tot // 2, tot - tot // 2))
                wt = self.w(node, 0).permute(2, 1, 0)
                b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                y = F.conv1d(xc, wt, b, stride=st, dilation=dil).transpose(1, 2)
                return _act(torch, conf.get("activation"))(y)
            if cls in ("MaxPooling1D", "AveragePooling1D"):
                size = conf.get("pool_size", 2)
                size = int(size[0] if isinstance(size, (list, tuple)) else size)
                st = conf.get("strides") or size
                st = int(st[0] if isinstance(st, (list, tuple)) else st)
                if conf.get("padding", "valid") != "valid":  # TensorFlow's SAME pooling
                    return pool_nd(torch, x, conf, cls == "MaxPooling1D", 1)
                fn = F.max_pool1d if cls == "MaxPooling1D" else F.avg_pool1d
                return fn(x.transpose(1, 2), size, st).transpose(1, 2)
            if cls == "GlobalMaxPooling1D":
                return x.amax(1)
            if cls == "GlobalAveragePooling1D":
                if mask is None:
                    return x.mean(1)
                m = mask.to(x.dtype).unsqueeze(-1)
                return (x * m).sum(1) / m.sum(1)
            if cls == "Flatten":
                return x.flatten(1)
            if cls == "Reshape":
                return x.reshape([x.shape[0]] + [int(d) for d in conf["target_shape"]])
            if cls == "Permute":
                return x.permute([0] + [int(d) for d in conf["dims"]])
            if cls == "RepeatVector":
                return x.unsqueeze(1).expand(-1, int(conf["n"]), -1)
            if cls == "Concatenate":
                return torch.cat(xs, int(conf.get("axis", -1)))
            if cls in ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"):
                y = xs[0]
                for z in xs[1:]:
                    y = {"Add": torch.add, "Subtract": torch.sub, "Multiply": torch.mul, "Average": torch.add,
                         "Maximum": torch.maximum, "Minimum": torch.minimum}[cls](y, z)
                return y / len(xs) if cls == "Average" else y
            if cls in ("BatchNormalization", "LayerNormalization"):
                j = 0  # axis: the last (keras_graph checked it)
                gamma = beta = None
                if conf.get("scale", True):
                    gamma, j = self.w(node, j), j + 1
                if conf.get("center", True):
                    beta, j = self.w(node, j), j + 1
                eps = float(conf.get("epsilon", 1e-3))
                if cls == "BatchNormalization":
                    mean, var = self.w(node, j), self.w(node, j + 1)
                else:
                    mean = x.mean(-1, keepdim=True)
                    var = ((x - mean) ** 2).mean(-1, keepdim=True)
                y = (x - mean) / torch.sqrt(var + eps)
                if gamma is not None:
                    y = y * gamma
                return y + beta if beta is not None else y
            if cls in ("ZeroPadding1D", "Cropping1D"):
                key = "padding" if cls == "ZeroPadding1D" else "cropping"
                p = conf.get(key, 1)
                a, b = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
                if cls == "ZeroPadding1D":
                    return F.pad(x, (0, 0, a, b))
                return x[:, a:x.shape[1] - b]
            if cls == "Conv2D":
                if int(conf.get("groups", 1) or 1) != 1:
                    keras_graph.refuse(node.path, cls, "grouped convolution")
                b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                return _act(torch, conf.get("activation"))(conv_nd(torch, x, self.w(node, 0), b, conf, 2))
            if cls in ("MaxPooling2D", "AveragePooling2D"):
                return pool_nd(torch, x, conf, cls == "MaxPooling2D", 2)
            if cls in ("GlobalMaxPooling2D", "GlobalAveragePooling2D"):
                keep = bool(conf.get("keepdims"))
                return x.amax((1, 2), keepdim=keep) if cls == "GlobalMaxPooling2D" else x.mean((1, 2), keepdim=keep)
            keras_graph.refuse(node.path, cls, "no torch builder")  # pragma: no cover

        def forward(self, *inputs):
            env = {name: t for (name, *_), t in zip(graph.inputs, inputs)}
            masks: dict = {}
            for node in graph.nodes:
                mname = node.masks[0] if node.masks else None
                mask = None
                if mname is not None:
                    if mname not in masks:
                        masks[mname] = self.mask_of(mname, env)
                    mask = masks[mname]
                y = self.layer(node, [env[i] for i in node.inputs], mask, env)
                if isinstance(y, list):  # return_state: [output, h(, c)]
                    env.update(zip(node.outputs[1:], y[1:]))
                    y = y[0]
                env[node.outputs[0]] = y
                if self.record:  # eager runs only (never while exporting)
                    self.layer_outputs[node.name] = y
            return tuple(env[o] for o in graph.outputs)

    return WholeModule()


def run_float64(graph: keras_graph.Graph, xs: dict[str, np.ndarray], double: bool = True) -> tuple[list, dict]:
    """``graph`` run eagerly in float64 (weights widened exactly; ``double=False``: in float32, the same module)
    on ``xs`` (by input name): ``(outputs, {layer name: output})`` as numpy arrays; the second stage of the
    whole-model check measures the model's own float32 drift on the batch with the two."""
    torch = require("torch", "torch")
    m = build_module(graph).double() if double else build_module(graph)
    m.record = True
    fl = np.float64 if double else np.float32
    args = [torch.from_numpy(np.asarray(xs[n]).astype(fl if e is None else np.int64))
            for n, _, _, e in graph.inputs]
    with torch.no_grad():
        outs = m(*args)
    return ([o.numpy() for o in outs], {k: v.numpy() for k, v in m.layer_outputs.items()})


def _recurrent_graph(ckpt: Checkpoint) -> keras_graph.Graph:
    """A graph of the recurrent layers alone (one input ``<name>__in`` and output per layer)."""
    nodes, inputs = [], []
    for layer in ckpt.layers:
        inputs.append((f"{layer.name}__in", (None, layer.input_size), "float32", None))
        conf = {"return_sequences": True} if not layer.bidirectional else {"layer": {"config": {"return_sequences": True}}}
        nodes.append(keras_graph.Node(layer.name, layer.name, "Bidirectional" if layer.bidirectional else "LSTM",
                                      conf, [f"{layer.name}__in"], [f"{layer.name}:0"], [None], layer=layer))
    return keras_graph.Graph("rnnconvert", inputs, nodes, [n.outputs[0] for n in nodes])


def check(ckpt: Checkpoint, *, recurrent_only: bool = False, whole_model: Any = None, **_: Any) -> list[str]:
    """Refuse what the program cannot compute (:func:`refusals`; a whole model's layers outside the whitelist, by
    name); return notes.

    Raises:
        UnsupportedError: one line naming the layer, the feature and the way out.
    """
    from ....engine import refusal

    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "pt2", "a torch.export recurrent module")
    if recurrent_only:
        ckpt.meta["pt2_recurrent_only"] = True  # read by the torch_export runtime's verify_whole
    if whole_model is None or recurrent_only:
        why = (["weights-only Keras file: it holds no architecture, so only the recurrent layers are written"]
               if ckpt.format == "keras_h5" and not recurrent_only else [])
        return why + ["a torch.export program of the recurrent layers: one input '<layer>__in' (B, T, I) and one output "
                "per layer, positional in layer order"]
    graph = keras_graph.build(whole_model.config, whole_model.weights, ckpt)
    keras_graph.from_config(build_module, graph)
    notes = [f"whole model written: {len(graph.nodes)} layer call(s) in one torch.export program; inputs "
             + ", ".join(f"'{n}' ({'token ids' if e is not None else 'float32'})" for n, _, _, e in graph.inputs)
             + "; recurrent layers as exact scan modules (masks followed step by step)"]
    steps = program_steps(graph)
    if steps is not None:
        notes.append(f"strided layers shrink the free time axis: the program runs the lengths at which no layer's "
                     f"time axis shrinks to one step (torch.export specializes sizes of 1; exported and verified "
                     f"at {steps} steps)")
    return notes


def graph_of(ckpt: Checkpoint, whole_model: Any, recurrent_only: bool) -> keras_graph.Graph:
    """The graph ``.pt2`` writes: the whole model, or the recurrent layers alone."""
    if whole_model is None or recurrent_only:
        return _recurrent_graph(ckpt)
    return keras_graph.build(whole_model.config, whole_model.weights, ckpt)


#: strided / pooling layers: the time axis shrinks, so the example length of :func:`export` is chosen with care
SHRINKING = {"Conv1D", "Conv2D", "MaxPooling1D", "AveragePooling1D", "MaxPooling2D", "AveragePooling2D"}


def shrinks_time(graph: keras_graph.Graph) -> bool:
    """Whether ``graph`` has a free dimension that strided or pooling layers shrink (see :func:`_example_steps`)."""
    free = any(d is None for _, shape, _, _ in graph.inputs for d in shape)
    return free and any(n.cls in SHRINKING and (n.config.get("strides") not in (None, 1, [1], [1, 1])
                                                or "Pooling" in n.cls) for n in graph.nodes)


def program_steps(graph: keras_graph.Graph) -> int | None:
    """The example length the program of ``graph`` is exported at when strided layers shrink its free time axis
    (verification's generated inputs use it: the program runs the lengths at which no time-derived size is 1),
    else ``None``."""
    return _example_steps(graph, build_module(graph)) if shrinks_time(graph) else None


def _example_steps(graph: keras_graph.Graph, module) -> int:
    """The example length of free dimensions for ``torch.export``: 13, or, when strided layers shrink the time axis
    to one step at that length, a longer one (61, 253) with which no time-derived size is 1 (``torch.export``
    specializes sizes of 0 and 1: the program would then run that length only). Found by running ``module``
    eagerly at ``T`` and ``2T + 1``: a size that differs is time-derived."""
    torch = require("torch", "torch")
    if not shrinks_time(graph):
        return 13

    def shapes(steps):
        args = [torch.ones([2] + [steps if d is None else int(d) for d in shape],
                           dtype=torch.int32 if emb is not None else torch.float32)
                for _, shape, _, emb in graph.inputs]
        module.record = True
        with torch.no_grad():
            module(*args)
        module.record = False
        return {k: tuple(v.shape) for k, v in module.layer_outputs.items()}

    for steps in (13, 61, 253):
        a, b = shapes(steps), shapes(2 * steps + 1)
        if not any(x == 1 and x != y for k in a for x, y in zip(a[k], b.get(k, a[k]))):
            return steps
    return 253


def export(graph: keras_graph.Graph):
    """``torch.export.export`` of :func:`build_module` on example inputs (batch 2; a free time dimension 5),
    batch and free dimensions dynamic."""
    torch = require("torch", "torch")
    m = build_module(graph).eval()
    args, dyn = [], []
    steps = _example_steps(graph, m)
    for name, shape, _, emb in graph.inputs:
        dims = [2] + [steps if d is None else int(d) for d in shape]
        args.append(torch.ones(dims, dtype=torch.int32) if emb is not None else torch.zeros(dims))
        spec = {0: torch.export.Dim.DYNAMIC}
        spec.update({i + 1: torch.export.Dim.DYNAMIC for i, d in enumerate(shape) if d is None})
        dyn.append(spec)
    torch._dynamo.reset()  # a scan traced for an earlier program (a fixed time length) must not be reused
    with torch.no_grad():
        return torch.export.export(m, tuple(args), dynamic_shapes=(tuple(dyn),))


def write(ckpt: Checkpoint, path, *, recurrent_only: bool = False, whole_model: Any = None, **_: Any) -> list[str]:
    """Write the ``torch.export`` program (module docstring) to ``path``; one line says how to load it.
    Assumes :func:`check` passed."""
    torch = require("torch", "torch")
    graph = graph_of(ckpt, whole_model, recurrent_only)
    try:
        ep = export(graph)
        with open(path, "wb") as fh:
            torch.export.save(ep, fh)
    except (RNNConvertError, OSError):  # an OSError is the output's (a full disk): the engine reports it
        raise
    except Exception as exc:  # noqa: BLE001 - tracing a module built from an untrusted config: one line, not a trace
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UnsupportedError(f"'{graph.name}': torch.export could not trace or save the program built from this "
                               f"model's config ({type(exc).__name__}: {first}); convert to .onnx, or "
                               "--recurrent-only") from exc
    ins = ", ".join(n for n, *_ in graph.inputs)
    return [f"'{graph.name}': torch.export.load(path).module()({ins}) -> tuple of {len(graph.outputs)} output(s) "
            "(load only files you trust: torch.export.load unpickles)"]
