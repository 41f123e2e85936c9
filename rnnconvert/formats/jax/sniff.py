"""The JAX family's sniffers (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from ...conventions import haiku_names


def flax_msgpack(head: bytes, path: Path) -> bool:
    """A ``.msgpack`` file whose first byte opens a msgpack map (fixmap ``0x80-0x8f``, map16 ``0xde``, map32
    ``0xdf``): what ``flax.serialization.to_bytes`` of a parameter dict starts with. msgpack has no magic, so
    the name ending is required."""
    return path.name.lower().endswith(".msgpack") and len(head) >= 1 and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF))


#: the most ``.npz`` members the Haiku sniffer looks at
MAX_MEMBERS = 65536


def haiku(head: bytes, path: Path) -> bool:
    """An ``.npz`` (zip of ``.npy`` members) of ``<module>/<param>`` names holding a Haiku recurrent core by
    Haiku's names (:func:`rnnconvert.conventions.haiku_names.cores`: ``w_i``/``w_h``/``b``, ``lstm*/linear``,
    ``vanilla_rnn*/linear(_1)``), without rnnconvert's own archive markers; the names alone decide (no array is
    read). Haiku trees in msgpack are the ``flax_msgpack`` format's (its reader hands them to Haiku's convention)."""
    if not head.startswith(b"PK\x03\x04"):
        return False
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    if len(names) > MAX_MEMBERS or not all(n.endswith(".npy") for n in names):
        return False
    tree: dict[str, set[str]] = {}
    for n in names:
        key = n[:-4]
        if key in ("__rnnconvert__", "__cudnn_spec__") or "/" not in key:
            return False
        module, _, param = key.rpartition("/")
        tree.setdefault(module, set()).add(param)
    return bool(haiku_names.cores(tree))


def equinox(head: bytes, path: Path) -> bool:
    """A file named ``*.eqx`` that opens with a ``.npy`` record (``\\x93NUMPY``), or any file holding more than one
    record back to back: what ``eqx.tree_serialise_leaves`` writes (one record per leaf). A plain ``.npy`` (one
    array: ``np.save``'s, an input) is not claimed; only the first record's header is read."""
    if not head.startswith(b"\x93NUMPY") or len(head) < 10:
        return False
    if path.name.lower().endswith(".eqx"):
        return True
    wide = head[6] >= 2
    with open(path, "rb") as fh:
        fh.seek(12 if wide else 10)
        hlen = int.from_bytes(head[8:12] if wide else head[8:10], "little")
        if hlen > 1 << 16:
            return False
        header = ast.literal_eval(fh.read(hlen).decode("latin1"))
    n = 1
    for d in header["shape"]:
        n *= int(d)
    item = str(header["descr"]).lstrip("<>|=")[1:]  # '<f4' -> 4: plain number dtypes
    if not item.isdigit():
        return True  # not a plain number record: the reader says so
    end = (12 if wide else 10) + hlen + n * int(item)
    return path.stat().st_size > end


def orbax(head: bytes, path: Path) -> bool:
    """A folder holding Orbax's ``_METADATA`` (a PyTree checkpoint), or a step folder whose one item sub-folder
    does (``<step>/default/_METADATA``, with ``_CHECKPOINT_METADATA`` beside it)."""
    if not path.is_dir():
        return False
    if (path / "_METADATA").is_file():
        return True
    return (path / "_CHECKPOINT_METADATA").is_file() and any(
        (d / "_METADATA").is_file() for d in sorted(path.iterdir())[:64] if d.is_dir())
