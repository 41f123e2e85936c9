"""PyTorch ``.pt``/``.pth`` files: sniffing, the reader (state dicts, training checkpoints, legacy and
TorchScript archives), the writer's entry points (:mod:`.pt_write`), and how the torch runtime
(:mod:`rnnconvert.runtimes.torch`) gets a written file's tensors (:func:`load`).

The state-dict convention (key names, gate order, grouping into layers, what ``torch.nn`` expresses) is
:mod:`rnnconvert.conventions.torch_state`, shared with the safetensors container. Files are written as a
plain ``dict[str, Tensor]`` that ``torch.load(path, weights_only=True)`` reads and
``load_state_dict(strict=True)`` accepts into ``nn.LSTM(..., batch_first=True)`` of matching size.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import torch_names as naming
from ...conventions.torch_state import direction, foreign, group_state_dict, has_torch_names, strip_module_prefix
from ...conventions.torch_state import group as group_keys
from ...core.model import Checkpoint, DirectionParams, RNNLayer, placeholder
from ...errors import FormatError, require
from ...speed import filerows
from .sniff import ZIP_MAGIC

ROUTE = "torch"



def load_state(path: str | Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True, map_location='cpu')``; never unpickles code.

    Zip-format files (every ``torch.save`` since 1.6) are loaded with ``mmap=True``: tensors map the
    file's pages instead of being copied into memory, so a layer that is never touched (verification of
    one layer of a multi-GB file) is never read. Legacy (non-zip) files are read whole.

    Every pickle torch would unpickle is first checked by :func:`prescan`.

    Raises:
        FormatError: the file cannot be loaded with ``weights_only=True`` (the reason is given), or
        :func:`prescan` refuses it. BudgetError: the ``pickle_expanded`` limit.
    """
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == ZIP_MAGIC
    prescan(path, is_zip)
    torch = require("torch", "torch")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise FormatError(f"{path}: not loadable as a PyTorch file with weights_only=True: {load_failure(exc)}") from exc


#: pickles a legacy (non-zip) ``torch.save`` file starts with: magic number, protocol, sys_info, the object, the
#: storage keys (``torch/serialization.py`` ``_legacy_save``/``_legacy_load``); raw storage bytes follow
LEGACY_PICKLES = 5


def prescan(path: str | Path, is_zip: bool) -> None:
    """Bound the structure of every pickle ``torch.load`` would unpickle before it runs
    (:func:`rnnconvert.safety.pickle_scan.scan`: expanded size, nesting, memo, hashed keys): a zip's
    ``<archive>/data.pkl``, or a legacy file's first :data:`LEGACY_PICKLES` pickles. torch's ``weights_only``
    unpickler hashes dict keys like Python's own.

    Raises:
        FormatError: a stream the scan refuses. BudgetError: the ``pickle_expanded`` limit."""
    import mmap

    from ...safety import budget, pickle_scan
    from . import zip_read

    p = Path(path)
    budget.regular_source(p, dirs=False)
    if is_zip:
        try:
            arch = zip_read.Archive(p)
        except zip_read.Declined:
            return  # no <archive>/data.pkl: torch.load finds nothing to unpickle either
        pickle_scan.scan(arch.pickle, f"{p}: data.pkl")
        return
    with open(p, "rb") as fh:
        if not budget.source_size(p):
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            for _ in range(LEGACY_PICKLES):
                if pos >= len(mm):
                    break
                pos = pickle_scan.scan(mm, p, pos)


