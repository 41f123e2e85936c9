"""Keras HDF5 files (``.h5``, ``.hdf5``, ``.keras`` of Keras 2): reader (writer: :mod:`.h5_write`).

This module is the HDF5 container (h5py access hardened against hostile files, the isolated child of
:mod:`rnnconvert.safety.guard`, lazy loading, the stored tensors re-read for verification); what the
layers mean is decided by the Keras interpreter, :mod:`rnnconvert.conventions.keras_interpreter`, which reads the file's tensors
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import guard
from ...speed.pool import ArrayPool
from ...errors import FormatError
from ...core.model import Checkpoint, DirectionParams
from ...conventions.keras_interpreter import (
    DirSpec,
    Interpreter,
    LayerEntry,
    convert_direction,
    index_configs,
)
from .h5_access import Hdf5Tensors, attr_list, attr_str, check_links, dataset_meta, direct, read_dataset
from .sniff import hdf5_dialect


# --------------------------------------------------------------------------------------------
# HDF5 access, hardened
# --------------------------------------------------------------------------------------------


#: The reader can return a lazy checkpoint (streaming conversion, :func:`read` with ``lazy=True``).
LAZY = True


def read(path: str | Path, *, gate_activation: str | None = None, lazy: bool = False, **_: Any) -> Checkpoint:
    """Read a Keras 1/2 HDF5 file into a :class:`~rnnconvert.core.model.Checkpoint`.

    Args:
        path: the ``.h5``/``.hdf5`` file (full model or weights only).
        gate_activation: override the LSTM/GRU gate activation (``'sigmoid'`` or ``'hard_sigmoid'``)
            when a weights-only file cannot tell.
        lazy: return the structure only (layers, semantics, ``source`` provenance with the
            :class:`.h5_access.LazyRaw` tensor maps, Dense/Embedding tensors) with
            :func:`~rnnconvert.core.model.placeholder` parameters, and ``ckpt.slabs`` (:class:`H5Slabs`) reading layer
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
    ckpt = replace(rd.ckpt, slabs=H5Slabs(path, rd.layer_specs()))
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
                            dataset_meta(f[loc], f"{path}: {loc}")
                            raw[key] = f[loc] if key == "bias" else direct(f[loc])  # kernels: row sources
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
    if "optimizer_weights" in f:  # model.save(include_optimizer=True): the training state, said, not carried
        rd.ckpt.meta.setdefault("notes", []).append(
            "the file's optimizer_weights (the training state) are not carried: the output holds the model's "
            "weights only")
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
            weights.append(dataset_meta(grp[wn], f"{path}: {lname}/{wn}"))
            locations.append(grp[wn].name)
        rec = cfgs.get(lname, {})
        rd.entry(LayerEntry(lname, wnames, weights, rec.get("config"), rec.get("class_name"), locations=locations), "")
    if not rd.ckpt.layers:
        raise FormatError(f"{path}: no recurrent layer (LSTM, GRU, SimpleRNN, CuDNNLSTM, CuDNNGRU) found")
    return rd
