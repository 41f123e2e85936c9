"""``PReLU``, ``Rescaling``, ``UnitNormalization`` and ``UpSampling1D`` in the whole-model ONNX graph (issue #41),
op set 14, with the settings :func:`rnnconvert.whole.conventions.keras_graph._small` checked:

* ``PReLU``: ``Relu(x) - alpha * Relu(-x)`` (tf_keras 2.21 / keras 3.15 ``prelu.py``: ``pos + -alpha * relu(-x)``;
  ``alpha`` broadcast over the batch and its ``shared_axes``);
* ``Rescaling``: ``x * scale + offset`` (``rescaling.py``; the scale and offset as float32 constants);
* ``UnitNormalization``: ``x * 1/sqrt(max(sum(x^2, -1), 1e-12))`` (tf_keras ``tf.linalg.l2_normalize``; keras 3
  ``ops.normalize(order=2, epsilon=1e-12)``);
* ``EinsumDense``: ``Einsum(equation)`` of the input and the kernel, plus the bias, then the activation
  (``einsum_dense.py``);
* ``UpSampling1D``: each step repeated ``size`` times (``repeat_elements(x, size, axis=1)``): ``(B, T, C)`` ->
  ``Unsqueeze`` ``(B, T, 1, C)``, ``Expand`` to ``(B, T, size, C)``, ``Reshape`` ``(B, T * size, C)``.

Oracle: tf_keras' and Keras 3's outputs in ``tests/formats/whole_models/test_whole_small_layers.py``.
"""

from __future__ import annotations

import numpy as np

from ...conventions import keras_graph


def build(g, node: keras_graph.Node, x: str, activation=None) -> str:
    """The layer call ``node`` (a :data:`keras_graph.SMALL` class) on ``x`` (a tensor name in ``g``, a
    :class:`.model_write._G`): its output's name. ``activation``: the writer's ``activation(g, x, name, base)``
    (:func:`.model_write.activation`, handed in: no import cycle), for ``EinsumDense``."""
    cls, conf, base = node.cls, node.config, node.name

    def f32(a, name):
        return g.const(np.ascontiguousarray(a, np.float32), f"{base}.{name}")

    if cls == "EinsumDense":
        xs, ks, os_ = conf["spec"]
        y = g.op("Einsum", [x, f32(node.weights[0], "kernel")], base, equation=f"{xs},{ks}->{os_}")
        if len(node.weights) > 1:
            y = g.op("Add", [y, f32(node.weights[1], "bias")], base)
        return activation(g, y, conf.get("activation"), base)
    if cls == "PReLU":
        neg = g.op("Relu", [g.op("Neg", [x], base)], base)
        return g.op("Sub", [g.op("Relu", [x], base), g.op("Mul", [f32(node.weights[0], "alpha"), neg], base)], base)
    if cls == "Rescaling":
        return g.op("Add", [g.op("Mul", [x, f32(conf["scale"], "scale")], base), f32(conf["offset"], "offset")], base)
    if cls == "UnitNormalization":
        ss = g.op("ReduceSum", [g.op("Mul", [x, x], base), g.const(np.asarray([-1], np.int64), "ax")], base,
                  keepdims=1)
        norm = g.op("Sqrt", [g.op("Max", [ss, f32(1e-12, "epsilon")], base)], base)
        return g.op("Mul", [x, g.op("Reciprocal", [norm], base)], base)
    size = int(conf["size"])
    shape = g.op("Shape", [x], base)
    b, t, c = (g.op("Gather", [shape, g.const(np.asarray([i], np.int64), "i")], base) for i in range(3))
    u = g.op("Unsqueeze", [x, g.const(np.asarray([2], np.int64), "ax")], base)
    n = g.const(np.asarray([size], np.int64), "size")
    e = g.op("Expand", [u, g.op("Concat", [b, t, n, c], base, axis=0)], base)
    return g.op("Reshape", [e, g.op("Concat", [b, g.op("Mul", [t, n], base), c], base, axis=0)], base)
