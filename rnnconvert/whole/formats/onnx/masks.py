"""Any Keras mask exact at an ONNX recurrent node (issue #41): padding before, after or inside a sequence.

ONNX ``LSTM`` / ``GRU`` / ``RNN`` nodes take a mask only as ``sequence_lens`` (the node runs steps ``0 .. len-1``
of each sequence, ONNX operator spec), which is Keras' masked computation only when each sequence's padding is
at its end. The general form built here (the default, write option ``mask_layout='any'``) makes any mask such a
mask: each sequence's unmasked steps are moved to the front, in order (a stable permutation per row, made by
``ScatterElements`` on the ``(B, T)`` step indices), the node runs on them with ``sequence_lens`` = their count,
and each original step takes its output back; both moves are one ``Gather`` of the ``(B*T, F)`` rows (indices
``(B, T)``, never widened to the feature axis).

Keras' masked-step semantics (tf_keras 2.21 ``backend.rnn``: a masked step keeps the states and, unless
``zero_output_for_mask``, repeats the previous output, which is zero before the first unmasked step;
``Bidirectional`` sets ``zero_output_for_mask = return_sequences`` on both its layers, ``layers/rnn/
bidirectional.py``; a ``go_backwards`` layer reverses the input and the mask and returns its sequence in
processing order), with ``c[t]`` the count of unmasked steps up to and including ``t`` and ``n`` their total:

- a forward direction at step ``t`` outputs the compacted output ``c[t] - 1`` (zero where ``c[t] = 0``);
- a unidirectional ``go_backwards`` layer outputs, at original step ``t``, the compacted reverse output
  ``c[t] - mask[t]`` (the first unmasked step at or after ``t``; zero where there is none), then the sequence
  is reversed into processing order;
- a ``Bidirectional`` sequence: both directions at compacted ``c[t] - 1`` at an unmasked step (the reverse
  direction over the compacted steps is the backward layer over the unmasked steps), zero at a masked one;
- the last output (no ``return_sequences``) is the node's ``Y_h`` (the state after the last unmasked step in
  each direction), zero for a sequence with no unmasked step; ``return_state`` states are ``Y_h`` / ``Y_c``,
  the initial state for such a sequence (onnxruntime gives zeros at ``sequence_lens`` 0).

Checked against tf_keras' own outputs on pre-, post-, inner-padded and all-padded rows in
``tests/formats/whole_models/test_whole_masks.py`` (fixtures ``fixtures/gen_whole_masks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the write option's values: ``any`` (default, this module) or ``end`` (the mask as ``sequence_lens`` alone,
#: exact only when every sequence's padding is at its end; a smaller graph)
LAYOUTS = ("any", "end")


@dataclass
class Compaction:
    """The tensors of one mask, shared by every recurrent layer it reaches: ``mask`` bool ``(B, T)``,
    ``mi`` its int64 form, ``c`` the inclusive count of unmasked steps ``(B, T)`` int64, ``n`` their total
    ``(B, 1)`` int64, ``lens`` the same as ``sequence_lens`` int32 ``(B,)``, ``src`` int64 ``(B, T)`` the original
    step at each compacted place (unmasked steps first, in order; masked ones after them, in order), ``off`` int64
    ``(B, 1)`` each row's first index in the ``(B*T, F)`` rows (``b * T``)."""

    mask: str
    mi: str
    c: str
    n: str
    lens: str
    src: str
    off: str


def _i64(v) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


