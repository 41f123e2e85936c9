"""Read a Flax or Haiku parameter tree from an Orbax checkpoint folder (``ocp.StandardCheckpointer().save``,
``PyTreeCheckpointer``, a ``CheckpointManager`` step's item folder), without Orbax or JAX: the arrays are read by
``tensorstore`` (a dependency of Flax, in the ``jax`` extra), in the isolated child of native readers
(:func:`rnnconvert.safety.guard.isolated`: a crash or an endless loop on a damaged store ends in one line).

Layout facts (orbax-checkpoint 0.12.8, ``orbax/checkpoint/_src/metadata/tree.py``,
``orbax/checkpoint/_src/serialization/type_handlers.py``; confirmed on folders Orbax wrote,
``fixtures/gen_orbax.py``):

* ``<dir>/_METADATA``: JSON ``{"tree_metadata": {"('params', 'lstm', ...)": {"key_metadata": [{"key": "params",
  "key_type": 2}, ...], "value_metadata": {"value_type": "np.ndarray" | "jax.Array" | "scalar" | ..., "skip_deserialize":
  false}}}, "use_ocdbt": bool, "use_zarr3": bool}``: the tree's leaves by key path (``key_type`` 1 a sequence
  index, 2 a dict key).
* every array leaf is a zarr array (v2 ``.zarray``, or v3 ``zarr.json`` when ``use_zarr3``) at the key path
  joined with ``.`` (``params.lstm.cell.hi.kernel``), inside the OCDBT key-value store of ``<dir>``
  (``manifest.ocdbt``, ``ocdbt.process_*/``, ``d/``) when ``use_ocdbt``, else in the folder ``<dir>/<path>/``.
* ``_CHECKPOINT_METADATA`` names the handler class that wrote the folder (a string; nothing is imported from it).

Nothing the folder names is imported or run: the JSON is parsed, each array's zarr metadata checked (plain
number dtype; declared bytes against the budget, ``safety/budget.check_expansion`` against the folder's size)
before tensorstore reads it. Files (``rnnconvert.safety.paths``): the item folder lies inside the folder given,
and everything under it (``_METADATA``, zarr chunks and leaf folders, OCDBT manifests and data files) is, symlinks
resolved, inside it and a regular file or folder (:func:`~rnnconvert.safety.paths.check_tree`, before tensorstore
opens anything: tensorstore follows symlinks); a leaf's key path has no empty, ``.`` or ``..`` part; every store is
opened by the item folder's absolute real path (a leaf's array at ``<folder>/<leaf>/``, never the bare leaf
name, which tensorstore would take from the working directory), and the array opened must have the shape and
dtype its checked metadata declared before its data is read (``.read()``). The tree then goes through the Flax
reader's cell search (:func:`.msgpack_read.from_tree`), which hands Haiku trees to Haiku's convention.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...core.model import Checkpoint
from ...errors import FormatError, UnsupportedError, require
from ...safety import budget, guard
from ...safety.paths import check_tree, folder_of, inside, open_inside
from . import msgpack_read

METADATA, CHECKPOINT_METADATA = "_METADATA", "_CHECKPOINT_METADATA"
#: the largest ``_METADATA`` parsed
MAX_METADATA = 64 << 20
DTYPES = frozenset("<f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1 bfloat16".split())
#: tensorstore's dtype names of :data:`DTYPES` (what an opened array must have)
TS_DTYPES = {"<f2": "float16", "<f4": "float32", "<f8": "float64", "|i1": "int8", "<i2": "int16", "<i4": "int32",
             "<i8": "int64", "|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<u8": "uint64", "|b1": "bool",
             "bfloat16": "bfloat16"}


def item_folder(p: Path) -> Path | None:
    """The folder holding ``_METADATA``: ``p`` itself, or its one sub-folder that does (a ``CheckpointManager``
    step folder with one item, ``<step>/default``); ``None`` otherwise."""
    if (p / METADATA).is_file():
        return p
    subs = [d for d in sorted(p.iterdir())[:4096] if d.is_dir() and (d / METADATA).is_file()] if p.is_dir() else []
    return subs[0] if len(subs) == 1 else None


def leaves(meta: Any, where: str) -> list[tuple[tuple[str, ...], str]]:
    """``[(key path, value type)]`` of ``_METADATA``'s tree.

    Raises:
        FormatError: not Orbax's tree metadata."""
    tree = meta.get("tree_metadata") if isinstance(meta, dict) else None
    if not isinstance(tree, dict):
        raise FormatError(f"{where}: _METADATA holds no tree_metadata (not an Orbax PyTree checkpoint)")
    out = []
    for entry in tree.values():
        try:
            keys = tuple(str(k["key"]) for k in entry["key_metadata"])
            vtype = str(entry["value_metadata"]["value_type"])
        except (KeyError, TypeError):
            raise FormatError(f"{where}: a malformed tree_metadata entry") from None
        if not keys or any(not k or "\\" in k or "\0" in k or any(part in ("", ".", "..") for part in k.split("/"))
                           for k in keys):
            raise FormatError(f"{where}: a leaf key path {keys!r:.80}")
        out.append((keys, vtype))
    return out


