"""io.pool.ArrayPool: a released slab's arrays go to the next slab only when nothing holds them (the lazy
Keras HDF5 and TF2 readers), and verification never lists the process's libraries from a thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.speed.pool import REMEMBERED, ArrayPool

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

    from rnnconvert.speed import threads as verify_mod  # the controller's home (issue #38)

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


# ------------------------------------------------------------------ the lazy safetensors reader (a mapped file)
def _st_file(tmp_path, nan_at=None):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    from conftest import torch_rnn

    sd = {f"enc.rnn.{k}": v.contiguous() for k, v in
          torch_rnn("LSTM", 5, 6, seed=81, num_layers=3, bidirectional=True).state_dict().items()}
    sd["enc.proj.weight"] = torch.ones(2, 12)  # a non-recurrent tensor, carried
    if nan_at:
        sd[nan_at][1, 1] = float("nan")
    path = tmp_path / "m.safetensors"
    st.save_file(sd, str(path))
    return path, sd


def test_lazy_safetensors_reads_slabs_bit_for_bit_like_the_library(tmp_path):
    """safetensors ``read(lazy=True)``: placeholders, each slab read from the mapped file (no copy) on demand;
    every canonical array equals, bit for bit, the one made from the safetensors library's own reading of
    the file (the eager reader: a reader that is not ours for the bytes), the carried tensor too; a
    conversion from it streams (one slab at a time) and verifies."""
    from rnnconvert.core.model import is_placeholder
    from rnnconvert.formats.storage import safetensors_fmt

    path, _ = _st_file(tmp_path)
    lazy = safetensors_fmt.read(path, lazy=True)
    eager = api.load(path)
    assert lazy.lazy and all(is_placeholder(dp.w_ih) for dirs in lazy.layers[0].params for dp in dirs)
    for k in range(3):
        got = lazy.slab(0, k)
        for a, b in zip(got, eager.layers[0].params[k]):
            for f in ("w_ih", "w_hh", "b_ih", "b_hh"):
                x, y = getattr(a, f), getattr(b, f)
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
        lazy.release(0, k)
    assert lazy.tensors["enc.proj.weight"].tobytes() == eager.tensors["enc.proj.weight"].tobytes()
    rep = api.convert(path, tmp_path / "o.pt")
    assert rep.verification.verdict == "ok"


def test_lazy_safetensors_refuses_what_the_eager_reader_refuses(tmp_path):
    """A NaN in one slab: refused when that slab is read (one line naming the layer and tensor), no output;
    a header pointing outside the file: refused before anything is mapped."""
    from rnnconvert.errors import FormatError

    path, _ = _st_file(tmp_path, nan_at="enc.rnn.weight_hh_l2_reverse")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FormatError, match=r"NaN or Inf"):
        api.convert(path, out / "o.pt")
    assert list(out.iterdir()) == []
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    head = raw[8:8 + n].decode().replace('"data_offsets":[0,', '"data_offsets":[999999999,', 1)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(len(head.encode()).to_bytes(8, "little") + head.encode() + raw[8 + n:])
    with pytest.raises(FormatError, match="bad header record|cannot read"):
        api.load(bad, lazy=True)
