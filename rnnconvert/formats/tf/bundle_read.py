"""A pure-Python reader of TensorFlow V2 checkpoint bundles (``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``).

TensorFlow writes every checkpoint since TF 1.x's ``Saver(write_version=V2)`` -- TF1 ``Saver``, TF2
``save_weights``/``tf.train.Checkpoint``, a SavedModel's ``variables/`` -- as one *bundle*. This module reads
one without TensorFlow: no C++ runs, so a damaged file can only raise :class:`~rnnconvert.errors.FormatError`
(TensorFlow's reader aborts the process on some forged ``.index`` files), and each tensor is one ``readinto``.

Layout facts (TensorFlow sources: ``tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc}``, ``naming.cc``,
``tensorflow/core/protobuf/tensor_bundle.proto``; the table: ``tsl/lib/io/{format,block,table}.cc``,
leveldb's ``doc/table_format.md``; ``tensorflow/core/framework/{types,tensor_shape,versions}.proto``):

* ``.index`` is an SSTable. Its last 48 bytes are the footer: two block handles (varint64 offset, varint64
  size: the metaindex block, then the index block), zero padding to 40 bytes, the fixed64 magic
  ``0xdb4775248b80fb57``. Every block is followed by a 5-byte trailer: the compression type (0 none,
  1 snappy; bundles are written uncompressed) and the *masked* crc32c of the block and the type byte.
  A block holds entries ``varint32 shared, varint32 non_shared, varint32 value_length, key[shared:],
  value``; each key shares ``shared`` leading bytes with the previous key; the block ends with a uint32
  restart array and its uint32 count. The index block maps a key to the handle of the data block
  holding the keys up to it. Keys are sorted and distinct.
* Key ``""`` holds a ``BundleHeaderProto`` (``num_shards`` 1, ``endianness`` 2: 0 little / 1 big,
  ``version`` 3: a ``VersionDef``; the reader's version is 1, so ``min_consumer > 1`` is a newer format).
  Every other key is a ``BundleEntryProto``: ``dtype`` 1 (``DataType``), ``shape`` 2 (``TensorShapeProto``:
  ``dim`` 2 {``size`` 1}, ``unknown_rank`` 3), ``shard_id`` 3, ``offset`` 4, ``size`` 5, ``crc32c`` 6 (fixed32,
  masked crc32c of the stored bytes), ``slices`` 7 (``TensorSliceProto``: ``extent`` 1 {``start`` 1,
  ``length`` 2, absent = the whole dimension}).
* A partitioned variable (TF1 ``partitioner=``, TF2 ``MaxShardSizePolicy``) has an entry with ``slices``
  and no data of its own; each slice is an ordinary entry under the key ``EncodeTensorNameSlice(name,
  slice)`` (``tensorflow/core/util/saved_tensor_slice_util.cc``, OrderedCode of
  ``tensorflow/core/lib/strings/ordered_code.cc``), listed by neither reader. The slices must tile the
  tensor exactly.
* Shard ``k`` of ``n`` is ``<prefix>.data-%05d-of-%05d``. A numeric tensor is its ``size`` raw
  little-endian bytes at ``offset`` (row-major), ``size == itemsize * prod(shape)``. A string tensor is
  ``varint64`` lengths, a masked crc32c of the lengths (each as a little-endian uint32, or uint64 when
  over 2**32-1; writers before TF 2.x used uint64 always), then the bytes; the entry's crc32c covers
  the lengths as hashed, the stored length checksum and the bytes.

Declined with :class:`BundleUnsupported` (the caller falls back to TensorFlow): big-endian bundles,
compressed blocks, ``min_consumer > 1``, dtypes outside :data:`DTYPES` (``bfloat16`` needs ``ml_dtypes``;
strings are read whole, not partitioned), variables of more than :data:`MAX_SLICES` slices. Everything
inconsistent (offsets past the end of a file, sizes that disagree with shapes, slices that do not tile
their variable, bad checksums, broken varints or protobufs) raises FormatError naming the file and key.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from ...speed import crc32c
from ...errors import FormatError
from ...speed import filerows
from .table_read import BundleUnsupported, TableError, fields, int64, read_table, slice_key, text, varint

#: TensorFlow ``DataType`` enum values (types.proto) -> numpy dtype; 7 (DT_STRING) is handled apart.
DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 9: "<i8", 10: "?", 17: "<u2",
          19: "<f2", 22: "<u4", 23: "<u8"}
DT_STRING, DT_BFLOAT16 = 7, 14
#: Upper bound on a dimension product (TensorShape's own limit is 2**63-1 elements).
MAX_ELEMENTS = 1 << 62
#: More slices than this in one variable are left to TensorFlow (the overlap check is quadratic).
MAX_SLICES = 1024


# ------------------------------------------------------------------------------------------ the bundle
class Entry:
    """One ``BundleEntryProto``: dtype (TF enum), shape, shard, offset, size, crc32c (unmasked), and for a
    partitioned variable its slices (per slice: one (start, length) per dimension, length -1 = whole)
    and, once resolved, ``parts``: per slice (index tuple into the full tensor, the slice's Entry)."""

    __slots__ = ("crc", "dtype", "offset", "parts", "shape", "shard", "size", "slices")

    def __init__(self, value: bytes):
        self.dtype, self.shape, self.shard, self.offset, self.size, self.crc = 0, [], 0, 0, 0, None
        self.slices: list[list[tuple[int, int]]] = []
        self.parts: list[tuple[tuple[slice, ...], Entry]] = []
        for num, wt, val in fields(value):
            if num == 1 and wt == 0:
                self.dtype = val
            elif num == 2 and wt == 2:
                self.shape = _shape(value, val)
            elif num == 3 and wt == 0:
                self.shard = int64(val)
            elif num == 4 and wt == 0:
                self.offset = int64(val)
            elif num == 5 and wt == 0:
                self.size = int64(val)
            elif num == 6 and wt == 5:
                self.crc = crc32c.unmask(val)
            elif num == 7 and wt == 2:
                self.slices.append(_extents(value, val))


def _shape(buf: bytes, span) -> list[int]:
    dims = []
    for num, wt, val in fields(buf, *span):
        if num == 2 and wt == 2:
            size = 0
            for n2, w2, v2 in fields(buf, *val):
                if n2 == 1 and w2 == 0:
                    size = int64(v2)
            if size < 0:
                raise TableError(f"negative dimension {size}")
            dims.append(size)
        elif num == 3 and wt == 0 and val:
            raise TableError("shape of unknown rank")
    return dims


def _extents(buf: bytes, span) -> list[tuple[int, int]]:
    """A ``TensorSliceProto`` (``extent`` 1: {``start`` 1, ``length`` 2, absent = the whole dimension})."""
    out = []
    for num, wt, val in fields(buf, *span):
        if num == 1 and wt == 2:
            start, length = 0, -1
            for n2, w2, v2 in fields(buf, *val):
                if n2 == 1 and w2 == 0:
                    start = int64(v2)
                elif n2 == 2 and w2 == 0:
                    length = int64(v2)
            out.append((start, length))
    return out


def _dtype(code: int) -> np.dtype:
    if code in DTYPES:
        return np.dtype(DTYPES[code])
    if code == DT_BFLOAT16:
        try:
            import ml_dtypes  # optional (a TensorFlow and JAX dependency)
        except ImportError as exc:
            raise BundleUnsupported("bfloat16 tensors need the ml_dtypes package") from exc
        return np.dtype(ml_dtypes.bfloat16)
    if code == DT_STRING:
        return np.dtype(object)
    raise BundleUnsupported(f"TensorFlow dtype {code}")


def _count(shape: list[int], where: str) -> int:
    count = 1
    for d in shape:
        count *= d
        if count > MAX_ELEMENTS:
            raise FormatError(f"{where}: shape {shape} has too many elements")
    return count


class BundleReader:
    """The variables of a V2 checkpoint bundle; the subset of ``tf.train.load_checkpoint``'s reader that
    rnnconvert uses (:meth:`get_variable_to_shape_map`, :meth:`get_variable_to_dtype_map`, :meth:`get_tensor`).

    Opening parses and checks the whole ``.index`` (every entry's shape against its size and its shard
    file's length); tensors are read one at a time on demand, each into a fresh array with one
    ``readinto`` at its offset, then its crc32c is checked (:mod:`rnnconvert.speed.crc32c`; numpy, about
    1.5 GB/s on one core, unless a C implementation is installed).

    Raises:
        FormatError: anything inconsistent, naming the file (and the key).
        BundleUnsupported: a valid bundle this reader does not handle (see the module docstring).
    """

    def __init__(self, prefix: str | Path, where: str | Path | None = None):
        self.prefix = str(prefix)
        self.index = self.prefix + ".index"
        self.where = str(where) if where is not None else self.index  # how messages name the checkpoint
        try:
            if not stat.S_ISREG(os.stat(self.index).st_mode):  # a FIFO or device would block or never end
                raise FormatError(f"{self.where}: {self.index} is not a regular file")
            data = Path(self.index).read_bytes()
        except OSError as exc:
            raise FormatError(f"{self.where}: cannot read the checkpoint index {self.index} ({exc.strerror})") from exc
        try:
            table = read_table(data)
        except TableError as exc:
            raise FormatError(f"{self.where}: damaged TensorFlow checkpoint index: {exc}") from exc
        if not table or table[0][0] != b"":
            raise FormatError(f"{self.where}: damaged TensorFlow checkpoint index: no bundle header entry")
        self.num_shards = self._header(table[0][1])
        raw: dict[bytes, Entry] = {}
        for raw_key, value in table[1:]:
            try:
                raw[raw_key] = Entry(value)
            except TableError as exc:
                raise FormatError(f"{self.where}: damaged index entry of variable "
                                  f"'{raw_key.decode('utf-8', 'replace')}': {exc}") from exc
        sizes: dict[int, int] = {}
        hidden: set[bytes] = set()  # the slices' own entries, listed by neither reader
        for raw_key, e in raw.items():
            if e.slices:
                hidden.update(self._resolve(raw_key, e, raw, sizes))
        self.entries: dict[str, Entry] = {}
        for raw_key, e in raw.items():
            if raw_key not in hidden:
                key = raw_key.decode("utf-8", "replace")
                if key in self.entries:  # two keys that are not UTF-8 and differ only where undecodable
                    raise FormatError(f"{self.where}: two variables named '{key}' (keys that are not UTF-8)")
                if not e.slices:
                    self._check(key, e, sizes)
                self.entries[key] = e

    def _header(self, value: bytes) -> int:
        shards, endian, min_consumer, bad = 0, 0, 0, []
        try:
            for num, wt, val in fields(value):
                if num == 1 and wt == 0:
                    shards = int64(val)
                elif num == 2 and wt == 0:
                    endian = val
                elif num == 3 and wt == 2:
                    for n2, w2, v2 in fields(value, *val):
                        if n2 == 2 and w2 == 0:
                            min_consumer = int64(v2)
                        elif n2 == 3 and w2 == 0:
                            bad.append(int64(v2))
        except TableError as exc:
            raise FormatError(f"{self.where}: damaged bundle header: {exc}") from exc
        if not 1 <= shards <= 99999:
            raise FormatError(f"{self.where}: damaged bundle header: {shards} shards")
        if endian != 0:
            raise BundleUnsupported("big-endian bundle")
        if min_consumer > 1 or 1 in bad:
            raise BundleUnsupported(f"bundle format for readers of version {min_consumer} and later")
        return shards

    def _resolve(self, raw_key: bytes, e: Entry, raw: dict[bytes, Entry], sizes: dict[int, int]) -> list[bytes]:
        """Check a partitioned variable: each slice's entry exists, lies inside the full shape with the
        dtype of the whole and the slice's shape, and the slices tile the tensor exactly (no overlap, all
        covered). Fills ``e.parts``; returns the slices' keys."""
        key = raw_key.decode("utf-8", "replace")
        where = f"{self.where}: variable '{key}'"
        count = _count(e.shape, where)
        if len(e.slices) > MAX_SLICES:
            raise BundleUnsupported(f"'{key}' has {len(e.slices)} slices")
        if _dtype(e.dtype).kind == "O":
            raise BundleUnsupported(f"'{key}': a partitioned string tensor")
        keys, boxes, covered = [], [], 0
        for ext in e.slices:
            if len(ext) != len(e.shape):
                raise FormatError(f"{where}: slice of rank {len(ext)} of a tensor of shape {e.shape}")
            box = []
            for (start, length), dim in zip(ext, e.shape):
                stop = dim if length == -1 and start == 0 else start + length
                if start < 0 or length < -1 or stop > dim or (length == -1 and start != 0):
                    raise FormatError(f"{where}: slice {ext} outside shape {e.shape}")
                box.append((start, stop))
            sk = slice_key(raw_key, ext)
            part = raw.get(sk)
            if part is None or part.slices:
                raise FormatError(f"{where}: the entry of its slice {ext} is missing")
            if part.dtype != e.dtype or part.shape != [b - a for a, b in box]:
                raise FormatError(f"{where}: slice {ext} stored as dtype {part.dtype} shape {part.shape}")
            self._check(f"{key}' slice '{ext}", part, sizes)
            for other in boxes:
                if all(a < d and c < b for (a, b), (c, d) in zip(box, other)):
                    raise FormatError(f"{where}: slices overlap")
            boxes.append(box)
            covered += _count([b - a for a, b in box], where)
            keys.append(sk)
            e.parts.append((tuple(slice(a, b) for a, b in box), part))
        if covered != count:
            raise FormatError(f"{where}: its slices cover {covered} of {count} elements")
        return keys

    def shard_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    def _check(self, key: str, e: Entry, sizes: dict[int, int]) -> None:
        where = f"{self.where}: variable '{key}'"
        if not 0 <= e.shard < self.num_shards:
            raise FormatError(f"{where}: shard {e.shard} of {self.num_shards}")
        if e.shard not in sizes:
            try:
                st = os.stat(self.shard_path(e.shard))
            except OSError as exc:
                raise FormatError(f"{where}: its data file {self.shard_path(e.shard)} is missing "
                                  f"({exc.strerror})") from exc
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(f"{where}: its data file {self.shard_path(e.shard)} is not a regular file")
            sizes[e.shard] = st.st_size
        count = _count(e.shape, where)
        dt = _dtype(e.dtype)
        if dt.kind == "O":
            if e.size < count + 4 * (count > 0):
                raise FormatError(f"{where}: {e.size} bytes cannot hold {count} strings")
        elif e.size != count * dt.itemsize:
            raise FormatError(f"{where}: shape {e.shape} {dt.name} needs {count * dt.itemsize} bytes, the "
                              f"entry says {e.size}")
        if e.offset < 0 or e.offset + e.size > sizes[e.shard]:
            raise FormatError(f"{where}: bytes [{e.offset}, {e.offset + e.size}) lie past the end of "
                              f"{self.shard_path(e.shard)} ({sizes[e.shard]} bytes): the .data file is "
                              "shorter than its .index says")
        if e.crc is None and e.size:
            raise FormatError(f"{where}: entry without a checksum")

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        return {k: list(e.shape) for k, e in self.entries.items()}

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        return {k: _dtype(e.dtype) for k, e in self.entries.items()}

    def get_tensor(self, key: str, out: np.ndarray | None = None):
        """Variable ``key``: a fresh writable numpy array (dtype and shape as stored), or ``out`` filled when
        it is C-contiguous of that shape and dtype (verification reuses buffers); a scalar string tensor
        as ``bytes``, other string tensors as object arrays of ``bytes``.

        Raises:
            KeyError: no such variable. FormatError: the bytes are short or fail their checksum."""
        e = self.entries[key]
        dt = _dtype(e.dtype)
        if e.slices:  # a partitioned variable (numeric: see _resolve), assembled from its slices
            out = np.empty(e.shape, dt)
            for index, part in e.parts:
                dest = out[index]
                if dest.flags.c_contiguous:  # slices along the first axis: read in place
                    self._read(key, part, dt, dest)
                else:
                    dest[...] = self._read(key, part, dt, np.empty(part.shape, dt))
            return out
        if dt.kind == "O":
            return self._strings(key, e, self._read(key, e, dt, bytearray(e.size)))
        fits = (out is not None and out.shape == tuple(e.shape) and out.dtype == dt and out.flags.c_contiguous)
        return self._read(key, e, dt, out if fits else np.empty(e.shape, dt))

    def mapped(self, key: str) -> np.ndarray | None:
        """Variable ``key`` as a read-only memory map of its bytes in the ``.data`` shard, when it is a plain
        (unpartitioned) numeric entry of at least :data:`.filerows.DIRECT_MIN_BYTES` bytes lying inside its shard;
        else ``None``. Its crc32c is not checked: verification uses this to read again, in place, the bytes
        the conversion has just read through :meth:`rows` and checked."""
        e = self.entries[key]
        dt = _dtype(e.dtype)
        if e.slices or dt.kind not in "fiu" or e.size < filerows.DIRECT_MIN_BYTES or e.size != _count(e.shape, key) * dt.itemsize:
            return None
        path = self.shard_path(e.shard)
        try:
            if e.offset + e.size > os.path.getsize(path):
                return None
            return np.memmap(path, dtype=dt, mode="r", offset=e.offset, shape=tuple(e.shape))
        except (OSError, ValueError):
            return None

    def rows(self, key: str):
        """Variable ``key`` as a source of row blocks (:class:`RowSource`, read front to back by
        ``interpreter._rows``: one layer's kernel turned block by block, never held whole) when it is a plain
        2-D numeric entry; otherwise the whole tensor (:meth:`get_tensor`)."""
        e = self.entries[key]
        dt = _dtype(e.dtype)
        if e.slices or dt.kind not in "fiub" or len(e.shape) != 2:
            return self.get_tensor(key)
        return RowSource(self, key, e, dt)

    def _read(self, key: str, e: Entry, dt: np.dtype, buf):
        """The entry's bytes into ``buf`` (a C-contiguous array, or a bytearray for strings); the crc32c of
        numeric tensors checked."""
        path = self.shard_path(e.shard)
        view = memoryview(buf).cast("B") if dt.kind == "O" else memoryview(buf.reshape(-1).view(np.uint8))
        self._read_parts_exact(key, path, e.offset, [view[:e.size]])
        if dt.kind == "O":
            return bytes(buf)
        if crc32c.value(view) != e.crc:
            raise self.damaged(key, path)
        return buf

    def damaged(self, key: str, path: str) -> FormatError:
        """The error for variable ``key`` whose bytes in ``path`` do not match the index's crc32c."""
        return FormatError(f"{self.where}: variable '{key}': checksum does not match (crc32c of its bytes in "
                           f"{path}): the .data file is damaged")

    def _read_parts_exact(self, key: str, path: str, offset: int, parts: list[memoryview]) -> None:
        """Fill the consecutive ``parts`` from ``path`` at ``offset`` (:func:`.filerows.read_parts`).

        Raises:
            FormatError: the file cannot be read, or ends before every part is full."""
        try:
            filerows.read_parts(path, offset, parts)
        except OSError as exc:
            raise FormatError(f"{self.where}: cannot read variable '{key}' from {path} ({exc.strerror})") from exc
        except EOFError:
            raise FormatError(f"{self.where}: variable '{key}': {path} is shorter than its .index says") from None

    def _strings(self, key: str, e: Entry, data: bytes):
        path = self.shard_path(e.shard)
        count = int(np.prod(e.shape, dtype=np.int64)) if e.shape else 1
        where = f"{self.where}: variable '{key}' (in {path})"
        lengths, pos = [], 0
        try:
            for _ in range(count):
                n, pos = varint(data, pos, len(data))
                lengths.append(n)
        except TableError as exc:
            raise FormatError(f"{where}: damaged string lengths ({exc})") from exc
        if pos + 4 + sum(lengths) != len(data):
            raise FormatError(f"{where}: string lengths disagree with the entry size")
        stored = data[pos: pos + 4]
        ok = False
        for wide in (False, True):  # lengths hashed as uint32 (current writers) or uint64 (older ones)
            raw = b"".join(n.to_bytes(8 if wide or n > 0xFFFFFFFF else 4, "little") for n in lengths)
            crc = crc32c.value(raw)
            if crc32c.unmask(int.from_bytes(stored, "little")) == crc:
                ok = crc32c.extend(crc32c.extend(crc, stored), data[pos + 4:]) == e.crc
                break
        if not ok:
            raise FormatError(f"{where}: checksum does not match (crc32c): the .data file is damaged")
        out, pos = [], pos + 4
        for n in lengths:
            out.append(data[pos: pos + n])
            pos += n
        if not e.shape:
            return out[0]
        arr = np.empty(count, dtype=object)
        arr[:] = out
        return arr.reshape(e.shape)


# ------------------------------------------------------------------------------------------ object graph
def object_graph(blob: bytes, where: str = "") -> list[tuple[list[tuple[int, str]], list[tuple[str, str, str]]]]:
    """Decode a serialized ``TrackableObjectGraph`` (``tensorflow/core/protobuf/trackable_object_graph.proto``:
    ``nodes`` 1 -> ``TrackableObject`` {``children`` 1: ``ObjectReference`` {``node_id`` 1, ``local_name`` 2};
    ``attributes`` 2: ``SerializedTensor`` {``name`` 1, ``full_name`` 2, ``checkpoint_key`` 3}}): per node,
    its children as (node_id, local_name) and its attributes as (name, full_name, checkpoint_key).

    Raises:
        FormatError: the bytes are not such a protobuf."""
    if not isinstance(blob, (bytes, bytearray)):
        raise FormatError(f"{where}: _CHECKPOINTABLE_OBJECT_GRAPH in the TensorFlow checkpoint is not a scalar "
                          "string")
    nodes = []
    try:
        for num, wt, span in fields(blob):
            if num != 1 or wt != 2:
                continue
            children, attrs = [], []
            for n2, w2, v2 in fields(blob, *span):
                if n2 == 1 and w2 == 2:
                    node_id, name = 0, ""
                    for n3, w3, v3 in fields(blob, *v2):
                        if n3 == 1 and w3 == 0:
                            node_id = int64(v3)
                        elif n3 == 2 and w3 == 2:
                            name = text(blob, v3)
                    children.append((node_id, name))
                elif n2 == 2 and w2 == 2:
                    a = ["", "", ""]
                    for n3, w3, v3 in fields(blob, *v2):
                        if 1 <= n3 <= 3 and w3 == 2:
                            a[n3 - 1] = text(blob, v3)
                    attrs.append(tuple(a))
            nodes.append((children, attrs))
    except TableError as exc:
        raise FormatError(f"{where}: damaged _CHECKPOINTABLE_OBJECT_GRAPH in the TensorFlow checkpoint "
                          f"({exc})") from exc
    return nodes


class RowSource:
    """A 2-D bundle entry read in row blocks, front to back, like an HDF5 dataset's ``read_direct``
    (``shape``, ``dtype``, ``read_direct(out, rows, dest)``). The crc32c is extended block by block and
    checked when the last row is read, so a caller that consumes every row (``interpreter._rows``) has the
    checksum verified before it returns anything. The destination rows may lie further apart than their
    length (:data:`PADDED_ROWS`: ``interpreter._rows`` pads long rows): they are then filled by one scatter
    read (``os.preadv``)."""

    #: ``read_direct`` accepts a destination whose rows are contiguous but lie further apart than their length.
    PADDED_ROWS = True

    def __init__(self, reader: "BundleReader", key: str, e: Entry, dt: np.dtype) -> None:
        self.reader, self.key, self.e = reader, key, e
        self.shape, self.dtype = tuple(e.shape), dt
        self.row_bytes = int(e.shape[1]) * dt.itemsize
        self.next_row, self.crc = 0, 0

    def __getitem__(self, _):
        return self.reader.get_tensor(self.key)

    def read_direct(self, out: np.ndarray, rows: slice, dest: slice | tuple | None = None) -> None:
        r0, r1 = rows.start or 0, min(rows.stop, self.shape[0])
        if r0 != self.next_row:
            raise ValueError(f"rows of '{self.key}' must be read in order ({r0} after {self.next_row})")
        target = out[dest] if dest is not None else out
        path = self.reader.shard_path(self.e.shard)
        offset = self.e.offset + r0 * self.row_bytes
        if target.dtype != self.dtype:
            raise ValueError("read_direct needs a block of the variable's dtype")
        parts = filerows.row_parts(target, r1 - r0, self.row_bytes)
        self.reader._read_parts_exact(self.key, path, offset, parts)
        for part in parts:
            self.crc = crc32c.extend(self.crc, part)
        self.next_row = r1
        if r1 == self.shape[0] and self.crc != self.e.crc:
            raise self.reader.damaged(self.key, path)
