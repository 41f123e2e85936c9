"""Check that a written file computes the same function as its source.

Source side: the source format's own equations on its own tensors when the format module offers
``source_forward`` (Keras: :mod:`rnnconvert.formats.keras.keras_math`), else the canonical numpy
reference (:mod:`rnnconvert.core.reference`); with ``mode='framework'`` the source framework itself
(``framework_forward``, e.g. tf_keras). Target side: the target framework running the written file
(``target_forward`` of the target format module: torch, onnxruntime, ...).

Rule, in two stages (:func:`agreement`, then :func:`layer_check`):

1. The source side is computed in float32, the precision the weights are stored in (float16 weights
   widened exactly). The layer passes when the target agrees with it within
   ``first * max(1, max|y32|)``, ``first = 1e-5`` (``1e-2`` for float16 weights, which frameworks may
   run in float16). Two float32 computations of the same function differ by ~1e-7 relative on a
   well-conditioned layer; a layout slip (swapped gates, a transposed matrix, a dropped bias) by O(1).
2. Only a layer that misses that bound is computed again in float64 and judged against it with
   ``atol = first * max(1, max|y64|) + 2 * max|y64 - y32|``. The second term measures how
   ill-conditioned the layer is on this batch (a GRU with ``activation='linear'`` and inputs of size 30
   loses 5e-4 relative precision in float32, whichever framework runs it); for well-conditioned layers
   it is ~1e-7 and the first term dominates.

A layer that passes stage 1 passes stage 2 too: ``max|y - y64| <= max|y - y32| + max|y32 - y64|`` and
``max(1, max|y32|) <= max(1, max|y64|) + max|y32 - y64|`` (with ``first <= 1``). So the two stages accept
exactly what the float64 rule alone accepts; stage 1 only skips the float64 pass where its verdict is
known. The report says which rule decided (:attr:`LayerCheck.reference`). The float64 pass costs about 3x the
float32 one (each weight block cast, and twice the bytes), which is why it runs only when needed: for
a multi-GB checkpoint the float32 source side is a few passes over the weights at memory speed
(docs/performance.md, session 4).

Cost (multi-GB checkpoints): the source side reads each layer's stored tensors once (lazily re-read
tensors are held for that layer only); the input projections ``x_t W`` of all steps are one product;
the first step's recurrent product (a zero state) is not computed. Target sessions that load the whole
written file (onnxruntime) are built once per verification (``release`` verb).

Streamed conversions (:func:`rnnconvert.api.convert` with a ``LAZY`` reader and a ``STREAM`` writer) use
:class:`StreamedVerification`: the same batch, routes, tolerance and report, with the source side run
slab by slab while each slab is in memory and the target side reading the written file back one layer
(or one slab, ``target_forward_slab``) at a time; :func:`layer_check` is the comparison of both paths.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core import reference
from ..errors import FormatError, VerificationError
from ..core.model import Checkpoint, RNNLayer


@dataclass
class LayerCheck:
    """The comparison of one layer: max abs error of target vs source, and the tolerance used."""

    name: str
    max_abs_err: float
    tolerance: float
    max_abs_ref: float
    source_route: str
    target_route: str
    #: which rule decided: ``'float32'`` (agreement with the float32 source side) or ``'float64'``
    reference: str = "float64"

    @property
    def ok(self) -> bool:
        return bool(self.max_abs_err <= self.tolerance)


@dataclass
class VerifyReport:
    """Per-layer checks plus the batch used and the time spent."""

    layers: list[LayerCheck] = field(default_factory=list)
    batch: int = 0
    steps: int = 0
    seed: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.layers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for c, lc in zip(d["layers"], self.layers):
            c["ok"] = lc.ok
        d["ok"] = self.ok
        return d

    def raise_if_failed(self) -> None:
        """Raise :class:`VerificationError` naming the worst layer when any layer is out of tolerance."""
        bad = [c for c in self.layers if not c.ok]
        if bad:
            c = max(bad, key=lambda c: c.max_abs_err / max(c.tolerance, 1e-30))
            raise VerificationError(
                f"verification failed: layer '{c.name}' differs by {c.max_abs_err:.3g} "
                f"(tolerance {c.tolerance:.3g}); the output was not written. Please report this with the file")


#: The verification batch ``(sequences, steps)``: 3 random sequences of 8 steps ...
SAMPLE = (3, 8)
#: ... and for a checkpoint with at least :data:`LARGE_BYTES` of recurrent parameters, the same 24 input
#: vectors as 6 sequences of 4 steps. Every step is one pass over each ``W_hh`` on both sides (the numpy
#: source side and the target framework), bound by reading it from memory, while more sequences ride
#: along for free; so a multi-GB model verifies in about half the time (docs/performance.md, Session 3).
#: Four steps still exercise the recurrence (every ``W_hh`` entry meets a non-zero state from step 2 on)
#: and tell the directions apart.
SAMPLE_LARGE = (6, 4)
LARGE_BYTES = 256 << 20


def sample_shape(ckpt: Checkpoint) -> tuple[int, int]:
    """``(batch, steps)`` of the verification batch for ``ckpt`` (:data:`SAMPLE`, :data:`SAMPLE_LARGE`);
    placeholders of a lazy checkpoint count at their declared size."""
    nbytes = sum(int(a.size) * a.dtype.itemsize for layer in ckpt.layers for dirs in layer.params
                 for dp in dirs for a in dp.arrays().values())
    return SAMPLE_LARGE if nbytes >= LARGE_BYTES else SAMPLE


def _sample(ckpt: Checkpoint, batch: int | None, steps: int | None) -> tuple[int, int]:
    b, t = sample_shape(ckpt)
    return (b if batch is None else batch), (t if steps is None else steps)


def _batches(ckpt: Checkpoint, batch: int, steps: int, seed: int, inputs: dict | None) -> list[np.ndarray]:
    """Each layer's input batch, float32 ``(batch, steps, input_size)``: ``inputs[layer.name]`` when given
    (any batch and steps), else drawn from ``N(0, 1)`` (``default_rng(seed)``, one draw per layer in order,
    drawn whether or not the layer has given inputs, so that a layer's batch does not depend on the others').

    Raises:
        FormatError: a given input is not 3-D with the layer's input size last, or names no layer.
    """
    inputs = dict(inputs or {})
    rng = np.random.default_rng(seed)
    out = []
    for layer in ckpt.layers:
        x = rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
        given = inputs.pop(layer.name, None)
        if given is not None:
            given = np.asarray(given)
            if given.ndim != 3 or given.shape[-1] != layer.input_size or given.size == 0:
                raise FormatError(f"verification input for layer '{layer.name}' has shape {given.shape}; "
                                  f"expected (batch, steps, {layer.input_size})")
            x = np.ascontiguousarray(given, dtype=np.float32)
        out.append(x)
    if inputs:
        raise FormatError(f"verification inputs name no recurrent layer: {', '.join(sorted(inputs))} "
                          f"(layers: {', '.join(l.name for l in ckpt.layers)})")
    return out


def _own_equations(src_module, layer: RNNLayer) -> bool:
    """Whether the source format can run ``layer`` from its own stored tensors (``source_forward``)."""
    return getattr(src_module, "source_forward", None) is not None and layer.source.get("raw") is not None


@contextmanager
def _raw_held(layer: RNNLayer, pool: dict | None = None):
    """Within the block, ``layer.source['raw']`` holds plain dicts: lazily re-read tensors (Keras HDF5
    :class:`~rnnconvert.formats.keras.keras_h5.LazyRaw`) are read from the file (large plain tensors as
    read-only memory maps) for one pass of the source side, then dropped again (one layer's file tensors at a time). With a
    ``pool`` (a dict the caller keeps across layers), they are read into the previous layer's arrays of
    the same shape (no fresh multi-MB allocations; see ``LazyRaw.read``)."""
    raw = layer.source.get("raw")
    if not isinstance(raw, list) or all(isinstance(r, dict) for r in raw):
        yield
        return
    held = []
    for d, r in enumerate(raw):
        if hasattr(r, "read"):
            got = {key: r.read(key, None if pool is None else pool.get((d, key))) for key in r}
            if pool is not None:
                pool.update({(d, key): a for key, a in got.items()})
            held.append(got)
        else:
            held.append(dict(r))
    layer.source["raw"] = held
    try:
        yield
    finally:
        layer.source["raw"] = raw


def _source(src_module, layer: RNNLayer, x: np.ndarray, dtype) -> np.ndarray:
    """The source side of ``layer`` on ``x``, computed in ``dtype`` (float32 first, float64 when
    :func:`agreement` is not met): the source format's own equations on its stored tensors when it has
    them (``source_forward``), else the numpy reference on the canonical parameters."""
    xd = np.asarray(x, dtype=dtype)
    if _own_equations(src_module, layer):
        return src_module.source_forward(layer, xd, dtype)
    return reference.forward(layer, xd, dtype)


def _first(layer: RNNLayer, first_tol: float | None) -> float:
    return first_tol or (1e-2 if layer.dtype == np.float16 else 1e-5)


def agreement(layer: RNNLayer, y: np.ndarray, y32: np.ndarray, route: str, target_route: str,
              first_tol: float | None = None) -> LayerCheck:
    """Stage 1 of the rule (module docstring): the target's ``y`` against the float32 source side ``y32``,
    within ``first * max(1, max|y32|)``.

    Raises:
        VerificationError: the output shapes differ.
    """
    if y.shape != y32.shape:
        raise VerificationError(f"verification failed: layer '{layer.name}' output shape {y.shape} "
                                f"differs from the source's {y32.shape}")
    y32 = np.asarray(y32, np.float64)
    ref = float(np.abs(y32).max())
    return LayerCheck(layer.name, float(np.abs(y - y32).max()), _first(layer, first_tol) * max(1.0, ref), ref,
                      route, target_route, "float32")


def layer_check(layer: RNNLayer, y: np.ndarray, y64: np.ndarray, y32: np.ndarray, route: str, target_route: str,
                first_tol: float | None = None) -> LayerCheck:
    """Stage 2 of the rule (module docstring): the target's output ``y`` against the source side's float64
    ``y64`` (or the source framework's output), with float32 ``y32`` measuring the layer's conditioning.

    Raises:
        VerificationError: the output shapes differ.
    """
    if y.shape != y64.shape:
        raise VerificationError(f"verification failed: layer '{layer.name}' output shape {y.shape} "
                                f"differs from the source's {y64.shape}")
    scale = float(max(1.0, np.abs(y64).max()))
    tol = _first(layer, first_tol) * scale + 2.0 * float(np.abs(y64 - y32).max())
    return LayerCheck(layer.name, float(np.abs(y - y64).max()), tol, float(np.abs(y64).max()), route, target_route)


def _route(src_module, layer: RNNLayer) -> str:
    return "source equations (numpy)" if _own_equations(src_module, layer) else "numpy reference"


def _framework(src_module, src_path, src_ckpt: Checkpoint, layer: RNNLayer, x: np.ndarray):
    fw = getattr(src_module, "framework_forward", None)
    if fw is None:
        raise VerificationError(f"--verify framework is not available for {src_module.__name__}")
    return fw(src_path, src_ckpt, layer.name, x), "source framework"


def _target_route(dst_module) -> str:
    return getattr(dst_module, "ROUTE", dst_module.__name__.rsplit(".", 1)[-1])


def verify(src_ckpt: Checkpoint, src_module, dst_path, dst_module, *, mode: str = "reference",
           src_path=None, seed: int = 0, batch: int | None = None, steps: int | None = None,
           first_tol: float | None = None, inputs: dict[str, np.ndarray] | None = None) -> VerifyReport:
    """Run every recurrent layer of ``src_ckpt`` on one random batch on both sides and compare.

    Args:
        src_ckpt: the checkpoint as read from the source.
        src_module / dst_module: the format modules of source and target.
        dst_path: the written file (temporary path before it is renamed into place).
        mode: ``'reference'`` (numpy equations of the source) or ``'framework'`` (the source framework).
        seed, batch, steps: the random batch ``x ~ N(0, 1)`` of shape ``(batch, steps, input_size)``
            (default: :func:`sample_shape`).
        first_tol: the relative term of the tolerance (default 1e-5, 1e-2 for float16 weights).
        inputs: ``{layer name: (B, T, input_size) array}``: real inputs to verify those layers on instead
            of the random batch (e.g. data the model was trained on, whose range N(0, 1) may not reach).

    Raises:
        FormatError: ``inputs`` of the wrong shape or naming no layer.

    Returns:
        a :class:`VerifyReport`; call :meth:`VerifyReport.raise_if_failed` to turn failure into an error.
    """
    t0 = time.perf_counter()
    batch, steps = _sample(src_ckpt, batch, steps)
    pool: dict = {}  # one layer's raw source tensors, reused by the next (_raw_held)
    xs = _batches(src_ckpt, batch, steps, seed, inputs)
    rep = VerifyReport(batch=batch, steps=steps, seed=seed)
    target_route = _target_route(dst_module)
    try:
        for layer, x in zip(src_ckpt.layers, xs):
            with _raw_held(layer, pool):
                y32 = _source(src_module, layer, x, np.float32)
            route = _route(src_module, layer)
            y = dst_module.target_forward(dst_path, src_ckpt, layer.name, x)
            if mode == "framework":
                yfw, route = _framework(src_module, src_path, src_ckpt, layer, x)
                rep.layers.append(layer_check(layer, y, yfw, y32, route, target_route, first_tol))
                continue
            check = agreement(layer, y, y32, route, target_route, first_tol)
            if not check.ok:  # stage 2: the float64 source side and the conditioning term
                with _raw_held(layer, pool):
                    y64 = _source(src_module, layer, x, np.float64)
                check = layer_check(layer, y, y64, y32, route, target_route, first_tol)
            rep.layers.append(check)
    finally:
        release = getattr(dst_module, "release", None)  # a cached target session (onnxruntime)
        if release is not None:
            release()
        reference.release_scratch()
    rep.seconds = time.perf_counter() - t0
    return rep


class StreamedVerification:
    """Verification of a streamed conversion (:func:`rnnconvert.api.convert`), split in two halves so that
    only one slab of parameters is in memory at a time; the report reads as :func:`verify`'s.

    * Source side, :meth:`source_slab` while slab ``(i, k)`` is loaded (before it is released): the numpy
      reference on that slab in float32, chained from the previous slab's output (only the
      ``(B, T, dirs*H)`` outputs are kept). A layer the source format runs with its own equations
      (``source_forward`` on ``layer.source['raw']``: Keras, single slabs) keeps that route;
      ``mode='framework'`` runs the source framework per layer.
    * Target side, :meth:`target_side` after the writer closed: the target framework on the written file,
      per layer, or per slab (``target_forward_slab``, each slab's output feeding the next) for stacked
      layers when the target format offers it. A layer that misses the float32 agreement gets its
      float64 source side then (:meth:`_float64`: its slabs read again, one at a time).

    The batch is the same as :func:`verify`'s (same seed, one draw per layer in order), as is the rule
    (:func:`agreement`, :func:`layer_check`).
    """

    def __init__(self, src_ckpt: Checkpoint, src_module, *, mode: str = "reference", src_path=None,
                 seed: int = 0, batch: int | None = None, steps: int | None = None,
                 inputs: dict[str, np.ndarray] | None = None) -> None:
        batch, steps = _sample(src_ckpt, batch, steps)
        self.ckpt, self.src_module, self.mode, self.src_path = src_ckpt, src_module, mode, src_path
        self.rep = VerifyReport(batch=batch, steps=steps, seed=seed)
        self.x = _batches(src_ckpt, batch, steps, seed, inputs)
        self.y32: list = [None] * len(src_ckpt.layers)
        self.yfw: list = [None] * len(src_ckpt.layers)  # the source framework's outputs (mode='framework')
        self.routes = [""] * len(src_ckpt.layers)
        self.seconds = 0.0
        self.pool: dict = {}  # the source's raw tensors of the last layer, reused (_raw_held)

    def source_slab(self, i: int, k: int, dirs: list) -> None:
        """The source side of slab ``k`` of layer ``i`` (called in order, with the slab's loaded params)."""
        t0 = time.perf_counter()
        layer, x = self.ckpt.layers[i], self.x[i]
        if _own_equations(self.src_module, layer):  # from the file's tensors (not ``dirs``): once, at the end
            if k < layer.num_layers - 1:
                return
            with _raw_held(layer, self.pool):
                self.y32[i] = _source(self.src_module, layer, x, np.float32)
        else:
            self.y32[i] = reference.forward_slab(layer, dirs, x if k == 0 else self.y32[i], np.float32)
            if k == layer.num_layers - 1:
                self.y32[i] = reference.finish(layer, self.y32[i])
        if k == layer.num_layers - 1:
            self.routes[i] = _route(self.src_module, layer)
            if self.mode == "framework":
                self.yfw[i], self.routes[i] = _framework(self.src_module, self.src_path, self.ckpt, layer, x)
        self.seconds += time.perf_counter() - t0

    def _float64(self, i: int) -> np.ndarray:
        """Layer ``i``'s source side in float64 (stage 2 of the rule), reading its tensors again."""
        layer, x = self.ckpt.layers[i], self.x[i]
        if _own_equations(self.src_module, layer):
            with _raw_held(layer, self.pool):
                return _source(self.src_module, layer, x, np.float64)
        y = np.asarray(x, np.float64)
        for k in range(layer.num_layers):
            dirs = self.ckpt.slab(i, k)
            y = reference.forward_slab(layer, dirs, y, np.float64)
            del dirs
            if self.ckpt.release is not None:
                self.ckpt.release(i, k)
        return reference.finish(layer, y)

    def target_side(self, dst_path, dst_module, progress=None) -> VerifyReport:
        """Run the written file in the target framework and compare, layer by layer; returns the report.
        ``progress(done, total)``: layers verified so far."""
        t0 = time.perf_counter()
        target_route = _target_route(dst_module)
        by_slab = getattr(dst_module, "target_forward_slab", None)
        self.pool.clear()  # the source side is done: its buffers go before the target framework runs
        if progress is not None:
            progress(0, len(self.ckpt.layers))
        try:
            for i, layer in enumerate(self.ckpt.layers):
                x = self.x[i]
                if by_slab is not None and layer.num_layers > 1:
                    y = x
                    for k in range(layer.num_layers):
                        y = by_slab(dst_path, self.ckpt, layer.name, k, y)
                    y = reference.finish(layer, y)
                else:
                    y = dst_module.target_forward(dst_path, self.ckpt, layer.name, x)
                if self.mode == "framework":
                    check = layer_check(layer, y, self.yfw[i], self.y32[i], self.routes[i], target_route)
                else:
                    check = agreement(layer, y, self.y32[i], self.routes[i], target_route)
                    if not check.ok:  # stage 2
                        check = layer_check(layer, y, self._float64(i), self.y32[i], self.routes[i], target_route)
                self.rep.layers.append(check)
                if progress is not None:
                    progress(i + 1, len(self.ckpt.layers))
        finally:
            release = getattr(dst_module, "release", None)
            if release is not None:
                release()
            reference.release_scratch()
        self.rep.seconds = self.seconds + time.perf_counter() - t0
        return self.rep
