"""The resource budget: how much work and memory a file may ask of rnnconvert, whatever it declares.

A few kilobytes of file can declare gigabytes (a compressed dataset, a tensor with stride 0, a pickle
whose dicts share children: "billion laughs") or millions of names and nodes. Every reader checks what
it is about to do against the limits below *before* allocating or walking, and refuses with one line
naming the limit and the environment variable that raises it (:class:`~rnnconvert.errors.BudgetError`,
exit code 11). The defaults (documented in ``docs/security.md``, "Resource budget") leave every real
checkpoint the project has seen far inside them.

=====================  ==============================  ==========  =============================================
limit                  environment variable            default     what it bounds
=====================  ==============================  ==========  =============================================
``expansion``          ``RNNCONVERT_MAX_EXPANSION``    50          declared bytes per stored byte of a compressed
                                                                   (HDF5 gzip/lzf, zip deflate) or strided
                                                                   (stride 0, overlapping) tensor, above 1 MiB
``pickle_nodes``       ``RNNCONVERT_MAX_PICKLE_NODES`` 1000000     containers and tensor names visited while
                                                                   collecting the tensors of a pickle
``pickle_expanded``    ``RNNCONVERT_MAX_PICKLE_EXPANDED`` 50000000 nodes of one object of a pickle counted as a tree
                                                                   (each memo re-use at its full size), checked
                                                                   before unpickling (``safety.pickle_scan``)
``names``              ``RNNCONVERT_MAX_NAMES``        100000      layer/weight names of an HDF5 file, members
                                                                   of a zip, tensors of a checkpoint
``graph_nodes``        ``RNNCONVERT_MAX_GRAPH_NODES``  1000000     nodes of an ONNX graph (constants followed)
``layers``             ``RNNCONVERT_MAX_LAYERS``       2000        layers a file lists (HDF5 ``layer_names``,
                                                                   before it is walked) and recurrent layers
                                                                   read (ONNX recurrent nodes, stacked layers
                                                                   of every checkpoint: ``api.load``)
``header_bytes``       ``RNNCONVERT_MAX_HEADER_BYTES`` 16777216    a safetensors JSON header (parsing costs
                                                                   about 20 times its size in memory)
=====================  ==============================  ==========  =============================================

Only regular files (and checkpoint folders) are read: :func:`regular_source` refuses FIFOs, devices,
sockets, and symlinks to them, before anything is opened.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import BudgetError, FormatError

#: Declared sizes up to this many bytes are never refused by the expansion limit (tiny tensors compress well).
EXPANSION_FLOOR = 1 << 20


@dataclass(frozen=True)
class Limit:
    name: str
    env: str
    default: int
    what: str


LIMITS = {lim.name: lim for lim in (
    Limit("expansion", "RNNCONVERT_MAX_EXPANSION", 50, "expansion ratio (declared bytes per stored byte)"),
    Limit("pickle_nodes", "RNNCONVERT_MAX_PICKLE_NODES", 1_000_000, "pickle walk (containers and tensor names)"),
    Limit("pickle_expanded", "RNNCONVERT_MAX_PICKLE_EXPANDED", 50_000_000,
          "pickle object size (nodes)"),
    Limit("names", "RNNCONVERT_MAX_NAMES", 100_000, "name count"),
    Limit("graph_nodes", "RNNCONVERT_MAX_GRAPH_NODES", 1_000_000, "graph node count"),
    Limit("layers", "RNNCONVERT_MAX_LAYERS", 2_000, "layer count"),
    Limit("header_bytes", "RNNCONVERT_MAX_HEADER_BYTES", 16 << 20, "header size (bytes)"),
)}


def limit(name: str) -> int:
    """The current value of limit ``name`` (its environment variable, else the default)."""
    lim = LIMITS[name]
    raw = os.environ.get(lim.env)
    if raw:
        try:
            return max(int(float(raw)), 0)
        except ValueError:
            pass
    return lim.default


def exceeded(where: object, name: str, detail: str) -> BudgetError:
    """The one-line error of a file going past limit ``name``: ``detail`` says by how much."""
    lim = LIMITS[name]
    return BudgetError(f"{where}: {detail}: over the {lim.what} limit of {limit(name):,}; refused "
                       f"(the environment variable {lim.env} raises it)")


def check_count(where: object, name: str, count: int, what: str) -> None:
    """Refuse ``count`` items of kind ``what`` above limit ``name``."""
    if count > limit(name):
        raise exceeded(where, name, f"{count:,} {what}")


def check_expansion(where: object, declared: int, stored: int, what: str = "a tensor") -> None:
    """Refuse ``declared`` bytes of ``what`` made from ``stored`` bytes when above :data:`EXPANSION_FLOOR`
    and more than the ``expansion`` limit times ``stored``."""
    if declared > EXPANSION_FLOOR and declared > limit("expansion") * max(stored, 0):
        raise exceeded(where, "expansion", f"{what} declares {declared:,} bytes from {stored:,} stored bytes")


def check_aliasing(where: object, views: list[tuple[object, int]], storages: dict[object, int]) -> None:
    """Refuse tensors that view shared storage (``views``: ``(storage key, bytes the tensor declares)``;
    ``storages``: bytes held per storage key) when together they declare more than the ``expansion`` limit
    times the bytes stored: each view is written out in full, so 2,000 views of one 1 MiB storage would
    write 2 GB (tied weights, twice the stored bytes, pass)."""
    declared = sum(n for _, n in views)
    stored = sum(storages.get(k, 0) for k in {k for k, _ in views})
    check_expansion(where, declared, stored, f"{len(views):,} tensors viewing {len(storages):,} storages")


class Counter:
    """A running count against limit ``name`` (a walk: one :meth:`tick` per node visited)."""

    def __init__(self, where: object, name: str, what: str) -> None:
        self.where, self.name, self.what, self.n, self.max = where, name, what, 0, limit(name)

    def tick(self, k: int = 1) -> None:
        self.n += k
        if self.n > self.max:
            raise exceeded(self.where, self.name, f"more than {self.max:,} {self.what}")


def regular_source(path: str | os.PathLike, *, dirs: bool = True) -> None:
    """Refuse a source that is neither a regular file nor (``dirs``) a directory: a FIFO would block
    forever, ``/dev/zero`` reads without end; a symlink is judged by what it points to. A path that does not
    exist passes (the reader says what is missing: TF checkpoint prefixes are not files).

    Raises:
        FormatError: a FIFO, socket, character or block device (or a symlink to one), a symlink loop.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:  # a symlink to itself (or a cycle of them)
            raise FormatError(f"{path}: a symlink loop (it never reaches a file)") from None
        return
    if stat.S_ISREG(st.st_mode) or (dirs and stat.S_ISDIR(st.st_mode)):
        return
    kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
            else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
    raise FormatError(f"{path}: {kind}; rnnconvert reads regular files (and checkpoint folders) only")


