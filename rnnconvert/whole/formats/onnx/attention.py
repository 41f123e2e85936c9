"""Keras ``Attention`` / ``AdditiveAttention`` (:func:`build`) and ``MultiHeadAttention`` (:func:`build_mha`) in
the whole-model ONNX graph (issue #41), op set 14: the
equations of :mod:`rnnconvert.whole.formats.torch.attention` (tf_keras 2.21 / keras 3.15 ``layers/attention/``) as
``MatMul`` / ``Tanh`` / ``ReduceSum`` / ``Softmax`` nodes; hidden steps (the value mask, ``j > i`` under the causal
mask) score ``s - 1e9`` in float32 through ``Where``, exactly as Keras computes them; the query mask zeroes the
output's hidden steps. Dropout is the identity (inference). Oracle: tf_keras' and Keras 3's outputs in
``tests/formats/whole_models/test_whole_attention.py``.
"""

from __future__ import annotations

import numpy as np

from ...conventions import keras_graph


def build(g, node: keras_graph.Node, xs: list[str], masks: list[str | None]) -> str | list[str]:
    """The attention call ``node`` on ``xs`` (``[query, value(, key)]`` tensor names in ``g``, a
    :class:`.model_write._G`) with ``masks`` (bool ``(B, T)`` tensor names of the query and the value, or
    ``None``): the output ``(B, Tq, Dv)``, or ``[output, weights (B, Tq, Tv)]`` with ``return_attention_scores``.

    Raises:
        UnsupportedError: weights unlike the config (:func:`keras_graph.attention_weights`)."""
    conf, base = node.config, node.name
    scale, cw = keras_graph.attention_weights(node)
    q, v = xs[0], xs[1]
    k = xs[2] if len(xs) > 2 else v
    mode = conf["mode"]

    def const(a, name):
        return g.const(np.asarray(a, np.float32), f"{base}.{name}")

    def ax(v_):
        return g.const(np.asarray(v_, np.int64), "ax")

    if mode == "dot":
        scores = g.op("MatMul", [q, g.op("Transpose", [k], base, perm=[0, 2, 1])], base)
        if scale is not None:
            scores = g.op("Mul", [scores, const(scale, "scale")], base)
    else:
        t = g.op("Add", [g.op("Unsqueeze", [q, ax([2])], base), g.op("Unsqueeze", [k, ax([1])], base)], base)
        if mode == "additive":
            t = g.op("Tanh", [t], base)
            if scale is not None:
                t = g.op("Mul", [t, const(scale, "scale")], base)
            scores = g.op("ReduceSum", [t, ax([-1])], base, keepdims=0)
        else:
            if scale is not None:
                t = g.op("Mul", [t, const(scale, "scale")], base)
            scores = g.op("Mul", [g.op("ReduceSum", [g.op("Tanh", [t], base), ax([-1])], base, keepdims=0),
                                  const(cw, "concat_score_weight")], base)
    keep = None
    if len(masks) > 1 and masks[1] is not None:
        keep = g.op("Unsqueeze", [masks[1], ax([1])], base)  # (B, 1, Tv)
    if conf.get("causal"):
        shape = g.op("Shape", [scores], base)
        one = g.const(np.asarray(1, np.int64), "one")
        tq = g.op("Gather", [shape, g.const(np.asarray(1, np.int64), "i")], base)
        tv = g.op("Gather", [shape, g.const(np.asarray(2, np.int64), "i")], base)
        zero = g.const(np.asarray(0, np.int64), "zero")
        rows = g.op("Unsqueeze", [g.op("Range", [zero, tq, one], base), ax([1])], base)
        cols = g.op("Unsqueeze", [g.op("Range", [zero, tv, one], base), ax([0])], base)
        tri = g.op("GreaterOrEqual", [rows, cols], base)  # (Tq, Tv): i >= j
        keep = tri if keep is None else g.op("And", [keep, tri], base)
    if keep is not None:
        hidden = g.op("Sub", [scores, g.const(np.asarray(1e9, np.float32), "big")], base)
        scores = g.op("Where", [keep, scores, hidden], base)
    w = g.op("Softmax", [scores], base, axis=-1)
    out = g.op("MatMul", [w, v], base)
    if masks and masks[0] is not None:
        out = g.op("Mul", [out, g.op("Unsqueeze", [g.op("Cast", [masks[0]], base, to=g.TP.FLOAT), ax([2])], base)],
                   base)
    return [out, w] if conf.get("scores") else out


