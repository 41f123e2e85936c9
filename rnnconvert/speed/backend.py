"""The one switch of the fast paths (docs/performance.md): ``RNNCONVERT_SPEED=plain`` turns every speed-only
mechanism of :mod:`rnnconvert.speed` off -- ``O_DIRECT`` output (:mod:`.directio`: buffered writes), read-ahead
threads (:mod:`.prefetch`), ISA-L's CRC-32 (:mod:`.crc32`: zlib's), the tiled transpose (:mod:`.transpose`:
``np.ascontiguousarray``) and verification's blocked products (:mod:`.kernels`: the plain numpy products of
:mod:`rnnconvert.core.reference`). The bytes written and the verdicts are the same either way: the suite runs
conversions both ways and compares them (``tests/performance/test_speed_backend.py``). Read once, when a module asks.
"""

from __future__ import annotations


#: the environment variable, and its values: ``fast`` (default) or ``plain``
VARIABLE = "RNNCONVERT_SPEED"


def plain() -> bool:
    """Whether the plain fallback is asked for (``RNNCONVERT_SPEED=plain``)."""
    from ..process import settings

    return settings.value(VARIABLE) == "plain"
