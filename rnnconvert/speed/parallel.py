"""Verification's products on every core given (``--threads``/``-j``, issue #33).

One process-wide pool of worker threads (:func:`pool`) shares the row blocks of one large matrix between the
cores: :func:`split` (through :func:`row_chunks`) cuts ``M`` rows into contiguous pieces on block boundaries, :func:`run`
hands all but the first to the pool and runs the first in the calling thread (numpy's casts and BLAS products release
the GIL), each piece writing its own rows of the result.
Row-split products are the same products as one thread's, block for block (the block boundaries do not move):
the results are bit-identical to a single thread's (``tests/performance/test_parallel.py``); the sums of
:func:`rnnconvert.speed.kernels.left_products` are split by output columns for the same reason.

How many threads: :func:`set_threads` (the CLI's ``--threads``, the API's ``threads=``), else the environment
variable ``RNNCONVERT_THREADS``, else the cores this process may run on (``os.sched_getaffinity``: a
``taskset -c 0,1`` run gets 2), at most :data:`DEFAULT_MAX` (measured best). With one thread, or under the plain fallback (``RNNCONVERT_SPEED=plain``), or
for a matrix below :data:`MIN_BYTES`, everything runs in the calling thread as before. A piece is never split
again inside a worker (no nested waits: a worker that waited on the pool could wait on itself).

Where it helps, measured (docs/performance.md, session 12, the 3.1 GB benchmark on a 16-core machine): 4 threads
cut a verified conversion from 12.15 s to 9.59 s; 16 threads took 13.07 s (the pieces of a few-column product
then wait on each other and on BLAS's own locks), and so did letting BLAS thread each product itself (16 BLAS
threads: 13.76 s, 4: 10.35 s). On 2 cores the conversion's own threads already use the second core (pinned to
2 cores: 12.25 s with 1 thread, 12.30 s with 2).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import backend

#: the environment variable read when :func:`set_threads` was not called
VARIABLE = "RNNCONVERT_THREADS"
#: matrices below this many bytes are not split (a piece's start-up costs more than its share of the work)
MIN_BYTES = 8 << 20

#: the default's ceiling: verified conversions of the 3.1 GB benchmark on the 16-core H200 machine (issue #33,
#: docs/performance.md session 12, ``bench/device_sweep.py``) took 12.15 s with 1 thread, 11.22 s with 2, 9.59 s
#: with 4 and 13.07 s with 16 (the products are small enough that more threads wait on each other and on BLAS)
DEFAULT_MAX = 4

_lock = threading.Lock()
_state: dict = {"threads": None, "pool": None, "size": 0}
_local = threading.local()


def available() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where that is missing)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def set_threads(n: int | None) -> None:
    """Use ``n`` threads (``None``: the default, module docstring). Raises ValueError for ``n < 1``."""
    if n is not None and int(n) < 1:
        raise ValueError(f"threads must be at least 1, not {n}")
    with _lock:
        _state["threads"] = None if n is None else int(n)


def threads() -> int:
    """The number of threads the parallel paths use (module docstring); 1 under the plain fallback."""
    if backend.plain():
        return 1
    n = _state["threads"]
    if n is None:
        from ..process import settings

        n = settings.value(VARIABLE) or min(DEFAULT_MAX, available())
    return max(1, n)


def pool() -> ThreadPoolExecutor | None:
    """The shared pool for :func:`threads` workers (made at the first call, remade when the count changes);
    ``None`` with one thread."""
    n = threads()
    if n <= 1:
        return None
    with _lock:
        if _state["pool"] is None or _state["size"] != n:
            old = _state["pool"]
            _state["pool"] = ThreadPoolExecutor(n, thread_name_prefix="rnnconvert-pool", initializer=_mark)
            _state["size"] = n
            if old is not None:
                old.shutdown(wait=False)
        return _state["pool"]


def _mark() -> None:
    _local.worker = True


def row_chunks(m: int, rows: int, parts: int) -> list[tuple[int, int]]:
    """``m`` rows cut into at most ``parts`` contiguous ``(lo, hi)`` pieces whose starts are multiples of
    ``rows`` (so that each piece's blocks are the blocks one pass would make)."""
    blocks = -(-m // max(1, rows))
    parts = max(1, min(parts, blocks))
    per = -(-blocks // parts)
    return [(b * rows, min(m, (b + per) * rows)) for b in range(0, blocks, per)]


def split(m: int, rows: int, nbytes: int) -> list[tuple[int, int]]:
    """The pieces to run for a matrix of ``m`` rows and ``nbytes`` bytes: one piece (the whole)
    when it is small, there is one thread, or the caller is itself a pool worker."""
    if nbytes < MIN_BYTES or getattr(_local, "worker", False):  # first: the per-step products of a long
        return [(0, m)]  # sequence are small, and threads() reads the environment and the affinity each call
    n = threads()
    if n <= 1:
        return [(0, m)]
    return row_chunks(m, rows, n)


def run(piece, pieces: list[tuple[int, int]]) -> None:
    """``piece(lo, hi)`` for every ``(lo, hi)`` of ``pieces`` (from :func:`split`): every piece but the first on
    the pool (:func:`start`), the first in the calling thread, then :func:`wait` for the rest; the first error
    of any piece is raised after all of them ended. ``piece`` is the caller's own callable: this module runs
    it and calls nothing else of the caller."""
    rest = start(piece, pieces)
    piece(*pieces[0])
    wait(rest)


def start(fn, pieces: list[tuple[int, int]]) -> list:
    """Every piece but the first handed to the pool (``fn(lo, hi)``, called by the pool's threads), the
    futures returned; :func:`run` runs the first itself, then :func:`wait` for the rest."""
    if len(pieces) <= 1:
        return []
    ex = pool()
    if ex is None:
        raise RuntimeError("several pieces with one thread: split() gives one piece then")
    return [ex.submit(fn, lo, hi) for lo, hi in pieces[1:]]


def wait(futures: list) -> None:
    """Wait for every future of :func:`start`; the first error is raised after all of them ended."""
    errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e

class using:
    """``with using(n):`` :func:`set_threads` ``(n)`` for the block, the previous setting restored after;
    ``n`` ``None`` leaves the setting as it is (the API's ``threads=`` argument)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.before = n, None

    def __enter__(self) -> "using":
        self.before = _state["threads"]
        if self.n is not None:
            set_threads(self.n)
        return self

    def __exit__(self, *exc) -> None:
        if self.n is not None:
            set_threads(self.before)