def load_failure(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` found wrong, in one line, without torch's advice to reload
    with ``weights_only=False`` or to allow-list globals (which would run the file's code): the
    ``WeightsUnpickler error:`` reason when torch gives one (``torch/serialization.py``), else the
    exception's first line that does not give such advice, else its type."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    m = re.search(r"WeightsUnpickler error:\s*(.+)", text, re.S)
    if m:
        reason = next((ln.strip() for ln in m.group(1).splitlines() if ln.strip()), "")
        reason = re.split(r"\.\s+Please use|\s+Please use", reason)[0].rstrip(".")
        if reason:
            return f"{reason} (refused: rnnconvert never runs code from a file)"
    for line in text.splitlines():
        line = line.strip()
        if line and not re.search(r"weights_only|trust|safe_globals|arbitrary code|add_safe_globals", line, re.I):
            return line[:300]
    return type(exc).__name__




#: Keys under which training scripts commonly nest the state dict (checked in this order).
WRAPPERS = ("state_dict", "model_state_dict", "model_state", "model", "net", "network", "module", "weights")

def _flatten(obj: Any, where: object = "torch.load output") -> dict[str, np.ndarray]:
    """Tensors of nested dicts as numpy arrays, keys joined with ``.`` (non-tensor leaves dropped); each
    container walked once, within the ``pickle_nodes`` limit (:func:`rnnconvert.safety.budget.leaves`)."""
    torch = require("torch", "torch")
    from ...safety import budget

    found = budget.leaves(obj, torch.Tensor, where, "pickle")
    for k, v in found.items():  # stride 0 / overlapping strides: more elements than the storage holds
        try:
            stored = v.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse): no data
            stored = 0
        budget.check_expansion(where, v.numel() * v.element_size(), stored, f"tensor '{k}' of shape {tuple(v.shape)}")
    keys = {}
    for v in found.values():  # views of shared storages: each written out in full
        try:
            st = v.untyped_storage()
            keys[id(v)] = (st.data_ptr(), st.nbytes()) if st.nbytes() else (id(v), 0)
        except (RuntimeError, NotImplementedError):
            keys[id(v)] = (id(v), 0)
    budget.check_aliasing(where, [(keys[id(v)][0], v.numel() * v.element_size()) for v in found.values()],
                          dict(keys.values()))
    return {k: v.detach().cpu().numpy() for k, v in found.items()}


def unwrap(obj: Any) -> Any:
    """The state dict inside a training checkpoint: ``obj[w]`` for the first wrapper key ``w`` in
    :data:`WRAPPERS` that holds a dict, when ``obj`` itself has no recurrent keys at its top level."""
    if isinstance(obj, dict) and not any(isinstance(k, str) and naming.FIRST_KEY.match(k) for k in obj):
        for w in WRAPPERS:
            if isinstance(obj.get(w), dict):
                return unwrap(obj[w])
    return obj



#: The reader can return a lazy checkpoint (docs/performance.md "Streaming conversion").
LAZY = True


def read(path: str | Path, *, nonlinearity: str = "tanh", lazy: bool = False, map: Any = None,
         **_: Any) -> Checkpoint:
    """Read a PyTorch file: a state dict of ``nn.LSTM/GRU/RNN`` or ``nn.*Cell`` modules (any prefix), a
    training checkpoint wrapping one (:data:`WRAPPERS`, ``module.`` prefix stripped), a legacy
    (non-zip) ``torch.save`` file, or a TorchScript archive (tensors read by the restricted reader of
    :mod:`rnnconvert.formats.torch.torchscript_read`, no code run). CUDA storages are mapped to the CPU.

    ``torch.save`` zip files are read without torch by the allow-list unpickler of
    :mod:`rnnconvert.formats.torch.zip_read` (tensors are views of a memory map of the file); what it
    declines (legacy files, bfloat16, other globals, ...) is loaded with ``torch.load(weights_only=True)``.
    ``lazy=True`` (zip files read by the restricted reader): the recurrent parameters are placeholders
    read one slab at a time from ``ckpt.slabs`` (:class:`ZipSlabs`), whose ``release`` drops a slab's mapped pages.

    ``nonlinearity`` (``'tanh'``/``'relu'``) tells an ``nn.RNN``'s activation, which the file does not store.

    A file without ``torch.nn`` recurrent keys, or read with a name ``map``, goes through the foreign-name
    table (:mod:`rnnconvert.core.names`, docs/foreign-names.md; read eagerly): user cells with their own
    parameter names, TorchScript archives of hand-written RNNs.

    Raises:
        FormatError: not loadable with ``weights_only=True``, no recurrent keys, or inconsistent shapes.
    """
    from ...core import names
    from . import zip_read, torchscript_read

    p = Path(path)
    if torchscript_read.is_torchscript(p):
        sd = strip_module_prefix(torchscript_read.read_tensors(p))
        if map is not None or not has_torch_names(sd):
            return foreign(sd, str(p), nonlinearity, map, "TorchScript")
        ckpt = names.add_rest(group_state_dict(sd, str(p), "pt", nonlinearity), str(p), "pt", nonlinearity)
        ckpt.meta["container"] = "TorchScript"
        return ckpt
    try:
        arch = zip_read.Archive(p)
        found = strip_module_prefix(zip_read.tensors(unwrap(arch.load()), p))
    except zip_read.Declined:
        sd = strip_module_prefix(_flatten(unwrap(load_state(p)), p))
        if map is not None or not has_torch_names(sd):
            return foreign(sd, str(p), nonlinearity, map)
        return names.add_rest(group_state_dict(sd, str(p), "pt", nonlinearity), str(p), "pt", nonlinearity)
    except FormatError as exc:
        raise type(exc)(str(exc) if str(p) in str(exc) else f"{p}: {exc}") from exc
    if map is not None or not has_torch_names(found):
        return foreign({k: arch.array(t) for k, t in found.items()}, str(p), nonlinearity, map)
    # stand-ins of the right shape/dtype holding no memory (NaN placeholders for float tensors)
    stub = {k: placeholder(t.shape, t.dtype) if t.dtype.kind in "fc" else
            np.broadcast_to(np.zeros((), t.dtype), t.shape) for k, t in found.items()}
    ckpt, keys = group_keys(stub, str(p), "pt", nonlinearity)
    ckpt = replace(ckpt, tensors={k: arch.array(found[k]) for k in ckpt.tensors},
                   slabs=ZipSlabs(arch, found, keys, ckpt.layers))
    if names.candidates(ckpt.tensors):  # hand-written cells beside torch.nn modules: read eagerly
        return names.add_rest(ckpt.materialize(), str(p), "pt", nonlinearity)
    return ckpt if lazy else ckpt.materialize()


class ZipSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a lazily read ``torch.save`` zip: slab ``(i, k)``
    = the arrays named ``keys[i][k]`` (per direction, in :func:`rnnconvert.conventions.torch_state.direction`'s order; ``None`` for a missing
    bias) mapped from the archive (:class:`.zip_read.Archive`) and put in canonical form; ``release``
    gives back their mapped pages, ``release_array`` one array's."""

    def __init__(self, arch, found: dict[str, Any], keys: list, layers: list[RNNLayer]) -> None:
        self.arch, self.found, self.keys = arch, found, keys
        self.shape = [(layer.cell, layer.cell.gates * layer.hidden_size) for layer in layers]

    def read(self, i: int, k: int) -> list[DirectionParams]:
        cell, gh = self.shape[i]
        return [direction([None if n is None else self.arch.array(self.found[n]) for n in names], cell, gh)
                for names in self.keys[i][k]]

    def release(self, i: int, k: int) -> None:
        self.arch.release([self.found[n] for names in self.keys[i][k] for n in names if n is not None])

    def release_array(self, a: np.ndarray) -> None:
        self.arch.release_array(a)



#: The written file's tensors as loaded (memory-mapped) by :func:`load_state`, for one layer at a time, keyed
#: by the file's identity and the layer (and the slab, for stacked layers): verification's sequence and
#: one-step runs of a one-slab layer read the same pages, mapped once (a new mapping per run faulted every
#: page in again); the next key unmaps it, so the mapped pages counted in the process's memory stay one
#: layer's, or one slab's of a stacked layer (a 3 GB 8-slab layer: 3.3 GB -> 0.4 GB). :func:`release` drops it.
_STATE: dict[tuple, dict] = {}


def load(path: str | Path, layer: RNNLayer, k: int | None = None) -> dict[str, Any]:
    """The torch runtime's view of a written ``.pt`` (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`):
    the file's tensors (``torch.load(..., mmap=True, weights_only=True)``) for ``layer`` and, for slab ``k`` of a
    stacked layer, that slab (each slab mapped afresh, so that the pages of a multi-GB stacked layer are not
    all held at once; a one-slab layer's sequence and step runs share one mapping)."""
    key = (*filerows.identity(path), layer.name, k if layer.num_layers > 1 else None)
    if key not in _STATE:
        _STATE.clear()
        _STATE[key] = load_state(path)
    return _STATE[key]


def release() -> None:
    """Drop the mapped tensors of the last written file verification ran (:func:`load`)."""
    _STATE.clear()
