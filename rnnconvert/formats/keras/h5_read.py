"""Keras HDF5 files (``.h5``, ``.hdf5``, ``.keras`` of Keras 2): reader (writer: :mod:`.keras_h5_write`).

This module is the HDF5 container (h5py access hardened against hostile files, the isolated child of
:mod:`rnnconvert.safety.guard`, lazy loading, the stored tensors re-read for verification); what the
layers mean is decided by the Keras interpreter, :mod:`.interpreter`, which reads the file's tensors
through :class:`Hdf5Tensors`.

Dialects read (``docs/LAYOUTS.md`` §§1-4; tf_keras ``saving/legacy/hdf5_format.py``):

* full-model files (root ``@model_config`` + group ``model_weights``) and weights-only files
  (``@layer_names`` at the root); ``layer_names0, layer_names1 ...`` chunked attributes;
* Keras 1 (12-tensor LSTM saved i, c, f, o; 9-tensor GRU z, r, h; no ``keras_version`` on the
  weights group), standalone Keras 2.0-2.3, tf.keras / tf_keras (``lstm/lstm_cell/kernel:0``);
* nested ``Sequential``/``Model``, ``Bidirectional`` (forward half of the weights first),
  ``TimeDistributed``;
* Keras 1 3-tensor layers (``lstm_1_W``, ``lstm_1_U``, ``lstm_1_b``: LSTM ``consume_less='gpu'``,
  SimpleRNN; Dense ``dense_1_W``/``dense_1_b``), recognised by name in weights-only files;
* ``keras.layers.RNN`` around ``LSTMCell``/``GRUCell``/``SimpleRNNCell`` (read as the matching layer);
* ``LSTM``, ``GRU`` (``reset_after`` True/False; absent key = False), ``SimpleRNN``,
  ``CuDNNLSTM``/``CuDNNGRU`` (kernel slices hold cuDNN's row-major ``(H, in)`` bytes; bias
  ``(2*G*H,)``), ``use_bias=False``.

Lazy reading (``read(path, lazy=True)``, streaming conversion): the structure with placeholder
parameters and a slab source (:class:`H5Slabs`) reading one layer's datasets in row blocks (docs/keras.md "Reading lazily").

Weights are matched by group and order, never by the names stored inside a group (real files
put them under another prefix, e.g. textgenrnn's ``rnn_1/rnn_1_2/kernel:0``).

Semantics come from the layer config; for weights-only files from the defaults of the
``keras_version`` that wrote the file (``recurrent_activation='hard_sigmoid'`` through Keras 2.2.5
and in TF1 tf.keras; ``sigmoid`` from standalone 2.3.0 and in TF2 tf.keras). CuDNN layers are
always sigmoid/tanh.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import budget, guard, hdf5_checks
from ...speed import filerows
from ...speed.pool import ArrayPool
from ...errors import FormatError
from ...core.model import Checkpoint, DirectionParams, placeholder
from ...conventions.keras_interpreter import (
    DirSpec,
    Interpreter,
    LayerEntry,
    StoredTensors,
    convert_direction,
    index_configs,
)
from .sniff import hdf5_dialect


# --------------------------------------------------------------------------------------------
# HDF5 access, hardened
# --------------------------------------------------------------------------------------------

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


def _dataset_meta(ds, where: str) -> np.ndarray:
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
    """Read a dataset fully (into ``out`` when its shape and dtype fit) after :func:`_dataset_meta`'s
    checks. NaN/Inf is not looked for here: the recurrent tensors are checked by the conversion's own read
    (:func:`.interpreter.convert_direction`, block by block, naming the stored tensor), every tensor a
    reader keeps by :func:`rnnconvert.api.check_finite`; a re-read (verification, the whole-model writer)
    reads bytes those checks passed."""
    _dataset_meta(ds, where)
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


class LazyRaw(StoredTensors):
    """A direction's Keras tensors as stored in the HDF5 file (``kernel``, ``recurrent_kernel``, ``bias``),
    re-read from the file on each access instead of held in memory: a plain record of the file and the
    datasets' locations (``joined``: Keras 1 per-gate datasets, a tuple of locations per key, read and
    joined by :func:`_read_concat`), no reading function stored (the TF2 checkpoint reader's counterpart is
    ``tf_checkpoint.BundleRaw``).

    The reader keeps only the canonical copy of the weights; verification reads the file's own tensors
    again through this mapping. Holding both would double the memory of a multi-GB checkpoint
    (docs/performance.md, "Large checkpoints").
    """

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
    """The :class:`~.interpreter.TensorSource` of an open HDF5 file ``f`` (locations: dataset paths): values
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


