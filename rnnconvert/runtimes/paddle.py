"""The paddle runtime: a written PaddlePaddle ``.pdparams`` loaded by Paddle's own loader (``paddle.load``) into
``paddle.nn.LSTM``/``GRU``/``SimpleRNN`` (``set_state_dict``, every key of the layer used) and run on the CPU, for
verification's target side. Paddle is imported inside the functions (the ``paddle`` extra, ``paddlepaddle``).

Without Paddle (not installed, its import fails, or TensorFlow is already loaded: :func:`framework`) every operation runs the :mod:`torch runtime <.torch>` on
the file's tensors as rnnconvert's reader reads them back -- what verified ``.pdparams`` before this runtime
(Paddle's cells compute PyTorch's equations: ``paddle/nn/layer/rnn.py`` of PaddlePaddle 3.3.1, gate orders
``i f g o`` / ``r z n``, weights ``(G*H, in)``) -- and :func:`stand_in` gives the report that route, so a report
says which of the two ran.

A container hands this runtime a written file through its
:attr:`~rnnconvert.engine.protocol.FormatSpec.load`: ``load(path, layer, k)`` is the torch runtime's view
(``{torch state-dict key: tensor}``, used by the fallback), and ``load(path, layer, k, view="checked")`` passes
the file through rnnconvert's allow-list reader (raising :class:`~rnnconvert.errors.FormatError` for anything
but numeric arrays) before ``paddle.load`` unpickles it: ``rnnconvert verify SRC DST`` may be given a ``DST``
rnnconvert did not write.

Names (:mod:`rnnconvert.formats.paddle.naming`): layer ``name``'s parameters are the keys ``{name}.{k}.cell[_fw|
_bw].weight_ih`` ... and the flat aliases ``{name}.weight_ih_l{k}[_reverse]`` ...; the module is given exactly
the keys of its own ``state_dict()`` under ``{name}.`` (a missing or unexpected key is a
:class:`~rnnconvert.errors.FormatError`). Results are float64: outputs ``(B, T, dirs*out)``, steps
``[(h1 (N, out), c1 (N, H) or None)]`` per direction.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..core.model import Cell, Checkpoint, RNNLayer
from ..engine.protocol import Runtime
from ..errors import DependencyError, FormatError, require
from ..speed import filerows
from . import torch as torch_rt

#: the words of the report's target side when Paddle is missing and the torch runtime runs in its place (``why``:
#: :data:`WHY`; the report appends torch's version)
FALLBACK_ROUTE = "torch.nn on the file's tensors as read back ({why}), torch"
#: why Paddle did not run: not installed, its import failed, or TensorFlow is loaded in the process
WHY = {"missing": "paddle not installed", "broken": "paddle installed but failed to import",
       "tensorflow": "paddle cannot be loaded after TensorFlow in one process"}
#: the last file's ``paddle.load`` result, keyed by the file's identity (:func:`release` drops it)
_LOADED: dict[tuple, Any] = {}
#: the modules built from that file, by layer name
_MODULES: dict[str, Any] = {}
#: ``paddle`` once imported, or ``(key of WHY, DependencyError)`` (decided once per process)
_IMPORTED: list = []


def release() -> None:
    """Drop the cached ``paddle.load`` result and the modules built from it."""
    _LOADED.clear()
    _MODULES.clear()


def framework():
    """The ``paddle`` module, or ``None`` when it cannot be imported: not installed, a broken install, or
    TensorFlow already loaded in this process (``import paddle`` after ``import tensorflow`` is a segmentation
    fault in ``paddle/base/core.py`` with PaddlePaddle 3.3.1 and TensorFlow 2.21 on Linux x86-64, measured
    2026-11-27; the other order works). The first call decides for the process (:func:`stand_in` and the
    operations agree)."""
    if not _IMPORTED:
        if "paddle" not in sys.modules and "tensorflow" in sys.modules:
            _IMPORTED.append(("tensorflow", DependencyError(WHY["tensorflow"])))
        else:
            try:
                _IMPORTED.append(require("paddle", "paddle"))
            except DependencyError as exc:
                broken = "installed but could not be imported" in str(exc)
                _IMPORTED.append(("broken" if broken else "missing", exc))
    got = _IMPORTED[0]
    return None if isinstance(got, tuple) else got


def stand_in() -> tuple[str, str] | None:
    """``("torch", route)`` when Paddle cannot be imported (:func:`framework`; the torch runtime runs the file,
    the route says why, :data:`FALLBACK_ROUTE`), else ``None`` (Paddle runs it):
    :attr:`rnnconvert.engine.protocol.Runtime.stand_in`."""
    if framework() is not None:
        return None
    return "torch", FALLBACK_ROUTE.format(why=WHY[_IMPORTED[0][0]])


def _state(path: str | Path, load) -> dict:
    key = filerows.identity(path)
    if key not in _LOADED:
        paddle = framework()
        load(path, None, None, view="checked")  # the allow-list reader first: paddle.load unpickles
        release()
        _LOADED[key] = paddle.load(str(path))
    return _LOADED[key]


def module(path: str | Path, ckpt: Checkpoint, name: str, load):
    """``paddle.nn.LSTM``/``GRU``/``SimpleRNN`` for layer ``name`` of the written file (its class, sizes,
    direction, projection, biases and relu activation from the written layer ``ckpt.layer(name)``), its
    parameters set by ``set_state_dict`` from ``paddle.load(path)`` under ``{name}.``, in the file's dtype (a
    float16 file in float32, its values exactly: PaddlePaddle 3.3.1's CPU build has no float16 kernels for
    these layers, ``coalesce_tensor`` not registered).

    Built once per file and layer (:func:`release` drops them).

    Raises:
        FormatError: a key of the module is missing from the file, or has a shape Paddle does not load (not
        written by rnnconvert's Paddle writer?)."""
    paddle = framework()
    layer = ckpt.layer(name)
    sd = _state(path, load)
    if name in _MODULES:
        return _MODULES[name]
    pre = name + "."
    first = next((v for k, v in sd.items() if k.startswith(pre)), None)
    if first is None:
        raise FormatError(f"{path}: no Paddle layer '{name}'")
    dtype = str(first.dtype).replace("paddle.", "")
    half = dtype == "float16"  # Paddle's CPU build has no float16 recurrent kernels: run in float32
    old = paddle.get_default_dtype()
    paddle.set_default_dtype("float32" if half else dtype)
    try:
        m = _build(paddle, layer)
    finally:
        paddle.set_default_dtype(old)
    want = set(m.state_dict())
    own = {k[len(pre):]: v for k, v in sd.items() if k.startswith(pre) and k[len(pre):] in want}
    if set(own) != want:
        raise FormatError(f"{path}: the Paddle layer '{name}' lacks {sorted(want - set(own))[:3]}")
    import warnings

    with warnings.catch_warnings():  # a shape Paddle skips ("Skip loading for ...") comes back as missing
        warnings.simplefilter("ignore")
        missing, unexpected = m.set_state_dict({k: v.astype("float32") for k, v in own.items()} if half else own)
    if missing or unexpected:
        raise FormatError(f"{path}: Paddle did not load {sorted(set(missing) | set(unexpected))[:3]} of layer "
                          f"'{name}' (shapes that do not fit paddle.nn.{type(m).__name__})")
    m.eval()
    _MODULES[name] = m
    return m


def _build(paddle, layer: RNNLayer):
    kw: dict[str, Any] = {"num_layers": layer.num_layers, "direction": "bidirect" if layer.bidirectional else "forward"}
    if not layer.bias:
        kw.update(bias_ih_attr=False, bias_hh_attr=False)
    I, H = layer.input_size, layer.hidden_size
    if layer.cell is Cell.LSTM:
        return paddle.nn.LSTM(I, H, proj_size=layer.proj_size or 0, **kw)
    if layer.cell is Cell.GRU:
        return paddle.nn.GRU(I, H, **kw)
    return paddle.nn.SimpleRNN(I, H, activation="relu" if layer.cell is Cell.RNN_RELU else "tanh", **kw)


def _tensor(paddle, a, dtype):
    return paddle.to_tensor(np.ascontiguousarray(np.asarray(a), dtype))


def _np(t) -> np.ndarray:
    return np.asarray(t.numpy(), np.float64)


def _dtype(m) -> np.dtype:
    return np.dtype(str(m.parameters()[0].dtype).replace("paddle.", ""))


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load) -> np.ndarray:
    """Layer ``name`` of the written file in Paddle (the whole ``paddle.nn`` layer) on ``x`` ``(B, T, I)`` from
    zero states: ``(B, T, dirs*out)`` float64. Without Paddle: :func:`rnnconvert.runtimes.torch.forward`."""
    paddle = framework()
    if paddle is None:
        return torch_rt.forward(path, ckpt, name, x, load)
    m = module(path, ckpt, name, load)
    with paddle.no_grad():
        return _np(m(_tensor(paddle, x, _dtype(m)))[0])


