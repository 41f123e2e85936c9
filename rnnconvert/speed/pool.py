"""Reusing the arrays of released slabs (lazy readers that build canonical arrays).

A lazy reader that turns a file's tensors into fresh canonical arrays (Keras HDF5, TF2 object checkpoints:
``interpreter.convert_direction``) pays for fresh pages on every slab: the kernel zeroes each page before
the reader writes it (``clear_page``: 20% of the CPU of a ``--no-verify`` ``h5 -> pt`` conversion of the
issue #18 3 GB model, ``perf``, docs/performance.md session 7). :class:`ArrayPool` hands the next slab the
arrays of a released one instead, when nothing else holds them.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

#: slabs whose lent arrays are remembered; older ones are forgotten (so that a slab read but never released,
#: e.g. by a whole-checkpoint read, is not kept alive by the pool)
REMEMBERED = 3


class ArrayPool:
    """``take(slab, shape, dtype)``: an uninitialised array (``np.empty``), or one given back by an earlier
    slab's :meth:`give_back` of the same shape and dtype. :meth:`give_back(slab) <give_back>` (the reader's
    ``release``) keeps those of the slab's arrays that nothing else references any more (reference count:
    no view, no holder anywhere), for the next ``take``; at most one slab's arrays are kept free. Safe under
    threads (one lock); an array still referenced anywhere is never reused."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[tuple, list[np.ndarray]] = {}
        self.lent: dict = {}  # slab -> arrays handed out for it (insertion order: oldest first)

    def take(self, slab, shape: tuple, dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        with self.lock:
            got = self.free.get(key)
            a = got.pop() if got else None
        if a is None:
            a = np.empty(key[0], key[1])
        with self.lock:
            self.lent.setdefault(slab, []).append(a)
            while len(self.lent) > REMEMBERED:
                self.lent.pop(next(iter(self.lent)))
        return a

    def give_back(self, slab) -> None:
        with self.lock:
            arrs = self.lent.pop(slab, [])
            # the references of an array nobody else holds: ``arrs``, the comprehension's name, getrefcount's argument
            unused = [a for a in arrs if sys.getrefcount(a) <= 3 and a.base is None]
            free: dict[tuple, list[np.ndarray]] = {}
            for a in unused:
                free.setdefault((a.shape, a.dtype.str), []).append(a)
            self.free = free