def _direct(src: Any) -> Any:
    """``src``, or for a plain dataset (:func:`plain_offset`) a :class:`.filerows.FileRows` reading its bytes
    straight from the file (speed/filerows.py: about half the kernel time of h5py's ``read_direct``)."""

    offset = plain_offset(src)
    if offset is None:
        return src
    try:
        return filerows.FileRows(src.file.filename, offset, src.shape, src.dtype)
    except (OSError, ValueError):
        return src  # h5py then reports what is wrong




#: The reader can return a lazy checkpoint (streaming conversion, :func:`read` with ``lazy=True``).
LAZY = True


def read(path: str | Path, *, gate_activation: str | None = None, lazy: bool = False, **_: Any) -> Checkpoint:
    """Read a Keras 1/2 HDF5 file into a :class:`~rnnconvert.core.model.Checkpoint`.

    Args:
        path: the ``.h5``/``.hdf5`` file (full model or weights only).
        gate_activation: override the LSTM/GRU gate activation (``'sigmoid'`` or ``'hard_sigmoid'``)
            when a weights-only file cannot tell.
        lazy: return the structure only (layers, semantics, ``source`` provenance with the
            :class:`LazyRaw` tensor maps, Dense/Embedding tensors) with
            :func:`~rnnconvert.core.model.placeholder` parameters, and ``ckpt.source`` (:class:`H5Slabs`) reading layer
            ``i``'s datasets (both directions of a Bidirectional: one slab) when asked. ``False``: the same,
            every slab loaded before returning (one code path).

    Returns:
        the recurrent layers in file order (canonical form: gate order i,f,g,o / r,z,n, ``W (G*H, in)``,
        dtype as stored) and other layers' tensors (Dense/Embedding in PyTorch naming).

    Raises:
        FormatError: not HDF5, not a Keras file, links outside the file, damaged tensors, NaN/Inf,
            libhdf5 looping past the deadline or crashing (see :mod:`rnnconvert.safety.guard`).
        UnsupportedError: an activation or wrapper rnnconvert cannot represent.

    Isolation (:mod:`rnnconvert.safety.guard`): an eager read of a file up to :data:`FULL_ISOLATION_MAX` runs
    wholly in the forked child. Otherwise (a large file, or ``lazy=True``) the child first walks every
    object header, attribute and chunk index (:func:`probe_path`: where libhdf5's loops live), and this
    process then reads the metadata again and the data (the slab source: contiguous extents the probe has seen
    described, or chunks whose index it has walked).
    """
    d = hdf5_dialect(path) if Path(path).exists() else ""
    if d.startswith("damaged:"):
        raise FormatError(d[len("damaged:"):])
    if d == "other":  # not Keras: the owner's own dataset names (rnnconvert.core.names, docs/foreign-names.md)
        from ...core import names
        from .plain_h5_read import read_tensors

        return names.fallback(read_tensors(path), str(path), "keras_h5", _)
    if not lazy and Path(path).stat().st_size <= FULL_ISOLATION_MAX:
        return guard.isolated(_read_path, (str(path), gate_activation, False), path, "HDF5")
    # A large file would travel back through a pipe (a second copy of every weight), and a lazy
    # checkpoint's slab source reads here: the child probes, this process reads.
    guard.isolated(probe_path, (str(path),), path, "HDF5")
    return _read_path(str(path), gate_activation, lazy)


#: Files up to this size are read wholly in the isolated child (see :mod:`rnnconvert.safety.guard`).
FULL_ISOLATION_MAX = 64 << 20


def probe_path(path: str) -> None:
    """Open ``path`` and touch every group, dataset header, attribute and chunk index (runs in the
    isolated child)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            check_links(f)
            for g in (f, f.get("model_weights")):  # name lists bounded here, within the deadline
                if isinstance(g, h5py.Group):
                    attr_list(g, "layer_names")

            def touch(_name, obj):
                for key in obj.attrs:
                    obj.attrs[key]
                if isinstance(obj, h5py.Dataset):
                    obj.shape, obj.dtype, obj.chunks  # noqa: B018
                    if obj.chunks is not None and hasattr(obj.id, "get_num_chunks"):
                        obj.id.get_num_chunks()  # walks the chunk B-tree the data reads will use

            f.visititems(touch)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FormatError(f"{path}: damaged HDF5 file ({first})") from exc


def _damaged(path: str, exc: Exception) -> FormatError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return FormatError(f"{path}: damaged HDF5 file ({first})")


def _read_path(path: str, gate_activation: str | None, lazy: bool = False) -> Checkpoint:
    """The skeleton of ``path`` and its slab source (:func:`read`); materialized unless ``lazy`` (an eager read
    of a small file runs all of this in the isolated child of :func:`rnnconvert.safety.guard.isolated`)."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise FormatError(f"{path}: not a readable HDF5 file ({exc})") from exc
    with f:
        try:
            rd = _read_file(f, path, gate_activation)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:  # h5py on damaged B-trees, heaps
            raise _damaged(path, exc) from exc
    ckpt = replace(rd.ckpt, source=H5Slabs(path, rd.layer_specs()))
    return ckpt if lazy else ckpt.materialize()


