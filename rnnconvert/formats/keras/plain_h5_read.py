"""Every numeric dataset of an HDF5 file that no Keras reader claims, for the foreign-name table
(:mod:`rnnconvert.core.names`): ``{path inside the file: array}``, nothing else interpreted.

Read in the isolated child of :mod:`rnnconvert.guard` (libhdf5 can loop on a damaged file); only hard
links are followed (``h5py`` ``visititems``), soft and external links are refused, and the count and total
size of the datasets are bounded whatever the file declares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import FormatError

MAX_DATASETS = 4096
MAX_BYTES = 1 << 31


def _read(path: str) -> dict[str, np.ndarray]:
    import h5py

    out: dict[str, np.ndarray] = {}
    total = 0
    with h5py.File(path, "r") as f:
        found, bad = [], []

        def visit(name: str, link) -> None:
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                bad.append(name)
            elif isinstance(f.get(name), h5py.Dataset):
                found.append(name)

        f.visititems_links(visit)  # links themselves: a soft or external link is never followed
        if bad:
            raise FormatError(f"{path}: soft or external links ({', '.join(bad[:3])}); refused")
        if len(found) > MAX_DATASETS:
            raise FormatError(f"{path}: {len(found)} datasets; refused (at most {MAX_DATASETS})")
        for name in found:
            ds = f[name]
            if ds.dtype.kind not in "fiub" or ds.shape is None:
                continue
            total += int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
            if total > MAX_BYTES:
                raise FormatError(f"{path}: datasets declare more than {MAX_BYTES >> 30} GiB; refused")
            out[name] = np.asarray(ds[()])
    return out


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """The numeric datasets of ``path`` by their path inside the file (``group/sub/name``).

    Raises:
        FormatError: damaged file, links out of the file, too many or too large datasets.
    """
    from ...safety import guard

    try:
        return guard.isolated(_read, (str(path),), path, "HDF5")
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise FormatError(f"{path}: damaged HDF5 file ({exc})") from exc
