"""safetensors files (``.safetensors``) with PyTorch's key names: writer, reader, and the torch runtime's view of a written file (:func:`load`).

The tensors and key names are exactly those of :func:`rnnconvert.conventions.torch_state.state_dict`
(``<layer>.weight_ih_l{k}[_reverse]`` ``(G*H, in)``, gates LSTM i,f,g,o / GRU r,z,n; LAYOUTS.md §12),
so ``model.load_state_dict(safetensors.torch.load_file(path))`` loads them into ``nn.LSTM/GRU/RNN``.
Reading needs no torch (``safetensors.numpy``); the key grouping is shared with the ``.pt`` reader
(:func:`rnnconvert.conventions.torch_state.group_state_dict`). The file format itself (8-byte little-endian
header length, JSON header, raw little-endian data) cannot hold code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...engine import stream
from ...errors import FormatError, require
from ...core.model import Checkpoint
from ...speed import directio
from ...conventions import torch_names as naming
from ...conventions import torch_state

ROUTE = "torch (safetensors tensors)"


def _load(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file: by the safetensors library when installed, else by :func:`load_own`."""
    import importlib

    records(path)  # the header checked strictly first (the library is laxer: floats, overlaps, BOMs)
    try:
        st = importlib.import_module("safetensors.numpy")
    except ImportError:
        return load_own(path)
    try:
        return st.load_file(str(path))
    except Exception as exc:  # safetensors raises SafetensorError and others
        raise FormatError(f"{path}: not a readable safetensors file: {exc}") from exc


