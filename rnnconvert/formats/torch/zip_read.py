"""Read the tensors of a ``torch.save`` / ``torch.jit.save`` zip archive without torch and without running
anything from the file: a restricted unpickler and lazy, memory-mapped storages.

Layout facts (``torch/serialization.py`` ``_save``/``_load`` of torch 2.13, and ``pickletools.dis`` of
``<archive>/data.pkl`` written by it): the zip holds ``<archive>/data.pkl`` (protocol-2 pickle of the saved
object), one member ``<archive>/data/<key>`` per storage, stored uncompressed (``ZIP_STORED``) and
64-byte aligned, and ``<archive>/byteorder`` (``little``/``big``; absent in old files: little). A tensor
is ``torch._utils._rebuild_tensor_v2(persistent_id, offset, size, stride, requires_grad,
backward_hooks[, metadata])`` with ``persistent_id = ('storage', torch.<Type>Storage, key, location,
numel)``; ``nn.Parameter`` is ``torch._utils._rebuild_parameter(tensor, requires_grad, hooks)``; state
dicts are ``collections.OrderedDict`` (with a ``_metadata`` attribute set by ``BUILD``).

:class:`Unpickler` resolves only that allow-list. Anything else -- another global (code), a storage type
numpy has no dtype for (``BFloat16Storage``), a Parameter with hooks, a tensor with metadata -- raises
:class:`Declined`: the caller then uses ``torch.load(weights_only=True)``, which never runs code either.
A file that *is* in this layout but damaged (a tensor past its storage, a storage member missing,
compressed or past the end of the file) raises :class:`~rnnconvert.errors.FormatError`.

A tensor is a :class:`LazyTensor`: shape/dtype known, bytes read only by :meth:`Archive.array`, a view
of a private (copy-on-write) memory map of the file; :meth:`Archive.release` gives the pages back
(``madvise(MADV_DONTNEED)``: touched file-backed pages count in the process's RSS until then).
"""

from __future__ import annotations

import collections
import mmap
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import budget
from ...safety import pickle_scan
from ...safety.pickle_scan import brief
from ...speed.mapped import release_view
from ...errors import FormatError

#: ``torch.<Type>Storage`` -> numpy dtype (``torch/storage.py``); BFloat16/complex/quantized types are declined.
STORAGE = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
           "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
           "ByteStorage": np.uint8, "BoolStorage": np.bool_}
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # zip local file header (APPNOTE 4.3.7), 30 bytes
#: Largest ``data.pkl`` read (tensor data lives in other members; optimizer state keeps it far smaller).
MAX_PICKLE = 1 << 28


class Declined(Exception):
    """The restricted reader does not handle this file (not an error: use ``torch.load(weights_only=True)``)."""


@dataclass(frozen=True)
class Storage:
    key: str
    dtype: np.dtype
    numel: int


@dataclass(frozen=True)
class LazyTensor:
    """A tensor of the archive not read yet: ``numel`` elements of ``storage`` from ``offset`` (elements)."""

    storage: Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.storage.dtype


def _ints(v: Any) -> bool:
    return isinstance(v, (tuple, list)) and all(type(i) is int and i >= 0 for i in v)


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    hooks: Any = None, *more: Any) -> LazyTensor:
    if more or hooks:  # tensor metadata / backward hooks: leave to torch
        raise Declined("tensor with metadata or hooks")
    if not (isinstance(storage, Storage) and type(offset) is int and offset >= 0 and _ints(size) and _ints(stride)
            and len(size) == len(stride)):
        raise FormatError("malformed tensor record in data.pkl")
    if all(size) and offset + sum((s - 1) * st for s, st in zip(size, stride)) >= storage.numel:
        raise FormatError("a tensor reaches past the end of its storage")
    numel = 1
    for n in size:
        numel *= n
    if numel > storage.numel:  # stride 0 or overlapping strides: more elements than stored
        item = storage.dtype.itemsize
        budget.check_expansion("data.pkl", numel * item, storage.numel * item,
                               f"a tensor of shape {tuple(size)} with strides {tuple(stride)}")
    return LazyTensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_parameter(data: Any, requires_grad: Any = False, hooks: Any = None, *more: Any) -> LazyTensor:
    if more or hooks or not isinstance(data, LazyTensor):
        raise Declined("nn.Parameter with hooks or state")
    return data


