"""Read Haiku parameter trees (``hk.transform(f).init``) saved as users save them: ``np.savez`` of the tree
flattened to ``<module>/<param>`` keys (``lstm/linear/w``), or ``flax.serialization.to_bytes(params)``
(msgpack; a ``.msgpack`` file is detected as ``flax_msgpack``, whose reader hands a Haiku-shaped tree here).
A pickled tree is the pickle family's (allow-list unpickler), read by the same convention.

The cores and their equations (``hk.LSTM`` gates ``i g f o`` with a run-time forget bias of 1, ``hk.GRU``'s
inverted update gate, ``hk.VanillaRNN``'s ReLU) are :mod:`rnnconvert.conventions.haiku_params`; no JAX or Haiku
is needed. ``.npz`` members are read with ``np.load(allow_pickle=False)`` after every ``.npy`` header is checked
against the bytes the member holds (a forged shape allocates nothing) and the archive against the budget
(``safety/budget.zip_members``).
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import haiku_params
from ...core.model import Checkpoint
from ...errors import FormatError
from ...safety import budget
from . import msgpack_read

#: the most members of a Haiku ``.npz`` read (a network's parameters are far fewer)
MAX_MEMBERS = 65536


def npz_arrays(p: Path) -> dict[str, np.ndarray]:
    """The ``.npz``'s arrays by member name (``.npy`` dropped), without pickle.

    Raises:
        FormatError: not a zip of ``.npy`` members, a member declaring more bytes than it holds, damage.
        BudgetError: member count, duplicate names, expansion (``safety/budget.zip_members``)."""
    try:
        with zipfile.ZipFile(p) as zf:
            infos = zf.infolist()
            budget.check_count(p, "names", len(infos), "members")
            if len(infos) > MAX_MEMBERS:
                raise FormatError(f"{p}: {len(infos)} members; refused")
            budget.zip_members(p, infos)
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise FormatError(f"{p}: member '{info.filename[:60]}' is not a .npy array")
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(fh)
                    if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
                        raise FormatError(f"{p}: member '{info.filename[:60]}' declares shape {shape} but holds "
                                          f"{info.file_size} bytes")
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error) as exc:
        raise FormatError(f"{p}: not readable as .npz without pickle: {str(exc)[:100]}") from None


def read(path: str | Path, cells: Any = None) -> Checkpoint:
    """Read every Haiku recurrent core of a ``.npz`` or msgpack parameter file (module docstring).

    Args:
        cells: cores under names other than Haiku's defaults, ``"MODULE:lstm|gru|vanilla_rnn,..."``
            (the read option ``--read-opt cells=...``).

    Returns:
        :func:`rnnconvert.conventions.haiku_params.read`'s layers (format ``haiku``).

    Raises:
        FormatError: unreadable, not a two-level Haiku tree, no core found (naming ``cells``), shapes that fit
        no core. OptionError: a bad ``cells``.
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    with open(p, "rb") as fh:
        head = fh.read(4)
    if head.startswith(b"PK\x03\x04"):
        tree = haiku_params.modules(npz_arrays(p))
        if tree is None:
            raise FormatError(f"{p}: member names without a module part; a Haiku .npz holds "
                              "<module>/<param> keys (np.savez of the flattened params)")
    else:
        tree = msgpack_read.load_tree(p, set())
        if not haiku_params.two_levels(tree):
            raise FormatError(f"{p}: not a Haiku parameter tree ({{module: {{param: array}}}})")
    return haiku_params.read(tree, str(p), "haiku", cells)