def compaction(g, mask: str, lens: str, made: dict, key: str) -> Compaction:
    """The :class:`Compaction` of bool mask ``mask`` ``(B, T)`` whose count of unmasked steps is ``lens`` (int32
    ``(B,)``), built once per ``key`` in ``made``."""
    k = key + ":compaction"
    if k in made:
        return made[k]
    tp = g.TP
    mi = g.op("Cast", [mask], "cmask", to=tp.INT64)
    c = g.op("CumSum", [mi, g.const(_i64(1), "ax")], "cmask")
    n = g.op("Unsqueeze", [g.op("Cast", [lens], "cmask", to=tp.INT64), g.const(_i64([1]), "ax")], "cmask")  # (B, 1)
    shape = g.op("Shape", [mask], "cmask")
    B = g.op("Gather", [shape, g.const(_i64(0), "zero")], "cmask")
    T = g.op("Gather", [shape, g.const(_i64(1), "one")], "cmask")
    t = g.op("Range", [g.const(_i64(0), "zero"), T, g.const(_i64(1), "one")], "cmask")  # (T,)
    # a masked step goes after the n unmasked ones, keeping its order: n + (t - c[t])
    after = g.op("Add", [n, g.op("Sub", [t, c], "cmask")], "cmask")
    dest = g.op("Where", [mask, g.op("Sub", [c, g.const(_i64(1), "one")], "cmask"), after], "cmask")
    # the inverse permutation: src[b, dest[b, t]] = t (dest is a permutation of each row: every place written)
    src = g.op("ScatterElements", [dest, dest, g.op("Expand", [t, shape], "cmask")], "cmask", axis=1)
    off = g.op("Mul", [g.op("Unsqueeze", [g.op("Range", [g.const(_i64(0), "zero"), B, g.const(_i64(1), "one")],
                                                "cmask"), g.const(_i64([1]), "ax")], "cmask"), T], "cmask")
    made[k] = Compaction(mask, mi, c, n, lens, src, off)
    return made[k]


def _take(g, x: str, idx: str, cp: Compaction, base: str) -> str:
    """``y[b, t] = x[b, idx[b, t]]`` for ``x`` ``(B, T, F)`` and ``idx`` ``(B, T)``: one ``Gather`` of the rows of
    ``x`` flattened to ``(B*T, F)``."""
    return g.op("Gather", [g.op("Flatten", [x], base, axis=2), g.op("Add", [idx, cp.off], base)], base, axis=0)


def compact(g, x: str, cp: Compaction, base: str) -> str:
    """``x`` ``(B, T, F)`` with each row's unmasked steps first, in order (masked ones after them)."""
    return _take(g, x, cp.src, cp, base)


def sequence(g, out: str, cp: Compaction, *, bidirectional: bool, go_backwards: bool, base: str) -> str:
    """The Keras output sequence ``(B, T, Dout)`` from the node's merged output ``out`` ``(B, T, Dout)`` over
    the compacted steps (module docstring); a ``go_backwards`` layer's in processing order."""
    one = g.const(_i64(1), "one")
    if go_backwards and not bidirectional:
        ex = g.op("Sub", [cp.c, cp.mi], base)  # unmasked steps before t = the first at or after t, compacted
        keep = g.op("Less", [ex, cp.n], base)
        idx = g.op("Min", [ex, g.op("Max", [g.op("Sub", [cp.n, one], base), g.const(_i64(0), "zero")], base)],
                   base)
    else:
        idx = g.op("Max", [g.op("Sub", [cp.c, one], base), g.const(_i64(0), "zero")], base)
        keep = cp.mask if bidirectional else g.op("Greater", [cp.c, g.const(_i64(0), "zero")], base)
    y = _take(g, out, idx, cp, base)
    y = g.op("Where", [g.op("Unsqueeze", [keep, g.const(_i64([2]), "ax")], base), y,
                       g.const(np.zeros((), np.float32), "zero")], base)
    if go_backwards and not bidirectional:  # processing order, as Keras returns a go_backwards layer's sequence
        y = g.op("Slice", [y, g.const(_i64([-1]), "s"), g.const(_i64([-(2 ** 63)]), "e"),
                           g.const(_i64([1]), "a"), g.const(_i64([-1]), "st")], base)
    return y


def seen(g, cp: Compaction, base: str) -> str:
    """bool ``(B, 1)``: the sequence has an unmasked step."""
    return g.op("Greater", [cp.n, g.const(_i64(0), "zero")], base)


def last(g, out: str, cp: Compaction, base: str) -> str:
    """The last output ``out`` ``(B, Dout)`` (from ``Y_h``), zero for a sequence with no unmasked step (tf_keras:
    the previous output starts at zero)."""
    return g.op("Where", [seen(g, cp, base), out, g.const(np.zeros((), np.float32), "zero")], base)


def state(g, st: str, initial: str | None, cp: Compaction, base: str) -> str:
    """A returned state ``st`` ``(B, H)``: the initial state (or zero) for a sequence with no unmasked step."""
    return g.op("Where", [seen(g, cp, base), st, initial or g.const(np.zeros((), np.float32), "zero")], base)