def _read_arrays(folder: str, names: list[str], ocdbt: bool, zarr3: bool, stored: int) -> dict[str, np.ndarray]:
    """In the isolated child: every named zarr array, its metadata checked before its data is read.

    Raises:
        FormatError: damaged metadata or data (tensorstore's error, its first line). BudgetError."""
    ts = require("tensorstore", "jax")
    try:
        return _read_with(ts, folder, names, ocdbt, zarr3, stored)
    except FormatError:  # BudgetError is one
        raise
    except Exception as exc:  # tensorstore's ValueError on a damaged store, JSON errors, ...
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FormatError(f"{folder}: the checkpoint's store is damaged ({first[:160]})") from None


def _read_with(ts: Any, folder: str, names: list[str], ocdbt: bool, zarr3: bool, stored: int) -> dict[str, np.ndarray]:
    """``folder`` is the item folder's absolute real path (:func:`read`); every store below is opened by it."""
    base = Path(folder).as_uri() + "/"
    kvs = {"driver": "ocdbt", "base": base} if ocdbt else {"driver": "file", "path": folder + "/"}
    kv = ts.KvStore.open(kvs).result()
    meta_name = "zarr.json" if zarr3 else ".zarray"
    plans, declared = [], 0
    for name in names:
        raw = kv.read(f"{name}/{meta_name}".encode()).result()
        if raw.state != "value" or len(raw.value) > 1 << 20:
            raise FormatError(f"{folder}: leaf '{name}' has no zarr metadata ({meta_name})")
        zm = json.loads(bytes(raw.value))
        shape = zm.get("shape")
        dt = zm.get("data_type") if zarr3 else zm.get("dtype")
        if not (isinstance(shape, list) and len(shape) <= 32 and all(type(s) is int and s >= 0 for s in shape)):
            raise FormatError(f"{folder}: leaf '{name}' shape {shape!r:.60}")
        if zarr3:
            dt = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "bfloat16": "bfloat16", "int8": "|i1",
                  "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "|u1", "bool": "|b1"}.get(dt, str(dt))
        if dt not in DTYPES:
            raise FormatError(f"{folder}: leaf '{name}' dtype {dt!r:.40} (plain number arrays only)")
        size = int(np.prod(shape, dtype=object)) * (2 if dt == "bfloat16" else np.dtype(dt).itemsize)
        declared += size
        plans.append((name, tuple(shape), dt))
    budget.check_expansion(folder, declared, max(stored, 1), "the checkpoint's arrays")
    out = {}
    for name, shape, dt in plans:
        # the leaf's store inside the folder: a path within the OCDBT database, or the leaf's own folder
        where = {**kvs, "path": f"{name}/"} if ocdbt else {**kvs, "path": f"{folder}/{name}/"}
        store = ts.open({"driver": "zarr3" if zarr3 else "zarr", "kvstore": where}, open=True).result()
        if tuple(store.shape) != shape or store.dtype.name != TS_DTYPES[dt]:
            raise FormatError(f"{folder}: leaf '{name}' opened as {tuple(store.shape)} {store.dtype.name}, its checked "
                              f"metadata declared {shape} {TS_DTYPES[dt]}")
        a = np.asarray(store.read().result())
        if a.shape != shape:
            raise FormatError(f"{folder}: leaf '{name}' read as {a.shape}, declared {shape}")
        if dt == "bfloat16":  # the top half of a float32: widened exactly
            a = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = np.ascontiguousarray(a)
    return out