def _slab(paddle, m, layer: RNNLayer, k: int, x: np.ndarray, states: list) -> tuple:
    """The layer's ``k``-th ``paddle.nn.RNN``/``BiRNN`` on ``x`` ``(N, T, I_k)`` from ``states`` (one
    ``(h0, c0 or None)`` per direction, always given: the wrapper's own zero states take the cell's
    ``state_shape``, which for a projected ``LSTMCell`` is ``((H,), (P,))`` for ``(h, c)`` -- swapped -- in
    PaddlePaddle 3.3.1, ``paddle/nn/layer/rnn.py`` ``LSTMCell.state_shape``; the whole layer builds its own right):
    ``(y (N, T, dirs*out), [(h1, c1 or None)] per direction)`` float64."""
    dt = _dtype(m)
    lstm = layer.cell is Cell.LSTM
    init = [(_tensor(paddle, s[0], dt), _tensor(paddle, s[1], dt)) if lstm else _tensor(paddle, s[0], dt)
            for s in states]
    with paddle.no_grad():
        y, fin = m[k](_tensor(paddle, x, dt), init[0] if len(init) == 1 else tuple(init))
    fin = [fin] if len(states) == 1 else list(fin)
    return _np(y), [(_np(f[0]), _np(f[1])) if lstm else (_np(f), None) for f in fin]


