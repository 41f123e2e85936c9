"""One variable of a TensorFlow checkpoint, read by the pure bundle reader (:mod:`.bundle_read`) or by TensorFlow
where it declines, with NaN/Inf refused (:func:`tensor`, :func:`lazy_get`, :class:`CheckedGetter`), and the Keras
interpreter's tensor source of a TF2 object checkpoint (:class:`BundleTensors`, stored tensors re-read on access:
:class:`BundleRaw`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.finite import all_finite
from ...errors import FormatError, RNNConvertError, require
from . import bundle_read
from .sniff import prefix_of


def bundle(pre: str, path) -> bundle_read.BundleReader | None:
    """The pure reader of the bundle at ``pre``, or None where it declines (then TensorFlow reads it).

    Raises:
        FormatError: the bundle is damaged (from :class:`~.bundle_read.BundleReader`)."""
    if os.environ.get("RNNCONVERT_TF_READER", "auto") == "tensorflow":
        return None
    try:
        return bundle_read.BundleReader(pre, path)
    except bundle_read.BundleUnsupported:
        return None


def tensor(rd, key: str, path, raw: bool = False, out=None):
    """``rd.get_tensor(key)`` (into ``out``: the bundle reader only); a damaged ``.data`` file (checksum mismatch: ``OpError``; shorter than the
    index says: ``IndexError``, both found by bench/fuzz) raises FormatError naming the variable."""
    try:
        value = rd.get_tensor(key) if out is None else rd.get_tensor(key, out)
        return value if raw else np.asarray(value)
    except RNNConvertError:  # the pure reader's own FormatError names file and variable already
        raise
    except Exception as exc:  # tf.errors.OpError, IndexError, ValueError ...
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise FormatError(f"{path}: cannot read variable '{key}' of the TensorFlow checkpoint; the .data file is "
                          f"damaged or shorter than its .index says ({type(exc).__name__}: {first})") from exc


class BundleRaw(Mapping):
    """A direction's Keras tensors in a TF2 object checkpoint, re-read on access by :func:`lazy_get`: the
    record of :class:`~rnnconvert.conventions.keras_interpreter.StoredTensors` (path and locations, no reading function stored) with checkpoint keys
    as locations."""

    def __init__(self, path: str, locations: dict[str, Any]):
        self.path, self.locations = path, dict(locations)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.read(key)

    def __iter__(self):
        return iter(self.locations)

    def __len__(self) -> int:
        return len(self.locations)

    def read(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        return lazy_get(self.path, self.locations[key], out)


class BundleTensors:
    """The Keras interpreter's tensor source (``interpreter.TensorSource``) of a TF2 object checkpoint:
    values read now by :func:`lazy_get`, stored tensors as :class:`BundleRaw` (checkpoint keys as
    locations); Keras 1 per-gate tensors are not re-read (``None``)."""

    def __init__(self, path: str):
        self.path = path

    def value(self, location: str) -> np.ndarray:
        return lazy_get(self.path, location)

    def stored(self, locations) -> BundleRaw | None:
        if any(isinstance(v, tuple) for v in locations.values()):
            return None
        return BundleRaw(self.path, dict(locations))


def lazy_get(path: str, key: str, out: np.ndarray | None = None) -> np.ndarray:
    """Variable ``key`` of the checkpoint at ``path``, read again (verification of TF2 Keras layers:
    :class:`BundleRaw`): large plain tensors memory-mapped
    (:meth:`.bundle_read.BundleReader.mapped`), others read into ``out`` when the bundle reader can, NaN/Inf
    refused as in :func:`tensor`."""
    pre = prefix_of(path)
    rd = bundle(pre, path)
    if rd is not None:
        got = rd.mapped(key)  # large tensors: read in place from the page cache (checked by the conversion)
        if got is not None:
            return got
    if rd is None:
        rd = require("tensorflow", "tensorflow").train.load_checkpoint(pre)
    arr = tensor(rd, key, path, out=out if isinstance(rd, bundle_read.BundleReader) else None)
    if arr.dtype.kind == "f" and not all_finite(arr):
        raise FormatError(f"{path}: variable '{key}' contains NaN or Inf")
    return arr



class CheckedGetter:
    """``get(key)``: variable ``key`` of the open reader ``rd`` (:func:`tensor`), a float one with NaN/Inf refused;
    what the TF1 cell readers (:mod:`.tf1_cells`) and the TF2 interpreter read values with."""

    def __init__(self, rd, path) -> None:
        self.rd, self.path = rd, path

    def __call__(self, key: str) -> np.ndarray:
        arr = tensor(self.rd, key, self.path)
        if arr.dtype.kind == "f" and not all_finite(arr):
            raise FormatError(f"{self.path}: variable '{key}' contains NaN or Inf")
        return arr
