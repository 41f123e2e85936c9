"""The parts of a ``.pt`` file that ``torch.save`` computes in Python or C++, made without torch.

With :class:`rnnconvert.formats.torch.zip_write.ZipWriter` (the zip container) this lets
:mod:`rnnconvert.formats.torch.pt_write` write the bytes of ``torch.save(state_dict, fileobj)`` where torch
is not installed. Two pieces:

* :func:`data_pkl`: ``archive/data.pkl``, the protocol-2 pickle that ``torch.serialization._save``
  makes of a flat ``dict`` of CPU tensors (``torch/serialization.py``: a ``pickle.Pickler`` whose
  ``persistent_id`` turns each storage into ``('storage', torch.<T>Storage, '<key>', 'cpu', numel)``,
  storage keys ``'0'..'N-1'`` in first-seen order; ``torch/_tensor.py`` ``Tensor.__reduce_ex__`` /
  ``torch/_utils.py`` ``_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  backward_hooks)`` with ``backward_hooks = collections.OrderedDict()``). The opcodes are those of
  CPython's C pickler (``Modules/_pickle.c``) at protocol 2: ``BINUNICODE`` strings, memo ``BINPUT``/
  ``LONG_BINPUT`` after every string, global, tuple of 1+ items and reduced object, ``BINGET`` on a
  repeated object (one ``GLOBAL`` per storage class, and the ``'storage'`` and ``'cpu'`` constants:
  keys are taken to be other objects than those two interned constants, as keys read from a file
  are; a state dict whose key is the interned ``'cpu'`` pickles differently in torch),
  ``BININT1``/``BININT2``/``BININT``/``LONG1`` by size, ``TUPLE1..3`` or ``MARK .. TUPLE``, and a dict
  of one item as ``SETITEM``, else ``MARK .. SETITEMS`` batches of 1000 (``BATCHSIZE``; a dict whose
  size is a multiple of 1000 ends with an empty batch).
* :func:`serialization_id_names`: the first 20 digits of ``.data/serialization_id``, a
  ``c10::hash_combine`` fold (``c10/util/hash.h``) of ``std::hash<std::string>`` of every record name
  in the iteration order of the ``std::unordered_set<std::string>`` that holds them
  (``caffe2/serialize/inline_container.cc`` ``writeSerializationId``). Computed as torch's Linux
  wheels compute it, with GNU libstdc++: ``std::hash`` is ``std::_Hash_bytes(p, n, 0xc70f6907)``
  (``libstdc++-v3/libsupc++/hash_bytes.cc``, the 64-bit branch), the set a ``_Hashtable`` with cached
  hash codes, bucket ``hash % buckets``, a node entering an empty bucket going to the front of the
  list (``_M_insert_bucket_begin``) and rehashing relinking in list order (``_M_rehash_aux``), bucket
  counts from ``_Prime_rehash_policy`` (:data:`BUCKETS`, measured with g++ 12 / libstdc++ 6.0.30:
  the counts after each insertion into a default-constructed set). torch built against another C++
  library (macOS libc++, MSVC) computes other digits; torch never reads the id back (it names a
  save for tracing), so such a file still loads the same.

Checked byte for byte against ``torch.save`` by ``tests/formats/torch_files/test_pt_pickle.py`` (dtypes, empty and
0-d tensors, one key, 1000 and 2500 keys, large element counts, keys '0' and 'cpu').
"""

from __future__ import annotations

import math
import struct

import numpy as np

from ...errors import FormatError

#: numpy dtype -> the legacy storage class torch pickles for it (``torch/storage.py``,
#: ``_dtype_to_storage_type_map``).
STORAGE = {
    np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
    np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage", np.dtype(np.int32): "IntStorage",
    np.dtype(np.int16): "ShortStorage", np.dtype(np.int8): "CharStorage", np.dtype(np.uint8): "ByteStorage",
    np.dtype(np.bool_): "BoolStorage", np.dtype(np.complex64): "ComplexFloatStorage",
    np.dtype(np.complex128): "ComplexDoubleStorage",
}

#: (number of the insertion that rehashes, bucket count after it) of a default-constructed
#: ``std::unordered_set<std::string>`` in libstdc++ (module docstring); starts with 1 bucket.
BUCKETS = [(1, 13), (14, 29), (30, 59), (60, 127), (128, 257), (258, 541), (542, 1109), (1110, 2357),
           (2358, 5087), (5088, 10273), (10274, 20753), (20754, 42043), (42044, 85229), (85230, 172933),
           (172934, 351061), (351062, 712697), (712698, 1447153), (1447154, 2938679), (2938680, 5967347),
           (5967348, 12117689), (12117690, 24607243)]

_M64 = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def std_hash(data: bytes) -> int:
    """``std::hash<std::string>`` of libstdc++ on a 64-bit ``size_t``: ``_Hash_bytes(data, len, 0xc70f6907)``."""
    n = len(data)
    h = (0xC70F6907 ^ (n * _MUL)) & _M64
    end = n & ~7
    for (v,) in struct.iter_unpack("<Q", data[:end]):
        h ^= (_shift_mix((v * _MUL) & _M64) * _MUL) & _M64
        h = (h * _MUL) & _M64
    if n & 7:
        h ^= int.from_bytes(data[end:], "little")
        h = (h * _MUL) & _M64
    h = (_shift_mix(h) * _MUL) & _M64
    return _shift_mix(h)


