"""The PyTorch family's sniffer (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

from pathlib import Path


ZIP_MAGIC = b"PK\x03\x04"


def pt(head: bytes, path: Path) -> bool:
    """A zip whose member names look like ``torch.save`` / ``torch.jit.save`` output (``<archive>/data.pkl``),
    or a legacy (non-zip) ``torch.save`` file, which starts with the pickled magic number
    ``0x1950a86a20f9469cfc6c`` (``torch/serialization.py`` ``MAGIC_NUMBER``)."""
    if head.startswith(LEGACY_MAGIC):
        return True
    if not head.startswith(ZIP_MAGIC):
        return False
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()[:64])
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError):  # damaged zip
        return False


LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pickled torch magic number