def read(path: str | Path, cells: Any = None) -> Checkpoint:
    """Read the recurrent cells of an Orbax checkpoint folder (module docstring).

    Args:
        cells: a Haiku tree's cores under other than Haiku's default names (``--read-opt cells=enc:lstm``,
            :func:`rnnconvert.conventions.haiku_names.parse_cells`).

    Returns:
        the Flax reader's layers (linen/NNX cells; a Haiku tree's cores by Haiku's convention), format ``orbax``.

    Raises:
        FormatError: no ``_METADATA`` (naming what to give), malformed metadata or zarr metadata, a damaged store.
        UnsupportedError: leaves that are not arrays (a checkpoint of other objects). DependencyError: no
        ``tensorstore`` (the ``jax`` extra). BudgetError: declared sizes.
    """
    p = Path(path)
    folder = item_folder(p) if p.is_dir() else None
    if folder is None:
        raise FormatError(f"{p}: not an Orbax checkpoint folder (no {METADATA} in it or in one sub-folder); give the "
                          "step folder Orbax wrote (…/<step> or …/<step>/<item>)")
    budget.regular_source(folder)
    real = inside(folder_of(p), os.path.abspath(folder), p, "item folder", "dir")
    stored = check_tree(real, folder)  # before anything under it is opened (tensorstore follows symlinks)
    mfile = folder / METADATA
    try:
        with open_inside(real, METADATA, folder, "metadata file") as fh:
            text = fh.read(MAX_METADATA + 1)
    except OSError as exc:
        raise FormatError(f"{mfile}: cannot read ({exc.strerror})") from None
    if len(text) > MAX_METADATA:
        raise FormatError(f"{mfile}: more than {MAX_METADATA} bytes of metadata; refused")
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{mfile}: not JSON ({str(exc)[:60]})") from None
    where = str(folder)
    items = leaves(meta, where)
    budget.check_count(where, "names", len(items), "leaves")
    odd = sorted({v for _, v in items} - {"np.ndarray", "jax.Array", "scalar"})
    if odd:
        raise UnsupportedError(f"{where}: leaves of type {', '.join(odd)} (only array and scalar leaves are read); restore it "
                               "with Orbax and save the parameters alone (flax.serialization.to_bytes)")
    names = [".".join(k) for k, _ in items]
    if len(set(names)) != len(names):
        raise FormatError(f"{where}: two leaves under one name")
    ocdbt = bool(meta.get("use_ocdbt", True))
    if not ocdbt:  # each leaf's own folder, inside (check_tree saw every entry; this names a missing one)
        for name in names:
            inside(real, name, folder, f"folder of leaf '{name}'", "dir")
    arrays = guard.isolated(_read_arrays, (str(real), names, ocdbt, bool(meta.get("use_zarr3", False)), stored),
                            folder, "Orbax/tensorstore")
    tree: dict[str, Any] = {}
    for (keys, _), name in zip(items, names):
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise FormatError(f"{where}: leaf '{name}' under another leaf")
        node[keys[-1]] = arrays[name]
    return msgpack_read.from_tree(tree, folder, set(), "orbax", cells)
