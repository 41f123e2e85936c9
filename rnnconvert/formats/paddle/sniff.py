"""The PaddlePaddle sniffer: a ``.pdparams`` file starting with a pickle protocol header (``\\x80`` 2..5), not a
legacy ``torch.save`` file (those start with torch's pickled magic number). Light: the name and the head only."""

from __future__ import annotations

from pathlib import Path

#: torch's legacy magic number, pickled (``torch/serialization.py`` ``MAGIC_NUMBER``)
TORCH_LEGACY = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def paddle(head: bytes, path: Path) -> bool:
    """A ``*.pdparams`` pickle (protocol 2 to 5)."""
    return (path.name.lower().endswith(".pdparams") and len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
            and not head.startswith(TORCH_LEGACY))
