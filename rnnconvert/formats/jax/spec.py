"""The JAX family's record: Flax linen/NNX parameter trees saved with ``flax.serialization`` (msgpack), read
by :mod:`.msgpack_read` (the ``msgpack`` package, no JAX). A source format here: no writer yet, so no runtime
of its own (verification runs the written target against the numpy reference of the layers as read)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import msgpack_read

FLAX_MSGPACK = FormatSpec("flax_msgpack", read=msgpack_read.read)