def zip_members(where: object, infos: list) -> None:
    """The checks every zip container gets before a member is read: no duplicate member names (which one
    would a reader take?), at most the ``names`` limit of members, no member expanding past the
    ``expansion`` limit (``zipfile.ZipInfo`` records).

    Raises:
        FormatError (duplicates), BudgetError (counts, ratios).
    """
    check_count(where, "names", len(infos), "zip members")
    seen: set[str] = set()
    for i in infos:
        if i.filename in seen:
            raise FormatError(f"{where}: the zip holds two members named '{i.filename}'; refused (which one "
                              "is meant is not defined)")
        seen.add(i.filename)
        if i.compress_type != 0:
            check_expansion(where, i.file_size, i.compress_size, f"zip member '{i.filename}'")


def source_size(path: str | os.PathLike) -> int:
    """The size of ``path`` in bytes (0 when it cannot be read)."""
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def leaves(obj: object, leaf: type | tuple[type, ...], where: object, what: str = "pickle",
           max_depth: int = 32) -> dict[str, object]:
    """The leaves (instances of ``leaf``) of nested dicts, keys joined with ``.`` (other leaves dropped), in
    insertion order, walked once per container: a container reached again (a pickle can reference one
    object from many places) gives back the names it gave the first time without being walked again, and
    every container visited and every name produced counts against the ``pickle_nodes`` limit, so a file
    whose dicts each hold the same child twice ("billion laughs") is refused after a bounded amount of
    work instead of doubling it per level.

    Raises:
        FormatError: containers nested deeper than ``max_depth`` (a cycle ends there too).
        BudgetError: more than the ``pickle_nodes`` limit of containers and names.
    """
    count = Counter(where, "pickle_nodes", f"containers and tensor names in the {what}")
    memo: dict[int, list[tuple[str, object]]] = {}
    keep: list[object] = []  # the containers memoised stay alive, so their ids are not reused

    def walk(o: object, depth: int) -> list[tuple[str, object]]:
        count.tick()
        if isinstance(o, leaf):
            return [("", o)]
        if not isinstance(o, dict):
            return []
        got = memo.get(id(o))
        if got is not None:
            return got
        if depth > max_depth:
            raise FormatError(f"{where}: containers nested deeper than {max_depth} levels")
        res: list[tuple[str, object]] = []
        for k, v in o.items():
            sub = walk(v, depth + 1)
            count.tick(len(sub))
            res.extend((f"{k}.{rel}" if rel else str(k), t) for rel, t in sub)
        memo[id(o)] = res
        keep.append(o)
        return res

    return dict(walk(obj, 0))
