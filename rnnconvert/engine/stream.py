"""Iterating over the slabs of a checkpoint.

A *slab* is stacked layer ``k`` of ``ckpt.layers[i]`` with all its directions: the unit streaming
conversion holds in memory (:meth:`rnnconvert.core.model.Checkpoint.slab`).
"""

from __future__ import annotations

from ..core.model import Checkpoint, DirectionParams


def slab_bytes(dirs: list[DirectionParams]) -> int:
    """Parameter bytes of one slab (placeholders count at their declared size)."""
    return sum(int(a.size) * a.dtype.itemsize for dp in dirs for a in dp.arrays().values())


def order(ckpt: Checkpoint) -> list[tuple[int, int]]:
    """Every ``(i, k)`` in write order: layers in source order, stacked layers bottom-up."""
    return [(i, k) for i, layer in enumerate(ckpt.layers) for k in range(layer.num_layers)]


def stream_write(writer, ckpt, on_slab=None, *, progress=None, reading=None) -> list[str]:
    """Feed every slab of ``ckpt`` (read through :meth:`Checkpoint.slab`, released after) to a stream
    ``writer`` in order and close it; ``abort()`` on any error. What a streaming writer's ``write`` does.
    ``writer`` ``None``: only ``on_slab`` (``rnnconvert verify``'s source side); returns ``[]``.
    ``on_slab(i, k, dirs)``, when given, runs on each slab, in order, in its own thread (the source side of
    a streamed verification, :class:`_Pipeline`), while the next slab is read. ``progress(done, total)``:
    parameter bytes written.

    A writer whose ``WRITE_BEHIND`` attribute is true (its ``write_slab`` spends its time in code that
    releases the GIL: CRC-32 and ``write``) writes in its own thread too; the others write in the
    caller's thread. Either way at most two slabs are alive (:class:`_Pipeline`; with neither a verifier nor
    a ``WRITE_BEHIND`` writer, one: each slab is written and released before the next is read)."""
    if writer is None and on_slab is None:
        raise ValueError("stream_write needs a writer or an on_slab")
    total = sum(slab_bytes(ckpt.layers[i].params[k]) for i, k in order(ckpt))
    behind = writer is not None and bool(getattr(writer, "WRITE_BEHIND", False))
    return _Pipeline(writer, ckpt, total, behind, on_slab).run(progress, reading)


class _Pipeline:
    """:func:`stream_write` with the source side of verification (``on_slab``), and the writing of a
    ``WRITE_BEHIND`` writer, each in a background thread, while the caller's thread reads the next slab.

    Each slab goes to every stage (a queue and a thread per stage, so each stage sees the slabs in order);
    it is released (``ckpt.release``) once every stage is done with it. At most two slabs are alive: the
    caller may read slab ``n + 1`` only once slab ``n - 1`` is done (a semaphore of two slots, given back
    with the release). A writer that gives back each array's pages once written (``ckpt.release_array``,
    a memory-mapped source) may do so before the verifier has read them: they stay valid, read again from
    the page cache. An error in a stage stops the reading at the next slab and is raised in the caller's
    thread; any error ends in ``writer.abort()`` after the threads have stopped.

    With no stage (no verifier, a writer that writes in the caller's thread) this is the plain loop: read,
    write, release, one slab alive. The reading itself stays in the caller's thread: reading slab ``n + 1``
    in a background thread while slab ``n`` is written was measured on the benchmark ``h5 -> pt``
    conversion, 9.7 s against 7.5 s sequential (medians of 4 cold runs). The source side of verification in
    the reading thread against its own thread: docs/performance.md, session 7."""

    def __init__(self, writer, ckpt, total: int, behind: bool, on_slab) -> None:
        import queue
        import threading

        self.writer, self.ckpt, self.total, self.behind = writer, ckpt, total, behind
        self.slots = threading.Semaphore(2)
        self.lock = threading.Lock()
        self.pending: dict[tuple[int, int], int] = {}
        self.error: BaseException | None = None
        self.written = 0
        stages = ([("writer", self._write)] if behind else []) + ([("verifier", on_slab)] if on_slab else [])
        self.queues = [queue.Queue() for _ in stages]
        self.threads = [threading.Thread(target=self._work, args=(q, fn), name=f"rnnconvert-{name}", daemon=True)
                        for q, (name, fn) in zip(self.queues, stages)]

    def _write(self, i: int, k: int, dirs) -> None:
        self.writer.write_slab(i, k, dirs)
        self.written += slab_bytes(dirs)

    def _done(self, i: int, k: int) -> None:
        with self.lock:
            self.pending[i, k] -= 1
            last = not self.pending[i, k]
            if last:
                del self.pending[i, k]
        if last:
            self.ckpt.release(i, k)
            self.slots.release()

    def _work(self, todo, fn) -> None:
        while True:
            item = todo.get()
            if item is None:
                return
            i, k, dirs = item
            try:
                if self.error is None:
                    fn(i, k, dirs)
            except BaseException as exc:  # handed to the main thread
                with self.lock:
                    self.error = self.error or exc
            finally:
                del dirs, item
                self._done(i, k)

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _stop(self) -> None:
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            t.join()

    def run(self, progress, reading=None) -> list[str]:
        for t in self.threads:
            t.start()
        read = 0
        try:
            for i, k in order(self.ckpt):
                if reading is not None:
                    reading(read, self.total)
                    read += slab_bytes(self.ckpt.layers[i].params[k])
                self.slots.acquire()
                self._check()
                if progress is not None and self.behind:  # what the writer thread has written so far
                    progress(self.written, self.total)
                dirs = self.ckpt.slab(i, k)
                with self.lock:
                    self.pending[i, k] = len(self.queues) + (self.writer is not None and not self.behind)
                for q in self.queues:
                    q.put((i, k, dirs))
                if self.writer is not None and not self.behind:
                    try:
                        self._write(i, k, dirs)
                    finally:
                        self._done(i, k)
                    if progress is not None:
                        progress(self.written, self.total)
                del dirs
            self._stop()
            self._check()
            if self.writer is None:
                return []
            if progress is not None and self.behind:
                progress(self.written, self.total)
            return self.writer.close()
        except BaseException:
            self.error = self.error or RuntimeError("stopped")  # the threads skip what is still queued
            self._stop()
            if self.writer is not None:
                self.writer.abort()
            raise