class Unpickler(pickle.Unpickler):
    """The allow-list unpickler of ``data.pkl`` (module docstring); subclasses add names (TorchScript)."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name in STORAGE:
            return STORAGE[name]
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return self.refuse(module, name)

    def refuse(self, module: str, name: str):
        raise Declined(f"global '{module}.{name}'")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise Declined(f"persistent id {brief(pid, 60)}")
        dtype, key, numel = pid[1], pid[2], pid[4]
        if not any(dtype is t for t in STORAGE.values()):
            raise Declined("storage type")
        if not (isinstance(key, str) and key.isdigit() and type(numel) is int and numel >= 0):
            raise FormatError(f"malformed storage record {brief(pid, 60)}")
        return Storage(key, np.dtype(dtype), numel)


class Archive:
    """An open ``torch.save``-style zip: its root folder, byte order, and storage members by key.

    Raises:
        Declined: not a zip, or no ``<root>/data.pkl`` (legacy files, other zips).
        FormatError: a damaged zip directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            if fh.read(4) != b"PK\x03\x04":
                raise Declined("not a zip archive")
        try:
            with zipfile.ZipFile(self.path) as zf:
                infos = zf.infolist()
                pkls = [i.filename for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
                if not pkls:
                    raise Declined("no <archive>/data.pkl")
                budget.zip_members(self.path, infos)  # duplicate names, member count, inflation ratio
                if len(pkls) > 1:
                    raise FormatError(f"{self.path}: the archive holds {len(pkls)} <archive>/data.pkl members; "
                                      "refused (which one is meant is not defined)")
                self.root = pkls[0].split("/")[0]
                self.members = {i.filename: i for i in infos if i.filename.startswith(self.root + "/")}
                bo = self.members.get(f"{self.root}/byteorder")
                self.big = bo is not None and zf.read(bo).strip() == b"big"
                info = self.members[pkls[0]]
                if info.file_size > MAX_PICKLE:  # a state dict's pickle is KBs; refuse before inflating it
                    raise FormatError(f"{self.path}: data.pkl declares {info.file_size} bytes; refused")
                self.pickle = zf.read(info)
        except (Declined, FormatError):
            raise
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, NotImplementedError) as exc:
            raise FormatError(f"{self.path}: damaged zip archive ({exc})") from exc
        self.size = self.path.stat().st_size
        self._mm: mmap.mmap | None = None
        self._data: dict[str, tuple[int, int]] = {}

    def load(self, unpickler: type[Unpickler] = Unpickler) -> Any:
        """Unpickle ``data.pkl`` with ``unpickler``, after :func:`rnnconvert.safety.pickle_scan.scan` has bounded its
        structure (expanded size, nesting, memo, hashed keys); tensors come back as :class:`LazyTensor`.

        Raises:
            Declined: a name off the allow-list. FormatError: a damaged or refused stream. BudgetError: the
            ``pickle_expanded`` limit."""
        import io

        pickle_scan.scan(self.pickle, f"{self.path}: data.pkl")  # structure bounded before the unpickler runs
        try:
            return unpickler(io.BytesIO(self.pickle)).load()
        except (Declined, FormatError):
            raise
        except RecursionError as exc:
            raise FormatError(f"{self.path}: data.pkl nested too deeply") from exc
        except Exception as exc:  # a damaged pickle stream (UnpicklingError, EOFError, TypeError, ...)
            raise FormatError(f"{self.path}: damaged data.pkl ({type(exc).__name__}: {exc})") from exc

    def _member(self, key: str) -> tuple[int, int]:
        """File offset and size of the bytes of storage ``key`` (a ``ZIP_STORED`` member), validated."""
        if key not in self._data:
            info = self.members.get(f"{self.root}/data/{key}")
            if info is None:
                raise FormatError(f"{self.path}: storage '{key}' is missing from the archive")
            head = b""
            if 0 <= info.header_offset <= self.size - _LOCAL_HEADER.size:
                with open(self.path, "rb") as fh:
                    fh.seek(info.header_offset)
                    head = fh.read(_LOCAL_HEADER.size)
            if len(head) < _LOCAL_HEADER.size:
                raise FormatError(f"{self.path}: storage '{key}' lies past the end of the file")
            sig, _, flags, method, _, _, _, _, _, nlen, xlen = _LOCAL_HEADER.unpack(head)
            if sig != b"PK\x03\x04" or method != 0 or info.compress_type != 0 or flags & 1 \
                    or info.compress_size != info.file_size:
                raise FormatError(f"{self.path}: storage '{key}' is not stored uncompressed (torch.save stores "
                                  "every storage as is)")
            start = info.header_offset + _LOCAL_HEADER.size + nlen + xlen
            if start + info.file_size > self.size:
                raise FormatError(f"{self.path}: storage '{key}' reaches past the end of the file")
            self._data[key] = (start, info.file_size)
        return self._data[key]

    def array(self, t: LazyTensor) -> np.ndarray:
        """The values of ``t`` (native byte order, C-contiguous): a view of the file's mapped bytes when
        they are already that, else a copy.

        Raises:
            FormatError: the storage member is missing, compressed, or shorter than the storage declares.
        """
        start, size = self._member(t.storage.key)
        item = t.dtype.itemsize
        if t.storage.numel * item > size:
            raise FormatError(f"{self.path}: storage '{t.storage.key}' declares {t.storage.numel} elements, "
                              f"its member holds {size} bytes")
        if self._mm is None:
            with open(self.path, "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        dt = t.dtype.newbyteorder(">" if self.big else "<")
        n = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
        if n == 0:
            return np.zeros(t.shape, t.dtype)
        base = np.frombuffer(self._mm, dtype=dt, count=t.storage.numel, offset=start)
        view = np.lib.stride_tricks.as_strided(base[t.offset:], shape=t.shape,
                                               strides=tuple(s * item for s in t.stride), writeable=False)
        if dt.isnative and view.flags.c_contiguous:
            return base[t.offset:t.offset + n].reshape(t.shape)  # a writable (copy-on-write) view, no copy
        return np.ascontiguousarray(view, dtype=t.dtype)  # strided or big-endian: a native copy

    def release_array(self, a: np.ndarray) -> None:
        """Drop the mapped pages that lie wholly inside array ``a``'s memory, when ``a`` is a view of this
        archive's map (``MADV_DONTNEED``; ``a`` stays valid: its pages are read again from the file if used;
        :func:`rnnconvert.speed.mapped.release_view`)."""
        release_view(self._mm, a)

    def release(self, tensors: list[LazyTensor]) -> None:
        """Drop the mapped pages of ``tensors`` from this process (``MADV_DONTNEED``; the file is unchanged,
        a later read maps them again)."""
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        for t in tensors:
            start, size = self._data.get(t.storage.key, (0, 0))
            if size:
                lo = start - start % page
                self._mm.madvise(mmap.MADV_DONTNEED, lo, min(start + size, self.size) - lo)


def tensors(obj: Any, where: object = "data.pkl") -> dict[str, Any]:
    """The :class:`LazyTensor` leaves of nested dicts, keys joined with ``.`` (other leaves dropped), like
    ``pt_read._flatten`` does for ``torch.load`` output. Each container is walked
    once (:func:`rnnconvert.safety.budget.leaves`: a pickle's shared children cost nothing twice, the walk is
    bounded by the ``pickle_nodes`` limit).

    Raises:
        FormatError: containers nested deeper than 32 levels. BudgetError: the walk's limit, or views of
            shared storages declaring more than the ``expansion`` limit allows (:func:`budget.check_aliasing`)."""
    found = budget.leaves(obj, LazyTensor, where, "data.pkl")
    views = []
    for t in found.values():
        numel = 1
        for n in t.shape:
            numel *= n
        views.append((t.storage.key, numel * t.dtype.itemsize))
    budget.check_aliasing(where, views, {t.storage.key: t.storage.numel * t.dtype.itemsize for t in found.values()})
    return found
