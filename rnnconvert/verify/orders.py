"""Float32 spreads measured over several evaluation orders of the canonical equations (issue #39, rule B: the
measured sequence tolerance of :func:`rnnconvert.verify.verdict.measured`).

The sequence comparison's tolerance has a float32 term: the spread of the source's own float32 run from its
float64 run over the short sequence. One run is one sample of a rounding that a target evaluating the same
equations in another order (another BLAS kernel, blocked or unblocked sums, another thread count) does not
reproduce: onnxruntime on the tf_keras reset-before GRU fixture parted from the float64 run by 7.7e-5 where
numpy's float32 run parted by 3.7e-5. Where a target's sequence lands above that one-sample tolerance,
:func:`spread` measures the spread again over :data:`ORDERS` independent float32 evaluations of the same
equations on the same inputs (numpy's BLAS; blocked sums added in reverse order; an unblocked sequential sum;
numpy's BLAS with every activation one ulp off, in a seeded
random direction: a framework's own ``exp``/``tanh`` differ from numpy's by about that, and along the reset-before
GRU fixtures that doubles the spread), and the verdict uses the largest
(:meth:`rnnconvert.verify.engine.StreamedVerification.judge`; docs/cli.md "Verdicts").
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..core import reference
from ..core.model import RNNLayer

#: a sequence error is "far above" float32 rounding when it exceeds this many times the largest spread measured
#: over the evaluation orders (the tolerance's float32 term is twice one spread: this is twice that)
FAR = 4.0


def _blas(w: np.ndarray, vs: list[np.ndarray]) -> list[np.ndarray]:
    return [w.astype(v.dtype, copy=False) @ v for v in vs]


def _blocked(w: np.ndarray, vs: list[np.ndarray], blocks: int = 4) -> list[np.ndarray]:
    """``w @ v`` as ``blocks`` partial products over column blocks of ``w``, added last block first."""
    out = []
    for v in vs:
        wv = w.astype(v.dtype, copy=False)
        edges = np.linspace(0, w.shape[1], blocks + 1).astype(int)
        acc = np.zeros((w.shape[0], v.shape[1]), v.dtype)
        for lo, hi in reversed(list(zip(edges[:-1], edges[1:]))):
            acc = acc + wv[:, lo:hi] @ v[lo:hi]
        out.append(acc)
    return out


def _sequential(w: np.ndarray, vs: list[np.ndarray]) -> list[np.ndarray]:
    """``w @ v`` summed term by term, column ``k`` of ``w`` after column ``k - 1`` (no blocking, no FMA)."""
    out = []
    for v in vs:
        wv = w.astype(v.dtype, copy=False)
        acc = np.zeros((w.shape[0], v.shape[1]), v.dtype)
        for k in range(w.shape[1]):
            acc += wv[:, k:k + 1] * v[k:k + 1]
        out.append(acc)
    return out


def _kernels(products) -> SimpleNamespace:
    return SimpleNamespace(products=products, widened=lambda a, reuse=False: None if a is None else
                           (a.astype(np.float32) if a.dtype == np.float16 else a))


#: the float32 evaluation orders: ``(name, products)``. The same set in every process: torch's kernels, once an
#: order here where torch happened to be imported, made the tolerance depend on what the process had loaded
ORDERS = (("numpy BLAS", _blas), ("blocked sums, reversed", _blocked), ("sequential sums", _sequential),
          ("activations one ulp off", _blas))


def _ulp_off(rng: np.random.Generator) -> dict:
    """Every activation of :data:`rnnconvert.core.reference.ACT` with its float32 result moved by one unit of
    roundoff of ``1 + |act(z)|`` up or down (``rng``): another correct ``exp``/``tanh``."""
    u = 2.0 ** -24

    def off(f):
        def g(z):
            t = f(z)
            return (t + rng.choice(np.array([-1.0, 1.0], t.dtype), t.shape) * u * (1 + np.abs(t))).astype(t.dtype)
        return g
    return {k: off(f) for k, f in reference.ACT.items()}


def _run32(layer: RNNLayer, x: np.ndarray, products, acts: dict | None, finished: bool) -> np.ndarray:
    ys = [np.asarray(x, np.float32)]
    for k in range(layer.num_layers):
        ys = reference.forward_slab_multi(layer, layer.params[k], ys, acts, kernels=_kernels(products))
    return reference.finish(layer, ys[0]) if finished else ys[0]


def spread(layer: RNNLayer, x: np.ndarray, ref: np.ndarray | None = None,
           finished: bool = True) -> tuple[float, list[str]]:
    """``(largest spread, orders used)``: the largest ``max |y32 - y64|`` of ``layer`` on ``x`` (``(B, T, I)``)
    over the float32 evaluation orders of :data:`ORDERS`, ``y64`` the canonical float64 run (``ref`` where
    given: the same run, finished or not as ``finished`` says). Cost: one float32 run per order of the short
    sequence (the sequential order ``K`` vector operations per product). Deterministic for given inputs and
    kernels (the one-ulp order is seeded)."""
    x = np.asarray(x)
    run = reference.forward if finished else _unfinished
    y64 = run(layer, x.astype(np.float64), np.float64) if ref is None else np.asarray(ref, np.float64)
    worst, used = 0.0, []
    for name, products in ORDERS:
        acts = _ulp_off(np.random.default_rng(39)) if name == "activations one ulp off" else None
        y32 = _run32(layer, x, products, acts, finished)
        worst = max(worst, float(np.abs(np.asarray(y32, np.float64) - y64).max()))
        used.append(name)
    return worst, used


def _unfinished(layer: RNNLayer, x: np.ndarray, dtype, kernels=reference.PLAIN) -> np.ndarray:
    y = np.asarray(x, dtype)
    for k in range(layer.num_layers):
        y = reference.forward_slab(layer, layer.params[k], y, dtype, kernels=kernels)
    return y


def step_spread(layer: RNNLayer, p, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
                exact: tuple) -> tuple[tuple, list[str]]:
    """``((sh, sc), orders used)``: per element, the largest ``|s32 - s|`` of one step of direction ``p`` of
    ``layer`` from the states ``x`` ``(N, I)``, ``h0``, ``c0`` over the float32 evaluation orders of :data:`ORDERS`,
    ``s = exact`` the exact (float64) step ``(h1, c1)`` (``sc`` None but for LSTM); float64 arrays of the shapes of
    ``h1``, ``c1``. What the one-step comparison's measured tolerance is made of
    (:func:`step_tolerance`). Cost: one float32 step per order (the sequential order
    ``K`` vector operations per product). Deterministic for given inputs (the one-ulp order is seeded)."""
    worst: list = [None, None]
    used = []
    for name, products in ORDERS:
        acts = _ulp_off(np.random.default_rng(39)) if name == "activations one ulp off" else None
        got = reference.step(layer, p, x, h0, c0, np.float32, kernels=_kernels(products), acts=acts)
        for j, (a, e) in enumerate(zip(got, exact)):
            if e is not None:
                d = np.abs(np.asarray(a, np.float64) - e)
                worst[j] = d if worst[j] is None else np.maximum(worst[j], d)
        used.append(name)
    return tuple(worst), used


#: the one-step comparison: an element beyond its measured tolerance (:func:`step_tolerance`) by more than this
#: factor is ``fail`` (docs/cli.md "Verdicts", rule 1); between the two, ``inconclusive`` (rule 6b)
STEP_FAIL = 2.0


def step_tolerance(exact: tuple, bound: tuple, spread: tuple, u: float) -> tuple[tuple, float]:
    """The measured one-step tolerance of one direction: ``((th, tc), r)``, per element of ``h_1`` (and ``c_1``;
    ``tc`` None but for LSTM) ``min(B, FAR r B + 2 u |s|)``, ``B`` the rigorous bound (``bound``,
    :func:`rnnconvert.verify.bounds.step_bound`), ``s`` the exact step (``exact``), and ``r`` the largest fraction
    of its bound that the measured float32 spread (``spread``, :func:`step_spread`) reaches at any element of
    either output: the rounding several evaluation orders actually show, as a share of the worst case the bound
    allows, applied to every element through the bound's own shape (its magnitudes ``|W||v|``, its activations'
    slopes), so that no element's tolerance rests on the one sample its own spread is. float64 arrays of the
    shapes of ``bound``; ``r`` at most 1."""
    r = 0.0
    for s, b in zip(spread, bound):
        if s is not None and b is not None and b.size:
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.where(b > 0, s / np.where(b > 0, b, 1.0), np.where(s > 0, np.inf, 0.0))
            r = max(r, float(np.nan_to_num(q, nan=np.inf).max()))
    r = min(r, 1.0)
    tol = tuple(None if b is None else applied(e, b, r, u) for e, b in zip(exact, bound))
    return tol, r


def applied(exact: np.ndarray, bound: np.ndarray, r: float, u: float) -> np.ndarray:
    """The measured tolerance ``min(B, FAR r B + 2 u |s|)`` of the elements of an exact step ``s`` (``exact``) with
    bound ``B`` (``bound``), ``r`` the direction's measured share of its bound (:func:`step_tolerance`): float64 of
    their (broadcast) shape. Also what rule A asks of a slipped step's own rounding where the measured tolerance
    decides (:func:`rnnconvert.verify.escapes.swap_escapes`' ``tolerance``; docs/cli.md "Verdicts")."""
    return np.minimum(bound, FAR * r * bound + 2.0 * u * np.abs(exact))
