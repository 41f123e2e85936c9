"""Issue #18: the shared passes of verification's source side compute what the separate ones do.

A guard for a refactor, not a convention test: the equations' oracles are the framework tests
(test_verify_mutations.py, test_stream.py). Here: ``trajectory_multi``'s float32 run is operation for
operation ``trajectory`` (bit-identical), its float64 run is ``forward_slab``; ``step_with_bound`` (one pass
over ``W_hh``) equals ``step`` and ``step_bound`` up to float64 rounding, and leaves float64 weights untouched
(its in-place ``|block|`` must never write into the caller's matrix).
"""

import numpy as np
import pytest

from rnnconvert.speed import kernels
from rnnconvert.verify import bounds
from rnnconvert.core import reference
from rnnconvert.core.model import Cell, DirectionParams, RNNLayer


def _layer(cell, dtype, bidirectional=True, I=5, H=70):
    if cell == "GRU reset_before":
        return _layer(Cell.GRU, dtype, bidirectional, I, H).with_semantics(reset_after=False)
    rng = np.random.default_rng(7)
    G = cell.gates

    def dp():
        return DirectionParams(*(rng.standard_normal(s).astype(dtype) * 0.3
                                 for s in ((G * H, I), (G * H, H), (G * H,), (G * H,))))
    return RNNLayer("l", cell, I, H, bidirectional=bidirectional,
                    params=[[dp() for _ in range(2 if bidirectional else 1)]])


