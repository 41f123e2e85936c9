"""The SOURCE side of the whole-model check in numpy (issue #39, speed): a Keras model's parsed graph
(:class:`rnnconvert.whole.conventions.keras_graph.Graph`, built from the file's config and weights) evaluated
from the stored weights, in float32 or float64, without importing TensorFlow or Keras.

What it computes is what the source framework computes at inference (tf_keras 2.21 / Keras 3.15 layer ``call``s;
each equation's source named where it is written): every layer the whole-model writers build
(docs/guides/whole-model.md §5), recurrent calls with ``initial_state`` and ``return_state`` included; a graph
holding anything else (a class added to the writers since, :data:`_COMPUTED`) raises :class:`Uncovered`
(:func:`uncovered` says so before running), and the check runs the source framework instead
(:mod:`rnnconvert.whole.verify.keras_whole_check`).

Recurrent layers run rnnconvert's canonical Keras equations on the file's own tensors
(:func:`rnnconvert.verify.keras_equations.direction_forward`), with Keras' masked-step semantics (tf_keras
``backend.rnn``): a masked step keeps the state; a unidirectional layer's output at a masked step is the previous
output (zeros before the first unmasked step), a ``Bidirectional`` one's is zero (``zero_output_for_mask``);
masked steps are removed by a stable compaction (the run over the unmasked steps in order has, at its step
``pos[t]``, the state the step-by-step run has at ``t``).

Two float32 evaluation orders (``order``): 0, the products as written (``x @ W``); 1, every product's
contraction summed in the reverse order (the inputs' last axis and the kernel's rows reversed; for CuDNN
kernels, stored as cuDNN's matrices, order 1 is order 0). The whole-model rule measures the source's float32
spread with the two against the float64 run (:func:`rnnconvert.verify.whole_rule.decide_whole`).

Oracle: tf_keras (and Keras 3 for ``.keras`` sources) on the framework-made fixtures,
``tests/formats/whole_models/test_whole_numpy_source.py``.
"""

from __future__ import annotations

import numpy as np

from ...core.model import Cell
from ...verify import keras_equations
from ..conventions import keras_graph



#: every class :func:`_layer` computes (recurrent calls aside); a class the writers add later is uncovered
_COMPUTED = (set(keras_graph.IDENTITY) | set(keras_graph.MERGE) | set(keras_graph.ATTENTION) | {
    "Embedding", "Masking", "Dense", "TimeDistributed", "Activation", "ReLU", "Softmax", "LeakyReLU", "ELU",
    "Conv1D", "Conv2D", "MaxPooling1D", "AveragePooling1D", "MaxPooling2D", "AveragePooling2D",
    "GlobalMaxPooling1D", "GlobalAveragePooling1D", "GlobalMaxPooling2D", "GlobalAveragePooling2D",
    "BatchNormalization", "LayerNormalization", "Flatten", "Reshape", "Permute", "RepeatVector", "ZeroPadding1D",
    "Cropping1D"})


class Uncovered(Exception):
    """A layer call the numpy evaluator does not compute (its message names it)."""


def uncovered(graph: keras_graph.Graph) -> str:
    """Why ``graph`` cannot be evaluated here ("" when every call can), naming the layer: a class outside
    :data:`_COMPUTED`, a Bidirectional merge other than concat/sum/ave/mul, a grouped convolution, a Softmax over
    another axis than the last, a recurrent layer without its raw Keras tensors (a Keras 3 archive's)."""
    for n in graph.nodes:
        if n.layer is not None:
            if n.layer.bidirectional and n.layer.semantics.merge_mode not in ("concat", "sum", "ave", "mul"):
                return f"layer '{n.path}' ({n.cls}) merge_mode {n.layer.semantics.merge_mode!r}"
            if not isinstance(n.layer.source, dict) or "raw" not in n.layer.source:
                return f"layer '{n.path}' ({n.cls}) has no raw Keras tensors"
        if n.cls == "Softmax" and n.config.get("axis", -1) not in (-1, [-1]):
            return f"layer '{n.path}' (Softmax) axis {n.config.get('axis')!r}"
        if n.cls in ("Conv1D", "Conv2D") and int(n.config.get("groups", 1) or 1) != 1:
            return f"layer '{n.path}' ({n.cls}) groups"
        if n.cls not in _COMPUTED and n.layer is None:
            return f"layer '{n.path}' ({n.cls})"
    return ""


