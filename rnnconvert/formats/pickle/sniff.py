"""The pickle family's sniffer (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

from pathlib import Path

#: the pickled magic number a legacy (non-zip) ``torch.save`` file starts with (``torch/serialization.py``
#: ``MAGIC_NUMBER``): those are ``.pt`` files, never claimed here
TORCH_LEGACY = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
#: file name endings of pickles that belong to another format (PaddlePaddle's ``paddle.save``)
OTHER_SUFFIXES = (".pdparams", ".pdopt", ".pdmodel", ".pt", ".pth")


def pickle(head: bytes, path: Path) -> bool:
    """A binary pickle (protocol 2 to 5: ``\\x80`` then the protocol byte, ``pickle.PROTO``) that is no legacy
    ``torch.save`` file and not named like another format's pickle (``.pdparams``, ``.pt``). Protocol 0/1
    pickles have no magic; they are read when named ``.pkl``/``.pickle`` (or ``--from pickle``)."""
    if len(head) < 3 or head[0] != 0x80 or not 2 <= head[1] <= 5:
        return False
    if head.startswith(TORCH_LEGACY):
        return False
    return not path.name.lower().endswith(OTHER_SUFFIXES)