# ------------------------------------------------------------------ a run-time forget_bias, decided once
# FormatSpec.forget_bias says how a writer takes a TF1 cell's run-time forget_bias: "fold" (the engine adds
# it into b_ih of the forget gate before the writer sees the layer: core.transforms.fold_forget_bias, one
# rounding per element) or "keep" (the writer stores it with the layer: npz). Writers never fold.


def writer_view(ckpt: Checkpoint, forget_bias: str) -> Checkpoint:
    """``ckpt`` as a writer with ``FormatSpec.forget_bias == forget_bias`` takes it: for ``"fold"``, every
    LSTM layer with a run-time ``forget_bias`` has it folded into ``b_ih[f]`` and ``forget_bias`` 0 (an
    eager checkpoint: all its parameters; a lazy one: the layers' semantics, and each slab as it is
    read: :class:`FoldedSlabs`); for ``"keep"``, ``ckpt`` itself. ``ckpt`` is never changed. A streamed conversion, whose
    verification must see each slab as read, opens the writer on this view but feeds it the slabs of
    ``ckpt`` through :class:`FoldingWriter`."""
    from dataclasses import replace

    from ..core.transforms import fold_forget_bias

    if forget_bias == "keep" or not any(layer.semantics.forget_bias for layer in ckpt.layers):
        return ckpt
    if forget_bias != "fold":
        raise ValueError(f"FormatSpec.forget_bias is 'fold' or 'keep', not {forget_bias!r}")
    if not ckpt.lazy:
        return replace(ckpt, layers=[fold_forget_bias(layer) for layer in ckpt.layers])
    return replace(ckpt, layers=[layer.with_semantics(forget_bias=0.0) if layer.semantics.forget_bias else layer
                                 for layer in ckpt.layers], slabs=FoldedSlabs(ckpt))


def folded_slab(layer, k: int, dirs: list[DirectionParams]) -> list[DirectionParams]:
    """Slab ``k`` of ``layer`` (its directions ``dirs``, as read) with a run-time ``forget_bias`` folded into
    ``b_ih[f]`` (:func:`rnnconvert.core.transforms.fold_forget_bias`); ``dirs`` itself when there is none."""
    from ..core.transforms import fold_forget_bias

    return fold_forget_bias(layer.one_slab(k, dirs)).params[0] if layer.semantics.forget_bias else dirs


class FoldedSlabs:
    """A :class:`~rnnconvert.core.model.SlabSource`: the slabs of the lazy ``ckpt`` with a run-time
    ``forget_bias`` folded into ``b_ih[f]`` (:func:`writer_view`); releases go to ``ckpt``'s own source."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt

    def read(self, i: int, k: int) -> list[DirectionParams]:
        return folded_slab(self.ckpt.layers[i], k, self.ckpt.slab(i, k))

    def release(self, i: int, k: int) -> None:
        self.ckpt.release(i, k)

    def release_array(self, a) -> None:
        self.ckpt.release_array(a)


class FoldingWriter:
    """A :class:`~rnnconvert.engine.protocol.SlabWriter` that hands ``writer`` each slab of the lazy ``ckpt``
    with its run-time ``forget_bias`` folded (:func:`writer_view`, per slab): what ``stream_write`` feeds a
    ``"fold"`` writer opened on ``writer_view(ckpt, "fold")``, while its ``on_slab`` (the source side of
    verification) still sees the slab as read."""

    def __init__(self, writer, ckpt: Checkpoint) -> None:
        self.writer, self.ckpt = writer, ckpt
        self.WRITE_BEHIND = bool(getattr(writer, "WRITE_BEHIND", False))

    def write_slab(self, i: int, k: int, dirs: list[DirectionParams]) -> None:
        self.writer.write_slab(i, k, folded_slab(self.ckpt.layers[i], k, dirs))

    def close(self) -> list[str]:
        return self.writer.close()

    def abort(self) -> None:
        self.writer.abort()