def _softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


#: Keras built-in activations (tf_keras ``activations.py``; ``hard_sigmoid_k3``: Keras 3's, keras_graph)
ACT = {None: lambda x: x, "linear": lambda x: x, "relu": lambda x: np.maximum(x, 0),
       "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "softmax": _softmax,
       "softplus": lambda x: np.logaddexp(np.zeros((), x.dtype), x), "softsign": lambda x: x / (1 + np.abs(x)),
       "elu": _elu, "selu": lambda x: x.dtype.type(1.0507009873554805) * _elu(x, x.dtype.type(1.6732632423543772)),
       "exponential": np.exp, "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0).astype(x.dtype),
       "hard_sigmoid_k3": lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0).astype(x.dtype)}


def _act(name, x):
    if name not in ACT:
        raise Uncovered(f"activation {name!r}")
    return ACT[name](x).astype(x.dtype, copy=False)


def _mm(x, w, order: int):
    """``x @ w`` contracting ``x``'s last axis with ``w``'s first; ``order`` 1 sums the contraction reversed."""
    if order:
        return np.ascontiguousarray(x[..., ::-1]) @ np.ascontiguousarray(w[::-1])
    return x @ w


def _int1(v) -> int:
    return int(v[0] if isinstance(v, (list, tuple)) else v)


