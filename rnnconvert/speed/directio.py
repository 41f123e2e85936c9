"""Large sequential outputs written around the page cache (``O_DIRECT``), where the system allows it.

Copying gigabytes into the page cache with ``write()`` is what a streamed conversion spent most of its
kernel time on (``perf``: ``copy_folio_from_iter_atomic`` 34% of a cold 3 GB ``h5 -> pt`` on the
benchmark VM). :class:`DirectWriter` stages the byte stream in an aligned buffer and hands whole blocks
to the device with ``O_DIRECT`` (no page-cache copy, nothing left to flush at ``fsync``); only the last
partial block goes through the page cache. ``dd`` of the same 3 GB file: 4.4-7.7 s buffered (system time
3.3-6.9 s) against 1.8-2.1 s with ``oflag=direct``, ``cp`` 1.9-2.0 s (docs/performance.md, Session 3). Whole
blocks are written in background threads, several at once (:class:`_InFlight`): the device is faster with
more requests in flight, and the conversion goes on meanwhile.

:class:`ScatterWriter` does the same for a file of known size whose pieces arrive out of order (safetensors:
tensors sorted by dtype and name, written as the slabs come): each aligned block goes ``O_DIRECT`` as
soon as all of its bytes have arrived.

Where ``O_DIRECT`` is missing or refused (not Linux, tmpfs, some network file systems) the writer falls
back to ordinary buffered writes, transparently: the bytes are the same either way. Outputs that are read
back at once (a verified conversion) are written through the page cache (:func:`through_page_cache`).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import mmap
import os

from . import backend

#: Bytes staged before each ``O_DIRECT`` write (a multiple of every logical block size in use).
BLOCK = 16 << 20
#: ``O_DIRECT`` writes of one writer in flight at once, each in a thread of its own (:class:`_InFlight`): the
#: device is kept busy while the next block is staged, and sees several requests at a time. On the benchmark VM
#: (``max_sectors_kb`` 4096, so a write is cut into requests of 4 MiB) ``dd oflag=direct`` of 3 GB took 3.0-4.1 s
#: in 8 MiB writes, 1.9-2.8 s in 64 MiB ones, 2.9 s as two 8 MiB streams at once (docs/performance.md,
#: session 10); so a writer keeps up to this many blocks in flight (memory: that many staging buffers more).
IN_FLIGHT = 3
#: Without ``O_DIRECT`` (refused, or :func:`through_page_cache`), :meth:`DirectWriter.write` pieces of at least
#: this many bytes are written straight from the caller's buffer: staging them was one more copy of every byte
#: of a verified output (0.3 s of CPU for 3 GB; docs/performance.md, session 8); smaller ones (zip headers)
#: are still gathered into one write
UNSTAGED = 64 << 10

_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("rnnconvert_direct_io", default=True)


@contextlib.contextmanager
def through_page_cache():
    """Within the block, :class:`DirectWriter` s write through the page cache (no ``O_DIRECT``): for an
    output that is read back at once. Verification reads the written file back in its framework, so a
    verified conversion writes through the cache (``rnnconvert.api.convert``): a cold re-read of a
    multi-GB file from the device cost more than ``O_DIRECT`` saved (docs/performance.md, Session 3)."""
    token = _ALLOWED.set(False)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def _open_direct(path: str) -> int:
    """A second, ``O_DIRECT`` descriptor of ``path``, or -1 where it is missing, refused, or not allowed now."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag and _ALLOWED.get() and not backend.plain():
        try:
            return os.open(path, os.O_WRONLY | flag)
        except OSError:
            return -1
    return -1


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:done + (1 << 30)], pos + done)


_WRITEBACK: list = []


def start_writeback(fd: int, pos: int, n: int) -> None:
    """Ask the kernel to start writing bytes ``pos .. pos + n`` of ``fd`` to the device now, without waiting
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, through ``ctypes``: Python's ``os`` has no binding);
    elsewhere, or where the call fails, nothing happens. The pages stay in the page cache (a verified output
    is read back from there). Without it the kernel starts writing a buffered output only once dirty pages
    pass its background threshold (10% of memory, 2.3 GB on the 2-core test machine: most of a 3 GB
    output), and the ``fsync`` before the rename waits for the rest; with it the device writes while the
    conversion runs (docs/performance.md, session 8)."""
    if not _WRITEBACK:
        fn = None
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (AttributeError, OSError):
            fn = None
        _WRITEBACK.append(fn)
    fn = _WRITEBACK[0]
    # whole pages only, each once: a page a later write completes (the next piece of a scattered file, the
    # tail of this one) is started with that write, not sent half-written now and again later
    lo, hi = pos - pos % mmap.PAGESIZE, (pos + n) - (pos + n) % mmap.PAGESIZE
    if fn is not None and hi > lo:
        fn(fd, lo, hi - lo, 2)  # SYNC_FILE_RANGE_WRITE; a failure (EINVAL, ESPIPE) leaves the kernel's own timing


