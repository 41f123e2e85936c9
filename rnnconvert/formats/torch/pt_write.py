"""The ``.pt`` writer, one slab at a time: the bytes of ``torch.save(state_dict, fileobj)``, streamed, without torch.

``torch.save`` needs every tensor in memory at once, and torch itself. This writer produces the same
file while holding one slab (stacked layer ``k`` of a layer, all directions) of parameters, and imports
no torch (a plain install writes ``.pt``):

1. the pickle ``archive/data.pkl`` is made by :func:`rnnconvert.formats.torch.pickle_write.data_pkl` from the
   keys, shapes and dtypes alone (storage keys ``0..N-1`` in state-dict order), then torch's small
   records (``.format_version`` ``1``, ``.storage_alignment`` ``64``, ``byteorder``);
2. the zip container is written by :class:`rnnconvert.formats.torch.zip_write.ZipWriter`, our Python rebuild
   of torch's zip writer ``torch._C.PyTorchFileWriter`` (what ``torch.save`` writes with: 64-byte
   aligned records, CRC-32 of each, ``version`` and ``.data/serialization_id`` at the end, zip64 end
   records): the same bytes, each slab's tensors written as ``data/<key>`` records straight from the
   arrays' memory in 1 MiB chunks (CRC-32 by :func:`zlib.crc32`) as the slab arrives. Layout facts and
   their sources: the :mod:`~rnnconvert.formats.torch.zip_write` and :mod:`~rnnconvert.formats.torch.pickle_write`
   docstrings (the serialization id's name half as torch's Linux wheels compute it).

Layout facts: ``torch/serialization.py`` (``_save``: record order ``data.pkl``, ``.format_version``,
``.storage_alignment``, ``byteorder``, ``data/<key>`` in key order; ``_open_zipfile_writer_buffer``: an
open file object gives the root folder ``archive``). The result is byte-identical to ``torch.save`` of
the materialized state dict (``torch.from_numpy`` of each array) into an open file, zip64 included
(``tests/formats/torch_files/test_pt_stream.py``, ``tests/formats/torch_files/test_pt_zip.py``, ``tests/formats/torch_files/test_pt_pickle.py``).

``PtStream(..., fast_zip=False)`` uses torch's own pieces instead (``torch.serialization._save`` on
stand-in tensors for the pickle, ``PyTorchFileWriter`` for the zip; ``torch.save`` at
:meth:`PtStream.close` when this torch lacks them): the reference the tests compare with.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...errors import FormatError, require
from ...core.model import Cell, Checkpoint, DirectionParams
from ...engine import stream
from ...speed import directio
from . import pickle_write, zip_write
from ...conventions.torch_names import describe_module
from ...conventions.torch_state import slab_items, slab_plan

#: torch's storage alignment (``torch.serialization._get_storage_alignment()``, default 64) and its
#: ``version`` record for format version 3 (``caffe2/serialize/versions.h`` ``kProducedFileFormatVersion``
#: 0x3; ``inline_container.cc`` ``writeEndOfFile``), as torch 2.13 writes them.
ALIGNMENT = 64
VERSION_RECORD = b"3\n"


def entries(ckpt: Checkpoint) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """Every state-dict key with its shape and dtype, in write order, from shapes alone (a lazy
    checkpoint's placeholders suffice: torch's orientation is the canonical ``(G*H, in)``)."""
    assert all(gates.convention("torch", c).orientation != "in_out" for c in Cell)
    out = []
    for layer in ckpt.layers:
        for k in range(layer.num_layers):
            for key, d, fld in slab_plan(layer, k):
                arr = getattr(layer.params[k][d], fld)
                out.append((key, tuple(arr.shape), np.dtype(arr.dtype)))
    seen = {key for key, _, _ in out}
    for key, arr in ckpt.tensors.items():
        if key in seen:
            raise FormatError(f"tensor name '{key}' is used twice")
        out.append((key, tuple(np.shape(arr)), np.asarray(arr).dtype))
    return out


class _Recorder:
    """Stands in for the zip writer while ``torch.serialization._save`` runs: keeps the small records,
    and the names and sizes of the data records (their stand-in storages are never read)."""

    def __init__(self) -> None:
        self.head: list[tuple[str, Any, int]] = []
        self.data: list[tuple[str, int]] = []

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if name.startswith("data/"):
            self.data.append((name, int(nbytes)))
        else:
            self.head.append((name, data, nbytes))

    def write_record_metadata(self, name: str, nbytes: int) -> None:  # torch's skip_data mode
        self.data.append((name, int(nbytes)))


class PtStream:
    """A ``.pt`` being written slab by slab (see the module docstring); made by :func:`open_stream`."""

    def __init__(self, ckpt: Checkpoint, path: str | Path, fast_zip: bool = True) -> None:
        """``fast_zip=False``: torch's own pieces (``_save`` for the pickle, ``PyTorchFileWriter`` for the
        zip; same bytes, slower, needs torch); the default imports no torch."""
        self.ckpt, self.path = ckpt, Path(path)
        self.plan = entries(ckpt)
        self.next = 0  # index into self.plan of the next tensor to write
        self.zw: Any = None
        self.tail: zip_write.Tail | None = None
        self.held: dict[str, Any] = {}
        self.WRITE_BEHIND = False
        if fast_zip:
            self._open_own()
        else:
            self._open_torch()

    def _open_own(self) -> None:
        """Every byte made here (no torch): :func:`pickle_write.data_pkl`, torch's small records, the data
        records through :class:`zip_write.ZipWriter`, torch's tail (``version``) and its serialization id
        (:func:`pickle_write.serialization_id_names`)."""
        import sys

        head = [("data.pkl", pickle_write.data_pkl(self.plan)), (".format_version", b"1"),
                (".storage_alignment", str(ALIGNMENT).encode()), ("byteorder", sys.byteorder.encode())]
        self.sizes = [math.prod(shape) * np.dtype(dt).itemsize for _, shape, dt in self.plan]
        tail = [("version", VERSION_RECORD)]
        names = [n for n, _ in head] + [f"data/{i}" for i in range(len(self.plan))] + [n for n, _ in tail]
        self.tail = zip_write.Tail(tail, pickle_write.serialization_id_names(names))
        # the CRC (speed/crc32.py) and write() release the GIL: stream.stream_write may run the writing one slab
        # behind the reading, in a thread (two slabs in memory; the goal of a .pt is the file size)
        self.WRITE_BEHIND = True
        self.fh = directio.DirectWriter(self.path)  # around the page cache where allowed
        self.zw = zip_write.ZipWriter(self.fh, ALIGNMENT)
        for name, data in head:
            self.zw.write_record(name, data)

    def _open_torch(self) -> None:
        torch = require("torch", "torch")
        self.torch = torch
        ser = torch.serialization
        if hasattr(ser, "_save") and hasattr(torch._C, "PyTorchFileWriter"):
            stand_in = {key: _stand_in(torch, shape, dt) for key, shape, dt in self.plan}
            rec = _Recorder()
            ser._save(stand_in, rec, pickle, 2, False)
            del stand_in
            if [n for n, _ in rec.data] != [f"data/{i}" for i in range(len(self.plan))]:
                raise FormatError("torch.save laid out the storages differently than expected; please report")
            self.sizes = [n for _, n in rec.data]
            crc = ser.get_crc32_options() if hasattr(ser, "get_crc32_options") else True
            align = ser._get_storage_alignment() if hasattr(ser, "_get_storage_alignment") else 64
            self.fh = open(self.path, "wb")  # noqa: SIM115 -- closed in close()/abort()
            self.zw = torch._C.PyTorchFileWriter(self.fh, crc, align)
            for name, data, nbytes in rec.head:
                self.zw.write_record(name, data, nbytes)
        else:  # collected and handed to torch.save at close()
            self.fh = open(self.path, "wb")  # noqa: SIM115 -- closed in close()/abort()

    def _put(self, key: str, arr: np.ndarray) -> None:
        want_key, shape, dt = self.plan[self.next]
        if key != want_key or tuple(arr.shape) != shape or arr.dtype != dt:
            raise FormatError(f"internal: tensor '{key}' {arr.shape} arrived where '{want_key}' {shape} was "
                              "expected; please report")
        if self.zw is None:
            self.held[key] = arr
        else:
            arr = np.ascontiguousarray(arr)
            if arr.nbytes != self.sizes[self.next]:
                raise FormatError(f"internal: tensor '{key}' has {arr.nbytes} bytes, torch expects "
                                  f"{self.sizes[self.next]}; please report")
            if self.tail is not None:
                self.zw.write_record(f"data/{self.next}", arr)
            else:
                self.zw.write_record(f"data/{self.next}", self._storage(arr), arr.nbytes)
        self.next += 1

    def _storage(self, arr: np.ndarray):
        """The bytes of ``arr`` as a torch storage sharing its memory (no copy); ``b""`` when empty."""
        if not arr.nbytes:
            return b""
        import warnings

        with warnings.catch_warnings():  # a read-only array (a file mapping) is only read here
            warnings.simplefilter("ignore", UserWarning)
            return self.torch.from_numpy(arr).untyped_storage()

    def write_slab(self, i: int, k: int, dirs: list[DirectionParams]) -> None:
        """Write slab ``k`` of ``ckpt.layers[i]`` (calls come in order ``i`` ascending, ``k`` ascending)."""
        for key, arr in slab_items(self.ckpt.layers[i], k, dirs):
            self._put(key, arr)

    def close(self) -> list[str]:
        """Write the carried tensors and the zip's end; returns one line per layer naming its module."""
        for key, arr in self.ckpt.tensors.items():
            self._put(key, np.asarray(arr))
        if self.next != len(self.plan):
            raise FormatError(f"internal: {len(self.plan) - self.next} tensors were never written; please report")
        if self.zw is None:
            torch = require("torch", "torch")
            torch.save({k: torch.from_numpy(np.require(v, requirements="C")) for k, v in self.held.items()}, self.fh)
            self.held.clear()
        elif self.tail is not None:
            self.tail.write(self.zw)
            self.zw = None
        else:
            self.zw.write_end_of_file()
            self.zw = None
        self.fh.flush()
        self.fh.close()
        return [describe_module(layer) for layer in self.ckpt.layers]

    def abort(self) -> None:
        """Stop writing; the caller deletes the partial file."""
        self.zw = None
        self.held.clear()
        self.fh.close()


