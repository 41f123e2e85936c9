"""The torch runtime: ``torch.nn`` modules built from a state dict and run on CPU (or a GPU), for
verification's target side of every container holding PyTorch-named tensors (``.pt``, safetensors) and for
:func:`rnnconvert.api.torch_modules`.

A container hands this runtime a written file through its :attr:`~rnnconvert.engine.protocol.FormatSpec.load`:
``load(path, layer, k) -> {state-dict key: torch tensor}``, the tensors of layer ``layer`` (``k`` ``None``),
or of its stacked layer ``k``, under the full layer's names (:mod:`rnnconvert.conventions.torch_state`).
torch is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from ..conventions import torch_names as naming
from ..conventions import torch_state
from ..conventions.torch_names import module_args
from ..core.model import Cell, Checkpoint, RNNLayer
from ..engine.protocol import Runtime
from ..errors import FormatError, require


def build_module(layer: RNNLayer, sd: dict[str, Any], *, assign: bool = False):
    """A ``torch.nn`` module for ``layer`` loaded (strict) from the tensors ``sd`` under ``<layer>.``.

    ``assign=True`` (verification): the module is built on the meta device and takes the tensors of
    ``sd`` themselves (``load_state_dict(assign=True)``: no random initialisation of GB-sized parameters,
    no copy); the tensors may then be read-only file mappings, so the module must not be trained.
    ``assign=False`` (default): a normal module with its own parameters, copied from ``sd``."""
    torch = require("torch", "torch")
    cls = getattr(torch.nn, naming.MODULE[layer.cell])
    mod = cls(**module_args(layer), device="meta") if assign else cls(**module_args(layer))
    prefix = layer.name + "."
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
    if naming.is_cell(layer):  # nn.LSTMCell keys load into the equivalent one-layer nn.LSTM
        sub = {k + naming.suffix(0, 0): v for k, v in sub.items()}
    first = next(iter(sub.values()))
    mod = mod.to(first.dtype)
    mod.load_state_dict(sub, strict=True, assign=assign)
    return mod.eval()


def modules(ckpt: Checkpoint) -> dict[str, Any]:
    """Ready ``torch.nn`` modules for every layer of ``ckpt``, by layer name (eval mode, batch_first).

    Assumes the layers pass :func:`rnnconvert.conventions.torch_state.check` (:func:`rnnconvert.api.torch_modules` checks).
    """
    torch = require("torch", "torch")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in torch_state.state_dict(ckpt).items()}
    return {layer.name: build_module(layer, sd) for layer in ckpt.layers}


def _big(layer: RNNLayer) -> bool:
    """Whether verification builds ``layer``'s module on the meta device and takes the file's tensors as they
    are (:func:`build_module` ``assign=True``: no random initialisation and copy of GB-sized parameters,
    1.4 s per GB here); small layers get a normal module (the meta machinery costs a 0.3 s import, more than
    their whole check)."""
    return layer.params[0][0].w_ih.size + layer.params[0][0].w_hh.size > (1 << 22)


@contextlib.contextmanager
def native_kernels(torch):
    """torch's own CPU recurrent kernels for verification runs (``torch.backends.mkldnn.enabled`` off while
    inside, restored after). With oneDNN on, every ``nn.LSTM``/``nn.GRU`` call on CPU reorders all its
    weights into a fresh oneDNN buffer: for a verification batch of a few states that copy is the whole
    cost (one 400 MB bidirectional LSTM(2048) layer, a short sequence and one step: 0.58 s and 197 000 page
    faults against 0.18 s and none, docs/performance.md session 7). Either is torch computing from the
    file's tensors; the one-step bound assumes only float32 arithmetic, which both use."""
    old = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = old


