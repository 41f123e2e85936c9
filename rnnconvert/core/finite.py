"""The one NaN/Inf test of rnnconvert (:func:`all_finite`), used by :func:`rnnconvert.api.check_finite` and by
every reader that checks tensors as it reads them (``keras_h5``, ``tf_checkpoint``, ``tf_framework``).

A neutral module (numpy only), so that format modules need not import :mod:`rnnconvert.api`.
"""

from __future__ import annotations

import numpy as np

#: IEEE 754 binary16 exponent field: all ones <=> Inf or NaN (IEEE 754-2008 §3.4; numpy ``finfo(float16)``).
_F16_EXP = 0x7C00


def all_finite(a, block_bytes: int = 16 << 20) -> bool:
    """Whether ``a`` (any array-like) holds no NaN/Inf; always true for non-float dtypes (integers, bool,
    strings). Checked ``block_bytes`` at a time, so that no full-size mask is allocated.

    float16 is tested on its bits, not with ``np.isfinite`` (which widens every element to float32 and
    is about 10x slower): a binary16 value is NaN or +-Inf exactly when its 5 exponent bits are all ones,
    ``bits & 0x7C00 == 0x7C00``. float32/float64 (and complex) use ``np.isfinite``, which numpy
    vectorizes and which measured as fast as the bit test there (docs/performance.md, Session 3).
    Contiguous arrays are viewed, never copied; any other array is checked in slabs along its first axis,
    each slab copied (at most about ``block_bytes`` at a time, one row at least). 16 MiB pieces (a mask of 4 MB
    for float32): each piece releases and retakes the GIL twice, which beside a thread holding it costs up to a
    switch interval each (1 MiB pieces were most of such waits of a streamed read: docs/performance.md, session 13).
    """
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return True
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        if a.ndim == 1:
            step = max(1, block_bytes // a.itemsize)
        else:
            step = max(1, block_bytes // max(1, a[0].nbytes))
        return all(all_finite(np.ascontiguousarray(a[i:i + step]), block_bytes) for i in range(0, a.shape[0], step))
    flat = np.ravel(a, order="K")  # a view: the array is contiguous
    step = max(1, block_bytes // a.itemsize)
    if a.dtype.kind == "f" and a.itemsize == 2:
        bits = flat.view(a.dtype.str.replace("f", "u"))  # same byte order
        buf = np.empty(min(step, flat.size), bits.dtype)
        exp = bits.dtype.type(_F16_EXP)
        for i in range(0, flat.size, step):
            part = bits[i:i + step]
            masked = np.bitwise_and(part, exp, out=buf[:part.size])
            if masked.max() == exp:  # the masked value is <= exp, equal only with all exponent bits set
                return False
        return True
    mask = np.empty(min(step, flat.size), bool)
    for i in range(0, flat.size, step):
        part = flat[i:i + step]
        if not np.isfinite(part, out=mask[:part.size]).all():
            return False
    return True
