"""The Keras family's sniffers (format detection, :func:`rnnconvert.engine.registry.detect`): which Keras wrote an
HDF5 file (:func:`hdf5_dialect`, looked at in an isolated child) and whether a zip is a ``.keras`` archive. Light on
purpose: detection asks every family, and only the family that claims a file is loaded whole."""

from __future__ import annotations

import zipfile
from pathlib import Path

from ...errors import FormatError
from ...safety import guard
from ...speed import filerows

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"


def _dialect_in_child(path: str) -> str:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "model_weights" in f or "layer_names" in f.attrs or "layer_names0" in f.attrs:
                return "keras2"
            return "keras3" if ("layers" in f or "vars" in f) else "other"
    except (OSError, RuntimeError, KeyError, ValueError):
        return "damaged"


_DIALECTS: dict[tuple[str, int, int], str] = {}


def hdf5_dialect(path: str | Path) -> str:
    """Which Keras writes this HDF5 file: ``'keras2'`` (``model_weights`` group or ``layer_names``
    attribute), ``'keras3'`` (top-level ``layers``/``vars`` groups), ``'other'``, or ``'damaged'``.

    Looked at in the isolated child of :mod:`rnnconvert.safety.guard` (libhdf5 can loop forever on a damaged
    file even while opening it); cached per path, size and modification time, so that format detection
    forks once per file. A file the child cannot finish with is ``'damaged:<reason>'``.
    """
    key = filerows.identity(path)
    if key not in _DIALECTS:
        try:
            _DIALECTS[key] = guard.isolated(_dialect_in_child, (str(path),), path, "HDF5")
        except FormatError as exc:
            _DIALECTS[key] = f"damaged:{exc}"
    return _DIALECTS[key]


def keras_h5(head: bytes, path: Path | None = None) -> bool:
    """True for an HDF5 file of Keras 1/2 (see :func:`hdf5_dialect`); a damaged HDF5 file is claimed too
    (``read`` then reports why). Keras 3 ``.weights.h5`` files are left to ``keras3``."""
    if not head.startswith(HDF5_MAGIC):
        return False
    if path is None:
        return True
    d = hdf5_dialect(path)
    return d == "keras2" or d.startswith("damaged")


def keras3(head: bytes, path: Path | None = None) -> bool:
    """A zip holding ``config.json`` and ``model.weights.h5``, or an HDF5 file with a top-level
    ``layers`` or ``vars`` group and no Keras 2 ``model_weights`` group / ``layer_names`` attribute."""
    if path is None:
        return False
    if head.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as z:
                names = set(z.namelist()[:256])
            return "config.json" in names and ("model.weights.h5" in names or "model.weights.npz" in names)
        except (zipfile.BadZipFile, OSError):
            return False
    if head.startswith(HDF5_MAGIC):
        return hdf5_dialect(path) == "keras3"  # looked at in an isolated child
    return False
