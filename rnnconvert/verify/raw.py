"""The source file's own tensors as verification's source side reads them (``layer.source['raw']``): plain dicts,
or mappings that re-read each tensor from the file on access (:class:`OnAccess`), handed to the source's
equations (:class:`rnnconvert.engine.protocol.Runtime` ``source_forward(..., raw=...)``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core.model import RNNLayer


class OnAccess(Mapping):
    """A direction's stored tensors read from the file at each access (``LazyRaw.read``): large plain tensors
    as read-only memory maps, unmapped as soon as the equations drop them, so that the source side holds
    one tensor's mapped pages at a time, not a layer's (they count in the process's memory: the 3 GB
    benchmark's source side mapped 384 MB per layer, and the pool kept the last layer's mapped until the next
    one). Other tensors are read into ``pool``'s arrays of the same shape (no fresh multi-MB allocations)."""

    def __init__(self, raw, pool: dict | None, d: int) -> None:
        self.raw, self.pool, self.d = raw, pool, d

    def __getitem__(self, key: str) -> np.ndarray:
        got = self.raw.read(key, None if self.pool is None else self.pool.get((self.d, key)))
        if self.pool is not None and got.flags.writeable:  # a buffer to read into next time, not a map
            self.pool[self.d, key] = got
        return got

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def raw_tensors(layer: RNNLayer, pool: dict | None = None) -> list:
    """``layer.source['raw']`` as mappings, one per direction (or TF1 pseudo-layer), for one pass of the
    source side (``source_forward(..., raw=...)``): lazily re-read tensors (Keras HDF5 / TF2
    :class:`~rnnconvert.formats.keras.h5_access.LazyRaw`) are read from the file at each access
    (:class:`OnAccess`; with a ``pool``, a dict the caller keeps across layers, into the previous layer's
    arrays of the same shape), in-memory ones are plain dicts. ``layer`` is not changed."""
    return [OnAccess(r, pool, d) if hasattr(r, "read") else dict(r) for d, r in enumerate(layer.source["raw"])]
