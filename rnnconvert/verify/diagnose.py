"""``rnnconvert diagnose``: name the slip that makes a hand-made conversion compute something else.

For each layer of DST that does not compute its source layer's function, the search (docs/diagnose.md):

1. **Function.** Both layers, as rnnconvert's readers put them in canonical form (:mod:`rnnconvert.core.model`;
   the source's TF1 ``forget_bias`` folded, :func:`rnnconvert.core.transforms.fold_forget_bias`), run through
   the float64 equations (:func:`rnnconvert.core.reference.forward`) on ``N(0, 1)`` inputs ``(3, 8, I)``. Outputs
   within ``1e-5 * max(1, max|y|)`` (the sequence rule's first term, :mod:`rnnconvert.verify.engine`): the
   layer is ok, even where its parameters are written differently (an LSTM's two biases summed).
2. **Parameters, tensor by tensor** (:mod:`rnnconvert.verify.slips`): each stacked layer and direction of DST is
   matched to the source's parameter set that explains most of its tensors (the same one, or the other
   direction or stacked layer: exchanged); each tensor is explained as the source's, or its gate blocks in
   another order (an exact block match), reshaped instead of transposed, with its ``(H, H)`` blocks
   transposed, the biases summed, a bias dropped, the forget bias not folded (the TF1 bias copied as is into
   ``b_ih``, or into ``b_hh``) -- or pairs of these (a reshape of a kernel in another gate order). Semantics
   fields that differ (gate activation, activation, reset-after, ``go_backwards``) are slips too. A DST
   layer no source layer of its name explains is tried against the other source layers (layers exchanged).
   Layers are paired by name, else by position, else (other counts) as one-layer pieces (:func:`view`); the
   smallest explanation is preferred throughout, and more than :data:`MAX_KINDS` kinds in one layer is
   "unexplained" (:func:`diagnose`, docs/diagnose.md).
3. **Confirmation.** The explanation is applied to the source's canonical layer and run through the same
   equations: it must reproduce DST's outputs (within the tolerance of 1.) while the uncorrected source does
   not; only then is the slip reported. Otherwise, or where some tensor has no explanation, the layer is
   "unexplained" with the first step at which the outputs part.

``--fix``: :func:`fixed_checkpoint` applies each slip's inverse to DST's tensors (a bias that DST lost --
dropped, or summed into the other -- is taken from the source) and the caller writes it with DST's own
writer and verifies it against SRC (:func:`rnnconvert.api.diagnose`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core import reference
from ..core.gates import CANONICAL, gate_slice
from ..core.model import Cell, Checkpoint, DirectionParams, RNNLayer
from ..core.transforms import fold_forget_bias
from . import pairing as P
from . import slips as S
from .slips import Slip

#: the inputs of the function comparison: ``(batch, steps)`` of ``N(0, 1)``
SAMPLE = (3, 8)
#: relative tolerance of the function comparison (verification's ``first``: :func:`rnnconvert.verify.engine._first`)
FIRST = 1e-5


@dataclass
class Recipe:
    """How one DST tensor came from the source's: ``variant`` (``as_is``, ``reshaped``, ``blocks_transposed``, ``blocks_reshaped``,
    ``summed``, ``zero``, ``unfolded``, ``summed_unfolded``) then its gate blocks put in ``order``."""

    variant: str
    order: str


@dataclass
class LayerDiagnosis:
    """The diagnosis of one DST layer.

    ``verdict``: ``'ok'`` (computes the source's function), ``'slip'`` (``slips`` explain it, confirmed) or
    ``'unexplained'``. ``source``: the source layer it was compared with. ``errors``: the measured maximum
    abs differences of the confirmation (``source``: uncorrected source vs DST; ``slipped``: source with the
    slips applied vs DST) and ``tolerance``. ``diverge``: where outputs first part (unexplained layers)."""

    name: str
    source: str
    verdict: str
    slips: list[Slip] = field(default_factory=list)
    note: str = ""
    errors: dict[str, float] = field(default_factory=dict)
    diverge: dict[str, Any] | None = None
    # internals for fixing: per DST (k, d), the source (k', d') and the recipes per tensor
    plan: dict = field(default_factory=dict, repr=False)
    src_index: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.name, "source_layer": self.source, "verdict": self.verdict,
                "slips": [s.to_dict() for s in self.slips], "note": self.note, "errors": self.errors,
                "diverge": self.diverge}


def _structure(a: RNNLayer) -> tuple:
    return (a.cell, a.input_size, a.hidden_size, a.num_layers, a.bidirectional, a.proj_size)


def _inputs(layer: RNNLayer, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((*SAMPLE, layer.input_size))


def _run(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    return reference.forward(layer, x, np.float64)


def _tol(y: np.ndarray) -> float:
    return FIRST * max(1.0, float(np.abs(y).max()))


def _err(a: np.ndarray, b: np.ndarray) -> float:
    d = np.abs(a - b)
    return float(d.max()) if np.isfinite(d).all() else float("inf")


# ---------------------------------------------------------------------------------------------------------
# one tensor

def _explain(t: str, dt: np.ndarray, e: DirectionParams, s: DirectionParams, cell: Cell, fb: float) -> Recipe | None:
    """How DST's tensor ``t`` (``dt``) came from the source's (``e``: canonical, forget bias folded; ``s``: as
    read, unfolded), or ``None``: the first variant (:func:`_variants`) whose gate blocks match."""
    for variant, base, ref, exact in _variants(t, dt, e, s, cell, fb):
        order = S.block_order(base, ref, cell, exact)
        if order is not None:
            return Recipe(variant, order)
    return None


def _source_of(variant: str, t: str, e: DirectionParams, s: DirectionParams) -> np.ndarray:
    """The source-side tensor a variant's gate blocks are matched with."""
    if variant == "summed":
        return e.b_ih + e.b_hh
    if variant == "summed_unfolded":
        return s.b_ih + s.b_hh
    if variant == "unfolded":
        return s.b_ih
    if variant == "zero":
        return np.zeros_like(getattr(e, t))
    return getattr(e, t)


def _variants(t: str, dt: np.ndarray, e: DirectionParams, s: DirectionParams, cell: Cell, fb: float):
    """``(variant, DST's tensor brought back to canonical form but for its gate order, the source tensor to
    match, exact?)`` in the order they are tried (the plain reading first)."""
    G = cell.gates
    src = getattr(e, t)
    yield "as_is", dt, src, True
    if t.startswith("w"):
        if dt.shape[0] != dt.shape[1]:
            yield "reshaped", S.unreshape(dt), src, True
        yield "blocks_transposed", S.blocks_reshaped(dt, G), src, True
        if dt.shape[0] != G * dt.shape[1]:  # square blocks: a transpose and a reshape coincide
            yield "blocks_reshaped", S.blocks_transposed(dt, G), src, True
        return
    other = e.b_hh if t == "b_ih" else e.b_ih
    lstm_fb = bool(fb) and cell is Cell.LSTM
    if lstm_fb and t == "b_ih":
        yield "unfolded", dt, _source_of("unfolded", t, e, s), True
    if np.any(other != 0):
        yield "summed", dt, _source_of("summed", t, e, s), False
        # an LSTM's bias copied unfolded into either vector (the other zero): b_hh holding the TF1 bias as
        # stored is the same as b_ih holding it but for the fold
        if lstm_fb:
            yield "summed_unfolded", dt, _source_of("summed_unfolded", t, e, s), False
    if np.any(src != 0) and not np.any(dt != 0):
        yield "zero", dt, np.zeros_like(src), True


def _apply(r: Recipe, t: str, e: DirectionParams, s: DirectionParams, cell: Cell) -> np.ndarray:
    """The slip of recipe ``r`` applied to the source's tensor ``t``: what DST holds."""
    if r.variant == "zero":
        return np.zeros_like(getattr(e, t))
    base = _source_of(r.variant, t, e, s)
    moved = S.reorder(base, r.order, cell)
    if r.variant == "reshaped":
        return S.reshape_slip(moved)
    if r.variant == "blocks_transposed":
        return S.blocks_transposed(moved, cell.gates)
    if r.variant == "blocks_reshaped":
        return S.blocks_reshaped(moved, cell.gates)
    return moved


def _invert(r: Recipe, t: str, dt: np.ndarray, e: DirectionParams, cell: Cell, fb: float, H: int) -> np.ndarray:
    """DST's tensor with the slip undone; where DST lost the information (a dropped or summed bias) the
    source's tensor."""
    if r.variant in ("zero", "summed", "summed_unfolded"):
        return np.array(getattr(e, t))
    if r.variant == "reshaped":
        dt = S.unreshape(dt)
    elif r.variant == "blocks_transposed":
        dt = S.blocks_reshaped(dt, cell.gates)
    elif r.variant == "blocks_reshaped":
        dt = S.blocks_transposed(dt, cell.gates)
    out = S.reorder(dt, r.order, cell, inverse=True)
    if r.variant == "unfolded":
        out = out.copy()
        sl = gate_slice(Cell.LSTM, "f", H)
        out[sl] = out[sl] + np.asarray(fb, out.dtype)
    return out


# ---------------------------------------------------------------------------------------------------------
# one layer

def _slot_plan(d_layer: RNNLayer, e_layer: RNNLayer, s_layer: RNNLayer) -> dict | None:
    """Per DST ``(k, d)``: ``((k', d'), {tensor: Recipe or None})``, the source set explaining most tensors
    (the same one on a tie); ``None`` when sizes do not allow a comparison."""
    if _structure(d_layer) != _structure(e_layer):
        return None
    cell, fb = e_layer.cell, e_layer_fb(s_layer)
    slots = [(k, d) for k in range(e_layer.num_layers) for d in range(e_layer.num_directions)]
    plan = {}
    for k, d in slots:
        dp = d_layer.params[k][d]
        best = None
        for k2, d2 in [(k, d)] + [x for x in slots if x != (k, d)]:
            ep, sp = e_layer.params[k2][d2], s_layer.params[k2][d2]
            if any(getattr(ep, t).shape != getattr(dp, t).shape for t in S.TENSORS):
                continue
            rec = {t: _explain(t, getattr(dp, t), ep, sp, cell, fb) for t in S.TENSORS}
            # a zero bias explained alone is no evidence of which set it came from; among sets explaining as
            # many tensors, the one needing the fewest slips (the same set first on a tie)
            score = (sum(r is not None and r.variant != "zero" for r in rec.values()),
                     -_recipe_cost(rec, cell) - ((k2, d2) != (k, d)))
            if best is None or score > best[0]:
                best = (score, (k2, d2), rec)
        if best is None:
            return None
        plan[(k, d)] = (best[1], best[2])
    return plan


def _recipe_cost(rec: dict, cell: Cell) -> int:
    """How many tensors of one parameter set a set of recipes calls slipped (another variant than ``as_is``,
    or another gate order)."""
    canon = CANONICAL[cell]
    return sum(r is not None and (r.variant != "as_is" or r.order != canon) for r in rec.values())


def e_layer_fb(s_layer: RNNLayer) -> float:
    """The source's TF1 run-time forget bias (0 for every other format)."""
    return float(s_layer.semantics.forget_bias) if s_layer.cell is Cell.LSTM else 0.0


def _slipped(d_layer: RNNLayer, e_layer: RNNLayer, s_layer: RNNLayer, plan: dict) -> RNNLayer:
    """The source's canonical layer with the plan's slips applied (DST's semantics): what DST should equal."""
    cell = e_layer.cell
    params = [[None] * e_layer.num_directions for _ in range(e_layer.num_layers)]
    for (k, d), ((k2, d2), rec) in plan.items():
        ep, sp, dp = e_layer.params[k2][d2], s_layer.params[k2][d2], d_layer.params[k][d]
        params[k][d] = replace(dp, **{t: _apply(rec[t], t, ep, sp, cell) for t in S.TENSORS})
    return replace(d_layer, params=params)


def _semantic_slips(name: str, e: RNNLayer, d: RNNLayer, fmt: str) -> list[Slip]:
    out = []
    for f in S.SEMANTIC:
        want, got = getattr(e.semantics, f), getattr(d.semantics, f)
        if f == "reset_after" and e.cell is not Cell.GRU:
            continue
        if want == got:
            continue
        who = S.target_name(fmt)
        # where DST's framework has no such choice (cuDNN/PyTorch: sigmoid gates, tanh, reset-after), the way out
        # is another format; elsewhere (ONNX, Keras) DST's own attribute is wrong
        out_of = (f"; {who} cannot express the source's: convert it to a format that does (ONNX)"
                  if fmt in ("pt", "safetensors", "cudnn_npz") else f"; set DST's {f} to {want}")
        if f == "gate_activation":
            msg = (f"{name}: gates are run with {got} where the source uses {want}"
                   + (" (Keras-2 hard_sigmoid = clip(0.2 x + 0.5, 0, 1))" if want == "hard_sigmoid" else "")
                   + out_of)
        elif f == "activation":
            msg = f"{name}: the candidate activation is {got} where the source uses {want}" + out_of
        elif f == "reset_after":
            ra = "reset-after (r * (W_hn h + b_hn), PyTorch/cuDNN, Keras reset_after=True)"
            rb = "reset-before (W_hn (r * h), Keras reset_after=False, TF1 GRUCell)"
            msg = (f"{name}: the GRU is run {ra if got else rb} where the source is {rb if got else ra}; "
                   f"the same weights compute another function" + out_of.replace("set DST's reset_after to",
                                                                                 "set DST's reset_after (ONNX "
                                                                                 "linear_before_reset) to"))
        else:  # go_backwards
            msg = (f"{name}: the source reads the sequence backwards (Keras go_backwards=True) and DST forwards: "
                   f"go_backwards ignored (reverse the input in time, and the output back)" if want else
                   f"{name}: DST reads the sequence backwards where the source reads it forwards")
        out.append(Slip(name, None, None, f, f, got, want, msg))
    return out


def _tensor_slips(name: str, cell: Cell, plan: dict, fmt: str, fb: float, depth0: int = 0) -> list[Slip]:
    out = []
    canon = CANONICAL[cell]
    for (k, d), ((k2, d2), rec) in sorted(plan.items()):
        k, k2 = k + depth0, k2 + depth0  # a one-layer piece of DST's stacked layer: its depth there
        here = S.where(name, k, d)
        if (k2, d2) != (k, d):
            if k2 == k:
                out.append(Slip(name, k, d, None, "directions_exchanged", [k2, d2], [k, d],
                                f"{here}: holds the {'backward' if d2 else 'forward'} direction's parameters: "
                                f"forward and backward directions exchanged"))
            elif d2 == d:
                out.append(Slip(name, k, d, None, "stacked_layers_exchanged", [k2, d2], [k, d],
                                f"{here}: holds stacked layer {k2}'s parameters: stacked layers {k} and {k2} "
                                f"exchanged"))
            else:
                out.append(Slip(name, k, d, None, "parameter_sets_exchanged", [k2, d2], [k, d],
                                f"{here}: holds layer {k2}, {'backward' if d2 else 'forward'}'s parameters"))
        summed_into = [t for t in ("b_ih", "b_hh") if rec[t].variant in ("summed", "summed_unfolded")]
        for t in S.TENSORS:
            r = rec[t]
            tn = S.tensor_name(fmt, t, k, d)
            if r.variant == "reshaped":
                out.append(Slip(name, k, d, t, "reshaped", "reshape", "transpose",
                                f"{here}: {tn} is the (in, {cell.gates}*H) kernel reshaped to (G*H, in), not "
                                f"transposed: use kernel.T"))
            elif r.variant == "blocks_transposed":
                out.append(Slip(name, k, d, t, "blocks_transposed", "block.T", "block",
                                f"{here}: each gate block of {tn} is transposed (Keras (H, H) recurrent blocks "
                                f"stacked without turning, or CuDNN kernel slices transposed where they are "
                                f"reinterpreted): transpose every block back"))
            elif r.variant == "blocks_reshaped":
                out.append(Slip(name, k, d, t, "blocks_reshaped", "reshape", "transpose",
                                f"{here}: each gate block of {tn} is its (in, H) Keras slice reshaped to (H, in), "
                                f"not transposed: use slice.T"))
            elif r.variant in ("summed", "summed_unfolded") and cell is Cell.GRU:
                # an LSTM's or simple RNN's two biases only count as their sum: not a slip there
                other = "b_hh" if t == "b_ih" else "b_ih"
                out.append(Slip(name, k, d, t, "biases_summed", f"{t}+{other}", t,
                                f"{here}: {tn} holds b_ih + b_hh and {S.tensor_name(fmt, other, k, d)} zero: "
                                f"summed cuDNN biases change a GRU's n gate (b_hn sits inside r * (W_hn h + b_hn)); "
                                f"keep the two biases apart"))
            elif r.variant == "zero" and not summed_into:
                out.append(Slip(name, k, d, t, "bias_dropped", "zeros", t,
                                f"{here}: {tn} is zero where the source's is not: {t} dropped"))
            if r.variant in ("unfolded", "summed_unfolded"):
                out.append(Slip(name, k, d, t, "forget_bias_not_folded", 0.0, fb,
                                f"{here}: TF1's forget_bias={fb:g} is not folded into {tn}'s f block "
                                f"(add it to b_ih[f])"))
            if r.order != canon and r.variant != "zero":
                out.append(Slip(name, k, d, t, "gate_order", r.order, canon,
                                f"{here}: {tn} gate blocks are {S.order_words(cell, r.order, fmt)}"))
    return out


def _diverge(e: RNNLayer, ye: np.ndarray, yd: np.ndarray, tol: float) -> dict[str, Any]:
    """The first time step and direction at which the outputs part by more than ``tol`` (input time order)."""
    diff = np.abs(ye - yd)
    diff = np.where(np.isfinite(diff), diff, np.inf)
    out = e.output_size
    best = None
    for d in range(e.num_directions):
        per_t = diff[..., d * out:(d + 1) * out].max(axis=(0, 2))
        bad = np.nonzero(per_t > tol)[0]
        if bad.size:
            # a backward direction (or a go_backwards layer) processes the last input step first
            backward = bool(d) != bool(e.semantics.go_backwards and not e.bidirectional)
            t = int(bad[-1] if backward else bad[0])
            n = (len(per_t) - 1 - t) if backward else t
            if best is None or n < best["processing_step"]:
                best = {"step": t, "processing_step": n, "direction": d, "max_abs_diff": float(per_t[t]),
                        "tolerance": tol}
    return best or {}


def diagnose_layer(name: str, s_layer: RNNLayer, d_layer: RNNLayer, fmt: str, seed: int = 0,
                   depth0: int = 0) -> LayerDiagnosis:
    """The diagnosis of DST layer ``d_layer`` (called ``name``) against source layer ``s_layer`` (module
    docstring). ``fmt``: DST's format name (for tensor names in messages); ``depth0``: where ``d_layer`` is
    a one-layer piece of DST's stacked layer ``name`` (:func:`view`), its depth there (slips and messages name
    ``weight_ih_l1``...)."""
    e_layer = fold_forget_bias(s_layer)
    fb = e_layer_fb(s_layer)
    if _structure(d_layer) != _structure(e_layer):
        want, got = _structure(e_layer), _structure(d_layer)
        return LayerDiagnosis(name, s_layer.name, "unexplained", note=(
            f"{name}: DST's layer is {got[0].value}(input {got[1]}, hidden {got[2]}, layers {got[3]}, "
            f"bidirectional {got[4]}) where the source's is {want[0].value}(input {want[1]}, hidden {want[2]}, "
            f"layers {want[3]}, bidirectional {want[4]})"))
    x = _inputs(e_layer, seed)
    ye, yd = _run(e_layer, x), _run(d_layer, x)
    tol = _tol(ye)
    err = _err(ye, yd)
    plan = _slot_plan(d_layer, e_layer, s_layer)
    if err <= tol:
        diff = [t for k in range(e_layer.num_layers) for d in range(e_layer.num_directions)
                for t in S.TENSORS if not S.same(getattr(e_layer.params[k][d], t), getattr(d_layer.params[k][d], t))]
        note = ""
        if diff:
            summed = plan and all(r.variant in ("as_is", "summed", "zero") for _, rec in plan.values()
                                  for r in rec.values() if r is not None) and any(
                r is not None and r.variant == "summed" for _, rec in plan.values() for r in rec.values())
            note = (f"{name}: the same function written differently ("
                    + ("b_ih and b_hh summed: harmless for this cell" if summed else
                       f"{', '.join(sorted(set(diff)))} differ within rounding") + ")")
        return LayerDiagnosis(name, s_layer.name, "ok", note=note, errors={"source": err, "tolerance": tol},
                              plan=plan or {})
    if plan is None or any(r is None for _, rec in plan.values() for r in rec.values()) or any(
            not _extras_same(e_layer.params[k2][d2], d_layer.params[k][d]) for (k, d), ((k2, d2), _) in plan.items()):
        missing = [] if plan is None else [f"{S.where(name, k, d)} {S.tensor_name(fmt, t, k, d)}"
                                           for (k, d), (_, rec) in sorted(plan.items())
                                           for t, r in rec.items() if r is None]
        div = _diverge(e_layer, ye, yd, tol)
        return LayerDiagnosis(name, s_layer.name, "unexplained", errors={"source": err, "tolerance": tol},
                              diverge=div, note=_unexplained(name, e_layer, div, missing))
    found = _semantic_slips(name, e_layer, d_layer, fmt) + _tensor_slips(name, e_layer.cell, plan, fmt, fb, depth0)
    slipped = _slipped(d_layer, e_layer, s_layer, plan)
    e_slip = _err(_run(slipped, x), yd)
    if not found or e_slip > tol:  # the explanation does not reproduce DST: not confirmed
        div = _diverge(e_layer, ye, yd, tol)
        return LayerDiagnosis(name, s_layer.name, "unexplained",
                              errors={"source": err, "slipped": e_slip, "tolerance": tol}, diverge=div,
                              note=_unexplained(name, e_layer, div, []))
    kinds = sorted({s.kind for s in found if s.kind not in S.SEMANTIC})
    if len(kinds) > MAX_KINDS:  # a shotgun is no diagnosis
        div = _diverge(e_layer, ye, yd, tol)
        return LayerDiagnosis(name, s_layer.name, "unexplained",
                              errors={"source": err, "slipped": e_slip, "tolerance": tol}, diverge=div,
                              note=_unexplained(name, e_layer, div, []).replace(
                                  "no known slip explains it", f"no small set of known slips explains it (the "
                                  f"closest takes {len(kinds)} kinds at once: {', '.join(kinds)})"))
    return LayerDiagnosis(name, s_layer.name, "slip", found, errors={"source": err, "slipped": e_slip,
                                                                     "tolerance": tol}, plan=plan)


def _extras_same(e: DirectionParams, d: DirectionParams) -> bool:
    """Projection and peepholes, not searched for slips: the same or none."""
    for t in ("w_hr", "peep"):
        a, b = getattr(e, t), getattr(d, t)
        if (a is None) != (b is None) or (a is not None and not S.same(a, b, exact=False)):
            return False
    return True


def _unexplained(name: str, e: RNNLayer, div: dict, missing: list[str]) -> str:
    what = f" ({'; '.join(missing[:4])} match no known slip)" if missing else ""
    if not div:
        return f"{name}: no known slip explains it{what}"
    return (f"{name}: no known slip explains it{what}; outputs first part at step {div['step']} "
            f"({'backward' if div['direction'] else 'forward'} direction): max abs difference "
            f"{div['max_abs_diff']:.3g} (tolerance {div['tolerance']:.3g})")


# ---------------------------------------------------------------------------------------------------------
# checkpoints

def pairs(src: Checkpoint, dst: Checkpoint) -> list[tuple[int, int]]:
    """``(source index, DST index)`` of the layers compared: the one pairing rule (:func:`rnnconvert.verify.pairing.pair`:
    by name where the names match, else by position or shape).

    Raises:
        ValueError: the layers left after the names differ in number."""
    return P.pair(src.layers, dst.layers).tuples()


def split_stack(layer: RNNLayer) -> list[RNNLayer]:
    """A stacked layer as its one-layer pieces, named ``<name>.l<k>`` (the names rnnconvert's ONNX writer gives
    its nodes; an ONNX exporter writes one node per stacked layer): piece ``k`` reads ``input_size`` (``k = 0``)
    or the previous piece's ``dirs * output_size`` features. A one-layer layer as it is."""
    if layer.num_layers == 1:
        return [layer]
    out, size = [], layer.input_size
    for k in range(layer.num_layers):
        out.append(replace(layer, name=f"{layer.name}.l{k}", input_size=size, num_layers=1,
                           params=[layer.params[k]]))
        size = layer.output_size * layer.num_directions
    return out


@dataclass
class View:
    """The layers compared: ``src``/``dst`` the layers (or their one-layer pieces, ``split``), ``pairs``
    ``(source index, DST index)`` into them, ``named`` whether paired by name, ``owner[i]`` the index in
    ``Checkpoint.layers`` of source view layer ``i``, ``dst_at[j]`` DST view layer ``j``'s layer name and depth
    in DST's file; ``pairing`` the rule's pairing of the view's layers (:mod:`rnnconvert.verify.pairing`)."""

    src: list[RNNLayer]
    dst: list[RNNLayer]
    pairs: list[tuple[int, int]]
    named: bool
    split: bool
    owner: list[int]
    dst_at: list[tuple[str, int]] = field(default_factory=list)
    pairing: P.Pairing | None = None


def view(src: Checkpoint, dst: Checkpoint) -> View:
    """How the layers of ``src`` and ``dst`` are compared (:func:`pairs`); where the files hold different
    numbers of layers with other names, or paired by position stack them otherwise (and the pieces agree in
    shape), both are cut into one-layer pieces (:func:`split_stack`: a 2-layer PyTorch GRU against two ONNX GRU
    nodes, two Keras GRUs against a 2-layer PyTorch GRU), paired by position.

    Raises:
        ValueError: the layer counts differ, with other names, and the pieces' counts differ too."""
    sp = [(i, piece) for i, l in enumerate(src.layers) for piece in split_stack(l)]
    dp = [(l.name, k, piece) for l in dst.layers for k, piece in enumerate(split_stack(l))]
    s_pieces, d_pieces = [x for _, x in sp], [x for _, _, x in dp]
    pieces = View(s_pieces, d_pieces, [(j, j) for j in range(len(dp))], False, True,
                  [i for i, _ in sp], [(n, k) for n, k, _ in dp],
                  P.Pairing([P.Pair(j, j, "position") for j in range(len(dp))], [l.name for l in s_pieces],
                            [l.name for l in d_pieces]))
    try:
        got = P.pair(src.layers, dst.layers)
    except ValueError:
        if len(sp) != len(dp):
            raise
        return pieces
    p = got.tuples()
    # paired by position or shape with stacks cut otherwise (a 2-layer and a 1-layer against a 1-layer and a
    # 2-layer): the pieces, where they all agree in shape (the files' order first: a stack is cut, not reordered)
    if not got.named and any(q.how == "shape" or _structure(src.layers[q.src]) != _structure(dst.layers[q.dst])
                             for q in got.pairs) and \
            len(sp) == len(dp) and all(_structure(a) == _structure(b) for a, b in zip(pieces.src, pieces.dst)):
        return pieces
    return View(list(src.layers), list(dst.layers), p, got.named, False, list(range(len(src.layers))),
                [(l.name, 0) for l in dst.layers], got)


#: the most kinds of slip (the layer's semantics fields not counted: they are read, not guessed) one layer's
#: explanation may name; more is a shotgun, not a diagnosis: the layer is unexplained (docs/diagnose.md)
MAX_KINDS = 3


def _kinds(ld: LayerDiagnosis) -> set[str]:
    return {s.kind for s in ld.slips if s.kind not in S.SEMANTIC}


def _cost(ld: LayerDiagnosis) -> tuple[int, int]:
    """How much an explanation claims: ``(kinds, slips)``; ``ok`` is ``(0, 0)``, unexplained the most."""
    if ld.verdict == "unexplained":
        return (1000, 0)
    return (len({s.kind for s in ld.slips}), len(ld.slips))


def _copy(ld: LayerDiagnosis) -> LayerDiagnosis:
    return replace(ld, slips=list(ld.slips), errors=dict(ld.errors))


def diagnose(src: Checkpoint, dst: Checkpoint, seed: int = 0) -> list[LayerDiagnosis]:
    """Each DST layer diagnosed against its source layer (:func:`view`, :func:`diagnose_layer`), the smallest
    explanation preferred. Paired by name, a layer no slip explains is tried against the other source layers
    of its shape and the one needing the fewest slips is taken (layers exchanged). Paired by position (the
    names differ, so the order is a guess), the DST layers the position leaves not ok are paired with those
    source layers in the way that needs the fewest slips in all (ties: by position), without calling that an
    exchange. Eager checkpoints (``Checkpoint.materialize``).

    Raises:
        ValueError: see :func:`view`."""
    v = view(src, dst)
    memo: dict[tuple[int, int], LayerDiagnosis] = {}

    def dg(i: int, j: int) -> LayerDiagnosis:
        if (i, j) not in memo:
            got = diagnose_layer(v.dst_at[j][0], v.src[i], v.dst[j], dst.format, seed, v.dst_at[j][1])
            got.src_index = i
            memo[(i, j)] = got
        return memo[(i, j)]

    base = {j: i for i, j in v.pairs}
    if not v.named:
        out = []
        for j, i in sorted({p.dst: p.src for p in _pairing(v, dg).pairs}.items()):
            got = _copy(dg(i, j))
            if i != base[j]:  # not an exchange: the names differ, the order was a guess
                said = (f"paired with source layer '{v.src[i].name}' by its parameters (the files name and order "
                        f"the layers otherwise)")
                got.note = (f"{got.note}; {said}" if got.note else
                            f"{got.name}: computes the function of source layer '{v.src[i].name}' (paired by its "
                            f"parameters: the files name and order the layers otherwise)"
                            if got.verdict == "ok" else f"{got.name}: {said}")
            out.append(got)
        return out
    out = []
    for j in range(len(v.dst)):
        i = base[j]
        got = _copy(dg(i, j))
        if got.verdict == "unexplained":
            alts = [dg(i2, j) for i2, other in enumerate(v.src)
                    if i2 != i and _structure(fold_forget_bias(other)) == _structure(v.dst[j])]
            alts = [a for a in alts if a.verdict in ("ok", "slip") and len(_kinds(a)) < MAX_KINDS]
            if alts:
                alt = _copy(min(alts, key=_cost))
                other = v.src[alt.src_index]
                alt.slips.insert(0, Slip(v.dst[j].name, None, None, None, "layers_exchanged", other.name,
                                         v.src[i].name,
                                         f"{v.dst[j].name}: holds the parameters of source layer '{other.name}' "
                                         f"where '{v.src[i].name}' belongs: layers exchanged"))
                # the other layer's slipped (or plain) function reproduces DST's; the layer's own source
                # comparison is kept where it could run (not where the shapes differ)
                if alt.verdict == "ok":
                    alt.errors["slipped"] = alt.errors.pop("source")
                else:
                    alt.errors.pop("source", None)
                if "source" in got.errors:
                    alt.errors["source"] = got.errors["source"]
                alt.verdict = "slip"
                got = alt
        out.append(got)
    return out


def _pairing(v: View, dg) -> P.Pairing:
    """The view's pairing (:func:`view`), and where it is not all by name, by parameters too (``dg(i, j)``: the
    diagnosis of DST view layer ``j`` against source view layer ``i``; :func:`_cost` of it)."""
    if v.named:
        return v.pairing
    return P.pair(v.src, v.dst, cost=lambda i, j: _cost(dg(i, j)))


def pair_checkpoints(src: Checkpoint, dst: Checkpoint, seed: int = 0) -> P.Pairing | None:
    """How ``diagnose`` pairs the layers of ``src`` and ``dst`` (:func:`view`, then by parameters: the pairing
    rule of :mod:`rnnconvert.verify.pairing`), for ``verify`` and ``--fix``'s verification to pair the same way;
    ``None`` where the files' layers are compared as one-layer pieces (stacked otherwise). Eager checkpoints.

    Raises:
        ValueError: see :func:`view`."""
    v = view(src, dst)
    if v.split:
        return None
    memo: dict = {}

    def dg(i: int, j: int) -> LayerDiagnosis:
        if (i, j) not in memo:
            memo[(i, j)] = diagnose_layer(v.dst_at[j][0], v.src[i], v.dst[j], dst.format, seed, v.dst_at[j][1])
        return memo[(i, j)]

    got = _pairing(v, dg)
    return P.Pairing(got.pairs, [l.name for l in src.layers], [l.name for l in dst.layers])


def fixed_checkpoint(src: Checkpoint, dst: Checkpoint, found: list[LayerDiagnosis]) -> Checkpoint:
    """DST with every slip undone (module docstring): each slipped layer's tensors put back through the inverse
    of its recipes, at the source slots they came from, with the source's semantics (forget bias folded) and
    DST's name; a layer holding another source layer's parameters (layers exchanged) goes where that layer
    belongs. The other tensors of DST as they are. Where DST's layer names are not the source's (paired by
    position, shape or parameters: :mod:`rnnconvert.verify.pairing`), each fixed layer keeps DST's name and
    place (the fixed file is a drop-in for the user's code; its verification pairs the same way,
    :func:`pair_checkpoints`); where the layers were compared as one-layer pieces (:func:`view`: the files
    stack them otherwise), the result has the source's layers (names, stacking), each built from the fixed pieces.

    Raises:
        ValueError: a layer is unexplained (nothing to fix), or the fix does not give back the source's
            parameters (an internal check)."""
    v = view(src, dst)
    layers = list(dst.layers)
    pos = {i: j for i, j in v.pairs}  # source index -> DST position
    pieces: dict[int, list] = {}
    for j, ld in enumerate(found):
        if ld.verdict == "unexplained":
            raise ValueError(f"layer '{ld.name}' is not explained by a known slip; nothing to fix")
        if ld.verdict != "slip":
            if v.split:
                pieces[ld.src_index] = v.dst[j].params[0]
            continue
        s_layer = v.src[ld.src_index]
        e_layer, fb = fold_forget_bias(s_layer), e_layer_fb(s_layer)
        d_layer = v.dst[j]
        params = [[None] * e_layer.num_directions for _ in range(e_layer.num_layers)]
        for (k, d), ((k2, d2), rec) in ld.plan.items():
            ep, dp = e_layer.params[k2][d2], d_layer.params[k][d]
            # a tensor without a recipe belongs to a layer computing the source's function already (an exchanged
            # layer written differently): the source's tensor
            params[k2][d2] = replace(ep, **{t: np.array(getattr(ep, t)) if rec[t] is None else
                                            _invert(rec[t], t, getattr(dp, t), ep, e_layer.cell, fb,
                                                    e_layer.hidden_size) for t in S.TENSORS})
            for t in S.TENSORS:
                if not S.same(getattr(params[k2][d2], t), getattr(ep, t), exact=False):
                    raise ValueError(f"layer '{ld.name}': undoing the slips did not give back the source's {t}")
        if v.split:
            pieces[ld.src_index] = params[0]
            continue
        if not v.named:  # paired by position, shape or parameters: DST's (the user's) name and place
            layers[j] = replace(d_layer, name=dst.layers[j].name, semantics=e_layer.semantics, params=params,
                                source=dst.layers[j].source)
            continue
        target = pos.get(ld.src_index, j)
        name = dst.layers[target].name
        layers[target] = replace(d_layer, name=name, semantics=e_layer.semantics, params=params,
                                 source=dst.layers[target].source)
    if v.split:
        layers = []
        for i, l in enumerate(src.layers):
            idx = [x for x, o in enumerate(v.owner) if o == i]
            if any(x not in pieces for x in idx):
                raise ValueError(f"source layer '{l.name}': not every stacked layer was found in DST")
            layers.append(replace(fold_forget_bias(l), params=[pieces[x] for x in idx]))
    return replace(dst, layers=layers, slabs=None)


def _short(s: Slip) -> str:
    """A slip's kind in a few words: ``z<->r`` for two exchanged gate blocks, ``gate order z,r,n``..."""
    if s.kind == "gate_order":
        moved = [(a, b) for a, b in zip(s.frm, s.to) if a != b]
        return f"{moved[0][0]}<->{moved[0][1]}" if len(moved) == 2 else f"gate order {','.join(s.frm)}"
    if s.kind in S.SEMANTIC:
        return f"{s.kind} {s.frm} (source: {s.to})"
    return s.kind.replace("_", " ")


def groups(layers: list[LayerDiagnosis]) -> list[dict[str, Any]]:
    """The slips of ``layers`` grouped by what was slipped (kind, ``from``, ``to``), in order of first
    appearance: per group ``{"kind", "short" (``'z<->r'``...), "count", "layers" (DST names), "example" (the
    first slip's message), "what" (the message's part after the tensor's name where all of a group's messages
    share it, else the example)}``. The console's grouped lines (``rnnconvert diagnose``; ``-v`` lists each)."""
    out: dict[tuple, dict[str, Any]] = {}
    for ld in layers:
        if ld.verdict != "slip":
            continue
        for s in ld.slips:
            key = (s.kind, str(s.frm), str(s.to))
            g = out.setdefault(key, {"kind": s.kind, "short": _short(s), "count": 0, "layers": [],
                                     "example": s.message, "tails": set()})
            g["count"] += 1
            if ld.name not in g["layers"]:
                g["layers"].append(ld.name)
            tail = s.message.split(": ", 1)[-1]
            g["tails"].add(tail.split(" ", 1)[1] if s.tensor in S.TENSORS and " " in tail else tail)
    got = []
    for g in out.values():
        tails = g.pop("tails")
        g["what"] = next(iter(tails)) if len(tails) == 1 else g["example"]
        got.append(g)
    return got
