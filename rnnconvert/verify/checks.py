"""The record of one layer's verification (:class:`LayerCheck`): a leaf module, so that the engine
(:mod:`rnnconvert.verify.engine`) and a format's own whole-model check (``formats/keras/keras_whole.py``)
report in the same terms without a format importing the verification engine."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LayerCheck:
    """The comparison of one layer.

    ``step_err``/``step_tol``: the largest abs difference of the one-step comparison (``h_t`` and ``c_t``)
    and the largest element of its bound; ``step_ratio``: ``max(err / bound)`` over elements (at most 1 where
    no step fails on the bound). The tolerance the one-step comparison applied (docs/cli.md "Verdicts" rule E):
    ``step_applied_kind`` ``'measured'`` (rule E's measured tolerance) or ``'bound'`` (the rigorous bound: float16,
    a target with less accurate activations, weight matrices above ``states.RES_WEIGHTS``), of the element
    closest to it; ``step_applied_ratio`` the largest ``err / tolerance`` over elements (``ok`` needs ``<= 1``),
    ``step_applied_err``/``step_applied_tol`` the error and tolerance at that element. ``seq_err``/``seq_tol``: the short full-sequence comparison (of a stacked layer compared slab by slab, the slab
    closest to failing; ``max_abs_ref`` is then that slab's output scale). ``max_abs_err``/``tolerance``:
    the comparison closer to failing of the two (for one-line reports; the one step's against its measured
    tolerance where one was measured, docs/cli.md "Verdicts" rule E). ``verdict``: ``'ok'``, ``'fail'``
    or ``'inconclusive'``; ``reason`` says why when not ok.

    Per time step (input time order; for the plots of the HTML report, ``--report``; empty where that comparison
    did not run): ``step_err_t``/``step_bound_t``, the largest one-step error and the largest element of its
    bound over the sequences, stacked layers, directions, ``h`` and ``c`` of the trajectory states before step
    ``t`` (the probes left out); ``seq_err_t``, the largest error of the short sequence at step ``t``."""

    name: str
    max_abs_err: float
    tolerance: float
    max_abs_ref: float
    source_route: str
    target_route: str
    #: which comparison the headline numbers come from: ``'step'`` or ``'sequence'``
    reference: str = "step"
    verdict: str = "ok"
    reason: str = ""
    step_err: float = 0.0
    step_tol: float = 0.0
    step_ratio: float = 0.0
    step_applied_err: float = 0.0
    step_applied_tol: float = 0.0
    step_applied_ratio: float = 0.0
    #: which tolerance ``step_applied_*`` are against: ``'measured'``, ``'bound'``; ``''`` where no step ran
    step_applied_kind: str = ""
    seq_err: float = 0.0
    seq_tol: float = 0.0
    steps_checked: int = 0
    step_err_t: list[float] = field(default_factory=list)
    step_bound_t: list[float] = field(default_factory=list)
    #: the largest element of the one-step tolerance applied (``step_applied_kind``'s) at each step ``t``
    step_applied_t: list[float] = field(default_factory=list)
    seq_err_t: list[float] = field(default_factory=list)
    #: the one-step states per slab and direction (trajectory, probes and constructed), of which ``constructed``
    #: were constructed from the weights (:mod:`rnnconvert.verify.states`); ``unexercised``: the gate units no
    #: state made responsive (the verdict is then at best ``inconclusive``), empty when every unit was
    states: int = 0
    constructed: int = 0
    unexercised: str = ""
    #: the fewest one-step states in which any gate row (unit of a gate) of the layer is responsive
    coverage: int = 0
    #: what the one-step comparison catches (:func:`rnnconvert.verify.states.resolution`), as fractions of a
    #: gate row's scale (its largest weight): ``resolution`` the smallest change of ANY single weight or bias
    #: that the states and bounds used would have caught (None: not computed, a matrix above
    #: ``states.RES_WEIGHTS``), ``bias_resolution`` the same over biases alone, ``row_resolution`` the smallest
    #: relative scaling of any whole row of ``W_ih`` or ``W_hh`` caught; ``resolution_at`` where the worst is
    resolution: float | None = None
    bias_resolution: float | None = None
    row_resolution: float | None = None
    resolution_at: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


#: where a whole-model check reports its stages (:func:`whole_stage`): ``fn(what, done, total)``, set by the
#: conversion around its verification (``progress`` of :func:`rnnconvert.api.convert`, stage ``'whole: <what>'``)
WHOLE_STAGE: ContextVar[Callable[[str, float, float], None] | None] = ContextVar("whole_stage", default=None)

#: the stages of a whole-model check, in order (:func:`whole_stage`)
WHOLE_STAGES = ("loading the source model", "running the written model", "running the source model",
                "measuring the source's float32 spreads")


def whole_stage(what: str) -> None:
    """Report that a whole-model check enters stage ``what`` (one of :data:`WHOLE_STAGES`) to :data:`WHOLE_STAGE`,
    if set; a reporter that raises is ignored."""
    fn = WHOLE_STAGE.get()
    if fn is not None:
        try:
            fn(what, WHOLE_STAGES.index(what) if what in WHOLE_STAGES else 0, len(WHOLE_STAGES))
        except Exception:  # noqa: BLE001 - progress display only
            pass