def load_own(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, read without the library (a plain install): the 8-byte
    little-endian header length, the JSON header (each record ``dtype``, ``shape``, ``data_offsets``
    inside the data section, sizes matching shapes), the raw little-endian data; arrays in memory, in
    header order. Layout: ``safetensors/README.md`` (format section); dtypes :data:`DTYPES`.

    Raises:
        FormatError: a malformed header, an unknown dtype, a tensor outside the data section.
    """
    p = Path(path)
    try:
        out = {}
        with open(p, "rb") as fh:
            for key, dt, shape, start, nbytes in records(p):
                fh.seek(start)
                out[key] = np.frombuffer(fh.read(nbytes), dt).reshape(shape).astype(dt.newbyteorder("="))
        return out
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"the header names '{k}' twice (which record is meant is not defined)")
        out[k] = v
    return out


def _is_count(v: object) -> bool:
    """A non-negative JSON integer: not a float (``16.5``, ``16.0``), a bool or a string."""
    return type(v) is int and v >= 0


def read_header(path: str | Path) -> tuple[dict[str, Any], int, int]:
    """The parsed JSON header of safetensors file ``path``, its length and the file's size, checked as the
    format's specification says (``safetensors/README.md``): the 8-byte length inside the file and within the
    ``header_bytes`` limit of :mod:`rnnconvert.safety.budget` (json parsing costs about 20 times the header's size
    in memory: a 90 MB header took 1.6 GB), UTF-8 without a byte-order mark, one JSON object, no key twice.

    Raises:
        FormatError: a malformed header. BudgetError: a header over the limit.
    """
    from ...safety import budget

    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0] if size >= 8 else -1
            if not 2 <= n <= size - 8:
                raise FormatError(f"{p}: not a readable safetensors file (header of {n} bytes in {size})")
            if n > budget.limit("header_bytes"):
                raise budget.exceeded(p, "header_bytes", f"a safetensors header of {n:,} bytes")
            raw = fh.read(n)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    if raw.startswith(b"\xef\xbb\xbf"):
        raise FormatError(f"{p}: safetensors header starts with a byte-order mark; the format's header is "
                          "UTF-8 JSON without one")
    try:
        head = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        raise FormatError(f"{p}: safetensors header is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise FormatError(f"{p}: safetensors header is not valid JSON ({exc})") from exc
    except FormatError as exc:
        raise FormatError(f"{p}: safetensors header is ambiguous: {exc}") from exc
    except RecursionError as exc:
        raise FormatError(f"{p}: safetensors header nested too deeply") from exc
    if not isinstance(head, dict):
        raise FormatError(f"{p}: safetensors header is not a JSON object")
    return head, n, size


def records(path: str | Path) -> list[tuple[str, np.dtype, tuple[int, ...], int, int]]:
    """The tensors of a safetensors file's header, checked: ``(name, little-endian dtype, shape, byte offset
    in the file, byte count)`` in header order. Strictly as the specification says: shapes and
    ``data_offsets`` are non-negative JSON integers (not floats, bools or strings), sizes match shapes, and the
    byte ranges, sorted, tile the data section from its start to the end of the file without overlap or
    hole: no two tensors alias one range (2,000 names sharing 1 MiB would write 2 GB), no byte is left
    unaccounted for. At most the ``names`` limit of tensors.

    Raises:
        FormatError: a malformed header, an unknown dtype, a tensor outside the data section, overlapping
            or non-contiguous ranges. BudgetError: too many tensors, too large a header.
    """
    from ...safety import budget

    p = Path(path)
    names = {v[0]: k for k, v in DTYPES.items()}
    head, n, size = read_header(p)
    budget.check_count(p, "names", len(head), "tensors in the header")
    base = 8 + n
    out = []
    for key, rec in head.items():
        if key == "__metadata__":
            if not isinstance(rec, dict) or not all(isinstance(v, str) for v in rec.values()):
                raise FormatError(f"{p}: safetensors __metadata__ must map strings to strings")
            continue
        try:
            dt = np.dtype(names[rec["dtype"]]).newbyteorder("<")
            shape, offsets = rec["shape"], rec["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{p}: tensor '{key}' has a header record rnnconvert cannot read: {rec!r:.200}"
                              ) from exc
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape) and isinstance(offsets, list)
                and len(offsets) == 2 and all(_is_count(v) for v in offsets)):
            raise FormatError(f"{p}: tensor '{key}': shape and data_offsets must be lists of non-negative "
                              f"integers; found {rec!r:.200}")
        b, e = offsets
        shape = tuple(shape)
        if not b <= e <= size - base or e - b != int(np.prod(shape, dtype=object)) * dt.itemsize:
            raise FormatError(f"{p}: tensor '{key}' has a bad header record {rec!r:.200}")
        out.append((key, dt, shape, base + b, e - b))
    end = base
    for key, _, _, start, nbytes in sorted(out, key=lambda r: (r[3], r[3] + r[4])):
        if start != end:
            raise FormatError(f"{p}: tensor '{key}' starts at data offset {start - base:,}, not at "
                              f"{end - base:,} where the previous tensor ends: "
                              f"{'ranges overlap' if start < end else 'a hole in the data'}; refused (the "
                              "format's tensors tile the data section)")
        end = start + nbytes
    if end != size:
        raise FormatError(f"{p}: the tensors end at data offset {end - base:,}, the file at {size - base:,}; "
                          "refused (the format's tensors tile the data section)")
    return out


#: The reader can return a lazy checkpoint (``read(path, lazy=True)``: docs/performance.md "Streaming conversion").
LAZY = True


def _read_lazy(p: Path, nonlinearity: str) -> Checkpoint | None:
    """The lazy checkpoint of a safetensors file of ``torch.nn`` recurrent keys: the header checked
    (:func:`records`), every tensor a view of the mapped file (:class:`rnnconvert.speed.mapped.MappedFile`), the
    recurrent parameters read one slab at a time (:func:`rnnconvert.conventions.torch_state.lazy_state_dict`).
    ``None`` where the eager reader must decide (no ``torch.nn`` keys, hand-written cells beside them, a
    big-endian machine)."""
    import sys

    from ...core import names
    from ...speed.mapped import MappedFile

    if sys.byteorder != "little":
        return None
    recs = records(p)
    try:
        mf = MappedFile(p)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    sd = torch_state.strip_module_prefix({key: mf.array(start, dt, shape) for key, dt, shape, start, _ in recs})
    if not torch_state.has_torch_names(sd):
        return None
    ckpt = torch_state.lazy_state_dict(sd, mf, str(p), "safetensors", nonlinearity)
    return None if names.candidates(ckpt.tensors) else ckpt


def read(path: str | Path, *, nonlinearity: str = "tanh", map: Any = None, lazy: bool = False,
         **_: Any) -> Checkpoint:
    """Read PyTorch-named tensors (``nn.LSTM/GRU/RNN`` and ``nn.*Cell`` keys, any prefix, ``module.`` stripped);
    a file without such keys, or read with a name ``map``, goes through the foreign-name table
    (:mod:`rnnconvert.core.names`, docs/foreign-names.md). ``lazy=True``: the recurrent parameters are
    placeholders read one slab at a time from the mapped file (:func:`_read_lazy`; files the foreign-name
    table reads are read whole); otherwise every tensor is read by the safetensors library.

    Raises:
        FormatError: unreadable file, no recurrent keys, inconsistent shapes, ambiguous foreign names.
    """
    p = Path(path)
    if lazy and map is None:
        ckpt = _read_lazy(p, nonlinearity)
        if ckpt is not None:
            return ckpt
    sd = torch_state.strip_module_prefix(_load(p))
    if map is not None or not torch_state.has_torch_names(sd):
        from ...core import names

        return names.fallback(sd, str(p), "safetensors", {"map": map, "nonlinearity": nonlinearity})
    from ...core import names

    ckpt = torch_state.group_state_dict(sd, str(p), "safetensors", nonlinearity)
    return names.add_rest(ckpt, str(p), "safetensors", nonlinearity)  # hand-written cells beside them


def check(ckpt: Checkpoint, **opts: Any) -> list[str]:
    """What ``torch.nn`` cannot express is refused here too (see :func:`rnnconvert.conventions.torch_state.check`)."""
    return torch_state.check(ckpt, **opts)


#: The writer streams (one slab at a time; docs/performance.md "Streaming conversion").
STREAM = True
#: Header metadata. One key only: safetensors serialises ``__metadata__`` from a hash map, so the library
#: writes several keys in a different order from run to run; with one the bytes are deterministic.
METADATA = {"format": "pt"}
#: numpy dtype -> (safetensors dtype, rank). The rank is the position of the dtype in the safetensors
#: crate's ``Dtype`` enum: ``safetensors::tensor::prepare`` sorts tensors by descending dtype, then by
#: name (``safetensors/src/tensor.rs``; checked against ``safetensors.numpy.save`` in tests).
DTYPES = {np.dtype(np.bool_): ("BOOL", 0), np.dtype(np.uint8): ("U8", 1), np.dtype(np.int8): ("I8", 2),
          np.dtype(np.int16): ("I16", 3), np.dtype(np.uint16): ("U16", 4), np.dtype(np.float16): ("F16", 5),
          np.dtype(np.int32): ("I32", 7), np.dtype(np.uint32): ("U32", 8), np.dtype(np.float32): ("F32", 9),
          np.dtype(np.float64): ("F64", 10), np.dtype(np.int64): ("I64", 11), np.dtype(np.uint64): ("U64", 12)}


def header(specs: dict[str, tuple[np.dtype, tuple[int, ...]]], metadata: dict[str, str] | None = METADATA
           ) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The bytes before the data (8-byte little-endian length, JSON header padded with spaces to a multiple
    of 8) and each tensor's ``(begin, end)`` in the data section, for tensors ``name -> (dtype, shape)``:
    the layout ``safetensors.serialize_file`` writes (``safetensors/src/tensor.rs`` ``prepare``: order by
    descending dtype then name, compact JSON, ``__metadata__`` first), computed without the data.

    Raises:
        FormatError: a dtype safetensors cannot store.
    """
    for name, (dt, _) in specs.items():
        if np.dtype(dt).newbyteorder("=") not in DTYPES:
            raise FormatError(f"tensor '{name}' has dtype {np.dtype(dt)}, which safetensors cannot store")
    order = sorted(specs, key=lambda n: (-DTYPES[np.dtype(specs[n][0]).newbyteorder("=")][1], n))
    head: dict[str, Any] = {"__metadata__": metadata} if metadata is not None else {}
    offsets, pos = {}, 0
    for name in order:
        dt, shape = specs[name]
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        offsets[name] = (pos, pos + n)
        head[name] = {"dtype": DTYPES[np.dtype(dt).newbyteorder("=")][0], "shape": [int(d) for d in shape],
                      "data_offsets": [pos, pos + n]}
        pos += n
    js = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, offsets