def run_module(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """Build the ``torch.nn`` module of ``layer`` from torch tensors ``sd`` and run it on ``x`` (torch's native
    CPU kernels, :func:`native_kernels`); float64 result."""
    torch = require("torch", "torch")
    mod = build_module(layer, sd, assign=_big(layer))
    dtype = next(mod.parameters()).dtype
    with torch.no_grad(), native_kernels(torch):
        y, _ = mod(torch.from_numpy(np.asarray(x)).to(dtype))
    return y.double().numpy()


def run_slab(layer: RNNLayer, k: int, get, x: np.ndarray) -> np.ndarray:
    """Run stacked layer ``k`` of ``layer`` alone, as a one-layer ``torch.nn`` module loaded from the
    tensors ``get(key)`` (torch tensors, ``key`` in the full layer's naming ``<layer>.weight_ih_l{k}...``),
    on its input ``x`` ``(B, T, I_k)``; float64 ``(B, T, dirs*H)``. Verification of one slab at a time.

    Raises:
        FormatError: a tensor of the slab is missing from the file."""
    return run_module(*slab_state(layer, k, get), x)


def run_step(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray, states: list, device: str = "cpu") -> list:
    """One step of every direction of the one-layer ``layer`` (a slab, :meth:`RNNLayer.one_slab`) in its
    ``torch.nn`` module loaded from ``sd``: ``x`` ``(N, I)`` is fed as ``N`` sequences of length 1, each
    direction starting from its own ``states[d] = (h0 (N, out), c0 (N, H) or None)`` (torch ``h0``/``c0``,
    ``(D, N, .)``). Returns ``[(h1, c1 or None)]`` per direction, float64. Verification's one-step check
    (torch's native CPU kernels, :func:`native_kernels`).
    ``device='cuda'``: the module runs on the GPU (cuDNN)."""
    torch = require("torch", "torch")
    mod = build_module(layer, sd, assign=_big(layer)).to(device)
    dt = next(mod.parameters()).dtype
    h0 = torch.from_numpy(np.stack([np.asarray(s[0]) for s in states])).to(device, dt).contiguous()
    with torch.no_grad(), native_kernels(torch):
        xt = torch.from_numpy(np.asarray(x)[:, None, :]).to(device, dt)
        if layer.cell is Cell.LSTM:
            c0 = torch.from_numpy(np.stack([np.asarray(s[1]) for s in states])).to(device, dt).contiguous()
            _, (hn, cn) = mod(xt, (h0, c0))
            return [(hn[d].double().cpu().numpy(), cn[d].double().cpu().numpy()) for d in range(len(states))]
        _, hn = mod(xt, h0)
        return [(hn[d].double().cpu().numpy(), None) for d in range(len(states))]


def run_both(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray, xf: np.ndarray, states: list) -> tuple:
    """:func:`run_module` on ``x`` ``(B, T, I)`` and :func:`run_step` on ``xf`` ``(N, I)`` from ``states`` in one call
    of the one-layer ``layer``'s ``torch.nn`` module loaded from ``sd``: a packed batch
    (``torch.nn.utils.rnn.pack_padded_sequence``) of the ``B`` sequences of length ``T`` from zero states and
    the ``N`` sequences of length 1 from ``states`` (torch ``h0``/``c0`` per sequence; each direction, the
    reverse one too, takes one step from its own state). Each weight matrix is then read (and packed by
    torch's GEMM) once for the input products of both, not twice: the 3 GB benchmark's target side, 150 ->
    90 ms per bidirectional LSTM(2048) layer (docs/performance.md, session 8). Returns ``(y, steps)``: float64
    ``(B, T, dirs*out)``, and ``[(h1, c1 or None)]`` per direction as :func:`run_step`. torch's native CPU
    kernels (:func:`native_kernels`). The same results as the two calls, up to the order of GEMM sums."""
    torch = require("torch", "torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    mod = build_module(layer, sd, assign=_big(layer))
    dt = next(mod.parameters()).dtype
    x, xf = np.asarray(x), np.asarray(xf)
    (B, T, I), N, D = x.shape, xf.shape[0], len(states)
    with torch.no_grad(), native_kernels(torch):
        xp = torch.zeros((B + N, T, I), dtype=dt)
        xp[:B] = torch.from_numpy(x).to(dt)
        xp[B:, 0] = torch.from_numpy(xf).to(dt)
        h0 = torch.zeros((D, B + N, states[0][0].shape[1]), dtype=dt)
        h0[:, B:] = torch.from_numpy(np.stack([np.asarray(s[0]) for s in states])).to(dt)
        packed = pack_padded_sequence(xp, torch.tensor([T] * B + [1] * N), batch_first=True, enforce_sorted=False)
        if layer.cell is Cell.LSTM:
            c0 = torch.zeros((D, B + N, layer.hidden_size), dtype=dt)
            c0[:, B:] = torch.from_numpy(np.stack([np.asarray(s[1]) for s in states])).to(dt)
            out, (hn, cn) = mod(packed, (h0, c0))
        else:
            out, hn = mod(packed, h0)
            cn = None
        y, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
    return y[:B].double().numpy(), [(hn[d, B:].double().numpy(), None if cn is None else cn[d, B:].double().numpy())
                                    for d in range(D)]


def slab_state(layer: RNNLayer, k: int, get) -> tuple[RNNLayer, dict[str, Any]]:
    """Stacked layer ``k`` of ``layer`` as a one-layer layer and its ``torch.nn`` tensors, taken with
    ``get(key)`` (``key`` in the full layer's naming) and renamed to the one-layer module's.

    Raises:
        FormatError: a tensor of the slab is missing from the file."""
    one = layer.one_slab(k)
    sd = {}
    for (key, _, _), (new, _, _) in zip(torch_state.slab_plan(layer, k), torch_state.slab_plan(one, 0)):
        try:
            sd[new] = get(key)
        except KeyError:
            raise FormatError(f"the written file has no tensor '{key}'") from None
    return one, sd


def step_canonical(layer: RNNLayer, k: int, x: np.ndarray, states: list, device: str = "cpu") -> list:
    """:func:`run_step` of stacked layer ``k`` of ``layer`` from its canonical parameters (read back from a
    written file by rnnconvert's reader: npz, cuDNN buffers), in ``torch.nn``."""
    torch = require("torch", "torch")
    one = layer.one_slab(k)
    sd = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in torch_state.state_dict(Checkpoint(layers=[one])).items()}
    return run_step(one, sd, x, states, device)



def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Run layer ``name`` of the written file ``path`` in torch on ``x`` ``(B, T, I)``; float64 result."""
    layer = ckpt.layer(name)
    return run_module(layer, load(path, layer, None), x)


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` of the written file alone, in torch, on its input ``x``."""
    layer = ckpt.layer(name)
    return run_slab(layer, k, load(path, layer, k).__getitem__, x)


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """Verification's one-step check: stacked layer ``k`` of layer ``name`` of the written file in a one-layer
    ``torch.nn`` module, one step from each of the given states (:func:`run_step`)."""
    layer = ckpt.layer(name)
    one, sd = slab_state(layer, k, load(path, layer, k).__getitem__)
    return run_step(one, sd, x, states)


def slab_check(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, xf: np.ndarray,
               states: list, load) -> tuple:
    """:func:`forward_slab` on ``x`` and :func:`step` on ``xf`` from ``states`` of stacked layer ``k`` of layer
    ``name`` of the written file, in one torch call (:func:`run_both`)."""
    layer = ckpt.layer(name)
    one, sd = slab_state(layer, k, load(path, layer, k).__getitem__)
    return run_both(one, sd, x, xf, states)


RUNTIME = Runtime("torch", engine="torch", forward=forward, forward_slab=forward_slab, step=step,
                  slab_check=slab_check)