class H5Slabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a Keras HDF5 file: ``read(i, 0)`` = layer ``i``'s
    directions read from ``path`` (one ``h5py.File`` open per slab, datasets read in row blocks straight
    into the canonical arrays); ``release`` gives the slab's arrays that nothing holds any more to the next
    slab (:class:`~rnnconvert.speed.pool.ArrayPool`: no fresh pages per slab); ``release_array`` does nothing."""

    def __init__(self, path: str, specs: list[list[tuple[DirSpec, dict[str, Any]]]]) -> None:
        self.path, self.specs = path, specs
        self.pool = ArrayPool()

    def release(self, i: int, k: int) -> None:
        self.pool.give_back((i, k))

    def release_array(self, a: np.ndarray) -> None:
        pass

    def read(self, i: int, k: int) -> list[DirectionParams]:
        import h5py

        path, specs = self.path, self.specs
        if k != 0:
            raise IndexError(f"a Keras layer holds one stacked layer, not {k + 1}")
        try:
            with h5py.File(path, "r") as f:
                out = []
                for spec, srcs in specs[i]:
                    raw: dict[str, Any] = {}
                    for key, loc in srcs.items():
                        if isinstance(loc, tuple):  # Keras 1 per-gate tensors (small by nature): read, joined
                            raw[key] = np.concatenate([read_dataset(f[x], f"{path}: {x}") for x in loc], axis=-1)
                        else:
                            _dataset_meta(f[loc], f"{path}: {loc}")
                            raw[key] = f[loc] if key == "bias" else _direct(f[loc])  # kernels: row sources
                    first = srcs.get("kernel")
                    first = first[0] if isinstance(first, tuple) else first  # Keras 1: the layer's group
                    out.append(convert_direction(spec, raw, f"{path}: {first!s}".rsplit("/", 1)[0],
                                                 functools.partial(self.pool.take, (i, k))))
                return out
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise _damaged(path, exc) from exc


def _read_file(f, path: str, gate_activation: str | None) -> "Interpreter":
    """The body of :func:`read` on an open ``h5py.File``: metadata (dataset shapes and dtypes, as
    placeholders), configs and the non-recurrent tensors; h5py errors are translated by the caller."""
    check_links(f)
    if "model_weights" in f:
        g = f["model_weights"]
        cfg_s = attr_str(f, "model_config")
        try:
            config = json.loads(cfg_s) if cfg_s else None
        except json.JSONDecodeError as exc:
            raise FormatError(f"{path}: model_config is not valid JSON ({exc})") from exc
    elif "layer_names" in f.attrs or "layer_names0" in f.attrs:
        g, config = f, None
    else:
        raise FormatError(f"{path}: HDF5 file without Keras 'model_weights' group or 'layer_names' "
                          "attribute; is it a Keras 3 .weights.h5 or another HDF5 file?")
    keras_version = attr_str(g, "keras_version") or attr_str(f, "keras_version")
    rd = Interpreter(path, keras_version, gate_activation, Hdf5Tensors(f, path))
    if isinstance(config, dict) and config.get("class_name") in ("Sequential", "Model", "Functional"):
        cfgs = index_configs(config)
    else:
        cfgs = {}
    for lname in attr_list(g, "layer_names"):
        if lname not in g:
            raise FormatError(f"{path}: layer '{lname}' is listed in layer_names but has no group")
        grp = g[lname]
        wnames = attr_list(grp, "weight_names")
        if not wnames:
            continue
        weights, locations = [], []
        for wn in wnames:
            if wn not in grp:
                raise FormatError(f"{path}: layer '{lname}' lists weight '{wn}' that is not in the file")
            weights.append(_dataset_meta(grp[wn], f"{path}: {lname}/{wn}"))
            locations.append(grp[wn].name)
        rec = cfgs.get(lname, {})
        rd.entry(LayerEntry(lname, wnames, weights, rec.get("config"), rec.get("class_name"), locations=locations), "")
    if not rd.ckpt.layers:
        raise FormatError(f"{path}: no recurrent layer (LSTM, GRU, SimpleRNN, CuDNNLSTM, CuDNNGRU) found")
    return rd