def _bytes(arr: np.ndarray) -> memoryview:
    """``arr``'s bytes, little-endian, C order (no copy when they already are)."""
    a = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return memoryview(a.reshape(-1)).cast("B") if a.size else memoryview(b"")


class StreamWriter:
    """Writes a safetensors file one slab at a time (:func:`open_stream`): the header is computed from
    the skeleton's shapes, each slab's tensors are written at their offsets as they arrive, around the page
    cache where allowed (:class:`.directio.ScatterWriter`: the library's order, by dtype then name, is not
    the order of the slabs)."""

    def __init__(self, ckpt: Checkpoint, path: str | Path) -> None:
        self.ckpt = ckpt
        specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self.pending: set[tuple[int, int]] = set()
        for i, layer in enumerate(ckpt.layers):
            for k, dirs in enumerate(layer.params):
                self.pending.add((i, k))
                for key, d, f in torch_state.slab_plan(layer, k):
                    a = getattr(dirs[d], f)
                    specs[key] = (a.dtype, tuple(a.shape))  # torch's layout is the canonical one: same shapes
        for key, arr in ckpt.tensors.items():
            if key in specs:
                raise FormatError(f"tensor name '{key}' is used twice")
            specs[key] = (np.asarray(arr).dtype, tuple(np.shape(arr)))
        head, self.offsets = header(specs)
        self.specs, self.base = specs, len(head)
        end = self.base + max([e for _, e in self.offsets.values()], default=0)
        self.out = directio.ScatterWriter(path, end)
        try:
            self.out.pwrite(head, 0)
            for key, arr in ckpt.tensors.items():
                self._put(key, np.asarray(arr))
        except BaseException:
            self.abort()
            raise

    def _put(self, key: str, arr: np.ndarray) -> None:
        if (arr.dtype.newbyteorder("="), tuple(arr.shape)) != (np.dtype(self.specs[key][0]).newbyteorder("="),
                                                               self.specs[key][1]):
            raise FormatError(f"tensor '{key}': {arr.dtype} {arr.shape} arrived for {self.specs[key]}")
        self.out.pwrite(_bytes(arr), self.base + self.offsets[key][0])

    def write_slab(self, i: int, k: int, dirs: list) -> None:
        """Write stacked layer ``k`` of ``layers[i]`` (its directions ``dirs``, canonical arrays)."""
        for key, arr in torch_state.slab_items(self.ckpt.layers[i], k, dirs):
            self._put(key, arr)
            self.ckpt.release_array(arr)  # written: its pages of a mapped source go now
        self.pending.discard((i, k))

    def close(self) -> list[str]:
        """Finish the file; one line per layer names its ``torch.nn`` module."""
        if self.pending:
            raise FormatError(f"safetensors stream closed with {len(self.pending)} slab(s) not written")
        self.out.close()
        return [naming.describe_module(layer) for layer in self.ckpt.layers]

    def abort(self) -> None:
        """Release the file (the caller deletes it)."""
        self.out.abort()


