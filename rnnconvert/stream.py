"""Iterating over the slabs of a checkpoint, optionally reading the next one while the caller works.

A *slab* is stacked layer ``k`` of ``ckpt.layers[i]`` with all its directions: the unit streaming
conversion holds in memory (:meth:`rnnconvert.model.Checkpoint.slab`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from .model import Checkpoint, DirectionParams


def slab_bytes(dirs: list[DirectionParams]) -> int:
    """Parameter bytes of one slab (placeholders count at their declared size)."""
    return sum(int(a.size) * a.dtype.itemsize for dp in dirs for a in dp.arrays().values())


def order(ckpt: Checkpoint) -> list[tuple[int, int]]:
    """Every ``(i, k)`` in write order: layers in source order, stacked layers bottom-up."""
    return [(i, k) for i, layer in enumerate(ckpt.layers) for k in range(layer.num_layers)]


def slabs(ckpt: Checkpoint, *, prefetch: bool = False) -> Iterator[tuple[int, int, list[DirectionParams]]]:
    """Yield ``(i, k, dirs)`` for every slab in :func:`order`.

    With ``prefetch``, slab ``n + 1`` is read in a background thread while the caller handles slab ``n``
    (reading -- HDF5, the Keras kernel turn, file pages -- overlaps writing and verification; numpy,
    h5py and file I/O release the GIL for the bulk of their work). Two slabs are then alive at once,
    so streamed targets, whose memory goal is one slab, do not prefetch. Exceptions of a read are
    raised where that slab would have been yielded.
    """
    todo = order(ckpt)
    if not prefetch or len(todo) < 2:
        for i, k in todo:
            yield i, k, ckpt.slab(i, k)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rnnconvert-read") as pool:
        nxt = pool.submit(ckpt.slab, *todo[0])
        for n, (i, k) in enumerate(todo):
            dirs = nxt.result()
            nxt = pool.submit(ckpt.slab, *todo[n + 1]) if n + 1 < len(todo) else None
            try:
                yield i, k, dirs
            except GeneratorExit:
                if nxt is not None:
                    nxt.cancel()
                raise
            del dirs
