"""The checks every HDF5 route makes before reading a dataset: data comes from the file itself only, and
the walk over the file is bounded whatever its links declare.

Used by the Keras 2 reader (:mod:`rnnconvert.formats.keras.h5_read`, its whole-model re-read and its
isolated probe), the Keras 3 store reader (``.weights.h5``, and the store inside a ``.keras``), and the
plain HDF5 reader (:mod:`rnnconvert.formats.keras.plain_h5_read`): one function, :func:`check_file`, so no
route can forget a case (issue 29: the plain reader had copied ``/etc/passwd`` into DST through a dataset
with external raw storage).

Refused, naming the first object found:

* soft links and external links (``h5py.SoftLink``, ``h5py.ExternalLink``): a link is looked at, never
  followed;
* datasets with external raw storage (``create_dataset(external=[('/etc/passwd', 0, n)])``: the dataset
  creation property list's external file count) and virtual datasets (layout ``H5D_VIRTUAL``: a mapping of
  other files' datasets).

The walk visits each object once, by its address in the file (``H5Oget_info``): hard links may make any
number of paths to one group (40 groups each linking the next twice: 2^40 paths, 41 objects), and a
path-by-path walk never ends. Links looked at count against the ``names`` limit of
:mod:`rnnconvert.safety.budget`; groups nest at most :data:`MAX_DEPTH` deep.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import FormatError
from . import budget

MAX_DEPTH = 64


def outside(ds) -> str | None:
    """Why dataset ``ds`` reads bytes from outside its file (``'external raw storage'``, ``'a virtual
    dataset'``), else ``None``; judged from its creation property list, not from h5py's conveniences only."""
    import h5py

    plist = ds.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL or getattr(ds, "is_virtual", False):
        return "a virtual dataset (it maps datasets of other files)"
    if plist.get_external_count() > 0 or getattr(ds, "external", None):
        return "a dataset with external raw storage (its bytes live in another file)"
    return None


def check_file(f, where: object | None = None) -> None:
    """Refuse an open ``h5py.File`` (or group) ``f`` holding a soft or external link, a dataset with
    external storage or a virtual dataset anywhere below it; each object is visited once (by address).

    Raises:
        FormatError: the first such object, by path; groups nested deeper than :data:`MAX_DEPTH`.
        BudgetError: more links than the ``names`` limit.
    """
    import h5py

    where = where if where is not None else getattr(getattr(f, "file", f), "filename", "HDF5 file")
    links = budget.Counter(where, "names", "HDF5 links")
    seen: set[tuple[int, int]] = set()
    stack = [(f, "", 0)]

    def refuse(path: str, why: str) -> FormatError:
        return FormatError(f"{where}: refusing HDF5 file with links outside the file: {path or '/'} is {why}; "
                           "external links, external storage and virtual datasets are never followed")

    while stack:
        group, prefix, depth = stack.pop()
        info = h5py.h5o.get_info(group.id)
        key = (info.fileno, info.addr)
        if key in seen:
            continue
        seen.add(key)
        if depth > MAX_DEPTH:
            raise FormatError(f"{where}: HDF5 groups nested deeper than {MAX_DEPTH} levels at {prefix}")
        for name in group:
            links.tick()
            path = f"{prefix}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink):
                raise refuse(path, f"a soft link (to {link.path})")
            if isinstance(link, h5py.ExternalLink):
                raise refuse(path, f"an external link (to {link.filename}:{link.path})")
            obj = group.get(name)
            if isinstance(obj, h5py.Group):
                stack.append((obj, path, depth + 1))
            elif isinstance(obj, h5py.Dataset):
                oinfo = h5py.h5o.get_info(obj.id)
                if (oinfo.fileno, oinfo.addr) in seen:
                    continue
                seen.add((oinfo.fileno, oinfo.addr))
                why = outside(obj)
                if why:
                    raise refuse(path, why)


def check_dataset_size(ds, where: object) -> int:
    """The bytes dataset ``ds`` declares, after refusing a declaration the file cannot back: more than the
    ``expansion`` limit times the bytes it stores (``H5Dget_storage_size``, at most the file's size), above
    :data:`rnnconvert.safety.budget.EXPANSION_FLOOR`: a gzip-compressed dataset, or one with no storage at all
    (read as its fill value).

    Raises:
        BudgetError: past the ``expansion`` limit.
    """
    import numpy as np

    if ds.shape is None:
        return 0
    declared = int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
    try:
        fsize = Path(ds.file.filename).stat().st_size
    except OSError:
        fsize = 0
    stored = min(int(ds.id.get_storage_size()), fsize)
    kind = "compressed" if ds.compression else "chunked" if ds.chunks is not None else "contiguous"
    budget.check_expansion(where, declared, stored, f"{kind} dataset of shape {ds.shape}")
    return declared