def _zeros(layer: RNNLayer, n: int) -> list:
    out = layer.proj_size or layer.hidden_size
    c = np.zeros((n, layer.hidden_size)) if layer.cell is Cell.LSTM else None
    return [(np.zeros((n, out)), c)] * layer.num_directions


def forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, load) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` alone (the layer's ``k``-th ``paddle.nn.RNN``/``BiRNN``) on its input
    ``x`` ``(B, T, I_k)`` from zero states: ``(B, T, dirs*out)`` float64. Without Paddle: the torch runtime's."""
    paddle = framework()
    if paddle is None:
        return torch_rt.forward_slab(path, ckpt, name, k, x, load)
    layer = ckpt.layer(name)
    return _slab(paddle, module(path, ckpt, name, load), layer, k, np.asarray(x), _zeros(layer, len(x)))[0]


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load) -> list:
    """One step of stacked layer ``k`` of layer ``name`` in Paddle from each of ``N`` states per direction
    (``states[d] = (h0 (N, out), c0 (N, H) or None)``), ``x`` ``(N, I_k)`` fed as ``N`` sequences of length 1 to
    the layer's ``k``-th ``paddle.nn.RNN``/``BiRNN`` with those initial states (LSTM ``(h, c)``; ``BiRNN``: one
    per direction): ``[(h1, c1 or None)]`` float64 per direction. Without Paddle: the torch runtime's."""
    paddle = framework()
    if paddle is None:
        return torch_rt.step(path, ckpt, name, k, x, states, load)
    m = module(path, ckpt, name, load)
    return _slab(paddle, m, ckpt.layer(name), k, np.asarray(x)[:, None, :], states)[1]


RUNTIME = Runtime("paddle", engine="paddlepaddle", forward=forward, forward_slab=forward_slab, step=step,
                  release=release, stand_in=stand_in)