def _same_pads(length: int, k_eff: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one dimension (``kernel_shape_util.cc`` ``GetWindowedOutputSize``)."""
    total = max((-(-length // stride) - 1) * stride + k_eff - length, 0)
    return total // 2, total - total // 2


def _ints(v, nd: int) -> list[int]:
    return [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)] * nd


def _windows(x, size: list[int], st: list[int], dil: list[int]):
    """``(B, *out, prod(size), C)``: each output position's window of ``x`` ``(B, *spatial, C)``, taps in
    row-major order of the window (the order of a Keras kernel ``(*size, in, out)`` reshaped)."""
    nd = len(size)
    out = [(x.shape[1 + i] - ((size[i] - 1) * dil[i] + 1)) // st[i] + 1 for i in range(nd)]
    if min(out) <= 0:
        raise Uncovered("a window larger than its input")
    taps = []
    for idx in np.ndindex(*size):
        sl = tuple(slice(idx[i] * dil[i], idx[i] * dil[i] + (out[i] - 1) * st[i] + 1, st[i]) for i in range(nd))
        taps.append(x[(slice(None),) + sl])
    return np.stack(taps, axis=1 + nd)


def _conv(x, w, b, conf: dict, order: int):
    """Keras ``Conv1D`` / ``Conv2D`` (channels_last; kernel ``(*k, in, out)`` as stored; TensorFlow's padding:
    ``valid``, ``causal`` (1-D: ``(k-1)*d`` zeros before), ``same`` (:func:`_same_pads` on every spatial axis))."""
    nd = w.ndim - 2
    size, dil, st = list(w.shape[:nd]), _ints(conf.get("dilation_rate", 1), nd), _ints(conf.get("strides", 1), nd)
    pad = conf.get("padding", "valid")
    if pad == "causal":
        x = np.pad(x, ((0, 0), ((size[0] - 1) * dil[0], 0), (0, 0)))
    elif pad == "same":
        x = np.pad(x, [(0, 0)] + [_same_pads(x.shape[1 + i], (size[i] - 1) * dil[i] + 1, st[i]) for i in range(nd)]
                   + [(0, 0)])
    win = _windows(x, size, st, dil)
    y = _mm(win.reshape(win.shape[:1 + nd] + (-1,)), w.reshape(-1, w.shape[-1]), order)
    return y + b if b is not None else y


def _pool(x, conf: dict, is_max: bool, nd: int):
    """Keras ``Max/AveragePooling1D/2D`` (TensorFlow: SAME pads with -inf for the max and counts only real
    elements for the average)."""
    size = _ints(conf.get("pool_size", 2), nd)
    st = _ints(conf.get("strides") or size, nd)
    valid = np.ones(x.shape[:-1] + (1,), x.dtype)
    if conf.get("padding", "valid") == "same":
        p = [(0, 0)] + [_same_pads(x.shape[1 + i], size[i], st[i]) for i in range(nd)] + [(0, 0)]
        x = np.pad(x, p, constant_values=-np.inf if is_max else 0)
        valid = np.pad(valid, p)
    win = _windows(x, size, st, [1] * nd)
    if is_max:
        return win.max(axis=1 + nd)
    return (win.sum(axis=1 + nd) / _windows(valid, size, st, [1] * nd).sum(axis=1 + nd)).astype(x.dtype)


def _attention(node, xs, masks, dt):
    """Keras ``Attention`` / ``AdditiveAttention`` at inference (equations: :mod:`rnnconvert.whole.formats.torch.
    attention`'s docstring, tf_keras 2.21 / keras 3.15): ``(output, weights)``."""
    scale, cw = keras_graph.attention_weights(node)
    conf = node.config
    q, v = xs[0], xs[1]
    k = xs[2] if len(xs) > 2 else v
    if conf["mode"] == "dot":
        s = q @ np.swapaxes(k, -1, -2)
        s = s * scale.astype(dt) if scale is not None else s
    else:
        t = q[:, :, None, :] + k[:, None, :, :]
        if conf["mode"] == "additive":
            t = np.tanh(t)
            s = (t * scale.astype(dt)).sum(-1) if scale is not None else t.sum(-1)
        else:
            s = cw.astype(dt) * np.tanh(t * scale.astype(dt) if scale is not None else t).sum(-1)
    keep = None if masks[1] is None else masks[1][:, None, :]
    if conf.get("causal"):
        tri = np.tril(np.ones(s.shape[-2:], bool))
        keep = tri if keep is None else keep & tri
    if keep is not None:  # Keras: s - 1e9 in float32, whatever the dtype here
        s = np.where(keep, s, (s.astype(np.float32) - np.float32(1e9)).astype(dt))
    w = _softmax(s).astype(dt)
    out = w @ v
    if masks[0] is not None:
        out = out * masks[0][..., None].astype(dt)
    return out, w


def _compact(x, mask):
    """Each row's unmasked steps moved to the front in order, ``pos`` (the index among them of the last unmasked
    step at or before each step, -1 before the first) and ``count``."""
    idx = np.argsort(~mask, axis=1, kind="stable")
    return np.take_along_axis(x, idx[..., None], 1), np.cumsum(mask, 1) - 1, mask.sum(1)


def _direction(layer, d: int, x, mask, rev: bool, zero_masked: bool, order: int, want_c: bool, init=None):
    """One direction in processing order: ``(outputs (B, T, H) in processing order, last output, final h, final c
    or None)``; ``init``: Keras ``initial_state`` ``[h(, c)]`` or ``None`` (zeros). The last output of a row whose
    every step is masked is zero (tf_keras ``backend.rnn``: the previous output starts as zeros); its states are
    the initial ones."""
    xd = x[:, ::-1] if rev else x
    md = None if mask is None else (mask[:, ::-1] if rev else mask)
    pos = count = None
    if md is not None:
        xd, pos, count = _compact(xd, md)
    raw = layer.source["raw"][d]
    if order and "kernel" in raw and not layer.source["class_name"].startswith("CuDNN"):
        raw = {**raw, "kernel": np.asarray(raw["kernel"])[::-1]}
        xd = xd[..., ::-1]
    rec = {} if want_c else None
    y = keras_equations.direction_forward(layer, d, np.ascontiguousarray(xd), raw=raw, record=rec, init=init)
    B, T, H = y.shape
    if md is None:
        return y, y[:, -1], y[:, -1], (rec["c_last"] if want_c else None)
    got = np.take_along_axis(y, np.clip(pos, 0, None)[..., None], 1)
    keep = md if zero_masked else pos >= 0
    ys = np.where(keep[..., None], got, 0).astype(y.dtype)
    rows = np.arange(B)
    at = y[rows, np.clip(count - 1, 0, None)]
    last = np.where((count > 0)[:, None], at, 0).astype(y.dtype)
    h = last if init is None else np.where((count > 0)[:, None], at, init[0]).astype(y.dtype)
    c = None
    if want_c:  # c after step count-1: record['c'] holds c before each step
        cs = np.concatenate([rec["c"], rec["c_last"][:, None]], axis=1)
        c = cs[rows, count]
    return ys, last, h, c


def _recurrent(node, xs, mask, order: int):
    """A recurrent call (LSTM/GRU/SimpleRNN/CuDNN/Bidirectional; Keras ``backend.rnn`` masking, module docstring):
    its output, or ``[output, h(, c)]`` with ``return_state``."""
    layer, cls, conf, x = node.layer, node.cls, node.config, xs[0]
    inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
    seqs = bool(inner.get("return_sequences"))
    if layer.bidirectional:
        res = [_direction(layer, d, x, mask, d == 1, True, order, False) for d in (0, 1)]
        fw, bw = (res[0][0], res[1][0][:, ::-1]) if seqs else (res[0][1], res[1][1])  # (states refused)
        merge = layer.semantics.merge_mode
        if merge == "concat":
            return np.concatenate([fw, bw], -1)
        return fw + bw if merge == "sum" else (fw * bw if merge == "mul" else (fw + bw) / 2)
    want_c = len(node.outputs) > 2 and layer.cell is Cell.LSTM
    y, last, h, c = _direction(layer, 0, x, mask, layer.semantics.go_backwards, False, order, want_c,
                               [s.astype(x.dtype) for s in xs[1:]] or None)
    out = y if seqs else last
    if len(node.outputs) > 1:
        return [out, h, c][:len(node.outputs)]
    return out


def _dense(node, x, conf, dt, order):
    ws = [np.asarray(w).astype(dt) for w in node.weights]
    y = _mm(x, ws[0], order)
    if conf.get("use_bias", True) and len(ws) > 1:
        y = y + ws[1]
    return _act(conf.get("activation"), y)


def _norm(node, x, dt):
    """``BatchNormalization`` (moving statistics) / ``LayerNormalization`` over the last axis (keras_graph checked
    it): ``(x - mean) / sqrt(var + eps) * gamma + beta``."""
    conf, ws = node.config, [np.asarray(w).astype(dt) for w in node.weights]
    j, gamma, beta = 0, None, None
    if conf.get("scale", True):
        gamma, j = ws[j], j + 1
    if conf.get("center", True):
        beta, j = ws[j], j + 1
    eps = dt(float(conf.get("epsilon", 1e-3)))
    if node.cls == "BatchNormalization":
        mean, var = ws[j], ws[j + 1]
    else:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    y = y * gamma if gamma is not None else y
    return y + beta if beta is not None else y


def _shape_layer(node, x, xs):
    """Flatten, Reshape, Permute, RepeatVector, ZeroPadding1D, Cropping1D, Concatenate and the merges."""
    cls, conf = node.cls, node.config
    if cls == "Flatten":
        return x.reshape(x.shape[0], -1)
    if cls == "Reshape":
        return x.reshape([x.shape[0]] + [int(d) for d in conf["target_shape"]])
    if cls == "Permute":
        return np.transpose(x, [0] + [int(d) for d in conf["dims"]])
    if cls == "RepeatVector":
        return np.repeat(x[:, None, :], int(conf["n"]), axis=1)
    if cls in ("ZeroPadding1D", "Cropping1D"):
        p = conf.get("padding" if cls == "ZeroPadding1D" else "cropping", 1)
        a, b = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
        return np.pad(x, ((0, 0), (a, b), (0, 0))) if cls == "ZeroPadding1D" else x[:, a:x.shape[1] - b]
    if cls == "Concatenate":
        return np.concatenate(xs, int(conf.get("axis", -1)))
    fn = {"Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply, "Average": np.add,
          "Maximum": np.maximum, "Minimum": np.minimum}[cls]
    y = xs[0]
    for z in xs[1:]:
        y = fn(y, z)
    return (y / len(xs)).astype(x.dtype) if cls == "Average" else y


def _layer(node, xs, mask, masks, dt, order):
    """One layer call's output (a list for several outputs)."""
    cls, conf, x = node.cls, node.config, xs[0]
    if cls in keras_graph.IDENTITY:
        return x
    if node.layer is not None:
        return _recurrent(node, xs, mask, order)
    if cls in keras_graph.ATTENTION:
        out, w = _attention(node, xs, (masks + [None, None])[:2], dt)
        return [out, w] if conf.get("scores") else out
    if cls == "Embedding":
        table = np.asarray(node.weights[0])
        if x.size and (x.min() < 0 or x.max() >= table.shape[0]):
            raise Uncovered("token ids outside the Embedding's range")
        return table.astype(dt)[x.astype(np.int64)]
    if cls == "Masking":
        return x * np.any(x != dt(float(conf.get("mask_value", 0.0))), -1, keepdims=True).astype(dt)
    if cls == "Dense":
        return _dense(node, x, conf, dt, order)
    if cls == "TimeDistributed":
        icls, iconf = node.inner
        if icls == "Dense":
            return _dense(node, x, iconf, dt, order)
        return _act(iconf.get("activation"), x) if icls == "Activation" else x
    if cls in ("Activation", "ReLU", "Softmax"):
        return _act({"ReLU": "relu", "Softmax": "softmax"}.get(cls, conf.get("activation")), x)
    if cls == "LeakyReLU":
        return np.where(x > 0, x, dt(float(conf.get("alpha", 0.3))) * x)
    if cls == "ELU":
        return _elu(x, dt(float(conf.get("alpha", 1.0)))).astype(dt)
    if cls in ("Conv1D", "Conv2D"):
        ws = [np.asarray(w).astype(dt) for w in node.weights]
        b = ws[1] if conf.get("use_bias", True) and len(ws) > 1 else None
        return _act(conf.get("activation"), _conv(x, ws[0], b, conf, order))
    if cls in ("MaxPooling1D", "AveragePooling1D", "MaxPooling2D", "AveragePooling2D"):
        return _pool(x, conf, cls.startswith("Max"), int(cls[-2]))
    if cls in ("GlobalMaxPooling2D", "GlobalAveragePooling2D"):
        keep = bool(conf.get("keepdims"))
        return x.max((1, 2), keepdims=keep) if cls == "GlobalMaxPooling2D" else x.mean((1, 2), keepdims=keep)
    if cls in ("GlobalMaxPooling1D", "GlobalAveragePooling1D"):
        keep = bool(conf.get("keepdims"))
        if cls == "GlobalMaxPooling1D":
            return x.max(1, keepdims=keep)
        if mask is None:
            return x.mean(1, keepdims=keep)
        m = mask.astype(dt)[..., None]
        return ((x * m).sum(1, keepdims=keep) / m.sum(1, keepdims=keep)).astype(dt)
    if cls in ("BatchNormalization", "LayerNormalization"):
        return _norm(node, x, dt)
    if cls in ("Flatten", "Reshape", "Permute", "RepeatVector", "ZeroPadding1D", "Cropping1D") + keras_graph.MERGE:
        return _shape_layer(node, x, xs)
    raise Uncovered(f"layer '{node.path}' ({cls})")


def _mask(graph, name: str, env: dict):
    kind = graph.masks[name]
    src = env[kind[1]]
    return src != 0 if kind[0] == "ids" else np.any(src != kind[2], -1)


def run(graph: keras_graph.Graph, xs: dict[str, np.ndarray], dtype=np.float64, order: int = 0,
        fed: dict | None = None) -> tuple[list, dict]:
    """``graph`` evaluated on ``xs`` (``{input name: array}``; float inputs cast to ``dtype``, integer ones kept)
    in ``dtype`` (``np.float32`` or ``np.float64``, weights cast exactly from the stored float32) and evaluation
    ``order`` (module docstring). Returns ``(model outputs in order, {node name: its first output})``.
    ``fed`` (a dict, filled): ``{recurrent layer name: [(x, mask)]}``, the input the graph feeds each call of
    each recurrent layer, in the order of the calls (``(B, T, input_size)`` in ``dtype``) and its Keras mask (bool
    ``(B, T)``, or ``None``).

    Raises:
        Uncovered: a layer call this evaluator does not compute (:func:`uncovered`), token ids outside an
            Embedding's range."""
    why = uncovered(graph)
    if why:
        raise Uncovered(why)
    dt = np.dtype(dtype).type
    env = {}
    for name, *_ in graph.inputs:
        a = np.asarray(xs[name])
        env[name] = a.astype(dt) if a.dtype.kind == "f" else a
    masks: dict = {}
    layers = {}
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        for node in graph.nodes:
            ms = []
            for m in node.masks or [None]:
                if m is not None and m not in masks:
                    masks[m] = _mask(graph, m, env)
                ms.append(None if m is None else masks[m])
            if fed is not None and node.layer is not None:
                fed.setdefault(node.layer.name, []).append((env[node.inputs[0]], ms[0]))
            y = _layer(node, [env[i] for i in node.inputs], ms[0], ms, dt, order)
            if isinstance(y, list):
                env.update(zip(node.outputs[1:], y[1:]))
                y = y[0]
            env[node.outputs[0]] = y
            layers[node.name] = y
    return [env[o] for o in graph.outputs], layers