def _pwrite_buffered(fd: int, data: memoryview, pos: int) -> None:
    """:func:`_pwrite_all` through the page cache, its writeback started at once (:func:`start_writeback`)."""
    _pwrite_all(fd, data, pos)
    start_writeback(fd, pos, len(data))


def _put(owner, data: memoryview, pos: int, direct: bool) -> None:
    """Write all of ``data`` at ``pos`` through ``owner.dfd`` (``O_DIRECT``) when ``direct`` and it is in use
    (``owner.direct``), else through ``owner.fd``. A file system that refuses ``O_DIRECT`` writes
    (``EINVAL``/``EOPNOTSUPP``) marks ``owner`` as not direct (``owner.refused``; the descriptor stays open
    until ``owner.close``, as another thread's write may be using it) and gets the same bytes written
    buffered; other errors are raised."""
    if direct and owner.direct:
        try:
            _pwrite_all(owner.dfd, data, pos)
            return
        except OSError as exc:
            if exc.errno not in (22, 95):
                raise
            owner.refused = True
    _pwrite_buffered(owner.fd, data, pos)


def _unmap(buf: mmap.mmap) -> None:
    """Unmap a staging buffer now, or, while a view of it is still alive (an error's traceback holding the
    piece a failed write was given), when the last view goes."""
    try:
        buf.close()
    except BufferError:
        pass


class _InFlight:
    """Whole staged blocks of a writer written with ``O_DIRECT`` in background threads, up to
    :data:`IN_FLIGHT` at once (:meth:`send`), each staging buffer handed back to ``owner.spare`` once written.
    The first error of a background write is raised by the next :meth:`send` or by :meth:`drain` (the
    writer's ``close``), as a buffered file's error at ``close``; after an error nothing more is written."""

    def __init__(self, owner) -> None:
        import threading

        self.owner, self.error, self.failed = owner, None, False
        self.slots = threading.Semaphore(IN_FLIGHT)
        self.lock = threading.Lock()
        self.threads: list = []

    def send(self, buf: mmap.mmap, n: int, pos: int) -> None:
        """Write the first ``n`` bytes of ``buf`` at ``pos`` in a thread (waiting while :data:`IN_FLIGHT` are)."""
        import threading

        self.slots.acquire()
        if self.error is not None or self.failed:
            self.slots.release()
            self.raise_error()
            raise OSError(f"{self.owner.path}: an earlier write failed")
        t = threading.Thread(target=self._write, args=(buf, n, pos), name="rnnconvert-odirect", daemon=True)
        try:
            t.start()
        except BaseException:  # no thread: nothing in flight for it, the buffer stays the caller's
            self.slots.release()
            raise
        with self.lock:
            self.threads = [x for x in self.threads if x.is_alive()] + [t]

    def _write(self, buf: mmap.mmap, n: int, pos: int) -> None:
        try:
            if self.error is None and not self.failed:
                with memoryview(buf)[:n] as out:
                    _put(self.owner, out, pos, True)
        except BaseException as exc:  # raised in the writer's thread by send() or drain()
            with self.lock:  # without this thread's frames, which hold views of the buffer
                self.error = self.error or exc.with_traceback(None)
        finally:
            with self.lock:
                self.owner.spare.append(buf)
            self.slots.release()

    def raise_error(self) -> None:
        """Raise the first error of a background write, once (``failed`` stays: later sends refuse)."""
        with self.lock:
            err, self.error = self.error, None
            self.failed = self.failed or err is not None
        if err is not None:
            raise err

    def drain(self) -> None:
        """Wait for every write in flight, even through an interrupt (raised once they are all done: no
        thread may outlive its writer's descriptors); raise the first error."""
        with self.lock:
            threads = list(self.threads)
        stopped = None
        for t in threads:
            while t.is_alive():
                try:
                    t.join()
                except BaseException as exc:  # KeyboardInterrupt: the write in flight ends in moments
                    stopped = stopped or exc
        if stopped is not None:
            raise stopped
        self.raise_error()


