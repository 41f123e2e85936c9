"""The float64 side of verification on the GPU (``--device cuda``, issue #33): the products of the source's
equations and of the one-step bound (:func:`rnnconvert.speed.kernels.products`,
:func:`~rnnconvert.speed.kernels.left_products`, :func:`rnnconvert.verify.bounds.lin`) computed by torch on CUDA in
the dtype the CPU computes them in (float64 for the exact side, float32 for the source's float32 run), TF32 off.

Only the products move: the elementwise equations stay in numpy, and so does every decision. Each weight
matrix goes to the GPU once per slab (float32 or float16 as stored, widened there: exact) and stays while the
slab is checked (:func:`forget` after it); the products of a few dozen rows come back. A float64 sum on the GPU
is as accurate as one on the CPU (``gamma_K(2**-53)``, in another order), so the bound's magnitude,
``|v| @ |w|.T``, is raised by that sum's own error bound (:func:`lin`) to stay an upper bound.

Off unless :func:`using` turned it on (``api.convert``/``api.verify`` with ``device='cuda'``) and torch sees a CUDA
device; off under the plain fallback (``RNNCONVERT_SPEED=plain``).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import backend

_state = {"on": False, "device": "cuda"}  # "device": where torch puts the products (a test runs them on "cpu")
_lock = threading.Lock()
_cache: dict[int, tuple] = {}  # id(w) -> (w, the tensor on the GPU in float64, in float32): one slab's weights


def active() -> bool:
    """Whether the products run on the GPU now."""
    return _state["on"]


@contextlib.contextmanager
def using(on: bool):
    """The block with the products on the GPU when ``on`` and torch sees CUDA (else unchanged); the cached
    weights are let go at the end."""
    before = _state["on"]
    if on and not backend.plain():
        try:
            import torch

            _state["on"] = bool(torch.cuda.is_available())
        except ImportError:
            pass
    try:
        yield
    finally:
        _state["on"] = before
        forget()


def forget() -> None:
    """Let go of the weights kept on the GPU (verification calls this after each slab: a lazy reader may reuse
    the same arrays for the next slab's values)."""
    with _lock:
        _cache.clear()


def _torch():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def _weight(w: np.ndarray, dt):
    """``w`` on the GPU in ``dt`` (torch dtype), sent once per slab (:func:`forget`)."""
    torch = _torch()
    with _lock:
        got = _cache.get(id(w))
        if got is None or got[0] is not w:
            t = torch.from_numpy(np.ascontiguousarray(w)).to(_state["device"])
            got = _cache[id(w)] = (w, t, {})
        base, conv = got[1], got[2]
        if base.dtype == dt:
            return base
        if dt not in conv:
            conv[dt] = base.to(dt)
        return conv[dt]


def _dtype(np_dtype):
    torch = _torch()
    return {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32,
            np.dtype(np.float16): torch.float16}[np.dtype(np_dtype)]


def _vec(v: np.ndarray, dt):
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(v)).to(_state["device"], dt)


def products(w: np.ndarray, vs: list[np.ndarray]) -> list[np.ndarray]:
    """``[w @ v for v in vs]`` on the GPU, each in ``v``'s dtype (:func:`rnnconvert.speed.kernels.products`)."""
    out = []
    for v in vs:
        dt = _dtype(v.dtype)
        out.append((_weight(w, dt) @ _vec(v, dt)).cpu().numpy())
    return out


def left_products(xs: list[np.ndarray], w: np.ndarray) -> list[np.ndarray]:
    """``[x @ w for x in xs]`` on the GPU, each in ``x``'s dtype (:func:`rnnconvert.speed.kernels.left_products`)."""
    out = []
    for x in xs:
        dt = _dtype(x.dtype)
        out.append((_vec(x, dt) @ _weight(w, dt)).cpu().numpy())
    return out


def lin(w: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(v @ w.T, M)`` in float64 on the GPU, ``M >= |v| @ |w|.T`` (:func:`rnnconvert.verify.bounds.lin`): the
    magnitude summed in float64 and raised by ``(1 + 2 gamma_K(2**-53))`` for that sum's own rounding (Higham
    eq. 3.5: any order)."""
    torch = _torch()
    w64 = _weight(w, torch.float64)
    v64 = _vec(np.asarray(v, np.float64), torch.float64)
    K = w.shape[1]
    g = K * 2.0 ** -53 / (1.0 - K * 2.0 ** -53)
    val = (v64 @ w64.T).cpu().numpy()
    mag = ((v64.abs() @ w64.abs().T) * (1.0 + 2.0 * g)).cpu().numpy()
    return val, mag
