"""Read the tensors of a TorchScript archive (``torch.jit.save``) without running anything from the file.

``torch.load(weights_only=True)`` refuses TorchScript archives, and ``torch.jit.load`` compiles the
archive's ``code/`` and may run its ``__setstate__`` methods. This module instead unpickles
``<archive>/data.pkl`` with a restricted :class:`pickle.Unpickler` that resolves only an allow-list of
names (every other global is refused):

* ``__torch__.*`` module classes -> an inert record of the attributes the pickle stores;
* ``torch._utils._rebuild_tensor_v2`` and ``torch.<Type>Storage`` -> numpy arrays read from
  ``<archive>/data/<key>`` (little-endian unless ``<archive>/byteorder`` says ``big``);
* ``collections.OrderedDict``, ``torch.jit._pickle.restore_type_tag`` / ``build_*list`` -> plain values.

Layout facts from inspecting ``torch.jit.save`` output of torch 2.13 (``pickletools.dis`` of
``data.pkl``): modules are ``NEWOBJ`` of ``__torch__.<qualified class>`` followed by ``BUILD`` with a
dict of attributes, tensors are ``_rebuild_tensor_v2(persistent('storage', <Type>Storage, key,
location, numel), offset, size, stride, requires_grad, hooks)``.
"""

from __future__ import annotations

import pickle
import struct
import zlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError

_STORAGE = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
            "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
            "ByteStorage": np.uint8, "BoolStorage": np.bool_}


class _Module:
    """An inert stand-in for a scripted module: keeps the attributes of the pickle's ``BUILD``."""

    def __init__(self, *_: Any) -> None:
        self.attrs: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        self.attrs = state if isinstance(state, dict) else {}


def is_torchscript(path: Path) -> bool:
    """A zip with ``<archive>/code/`` members and a ``data.pkl`` (what ``torch.jit.save`` writes)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError):  # damaged zip
        return False
    return any("/code/" in n for n in names) and any(n.endswith("/data.pkl") for n in names)


def _rebuild(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    ints = lambda v: isinstance(v, (tuple, list)) and all(type(i) is int and i >= 0 for i in v)  # noqa: E731
    if not (isinstance(storage, np.ndarray) and type(offset) is int and offset >= 0 and ints(size) and ints(stride)
            and len(size) == len(stride)):
        raise FormatError("malformed tensor record in data.pkl")
    item = storage.itemsize
    n = int(np.prod(size)) if size else 1
    if n and offset + sum((s - 1) * st for s, st in zip(size, stride)) >= storage.size:
        raise FormatError("a tensor reaches past the end of its storage")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size), strides=tuple(s * item for s in stride))
    return np.array(view, copy=True)


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, zf: zipfile.ZipFile, root: str, big: bool) -> None:
        super().__init__(fh)
        self.zf, self.root, self.big = zf, root, big

    def find_class(self, module: str, name: str):
        if module.startswith("__torch__"):
            return _Module
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if module == "torch" and name in _STORAGE:
            return _STORAGE[name]
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch.jit._pickle" and name == "restore_type_tag":
            return lambda value, _tag: value
        if module == "torch.jit._pickle" and name.startswith("build_") and name.endswith("list"):
            return lambda value: value
        raise FormatError(f"TorchScript archive refers to '{module}.{name}', which rnnconvert does not resolve "
                          "(it reads tensors only and never runs code from a file)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise FormatError(f"unexpected persistent id {pid!r:.60}")
        dtype, key = pid[1], str(pid[2])
        if not any(dtype is t for t in _STORAGE.values()):
            raise FormatError(f"storage '{key}' has an unknown type")
        try:
            raw = self.zf.read(f"{self.root}/data/{key}")
        except KeyError:
            raise FormatError(f"storage '{key}' is missing from the archive") from None
        dt = np.dtype(dtype).newbyteorder(">" if self.big else "<")
        return np.frombuffer(raw, dtype=dt).astype(np.dtype(dtype), copy=False)


def _walk(obj: Any, prefix: str, out: dict[str, np.ndarray], depth: int = 0) -> None:
    if depth > 64:
        raise FormatError("modules nested deeper than 64 levels")
    if isinstance(obj, np.ndarray):
        out[prefix] = obj
    elif isinstance(obj, _Module):
        for k, v in obj.attrs.items():
            if not str(k).startswith("_"):  # skip _flat_weights and other private copies
                _walk(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Public (non-underscore) tensor attributes of the scripted module tree, keyed like a state dict.

    Raises:
        FormatError: not a TorchScript archive, or it refers to names outside the allow-list.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = next(n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1)
            root = pkl.split("/")[0]
            try:
                big = zf.read(f"{root}/byteorder").strip() == b"big"
            except KeyError:
                big = False
            with zf.open(pkl) as fh:
                obj = _Unpickler(fh, zf, root, big).load()
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from exc
    except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError, TypeError,
            KeyError, IndexError, AttributeError, OSError, RuntimeError, NotImplementedError, zlib.error,
            struct.error) as exc:
        raise FormatError(f"{path}: not a readable TorchScript archive: {exc}") from exc
    out: dict[str, np.ndarray] = {}
    _walk(obj, "", out)
    return out