class DirectWriter:
    """A write-only binary file at ``path`` (truncated), with ``write``, ``tell``, ``flush``, ``fileno``, ``close``.

    Bytes are copied into a page-aligned staging buffer of :data:`BLOCK` bytes; each full buffer is written
    at its (block-aligned) offset through an ``O_DIRECT`` descriptor in the background (:class:`_InFlight`,
    up to :data:`IN_FLIGHT` at once, staging going on in another buffer), the last partial one through an
    ordinary descriptor at :meth:`close`, which waits for them all. ``direct`` says whether ``O_DIRECT`` is
    in use.

    Raises:
        OSError: the file cannot be opened or written (as ``open``/``write`` would).
    """

    def __init__(self, path: str | os.PathLike, block: int | None = None) -> None:
        self.path, self.block = os.fspath(path), block or BLOCK
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.dfd = _open_direct(self.path)
        self.refused = False
        self.spare: list[mmap.mmap] = []  # staging buffers written and free again (:class:`_InFlight`)
        self.flight = _InFlight(self)
        self.buf = mmap.mmap(-1, self.block)  # anonymous: page-aligned, as O_DIRECT wants
        self.view = memoryview(self.buf)
        self.fill = 0  # bytes staged
        self.pos = 0  # file offset of the staging buffer's first byte
        self.closed = False

    @property
    def direct(self) -> bool:
        """Whether whole blocks go ``O_DIRECT`` (opened so, and not refused at a write)."""
        return self.dfd >= 0 and not self.refused

    def fileno(self) -> int:
        return self.fd

    def tell(self) -> int:
        """Bytes written so far (staged ones included)."""
        return self.pos + self.fill

    def write(self, data) -> int:
        src = memoryview(data).cast("B")
        n, done = len(src), 0
        if not self.direct and n >= UNSTAGED:  # through the page cache: large pieces go straight from ``data``
            if self.fill:
                self._send(self.fill, direct=False)
            _pwrite_buffered(self.fd, src, self.pos)
            self.pos += n
            return n
        while done < n:
            take = min(self.block - self.fill, n - done)
            self.view[self.fill:self.fill + take] = src[done:done + take]
            self.fill += take
            done += take
            if self.fill == self.block:
                self._send(self.block)
        return n

    def _send(self, size: int, direct: bool = True) -> None:
        """Write the first ``size`` staged bytes at ``pos`` (``O_DIRECT`` when possible and ``direct``: a
        whole block, handed to a background write, :class:`_InFlight`, and staging goes on in another
        buffer), then restage."""
        if direct and self.direct:
            self.flight.send(self.buf, size, self.pos)  # raises before the hand-off: the buffer stays staged
            self.view.release()
            with self.flight.lock:
                self.buf = self.spare.pop() if self.spare else mmap.mmap(-1, self.block)
            self.view = memoryview(self.buf)
        else:
            with self.view[:size] as out:
                _put(self, out, self.pos, direct)
        self.pos += size
        self.fill = 0

    def flush(self) -> None:
        """Nothing to do: staged bytes are written by :meth:`close` (a partial block cannot go ``O_DIRECT``)."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            try:
                self.flight.drain()
            finally:
                if self.fill and not self.flight.failed:  # the tail, through the page cache
                    self._send(self.fill, direct=False)
        finally:
            self.view.release()
            for b in [self.buf, *self.spare]:
                _unmap(b)
            self.spare.clear()
            if self.dfd >= 0:
                os.close(self.dfd)
            os.close(self.fd)

    def __enter__(self) -> DirectWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ScatterWriter:
    """A file of ``size`` bytes (truncated, then extended to it) written by :meth:`pwrite` at any offsets,
    each byte exactly once, around the page cache where allowed.

    Arriving bytes are copied into a page-aligned buffer of ``block`` bytes per block of the file; a block
    is written with ``O_DIRECT`` as soon as all of its bytes are there (in the background,
    :class:`_InFlight`; the file's last, partial block through the page cache), and its buffer is reused. So
    as many buffers are alive as blocks are being filled at once, plus those in flight: for a safetensors
    file written slab by slab, one or two per run of tensors that arrive in file order (about 10); at most
    :data:`SPARE` written buffers are kept for reuse. Without ``O_DIRECT`` (not available, or
    :func:`through_page_cache`) every piece is written straight away with ``pwrite``, unstaged.

    Raises:
        OSError: the file cannot be opened or written. ValueError: a piece outside the file; at
        :meth:`close`, bytes that never arrived (nothing is then written for them).
    """

    #: 8 MiB: the no-verify ``pt -> safetensors`` benchmark took 5.1-7.2 s (median 5.5) against 5.8-7.1 s (6.6)
    #: with 2 MiB blocks, 43 MB more peak memory (docs/performance.md, session 10)
    BLOCK = 8 << 20
    #: written buffers kept for the next blocks (the rest are unmapped)
    SPARE = 4

    def __init__(self, path: str | os.PathLike, size: int, block: int | None = None) -> None:
        self.path, self.size, self.block = os.fspath(path), int(size), block or self.BLOCK
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            os.close(self.fd)
            raise
        self.dfd = _open_direct(self.path)
        self.refused = False
        self.filling: dict[int, list] = {}  # block index -> [buffer, bytes arrived]
        self.spare: list[mmap.mmap] = []
        self.flight = _InFlight(self)
        self.closed = False

    @property
    def direct(self) -> bool:
        """Whether whole blocks go ``O_DIRECT`` (opened so, and not refused at a write)."""
        return self.dfd >= 0 and not self.refused

    def pwrite(self, data, pos: int) -> None:
        """Write ``data`` (any buffer) at file offset ``pos``."""
        src = memoryview(data).cast("B")
        if pos < 0 or pos + len(src) > self.size:
            raise ValueError(f"{self.path}: {len(src)} bytes at {pos} do not fit a {self.size}-byte file")
        if not self.direct and not self.filling:
            _pwrite_buffered(self.fd, src, pos)
            return
        while len(src):
            b, off = divmod(pos, self.block)
            take = min(self.block - off, len(src))
            ent = self.filling.get(b)
            if ent is None and not self.direct:  # O_DIRECT refused since: only blocks already begun are staged
                _pwrite_buffered(self.fd, src[:take], pos)
                src, pos = src[take:], pos + take
                continue
            if ent is None:
                ent = self.filling[b] = [self.spare.pop() if self.spare else mmap.mmap(-1, self.block), 0]
            ent[0][off:off + take] = src[:take]
            ent[1] += take
            if ent[1] >= min(self.block, self.size - b * self.block):
                self._send(b)
            src, pos = src[take:], pos + take

    def _send(self, b: int) -> None:
        """Write block ``b``, now complete: a whole block in the background (:class:`_InFlight`), the file's
        last, partial one here, through the page cache."""
        buf, _ = self.filling.pop(b)
        n = min(self.block, self.size - b * self.block)
        if n == self.block and self.direct:
            self.flight.send(buf, n, b * self.block)
        else:
            with memoryview(buf)[:n] as out:
                _put(self, out, b * self.block, n == self.block)
            with self.flight.lock:
                self.spare.append(buf)
        with self.flight.lock:  # written buffers come back from the threads too: keep SPARE of them
            extra, self.spare[self.SPARE:] = self.spare[self.SPARE:], []
        for old in extra:
            _unmap(old)

    def close(self) -> None:
        """Release the descriptors. Raises ValueError when some bytes never arrived."""
        if self.closed:
            return
        missing = sum(min(self.block, self.size - b * self.block) - got for b, (_, got) in self.filling.items())
        try:
            self.flight.drain()
        finally:
            self.abort()
        if missing:
            raise ValueError(f"{self.path}: {missing} bytes were never written")

    def abort(self) -> None:
        """Release the descriptors and buffers without writing what is staged (the caller deletes the file)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flight.drain()  # the threads' buffers back in spare; an error of theirs is moot now
        except Exception:  # noqa: BLE001 - aborting: the caller deletes the file
            pass
        finally:
            self._release()

    def _release(self) -> None:
        for buf in [b for b, _ in self.filling.values()] + self.spare:
            _unmap(buf)
        self.filling.clear()
        self.spare.clear()
        if self.dfd >= 0:
            os.close(self.dfd)
        os.close(self.fd)
