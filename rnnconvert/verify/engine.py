"""Check that a written file computes the same function as its source.

Two comparisons per recurrent layer, both must pass (docs/cli.md "Verification" has the rule and its proof):

1. **One step from the source's own states** (the decisive check, any sequence length). The source runs
   along its own trajectory (the canonical numpy reference, :func:`rnnconvert.core.reference.trajectory`, in
   float32, the weights' precision; for a one-slab layer of a format with its own equations, Keras HDF5 and
   TF2, the float32 run of those equations that the sequence comparison makes anyway: ``source_forward_multi``
   records its states), which gives the state ``h_{t-1}`` (and ``c_{t-1}``) before every step
   ``t`` of every sequence, stacked layer and direction. The *target framework* then computes one step
   from each of those ``B*T`` (input, state) pairs, all in one batched call: sequences of length 1 with
   initial states (torch ``h0, c0``; onnxruntime ``initial_h``/``initial_c``; Keras ``initial_state`` /
   the layer's cell; ``target_step`` of the target format module). The same steps are computed exactly
   (float64, :func:`rnnconvert.core.reference.step`), and each element of ``h_t`` (and ``c_t``) must agree
   within :func:`rnnconvert.verify.bounds.step_bound`: a forward error bound of one step evaluated in
   float32 (unit roundoff ``u``; float16 ``u`` for float16 weights or ``--dtype float16``), a few
   roundings of the step's own magnitudes. Errors cannot compound: each step starts from exactly the
   same numbers on both sides, so the tolerance does not grow with the sequence length. States built from
   the weights are appended where the trajectory and the probes leave a gate unit unresponsive
   (:mod:`rnnconvert.verify.states`), and the layer's resolution (the smallest change of a weight, bias or
   row the states catch) is recorded on its :class:`LayerCheck`. The tolerance applied is the bound scaled down
   to the rounding measured on the same states (:meth:`StreamedVerification._step_tolerances`,
   :func:`rnnconvert.verify.orders.step_tolerance`: ``FAR`` times the largest share of the bound that several float32
   evaluation orders reach), never above the bound; beyond twice it, or beyond the bound, a step fails; between,
   ``inconclusive`` (docs/cli.md "Verdicts", rule E).
2. **A short full-sequence run** (the first :data:`SEQ_STEPS` steps of the batch; and every step of each group of
   rows a whole model's graph feeds the layer, issue #39: :attr:`rnnconvert.verify.evidence.LayerEvidence.fed`) for
   what one step
   cannot show: direction and ``go_backwards``, the order of stacked layers and directions, the link of
   the written file to the *source's own equations* (``source_forward`` of Keras and TF1 files, or the
   source framework with ``mode='framework'``). Tolerance ``first * max(1, max|y64|) + 2 * max|y64 - y32|``
   (source side in float64 and float32; ``first = 1e-5``, ``1e-2`` for float16), the second term widened to
   the spread of an emulation of the target's arithmetic for a target that declares one
   (:func:`sequence_tolerance`); a sequence above it, or whose tolerance exceeds :func:`fraction` of its scale, gets
   its measured tolerance (:func:`rnnconvert.verify.verdict.measured`, :meth:`StreamedVerification._measured_spreads`).
   A stacked layer the numpy
   reference runs into a target that runs one slab alone is compared slab by slab, each slab of the target
   from the source's float32 input of that slab (:meth:`StreamedVerification._by_slab`); where the written file
   joins its slabs by wiring of its own (an ONNX graph: :attr:`rnnconvert.engine.protocol.Runtime.wired`), the whole
   written layer also runs and is compared with its nodes run one by one and joined as the source joins its slabs,
   within the tolerance of the source's runs chained over the slabs (:func:`rnnconvert.verify.verdict.wiring_check`,
   issue #39).

Verdicts (:attr:`LayerCheck.verdict`; docs/cli.md "Verdicts" has every rule): ``'fail'`` when either comparison
exceeds its tolerance (a sequence above its one-sample float32 estimate gets a tolerance of
:data:`rnnconvert.verify.orders.FAR` times the largest spread measured over several float32 evaluation orders on the
same inputs); ``'inconclusive'`` also for a gate unit no state exercises, a weight no state reaches, and a sequence
beyond that measured tolerance by less than a layout slip moves the outputs;
``'inconclusive'`` when it passes but a tolerance is too loose to tell a broken file from a correct one:
above :func:`fraction` of the output's own scale (``max|y|``; at most 1 for sigmoid/tanh cells), which an
ill-conditioned layer on long or large inputs can reach; ``'ok'`` otherwise. An inconclusive layer is
never reported as ok: the CLI exits with :class:`~rnnconvert.errors.InconclusiveError`'s code and a
conversion keeps no output unless ``accept_inconclusive`` (``--accept-inconclusive``).

Engines: the report names both (:attr:`LayerCheck.source_route`, :attr:`LayerCheck.target_route`). A
target format whose framework is not installed (or that has no ``target_step``) falls back to the numpy
reference on the arrays read back from the written file, and the route says so.

Streamed and eager conversions share :class:`StreamedVerification`: the source side runs slab by slab
while each slab of parameters is in memory (trajectory, exact steps and their bounds, the short sequence
in float32 and float64: the source is never read twice); the target side reads the written file back one
layer or slab at a time. Memory: the kept states are ``B*T*(I + 3*dirs*H)`` numbers per slab.

The parts (docs/architecture.md): the batch and the one-step states, :mod:`rnnconvert.verify.sample`; what the
source side keeps of each layer, one :class:`rnnconvert.verify.evidence.LayerEvidence`; the written file run,
:mod:`rnnconvert.verify.target_run`; the verdict from the numbers, :func:`rnnconvert.verify.verdict.decide` (pure);
BLAS threads and the background import of the target's framework, :mod:`rnnconvert.speed.threads`. This module
binds them: :class:`StreamedVerification` (the source side slab by slab, the sequence-level slips a verdict may
need ruled out) and :func:`verify`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from ..core import reference
from ..core.model import Checkpoint, RNNLayer
from ..errors import FormatError, InconclusiveError, VerificationError
from ..speed import gpu, kernels, threads
from ..speed.kernels import FAST
from ..speed.threads import BACKGROUND_IMPORT, blas_controller
from . import bounds, escapes, orders, sample, source, states, verdict
from .checks import LayerCheck
from .evidence import LayerEvidence, SlabCoverage, SlabEscape
from .raw import raw_tensors
from .sample import (LARGE_BYTES, SAMPLE, SAMPLE_LARGE, SEQ_STEPS, SWAP_STATES, U_ACC, sample_shape,
                     unit_roundoff)
from .target import as_source, as_target
from .target_run import NOT_INSTALLED, TargetRun
from .verdict import fraction, sequence_tolerance

__all__ = ["BACKGROUND_IMPORT", "LARGE_BYTES", "LayerCheck", "NOT_INSTALLED", "SAMPLE", "SAMPLE_LARGE",
           "SEQ_SLIP_BYTES", "SEQ_STEPS", "SWAP_STATES", "StreamedVerification", "U_ACC", "VerifyReport",
           "blas_controller", "fraction", "import_engine", "sample_shape", "sequence_tolerance", "unit_roundoff",
           "verify"]

#: the largest layer (bytes of parameters) a streamed conversion reads again to measure a sequence's float32 spread
#: over several evaluation orders (:meth:`StreamedVerification._measured_spreads`) or rule out the slips only a
#: sequence shows (:meth:`StreamedVerification._sequence_escapes`), in the rare case that needs it
SEQ_SLIP_BYTES = 64 << 20


@dataclass
class VerifyReport:
    """Per-layer checks plus the batch used and the time spent."""

    layers: list[LayerCheck] = field(default_factory=list)
    batch: int = 0
    steps: int = 0
    seed: int = 0
    seconds: float = 0.0
    #: what the checks ran on beyond the batch above (a whole model's recurrent layers: also the rows its graph
    #: feeds each, issue #39), one line each
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.layers)

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.layers)

    @property
    def inconclusive(self) -> bool:
        return not self.failed and any(c.verdict == "inconclusive" for c in self.layers)

    @property
    def verdict(self) -> str:
        return "fail" if self.failed else "inconclusive" if self.inconclusive else "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for c, lc in zip(d["layers"], self.layers):
            c["ok"] = lc.ok
        d["ok"] = self.ok
        d["verdict"] = self.verdict
        return d

    def raise_if_failed(self, accept_inconclusive: bool = False) -> None:
        """Raise :class:`VerificationError` naming the worst layer when a layer failed, and
        :class:`InconclusiveError` when a layer is inconclusive (unless ``accept_inconclusive``)."""
        bad = [c for c in self.layers if c.failed]
        if bad:
            c = max(bad, key=lambda c: c.max_abs_err / max(c.tolerance, 1e-300))
            raise VerificationError(
                f"verification failed: layer '{c.name}': {c.reason}; the output was not written. "
                f"Please report this with the file")
        unsure = [c for c in self.layers if c.verdict == "inconclusive"]
        if unsure and not accept_inconclusive:
            c = unsure[0]
            raise InconclusiveError(
                f"verification inconclusive: layer '{c.name}': {c.reason}; the output was not written "
                f"(--accept-inconclusive keeps it; a shorter or smaller-range --inputs may decide)")


def _first(layer: RNNLayer, first_tol: float | None) -> float:
    return verdict.first(layer.dtype == np.float16, first_tol)


def import_engine(dst_module):
    """Start importing the target's framework (``dst_module.engine``, when in :data:`BACKGROUND_IMPORT` and
    installed) in a daemon thread (:func:`rnnconvert.speed.threads.import_in_background`), so that the target side
    of verification finds it loaded. Returns the thread (or None)."""
    return threads.import_in_background(as_target(dst_module).engine, BACKGROUND_IMPORT)


def _unfinished(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    """``layer`` run on ``x`` in float64 by the numpy reference, its outputs in input time order (no
    :func:`rnnconvert.core.reference.finish`): what :meth:`StreamedVerification._sequence_escapes` compares."""
    y = np.asarray(x, np.float64)
    for k in range(layer.num_layers):
        y = reference.forward_slab(layer, layer.params[k], y, kernels=FAST)
    return y


def _layer_slips(layer: RNNLayer) -> list:
    """The sequence-level slips of the whole ``layer`` (:meth:`StreamedVerification._sequence_escapes`):
    ``[(slip, slipped layer)]``, the directions of a stacked layer exchanged, two stacked layers of equal input
    sizes exchanged."""
    slips = []
    for k in range(layer.num_layers):
        if layer.bidirectional:
            params = list(layer.params)
            params[k] = list(reversed(params[k]))
            slips.append((f"the directions of stacked layer {k} exchanged", replace(layer, params=params)))
        if k + 1 < layer.num_layers and layer.layer_input_size(k) == layer.layer_input_size(k + 1):
            params = list(layer.params)
            params[k], params[k + 1] = params[k + 1], params[k]
            slips.append((f"stacked layers {k} and {k + 1} exchanged", replace(layer, params=params)))
    return slips


def _engine(dst_module) -> str:
    """The target side's engine with its version: ``route`` of the format's record, and the version of its
    ``engine`` distribution when installed (``'torch 2.13.0'``)."""
    route = dst_module.route
    dist = dst_module.engine
    if dist:
        from importlib import metadata

        try:
            return f"{route} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            return route
    return route


class StreamedVerification:
    """Verification in two halves, so that only one slab of parameters is in memory at a time (streamed
    conversions, lazy sources); :func:`verify` runs the same on an in-memory checkpoint.

    * :meth:`source_slab` while slab ``(i, k)`` is loaded (called in order): the trajectory of the slab in
      float32 from its input (the batch, or the previous slab's trajectory output), the exact one-step
      results from every state and their bounds (:func:`rnnconvert.verify.bounds.step_bound`), and the short
      sequence in float32 and float64 (the numpy reference chained over slabs; a layer the source format
      runs with its own equations, ``source_forward`` on the file's tensors (``layer.source['raw']`` read, passed
      as ``raw=``, the layer left as it is), at its last slab -- or, for a one-slab layer whose batch is the
      short sequence, first, its float32 run recording the trajectory (``source_forward_multi(record=)``), which
      the numpy reference then does not run;
      ``mode='framework'``: the source framework). When the short sequence is the whole batch and the numpy
      reference runs it, its float32 run is the trajectory itself, computed once in lockstep with the float64
      run (:func:`rnnconvert.core.reference.trajectory_multi`). Nothing of the source is read again later.
      What it keeps of layer ``i`` is ``evidence[i]`` (:class:`rnnconvert.verify.evidence.LayerEvidence`).
    * :meth:`target_side` after the writer closed: the target framework on the written file
      (:class:`rnnconvert.verify.target_run.TargetRun`), per layer, per slab (``target_forward_slab``) for stacked
      layers when the format offers it, and one step per slab (``target_step``); each layer judged by
      :meth:`judge` (:func:`rnnconvert.verify.verdict.decide`).
    """

    def __init__(self, src_ckpt: Checkpoint, src_module, *, mode: str = "reference", src_path=None,
                 seed: int = 0, batch: int | None = None, steps: int | None = None,
                 inputs: dict[str, np.ndarray] | None = None, first_tol: float | None = None,
                 target_dtype=None, target=None, added: dict[str, np.ndarray] | None = None) -> None:
        batch, steps = sample.sample(src_ckpt, batch, steps)
        blas_controller()  # in the caller's thread, before the verifier thread and any background import
        src_module, target = as_source(src_module), as_target(target)
        self.ckpt, self.src_module, self.mode, self.src_path = src_ckpt, src_module, mode, src_path
        self.first_tol, self.target_dtype = first_tol, target_dtype
        #: whether the target format (``target``: the module the written file is judged with) runs one slab alone
        self.slab_targets = getattr(target, "target_forward_slab", None) is not None
        #: the accuracy of the target's activations in ulps, where it declares one (cuDNN's float32 ``tanh``:
        #: :attr:`rnnconvert.verify.cuda.CudaTarget.act_ulps`); None: :data:`rnnconvert.verify.bounds.ACT_ULPS`
        self.act_ulps = getattr(target, "act_ulps", None)
        #: an emulation of the target's own arithmetic (``target_arithmetic``: the cuDNN routes), run on each slab
        #: while it is loaded (:meth:`_emulate`), so that a streamed source needs no second read
        self.emulate = getattr(target, "target_arithmetic", None)
        #: whether the target's slabs are joined by the file's own wiring (an ONNX graph), which only a run of the
        #: whole written layer exercises: the source side then keeps the float64 run chained over the slabs
        self.wired = bool(getattr(target, "target_wired", False))
        self.rep = VerifyReport(batch=batch, steps=steps, seed=seed)
        #: what the source side keeps of each layer, one record per layer
        budget = sample.FED_STATES_LARGE if sample.sample_shape(src_ckpt) == SAMPLE_LARGE else sample.FED_STATES
        self.evidence = [LayerEvidence.empty(layer, x, fed, budget) for layer, x, fed in
                         zip(src_ckpt.layers, sample.batches(src_ckpt, batch, steps, seed, inputs),
                             sample.fed_rows(src_ckpt, added))]
        for layer, ev in zip(src_ckpt.layers, self.evidence):
            if any(g.picked is not None for g in ev.fed):
                total = sum(g.x.shape[0] * g.x.shape[1] for g in ev.fed)
                self.rep.notes.append(
                    f"{layer.name}: {sum(len(g.picked) for g in ev.fed)} of the {total} states of the rows the model's "
                    f"graph feeds it in the one-step comparison (spread evenly over them; every step of every row in "
                    f"the sequence comparison)")
        self.target_seconds = 0.0
        self.seconds = 0.0
        self.pool: dict = {}  # the source's raw tensors of the last layer, reused (_raw_tensors)

    def _by_slab(self, layer: RNNLayer) -> bool:
        """Whether the short sequence of ``layer`` is compared slab by slab: a stacked layer the numpy reference
        runs (not the source's own equations or framework) into a target that runs one slab alone
        (``slab_targets``: its format's ``target_forward_slab``). Each slab of the target then starts from the
        source's own float32 input of that slab, as each one step starts from the source's own state, so that
        rounding does not compound through the stack: a float16 target rounds every slab's output to float16,
        and the 8-slab float16 benchmark LSTM amplified that to 0.0126 at one element of its output after 8
        slabs (a tolerance of 0.01: a correct file failed; docs/performance.md, session 8)."""
        return (self.slab_targets and layer.num_layers > 1 and self.mode != "framework"
                and not source.own_equations(self.src_module, layer))

    def _own_run(self, i: int, record: list[dict] | None = None) -> list[dict] | None:
        """The short sequence of layer ``i`` by the source format's own equations on the file's tensors, in
        float32 and float64 (``y32``, ``y64`` of its evidence); ``record``, returned, filled with the float32 run's
        states where the format records them (``source_slab``)."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        xs = ev.seq_x()
        raw = raw_tensors(layer, self.pool)
        ev.y32, ev.y64 = source.run(self.src_module, layer, [xs.astype(np.float32), xs.astype(np.float64)], raw,
                                    record)
        return record

    def source_slab(self, i: int, k: int, dirs: list) -> None:
        """The source side of slab ``k`` of layer ``i`` (called in order, with the slab's loaded params); numpy's
        BLAS kept to one thread (:func:`rnnconvert.speed.threads.one_blas_thread`)."""
        with threads.one_blas_thread():
            self._source_slab(i, k, dirs)

    def _source_slab(self, i: int, k: int, dirs: list) -> None:
        t0 = time.perf_counter()
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        one = layer.one_slab(k, dirs)
        u = unit_roundoff(layer, self.target_dtype)
        xin = ev.x if k == 0 else ev.traj
        own = source.own_equations(self.src_module, layer)
        per = self._by_slab(layer)
        y, y64, recs, shared = self._trajectory(i, k, one, dirs, xin, own, per)
        fed = self._fed_trajectories(i, k, one, dirs)
        xf, entries, counts, seen, slack = sample.slab_states(layer, one, dirs, xin, recs, u, self.act_ulps, fed)
        ev.slabs[k] = self._exercise(i, k, one, dirs, xin, recs, xf, entries, counts, seen, u)
        ev.escapes += self._slips_applied(i, k, one, dirs, slack, u)
        ev.traj = y if k < layer.num_layers - 1 else None
        self._short_sequence(i, k, dirs, own, shared, per, y, y64)
        self._fed_sequences(i, k, one, dirs, own)
        if self.emulate is not None:
            self._emulate(i, k, one, dirs, own, per)
        if k == layer.num_layers - 1:
            ev.route = source.route(self.src_module, layer, self.mode)
            if self.mode == "framework":
                ev.yfw = source.framework_run(self.src_module, self.src_path, self.ckpt, layer, ev.seq_x())
        gpu.forget()  # the slab's weights sent to the GPU (--device cuda): its arrays may be reused for the next
        self.seconds += time.perf_counter() - t0

    def _trajectory(self, i: int, k: int, one: RNNLayer, dirs: list, xin: np.ndarray, own: bool,
                    per: bool) -> tuple[np.ndarray, np.ndarray | None, list, bool]:
        """The float32 trajectory of slab ``k`` of layer ``i`` from ``xin``: ``(y, y64, recs, shared)``, its output,
        the float64 run computed with it (``shared``: the short sequence is the whole batch and the numpy reference
        runs it; else None), and its states per direction (``recs``)."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        xs = ev.seq_x()
        # The short sequence's batch is the whole batch (steps <= SEQ_STEPS) and the numpy reference runs it:
        # its float32 run IS the trajectory (same inputs, weights, dtype and code), so it is computed once,
        # in lockstep with the float64 run (one read of each weight matrix per step for both).
        shared = not own and xs.shape[1] == xin.shape[1]
        # A one-slab layer run by its own equations on the whole batch: the states of that float32 run are the
        # trajectory (the source's own states; the one-step check starts the target from them), so the numpy
        # reference does not run the same float32 sequence a second time (Keras HDF5 and TF2 sources)
        if own and layer.num_layers == 1 and xs.shape[1] == xin.shape[1] and self.src_module.source_forward_multi:
            recs = self._own_run(i, [{} for _ in dirs])
            if all(recs) and all(r["h"].shape == (*xin.shape[:2], layer.output_size) for r in recs):
                return ev.y32, None, recs, shared
            # else the format did not record them (TF1 cells), or not as the canonical states
        if shared:
            x64 = xs.astype(np.float64) if k == 0 else np.asarray(xin, np.float64) if per else ev.y64
            (y, y64), recs = reference.trajectory_multi(one, dirs, [np.asarray(xin, np.float32), x64], kernels=FAST)
            if per:
                ev.seq_slabs[k] = (np.asarray(xin, np.float32), y, y64)
            return y, y64, recs, shared
        y, recs = reference.trajectory(one, dirs, np.asarray(xin, np.float32), kernels=FAST)
        return y, None, recs, shared

    def _fed_trajectories(self, i: int, k: int, one: RNNLayer, dirs: list) -> list:
        """The float32 trajectory of slab ``k`` of layer ``i`` on each group of the rows a whole model's graph feeds
        the layer (:attr:`rnnconvert.verify.evidence.LayerEvidence.fed`, issue #39), at their full length:
        ``[(input, recs)]`` (:func:`rnnconvert.core.reference.trajectory`) of the states picked for the one-step
        comparison (all, or :attr:`rnnconvert.verify.evidence.FedGroup.picked`: flattened), each group's whole
        output kept as the next slab's input."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        out = []
        for g in ev.fed:
            xin = g.x if k == 0 else g.traj
            y, recs = reference.trajectory(one, dirs, np.asarray(xin, np.float32), kernels=FAST)
            g.traj = y if k < layer.num_layers - 1 else None
            if g.picked is not None:
                flat = lambda a: None if a is None else a.reshape(-1, a.shape[-1])[g.picked]  # noqa: E731
                recs = [{"h": flat(r["h"]), "c": flat(r.get("c"))} for r in recs]
                xin = np.asarray(xin).reshape(-1, xin.shape[-1])[g.picked]
            out.append((xin, recs))
        return out

    def _fed_sequences(self, i: int, k: int, one: RNNLayer, dirs: list, own: bool) -> None:
        """The whole sequence of each group of graph-fed rows of layer ``i`` (all their steps) after slab ``k``, in
        float32 and float64, as the batch's short sequence is made: the source's own equations on the file's tensors
        (``own``, once, at the end), else the numpy reference chained over the slabs; ``mode='framework'``: the
        source framework too; an emulated target's spread (``self.emulate``) chained the same way."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        last = k == layer.num_layers - 1
        for g in ev.fed:
            if own:
                if last:
                    g.y32, g.y64 = source.run(self.src_module, layer, [g.x, g.x.astype(np.float64)],
                                              raw_tensors(layer, self.pool))
            else:
                prev = [g.x, g.x.astype(np.float64)] if k == 0 else [g.y32, g.y64]
                g.y32, g.y64 = reference.forward_slab_multi(layer, dirs, prev, kernels=FAST)
                if last:
                    g.y32, g.y64 = (reference.finish(layer, a) for a in (g.y32, g.y64))
            if self.emulate is not None:
                em_in, canon_in = (g.x, g.x) if k == 0 else g.em
                em = self.emulate(one, em_in, finished=False)
                canon = reference.forward_slab(one, dirs, np.asarray(canon_in, np.float64), np.float64, kernels=FAST)
                g.em = None if last else (em, canon)
                if last:
                    g.spread = float(np.abs(reference.finish(layer, canon) - reference.finish(layer, em)).max())
            if last and self.mode == "framework":
                g.yfw = source.framework_run(self.src_module, self.src_path, self.ckpt, layer, g.x)

    def _short_sequence(self, i: int, k: int, dirs: list, own: bool, shared: bool, per: bool, y, y64) -> None:
        """The short sequence of layer ``i`` after slab ``k``, float32 and float64 (``y32``, ``y64`` of its evidence;
        per slab ``seq_slabs`` for a layer compared slab by slab): from the file's tensors by the source's own
        equations (``own``, once, at the end), the trajectory's run itself (``shared``), or the numpy reference."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        last = k == layer.num_layers - 1
        if own:  # from the file's tensors (not ``dirs``): once, at the end
            if last and ev.y64 is None:
                self._own_run(i)
            return
        if shared:
            ev.y32, ev.y64 = y, y64
        else:
            xs = ev.seq_x()
            prev = [xs.astype(np.float32), xs.astype(np.float64)] if k == 0 else [ev.y32, ev.y64]
            if per and k:
                prev[1] = np.asarray(prev[0], np.float64)
            ev.y32, ev.y64 = reference.forward_slab_multi(layer, dirs, prev, kernels=FAST)
            if per:
                ev.seq_slabs[k] = (np.asarray(prev[0], np.float32), ev.y32, ev.y64)
        if last:
            ev.y32, ev.y64 = (reference.finish(layer, a) for a in (ev.y32, ev.y64))

    def _chain64(self, i: int) -> np.ndarray | str:
        """The canonical float64 run of the short sequence of layer ``i`` chained over its slabs, finished: the
        reference of the whole written layer of a wired target (:attr:`rnnconvert.engine.protocol.Runtime.wired`),
        whose slabs are otherwise compared one by one, each from the source's float32 input of it. Computed only
        where the whole written layer and its nodes joined differ (:meth:`judge`; a correct file's agree bit for bit,
        the 3 GB benchmark's included): the layer's slabs read again one at a time where the source is streamed
        (one slab's weights in memory). Or why it could not be computed (a phrase)."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        y = ev.seq_x().astype(np.float64)
        for k in range(layer.num_layers):
            try:
                dirs = self.ckpt.slab(i, k) if self.ckpt.lazy else layer.params[k]
            except (OSError, ValueError, FormatError) as e:
                return f"the layer could not be read again: {e}"
            y = reference.forward_slab(layer.one_slab(k, dirs), dirs, y, np.float64, kernels=FAST)
        return reference.finish(layer, y)

    def _exercise(self, i: int, k: int, one: RNNLayer, dirs: list, xin: np.ndarray, recs: list, xf: np.ndarray,
                  entries: list, counts: list, seen: list, u: float) -> tuple[np.ndarray, list]:
        """States constructed from the weights of slab ``k`` of layer ``i`` for the gate rows that the trajectory
        and the probes leave unresponsive (:func:`rnnconvert.verify.states.exercise`), appended to ``xf`` and
        ``entries``; what they cover recorded in the layer's evidence (:class:`SlabCoverage`:
        :func:`rnnconvert.verify.states.resolution` on every state)."""
        def step(p, x, h, c):
            parts: dict = {}
            ex, bd = bounds.step_with_bound(one, p, x, h, c, u, U_ACC, parts=parts, act_ulps=self.act_ulps)
            return ex, bd, (parts["xx"][0], parts["hh"][0])
        xr, hr = states.ranges(one, xin, recs[0]["h"])
        rng = np.random.default_rng((self.rep.seed, i, k))
        xf, entries, added = states.exercise(one, dirs, xf, entries, counts, step, rng, xr, hr, seen)
        res = self._resolutions(one, dirs, xf, entries, seen)
        weak = [np.flatnonzero(~np.isfinite(r["rows"])) for r in res]  # a weight no state reaches
        if any(len(w) for w in weak):  # weights no state reaches: states for their rows, once
            xf, entries, more = states.exercise(one, dirs, xf, entries, counts, step, rng, xr, hr, seen, weak)
            added += more
            res = None
        tols = self._step_tolerances(i, k, one, dirs, xf, entries, u)
        if res is None or tols is not None:  # the resolution follows from the tolerance applied
            res = self._resolutions(one, dirs, xf, entries, seen, tols)
        for d, (cnt, r) in enumerate(zip(counts, res)):
            self.evidence[i].coverage.append(
                SlabCoverage(k, d, xf.shape[0], added, np.flatnonzero(cnt < 1), r, int(cnt.min())))
        return xf, entries

    def _slips_applied(self, i: int, k: int, one: RNNLayer, dirs: list, slack: list, u: float) -> list[SlabEscape]:
        """Rule A asked of the tolerance the one-step comparison applies (docs/cli.md "Verdicts"): the slips each
        loose direction of slab ``k`` of layer ``i`` could let pass (``slack``, ``(direction, escape)`` of
        :func:`rnnconvert.verify.sample.slab_states`, checked against the rigorous bound), as :class:`SlabEscape`
        records (``against``: ``'bound'``, or ``'measured'`` where the bound let a slip pass and the measured
        tolerance was asked). Where the slab has a measured tolerance (``measured[k]`` of its evidence, rule E), a slip
        the bound let pass is checked again against it, on the same states (the first :data:`SWAP_STATES` trajectory states
        and the probes, their products computed again: a few rows): caught where its exact step parts from the
        correct one by more than the correct step's measured tolerance plus its own (:func:`orders.applied` of its
        exact step and bound, the direction's measured share ``r``), so that no file with it is judged ``ok``; a
        slip the bound catches is caught by the smaller tolerance too."""
        ev = self.evidence[i]
        tols = ev.measured[k]
        if tols is None:
            return [SlabEscape(k, d, esc) for d, esc in slack]
        rs = ev.fractions[-len(dirs):]  # this slab's shares, one per direction (_step_tolerances just appended them)
        xf, entries = ev.slabs[k]
        N, P = ev.x.shape[0] * ev.x.shape[1], escapes.N_PROBES
        rows = np.r_[0:min(N, SWAP_STATES), N:N + P]  # the states slab_states checked the slips on
        out = []
        for d, esc in slack:
            against = "bound"
            if esc is not None and not esc.startswith("n/a"):
                against, tol = "measured", partial(orders.applied, r=rs[d], u=u)
                if esc != "the directions exchanged":  # else every other slip was caught by the bound already
                    (h0, c0), _, _ = entries[d]
                    h, c = h0[rows], None if c0 is None else c0[rows]
                    parts: dict = {}
                    bounds.step_with_bound(one, dirs[d], xf[rows], h, c, u, U_ACC, parts=parts,
                                           act_ulps=self.act_ulps)
                    esc = escapes.swap_escapes(one, dirs[d], h, c, parts, u, U_ACC, act_ulps=self.act_ulps,
                                               tolerance=tol)
                if esc is None and len(dirs) == 2:
                    esc = escapes.directions_escape(entries[d][1:], entries[1 - d][1:], slice(N, N + P), tol)
            out.append(SlabEscape(k, d, esc, against))
        return out

    @staticmethod
    def _resolutions(one: RNNLayer, dirs: list, xf: np.ndarray, entries: list, seen: list,
                     tols: list | None = None) -> list[dict]:
        """:func:`rnnconvert.verify.states.resolution` of each direction on all its states, against the tolerance
        the one-step comparison applies: the measured one (``tols``, per direction ``(th, tc)``) where there is one,
        else the rigorous bound."""
        out = []
        for d, (p, got, ((h0, _), _, bound)) in enumerate(zip(dirs, seen, entries)):
            cat = lambda parts: None if parts[0] is None else np.concatenate(parts)  # noqa: E731
            g = tuple(cat([s[0][j] for s in got]) for j in range(3))
            prods = tuple(cat([s[1][j] for s in got]) for j in range(2))
            out.append(states.resolution(one, p, xf, h0, g, prods, bound if tols is None else tols[d]))
        return out

    def _step_tolerances(self, i: int, k: int, one: RNNLayer, dirs: list, xf: np.ndarray, entries: list,
                         u: float) -> list | None:
        """The measured one-step tolerance of each direction of slab ``k`` of layer ``i`` on its final states
        (:func:`rnnconvert.verify.orders.step_tolerance` of the spread :func:`rnnconvert.verify.orders.step_spread`
        measures), kept in the layer's evidence (``measured[k]``, ``fractions``) and returned (per direction ``(th,
        tc)``); None, the rigorous bound alone, where no float32 evaluation order measures the target's rounding
        (:meth:`_measures_steps`)."""
        if not self._measures_steps(one, u):
            return None
        ev, tols = self.evidence[i], []
        for p, ((h0, c0), exact, bound) in zip(dirs, entries):
            spread, used = orders.step_spread(one, p, xf, h0, c0, exact)
            tol, r = orders.step_tolerance(exact, bound, spread, u)
            tols.append(tol)
            ev.fractions.append(r)
            ev.step_orders = tuple(used)
        ev.measured[k] = tols
        return tols

    def _measures_steps(self, one: RNNLayer, u: float) -> bool:
        """Whether the one-step comparison of slab ``one`` gets a measured tolerance: float32 arithmetic (not float16
        weights or a float16 target run, which the float32 orders do not evaluate), activations within the
        bound's own allowance (no ``act_ulps``: cuDNN's ``tanh``), and weight matrices of at most
        :data:`rnnconvert.verify.states.RES_WEIGHTS` elements (above, the four float32 steps per state would cost
        more than the rest of verification: the rigorous bound stays the tolerance)."""
        p = one.params[0][0]
        return (u == bounds.unit_roundoff(np.float32) and self.act_ulps is None
                and max(p.w_ih.size, p.w_hh.size) <= states.RES_WEIGHTS)

    def _emulate(self, i: int, k: int, one: RNNLayer, dirs: list, own: bool, per: bool) -> None:
        """The spread of the target's emulated arithmetic (``self.emulate``) from the float64 run on the short
        sequence of slab ``k`` of layer ``i`` while its parameters are loaded: for a layer compared slab by slab,
        slab ``k`` alone from its float32 input (``seq_slabs``); else chained over the slabs from the
        layer's input, the float64 side the CANONICAL equations' run, never the source's own equations (``y64``
        of a Keras or TF1 file): a gap between those (a reader's slip) must stay outside the tolerance, or it
        would widen the tolerance to cover itself."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        last = k == layer.num_layers - 1
        if per:
            xk, _y32, y64 = ev.seq_slabs[k]
            em = self.emulate(one, xk, finished=False)
            ev.spreads = (ev.spreads or []) + [float(np.abs(np.asarray(y64, np.float64) - em).max())]
            return
        xs = ev.seq_x()
        em_in, canon_in = (xs, xs) if k == 0 else ev.em
        em = self.emulate(one, em_in, finished=False)
        if own:
            canon = reference.forward_slab(one, dirs, np.asarray(canon_in, np.float64), np.float64, kernels=FAST)
        else:
            canon = None  # the numpy reference's float64 run is the evidence's y64 (chained the same way)
        ev.em = (em, canon)
        if last:
            ref = reference.finish(layer, canon) if own else ev.y64
            ev.spreads = float(np.abs(ref - reference.finish(layer, em)).max())
            ev.em = None

    def _spreads(self, i: int, dst_module, n: int) -> list[float]:
        """The spread of a run emulating the target's own arithmetic (:meth:`_emulate`; 0 for a target that
        declares none) for each of the ``n`` sequence runs of layer ``i`` (the whole layer, or each slab)."""
        spreads = self.evidence[i].spreads if getattr(dst_module, "target_arithmetic", None) is not None else None
        if not isinstance(spreads, list):
            spreads = [spreads or 0.0] * n
        if len(spreads) != n:
            raise RuntimeError(f"layer '{self.ckpt.layers[i].name}': {len(spreads)} emulated spreads for {n} "
                               f"sequence runs")
        return spreads

    def judge(self, i: int, run: TargetRun, target_route: str) -> LayerCheck:
        """Both comparisons of layer ``i`` against the written file (``run``), and the verdict
        (:func:`rnnconvert.verify.verdict.decide`)."""
        layer, ev = self.ckpt.layers[i], self.evidence[i]
        tol = verdict.Tolerances(first=_first(layer, self.first_tol),
                                 rho=fraction(unit_roundoff(layer, self.target_dtype)), far=orders.FAR,
                                 step_fail=orders.STEP_FAIL)
        ref = ev.yfw if self.mode == "framework" else ev.y64
        runs, seq_note = run._sequence_target(layer, ev, self._by_slab(layer), ref)
        seqs, seq_t = verdict.sequence_checks(layer.name, runs, self._spreads(i, run.dst_module, len(runs)),
                                              tol.first)
        fed_runs, fed_note = run._fed_target(layer, ev, self.mode == "framework")  # each at its own length
        emulated = getattr(run.dst_module, "target_arithmetic", None) is not None
        seqs += verdict.sequence_checks(layer.name, fed_runs, [g.spread if emulated else 0.0 for g in ev.fed],
                                        tol.first)[0]
        seq_note = seq_note or fed_note
        st, note = run._step_check(layer, ev)
        got = run._whole_layer(layer, ev) if self._by_slab(layer) else None
        whole = None if got is None else verdict.wiring_check(layer.name, *got, ev.y32, lambda: self._chain64(i),
                                                              tol.first)
        cov = ev.coverage_fields(layer)
        found = verdict.Findings(
            seqs, st, note, ev.seq_x().shape[1], whole=whole, unexercised=cov.get("unexercised", ""),
            constructed=cov.get("constructed", 0), resolution=cov.get("resolution"),
            resolution_at=cov.get("resolution_at", ""), swaps_caught=self._swaps_caught(i),
            loose_escape=ev.loose_escape(), escapes_measured=ev.escapes_measured(),
            at_dtype="" if self.target_dtype is None else f" at {self.target_dtype.__name__}",
            seq_names=[""] * len(runs) + [g.label for g in ev.fed])
        while (fields := verdict.decide(found, tol)).get("ask"):  # a measurement only some rules need
            if fields["ask"] == "spread":
                found.spreads = self._measured_spreads(i, seqs, fields["over"])
            else:
                found.sequence_escape = self._sequence_escapes(i, tol.rho, fields["tols"])
        c = LayerCheck(name=layer.name, source_route=ev.route,
                       target_route=verdict.route(target_route, bool(st), note, seq_note, NOT_INSTALLED,
                                                  whole is not None),
                       **fields, **cov)
        c.seq_err_t = [] if seq_t is None else seq_t.tolist()
        return c

    def _layer_again(self, i: int) -> RNNLayer | str:
        """Layer ``i`` with its parameters in memory: as it is, or (a streamed conversion) read again where it
        is at most :data:`SEQ_SLIP_BYTES`; else why not (a phrase)."""
        layer = self.ckpt.layers[i]
        if not self.ckpt.lazy:
            return layer
        nbytes = sum(int(a.size) * a.dtype.itemsize for dirs in layer.params for dp in dirs
                     for a in dp.arrays().values())
        if nbytes > SEQ_SLIP_BYTES:
            return f"the layer's {nbytes >> 20} MiB are not read again"
        try:
            return replace(layer, params=[self.ckpt.slab(i, k) for k in range(layer.num_layers)])
        except (OSError, ValueError, FormatError) as e:
            return f"the layer could not be read again: {e}"

    def _measured_spreads(self, i: int, seqs: list, over: list[int]) -> dict | str:
        """The float32 spread of each sequence comparison of layer ``i`` over its one-sample tolerance (``over``:
        indices in :meth:`judge`'s ``seqs``, :class:`rnnconvert.verify.verdict.SeqCheck` of the whole layer or of each
        slab compared alone) measured again over several float32 evaluation orders of the canonical equations on the
        same inputs (:func:`rnnconvert.verify.orders.spread`: numpy's BLAS, blocked sums added in reverse, unblocked
        sequential sums, torch where loaded): ``{index: Spread}``, what rule 2 of
        :func:`rnnconvert.verify.verdict.decide` makes the measured tolerance of; or why it could not be measured (a
        phrase: a streamed layer not read again)."""
        layer, ev = self._layer_again(i), self.evidence[i]
        if isinstance(layer, str):
            return f"its float32 spread could not be measured again ({layer})"
        n_own = len(seqs) - len(ev.fed)  # then the graph-fed rows' comparisons, each of the whole layer
        slabs = n_own > 1
        out = {}
        for idx in over:
            one, x, fin = ((layer, ev.fed[idx - n_own].x, True) if idx >= n_own else
                           (layer.one_slab(idx), ev.seq_slabs[idx][0], idx == layer.num_layers - 1) if slabs
                           else (layer, ev.seq_x(), True))
            m, used = orders.spread(one, x, finished=fin)
            out[idx] = verdict.Spread(m, tuple(used))
        return out

    def _slip_cases(self, i: int, layer: RNNLayer, rho: float) -> list | str:
        """The sequence-level slips of :meth:`_sequence_escapes`: ``[(input, the correct layer, [(slip, slipped
        layer)])]`` slab by slab, or for the whole layer, then for each group of graph-fed rows (the whole layer, in
        the order of :meth:`judge`'s sequence comparisons); or why they cannot be checked (a phrase)."""
        ev = self.evidence[i]
        cases = []
        if self._by_slab(layer):  # each slab of the target from the source's float32 input of that slab
            for k in range(layer.num_layers):
                one = layer.one_slab(k)
                slips = [(f"the directions of stacked layer {k} exchanged",
                          replace(one, params=[list(reversed(one.params[0]))]))] if layer.bidirectional else []
                for j in (k - 1, k + 1):  # a neighbour's weights in its place
                    if 0 <= j < layer.num_layers and all(
                            a.shape == b.shape for pa, pb in zip(layer.params[j], one.params[0])
                            for a, b in zip(pa.arrays().values(), pb.arrays().values())):
                        slips.append((f"stacked layer {j}'s weights in layer {k}'s place",
                                      replace(one, params=[layer.params[j]])))
                cases.append((ev.seq_slabs[k][0], one, slips))
            return cases + [(g.x, layer, _layer_slips(layer)) for g in ev.fed]
        xs = ev.seq_x()
        canon = reference.forward(layer, xs, kernels=FAST)
        ref = ev.yfw if self.mode == "framework" else ev.y64
        if ref is None or ref.shape != canon.shape or \
                float(np.abs(canon - ref).max()) > 1e-3 * rho * max(1.0, float(np.abs(canon).max())):
            return "a reader's slip (the source's own equations and rnnconvert's reading of them part)"
        return [(x, layer, _layer_slips(layer)) for x in [xs] + [g.x for g in ev.fed]]

    def _sequence_escapes(self, i: int, rho: float, tols: list[float]) -> str | None:
        """Whether every slip that only the sequence comparison sees would move the short sequence of layer
        ``i`` (float64, the canonical equations) by more than twice ``rho`` of the output's scale or twice
        the sequence tolerance (``tols``: of the whole layer, or of each slab compared alone): a lone direction
        run in the other time order (``go_backwards`` flipped), the two directions of a slab exchanged, two
        stacked slabs of equal shapes exchanged: asked by :func:`rnnconvert.verify.verdict.decide` only for a sequence
        within an ill-conditioned tolerance (above ``rho`` of the scale; rule 10). ``None`` when each does (a file
        holding one of them parts from the source by more than its tolerance unless its own float32 rounding moved it
        by more than that tolerance: the sequence is then beyond it, and the verdict is not ``ok``), else
        the first that does not, or why it cannot be checked: the source's parameters are not in memory (a
        streamed conversion), or the source's own equations and the canonical ones part (what the sequence
        comparison is there to see: a reader's slip). docs/cli.md "Verdicts"."""
        layer = self._layer_again(i)
        if isinstance(layer, str):
            return f"a slip only a sequence shows ({layer} to rule it out)"
        cases = self._slip_cases(i, layer, rho)
        if isinstance(cases, str):
            return cases
        for (x, good, slips), tol in zip(cases, tols):
            if not good.bidirectional:
                slips.append(("the time order flipped (go_backwards)",
                              good.with_semantics(go_backwards=not good.semantics.go_backwards)))
            base = _unfinished(good, x)
            scale = max(float(np.abs(base).max()), 1e-300)
            for desc, var in slips:
                moved = _unfinished(var, x)
                if float(np.abs(moved - base).max()) <= 2.0 * max(rho * scale, tol):
                    return desc
        return None

    def _swaps_caught(self, i: int) -> bool:
        """Whether every loose direction of layer ``i`` showed that all its gate-block swaps are caught
        (:func:`rnnconvert.verify.escapes.swap_escapes` returned None for each)."""
        return self.evidence[i].swaps_caught()

    def target_side(self, dst_path, dst_module, progress=None) -> VerifyReport:
        """Run the written file in the target framework and compare, layer by layer; returns the report.
        ``progress(done, total)``: layers verified so far. numpy's BLAS kept to one thread
        (:func:`rnnconvert.speed.threads.one_blas_thread`)."""
        with threads.one_blas_thread():
            return self._target_side(dst_path, dst_module, progress)

    def _target_side(self, dst_path, dst_module, progress=None) -> VerifyReport:
        t0 = time.perf_counter()
        dst_module = as_target(dst_module)
        target_route = _engine(dst_module)
        run = TargetRun(self.ckpt, dst_path, dst_module)
        self.pool.clear()  # the source side is done: its buffers go before the target framework runs
        if progress is not None:
            progress(0, len(self.ckpt.layers))
        try:
            for i in range(len(self.ckpt.layers)):
                self.rep.layers.append(self.judge(i, run, target_route))
                gpu.forget()
                if progress is not None:
                    progress(i + 1, len(self.ckpt.layers))
        finally:
            release = dst_module.release  # a cached target session (onnxruntime)
            if release is not None:
                release()
            kernels.release_scratch()
        self.target_seconds += time.perf_counter() - t0
        self.rep.seconds = self.seconds + self.target_seconds  # a second target (the other cuDNN route) adds its own
        return self.rep


def verify(src_ckpt: Checkpoint, src_module, dst_path, dst_module, *, mode: str = "reference",
           src_path=None, seed: int = 0, batch: int | None = None, steps: int | None = None,
           first_tol: float | None = None, inputs: dict[str, np.ndarray] | None = None,
           target_dtype=None, added: dict[str, np.ndarray] | None = None) -> VerifyReport:
    """Run every recurrent layer of ``src_ckpt`` on one batch on both sides and compare (module docstring).

    Args:
        src_ckpt: the checkpoint as read from the source (in memory).
        src_module / dst_module: the format modules of source and target; ``dst_module`` a list: several
            targets of the same file (the cuDNN routes, which share ``act_ulps`` and ``target_arithmetic``),
            judged against one source side, their layers in one report.
        dst_path: the written file (temporary path before it is renamed into place).
        mode: ``'reference'`` (numpy equations of the source) or ``'framework'`` (the source framework,
            for the sequence comparison).
        seed, batch, steps: the random batch ``x ~ N(0, 1)`` of shape ``(batch, steps, input_size)``
            (default: :func:`sample_shape`).
        first_tol: the relative term of the sequence tolerance (default 1e-5, 1e-2 for float16 weights).
        inputs: ``{layer name: (B, T, input_size) array}``: real inputs to verify those layers on instead
            of the random batch (any length: the one-step comparison's tolerance does not grow with it).
        target_dtype: ``np.float16`` when the target runs in float16 (the cuDNN route's ``--dtype``).
        added: ``{layer name: [FedRows]}``: rows a whole model's graph feeds those layers (issue #39;
            :class:`rnnconvert.verify.sample.FedRows`, groups of equal length), checked besides their batches at
            their own length: their trajectory states join the one-step comparison, each group's whole sequence is
            compared (:attr:`rnnconvert.verify.evidence.LayerEvidence.fed`).

    Raises:
        FormatError: ``inputs`` of the wrong shape or naming no layer.

    Returns:
        a :class:`VerifyReport`; :meth:`VerifyReport.raise_if_failed` turns failure into an error.
    """
    t0 = time.perf_counter()
    targets = [as_target(t) for t in (dst_module if isinstance(dst_module, (list, tuple)) else [dst_module])]
    check = StreamedVerification(src_ckpt, src_module, mode=mode, src_path=src_path, seed=seed, batch=batch,
                                 steps=steps, inputs=inputs, first_tol=first_tol, target_dtype=target_dtype,
                                 target=targets[0], added=added)
    try:
        for i, layer in enumerate(src_ckpt.layers):
            for k in range(layer.num_layers):
                check.source_slab(i, k, layer.params[k])
    finally:
        kernels.release_scratch()
    for t in targets:  # one source side for every target (the two cuDNN routes): one report, their layers in turn
        rep = check.target_side(dst_path, t)
    rep.seconds = time.perf_counter() - t0
    return rep
