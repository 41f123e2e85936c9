"""A ``.pt2`` archive (``torch.export.save``) checked before ``torch.export.load`` runs on it, and loaded with
every unpickling path that can run code closed.

``rnnconvert verify SRC DST.pt2`` loads a file the user names, which may not be one rnnconvert wrote. In torch
2.13, ``torch.export.load`` (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``)
unpickles with ``weights_only=False`` in four places: a weight or tensor constant whose payload config says
``use_pickle``, a legacy ``data/weights/<model>.pt`` / ``data/constants/<model>.pt`` blob, a custom or opaque
object constant (``torch._C._pickle_load_obj``, ``pickle.loads``), and the sample inputs when their
``weights_only=True`` load fails (a silent fallback). A crafted archive runs code through any of them.

:func:`check` refuses, with one line (:class:`~rnnconvert.errors.FormatError`, exit 3), before torch sees the file:
a compressed member (torch writes every member stored; a deflated one could expand without bound), a member
larger than the file, a legacy weights/constants blob, a payload config with ``use_pickle`` or a constant that is
not a tensor, and sample inputs whose pickle :func:`rnnconvert.safety.pickle_scan.scan` refuses (bounded
structure). :func:`load` then runs ``torch.export.load`` with ``torch.load`` forced to ``weights_only=True`` (the
fallback has nothing else to fall back to) and the two object unpicklers replaced by a refusal, under a lock.
What rnnconvert writes (:mod:`rnnconvert.whole.formats.torch.pt2_write`) has none of these and loads unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickletools
import re
import threading
import zipfile
from typing import Any

from ..errors import FormatError
from . import pickle_scan

_LEGACY = re.compile(r"(^|/)data/(weights|constants)/[^/]+\.pt$")
_CONFIG = re.compile(r"(^|/)data/(weights|constants)/[^/]*_config\.json$")
_SAMPLES = re.compile(r"(^|/)data/sample_inputs/[^/]+\.pt$")
_CONFIG_BYTES = 64 << 20  # a payload config is a few kB per tensor
_LOCK = threading.Lock()


def _refuse(path: object, why: str) -> FormatError:
    return FormatError(f"{path}: not loaded as a torch.export program: {why} (a .pt2 that torch.export.load would "
                       "unpickle; rnnconvert never unpickles a file)")


def check(path: str | os.PathLike) -> None:
    """Refuse a ``.pt2`` whose loading could unpickle objects or expand without bound (see the module docstring).

    Raises :class:`~rnnconvert.errors.FormatError` (exit 3) naming the member; returns ``None`` for an archive
    with stored members, tensor payloads only and bounded sample inputs."""
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    raise _refuse(path, f"member {pickle_scan.brief(info.filename)} is compressed")
                if info.file_size > size:
                    raise _refuse(path, f"member {pickle_scan.brief(info.filename)} is larger than the file")
                name = info.filename
                if _LEGACY.search(name):
                    raise _refuse(path, f"member {pickle_scan.brief(name)} is a pickled legacy weights blob")
                if _CONFIG.search(name):
                    _payload_config(path, name, z.read(info) if info.file_size <= _CONFIG_BYTES else b"")
                elif _SAMPLES.search(name):
                    _sample_inputs(path, name, z.read(info))
    except zipfile.BadZipFile as exc:
        raise FormatError(f"{path}: not a torch.export program: {exc}") from None


def _payload_config(path: object, name: str, data: bytes) -> None:
    try:
        cfg = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise _refuse(path, f"{pickle_scan.brief(name)} is not a JSON payload config") from None
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    if not isinstance(entries, dict):
        raise _refuse(path, f"{pickle_scan.brief(name)} has no 'config' table")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise _refuse(path, f"{pickle_scan.brief(fqn)} in {pickle_scan.brief(name)} is pickled")
        where = meta.get("path_name")
        if not isinstance(where, str) or not where.startswith(("weight_", "tensor_")):
            raise _refuse(path, f"{pickle_scan.brief(fqn)} in {pickle_scan.brief(name)} is not a tensor "
                                f"({pickle_scan.brief(where)})")


def _sample_inputs(path: object, name: str, data: bytes) -> None:
    """The sample inputs are a ``torch.save`` zip inside the archive: its ``data.pkl`` scanned for structure."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            pkls = [i for i in inner.infolist() if i.filename.endswith("data.pkl")]
            if len(pkls) != 1 or any(i.compress_type != zipfile.ZIP_STORED or i.file_size > len(data)
                                     for i in inner.infolist()):
                raise _refuse(path, f"{pickle_scan.brief(name)} is not one stored torch.save pickle")
            data = inner.read(pkls[0])
            pickle_scan.scan(data, f"{path}: {name}")  # bounded first: the opcode walk below is linear then
            for g in _globals(data):
                if g not in _TENSOR_GLOBALS and not (g[0] == "torch" and g[1].endswith("Storage")):
                    raise _refuse(path, f"{pickle_scan.brief(name)} names {pickle_scan.brief('.'.join(g))}, "
                                        "not a tensor")
    except zipfile.BadZipFile:
        raise _refuse(path, f"{pickle_scan.brief(name)} is not a torch.save archive") from None


