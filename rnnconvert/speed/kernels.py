"""The fast products of the equations (:mod:`rnnconvert.core.reference`) and the source equations
(:mod:`rnnconvert.verify.keras_equations`) as verification runs them: each weight matrix read from memory once for
all the dtypes of a lockstep run, row block by row block through reused cast buffers, float16 widened to float32
with torch's vectorised copy when torch is loaded, one reused scratch buffer per thread. Exact casts; each product
equals ``w.astype(dt) @ v`` up to the order of BLAS's sums (docs/performance.md, sessions 4-8).

:data:`FAST` is the kernels object verification hands :mod:`rnnconvert.core.reference`
(``kernels=``: ``products``, ``widened``); the reference's own default (:data:`rnnconvert.core.reference.PLAIN`)
is plain numpy, which the suite compares these with (``tests/verify/test_reference_passes.py``).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from ..core import reference
from . import backend, gpu, parallel
from ..process import settings


class Blocks:
    """Row blocks ``w[i:i+rows]`` of a weight matrix in each dtype a product asks for, through buffers reused
    from block to block (no full-size cast copy): float16 is widened to float32 once per block (numpy's
    float16 casts are slow), other dtypes cast from the block or from that float32 copy. Exact casts
    (float16 -> float32 -> float64)."""

    def __init__(self, w: np.ndarray, rows: int) -> None:
        self.w, self.rows, self.bufs = w, rows, {}

    def __iter__(self):
        w, rows = self.w, self.rows
        for i in range(0, w.shape[0], rows):
            yield i, self._in(w[i:i + rows])

    def _cast(self, blk: np.ndarray, dt: np.dtype) -> np.ndarray:
        """``blk`` in ``dt``, in this dtype's reused buffer."""
        buf = self.bufs.get(dt)
        if buf is None:
            buf = self.bufs[dt] = np.empty((min(self.rows, self.w.shape[0]), self.w.shape[1]), dt)
        b = buf[:blk.shape[0]]
        if blk.dtype == np.float16 and dt == np.float32:
            return widen_into(b, np.ascontiguousarray(blk))
        b[...] = blk
        return b

    def _in(self, blk: np.ndarray):
        """``get(dt)``: this block in ``dt`` (each cast made once per block). ``get`` holds no reference to
        itself: no reference cycle keeps the block (a view of ``w``) alive after the loop, so ``w`` is
        freed as soon as its owner lets it go (a lazy reader reuses a released slab's arrays only then:
        :class:`rnnconvert.speed.pool.ArrayPool`)."""
        got = {blk.dtype: blk}
        f32 = np.dtype(np.float32)

        def get(dt) -> np.ndarray:
            dt = np.dtype(dt)
            if dt not in got:
                base = blk
                if blk.dtype.itemsize < 4 and dt != f32:
                    if f32 not in got:
                        got[f32] = self._cast(blk, f32)
                    base = got[f32]
                got[dt] = self._cast(base, dt)
            return got[dt]
        return get


#: bytes of one float64 block of rows in :func:`products`, :func:`abs_products`, :func:`_lin` (:func:`block_rows`):
#: 1 MiB stays in cache between a block's cast and its product. With 256 rows of a ``K = 2048`` matrix
#: (4 MiB) a float32+float64 pass over an ``(8192, 2048)`` ``W_hh`` with 3 columns took ~1 s of wall time on
#: the 2-core test machine against ~0.1 s with 64 rows (docs/performance.md, "one-step verification cost").
BLOCK_BYTES = settings.lenient("RNNCONVERT_BLOCK_BYTES") or 1 << 20  # env: a benchmark's knob


