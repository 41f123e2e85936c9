"""io.pool.ArrayPool: a released slab's arrays go to the next slab only when nothing holds them (the lazy
Keras HDF5 and TF2 readers), and verification never lists the process's libraries from a thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.io.pool import REMEMBERED, ArrayPool

from conftest import FIXTURES


def test_pool_reuses_only_arrays_nothing_holds():
    pool = ArrayPool()
    a = pool.take((0, 0), (4, 5), np.float32)
    b = pool.take((0, 0), (4, 5), np.float32)
    c = pool.take((0, 0), (3, 5), np.float32)
    ids = {id(a), id(b), id(c)}
    view = b[1:]  # a view holds b
    held = [c]  # a list holds c
    del a, b, c
    pool.give_back((0, 0))
    got = [pool.take((1, 0), (4, 5), np.float32) for _ in range(2)] + [pool.take((1, 0), (3, 5), np.float32)]
    reused = [id(g) in ids for g in got]
    assert reused == [True, False, False]  # only a: b has a view, c a holder
    assert view.base is not None and held[0].shape == (3, 5)
    assert pool.take((2, 0), (4, 5), np.float64).dtype == np.float64  # another dtype: a fresh array


def test_pool_forgets_slabs_never_given_back():
    pool = ArrayPool()
    for k in range(REMEMBERED + 2):
        pool.take((k, 0), (2, 2), np.float32)
    assert len(pool.lent) == REMEMBERED  # a whole-checkpoint read that never releases is not kept alive


@pytest.mark.parametrize("src", [FIXTURES / "keras" / "bidi_lstm_concat.h5", FIXTURES / "tf" / "keras_lstm_bigru"])
def test_lazy_keras_reader_reuses_released_arrays_and_output_is_unchanged(src, tmp_path):
    """A streamed verified conversion from a lazy Keras source: a slab read after an earlier one was released
    gets that slab's arrays (same memory) when nothing holds them, and the written file is the one an eager
    read writes (byte for byte)."""
    lazy = api.load(src, lazy=True)

    def addresses(dirs):
        return sorted(a.ctypes.data for dp in dirs for a in (dp.w_ih, dp.w_hh))
    first = addresses(lazy.slab(0, 0))  # nothing holds the slab after this line
    lazy.release(0, 0)
    assert addresses(lazy.slab(0, 0)) == first  # the same arrays, no fresh pages
    held = lazy.slab(0, 0)
    lazy.release(0, 0)
    again = lazy.slab(0, 0)
    assert not set(addresses(again)) & set(addresses(held))  # held ones are never handed out again
    assert all(np.array_equal(getattr(x, n), getattr(y, n)) for x, y in zip(held, again) for n in ("w_ih", "w_hh"))
    api.convert(src, tmp_path / "lazy.safetensors")
    eager = api.load(src)
    api.save(eager, tmp_path / "eager.safetensors")
    assert (tmp_path / "lazy.safetensors").read_bytes() == (tmp_path / "eager.safetensors").read_bytes()


def test_blas_controller_made_once_in_the_callers_thread(tmp_path, monkeypatch):
    """Verification lists the process's libraries (threadpoolctl) once, in the caller's thread, never in its
    verifier thread: listing them (dl_iterate_phdr) beside a thread importing an extension module deadlocks
    (engine.verify.blas_controller)."""
    import threadpoolctl

    from rnnconvert.engine import verify as verify_mod

    made = []
    real = threadpoolctl.ThreadpoolController.__init__

    def init(self, *a, **k):
        made.append(threading.current_thread() is threading.main_thread())
        real(self, *a, **k)
    monkeypatch.setattr(threadpoolctl.ThreadpoolController, "__init__", init)
    monkeypatch.setattr(verify_mod, "_CONTROLLER", [])
    monkeypatch.setattr(threadpoolctl, "threadpool_limits",
                        lambda *a, **k: pytest.fail("threadpool_limits lists the libraries on every call"))
    api.convert(FIXTURES / "keras" / "bidi_lstm_concat.h5", tmp_path / "o.safetensors")
    api.convert(FIXTURES / "keras" / "bidi_lstm_concat.h5", tmp_path / "o2.safetensors")
    assert made == [True]
