"""Threads around verification: numpy's BLAS kept to one thread (:func:`one_blas_thread`, through one process-wide
``threadpoolctl`` controller, :func:`blas_controller`) and a target framework imported in a background thread while
the conversion runs (:func:`import_in_background`). Used by :mod:`rnnconvert.verify.engine`.
"""

from __future__ import annotations

#: Target engines imported in a background thread while the conversion runs (:func:`import_in_background`): their
#: import does nothing a thread must not (no signal handlers: Python allows those only in the main thread).
#: TensorFlow and Keras are left to the main thread.
BACKGROUND_IMPORT = ("torch", "onnxruntime")


def one_blas_thread():
    """A context in which numpy's BLAS is limited to one thread (``threadpoolctl``): verification multiplies each
    weight matrix block by block (1 MiB blocks, :func:`rnnconvert.speed.kernels.block_rows`) by a few dozen
    states, products too small to share between threads, while the conversion's reader and writer threads
    need the other core; a multithreaded BLAS then spends its time waiting for its threads (measured on
    the 2-core machine, ``docs/performance.md``: 2.3-2.5x the wall time of a verified conversion). The
    products share the cores through :mod:`rnnconvert.speed.parallel` instead. ``RNNCONVERT_BLAS_THREADS=N``
    lets BLAS use ``N`` threads here (a benchmark's knob: ``bench/device_table.py``). A context, not a decorator:
    the caller's code runs in the caller's module (no callback from here)."""
    from ..process import settings

    return blas_controller().limit(limits=settings.value("RNNCONVERT_BLAS_THREADS"), user_api="blas")


_CONTROLLER: list = []


def blas_controller():
    """One ``threadpoolctl.ThreadpoolController`` for the process (numpy's BLAS), made at the first call,
    which verification makes in the caller's thread before any of its own threads start
    (:class:`rnnconvert.verify.engine.StreamedVerification`, :func:`import_in_background`). ``threadpool_limits``
    would list the process's libraries on every call (``dl_iterate_phdr``, holding the dynamic loader's lock while
    its callback waits for the GIL): run beside a thread importing an extension module (holding the GIL while
    ``dlopen`` waits for that lock) the two deadlock; it hung one verified conversion in three with a background
    import."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def import_in_background(name: str | None, allowed: tuple[str, ...] = BACKGROUND_IMPORT):
    """Start importing the module ``name`` (a target's framework, when in ``allowed`` and installed) in a daemon
    thread, so that the target side of verification finds it loaded: ``import torch`` is 1.1-2.4 s of the 2-core
    test machine, a fifth of the verification of a 3 GB model (docs/performance.md session 7), and the conversion
    before it leaves a core idle while it waits on the disk. Returns the thread (or None: not allowed, already
    imported, not installed); a later ``import`` in another thread waits for it (Python's per-module import lock).
    An import error is left for the target side to meet and report."""
    import importlib
    import importlib.util
    import sys
    import threading

    if name not in allowed or name in sys.modules:
        return None
    blas_controller()  # listed now, in this thread: never while the import runs (see blas_controller)
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None

    def run():
        try:
            importlib.import_module(name)
        except BaseException:  # the target side imports it again and reports
            pass
    t = threading.Thread(target=run, name=f"rnnconvert-import-{name}", daemon=True)
    t.start()
    return t
