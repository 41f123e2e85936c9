"""Check that a written file computes the same function as its source.

Source side: the source format's own equations on its own tensors when the format module offers
``source_forward`` (Keras: :mod:`rnnconvert.formats.keras_math`), else the canonical numpy
reference (:mod:`rnnconvert.reference`); with ``mode='framework'`` the source framework itself
(``framework_forward``, e.g. tf_keras). Target side: the target framework running the written file
(``target_forward`` of the target format module: torch, onnxruntime, ...).

Tolerance (float32 weights): ``atol = 1e-5 * max(1, max|y|) + 2 * max|y64 - y32|`` where ``y64``
and ``y32`` are the source side computed in float64 and in float32. The second term measures how
ill-conditioned the layer is on this batch (a GRU with ``activation='linear'`` and inputs of size 30
loses 5e-4 relative precision in float32, whichever framework runs it); for well-conditioned layers
it is ~1e-7 and the first term dominates. float16 weights use ``1e-2`` for the first term.

Cost (multi-GB checkpoints, docs/performance.md): the source side reads each layer's stored tensors
once for both passes (lazily re-read tensors are held for that layer only); the float64 pass computes
the input projections ``x_t W`` of all steps in one product, the float32 pass keeps the source
framework's step-by-step order. Neither changes the equations or the tolerance above. Target sessions
that load the whole written file (onnxruntime) are built once per verification (``release`` verb).

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

from . import reference
from .errors import VerificationError
from .model import Checkpoint, RNNLayer


@dataclass
class LayerCheck:
    """The comparison of one layer: max abs error of target vs source, and the tolerance used."""

    name: str
    max_abs_err: float
    tolerance: float
    max_abs_ref: float
    source_route: str
    target_route: str

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


def _own_equations(src_module, layer: RNNLayer) -> bool:
    """Whether the source format can run ``layer`` from its own stored tensors (``source_forward``)."""
    return getattr(src_module, "source_forward", None) is not None and layer.source.get("raw") is not None


@contextmanager
def _raw_held(layer: RNNLayer, pool: dict | None = None):
    """Within the block, ``layer.source['raw']`` holds plain dicts: lazily re-read tensors (Keras HDF5
    :class:`~rnnconvert.formats.keras_h5.LazyRaw`) are read from the file once for the float64 and the
    float32 passes of the source side, then dropped again (one layer's file tensors at a time). With a
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


def _source_pair(src_module, layer: RNNLayer, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The source side in float64 and in float32 (returned as float64), computed in lockstep where the
    route allows it (``source_forward_multi``, :func:`rnnconvert.reference.forward_multi`): each weight is
    then read once per product for both passes."""
    xs = [np.asarray(x, dtype=np.float64), np.asarray(x, dtype=np.float32)]
    if _own_equations(src_module, layer):
        multi = getattr(src_module, "source_forward_multi", None)
        if multi is not None:
            y64, y32 = multi(layer, xs)
        else:
            y64, y32 = (src_module.source_forward(layer, xd, xd.dtype) for xd in xs)
    else:
        y64, y32 = reference.forward_multi(layer, xs)
    return y64, y32.astype(np.float64)


def layer_check(layer: RNNLayer, y: np.ndarray, y64: np.ndarray, y32: np.ndarray, route: str, target_route: str,
                first_tol: float | None = None) -> LayerCheck:
    """Compare the target's output ``y`` with the source side's float64 ``y64`` (float32 ``y32`` measures the
    layer's conditioning) under the module docstring's tolerance: the one rule of both verification paths.

    Raises:
        VerificationError: the output shapes differ.
    """
    if y.shape != y64.shape:
        raise VerificationError(f"verification failed: layer '{layer.name}' output shape {y.shape} "
                                f"differs from the source's {y64.shape}")
    scale = float(max(1.0, np.abs(y64).max()))
    first = first_tol or (1e-2 if layer.dtype == np.float16 else 1e-5)
    tol = first * scale + 2.0 * float(np.abs(y64 - y32).max())
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
           first_tol: float | None = None) -> VerifyReport:
    """Run every recurrent layer of ``src_ckpt`` on one random batch on both sides and compare.

    Args:
        src_ckpt: the checkpoint as read from the source.
        src_module / dst_module: the format modules of source and target.
        dst_path: the written file (temporary path before it is renamed into place).
        mode: ``'reference'`` (numpy equations of the source) or ``'framework'`` (the source framework).
        seed, batch, steps: the random batch ``x ~ N(0, 1)`` of shape ``(batch, steps, input_size)``
            (default: :func:`sample_shape`).
        first_tol: the relative term of the tolerance (default 1e-5, 1e-2 for float16 weights).

    Returns:
        a :class:`VerifyReport`; call :meth:`VerifyReport.raise_if_failed` to turn failure into an error.
    """
    t0 = time.perf_counter()
    batch, steps = _sample(src_ckpt, batch, steps)
    pool: dict = {}  # one layer's raw source tensors, reused by the next (_raw_held)
    rng = np.random.default_rng(seed)
    rep = VerifyReport(batch=batch, steps=steps, seed=seed)
    target_route = _target_route(dst_module)
    try:
        for layer in src_ckpt.layers:
            x = rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
            with _raw_held(layer, pool):
                y64, y32 = _source_pair(src_module, layer, x)
            route = _route(src_module, layer)
            if mode == "framework":
                y64, route = _framework(src_module, src_path, src_ckpt, layer, x)
            y = dst_module.target_forward(dst_path, src_ckpt, layer.name, x)
            rep.layers.append(layer_check(layer, y, y64, y32, route, target_route, first_tol))
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
      reference on that slab in float64 and in float32, each chained from the previous slab's output
      (only the ``(B, T, dirs*H)`` outputs are kept). A layer the source format runs with its own
      equations (``source_forward`` on ``layer.source['raw']``: Keras, single slabs) keeps that route;
      ``mode='framework'`` runs the source framework per layer.
    * Target side, :meth:`target_side` after the writer closed: the target framework on the written file,
      per layer, or per slab (``target_forward_slab``, each slab's output feeding the next) for stacked
      layers when the target format offers it.

    The batch is the same as :func:`verify`'s (same seed, one draw per layer in order), as is the tolerance
    (:func:`layer_check`).
    """

    def __init__(self, src_ckpt: Checkpoint, src_module, *, mode: str = "reference", src_path=None,
                 seed: int = 0, batch: int | None = None, steps: int | None = None) -> None:
        batch, steps = _sample(src_ckpt, batch, steps)
        self.ckpt, self.src_module, self.mode, self.src_path = src_ckpt, src_module, mode, src_path
        self.rep = VerifyReport(batch=batch, steps=steps, seed=seed)
        rng = np.random.default_rng(seed)
        self.x = [rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
                  for layer in src_ckpt.layers]
        self.y64: list = [None] * len(src_ckpt.layers)
        self.y32: list = [None] * len(src_ckpt.layers)
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
                self.y64[i], self.y32[i] = _source_pair(self.src_module, layer, x)
        else:
            if k == 0:
                self.y64[i], self.y32[i] = x, x
            self.y64[i], self.y32[i] = reference.forward_slab_multi(
                layer, dirs, [np.asarray(self.y64[i], np.float64), np.asarray(self.y32[i], np.float32)])
            if k == layer.num_layers - 1:
                self.y64[i] = reference.finish(layer, self.y64[i])
                self.y32[i] = reference.finish(layer, self.y32[i]).astype(np.float64)
        if k == layer.num_layers - 1:
            self.routes[i] = _route(self.src_module, layer)
            if self.mode == "framework":
                self.y64[i], self.routes[i] = _framework(self.src_module, self.src_path, self.ckpt, layer, x)
        self.seconds += time.perf_counter() - t0

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
                self.rep.layers.append(layer_check(layer, y, self.y64[i], self.y32[i], self.routes[i], target_route))
                if progress is not None:
                    progress(i + 1, len(self.ckpt.layers))
        finally:
            release = getattr(dst_module, "release", None)
            if release is not None:
                release()
            reference.release_scratch()
        self.rep.seconds = self.seconds + time.perf_counter() - t0
        return self.rep
