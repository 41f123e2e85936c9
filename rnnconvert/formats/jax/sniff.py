"""The JAX family's sniffer (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

from pathlib import Path


def flax_msgpack(head: bytes, path: Path) -> bool:
    """A ``.msgpack`` file whose first byte opens a msgpack map (fixmap ``0x80-0x8f``, map16 ``0xde``, map32
    ``0xdf``): what ``flax.serialization.to_bytes`` of a parameter dict starts with. msgpack has no magic, so
    the name ending is required."""
    return path.name.lower().endswith(".msgpack") and len(head) >= 1 and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF))
