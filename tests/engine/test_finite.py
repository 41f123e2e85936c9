"""rnnconvert.core.finite.all_finite (the one NaN/Inf test of every reader) against numpy's ``np.isfinite(a).all()``
as the oracle: special values (NaN with any payload, +-Inf, largest finite, subnormals, -0.0) in float16/32/64,
in any memory layout and byte order, across block boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.core.finite import all_finite

DTYPES = [np.float16, np.float32, np.float64]


def _specials(dt) -> list:
    fi = np.finfo(dt)
    bits = np.dtype(dt).str.replace("f", "u")
    nbits = 8 * np.dtype(dt).itemsize
    exp_ones = int(np.array(np.inf, dt).view(bits))  # exponent all ones, zero mantissa
    nan_payload = np.array([exp_ones | 1, exp_ones | (1 << (fi.nmant - 1)), (1 << nbits) - 1], bits).view(dt)
    return [np.nan, np.inf, -np.inf, *nan_payload]


def _finite_values(dt) -> list:
    fi = np.finfo(dt)
    return [fi.max, -fi.max, fi.smallest_subnormal, -fi.smallest_subnormal, fi.smallest_normal, -0.0, 0.0,
            np.nextafter(fi.max, 0, dtype=dt)]


def _oracle(a) -> bool:
    return bool(np.isfinite(a).all())


@pytest.mark.parametrize("dt", DTYPES)
def test_against_numpy(dt):
    rng = np.random.default_rng(7)
    fin = np.array(_finite_values(dt), dt)
    base = rng.standard_normal(5000).astype(dt)
    base[rng.integers(0, base.size, 40)] = rng.choice(fin, 40)
    assert all_finite(base, block_bytes=256) is True and _oracle(base)
    for bad in _specials(dt):
        for pos in (0, 127, 128, 129, base.size - 1):  # first element, around a block edge, last element
            a = base.copy()
            a[pos] = np.array(bad, dt)
            for bb in (256, 1 << 20):
                assert all_finite(a, block_bytes=bb) == _oracle(a) is False
            assert api.all_finite(a) is False  # the same function, re-exported


@pytest.mark.parametrize("dt", DTYPES)
def test_layouts_and_byte_orders(dt):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((37, 53)).astype(dt)
    views = {"C": m, "F": np.asfortranarray(m), "T": m.T, "strided": m[::2, ::3], "rows": m[:, :50],
             "big-endian": m.astype(np.dtype(dt).newbyteorder(">")), "0-d": m[3, 4],
             "3-D": m.reshape(1, 37, 53)[:, ::-1]}
    for name, v in views.items():
        assert all_finite(v, block_bytes=64) == _oracle(v) is True, name
        w = np.array(v, copy=True, order="K")
        w.flat[w.size // 2] = np.inf if w.size % 2 else np.nan
        assert all_finite(w, block_bytes=64) == _oracle(w) is False, name
    # non-contiguous views that hold the bad value
    m2 = m.copy()
    m2[10, 6] = -np.inf
    for v in (m2[::2, ::3], m2[:, :50], m2.T[::-1], m2[10:11, ::2]):
        assert all_finite(v, block_bytes=64) == _oracle(v) is False
    assert all_finite(m2[::2, 1::3], block_bytes=64) == _oracle(m2[::2, 1::3]) is True  # skips [10, 6]


def test_other_dtypes_and_empty():
    assert all_finite(np.array([1, 2, 3])) and all_finite(np.array([True])) and all_finite(np.array([b"x"]))
    assert all_finite(np.zeros((0, 5), np.float16))
    c = np.array([1 + 1j, complex(0, np.inf)])
    assert all_finite(c) == _oracle(c) is False
