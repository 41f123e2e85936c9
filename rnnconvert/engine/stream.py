"""Iterating over the slabs of a checkpoint.

A *slab* is stacked layer ``k`` of ``ckpt.layers[i]`` with all its directions: the unit streaming
conversion holds in memory (:meth:`rnnconvert.core.model.Checkpoint.slab`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..core.model import Checkpoint, DirectionParams


def slab_bytes(dirs: list[DirectionParams]) -> int:
    """Parameter bytes of one slab (placeholders count at their declared size)."""
    return sum(int(a.size) * a.dtype.itemsize for dp in dirs for a in dp.arrays().values())


def order(ckpt: Checkpoint) -> list[tuple[int, int]]:
    """Every ``(i, k)`` in write order: layers in source order, stacked layers bottom-up."""
    return [(i, k) for i, layer in enumerate(ckpt.layers) for k in range(layer.num_layers)]


def slabs(ckpt: Checkpoint) -> Iterator[tuple[int, int, list[DirectionParams]]]:
    """Yield ``(i, k, dirs)`` for every slab in :func:`order`, each read when it is reached and released
    (``ckpt.release``, e.g. the pages of a memory-mapped source) once the caller asks for the next one.
    The generator keeps no reference to a slab: the caller's is the only one.

    (Reading slab ``n + 1`` in a background thread while slab ``n`` is written was measured on the
    benchmark ``h5 -> pt`` conversion: 9.7 s against 7.5 s sequential, medians of 4 cold runs; so slabs are
    read one after the other.)
    """
    for i, k in order(ckpt):
        yield i, k, ckpt.slab(i, k)
        if ckpt.release is not None:
            ckpt.release(i, k)
