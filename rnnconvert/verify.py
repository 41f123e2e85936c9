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


def _own_equations(src_module, layer: RNNLayer) -> bool:
    """Whether the source format can run ``layer`` from its own stored tensors (``source_forward``)."""
    return getattr(src_module, "source_forward", None) is not None and layer.source.get("raw") is not None


@contextmanager
def _raw_held(layer: RNNLayer):
    """Within the block, ``layer.source['raw']`` holds plain dicts: lazily re-read tensors (Keras HDF5
    :class:`~rnnconvert.formats.keras_h5.LazyRaw`) are read from the file once for the float64 and the
    float32 passes of the source side, then dropped again (one layer's file tensors at a time)."""
    raw = layer.source.get("raw")
    if not isinstance(raw, list) or all(isinstance(r, dict) for r in raw):
        yield
        return
    layer.source["raw"] = [dict(r) for r in raw]
    try:
        yield
    finally:
        layer.source["raw"] = raw


def _source_side(src_module, layer: RNNLayer, x: np.ndarray, dtype) -> np.ndarray:
    if _own_equations(src_module, layer):
        return src_module.source_forward(layer, x, dtype)
    return reference.forward(layer, x, dtype)


def verify(src_ckpt: Checkpoint, src_module, dst_path, dst_module, *, mode: str = "reference",
           src_path=None, seed: int = 0, batch: int = 3, steps: int = 8,
           first_tol: float | None = None) -> VerifyReport:
    """Run every recurrent layer of ``src_ckpt`` on one random batch on both sides and compare.

    Args:
        src_ckpt: the checkpoint as read from the source.
        src_module / dst_module: the format modules of source and target.
        dst_path: the written file (temporary path before it is renamed into place).
        mode: ``'reference'`` (numpy equations of the source) or ``'framework'`` (the source framework).
        seed, batch, steps: the random batch ``x ~ N(0, 1)`` of shape ``(batch, steps, input_size)``.
        first_tol: the relative term of the tolerance (default 1e-5, 1e-2 for float16 weights).

    Returns:
        a :class:`VerifyReport`; call :meth:`VerifyReport.raise_if_failed` to turn failure into an error.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    rep = VerifyReport(batch=batch, steps=steps, seed=seed)
    target_route = getattr(dst_module, "ROUTE", dst_module.__name__.rsplit(".", 1)[-1])
    try:
        for layer in src_ckpt.layers:
            x = rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
            with _raw_held(layer):
                y64 = _source_side(src_module, layer, x, np.float64)
                y32 = _source_side(src_module, layer, x, np.float32).astype(np.float64)
            route = "source equations (numpy)" if _own_equations(src_module, layer) else "numpy reference"
            if mode == "framework":
                fw = getattr(src_module, "framework_forward", None)
                if fw is None:
                    raise VerificationError(f"--verify framework is not available for {src_module.__name__}")
                y64, route = fw(src_path, src_ckpt, layer.name, x), "source framework"
            y = dst_module.target_forward(dst_path, src_ckpt, layer.name, x)
            if y.shape != y64.shape:
                raise VerificationError(f"verification failed: layer '{layer.name}' output shape {y.shape} "
                                        f"differs from the source's {y64.shape}")
            scale = float(max(1.0, np.abs(y64).max()))
            first = first_tol or (1e-2 if layer.dtype == np.float16 else 1e-5)
            tol = first * scale + 2.0 * float(np.abs(y64 - y32).max())
            rep.layers.append(LayerCheck(layer.name, float(np.abs(y - y64).max()), tol, float(np.abs(y64).max()),
                                         route, target_route))
    finally:
        release = getattr(dst_module, "release", None)  # a cached target session (onnxruntime)
        if release is not None:
            release()
    rep.seconds = time.perf_counter() - t0
    return rep