def block_rows(w: np.ndarray) -> int:
    """Rows per block for ``w`` ``(M, K)``: :data:`BLOCK_BYTES` of float64, at least 64 (small matrices: one
    or a few blocks, so that Python's per-block overhead stays small on long sequences)."""
    return max(64, BLOCK_BYTES // (8 * max(1, w.shape[1])))


def products(w: np.ndarray, vs: list[np.ndarray], rows: int | None = None) -> list[np.ndarray]:
    """``[w @ v for v in vs]``, each computed in ``v``'s dtype, reading ``w`` from memory once for all of them.

    ``w`` ``(M, K)`` (float16, float32 or float64) is taken ``rows`` rows at a time and cast, while still in
    cache, into reused buffers for the dtypes of ``vs`` (:class:`Blocks`). The products stay ``(W @ v)``
    with ``v`` of a few columns: W keeps its row-major form and BLAS streams it without packing (3-4x
    faster than ``v.T @ W.T`` on multi-MB matrices). A product of a few columns is bound by reading
    ``w``; products in several dtypes share that read (one ``(8192, 2048)`` float32 matrix and 3 columns:
    17 ms of CPU for float64 and float32 together against 23 ms as two passes, docs/performance.md
    session 4; block size: :func:`block_rows`). Each result is the same as ``w.astype(dt) @ v`` up to the order of BLAS's sums.
    """
    if gpu.active():
        return gpu.products(w, vs)
    rows = rows or block_rows(w)
    outs = [np.empty((w.shape[0], v.shape[1]), v.dtype) for v in vs]

    def piece(lo: int, hi: int) -> None:  # rows lo:hi, in the blocks one pass would make (speed/parallel.py)
        for i, get in Blocks(w[lo:hi], rows):
            for v, o in zip(vs, outs):
                o[lo + i:lo + i + rows] = get(v.dtype) @ v
    parallel.run(piece, parallel.split(w.shape[0], rows, w.nbytes))
    return outs


def left_products(xs: list[np.ndarray], w: np.ndarray, rows: int = 64, magnitude: np.ndarray | None = None
                  ) -> list[np.ndarray]:
    """``[x @ w for x in xs]``, each in ``x``'s dtype, reading ``w`` ``(K, N)`` once for all of them: ``rows``
    rows of ``w`` at a time (cast as in :func:`products`), the products of each row block summed. For a
    stored ``(in, G*H)`` Keras kernel and all steps' inputs at once: no turned copy of the kernel is made.
    Each result equals ``x @ w.astype(dt)`` up to the order of the sums.

    ``magnitude``: nonnegative float32 ``(n, K)``; one more result is then appended, ``magnitude @ |w|`` summed
    in float32 in the same pass (each block made absolute while in cache: a sum of ``K`` nonnegative float32
    products in some order, which :func:`rnnconvert.verify.bounds.magnitude_bound32` raises to a bound), or
    ``None`` where it is not computed: float64 ``w`` (``|w|`` is not a float32 number), ``--device cuda``."""
    if gpu.active():
        return gpu.left_products(xs, w) + ([None] if magnitude is not None else [])
    mag = magnitude if magnitude is not None and w.dtype.itemsize <= 4 else None
    outs = [np.zeros((x.shape[0], w.shape[1]), x.dtype) for x in xs]
    acc = np.zeros((mag.shape[0], w.shape[1]), np.float32) if mag is not None else None

    def piece(lo: int, hi: int) -> None:  # output columns lo:hi: each sum in the order one pass makes it
        abuf = np.empty((min(rows, w.shape[0]), hi - lo), np.float32) if acc is not None else None
        for i, get in Blocks(w[:, lo:hi], rows):
            for x, o in zip(xs, outs):
                o[:, lo:hi] += x[:, i:i + rows] @ get(x.dtype)
            if acc is not None:
                b = get(np.float32)
                acc[:, lo:hi] += mag[:, i:i + rows] @ np.abs(b, out=abuf[:b.shape[0]])
    parallel.run(piece, parallel.split(w.shape[1], 64, w.nbytes))
    return outs + ([acc] if magnitude is not None else [])


#: elements per torch copy in :func:`widen_into`: torch's ``GRAIN_SIZE``, below which it does not hand a copy
#: to its OpenMP threads (whose spinning afterwards took a fifth of the 2 cores' time)
_TORCH_GRAIN = 32768


def widen_into(out: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``out[...] = a`` for float16 ``a`` into float32 ``out`` (same shape, both C-contiguous): exact either
    way. numpy converts float16 one element at a time (``npy_halfbits_to_floatbits``, ~2 ns per element:
    28% of the CPU of a verified float16 conversion of the issue #18 model); torch's conversion is vectorised
    (~7x faster), so it is used when torch is already imported and done importing (this never imports it;
    verification imports it in the background for torch targets: ``verify.engine.import_engine``)."""
    import sys

    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    if (torch is not None and not getattr(spec, "_initializing", True) and a.dtype == np.float16
            and out.dtype == np.float32 and a.flags.c_contiguous and out.flags.c_contiguous and a.size):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # from_numpy of a read-only (mapped) array warns; it is only read
            src, dst = torch.from_numpy(a.reshape(-1)), torch.from_numpy(out.reshape(-1))
        for i in range(0, a.size, _TORCH_GRAIN):  # pieces torch copies in the calling thread: a larger copy
            dst[i:i + _TORCH_GRAIN].copy_(src[i:i + _TORCH_GRAIN])  # wakes its OpenMP pool, which then spins
        return out
    np.copyto(out, a)
    return out


_scratch = threading.local()  # one reused float32 buffer per thread for widened()


def release_scratch() -> None:
    """Drop this thread's :func:`widened` scratch buffer (verification calls it when it is done)."""
    _scratch.buf = None


def widened(a: np.ndarray | None, reuse: bool = False) -> np.ndarray | None:
    """``a`` itself, or float16 widened to float32 once (exact; numpy's float16 casts are slow, so the
    products and per-block casts work from float32). ``reuse=True``: into this thread's scratch buffer
    (valid until the next ``widened(..., reuse=True)`` call), so that layer after layer of a large model does
    not pay for fresh pages (each direction's ``W_hh`` of ``core.reference._direction``)."""
    if a is None or a.dtype.itemsize >= 4:
        return a
    if not reuse:
        return widen_into(np.empty(a.shape, np.float32), np.ascontiguousarray(a))
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < a.size:
        buf = _scratch.buf = np.empty(a.size, np.float32)
    return widen_into(buf[:a.size].reshape(a.shape), np.ascontiguousarray(a))


#: the kernels verification passes to :mod:`rnnconvert.core.reference` (``kernels=FAST``); with the plain fallback
#: (:mod:`.backend`) the reference's own plain numpy products
FAST = reference.PLAIN if backend.plain() else SimpleNamespace(products=products, widened=widened)
