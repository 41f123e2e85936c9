"""The verdict of one whole-model comparison (a model output, or a top-level layer's output, of the written artifact
run whole against the source framework running the source model): measurements in, verdict out (issue #39).

Pure, numpy-free arithmetic on the numbers the whole-model check measured (:mod:`rnnconvert.whole.verify.
keras_whole_check`); it runs nothing. The tolerance has the form of the per-layer sequence tolerance
(:func:`rnnconvert.verify.verdict.sequence_tolerance`): ``T = first * max(1, scale) + 2 * S``, ``S`` the largest
float32 spread measured on the SOURCE (its float32 run against its float64 twin, and every further independent
float32 evaluation order against float64): a written file never widens its own tolerance. The rules, in order
(docs/cli.md "Verdicts", "Whole models"):

1. a shape other than the source's, or a non-finite output anywhere but where the source's own output holds the same
   non-finite value (NaN for NaN, the same infinity), or a finite output where the source's is not: ``fail``; the
   positions where both hold the same non-finite value are compared no further (tf_keras' masked
   ``GlobalAveragePooling1D`` over a wholly masked row divides 0 by 0: NaN, and a target computing the same NaN
   is right there), and ``scale``, ``err32``, ``err64`` and the spreads are measured on the other positions;
2. ``max|b - a32| <= first * max(1, scale)`` (``b`` the target, ``a32`` the source's float32 run): ``ok``, nothing
   more measured. Proof: ``|b - z64| <= |b - a32| + |a32 - z64| <= first * max(1, scale) + S <= T``, so rule 4 would
   say ``ok`` too;
3. otherwise the spreads are measured (:data:`ASK` until then: :func:`decide_whole` returns ``{"ask":
   "spreads"}`` and the caller measures them and asks again). None measured (the source framework cannot rebuild the
   model in float64): ``inconclusive``, naming why;
4. the source's own evaluations part by more than ``rho`` of the scale (``2 S > rho * scale``, ``rho`` of
   :func:`rnnconvert.verify.verdict.fraction`): a chaotic or ill-conditioned model on these inputs, whose float32
   rounding alone moves the outputs as much as a slip, and whose tolerance ``T`` would be too wide to tell a wrong
   file from a right one: ``inconclusive``, never ``fail`` and never ``ok`` (as the per-layer rule 10);
5. ``max|b - z64| <= T`` (``z64`` the float64 reference): ``ok``;
6. the spread term dominates the tolerance (``2 S > first * max(1, scale)``: the model amplifies rounding) and the
   error is within :data:`AMPLIFIED` times it: one sample of an amplified rounding is not a bound, the target's own
   rounding could reach it: ``inconclusive``;
7. otherwise ``fail``.

A well-conditioned model (``2 S <= first * max(1, scale)``) is always decided, ``ok`` or ``fail``; a chaotic one
(rule 4) is decided only where the target matches the source's own float32 run within the fixed term (rule 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: a measurement not made yet (:func:`decide_whole` asks for it where a rule needs it)
ASK = "<ask>"

#: rule 6: an error up to ``first * max(1, scale) + 2 * AMPLIFIED * S`` on a model that amplifies rounding
#: (``2 S`` above the fixed term) cannot be told from the target's own amplified rounding, so one sample of it is
#: trusted to this factor only. Measured (this session's 2-core AMD EPYC VM, the generated inputs): the two float32
#: orders (tf_keras, the graph rebuilt in torch) of fixtures/loose/keras_bidi_gru_before.h5 and of Mycroft's GRU
#: part from float64 by spreads within 2.1x of each other; issue #39 reports a correct .onnx of the former 10x one
#: measured spread (beyond the fixed term) from the float64 run on another machine of that kind: rule 6 makes that
#: inconclusive, not fail
AMPLIFIED = 8.0


@dataclass(frozen=True)
class WholeFindings:
    """What one whole-model comparison measured. ``err32``: ``max|b - a32|`` over the positions not both the
    same non-finite value (``inf`` where ``b`` is not finite and the source is); ``scale``: ``max|a32|``; ``shape``: a shape mismatch in words ("" none); ``err64``: ``max|b - z64|``
    against the float64 reference (the source's float64 twin), :data:`ASK` until measured; ``spreads``:
    ``{what: max|y32 - z64|}`` of the source's own float32 evaluations (its float32 run, other independent
    float32 orders), :data:`ASK` until measured, ``{}`` where none could be; ``why_none``: why none could be;
    ``nonfinite``: the target's non-finite values that are not the source's own, or its finite values where the
    source's are not, in words ("" none; rule 1)."""

    err32: float
    scale: float
    shape: str = ""
    err64: Any = ASK
    spreads: Any = ASK
    why_none: str = ""
    nonfinite: str = ""