@pytest.mark.parametrize("kern", ["plain", "fast"])
@pytest.mark.parametrize("cell", [Cell.LSTM, Cell.GRU, "GRU reset_before", Cell.RNN_TANH])
def test_trajectory_multi_is_trajectory_and_forward(cell, kern):
    """The same equations with either implementation of the products: the readable default
    (:data:`rnnconvert.core.reference.PLAIN`) and verification's (:data:`rnnconvert.speed.kernels.FAST`), and the
    two agree in float64 (they differ only in the order of BLAS's sums)."""
    kw = {"kernels": kernels.FAST} if kern == "fast" else {}
    layer = _layer(cell, np.float32)
    x = np.random.default_rng(1).standard_normal((3, 6, 5)).astype(np.float32)
    dirs = layer.params[0]
    y, recs = reference.trajectory(layer, dirs, x, **kw)
    (y32, y64), recs2 = reference.trajectory_multi(layer, dirs, [x, x.astype(np.float64)], **kw)
    assert y32.dtype == np.float32 and np.array_equal(y32, y)
    for a, b in zip(recs, recs2):
        assert np.array_equal(a["h"], b["h"])
    ref = reference.forward_slab(layer, dirs, x)  # the plain products, in float64
    assert np.allclose(y64, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("cell", [Cell.LSTM, Cell.GRU, "GRU reset_before", Cell.RNN_TANH])
def test_step_with_bound_is_step_and_bound(cell, dtype, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 1)  # 64-row blocks: several blocks and a short last one
    layer = _layer(cell, dtype, bidirectional=False)
    p = layer.params[0][0]
    before = p.w_hh.copy()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    h0 = rng.standard_normal((9, 70)).astype(np.float32)
    c0 = rng.standard_normal((9, 70)).astype(np.float32) if cell is Cell.LSTM else None
    u = bounds.unit_roundoff(np.float32)
    (h1, c1), (dh, dc) = bounds.step_with_bound(layer, p, x, h0, c0, u)
    assert np.array_equal(p.w_hh, before)
    eh, ec = reference.step(layer, p, x, h0, c0)
    bh, bc = bounds.step_bound(layer, p, x, h0, c0, u)
    assert np.allclose(h1, eh, rtol=1e-12, atol=1e-12) and np.allclose(dh, bh, rtol=1e-9, atol=0)
    if cell is Cell.LSTM:
        assert np.allclose(c1, ec, rtol=1e-12, atol=1e-12) and np.allclose(dc, bc, rtol=1e-9, atol=0)


def test_float32_magnitudes_bound_the_exact_ones():
    """bounds.lin's magnitude of float32/float16 weights, summed in float32 and raised by its own error
    bound (reference._magnitude32), is never below the exact ``|v| @ |w|.T``: checked against exact rational
    sums (fractions) on rows with wide-ranging, tiny (products below float32's normal range) and huge
    (float32 overflow: float64 fallback) values, and states that are not float32 numbers (rounded up)."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    K = 40
    w = (rng.standard_normal((6, K)) * 10.0 ** rng.integers(-3, 3, (6, K))).astype(np.float32)
    w[1] = np.float32(1e-30)  # products of 1e-30 and 1e-20: below float32's normal range
    w[2, :3] = np.float32(3e38)  # with a state of 10: overflows float32
    v = rng.standard_normal((3, K)) * 10.0 ** rng.integers(-2, 2, (3, K))
    v[1] = 1e-20
    v[2, :3] = 10.0
    v[0, 0] = 1.0 + 2.0 ** -40  # not a float32 number
    for wt in (w, np.clip(w, -6e4, 6e4).astype(np.float16)):  # float16 weights: widened per block
        _, mag = bounds.lin(wt, v)
        for a in range(v.shape[0]):
            for b in range(wt.shape[0]):
                exact = sum(Fraction(abs(float(x))) * Fraction(abs(float(y))) for x, y in zip(v[a], wt[b]))
                assert np.isfinite(mag[a, b]) and Fraction(float(mag[a, b])) >= exact, (a, b)


def test_float16_widening_is_exact_by_torch_or_numpy(monkeypatch):
    """kernels.widen_into: every finite float16 (and the infinities), subnormals and signed zeros included,
    widened to float32 bit for bit as numpy's own cast does (the oracle: numpy's IEEE conversion), through
    torch when it is imported (a vectorised conversion, in pieces of torch's grain size) and through numpy
    when it is not, or while it is still importing."""
    import sys
    import types

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h = bits.view(np.float16)
    h = np.concatenate([h[~np.isnan(h)]] * 3)  # longer than one torch piece
    want = h.astype(np.float32)
    pytest.importorskip("torch")
    got = kernels.widen_into(np.empty(h.shape, np.float32), h)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    half = types.ModuleType("torch")
    half.__spec__ = types.SimpleNamespace(_initializing=True)  # a torch still being imported: not used
    monkeypatch.setitem(sys.modules, "torch", half)
    got = kernels.widen_into(np.empty(h.shape, np.float32), h)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    monkeypatch.delitem(sys.modules, "torch")
    got = kernels.widen_into(np.empty(h.shape, np.float32), h)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_zero_rows_skip_the_products_and_change_nothing(dtype):
    """``_lin`` leaves all-zero rows of ``v`` (a first step's zero states, the zero probes) out of the products:
    their value and magnitude are exactly 0 (IEEE 754: ``0 * w`` is 0 for finite ``w``), and the other rows equal
    the dense pass's to float64 rounding."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((300, 40)) * 0.5).astype(dtype)
    v = rng.standard_normal((6, 40)).astype(np.float32).astype(np.float64)
    v[[0, 2, 5]] = 0.0
    val, mag = bounds.lin(w, v)
    assert not val[[0, 2, 5]].any() and not mag[[0, 2, 5]].any()
    dense = v[[1, 3, 4]] @ w.astype(np.float64).T
    np.testing.assert_allclose(val[[1, 3, 4]], dense, rtol=1e-12, atol=1e-12)
    exact = np.abs(v[[1, 3, 4]]) @ np.abs(w.astype(np.float64)).T
    if dtype == np.float64:  # float64 weights: the magnitude to float64 rounding (_lin's docstring)
        np.testing.assert_allclose(mag[[1, 3, 4]], exact, rtol=1e-12)
    else:  # float32/float16: summed in float32 and raised to a bound (_magnitude32)
        assert (mag[[1, 3, 4]] >= exact).all()
    zval, zmag = bounds.lin(w, np.zeros((3, 40)))
    assert zval.shape == zmag.shape == (3, 300) and not zval.any() and not zmag.any()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_one_hot_rows_are_columns(dtype):
    """``lin`` takes rows of ``v`` with one nonzero element (the one-hot probes) as that column of ``w`` times it,
    with no product: bit for bit ``w[:, j] * v_j`` in float64 (exact for float32 factors: IEEE 754 products of
    two 24-bit significands fit float64's 53), magnitudes at least the exact ``|w_j v_j|`` (fractions), and the
    other rows as before (equal to a pass without the one-hot rows, bit for bit)."""
    from fractions import Fraction

    rng = np.random.default_rng(4)
    w = (rng.standard_normal((200, 30)) * 0.5).astype(dtype)
    v = rng.standard_normal((5, 30)).astype(np.float32).astype(np.float64)
    v[1] = 0.0
    v[1, 7] = 1.0
    v[3] = 0.0
    v[3, 0] = -2.5
    val, mag = bounds.lin(w, v)
    for r, j in ((1, 7), (3, 0)):
        assert np.array_equal(val[r], w[:, j].astype(np.float64) * v[r, j])
        for b in range(w.shape[0]):
            assert Fraction(float(mag[r, b])) >= abs(Fraction(float(w[b, j])) * Fraction(float(v[r, j])))
    rest = bounds.lin(w, v[[0, 2, 4]])
    assert np.array_equal(val[[0, 2, 4]], rest[0]) and np.array_equal(mag[[0, 2, 4]], rest[1])


def test_left_products_magnitude_bounds_the_exact_sums():
    """``kernels.left_products(magnitude=)`` (the Keras equations' one pass over a stored kernel, issue #33): the
    float32 sum of ``|x| @ |K|`` raised by ``bounds.magnitude_bound32`` is never below the exact sum (fractions),
    on wide-ranging values and products below float32's normal range; ``None`` for float64 kernels."""
    from fractions import Fraction

    rng = np.random.default_rng(6)
    K, N = 150, 24
    k = (rng.standard_normal((K, N)) * 10.0 ** rng.integers(-3, 3, (K, N))).astype(np.float32)
    k[:, 1] = np.float32(1e-30)
    x = (rng.standard_normal((3, K)) * 10.0 ** rng.integers(-2, 2, (3, K))).astype(np.float32)
    x[1] = np.float32(1e-20)
    for kk in (k, np.clip(k, -6e4, 6e4).astype(np.float16)):
        val, s = kernels.left_products([x.astype(np.float64)], kk, rows=64, magnitude=np.abs(x))
        bound = bounds.magnitude_bound32(s, K)
        for a in range(x.shape[0]):
            for b in range(N):
                exact = sum(Fraction(abs(float(p))) * Fraction(abs(float(q))) for p, q in zip(x[a], kk[:, b]))
                assert Fraction(float(bound[a, b])) >= exact, (a, b)
    assert kernels.left_products([x.astype(np.float64)], k.astype(np.float64), magnitude=np.abs(x))[-1] is None
