"""The one rule that pairs a file's recurrent layers with another file's (issue #42): ``diagnose``, its
``--fix`` and ``verify`` all pair through :func:`pair` (docs/diagnose.md "Pairing").

1. **By name** where DST names a layer as SRC does.
2. **By position** among the layers left (both files' order), where the layers left agree in shape position by
   position (cell, input and hidden size, stacking, directions, projection: :func:`shape`) -- or where no other
   pairing by shape exists.
3. **By shape** where the position pairs layers of other shapes and taking, for each DST layer in order, the
   first SRC layer left of its shape pairs them all (a ``Seq2Seq`` that registers its decoder first).
4. **By parameters**, when the caller gives ``cost(i, j)`` (``diagnose``'s smallest explanation,
   :func:`rnnconvert.verify.diagnose.pair_checkpoints`): the layers that step 2 or 3 pairs with a layer whose
   function they do not compute are paired among themselves in the way that claims least in all (ties: the most
   kept in place; up to :data:`MAX_REPAIR` layers).

Every pair not made by name is said (:meth:`Pairing.lines`): a person sees how the files were matched.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..core.model import Checkpoint, RNNLayer

#: the most DST layers whose pairing by parameters is searched (every permutation of them)
MAX_REPAIR = 6


def shape(layer: RNNLayer) -> tuple:
    """What two layers must share to be compared: ``(cell, input_size, hidden_size, num_layers,
    bidirectional, proj_size)`` (:class:`rnnconvert.core.model.RNNLayer`)."""
    return (layer.cell, layer.input_size, layer.hidden_size, layer.num_layers, layer.bidirectional, layer.proj_size)


@dataclass(frozen=True)
class Pair:
    """SRC layer ``src`` (index) compared with DST layer ``dst`` (index), paired ``how``: ``'name'``,
    ``'position'``, ``'shape'`` or ``'parameters'``."""

    src: int
    dst: int
    how: str


@dataclass
class Pairing:
    """The pairs, in DST's order, and both files' layer names (``src_names``, ``dst_names``, in file order)."""

    pairs: list[Pair]
    src_names: list[str] = field(default_factory=list)
    dst_names: list[str] = field(default_factory=list)

    @property
    def named(self) -> bool:
        """Whether every pair is by name (nothing to say, nothing to rename)."""
        return all(p.how == "name" for p in self.pairs)

    def tuples(self) -> list[tuple[int, int]]:
        """``(source index, DST index)`` per pair."""
        return [(p.src, p.dst) for p in self.pairs]

    def names(self) -> dict[str, str]:
        """``{source layer name: DST layer name}``."""
        return {self.src_names[p.src]: self.dst_names[p.dst] for p in self.pairs}

    def lines(self) -> list[str]:
        """One line per pair not made by name: ``DST layer 'encoder' paired with source layer 'bidirectional' by
        position``; empty when every pair is by name."""
        words = {"position": "by position", "shape": "by shape (the first source layer of its shape left)",
                 "parameters": "by its parameters (it computes that layer's function, or its slips explain it)"}
        return [f"DST layer '{self.dst_names[p.dst]}' paired with source layer '{self.src_names[p.src]}' "
                f"{words[p.how]}" for p in self.pairs if p.how != "name"]

    def summary(self) -> str:
        """One line: how the layers were paired (``''`` when all by name)."""
        if self.named:
            return ""
        hows = sorted({p.how for p in self.pairs if p.how != "name"})
        return (f"layers paired by {' and '.join(hows)} (the names differ): "
                + ", ".join(f"{self.src_names[p.src]} -> {self.dst_names[p.dst]}" for p in self.pairs
                            if p.how != "name"))

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": [{"source": self.src_names[p.src], "dst": self.dst_names[p.dst], "how": p.how}
                          for p in self.pairs], "named": self.named}


def pair(src: Sequence[RNNLayer], dst: Sequence[RNNLayer],
         cost: Callable[[int, int], tuple] | None = None) -> Pairing:
    """The pairing of ``dst``'s layers with ``src``'s (module docstring). ``cost(i, j)``: how much the
    explanation of DST layer ``j`` by SRC layer ``i`` claims (``(0, 0)``: it computes that layer's function;
    compared as tuples), or ``None`` for no pairing by parameters.

    Raises:
        ValueError: some DST layer is not named as a source layer and the layers left after the names differ in
            number (one line naming both files' layers)."""
    s_names, d_names = [l.name for l in src], [l.name for l in dst]
    out: dict[int, Pair] = {}
    used: set[int] = set()
    if len(set(d_names)) == len(d_names):
        for j, n in enumerate(d_names):
            if n in s_names and s_names.index(n) not in used:
                out[j] = Pair(s_names.index(n), j, "name")
                used.add(s_names.index(n))
    s_left = [i for i in range(len(src)) if i not in used]
    d_left = [j for j in range(len(dst)) if j not in out]
    if d_left and len(s_left) != len(d_left):  # (every DST layer named as a source layer: a part of SRC)
        raise ValueError(f"SRC holds {len(src)} recurrent layers ({', '.join(s_names)}) and DST {len(dst)} "
                         f"({', '.join(d_names)}), with other names")
    how = "position"
    chosen = list(zip(s_left, d_left))
    if any(shape(src[i]) != shape(dst[j]) for i, j in chosen):
        free, by_shape = list(s_left), []
        for j in d_left:
            i = next((i for i in free if shape(src[i]) == shape(dst[j])), None)
            if i is None:
                break
            free.remove(i)
            by_shape.append((i, j))
        if len(by_shape) == len(d_left):
            chosen, how = by_shape, "shape"
    for i, j in chosen:
        out[j] = Pair(i, j, how)
    if cost is not None:
        _by_parameters(out, src, dst, cost)
    return Pairing([out[j] for j in sorted(out)], s_names, d_names)


def _by_parameters(out: dict[int, Pair], src, dst, cost) -> None:
    """Re-pair (in place) the DST layers that a pair not by name leaves not computing their source layer's
    function, among those source layers, in the way whose explanations claim least in all (``cost`` summed;
    ties: the most layers kept in place). A pair of other shapes costs the most."""
    worst = (1000, 0)
    bad = [j for j in sorted(out) if out[j].how != "name" and tuple(cost(out[j].src, j)) != (0, 0)]
    if len(bad) < 2 or len(bad) > MAX_REPAIR:
        return
    pool = [out[j].src for j in bad]
    best = None
    for perm in itertools.permutations(pool):
        total = [0, 0, 0]
        for j, i in zip(bad, perm):
            c = worst if shape(src[i]) != shape(dst[j]) else tuple(cost(i, j))
            total[0] += c[0]
            total[1] += c[1]
            total[2] += i != out[j].src
        if best is None or tuple(total) < best[0]:
            best = (tuple(total), perm)
    for j, i in zip(bad, best[1]):
        if i != out[j].src:
            out[j] = Pair(i, j, "parameters")


class RenamedTarget:
    """A verification target (:class:`rnnconvert.verify.target.Target` or another with its attributes) whose
    file names its layers otherwise: verification asks for SRC's layer names, this one runs DST's paired layers
    (``names``: ``{source layer name: DST layer name}``, :meth:`Pairing.names`). Each operation gets the
    checkpoint with its layers renamed to DST's names (a runtime finds the file's tensors or graph nodes by the
    layer's name); ``read`` gives DST's layers back under the source's names. Everything else is the target's."""

    def __init__(self, target, names: dict[str, str]) -> None:
        from .target import as_target

        self._t = as_target(target)
        self._names = dict(names)
        self._back = {v: k for k, v in self._names.items()}
        self._renamed: dict[int, tuple[Checkpoint, Checkpoint]] = {}
        for op in ("target_forward", "target_forward_slab", "target_step", "target_slab_check", "target_forward_wired"):
            fn = getattr(self._t, op, None)
            setattr(self, op, None if fn is None else self._wrap(fn))
        read = getattr(self._t, "read", None)
        self.read = None if read is None else (lambda path: self._named_back(read(path)))

    def _ckpt(self, ckpt: Checkpoint) -> Checkpoint:
        got = self._renamed.get(id(ckpt))
        if got is None or got[0] is not ckpt:
            got = (ckpt, replace(ckpt, layers=[replace(l, name=self._names.get(l.name, l.name)) for l in ckpt.layers]))
            self._renamed[id(ckpt)] = got
        return got[1]

    def _named_back(self, ckpt: Checkpoint) -> Checkpoint:
        return replace(ckpt, layers=[replace(l, name=self._back.get(l.name, l.name)) for l in ckpt.layers])

    def _wrap(self, fn):
        def op(path, ckpt, name, *rest):
            return fn(path, self._ckpt(ckpt), self._names.get(name, name), *rest)
        op.__name__ = getattr(fn, "__name__", "op")
        return op

    def __getattr__(self, key: str):
        return getattr(self._t, key)