def decide_whole(f: WholeFindings, first: float, rho: float) -> dict[str, Any]:
    """The verdict of one whole-model comparison (module docstring, rules 1-7; the rules 4 and 5 in that order). Returns
    :class:`~rnnconvert.verify.checks.LayerCheck` fields ``verdict`` (``'ok'``, ``'inconclusive'``, ``'fail'``),
    ``reason``, ``max_abs_err``, ``tolerance``, ``max_abs_ref``, ``reference`` (``'float32'`` or ``'float64'``), or
    ``{"ask": "spreads"}`` where rule 3 needs the spreads and the float64 error still :data:`ASK`."""
    base = first * max(1.0, f.scale)
    out = dict(max_abs_err=f.err32, tolerance=base, max_abs_ref=f.scale, reference="float32")
    if f.shape:
        return {**out, "max_abs_err": math.inf, "tolerance": 0.0, "verdict": "fail", "reason": f.shape}
    if f.nonfinite:
        return {**out, "max_abs_err": math.inf, "verdict": "fail", "reason": f.nonfinite}
    if not math.isfinite(f.err32):
        return {**out, "verdict": "fail", "reason": "the written model's output is not finite where the source's is"}
    if f.err32 <= base:
        return {**out, "verdict": "ok", "reason": ""}
    if f.spreads == ASK or f.err64 == ASK:
        return {"ask": "spreads"}
    if not f.spreads or f.err64 is None:
        return {**out, "verdict": "inconclusive", "reason": (
            f"differs by {f.err32:.3g} from the source's float32 run, above {base:.3g}, and the source's float32 "
            f"spread could not be measured ({f.why_none or 'no float64 run of the source'}): cannot decide")}
    what, s = max(f.spreads.items(), key=lambda kv: kv[1])
    tol = base + 2.0 * s
    out = dict(max_abs_err=f.err64, tolerance=tol, max_abs_ref=f.scale, reference="float64")
    says = (f"differs from the source's float64 run by {f.err64:.3g}, {f.err64 / tol:.3g}x the tolerance {tol:.3g} "
            f"({first:.3g} x max(1, scale {f.scale:.3g}) + 2 x the largest float32 spread of the source, "
            f"{s:.3g} ({what}))")
    if 2.0 * s > rho * f.scale:
        return {**out, "verdict": "inconclusive", "reason": (
            f"{says}; the source's own float32 and float64 runs part by more than {rho:.3g} of the output's "
            f"scale: chaotic or ill-conditioned on these inputs, so float32 rounding alone moves the outputs as "
            f"much as a wrong weight would, and a tolerance that wide could not tell them apart (shorter --inputs "
            f"may decide)")}
    if f.err64 <= tol:
        return {**out, "verdict": "ok", "reason": ""}
    if 2.0 * s > base and f.err64 <= base + 2.0 * AMPLIFIED * s:
        return {**out, "verdict": "inconclusive", "reason": (
            f"{says}; the model amplifies float32 rounding (its spread is above {base:.3g}) and the difference is "
            f"within {AMPLIFIED:g}x it: the target's own rounding, amplified alike, could explain it (shorter "
            f"--inputs may decide)")}
    return {**out, "verdict": "fail", "reason": says}
