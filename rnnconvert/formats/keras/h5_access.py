"""HDF5 access, hardened, for every Keras HDF5 route (:mod:`.h5_read`, :mod:`.keras3`, :mod:`.keras_whole`,
:mod:`.h5_write`'s re-read): links and outside data refused (:mod:`rnnconvert.safety.hdf5_checks`), attributes and
datasets read within the budget, NaN/Inf refused; and the Keras interpreter's tensor source of an open file
(:class:`Hdf5Tensors`, stored tensors re-read on access: :class:`LazyRaw`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...core.model import placeholder
from ...errors import FormatError
from ...safety import budget, hdf5_checks
from ...speed import filerows


def check_links(f) -> None:
    """Refuse soft/external links and external or virtual datasets (they reach outside the file), each object
    visited once: :func:`rnnconvert.safety.hdf5_checks.check_file`, the check of every HDF5 route."""
    hdf5_checks.check_file(f)


def attr_list(group, name: str) -> list[str]:
    """Read a Keras string-list attribute, joining chunked ``name0, name1 ...`` attributes; at most the
    ``names`` limit of :mod:`rnnconvert.safety.budget` (checked from the attribute's shape before it is read);
    ``layer_names`` also within the ``layers`` limit, each layer listed once.

    Raises:
        BudgetError: more names (layers) than the limit.
        FormatError: a layer listed twice."""
    where = f"{group.file.filename}: attribute '{name}' of {group.name}"

    def bounded(count: int) -> None:
        budget.check_count(where, "names", count, "names")
        if name == "layer_names":  # each listed layer costs a walk: bounded before the list is read
            budget.check_count(where, "layers", count, "layers listed")

    if name in group.attrs:
        bounded(_attr_len(group, name))
        vals = list(group.attrs[name])
    else:
        vals, i = [], 0
        while f"{name}{i}" in group.attrs:
            bounded(len(vals) + _attr_len(group, f"{name}{i}"))
            vals.extend(group.attrs[f"{name}{i}"])
            i += 1
    out = [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in vals]
    if name == "layer_names" and len(set(out)) != len(out):
        twice = next(n for i, n in enumerate(out) if n in out[:i])
        raise FormatError(f"{where}: layer '{twice}' is listed more than once; refused (each layer is saved once)")
    return out


def _attr_len(group, name: str) -> int:
    """The number of values of attribute ``name`` from its dataspace, without reading them."""
    import h5py

    try:
        shape = h5py.h5a.open(group.id, name.encode()).shape
    except (KeyError, OSError, RuntimeError, ValueError):
        return 0
    n = 1
    for d in shape or ():
        n *= int(d)
    return n


def attr_str(obj, name: str) -> str | None:
    v = obj.attrs.get(name)
    if v is None:
        return None
    return v.decode("utf8") if isinstance(v, bytes) else str(v)


def dataset_meta(ds, where: str) -> np.ndarray:
    """A :func:`~rnnconvert.core.model.placeholder` of a dataset's shape and dtype, after the checks that need
    no data: a dataset, floating point, a shape the file can hold (no promise of more bytes than it has)."""
    import h5py

    if not isinstance(ds, h5py.Dataset):
        raise FormatError(f"{where}: expected a dataset, found a {type(ds).__name__}")
    if ds.dtype.kind != "f":
        raise FormatError(f"{where}: weights must be floating point, found dtype {ds.dtype}")
    nbytes = int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
    fsize = Path(ds.file.filename).stat().st_size
    if nbytes > 64 * fsize + (1 << 20) and ds.compression is None:
        raise FormatError(f"{where}: declared shape {ds.shape} needs {nbytes} bytes, the file has {fsize}")
    if ds.chunks is not None or ds.compression is not None:  # filtered or sparse: judge by the bytes stored
        budget.check_expansion(where, nbytes, min(ds.id.get_storage_size(), fsize),
                               f"{'compressed' if ds.compression else 'chunked'} dataset of shape {ds.shape}")
    return placeholder(ds.shape, ds.dtype)


def read_dataset(ds, where: str, out: np.ndarray | None = None) -> np.ndarray:
    """Read a dataset fully (into ``out`` when its shape and dtype fit) after ``_dataset_meta``'s
    checks. NaN/Inf is not looked for here: the recurrent tensors are checked by the conversion's own read
    (:func:`rnnconvert.conventions.keras_interpreter.convert_direction`, block by block, naming the stored tensor), every tensor a
    reader keeps by :func:`rnnconvert.api.check_finite`; a re-read (verification, the whole-model writer)
    reads bytes those checks passed."""
    dataset_meta(ds, where)
    if ds.shape is None or ds.size == 0:
        arr = np.asarray(ds[()])
    else:
        fits = out is not None and out.shape == ds.shape and out.dtype == ds.dtype and out.flags.c_contiguous
        arr = out if fits else np.empty(ds.shape, ds.dtype)
        ds.read_direct(arr)
    return arr


def _read_concat(path: str, locations: tuple[str, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Keras 1 per-gate datasets ``locations`` read and joined along their last axis (LazyRaw loader;
    ``out`` is not used: Keras 1 layers are small)."""
    import h5py

    with h5py.File(path, "r") as f:
        return np.concatenate([read_dataset(f[loc], f"{path}: {loc}") for loc in locations], axis=-1)


class LazyRaw(Mapping):
    """A direction's Keras tensors as stored in the HDF5 file (``kernel``, ``recurrent_kernel``, ``bias``),
    re-read from the file on each access instead of held in memory: a plain record of the file and the
    datasets' locations (``joined``: Keras 1 per-gate datasets, a tuple of locations per key, read and
    joined by :func:`_read_concat`), no reading function stored (the TF2 checkpoint reader's counterpart is
    ``rnnconvert.formats.tf.tensors.BundleRaw``).

    The reader keeps only the canonical copy of the weights; verification reads the file's own tensors
    again through this mapping. Holding both would double the memory of a multi-GB checkpoint
    (docs/performance.md, "Large checkpoints"). The
    :class:`~rnnconvert.conventions.keras_interpreter.StoredTensors` of an HDF5 file.
    """

    def __init__(self, path: str, locations: dict[str, Any], joined: bool = False):
        self.path, self.locations, self.joined = path, dict(locations), joined

    def __getitem__(self, key: str) -> np.ndarray:
        return self.read(key)

    def __iter__(self):
        return iter(self.locations)

    def __len__(self) -> int:
        return len(self.locations)

    def read(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor ``key``; read into ``out`` when it has the dataset's shape and dtype (verification
        reuses one layer's buffers for the next: a fresh multi-MB array costs its first-touch page faults,
        which made re-reading the 3 GB benchmark file 16x slower than the conversion's reads)."""
        import h5py

        loc = self.locations[key]
        if self.joined:
            return _read_concat(self.path, loc)
        with h5py.File(self.path, "r") as f:
            ds = f[loc]
            offset = plain_offset(ds)
            if offset is not None and ds.dtype.kind == "f":
                # a read-only map of the file's bytes: the products read the page cache in place, with no copy
                # (the 3 GB benchmark model: 1.2 s of copying saved). Not checked for NaN/Inf again: the
                # conversion's reader refused them in these very bytes, and a non-finite value would fail
                # the comparison anyway.
                return np.memmap(self.path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
            return read_dataset(ds, f"{self.path}: {loc}", out)


class Hdf5Tensors:
    """The :class:`~rnnconvert.conventions.keras_interpreter.TensorSource` of an open HDF5 file ``f`` (locations: dataset paths): values
    read now with :func:`read_dataset`, stored tensors as :class:`LazyRaw` (Keras 1 per-gate tensors
    joined by :func:`_read_concat`)."""

    def __init__(self, f, path: str):
        self.file, self.path = f, path

    def value(self, location: str) -> np.ndarray:
        return read_dataset(self.file[location], f"{self.path}: {location}")

    def stored(self, locations: Mapping[str, Any]) -> LazyRaw:
        joined = any(isinstance(v, tuple) for v in locations.values())
        return LazyRaw(self.path, dict(locations), joined)


def plain_offset(src: Any) -> int | None:
    """The file offset of a large 2-D HDF5 dataset stored as one plain array (contiguous layout, no filters,
    native byte order, default file driver; ``H5Dget_offset``), else ``None``."""
    import h5py


    if not isinstance(src, h5py.Dataset) or src.ndim != 2 or src.chunks is not None or src.compression is not None:
        return None
    if not src.dtype.isnative or src.size * src.dtype.itemsize < filerows.DIRECT_MIN_BYTES:
        return None
    offset = src.id.get_offset()
    if offset is None or src.file.driver != "sec2":
        return None
    if offset + src.size * src.dtype.itemsize > Path(src.file.filename).stat().st_size:
        return None  # h5py then reports what is wrong
    return int(offset)


def direct(src: Any) -> Any:
    """``src``, or for a plain dataset (:func:`plain_offset`) a :class:`.filerows.FileRows` reading its bytes
    straight from the file (speed/filerows.py: about half the kernel time of h5py's ``read_direct``)."""

    offset = plain_offset(src)
    if offset is None:
        return src
    try:
        return filerows.FileRows(src.file.filename, offset, src.shape, src.dtype)
    except (OSError, ValueError):
        return src  # h5py then reports what is wrong
