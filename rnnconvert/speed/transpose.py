"""Fast, bit-exact turns of stored kernels into the canonical layout and back (:mod:`rnnconvert.core.gates` holds
the conventions and their plain implementation): a transposed copy made in cache-line tiles (:func:`contiguous`,
about 5x ``np.ascontiguousarray`` on multi-MB matrices, docs/performance.md), the whole-matrix turns with it
(:func:`to_canonical`, :func:`from_canonical`, :func:`reorder`: ``core.gates``'s with ``turn=contiguous``), and the
row-block turns of streamed reads and writes (:func:`to_canonical_block`, :func:`from_canonical_block`). Only
copies, transposes and block moves: the results equal the plain ones bit for bit (``tests/engine/test_core.py``).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import gates
from ..core.gates import Convention
from ..core.model import Cell
from . import backend

_PLAIN = backend.plain()


_TILE = 16  # rows per tile of the blocked transpose (16 float32 = one 64-byte cache line per output row)


#: Rows per tile of the one-pass :func:`to_canonical_block` when the block's row stride is not a multiple of 1 KiB
#: (the padded read buffer of ``interpreter._rows``): such rows do not share L1 cache sets, so longer tiles pay
#: (measured, docs/performance.md Session 3). Rows a multiple of 1 KiB apart (every large ``G*H``) use :data:`_TILE`.
_TILE_SPREAD = 64


def contiguous(m: np.ndarray) -> np.ndarray:
    """``m`` as a C-contiguous array: ``m`` itself when it already is, else a copy.

    A transposed 2-D view (the ``(in, G*H)`` -> ``(G*H, in)`` turn of every Keras/TF kernel) is copied in
    tiles of :data:`_TILE` source rows, so that each output row receives a full cache line per tile:
    about 5x faster than ``np.ascontiguousarray(m)`` on multi-MB matrices (docs/performance.md). Bit-exact.
    """
    if m.flags.c_contiguous:
        return m
    if _PLAIN:  # the plain fallback (speed/backend.py): numpy's own copy
        return np.ascontiguousarray(m)
    if m.ndim != 2 or not m.flags.f_contiguous or m.size < (1 << 16):
        return np.ascontiguousarray(m)
    out = np.empty(m.shape, m.dtype)
    src = m.T  # C-contiguous (cols, rows)
    for i in range(0, src.shape[0], _TILE):
        out[:, i:i + _TILE] = src[i:i + _TILE].T
    return out


def to_canonical_block(block: np.ndarray, conv: Convention, cell: Cell, out: np.ndarray, col: int) -> None:
    """Rows ``col : col + n`` of an ``in_out`` matrix stored under ``conv`` (``block``, ``(n, G*H)``) into
    columns ``col : col + n`` of the canonical ``out`` ``(G*H, in)``: :func:`rnnconvert.core.gates.to_canonical` one row block at
    a time, so that a multi-GB kernel is turned without a second full-size copy (streaming reads,
    docs/performance.md). Any strides work. Bit-exact.

    Two ways, the faster one measured per item size (docs/performance.md, Session 3): 2-byte items (float16)
    in one pass, each tile of block rows (:data:`_TILE`, or :data:`_TILE_SPREAD` when the rows do not share
    cache sets) transposed straight into the rows of ``out`` that its gate blocks go to (:func:`rnnconvert.core.gates.gate_moves`);
    wider items through a cache-sized temporary (the block turned with :func:`contiguous`), then whole gate
    blocks moved as ``4n``-byte (or wider) row pieces, which measured 5-15% faster than the one pass.

    Raises:
        ValueError: ``conv`` is not ``in_out``, or the block's width is not ``G*H`` of ``out``.
    """
    if conv.orientation != "in_out" or block.ndim != 2 or block.shape[1] != out.shape[0]:
        raise ValueError(f"block {block.shape} does not fit canonical {out.shape} ({conv.orientation})")
    n = block.shape[0]
    moves = gates.gate_moves(conv.gate_order, gates.CANONICAL[cell], out.shape[0] // len(conv.gate_order))
    if block.itemsize > 2:
        t = contiguous(block.T)  # (G*H, n) in the stored gate order
        for src, dst in moves:
            out[dst, col:col + n] = t[src]
        return
    if all(src == dst for src, dst in moves):  # stored in canonical order (Keras LSTM): one move per tile
        moves = [(slice(0, out.shape[0]), slice(0, out.shape[0]))]
    rows = _TILE if block.strides[0] % 1024 == 0 else _TILE_SPREAD
    for i in range(0, n, rows):
        tile = block[i:i + rows]
        cols = slice(col + i, col + i + tile.shape[0])
        for src, dst in moves:
            out[dst, cols] = tile[:, src].T


def from_canonical_block(mat: np.ndarray, conv: Convention, cell: Cell, r0: int, r1: int) -> np.ndarray:
    """Rows ``r0:r1`` of :func:`rnnconvert.core.gates.from_canonical` ``(mat)`` for an ``in_out`` convention, ``(r1 - r0, G*H)``
    C-contiguous, computed from columns ``r0:r1`` of the canonical ``mat`` only (streaming writes).
    Bit-exact.

    Raises:
        ValueError: ``conv`` is not ``in_out``.
    """
    if conv.orientation != "in_out":
        raise ValueError(f"from_canonical_block needs an in_out convention, not {conv.orientation}")
    t = np.empty((mat.shape[0], r1 - r0), mat.dtype)
    for dst, src in gates.gate_moves(conv.gate_order, gates.CANONICAL[cell], mat.shape[0] // len(conv.gate_order)):
        t[dst] = mat[src, r0:r1]
    return contiguous(t.T)


#: :func:`rnnconvert.core.gates.reorder`, :func:`~rnnconvert.core.gates.to_canonical` and
#: :func:`~rnnconvert.core.gates.from_canonical` with the tiled transpose
reorder = partial(gates.reorder, turn=contiguous)
to_canonical = partial(gates.to_canonical, turn=contiguous)
from_canonical = partial(gates.from_canonical, turn=contiguous)
