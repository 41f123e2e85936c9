"""What the source side of verification keeps of one recurrent layer until the written file is judged: one
:class:`LayerEvidence` per layer (:attr:`rnnconvert.verify.engine.StreamedVerification.evidence`), filled slab by
slab while each slab's parameters are in memory, read by the target side (:mod:`rnnconvert.verify.target_run`) and
the verdict (:mod:`rnnconvert.verify.verdict`). Memory: the kept states are ``B*T*(I + 3*dirs*H)`` numbers per slab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..core.model import RNNLayer
from . import states
from .sample import SEQ_STEPS


class SlabEscape(NamedTuple):
    """A direction whose one-step bound is loose: ``escape`` is None when every gate-block swap and other slip
    checked would fail it (:func:`rnnconvert.verify.escapes.swap_escapes`), else the first that would not;
    ``against`` the tolerance that decided: ``'bound'`` (the rigorous bound: a slip caught fails it) or
    ``'measured'`` (the bound let a slip pass and the slab's measured tolerance was asked, rule E: a slip caught is
    one the comparison would not judge ``ok``)."""

    slab: int
    direction: int
    escape: str | None
    against: str = "bound"


class SlabCoverage(NamedTuple):
    """What the one-step states of one slab and direction cover (:mod:`rnnconvert.verify.states`): the number of
    states, how many were constructed from the weights, the gate rows no state made responsive, the resolution
    (:func:`rnnconvert.verify.states.resolution`), and the fewest states any gate row is responsive in."""

    slab: int
    direction: int
    states: int
    constructed: int
    unexercised: np.ndarray
    resolution: dict
    fewest: int


@dataclass
class FedGroup:
    """Rows a whole model's graph feeds the layer, of one length (:class:`rnnconvert.verify.sample.FedRows`, issue
    #39), as the source side keeps them: ``x`` float32 ``(B, L, input_size)``; ``traj`` the float32 trajectory
    output of the last slab done (the next slab's input); the whole sequence (all ``L`` steps) in float32 and
    float64 (``y32``, ``y64``, finished; ``yfw`` the source framework's with ``mode='framework'``), chained over
    the slabs; ``spread`` an emulated target's spread from the float64 run (0: none), ``em`` its runs chained."""

    label: str
    x: np.ndarray
    traj: Any = None
    y32: Any = None
    y64: Any = None
    yfw: Any = None
    spread: float = 0.0
    em: Any = None
    #: the flat indices (row * steps + step) of the states that join the one-step comparison, or None: all
    #: (:func:`rnnconvert.verify.sample.fed_picks`)
    picked: Any = None
    #: the rows' indices in the model's batch (:attr:`rnnconvert.verify.sample.FedRows.rows`; empty: 0, 1, ...)
    rows: tuple = ()


@dataclass
class LayerEvidence:
    """The source side of one layer: its batch ``x`` (float32 ``(B, T, input_size)``); per slab, ``slabs[k]`` the
    one-step states ``(xf, [((h0, c0), exact, bound)] per direction)``; the short sequence (the first
    :data:`SEQ_STEPS` steps) run in float32 and float64 (``y32``, ``y64``; ``yfw`` the source framework's with
    ``mode='framework'``), or, for a layer compared slab by slab, ``seq_slabs[k] = (x, y32, y64)`` of each slab from
    its own float32 input; ``traj`` the float32 trajectory output of the last slab done (the next slab's input);
    ``route`` the source side's engine in words; ``spreads`` the emulated target's spread from the float64 run (one
    number, or one per slab compared alone; None: no emulation); ``em`` the emulated and canonical runs chained over
    slabs until the last; ``escapes`` and ``coverage`` per slab and direction."""

    x: np.ndarray
    slabs: list = field(default_factory=list)
    seq_slabs: list = field(default_factory=list)
    y32: Any = None
    y64: Any = None
    yfw: Any = None
    traj: Any = None
    route: str = ""
    spreads: Any = None
    em: Any = None
    escapes: list[SlabEscape] = field(default_factory=list)
    coverage: list[SlabCoverage] = field(default_factory=list)
    #: per slab, the measured one-step tolerance of each direction (``[(th, tc)]``, float64 of the shapes of the
    #: bound; :func:`rnnconvert.verify.orders.step_tolerance`), or None where the rigorous bound alone is the tolerance
    measured: list = field(default_factory=list)
    #: per slab and direction measured, the largest fraction of its bound that the measured float32 spread reached
    fractions: list[float] = field(default_factory=list)
    #: the float32 evaluation orders the one-step spread was measured over (empty: none measured)
    step_orders: tuple = ()
    #: the rows a whole model's graph feeds the layer (issue #39), checked at their own length: their trajectory
    #: states follow the batch's in the one-step states (before the probes), their whole sequences are compared
    fed: list[FedGroup] = field(default_factory=list)

    @classmethod
    def empty(cls, layer: RNNLayer, x: np.ndarray, fed=(), budget: int | None = None) -> LayerEvidence:
        """The evidence of ``layer`` before its slabs run: its batch ``x``, the graph-fed rows ``fed``
        (:class:`rnnconvert.verify.sample.FedRows`), at most ``budget`` of their states in the one-step comparison
        (:func:`rnnconvert.verify.sample.fed_picks`; None: all)."""
        from .sample import fed_picks

        groups = [FedGroup(r.label, r.x, rows=tuple(r.rows)) for r in fed]
        if budget is not None:
            for g, p in zip(groups, fed_picks([g.x.shape[0] * g.x.shape[1] for g in groups], budget)):
                g.picked = p
        return cls(x=x, slabs=[None] * layer.num_layers, seq_slabs=[None] * layer.num_layers,
                   measured=[None] * layer.num_layers, fed=groups)

    def fed_layout(self) -> list[tuple[str, tuple, int, Any]]:
        """``(label, rows, steps, picked)`` of each group of :attr:`fed`, in the order their states follow the
        batch's (``rows``: their indices in the model's batch; ``picked``: the flat indices of its states in the
        one-step comparison, None: all)."""
        return [(g.label, g.rows or tuple(range(g.x.shape[0])), g.x.shape[1], g.picked) for g in self.fed]

    def seq_x(self) -> np.ndarray:
        """The short sequence's input: the first :data:`SEQ_STEPS` steps of the batch."""
        return self.x[:, :SEQ_STEPS]

    def swaps_caught(self) -> bool:
        """Whether every loose direction showed that all its gate-block swaps are caught (each escape None)."""
        return bool(self.escapes) and all(e.escape is None for e in self.escapes)

    def escapes_measured(self) -> bool:
        """Whether the measured tolerance (rule E) decided rule A: for the first slip a loose direction could let
        pass (:meth:`loose_escape`), whether it passes that tolerance; where none, whether some direction needed
        that tolerance to catch its slips."""
        first = next((e for e in self.escapes if e.escape is not None), None)
        return first.against == "measured" if first else any(e.against == "measured" for e in self.escapes)

    def loose_escape(self) -> str:
        """The first slip a loose one-step bound could let pass, or ``''``."""
        return next((e.escape for e in self.escapes if e.escape is not None), "")

    def coverage_fields(self, layer: RNNLayer) -> dict[str, Any]:
        """The one-step states of the layer and what they left unexercised, as :class:`~rnnconvert.verify.checks.LayerCheck` fields
        (``states``, ``constructed``, ``unexercised``, ``coverage``, the resolutions and ``resolution_at``);
        ``{}`` when no slab recorded any."""
        cov = self.coverage
        if not cov:
            return {}
        where = lambda k, d: (f"stacked layer {k}, " if layer.num_layers > 1 else "") + (  # noqa: E731
            f"direction {d}, " if layer.bidirectional else "")
        worst = max(cov, key=lambda e: e.resolution["element"] if e.resolution["element"] is not None
                    else e.resolution["bias"])
        res = worst.resolution
        return dict(
            states=max(e.states for e in cov),
            constructed=sum(e.constructed for e in cov if e.direction == 0),
            unexercised="; ".join(f"{where(e.slab, e.direction)}{states.describe(layer, e.unexercised)}"
                                  for e in cov if len(e.unexercised)),
            coverage=min(e.fewest for e in cov),
            resolution=res["element"],
            bias_resolution=max(e.resolution["bias"] for e in cov),
            row_resolution=max(e.resolution["row"] for e in cov),
            resolution_at=f"{where(worst.slab, worst.direction)}{res['worst']}")
