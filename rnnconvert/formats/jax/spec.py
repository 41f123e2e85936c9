"""The JAX family's record: Flax linen/NNX parameter trees saved with ``flax.serialization`` (msgpack), read
by :mod:`.msgpack_read` (the ``msgpack`` package, no JAX) and written by :mod:`.msgpack_write` as linen cells;
a written file is run by the ``flax`` runtime (:mod:`rnnconvert.runtimes.flax`: Flax applies linen cells to
what ``flax.serialization.msgpack_restore`` reads), which also runs a linen source file for ``--verify framework``. Haiku parameter trees (``haiku``) are read by :mod:`.haiku_read`, Equinox leaf files (``equinox``) by
:mod:`.equinox_read`."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import equinox_read, haiku_read, msgpack_read, msgpack_write, orbax_read

FLAX_MSGPACK = FormatSpec(
    "flax_msgpack", read=msgpack_read.read, refusals=msgpack_write.refusals, check=msgpack_write.check,
    write=msgpack_write.write, runtime="flax", load=msgpack_write.load, route=msgpack_write.ROUTE, framework="flax")

#: Haiku parameter trees (``np.savez`` of ``<module>/<param>`` keys, or msgpack): a source format (no writer);
#: verification runs the written target against the numpy reference of Haiku's equations as read
HAIKU = FormatSpec("haiku", read=haiku_read.read, read_options=("cells",))

#: Equinox cells saved with ``eqx.tree_serialise_leaves`` (unnamed ``.npy`` leaves): a source format (no writer)
EQUINOX = FormatSpec("equinox", read=equinox_read.read, read_options=("cells",))

#: Orbax checkpoint folders of a Flax or Haiku parameter tree (arrays read by tensorstore): a source format
ORBAX = FormatSpec("orbax", read=orbax_read.read, read_options=("cells",))