def open_stream(ckpt: Checkpoint, path: str | Path, **_: Any) -> StreamWriter:
    """Start writing ``ckpt`` (a lazy skeleton is enough: shapes, names, carried tensors) to ``path``.

    The bytes equal ``safetensors.numpy.save_file(torch_state.state_dict(ckpt), path, metadata=METADATA)``
    (tested). Assumes :func:`check` passed (the engine calls it,
    once: :mod:`rnnconvert.engine.protocol`)."""
    return StreamWriter(ckpt, path)


def write(ckpt: Checkpoint, path: str | Path, **opts: Any) -> list[str]:
    """Write the PyTorch state dict of ``ckpt`` as safetensors; one line per layer names its ``torch.nn`` module.

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    return stream.stream_write(open_stream(ckpt, path, **opts), ckpt)


_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


def mapped(path: str | Path, prefix: str = "") -> dict[str, np.ndarray]:
    """The float tensors of a safetensors file whose names start with ``prefix``, as copy-on-write memory
    maps of the file (nothing is read until used; no copy of a multi-GB file). Used for verification of
    a file rnnconvert just wrote; the header is still checked (:func:`records`).

    Raises:
        FormatError: a malformed header or a tensor outside the data section.
    """
    p = Path(path)
    recs = records(p)
    size = p.stat().st_size
    base = min((start for _, _, _, start, _ in recs), default=size)
    data_len = size - base
    mm = np.memmap(p, dtype=np.uint8, mode="c", offset=base, shape=(data_len,)) if data_len else None
    out = {}
    for key, dt, shape, start, nbytes in recs:
        if not key.startswith(prefix):
            continue
        if dt.newbyteorder("=") not in [np.dtype(t) for t in _NP_DTYPES.values()]:
            raise FormatError(f"{p}: tensor '{key}' is not a float tensor ({dt})")
        b = start - base
        out[key] = mm[b:b + nbytes].view(dt.newbyteorder("=")).reshape(shape) if nbytes else np.zeros(shape, dt)
    return out


def load(path: str | Path, layer, k: int | None = None) -> dict:
    """The torch runtime's view of a written safetensors file (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`):
    layer ``layer``'s ``torch.nn`` tensors as torch tensors over memory maps of the file (:func:`mapped`; nothing is
    read until used). ``k`` is not needed: only what the runtime asks for is touched."""
    torch = require("torch", "torch")
    name = layer.name
    return {key: torch.from_numpy(v) for key, v in mapped(path, f"{name}.").items()
            if naming.PARAM_NAME.match(key[len(name) + 1:])}  # a carried tensor under the same prefix is not the module's

