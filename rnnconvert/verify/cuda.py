"""The cuDNN execution path of verification (``rnnconvert verify SRC DST --device cuda``).

Two routes run the *written* file's weights through cuDNN itself (via PyTorch on an NVIDIA GPU,
TF32 off), each checked against the source side like any other target:

* ``module``: ``torch.nn.LSTM/GRU/RNN`` on CUDA loaded with the file's weights (after
  ``flatten_parameters``, i.e. ``torch._cudnn_rnn_flatten_weight``);
* ``buffer``: our own packed opaque buffer (:func:`rnnconvert.core.cudnn.pack`) handed to
  ``torch._cudnn_rnn`` as its weight buffer, so that the buffer layout itself is what runs.

Before running, the region offsets cuDNN reports for the layer's spec are compared with
:func:`rnnconvert.core.cudnn.layout`; a mismatch raises :class:`~rnnconvert.errors.VerificationError`
naming the region that moved and the cuDNN version (:func:`rnnconvert.verify.cudnn_layout.check_layout`).
``dtype='float16'`` runs the weights in half precision (the verification tolerance becomes 1e-2).

cuDNN's own arithmetic, measured (``bench/gpu_check.py``, "Activation accuracy"; docs/gpu-validation.md):
in float32 its ``tanh`` is not correctly rounded in the kernels it picks for small hidden sizes (cuDNN 9.19
on an H100: up to :data:`CUDNN_TANH_ULPS` ``u (1 + |tanh z|)``, ``u = 2**-24``, for every cell at ``H`` = 4 to
128 and RNN_TANH at 256, batches of 8 rows or 65536; within 1.2 for LSTM and GRU at 256 and every cell from
512 to 2048); its ``sigmoid`` within 1.1, both in float16 within 0.3 of float16's ``u``. A correct file then
differs from the float64 reference by more than float32 numpy does (the realworld textgenrnn LSTM: 5.8e-5
over 8 steps against a tolerance of 1.5e-5). So a :class:`CudaTarget` declares

* :attr:`CudaTarget.act_ulps`: the activation accuracy the one-step bound allows
  (:func:`rnnconvert.verify.bounds.act_error`): :data:`CUDNN_ACT_ULPS` in float32, about twice the
  largest error measured;
* :meth:`CudaTarget.target_arithmetic`: a float64-free emulation of its run (float32 with every ``tanh``
  off by :data:`CUDNN_TANH_ULPS` in a random direction; float16: weights, inputs and activations rounded
  to float16) whose spread from the float64 run enters the sequence tolerance
  (:func:`rnnconvert.verify.engine.sequence_tolerance`) where it exceeds the source's own float32 spread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from ..errors import DependencyError
from ..core.model import Cell, Checkpoint, RNNLayer

ROUTES = ("module", "buffer")
#: the largest error of cuDNN's float32 ``tanh`` measured, in ``u (1 + |tanh z|)`` (``u = 2**-24``): cuDNN 9.19,
#: H100, 72.8 at x = -1.218749 over every float32 of magnitude 2**-26 to 10, H = 4 to 2048
#: (``bench/gpu_check.py``, docs/gpu-validation.md)
CUDNN_TANH_ULPS = 73.0
#: the activation accuracy (ulps) the one-step bound allows a cuDNN float32 run: about twice
#: :data:`CUDNN_TANH_ULPS` (float16 runs keep :data:`rnnconvert.verify.bounds.ACT_ULPS`: one ulp measured)
CUDNN_ACT_ULPS = 128.0


def require_cuda() -> None:
    """Raise :class:`DependencyError` (exit 7) unless torch sees a CUDA device with cuDNN."""
    from . import cudnn_layout as cudnn_check

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
    """A verification target that runs a converted file through cuDNN, one slab (stacked layer, all its
    directions) at a time: the written file is read back lazily where its reader can (``FormatSpec.lazy``),
    each slab's weights read, run and let go, so that a multi-GB file is never held whole (issue #33; the
    earlier whole-file read back took 10 GB for the 3 GB benchmark). The attributes are those of
    :class:`rnnconvert.verify.target.Target` that verification uses."""

    def __init__(self, dst_module, route: str, dtype: str = "float32"):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}")
        self.dst_module, self.way, self.dtype = dst_module, route, dtype
        # the runtime fields of a FormatSpec (rnnconvert.engine.protocol) that verification uses
        self.route = f"cuDNN {'nn module' if route == 'module' else 'packed buffer'} ({dtype})"
        self.engine = "torch"
        self.name = f"cuda_{route}"
        self.target_slab_check = None
        self.verify_whole = None
        self._back: dict[str, Checkpoint] = {}  # the written file read back (lazily), per nonlinearity read option
        #: the activations' accuracy the one-step bound allows (module docstring); None: the default
        self.act_ulps = CUDNN_ACT_ULPS if dtype == "float32" else None

    def _reader(self, path: Path, ckpt: Checkpoint, name: str) -> Checkpoint:
        """The written file, read back by rnnconvert's reader (lazily where the reader can). A format that
        does not store ``nn.RNN``'s nonlinearity (a ``.pt`` or ``.safetensors`` state dict: the module's
        constructor holds it; the ``nonlinearity`` read option) is read with the source layer's, as torch's own
        target (:func:`rnnconvert.runtimes.torch.step`) builds its module from the source's description:
        read as ``tanh``, a ``SimpleRNN(relu)`` file failed by 0.87 on a GPU."""
        opts = {}
        if "nonlinearity" in (getattr(self.dst_module, "read_options", None) or ()):
            opts["nonlinearity"] = "relu" if ckpt.layer(name).cell is Cell.RNN_RELU else "tanh"
        if getattr(self.dst_module, "lazy", False):
            opts["lazy"] = True
        key = opts.get("nonlinearity", "")
        if key not in self._back:
            self._back[key] = self.dst_module.read(path, **opts)
        return self._back[key]

    def read_back(self, path: Path, ckpt: Checkpoint, name: str) -> RNNLayer:
        """Layer ``name`` of the written file with all its parameters in memory (:meth:`slab` reads one slab)."""
        back = self._reader(path, ckpt, name)
        if not back.lazy:
            return back.layer(name)
        from dataclasses import replace

        i = [layer.name for layer in back.layers].index(name)
        layer = back.layers[i]
        return replace(layer, params=[back.slab(i, k) for k in range(layer.num_layers)])

    @contextlib.contextmanager
    def slab(self, path: Path, ckpt: Checkpoint, name: str, k: int):
        """``with target.slab(...) as one:`` stacked layer ``k`` of layer ``name`` of the written file as a
        one-layer :class:`RNNLayer` in this target's dtype, read alone: a lazy reader's slab (views of its
        mapping, no copy) is released when the block ends."""
        back = self._reader(path, ckpt, name)
        i = [layer.name for layer in back.layers].index(name)
        layer = back.layers[i]
        if not back.lazy:
            yield _cast(layer.one_slab(k), self.dtype)
            return
        try:
            yield _cast(layer.one_slab(k, back.slab(i, k)), self.dtype)
        finally:
            back.release(i, k)

    def release(self) -> None:
        """Let go of the file read back (verification calls this when the target side is done)."""
        self._back.clear()

    def target_arithmetic(self, layer: RNNLayer, x: np.ndarray, finished: bool = True) -> np.ndarray:
        """An emulation of this target's own run of ``layer`` (the source's canonical layer, or one slab of it)
        on ``x`` ``(B, T, I)``, in numpy: float32 with every ``tanh`` off by :data:`CUDNN_TANH_ULPS` ulps in a
        random direction (float32 runs), or with weights, inputs and every activation rounded to float16
        (float16 runs). Verification takes its spread from the float64 run as the size of this target's
        rounding along the sequence (module docstring); it is an estimate, as the source's own float32 spread
        is. ``finished=False``: one slab's output as it feeds the next (no ``go_backwards`` reversal)."""
        from ..core import reference
        from ..speed.kernels import FAST
        from . import bounds

        rng = np.random.default_rng(0)
        if self.dtype == "float32":
            u = bounds.unit_roundoff(np.float32)

            def tanh(z):
                t = np.tanh(z)
                return t + rng.choice(np.array([-1.0, 1.0], t.dtype), t.shape) * (CUDNN_TANH_ULPS * u) * (1 + np.abs(t))
            acts, run, xin = {"tanh": tanh}, layer, np.asarray(x, np.float32)
        else:
            f16 = np.float16

            def rounded(f):
                return lambda z: f(z).astype(f16).astype(z.dtype)
            acts = {k: rounded(reference.ACT[k]) for k in ("tanh", "sigmoid")}
            run, xin = _cast(_cast(layer, "float16"), "float32"), np.asarray(x, f16).astype(np.float32)
        ys = [xin]
        for k in range(run.num_layers):
            ys = reference.forward_slab_multi(run, run.params[k], ys, acts, kernels=FAST)
        y = reference.finish(run, ys[0]) if finished else ys[0]
        return y if self.dtype == "float32" else y.astype(np.float16)

    def target_step(self, path: Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list) -> list:
        """Verification's one-step check on the GPU: stacked layer ``k`` of the file's weights (cast to
        ``dtype``) in a one-layer ``torch.nn`` module on CUDA (cuDNN), one step from each state; both routes
        (the packed-buffer route's sequences are checked by :meth:`target_forward_slab`)."""
        from ..runtimes import torch as torch_rt

        with self.slab(path, ckpt, name, k) as one:
            return torch_rt.step_canonical(one, 0, x, states, device="cuda")

    def _run(self, layer: RNNLayer, x: np.ndarray, spec_of: RNNLayer) -> np.ndarray:
        from ..core import cudnn
        from . import cudnn_layout as cudnn_check

        cudnn_check.check_layout(cudnn.Spec.of(spec_of), getattr(__import__("torch"), self.dtype))
        run = cudnn_check.forward_module if self.way == "module" else cudnn_check.forward_buffer
        return np.asarray(run(layer, x), dtype=np.float64)

    def target_forward_slab(self, path: Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray) -> np.ndarray:
        """Stacked layer ``k`` of layer ``name`` of the written file alone through cuDNN (this target's route) on
        its input ``x`` ``(B, T, I)``; ``(B, T, dirs * out)`` float64. The cuDNN layout of the WHOLE layer's spec
        is checked against :func:`rnnconvert.core.cudnn.layout` first (once per spec and dtype)."""
        with self.slab(path, ckpt, name, k) as one:
            return self._run(one, x, _cast(ckpt.layer(name), self.dtype))

    def target_forward(self, path: Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
        """Layer ``name`` of the written file, slab after slab (:meth:`target_forward_slab`), on ``x``; the last
        slab's output as verification compares it (``go_backwards`` reversal applied)."""
        from ..core import reference

        layer, y = ckpt.layer(name), x
        for k in range(layer.num_layers):
            y = self.target_forward_slab(path, ckpt, name, k, np.asarray(y, np.float32 if self.dtype == "float32"
                                                                         else np.float16))
        return reference.finish(layer, y)

