"""The target side of verification: the written file run by its own framework (the target format's runtimes,
:class:`rnnconvert.verify.target.Target`), layer by layer, on what the source side kept
(:class:`rnnconvert.verify.evidence.LayerEvidence`): one step from every kept state (:meth:`TargetRun._step_check`)
and the short sequence (:meth:`TargetRun._sequence_target`), whole or slab by slab. Where the target's framework is
not installed (or the format has no runner), the numpy reference runs on the arrays read back from the written file
(:meth:`TargetRun._read_back`), and the note returned says so.
"""

from __future__ import annotations

import numpy as np

from ..core import reference
from ..core.model import Checkpoint, RNNLayer
from ..errors import DependencyError, VerificationError
from ..speed.kernels import FAST
from . import escapes
from .evidence import LayerEvidence
from .verdict import loose, worst

#: Why a comparison ran in the numpy reference on the arrays read back instead of the target framework.
NOT_INSTALLED = "its framework is not installed or failed to import"


def _where(j: int, B: int, T: int, fed=()) -> str:
    """The state of row ``j`` of the one-step states in words (trajectory row ``b * T + t``, the graph-fed rows'
    ``fed``: ``[(label, rows, steps, picked)]``, issue #39, probes, constructed)."""
    P = escapes.N_PROBES
    if j < B * T:
        return f"sequence {j // T}, step {j % T}"
    j -= B * T
    for label, rows, steps, picked in fed:
        n = len(rows) * steps if picked is None else len(picked)
        if j < n:
            flat = j if picked is None else int(picked[j])
            return f"{label}: row {rows[flat // steps]}, unmasked step {flat % steps}"
        j -= n
    return f"constructed state {j - P}" if j >= P else f"probe {j}"


