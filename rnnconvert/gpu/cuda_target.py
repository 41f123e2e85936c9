"""The cuDNN execution path of verification (``rnnconvert verify SRC DST --device cuda``).

Two routes run the *written* file's weights through cuDNN itself (via PyTorch on an NVIDIA GPU,
TF32 off), each checked against the source side like any other target:

* ``module``: ``torch.nn.LSTM/GRU/RNN`` on CUDA loaded with the file's weights (after
  ``flatten_parameters``, i.e. ``torch._cudnn_rnn_flatten_weight``);
* ``buffer``: our own packed opaque buffer (:func:`rnnconvert.core.cudnn.pack`) handed to
  ``torch._cudnn_rnn`` as its weight buffer, so that the buffer layout itself is what runs.

Before running, the region offsets cuDNN reports for the layer's spec are compared with
:func:`rnnconvert.core.cudnn.layout`; a mismatch raises :class:`~rnnconvert.errors.VerificationError`
naming the region that moved and the cuDNN version (:func:`rnnconvert.gpu.cudnn_check.check_layout`).
``dtype='float16'`` runs the weights in half precision (the verification tolerance becomes 1e-2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DependencyError
from ..core.model import Checkpoint, RNNLayer

ROUTES = ("module", "buffer")


def require_cuda() -> None:
    """Raise :class:`DependencyError` (exit 7) unless torch sees a CUDA device with cuDNN."""
    from . import cudnn_check

    if not cudnn_check.cuda_available():
        why = ("needs an NVIDIA GPU with cuDNN visible to torch (torch.cuda.is_available() is False here); run this "
               "check on a GPU machine")
        raise DependencyError(f"device='cuda' {why}", cli=f"--device cuda {why}")


def _cast(layer: RNNLayer, dtype: str) -> RNNLayer:
    from dataclasses import replace

    if dtype == str(layer.dtype):
        return layer
    params = [[replace(p, **{k: v.astype(dtype) for k, v in p.arrays().items()}) for p in row] for row in layer.params]
    return replace(layer, params=params)


class CudaTarget:
    """A verification target (``target_forward``) that runs a converted file through cuDNN."""

    def __init__(self, dst_module, route: str, dtype: str = "float32"):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}")
        self.dst_module, self.route, self.dtype = dst_module, route, dtype
        self.ROUTE = f"cuDNN {'nn module' if route == 'module' else 'packed buffer'} ({dtype})"
        self.ENGINE = "torch"
        self.__name__ = f"cuda_{route}"
        self._ckpt: Checkpoint | None = None

    def target_step(self, path: Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list) -> list:
        """Verification's one-step check on the GPU: stacked layer ``k`` of the file's weights (cast to
        ``dtype``) in a ``torch.nn`` module on CUDA (cuDNN), one step from each state; both routes (the
        packed-buffer route's full sequences are checked by :meth:`target_forward`)."""
        from ..formats.torch import torch_pt

        if self._ckpt is None:
            self._ckpt = self.dst_module.read(path)
        return torch_pt.step_canonical(_cast(self._ckpt.layer(name), self.dtype), k, x, states, device="cuda")

    def target_forward(self, path: Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
        from ..core import cudnn
        from . import cudnn_check

        if self._ckpt is None:
            self._ckpt = self.dst_module.read(path)
        layer = _cast(self._ckpt.layer(name), self.dtype)
        cudnn_check.check_layout(cudnn.Spec.of(layer), getattr(__import__("torch"), self.dtype))
        run = cudnn_check.forward_module if self.route == "module" else cudnn_check.forward_buffer
        return np.asarray(run(layer, x), dtype=np.float64)