def build_mha(g, node: keras_graph.Node, xs: list[str], masks: list[str | None]) -> str | list[str]:
    """The ``MultiHeadAttention`` call ``node`` (the equations of
    :func:`rnnconvert.whole.formats.torch.attention.keras_mha`) on ``xs`` (``[query, value(, key)]``, each
    ``(B, T, D)`` float) with ``masks`` (bool ``(B, T)`` names of the query, the value and the key, or ``None``):
    per-head projections as one ``MatMul`` and a ``Reshape`` to ``(B, T, H, d)``, scores ``(B, H, Tq, Tv)``,
    hidden pairs by ``Where`` (``node.config['masked']``), ``Softmax``, the output projection. Returns the output
    ``(B, Tq, O)``, or ``[output, weights (B, H, Tq, Tv)]`` with ``return_attention_scores``."""
    conf, base = node.config, node.name
    wq, bq, wk, bk, wv, bv, wo, bo = node.weights
    h, kd, vd, o = int(wq.shape[1]), int(wq.shape[2]), int(wv.shape[2]), int(wo.shape[2])
    q, v = xs[0], xs[1]
    k = xs[2] if len(xs) > 2 else v

    def const(a, name):
        return g.const(np.ascontiguousarray(a, np.float32), f"{base}.{name}")

    def ax(v_):
        return g.const(np.asarray(v_, np.int64), "ax")

    def proj(x, w, b, name, d):  # (B, T, D) -> (B, T, H, d)
        y = g.op("Add", [g.op("MatMul", [x, const(w.reshape(w.shape[0], h * d), name + ".kernel")], base),
                         const(b.reshape(h * d), name + ".bias")], base)
        return g.op("Reshape", [y, ax([0, 0, h, d])], base)

    qp = g.op("Mul", [proj(q, wq, bq, "query", kd), g.const(np.asarray(1.0 / np.sqrt(float(kd)), np.float32),
                                                            f"{base}.inv_sqrt_key_dim")], base)
    qp = g.op("Transpose", [qp], base, perm=[0, 2, 1, 3])  # (B, H, Tq, K)
    kt = g.op("Transpose", [proj(k, wk, bk, "key", kd)], base, perm=[0, 2, 3, 1])  # (B, H, K, Tv)
    vp = g.op("Transpose", [proj(v, wv, bv, "value", vd)], base, perm=[0, 2, 1, 3])  # (B, H, Tv, V)
    scores = g.op("MatMul", [qp, kt], base)
    keep = None
    for i, m in enumerate((masks + [None] * 3)[:3]):
        if m is None:
            continue
        mm = g.op("Unsqueeze", [m, ax([1, 3] if i == 0 else [1, 2])], base)  # (B,1,Tq,1) / (B,1,1,Tv)
        keep = mm if keep is None else g.op("And", [keep, mm], base)
    if conf.get("causal"):
        shape = g.op("Shape", [scores], base)
        one = g.const(np.asarray(1, np.int64), "one")
        zero = g.const(np.asarray(0, np.int64), "zero")
        tq = g.op("Gather", [shape, g.const(np.asarray(2, np.int64), "i")], base)
        tv = g.op("Gather", [shape, g.const(np.asarray(3, np.int64), "i")], base)
        rows = g.op("Unsqueeze", [g.op("Range", [zero, tq, one], base), ax([1])], base)
        cols = g.op("Unsqueeze", [g.op("Range", [zero, tv, one], base), ax([0])], base)
        tri = g.op("GreaterOrEqual", [rows, cols], base)  # (Tq, Tv): i >= j
        keep = tri if keep is None else g.op("And", [keep, tri], base)
    if keep is not None:
        big = g.const(np.asarray(1e9, np.float32), "big")
        hidden = (g.op("Sub", [scores, big], base) if conf["masked"] == "add"
                  else g.const(np.asarray(-1e9, np.float32), "minus_big"))
        scores = g.op("Where", [keep, scores, hidden], base)
    w = g.op("Softmax", [scores], base, axis=-1)
    if keep is not None and conf["masked"] == "zero":
        w = g.op("Where", [keep, w, g.const(np.asarray(0.0, np.float32), "zero_f")], base)
    y = g.op("Transpose", [g.op("MatMul", [w, vp], base)], base, perm=[0, 2, 1, 3])  # (B, Tq, H, V)
    y = g.op("Reshape", [y, ax([0, 0, h * vd])], base)
    y = g.op("Add", [g.op("MatMul", [y, const(wo.reshape(h * vd, o), "output.kernel")], base),
                     const(bo, "output.bias")], base)
    return [y, w] if conf.get("scores") else y