def _stand_in(torch, shape: tuple[int, ...], dt: np.dtype):
    """A tensor of ``shape``/``dt`` with no memory behind it, pickled as ``torch.from_numpy`` of the
    real array would be: ``torch.empty`` (C strides), but for an empty array numpy's strides (all 0),
    which ``from_numpy`` keeps."""
    if 0 in shape:
        return torch.from_numpy(np.empty(shape, dtype=dt))
    return torch.empty(shape, dtype=_torch_dtype(torch, dt))


def _torch_dtype(torch, dt: np.dtype):
    try:
        return torch.from_numpy(np.empty(0, dtype=dt)).dtype
    except TypeError as exc:
        raise FormatError(f"PyTorch has no dtype for numpy {dt}") from exc


def open_stream(ckpt: Checkpoint, path: str | Path, **_: Any) -> PtStream:
    """Start writing ``ckpt`` (its structure; parameters may be placeholders) to ``path``.

    Raises:
        DependencyError: torch is not installed.
        FormatError: two tensors with one name, a dtype torch lacks.
    """
    return PtStream(ckpt, path)


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as a ``torch.save`` dict of tensors, byte for byte what ``torch.save(state_dict,
    open(path, 'wb'))`` writes (root folder ``archive``), one slab at a time; returns one line per layer
    naming its module.

    Assumes the record's ``check`` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    return stream.stream_write(open_stream(ckpt, path), ckpt)

