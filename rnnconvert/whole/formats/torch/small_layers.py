"""``PReLU``, ``Rescaling``, ``UnitNormalization``, ``UpSampling1D`` and ``EinsumDense`` (before its activation)
in torch (issue #41): one expression per layer, evaluated by the ``.pt2`` program (:mod:`.pt2_write`, :func:`forward`) and written, as source, into
emitted modules (:mod:`.module_write`, :func:`source`); the equations of
:mod:`rnnconvert.whole.formats.onnx.small_layers` (tf_keras 2.21 / keras 3.15 ``call``). Oracle: tf_keras' and
Keras 3's outputs in ``tests/formats/whole_models/test_whole_small_layers.py``.
"""

from __future__ import annotations

from ...conventions import keras_graph


def _lit(a) -> str:
    """A float32 array as a ``torch.tensor`` literal (``repr`` of each value: float32 values round-trip)."""
    import numpy as np

    a = np.asarray(a, np.float32)
    return f"torch.tensor({[float(v) for v in a.ravel()]!r}).reshape({tuple(a.shape)!r})"


def source(node: keras_graph.Node, x: str, alpha: str | None = None) -> str:
    """The torch expression of the layer call ``node`` on the variable ``x`` (``alpha``: the source naming a
    ``PReLU``'s weight, an attribute of the emitted module)."""
    cls, conf = node.cls, node.config
    if cls == "EinsumDense":  # ``alpha``: the attribute holding ``kernel`` (and ``bias``)
        xs, ks, os_ = conf["spec"]
        y = f"torch.einsum({xs + ',' + ks + '->' + os_!r}, {x}, {alpha}['kernel'])"
        return y + (f" + {alpha}['bias']" if len(node.weights) > 1 else "")
    if cls == "PReLU":
        return f"torch.relu({x}) - {alpha} * torch.relu(-{x})"
    if cls == "Rescaling":
        return f"{x} * {_lit(conf['scale'])} + {_lit(conf['offset'])}"
    if cls == "UnitNormalization":
        return f"{x} / torch.sqrt(torch.clamp(({x} * {x}).sum(-1, keepdim=True), min=1e-12))"
    return f"torch.repeat_interleave({x}, {int(conf['size'])}, dim=1)"


def forward(node: keras_graph.Node, x, alpha=None):
    """The layer call ``node`` on the tensor ``x`` (``alpha``: a ``PReLU``'s weight tensor)."""
    import torch

    cls, conf = node.cls, node.config
    if cls == "EinsumDense":  # ``alpha``: ``[kernel(, bias)]``; the activation is the caller's
        xs, ks, os_ = conf["spec"]
        y = torch.einsum(f"{xs},{ks}->{os_}", x, alpha[0])
        return y + alpha[1] if len(alpha) > 1 else y
    if cls == "PReLU":
        return torch.relu(x) - alpha * torch.relu(-x)
    if cls == "Rescaling":
        return x * torch.as_tensor(conf["scale"]) + torch.as_tensor(conf["offset"])
    if cls == "UnitNormalization":
        return x / torch.sqrt(torch.clamp((x * x).sum(-1, keepdim=True), min=1e-12))
    return torch.repeat_interleave(x, int(conf["size"]), dim=1)
