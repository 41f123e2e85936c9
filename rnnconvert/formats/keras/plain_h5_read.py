"""Every numeric dataset of an HDF5 file that no Keras reader claims, for the foreign-name table
(:mod:`rnnconvert.core.names`): ``{path inside the file: array}``, nothing else interpreted.

Read in the isolated child of :mod:`rnnconvert.safety.guard` (libhdf5 can loop on a damaged file); only hard
links are followed, each object once (``h5py`` ``visititems``); soft and external links, external raw storage and
virtual datasets are refused (:func:`rnnconvert.safety.hdf5_checks.check_file`, as on every HDF5 route); the count
and total size of the datasets are bounded, and each dataset's declared bytes against what it stores (the
``expansion`` limit of :mod:`rnnconvert.safety.budget`), whatever the file declares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import FormatError
from ...safety import hdf5_checks

MAX_DATASETS = 4096
MAX_BYTES = 1 << 31


def _read(path: str) -> dict[str, np.ndarray]:
    import h5py

    out: dict[str, np.ndarray] = {}
    total = 0
    with h5py.File(path, "r") as f:
        # links, external storage, virtual datasets refused; each object visited once (a DAG of hard links)
        hdf5_checks.check_file(f, path)
        found: list[str] = []

        def visit(name: str, obj) -> None:  # H5Ovisit: one name per object, however many links reach it
            if isinstance(obj, h5py.Dataset):
                found.append(name)
                if len(found) > MAX_DATASETS:
                    raise FormatError(f"{path}: more than {MAX_DATASETS} datasets; refused")

        f.visititems(visit)
        for name in found:
            ds = f[name]
            if ds.dtype.kind not in "fiub" or ds.shape is None:
                continue
            total += hdf5_checks.check_dataset_size(ds, f"{path}: {name}")
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