def unordered_set_order(names: list[str]) -> list[str]:
    """The iteration order of a libstdc++ ``std::unordered_set<std::string>`` into which ``names``
    (distinct) were inserted one by one in this order (module docstring).

    The list is kept as groups of nodes of one bucket, contiguous: a node whose bucket is empty
    starts a new group at the front of the list, else it goes to the front of its bucket's group --
    both on insertion (``_M_insert_bucket_begin``) and when a rehash relinks the nodes in list order
    (``_M_rehash_aux``). Groups and their nodes are held back to front (appended)."""
    if len(names) >= BUCKETS[-1][0]:
        raise FormatError(f"{len(names)} records: more than this writer can name; install torch to write this .pt")
    codes = {name: std_hash(name.encode()) for name in names}
    grow = dict(BUCKETS)
    nb = 1
    groups: dict[int, list[str]] = {}   # bucket -> its nodes, back to front
    back: list[int] = []                # buckets, back to front

    def link(name: str) -> None:
        b = codes[name] % nb
        if b not in groups:
            groups[b] = []
            back.append(b)
        groups[b].append(name)

    def front_to_back() -> list[str]:
        return [n for b in reversed(back) for n in reversed(groups[b])]

    for count, name in enumerate(names, 1):
        if count in grow:
            old = front_to_back()
            nb = grow[count]
            groups, back = {}, []
            for node in old:
                link(node)
        link(name)
    return front_to_back()


def hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit ``size_t`` (``c10/util/hash.h``)."""
    return seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64)


def serialization_id_names(names: list[str]) -> str:
    """The first 20 digits of torch's ``.data/serialization_id`` for an archive whose records
    (without the ``archive/`` prefix and without the id itself) were written in the order ``names``."""
    seed = 0
    for name in unordered_set_order(names):
        seed = hash_combine(seed, std_hash(name.encode()))
    return f"{seed:020d}"


class Protocol2Writer:
    """The few opcodes of CPython's C pickler at protocol 2 that a state dict of tensors uses."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.n = 0                            # memo entries so far
        self.shared: dict[object, int] = {}   # objects that repeat -> their memo index

    def fresh(self) -> int:
        """``BINPUT``/``LONG_BINPUT`` of the object just pickled."""
        i, self.n = self.n, self.n + 1
        self.out += b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)
        return i

    def again(self, key: object) -> bool:
        """``BINGET``/``LONG_BINGET`` when the object ``key`` stands for was pickled before."""
        i = self.shared.get(key)
        if i is None:
            return False
        self.out += b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
        return True

    def string(self, s: str, shared: object | None = None) -> None:
        """A str; ``shared``: the identity of an object that repeats (torch's constants), else None
        for a new object."""
        if shared is not None and self.again(shared):
            return
        b = s.encode("utf-8", "surrogatepass")
        self.out += b"X" + struct.pack("<I", len(b)) + b
        i = self.fresh()
        if shared is not None:
            self.shared[shared] = i

    def integer(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -(1 << 31) <= v < (1 << 31):
            self.out += b"J" + struct.pack("<i", v)
        else:
            n = (v.bit_length() + 8) // 8  # two's complement with room for the sign bit
            self.out += b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)

    def global_(self, module: str, name: str) -> None:
        if self.again(("global", module, name)):
            return
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
        self.shared[("global", module, name)] = self.fresh()

    def int_tuple(self, vals: tuple[int, ...]) -> None:
        if not vals:
            self.out += b")"  # the empty tuple is not memoized
            return
        if len(vals) > 3:
            self.out += b"("
        for v in vals:
            self.integer(v)
        self.out += {1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(vals), b"t")
        self.fresh()


def _strides(shape: tuple[int, ...], dt: np.dtype) -> tuple[int, ...]:
    """The strides (in elements) of ``torch.from_numpy`` of a C-contiguous numpy array of ``shape``:
    C strides; for an empty array numpy's own strides (all 0 in numpy 2), which torch keeps."""
    if 0 in shape:
        return tuple(s // dt.itemsize for s in np.empty(shape, dt).strides)
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def data_pkl(entries: list[tuple[str, tuple[int, ...], np.dtype]]) -> bytes:
    """``archive/data.pkl`` of ``torch.save`` of a ``dict`` mapping each key of ``entries`` (in order)
    to a C-contiguous CPU tensor of that shape and dtype with its own storage (``torch.from_numpy``
    of a numpy array; storage ``i`` is entry ``i``).

    Raises:
        FormatError: a dtype torch has no storage class for (``STORAGE``).
    """
    p = Protocol2Writer()
    p.out += b"}"
    p.fresh()
    if len(entries) > 1:
        p.out += b"("
    for i, (key, shape, dt) in enumerate(entries):
        dt = np.dtype(dt)
        if dt not in STORAGE:
            raise FormatError(f"tensor '{key}': PyTorch has no storage for numpy {dt}")
        shape = tuple(int(n) for n in shape)
        numel = math.prod(shape)
        p.string(key)
        p.global_("torch._utils", "_rebuild_tensor_v2")
        p.out += b"(("
        p.string("storage", shared="storage")
        p.global_("torch", STORAGE[dt])
        p.string(str(i))
        p.string("cpu", shared="cpu")
        p.integer(numel)
        p.out += b"t"
        p.fresh()
        p.out += b"Q"
        p.integer(0)
        p.int_tuple(shape)
        p.int_tuple(_strides(shape, dt))
        p.out += b"\x89"
        p.global_("collections", "OrderedDict")
        p.out += b")R"
        p.fresh()
        p.out += b"t"
        p.fresh()
        p.out += b"R"
        p.fresh()
        if len(entries) > 1 and (i + 1) % 1000 == 0:
            p.out += b"u("
    if len(entries) == 1:
        p.out += b"s"
    elif len(entries) > 1:
        p.out += b"u"
    p.out += b"."
    return bytes(p.out)
