"""The MLX runtime: a written MLX safetensors file loaded by MLX itself (``mx.load``) into ``mlx.nn.LSTM``/
``GRU``/``RNN`` modules (``Module.load_weights(strict=True)``) and run on the CPU, for verification's target
side. The file is opened from its path (no :attr:`~rnnconvert.engine.protocol.FormatSpec.load`); modules are
found under the names of :func:`rnnconvert.conventions.mlx_names.prefix`. mlx is imported inside the
functions (the ``mlx`` extra: ``pip install mlx[cpu]`` on Linux).

Results are float64; outputs ``(B, T, H)``; steps ``[(h1 (N, H), c1 (N, H) or None)]`` (one direction: MLX
has no bidirectional layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..conventions import mlx_names
from ..core.model import Cell, Checkpoint
from ..engine.protocol import Runtime
from ..errors import FormatError, UnsupportedError, require
from ..speed import filerows

#: the last file's tensors as ``mx.load`` gave them, keyed by the file's identity (:func:`release` drops it)
_LOADED: dict[tuple, Any] = {}


def release() -> None:
    """Drop the cached ``mx.load`` result."""
    _LOADED.clear()


def _tensors(path: str | Path) -> dict:
    key = filerows.identity(path)
    if key not in _LOADED:
        mx = require("mlx.core", "mlx")
        _LOADED.clear()
        _LOADED[key] = mx.load(str(path), format="safetensors")  # a temporary path has no extension
    return _LOADED[key]


def module(path: str | Path, ckpt: Checkpoint, name: str, k: int):
    """``(mlx.nn module, numpy dtype)``: stacked layer ``k`` of layer ``name`` built as the ``mlx.nn`` class of
    its cell and given the file's tensors under :func:`rnnconvert.conventions.mlx_names.prefix` by MLX's own
    ``load_weights(strict=True)`` (names and shapes checked by MLX).

    Raises:
        FormatError: the file has no such module (not written by rnnconvert's MLX writer?).
    """
    nn = require("mlx.nn", "mlx")
    layer = ckpt.layer(name)
    pre = mlx_names.prefix(name, layer.num_layers, k)
    tensors = _tensors(path)
    own = [(key[len(pre) + 1:] if pre else key, v) for key, v in tensors.items()
           if mlx_names.split(key)[0] == pre and mlx_names.split(key)[1] in mlx_names.NAMES]
    if not own:
        raise FormatError(f"{path}: no MLX module '{pre}'")
    m = _build(nn, layer, layer.layer_input_size(k))
    m.load_weights(own, strict=True)
    mx = require("mlx.core", "mlx")
    w = own[0][1].dtype
    return m, (np.float16 if w == mx.float16 else np.float64 if w == mx.float64 else np.float32)


def _build(nn, layer, I: int):
    """The ``mlx.nn`` module of ``layer``'s cell (input size ``I``; a relu RNN as the layer says: MLX does not
    store the nonlinearity)."""
    H = layer.hidden_size
    if layer.cell is Cell.LSTM:
        return nn.LSTM(I, H, bias=layer.bias)
    if layer.cell is Cell.GRU:
        return nn.GRU(I, H, bias=layer.bias)
    return nn.RNN(I, H, bias=layer.bias, nonlinearity=nn.relu if layer.cell is Cell.RNN_RELU else None)


def _run(m, dt, x: np.ndarray, states=None):
    mx = require("mlx.core", "mlx")
    xs = mx.array(np.ascontiguousarray(x, dt))
    if states is None:
        y = m(xs)
    elif isinstance(states, tuple) and len(states) == 2 and states[1] is not None:
        y = m(xs, hidden=mx.array(np.asarray(states[0], dt)), cell=mx.array(np.asarray(states[1], dt)))
    else:
        y = m(xs, hidden=mx.array(np.asarray(states[0], dt)))
    if isinstance(y, tuple):
        return np.asarray(y[0], np.float64), np.asarray(y[1], np.float64)
    return np.asarray(y, np.float64), None


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load=None) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` alone, in MLX, on ``x`` ``(B, T, I_k)`` from zero states:
    ``(B, T, H)`` float64."""
    m, dt = module(path, ckpt, name, k)
    return _run(m, dt, x)[0]


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load=None) -> np.ndarray:
    """Layer ``name`` of the written file in MLX on ``x`` ``(B, T, I)`` from zero states (its stacked modules one
    after the other): ``(B, T, H)`` float64."""
    y = x
    for k in range(ckpt.layer(name).num_layers):
        y = forward_slab(path, ckpt, name, k, y)
    return y


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load=None) -> list:
    """One step of stacked layer ``k`` in MLX from each of ``N`` states (``states[0] = (h0, c0 or None)``), ``x``
    ``(N, I_k)``: ``[(h1, c1 or None)]`` float64 (the module called with ``hidden=`` and, LSTM, ``cell=``)."""
    m, dt = module(path, ckpt, name, k)
    h, c = _run(m, dt, np.asarray(x)[:, None, :], states[0])
    return [(h[:, 0], None if c is None else c[:, 0])]


def framework_forward(src_path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Layer ``name`` of an MLX *source* file run by MLX (``--verify framework``): the file loaded by ``mx.load``
    (``.safetensors`` or ``.npz``, as saved by ``Module.save_weights``), the tensors the reader took for the
    layer (``layer.source['tensors']``: leaf name -> the file's key) given to a fresh ``mlx.nn`` module of its
    class by MLX's ``load_weights(strict=True)``, run on the CPU on ``x`` ``(B, T, I)`` in the file's dtype
    from zero states: ``(B, T, H)`` float64. The source side then owes nothing to rnnconvert's reading of the
    gate blocks and biases (GRU ``b``/``bhn``).

    Raises:
        DependencyError: mlx is not installed. UnsupportedError: a file saved by MLX < 0.18 (weights stored
        transposed, ``(in, G*H)``), which today's ``mlx.nn`` modules cannot load as they are."""
    mx = require("mlx.core", "mlx")
    nn = require("mlx.nn", "mlx")
    layer = ckpt.layer(name)
    src = layer.source
    if src.get("orientation") != "out_in":
        raise UnsupportedError(f"layer '{name}' ({src.get('class_name')}): --verify framework cannot run a file "
                               f"saved by MLX < 0.18 (weights stored (in, G*H)) in mlx {_version()}, whose "
                               "modules take (G*H, in); verify without --verify framework")
    p = Path(src_path)
    arrays = mx.load(str(p), format="npz" if p.suffix == ".npz" else "safetensors")
    own = [(leaf, arrays[key]) for leaf, key in src["tensors"].items()]
    m = _build(nn, layer, layer.input_size)
    m.load_weights(own, strict=True)
    w = own[0][1].dtype
    dt = np.float16 if w == mx.float16 else np.float64 if w == mx.float64 else np.float32
    return _run(m, dt, x)[0]


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mlx")
    except metadata.PackageNotFoundError:
        return "current"


RUNTIME = Runtime("mlx", engine="mlx", forward=forward, forward_slab=forward_slab, step=step, release=release,
                  framework_forward=framework_forward)
