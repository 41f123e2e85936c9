"""Read the tensors of a TorchScript archive (``torch.jit.save``) without running anything from the file.

``torch.load(weights_only=True)`` refuses TorchScript archives, and ``torch.jit.load`` compiles the
archive's ``code/`` and may run its ``__setstate__`` methods. This module instead unpickles
``<archive>/data.pkl`` with a restricted :class:`pickle.Unpickler` that resolves only an allow-list of
names (every other global is refused):

* ``__torch__.*`` module classes -> an inert record of the attributes the pickle stores;
* ``torch._utils._rebuild_tensor_v2`` and ``torch.<Type>Storage`` -> numpy arrays read from
  ``<archive>/data/<key>`` (little-endian unless ``<archive>/byteorder`` says ``big``), by the
  restricted reader shared with plain ``torch.save`` files (:mod:`rnnconvert.formats.torch.zip_read`);
* ``collections.OrderedDict``, ``torch.jit._pickle.restore_type_tag`` / ``build_*list`` -> plain values.

Layout facts from inspecting ``torch.jit.save`` output of torch 2.13 (``pickletools.dis`` of
``data.pkl``): modules are ``NEWOBJ`` of ``__torch__.<qualified class>`` followed by ``BUILD`` with a
dict of attributes, tensors are ``_rebuild_tensor_v2(persistent('storage', <Type>Storage, key,
location, numel), offset, size, stride, requires_grad, hooks)``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import budget
from ...errors import FormatError
from . import zip_read


class _Module:
    """An inert stand-in for a scripted module: keeps the attributes of the pickle's ``BUILD``."""

    def __init__(self, *_: Any) -> None:
        self.attrs: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        # a dict of attributes (scripted modules); a class with its own __getstate__ may store a tuple/list
        self.attrs = state if isinstance(state, dict) else dict(enumerate(state)) if isinstance(state, (tuple, list)) \
            else {}


def is_torchscript(path: Path) -> bool:
    """A zip with ``<archive>/code/`` members and a ``data.pkl`` (what ``torch.jit.save`` writes)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError):  # damaged zip
        return False
    return any("/code/" in n for n in names) and any(n.endswith("/data.pkl") for n in names)


class _Unpickler(zip_read.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith("__torch__"):
            return _Module
        if module == "torch.jit._pickle" and name == "restore_type_tag":
            return lambda value, _tag: value
        if module == "torch.jit._pickle" and name.startswith("build_") and name.endswith("list"):
            return lambda value: value
        return super().find_class(module, name)

    def refuse(self, module: str, name: str):
        raise FormatError(f"TorchScript archive refers to '{module}.{name}', which rnnconvert does not resolve "
                          "(it reads tensors only and never runs code from a file)")


def _walk(obj: Any, prefix: str, out: dict[str, Any], depth: int = 0, count: Any = None) -> None:
    """Every tensor under ``obj`` at any depth (modules, dicts, lists, tuples), keyed by its attribute path;
    every object visited counts against the ``pickle_nodes`` limit (:mod:`rnnconvert.safety.budget`)."""
    count = count or budget.Counter("data.pkl", "pickle_nodes", "objects visited in the TorchScript module tree")
    count.tick()
    if depth > 64:
        raise FormatError("modules nested deeper than 64 levels")
    if isinstance(obj, zip_read.LazyTensor):
        out[prefix] = obj
        return
    items = obj.attrs.items() if isinstance(obj, _Module) else obj.items() if isinstance(obj, dict) else \
        enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        _walk(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1, count)


def _public(found: dict[str, Any]) -> dict[str, Any]:
    """Drop the private copies of tensors (``nn.LSTM._flat_weights.0``, any path with a ``_``-named part)
    that are also reachable under a public name; a tensor reachable only under private names (a user's
    ``self._cell``) stays."""
    def private(name: str) -> bool:
        return any(part.startswith("_") for part in name.split("."))

    def ident(t: zip_read.LazyTensor) -> tuple:
        return (t.storage.key, t.offset, t.shape, t.stride)

    public = {ident(t) for n, t in found.items() if not private(n)}
    seen: set = set()
    out = {}
    for n, t in found.items():
        if private(n) and (ident(t) in public or ident(t) in seen):
            continue
        seen.add(ident(t))
        out[n] = t
    return out


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the scripted module tree at any depth, keyed like a state dict (``a.b.0.weight``;
    private copies of public tensors dropped, :func:`_public`), as copies: the archive is closed when
    this returns. Which of them are recurrent weights is decided by name and shape afterwards
    (PyTorch's keys, else :mod:`rnnconvert.core.names`).

    Raises:
        FormatError: not a TorchScript archive, or it refers to names outside the allow-list.
    """
    try:
        arch = zip_read.Archive(Path(path))
        lazy: dict[str, Any] = {}
        _walk(arch.load(_Unpickler), "", lazy)
        return {k: np.array(arch.array(t), copy=True) for k, t in _public(lazy).items()}
    except FormatError as exc:
        raise type(exc)(f"{path}: {exc}" if str(path) not in str(exc) else str(exc)) from exc
    except zip_read.Declined as exc:
        raise FormatError(f"{path}: not a readable TorchScript archive: {exc}") from exc
