"""The row-split paths of rnnconvert.speed.parallel give the bytes a single thread gives (issue #33): the products
and bounds of verification; and the thread count comes from where it should."""

import numpy as np
import pytest

from rnnconvert.speed import kernels, parallel
from rnnconvert.verify import bounds


@pytest.fixture
def small_split(monkeypatch):
    """Every matrix split (MIN_BYTES 0) between 4 threads."""
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    yield
    parallel.set_threads(None)


def _both(fn):
    parallel.set_threads(1)
    one = fn()
    parallel.set_threads(4)
    many = fn()
    return one, many


def test_row_chunks_cover_rows_on_block_boundaries():
    for m, rows, parts in [(1000, 64, 4), (64, 64, 3), (65, 64, 8), (7, 3, 16), (4096, 16, 2)]:
        got = parallel.row_chunks(m, rows, parts)
        assert got[0][0] == 0 and got[-1][1] == m and len(got) <= parts
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(lo % rows == 0 for lo, _ in got)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
def test_products_and_bounds_bit_identical_across_threads(small_split, dt):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1000, 300)).astype(dt)
    v64, v32 = rng.standard_normal((300, 5)), rng.standard_normal((300, 5)).astype(np.float32)
    one, many = _both(lambda: kernels.products(w, [v64, v32], rows=64))
    for a, b in zip(one, many):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    x = rng.standard_normal((6, 300))
    one, many = _both(lambda: bounds.lin(w, x, rows=64))
    assert all(np.array_equal(a, b) for a, b in zip(one, many))
    one, many = _both(lambda: bounds.abs_products(w, np.abs(v64), rows=64))
    assert np.array_equal(one, many)
    wk = rng.standard_normal((300, 1000)).astype(dt)  # a stored (in, G*H) kernel: sums split by columns
    one, many = _both(lambda: kernels.left_products([x, x.astype(np.float32)], wk))
    for a, b in zip(one, many):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(a).max() if a.dtype == np.float64 else 1e-4)


def test_thread_count_sources(monkeypatch):
    parallel.set_threads(None)
    monkeypatch.setenv(parallel.VARIABLE, "3")
    assert parallel.threads() == 3
    monkeypatch.delenv(parallel.VARIABLE)
    assert parallel.threads() == min(parallel.DEFAULT_MAX, parallel.available())
    with parallel.using(2):
        assert parallel.threads() == 2
    assert parallel.threads() == min(parallel.DEFAULT_MAX, parallel.available())
    monkeypatch.setenv("RNNCONVERT_SPEED", "plain")
    assert parallel.threads() == 1
    with pytest.raises(ValueError):
        parallel.set_threads(0)


@pytest.fixture
def gpu_products_on_cpu(monkeypatch):
    """speed/gpu.py's torch products, on torch's CPU device (the code path --device cuda takes, without a GPU)."""
    pytest.importorskip("torch")
    from rnnconvert.speed import gpu

    monkeypatch.setitem(gpu._state, "device", "cpu")
    monkeypatch.setitem(gpu._state, "on", True)
    yield gpu
    gpu.forget()


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gpu_products_match_and_bound(gpu_products_on_cpu, dt):
    """The torch products equal numpy's to float64 (float32) rounding, and the bound's magnitude stays above the
    exact |v| @ |w|.T (computed here exactly with Python's fractions on a few rows)."""
    from fractions import Fraction

    gpu = gpu_products_on_cpu
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 30)).astype(dt)
    v = rng.standard_normal((30, 3))
    (a,) = gpu.products(w, [v])
    np.testing.assert_allclose(a, w.astype(np.float64) @ v, rtol=1e-13, atol=1e-13)
    (b,) = gpu.left_products([v.T.copy()], w.T.copy())
    np.testing.assert_allclose(b, v.T @ w.T.astype(np.float64), rtol=1e-13, atol=1e-13)
    val, mag = gpu.lin(w, v.T)
    np.testing.assert_allclose(val, v.T @ w.T.astype(np.float64), rtol=1e-13, atol=1e-13)
    for r in range(3):
        for c in range(0, 40, 7):
            exact = sum(abs(Fraction(float(v[k, r]))) * abs(Fraction(float(w[c, k]))) for k in range(30))
            assert Fraction(float(mag[r, c])) >= exact
    gpu.forget()


def test_verdicts_with_gpu_products(gpu_products_on_cpu, tmp_path):
    """A verified conversion with the products in torch says ok, and a file with two gate blocks exchanged fails."""
    import rnnconvert
    from conftest import FIXTURES

    src = FIXTURES / "keras" / "bidi_lstm_concat.h5"
    rep = rnnconvert.convert(src, tmp_path / "o.npz")
    assert rep.verification.ok
    from rnnconvert import api

    z = dict(np.load(tmp_path / "o.npz", allow_pickle=False))
    key = next(k for k in z if k.endswith("w_hh") or "weight_hh" in k)
    w = z[key].copy()
    H = w.shape[-1]
    w[..., :H, :], w[..., H:2 * H, :] = z[key][..., H:2 * H, :], z[key][..., :H, :]
    z[key] = w
    np.savez(tmp_path / "bad.npz", **z)
    rep = api.verify(src, tmp_path / "bad.npz")
    assert not rep.ok