#: what ``torch.save`` of example tensors names (``torch/_tensor.py``, ``torch/_utils.py``, ``torch/serialization.py``)
_TENSOR_GLOBALS = {("torch._tensor", "_rebuild_from_type_v2"), ("torch._utils", "_rebuild_tensor_v2"),
                   ("torch._utils", "_rebuild_parameter"), ("torch", "Tensor"), ("torch", "Size"),
                   ("torch", "device"), ("collections", "OrderedDict")}


def _globals(data: bytes) -> list[tuple[str, str]]:
    """Every ``(module, name)`` a pickle's ``GLOBAL``/``STACK_GLOBAL``/``INST`` opcodes name (``pickletools``)."""
    out, last = [], []  # the operands of the opcodes just before, MEMOIZE/PUT skipped; None: not a string push
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            mod, _, nm = str(arg).partition(" ")
            out.append((mod, nm))
        elif op.name == "STACK_GLOBAL":  # its two names must be pushed right before it, not fetched from the memo
            ok = len(last) >= 2 and isinstance(last[-2], str) and isinstance(last[-1], str)
            out.append((last[-2], last[-1]) if ok else ("?", "?"))
        if op.name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            last = (last + [arg if "UNICODE" in op.name or op.name == "STRING" else None])[-2:]
    return out


def _no_objects(*_: Any, **__: Any) -> Any:
    raise FormatError("the .pt2 holds a pickled object (refused: rnnconvert never unpickles a file)")


@contextlib.contextmanager
def _weights_only(torch) -> Any:
    from torch.export.pt2_archive import _package

    real_load, real_obj, real_pickle = torch.load, torch._C._pickle_load_obj, _package.pickle

    def load(f, *args: Any, **kw: Any) -> Any:
        kw["weights_only"] = True
        return real_load(f, *args, **kw)

    class _Pickle:  # what _package calls as pickle.loads
        loads = staticmethod(_no_objects)

    with _LOCK:
        torch.load, torch._C._pickle_load_obj, _package.pickle = load, _no_objects, _Pickle
        try:
            yield
        finally:
            torch.load, torch._C._pickle_load_obj, _package.pickle = real_load, real_obj, real_pickle


def load(torch, path: str | os.PathLike, extra_files: dict[str, str]) -> Any:
    """``torch.export.load`` of the archive at ``path`` after :func:`check`, with ``torch.load`` forced to
    ``weights_only=True`` and object unpickling refused while it runs. ``extra_files`` as torch's argument.

    Raises :class:`~rnnconvert.errors.FormatError` for what :func:`check` refuses or torch cannot load."""
    check(path)
    with open(path, "rb") as fh:  # a buffer: the temporary name does not end in .pt2 (torch warns otherwise)
        data = io.BytesIO(fh.read())
    with _weights_only(torch):
        try:
            return torch.export.load(data, extra_files=extra_files)
        except FormatError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever torch raises on a damaged or crafted archive
            raise FormatError(f"{path}: does not load as a torch.export program: "
                              f"{pickle_scan.brief(str(exc), 120)}") from None