class TargetRun:
    """The written file ``dst_path`` of format ``dst_module`` (a :class:`rnnconvert.verify.target.Target`) run for
    the layers of ``ckpt`` (the source checkpoint: names and shapes); one per target judged. Holds the file read back
    (the fallback, read once) and the one steps a format computed with a slab's sequence (``target_slab_check``)."""

    def __init__(self, ckpt: Checkpoint, dst_path, dst_module) -> None:
        self.ckpt, self.dst_path, self.dst_module = ckpt, dst_path, dst_module
        self._back = None  # the written file read back (fallback target of both comparisons)
        self._steps: dict = {}  # (layer name, slab) -> the target's one steps, from a target_slab_check run
        self._wired: dict = {}  # layer name -> (whole, joined), from a target_forward_wired run (_by_slab)

    def _target_step(self, layer: RNNLayer, k: int, xf, states) -> tuple[list | None, str]:
        """The target's one step of slab ``k`` from ``states``; ``(results, note)``: ``note`` names a
        fallback (the numpy reference on the arrays read back from the written file, when the target's
        framework is not installed or the format has no ``target_step``)."""
        done = self._steps.pop((layer.name, k), None)
        if done is not None:  # computed with the slab's sequence (_slab_run)
            return done, ""
        fn = self.dst_module.target_step
        why = "no one-step runner for this format"
        if fn is not None:
            try:
                return fn(self.dst_path, self.ckpt, layer.name, k, xf, states), ""
            except DependencyError:
                why = NOT_INSTALLED
        whole = self._read_back(layer)  # the file's own semantics (a TF1 writer folds forget_bias into b_f)
        if whole is None:
            return None, why
        back = whole.one_slab(k)
        got = [reference.step(back, p, xf, s[0], s[1], kernels=FAST) for p, s in zip(back.params[0], states)]
        return got, f"one step by the numpy reference on the arrays read back ({why})"

    def _step_check(self, layer: RNNLayer, ev: LayerEvidence) -> tuple[dict, str]:
        """The one-step comparison of ``layer``: every slab and direction. Returns the numbers (the keys of
        :attr:`rnnconvert.verify.verdict.Findings.step`; ``{}`` when the target ran no step) and a note."""
        out = {"ratio": 0.0, "err": 0.0, "bound": 0.0, "tol": 0.0, "loose": 0.0, "where": "", "n": 0, "scale": 0.0,
               "m_ratio": 0.0, "m_err": 0.0, "m_tol": 0.0, "m_bound": 0.0, "m_where": "", "m_kind": "", "m_max": 0.0,
               "measured": ev.step_orders, "fraction": max(ev.fractions, default=1.0)}
        B, T = ev.x.shape[:2]
        per_t = np.zeros((3, T))  # the largest error, bound and applied tolerance element at each step t (plots)
        note = ""
        for k, (xf, entries) in enumerate(ev.slabs):
            got, why = self._target_step(layer, k, xf, [e[0] for e in entries])
            if got is None:
                return {}, why
            note = note or why
            tols = ev.measured[k] or [bd for _, _, bd in entries]  # the measured tolerance, else the bound
            kind = "bound" if ev.measured[k] is None else "measured"
            for d, (_, (h1, c1), (dh, dc)), (th, tc), (mh, mc) in zip(range(len(entries)), entries, got, tols):
                out["loose"] = max(out["loose"], loose((h1, c1), (dh, dc)))
                pairs = [(th, h1, dh, mh, "h")] + ([] if c1 is None else [(tc, c1, dc, mc, "c")])
                for tv, ev_, bd, mt, what in pairs:
                    _compare_step(layer, out, per_t, np.asarray(tv, np.float64), ev_, (bd, mt), B, T,
                                  f"stacked layer {k}, direction {d}, {what}, ", kind, ev.fed_layout())
                    out["n"] += ev_.shape[0] - escapes.N_PROBES if what == "h" else 0
        out["err_t"], out["bound_t"], out["applied_t"] = per_t[0].tolist(), per_t[1].tolist(), per_t[2].tolist()
        return out, note

    def _read_back(self, layer: RNNLayer) -> RNNLayer | None:
        """``layer`` as the written file holds it, read back by rnnconvert's reader (the fallback target of
        both comparisons when the target's framework is missing): the file's own semantics, but for the
        run-time clips a checkpoint does not store (as the TF1 target does:
        rnnconvert.formats.tf.tf1_write.target_forward). ``None`` when rnnconvert cannot read the format."""
        if self.dst_module.read is None:
            return None
        if self._back is None:
            self._back = self.dst_module.read(self.dst_path)
        return self._back.layer(layer.name).with_semantics(cell_clip=layer.semantics.cell_clip,
                                                           proj_clip=layer.semantics.proj_clip)

    def _slab_run(self, layer: RNNLayer, ev: LayerEvidence, k: int, x: np.ndarray) -> np.ndarray:
        """The target's slab ``k`` of ``layer`` on ``x`` (``target_forward_slab``); where the format runs a slab's
        sequence and its one steps at once (``target_slab_check``), both, the steps kept for
        :meth:`_target_step`."""
        fn, slab = self.dst_module.target_slab_check, ev.slabs[k]
        if fn is not None and slab is not None:
            xf, entries = slab
            y, steps = fn(self.dst_path, self.ckpt, layer.name, k, x, xf, [e[0] for e in entries])
            self._steps[layer.name, k] = steps
            return y
        return self.dst_module.target_forward_slab(self.dst_path, self.ckpt, layer.name, k, x)

    def _sequence_target(self, layer: RNNLayer, ev: LayerEvidence, by_slab: bool, ref) -> tuple[list, str]:
        """The target's run of the short sequence as ``[(y, y32, ref)]``, each target output ``y`` with the source's
        float32 run and reference (float64, or the source framework's: ``ref``) of the same sequence: one entry for
        the whole layer, or one per slab (``by_slab``: each slab of the target from the source's float32 input of
        that slab). And a note naming a fallback: the numpy reference (float32, as a framework runs it) on the
        arrays read back from the written file, when the target's framework is not installed (a plain install
        writing ``.pt``, ``.npz``, ``.safetensors``)."""
        if by_slab:
            if self.dst_module.target_forward_slab is None:  # the source side stored per-slab references only
                raise RuntimeError(f"slab_targets was set for {self.dst_module.name}, which has no "
                                   f"target_forward_slab")
            return self._by_slab(layer, ev)
        xs = ev.seq_x()
        try:
            if self.dst_module.target_forward_slab is not None and (
                    layer.num_layers > 1 or self.dst_module.target_slab_check is not None):
                y = xs
                for k in range(layer.num_layers):
                    y = self._slab_run(layer, ev, k, y)
                return [(reference.finish(layer, y), ev.y32, ref)], ""
            return [(self.dst_module.target_forward(self.dst_path, self.ckpt, layer.name, xs), ev.y32, ref)], ""
        except DependencyError:
            back = self._read_back(layer)
            if back is None:
                raise
            y = reference.forward(back, xs, np.float32, kernels=FAST)  # finish applied, as target_forward returns it
            return [(y, ev.y32, ref)], f"sequence by the numpy reference on the arrays read back ({NOT_INSTALLED})"

    def _fed_target(self, layer: RNNLayer, ev: LayerEvidence, framework: bool) -> tuple[list, str]:
        """The target's run of each group of rows a whole model's graph feeds the layer (issue #39), all their steps,
        the whole written layer (``target_forward``) as ``[(y, y32, ref)]`` with the source's float32 run and
        reference (float64, or the source framework's: ``framework``), in the order of ``ev.fed``; and a note
        naming a fallback (:meth:`_sequence_target`'s)."""
        out, note = [], ""
        for g in ev.fed:
            ref = g.yfw if framework else g.y64
            try:
                y = self.dst_module.target_forward(self.dst_path, self.ckpt, layer.name, g.x)
            except DependencyError:
                back = self._read_back(layer)
                if back is None:
                    raise
                y = reference.forward(back, g.x, np.float32, kernels=FAST)
                note = f"sequence by the numpy reference on the arrays read back ({NOT_INSTALLED})"
            out.append((y, g.y32, ref))
        return out, note

    def _whole_layer(self, layer: RNNLayer, ev: LayerEvidence) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole written layer (every node of it and the file's wiring between them: ``target_forward``) on the
        short sequence, and the same nodes run one by one (``target_forward_slab``) and joined as the source's layer
        joins its slabs (each slab's output, directions concatenated, is the next one's input): float64 ``(B, T,
        dirs*H)`` each, finished. None where the target's slabs are not joined by a wiring of the file's own
        (:attr:`rnnconvert.engine.protocol.Runtime.wired`) or the framework is missing (issue #39)."""
        fwd, slab = self.dst_module.target_forward, self.dst_module.target_forward_slab
        if not getattr(self.dst_module, "target_wired", False) or fwd is None or slab is None:
            return None
        done = self._wired.pop(layer.name, None)
        if done is not None:  # run with the slabs' sequences (_by_slab: target_forward_wired)
            whole, y = done
            return whole, reference.finish(layer, y)
        try:
            whole = fwd(self.dst_path, self.ckpt, layer.name, ev.seq_x())
            y = ev.seq_x()
            for k in range(layer.num_layers):
                y = slab(self.dst_path, self.ckpt, layer.name, k, y)
        except DependencyError:
            return None
        return whole, reference.finish(layer, y)

    def _by_slab(self, layer: RNNLayer, ev: LayerEvidence) -> tuple[list, str]:
        """:meth:`_sequence_target` slab by slab: each slab of the target from the source's float32 input of it. A
        wired target whose runtime runs its three sequences in one pass (``target_forward_wired``: these, the whole
        written layer and its slabs chained) runs them together, the other two kept for :meth:`_whole_layer`."""
        out, note, last = [], "", layer.num_layers - 1
        fused = self._fused(layer, ev)
        for k, (xk, y32, y64) in enumerate(ev.seq_slabs):
            try:
                y, note = (self._slab_run(layer, ev, k, xk) if fused is None else fused[k]), ""
            except DependencyError:
                back = self._read_back(layer)
                if back is None:
                    raise
                y = reference.forward_slab(back, back.params[k], xk, np.float32, kernels=FAST)
                note = f"sequence by the numpy reference on the arrays read back ({NOT_INSTALLED})"
            out.append(tuple(reference.finish(layer, a) if k == last else a for a in (y, y32, y64)))
        return out, note

    def _fused(self, layer: RNNLayer, ev: LayerEvidence) -> list | None:
        """The target's slabs of ``layer`` on the source's float32 input of each (``ev.seq_slabs``) from one
        ``target_forward_wired`` run, which also runs the whole written layer and the slabs chained (kept for
        :meth:`_whole_layer`); ``None`` where the target has no such run or no wiring of its own (:meth:`_whole_layer`'s
        conditions), the format checks slabs with its one steps (``target_slab_check``) or the target's framework is
        missing."""
        fn = getattr(self.dst_module, "target_forward_wired", None)
        if fn is None or self.dst_module.target_slab_check is not None or \
                not getattr(self.dst_module, "target_wired", False) or self.dst_module.target_forward is None:
            return None
        try:
            whole, ys, joined = fn(self.dst_path, self.ckpt, layer.name, ev.seq_x(), [a[0] for a in ev.seq_slabs])
        except DependencyError:
            return None
        self._wired[layer.name] = (whole, joined)
        return ys


def _compare_step(layer: RNNLayer, out: dict, per_t: np.ndarray, tv: np.ndarray, ev: np.ndarray, tols: tuple,
                  B: int, T: int, at: str, kind: str = "bound", fed=()) -> None:
    """One output (``h_1`` or ``c_1``) of one direction's one steps against the exact ones: ``out`` (the worst
    element's ratio, error, bound and place; the same against the measured tolerance, ``m_*``; the largest error,
    bound element and scale) and ``per_t`` (the largest error, bound and tolerance applied at each step of the
    trajectory) updated.
    ``tols``: ``(bound, measured tolerance)`` of the output (the measured one the bound where none was measured);
    ``kind``: which the second is, ``'measured'`` or ``'bound'`` (``m_kind`` of the worst element; ``m_max`` the
    largest element of the tolerance applied); ``fed``: the graph-fed rows' layout
    (:meth:`rnnconvert.verify.evidence.LayerEvidence.fed_layout`), for the words.

    Raises:
        VerificationError: the target's output has another shape.
    """
    if tv.shape != ev.shape:
        raise VerificationError(f"verification failed: layer '{layer.name}' one-step output "
                                f"shape {tv.shape} differs from the source's {ev.shape}")
    bd, mt = tols
    ratio, err, bound, j = worst(np.abs(tv - ev), bd)
    scale = float(np.abs(ev).max())
    if ratio >= out["ratio"]:
        out.update(ratio=ratio, err=err, bound=bound, where=f"{at}{_where(j[0], B, T, fed)}")
    m_ratio, m_err, m_tol, m = worst(np.abs(tv - ev), mt)
    if m_ratio >= out["m_ratio"]:
        out.update(m_ratio=m_ratio, m_err=m_err, m_tol=m_tol, m_bound=float(bd[m]),
                   m_where=f"{at}{_where(m[0], B, T, fed)}", m_kind=kind)
    out["m_max"] = max(out["m_max"], float(mt.max()))
    rows = B * T  # the trajectory's states (row b * T + t), then the probes
    e_t = np.nan_to_num(np.abs(tv[:rows] - ev[:rows]), nan=np.inf).reshape(B, T, -1).max(axis=(0, 2))
    per_t[0] = np.maximum(per_t[0], e_t)
    per_t[1] = np.maximum(per_t[1], bd[:rows].reshape(B, T, -1).max(axis=(0, 2)))
    per_t[2] = np.maximum(per_t[2], mt[:rows].reshape(B, T, -1).max(axis=(0, 2)))
    out["err"] = max(out["err"], float(np.nanmax(np.abs(tv - ev))))
    out["tol"] = max(out["tol"], float(bd.max()))
    out["scale"] = max(out["scale"], scale)
