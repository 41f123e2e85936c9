"""Read Flax recurrent cells from a ``flax.serialization`` msgpack file (linen ``to_bytes`` of a variables dict,
or ``msgpack_serialize`` of an NNX state's pure dict), without JAX or Flax.

Layout facts (``flax/serialization.py``, flax 0.12.8): the file is one msgpack map (string keys, nested maps);
an array is msgpack ``ExtType(1, packb((shape, dtype_name, bytes)))`` (``_ndarray_to_bytes``: C order, the
dtype's numpy name; ``bfloat16`` for JAX's), a numpy scalar ``ExtType(3, ...)`` the same, a Python complex
``ExtType(2, ...)``; an array above 2**30 bytes is a map ``{'__msgpack_chunked_array__': True, 'shape': {'0':
..}, 'chunks': {'0': flat array, ...}}``. The cells' parameter names are in :mod:`.naming`.

Parsed with the ``msgpack`` package (``msgpack.unpackb``: data only, no code) with every length bounded by the
file's size and the ``names`` limit; arrays are checked (plain number dtype, shape times item size equal to
the bytes) and copied out of the file's bytes. ``bfloat16`` parameters are widened to float32 exactly (every
bfloat16 is a float32), with a note.

A Haiku parameter tree (``{module: {param: array}}`` holding a core under Haiku's names, what
``flax.serialization.to_bytes(params)`` of ``hk.transform(f).init`` writes) is read by Haiku's convention
(:mod:`rnnconvert.conventions.haiku_params`; format ``haiku``).

Every cell found anywhere in the tree (a map whose keys are one cell's Dense names) becomes a layer, named by
its path without ``params`` and the ``cell`` level (``lstm``, ``encoder.layers_0``); a ``forward_rnn``/
``backward_rnn`` pair of equal cells is one bidirectional layer (Flax's default ``merge_fn``, concatenation,
assumed: the function is not stored). Arrays of no cell are carried as tensors (``head.kernel``).
A cell's activation functions (``gate_fn``, ``activation_fn``) are not stored either: Flax's defaults,
sigmoid and tanh, are assumed (a note says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import haiku_params
from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ...errors import FormatError, UnsupportedError, require
from ...safety import budget
from . import naming

DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
                    "uint16", "uint32", "uint64", "bool"})
MAX_DEPTH = 64
CHUNKED = "__msgpack_chunked_array__"


class _Bad(Exception):
    pass


def _array(payload: bytes, msgpack: Any, notes: set) -> np.ndarray:
    try:
        rec = msgpack.unpackb(payload, raw=True, max_bin_len=len(payload), max_str_len=64, max_array_len=64,
                              max_map_len=0, max_ext_len=0)
    except Exception as exc:
        raise _Bad(f"a damaged array record ({type(exc).__name__})") from None
    if not (isinstance(rec, (list, tuple)) and len(rec) == 3):
        raise _Bad("an array record that is not (shape, dtype, bytes)")
    shape, dname, buf = rec
    if not (isinstance(shape, (list, tuple)) and len(shape) <= 32 and all(type(s) is int and s >= 0 for s in shape)):
        raise _Bad(f"array shape {shape!r:.60}")
    dname = dname.decode("ascii", "replace") if isinstance(dname, bytes) else dname
    if dname not in DTYPES or not isinstance(buf, bytes):
        raise _Bad(f"array dtype {dname!r:.40} (plain number arrays only)")
    wide = dname == "bfloat16"
    dt = np.dtype("<u2" if wide else dname).newbyteorder("<") if dname != "bool" else np.dtype(bool)
    n = 1
    for s in shape:
        n *= s
    if n * dt.itemsize != len(buf):
        raise _Bad(f"an array of shape {tuple(shape)} {dname} holding {len(buf)} bytes")
    a = np.frombuffer(buf, dtype=dt).reshape(shape)
    if wide:  # bfloat16 is the top half of a float32: widened exactly
        notes.add("bfloat16 parameters widened to float32 (exact)")
        return (a.astype(np.uint32) << 16).view(np.float32).copy()
    return a.astype(dt.newbyteorder("="), copy=True)


def load_tree(path: Path, notes: set) -> Any:
    """The file's tree: nested dicts of numpy arrays (and plain values).

    Raises:
        FormatError: not msgpack, damaged, an ext type or dtype off the list, a map holding one key twice
        (``msgpack`` would keep the last silently); BudgetError: sizes."""
    msgpack = require("msgpack", "jax")
    data = path.read_bytes()
    cap = min(budget.limit("names"), max(len(data), 1))

    def ext(code: int, payload: bytes) -> Any:
        if code in (1, 3):
            return _array(payload, msgpack, notes)
        if code == 2:
            return complex(*msgpack.unpackb(payload, max_array_len=2, max_map_len=0, max_str_len=0, max_bin_len=0))
        raise _Bad(f"msgpack ext type {code} (flax writes 1, 2, 3)")

    def pairs(items: list) -> dict:  # a map's pairs as the file holds them: a key twice would keep only the last
        out: dict = {}
        for k, v in items:
            if k in out:
                raise _Bad(f"a map holds the key {str(k)[:60]!r} twice (which value is meant is not defined)")
            out[k] = v
        return out

    try:
        tree = msgpack.unpackb(data, ext_hook=ext, raw=False, strict_map_key=False, object_pairs_hook=pairs,
                               max_str_len=len(data), max_bin_len=len(data), max_ext_len=len(data),
                               max_array_len=cap, max_map_len=cap)
    except _Bad as exc:
        raise FormatError(f"{path}: {exc}; refused") from None
    except RecursionError:
        raise FormatError(f"{path}: msgpack nested too deeply") from None
    except Exception as exc:  # ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError ...
        raise FormatError(f"{path}: not a readable msgpack file ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(tree, dict):
        raise FormatError(f"{path}: the msgpack file holds a {type(tree).__name__}, not a map of parameters")
    return tree


def _unchunk(d: dict, where: str) -> np.ndarray:
    shape, chunks = d.get("shape"), d.get("chunks")
    if not (isinstance(shape, dict) and isinstance(chunks, dict)):
        raise FormatError(f"{where}: a malformed chunked array")
    try:
        shp = tuple(shape[str(i)] for i in range(len(shape)))
        parts = [chunks[str(i)] for i in range(len(chunks))]
    except KeyError:
        raise FormatError(f"{where}: a chunked array with missing chunks") from None
    if not all(isinstance(p, np.ndarray) and p.ndim == 1 and p.dtype == parts[0].dtype for p in parts) \
            or not all(type(s) is int and s >= 0 for s in shp):
        raise FormatError(f"{where}: a malformed chunked array")
    flat = np.concatenate(parts) if parts else np.zeros(0)
    if flat.size != int(np.prod(shp, dtype=np.int64)):
        raise FormatError(f"{where}: a chunked array of shape {shp} holds {flat.size} elements")
    return flat.reshape(shp)


def _dense(d: Any, name: str, where: str, bias: bool | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A Dense's ``kernel`` (in, out) and ``bias`` (out,) (``bias``: True required, False absent, None either)."""
    if not isinstance(d, dict) or not isinstance(d.get("kernel"), np.ndarray):
        raise FormatError(f"{where}: '{name}' has no kernel array")
    k, b = d["kernel"], d.get("bias")
    if k.ndim != 2 or k.dtype.kind != "f":
        raise FormatError(f"{where}: '{name}.kernel' of shape {k.shape} {k.dtype} is no float matrix")
    if bias is True and b is None:
        raise FormatError(f"{where}: '{name}' has no bias (Flax's cell has one)")
    if bias is False and b is not None:
        raise UnsupportedError(f"{where}: '{name}' has a bias that Flax's cell does not have; refused")
    if b is not None and (not isinstance(b, np.ndarray) or b.shape != (k.shape[1],)):
        raise FormatError(f"{where}: '{name}.bias' does not fit its kernel {k.shape}")
    extra = set(d) - {"kernel", "bias"}
    if extra:
        raise UnsupportedError(f"{where}: '{name}' holds {', '.join(sorted(extra))} beside kernel/bias; refused")
    return k, b


def _kind(d: dict) -> str | None:
    """Which Flax cell the map ``d`` holds the parameters of (``lstm``, ``gru``, ``simple``, ``fused``, ``mgu``)."""
    keys = {naming.NNX_ALIASES.get(k, k) for k in d}
    if keys == {n for pair in naming.LSTM_GATES for n in pair}:
        return "lstm"
    if keys == {n for pair in naming.GRU_GATES for n in pair}:
        return "gru"
    if keys == naming.MGU:
        return "mgu"
    if keys == set(naming.SIMPLE):
        return "simple"
    if keys == set(naming.FUSED):
        return "fused"
    return None


def _cell(d: dict, where: str) -> tuple[Cell, DirectionParams, str]:
    """One direction's canonical parameters from a cell's map (bit-exact transposes and block stacking)."""
    kind = _kind(d)
    d = {naming.NNX_ALIASES.get(k, k): v for k, v in d.items()}
    if kind == "mgu":
        raise UnsupportedError(f"{where}: a Flax MGUCell (minimal gated unit), which no format rnnconvert writes "
                               "computes; refused")
    if kind == "lstm":
        cell, name = Cell.LSTM, "LSTMCell/OptimizedLSTMCell"
        ins = [_dense(d[i], i, where, False)[0] for i, _ in naming.LSTM_GATES]
        hs = [_dense(d[h], h, where, True) for _, h in naming.LSTM_GATES]
        k_i, k_h = np.concatenate(ins, 1), np.concatenate([k for k, _ in hs], 1)
        b_i, b_h = None, np.concatenate([b for _, b in hs])
    elif kind == "gru":
        cell, name = Cell.GRU, "GRUCell"
        ins = [_dense(d[i], i, where, True) for i, _ in naming.GRU_GATES]
        hs = [_dense(d[h], h, where, h == "hn") for _, h in naming.GRU_GATES]
        k_i, k_h = np.concatenate([k for k, _ in ins], 1), np.concatenate([k for k, _ in hs], 1)
        b_i = np.concatenate([b for _, b in ins])
        b_h = np.concatenate([np.zeros_like(hs[2][1]), np.zeros_like(hs[2][1]), hs[2][1]])
    elif kind == "simple":
        cell, name = Cell.RNN_TANH, "SimpleCell"
        k_i, b_i = _dense(d["i"], "i", where, True)
        k_h, b_h = _dense(d["h"], "h", where, False)
    elif kind == "fused":
        k_i, b_i = _dense(d["dense_i"], "dense_i", where, None)
        k_h, b_h = _dense(d["dense_h"], "dense_h", where, None)
        H = k_h.shape[0]
        G = k_h.shape[1] // H if H and k_h.shape[1] % H == 0 else 0
        cell = {4: Cell.LSTM, 3: Cell.GRU, 1: Cell.RNN_TANH}.get(G)
        want = {Cell.LSTM: (False, True), Cell.GRU: (True, False), Cell.RNN_TANH: (True, False)}.get(cell)
        if cell is None or (b_i is not None, b_h is not None) != want:
            raise FormatError(f"{where}: dense_i {k_i.shape} / dense_h {k_h.shape} (biases {b_i is not None}/"
                              f"{b_h is not None}) fit no NNX OptimizedLSTMCell, GRUCell or SimpleCell")
        name = {Cell.LSTM: "NNX OptimizedLSTMCell", Cell.GRU: "NNX GRUCell", Cell.RNN_TANH: "NNX SimpleCell"}[cell]
    else:
        raise FormatError(f"{where}: not a Flax cell")
    H = k_h.shape[0]
    gh = cell.gates * H
    if k_h.shape != (H, gh) or k_i.shape[1] != gh or k_i.dtype != k_h.dtype:
        raise FormatError(f"{where}: kernels {k_i.shape} and {k_h.shape} do not fit one {name}")
    conv = gates.convention("flax", cell)
    zeros = np.zeros(gh, k_i.dtype)
    dp = DirectionParams(gates.to_canonical(k_i, conv, cell), gates.to_canonical(k_h, conv, cell),
                         zeros if b_i is None else gates.vec_to_canonical(b_i, conv, cell),
                         zeros.copy() if b_h is None else gates.vec_to_canonical(b_h, conv, cell))
    return cell, dp, name


def _layer_name(path: tuple[str, ...], strip_cell: bool = False) -> str:
    """The layer's name: its path without ``params`` (and, for a bare cell map, without its own ``cell`` key)."""
    p = [s for s in path if s != "params"]
    if strip_cell and p and p[-1] == naming.CELL:
        p = p[:-1]
    return ".".join(p) or "rnn"


def read(path: str | Path) -> Checkpoint:
    """Read every Flax recurrent cell of a msgpack parameter file (module docstring).

    Returns:
        canonical layers (gate order LSTM i f g o, GRU r z n; ``out_in``; bit-exact transposes of the
        stored kernels) and every other array as a carried tensor under its dotted path.

    Raises:
        FormatError: not a Flax msgpack map, damaged, no cell found. UnsupportedError: an MGUCell, a Dense
        with more than kernel/bias. DependencyError: the ``msgpack`` package is missing.
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    notes: set[str] = set()
    return from_tree(load_tree(p, notes), p, notes)


def from_tree(tree: dict, p: Path, notes: set[str], fmt: str = "flax_msgpack", cells: Any = None) -> Checkpoint:
    """:func:`read` of a loaded parameter tree (nested dicts of numpy arrays: a msgpack file's, an Orbax
    checkpoint's); ``fmt`` the checkpoint's format name. A Haiku tree (by Haiku's names, or any two-level tree
    when ``cells`` names its cores) goes to Haiku's convention.

    Raises:
        FormatError: two paths giving one layer or tensor name (``a.b`` beside ``a: {b}``, or ``a/b``: ``/``
        is read as ``.``), no cell found, a malformed cell. UnsupportedError: a cell Flax's equations do not
        compute. BudgetError: the walk's or the name count's limit."""
    if haiku_params.is_tree(tree) or (cells is not None and haiku_params.two_levels(tree)):
        return haiku_params.read(tree, str(p), "haiku" if fmt == "flax_msgpack" else fmt, cells)
    count = budget.Counter(p, "pickle_nodes", "maps and arrays in the msgpack file")
    layers: list[RNNLayer] = []
    tensors: dict[str, np.ndarray] = {}
    named: dict[str, str] = {}  # a layer's or tensor's name, '/' read as '.', -> the path that gave it

    def claim(name: str, path: tuple) -> None:
        """Refuse two paths that give one name (``{'a.b': x, 'a': {'b': y}}``, ``a/b`` beside ``a.b``): one would
        be lost silently."""
        key, here = name.replace("/", "."), "".join(f"[{k!r}]" for k in path) or "(root)"
        if key in named:
            raise FormatError(f"{p}: {named[key]} and {here} both give the name '{name}'; refused (one of them "
                              "would be lost)")
        named[key] = here

    def unit(o: Any, where: str) -> list[tuple[Cell, DirectionParams, str]] | None:
        """The directions of an ``nn.RNN`` (``{'cell': ...}``) or ``nn.Bidirectional`` map, else None."""
        if not isinstance(o, dict):
            return None
        if set(o) == {naming.CELL} and isinstance(o[naming.CELL], dict) and _kind(o[naming.CELL]):
            return [_cell(o[naming.CELL], where)]
        fw, bw = o.get(naming.FORWARD), o.get(naming.BACKWARD)
        if set(o) == {naming.FORWARD, naming.BACKWARD} and all(
                isinstance(x, dict) and set(x) == {naming.CELL} and isinstance(x[naming.CELL], dict)
                and _kind(x[naming.CELL]) for x in (fw, bw)):
            dirs = [_cell(fw[naming.CELL], f"{where}/forward_rnn"), _cell(bw[naming.CELL], f"{where}/backward_rnn")]
            if dirs[1][0] is not dirs[0][0] or dirs[1][1].w_ih.shape != dirs[0][1].w_ih.shape:
                raise UnsupportedError(f"{where}: forward_rnn and backward_rnn hold different cells; refused")
            return dirs
        return None

    def stacked(o: dict, where: str) -> list[list[tuple[Cell, DirectionParams, str]]] | None:
        """``layers_0..layers_{n-1}`` (``nn.Sequential``) of equal cells chained by size, else None."""
        n = len(o)
        if n < 2 or set(o) != {f"{naming.LAYERS}{k}" for k in range(n)}:
            return None
        units = [unit(o[f"{naming.LAYERS}{k}"], f"{where}/{naming.LAYERS}{k}") for k in range(n)]
        if any(u is None for u in units):
            return None
        first = units[0]
        for prev, u in zip(units, units[1:]):
            if (len(u), u[0][0], u[0][1].w_hh.shape) != (len(first), first[0][0], first[0][1].w_hh.shape) \
                    or u[0][1].w_ih.shape[1] != len(prev) * prev[0][1].w_hh.shape[1]:
                return None
        return units

    def add(name: str, slabs: list[list[tuple[Cell, DirectionParams, str]]], where: str, keys: tuple) -> None:
        claim(name, keys)
        cell, first, cname = slabs[0][0]
        bidi = len(slabs[0]) == 2
        try:
            layers.append(RNNLayer(
                name=name, cell=cell, input_size=first.w_ih.shape[1], hidden_size=first.w_hh.shape[1],
                num_layers=len(slabs), bidirectional=bidi, semantics=Semantics(),
                params=[[d[1] for d in dirs] for dirs in slabs],
                source={"format": fmt, "class_name": cname + (" x2 (Bidirectional)" if bidi else ""),
                        "path": where, "keys": list(keys)}))
        except ValueError as exc:
            raise FormatError(f"{p}: {name}: {exc}") from exc

    def walk(o: Any, path: tuple[str, ...], depth: int) -> None:
        count.tick()
        where = f"{p}: '{'/'.join(path)}'"
        if depth > MAX_DEPTH:
            raise FormatError(f"{p}: maps nested deeper than {MAX_DEPTH} levels")
        if isinstance(o, dict) and o.get(CHUNKED) is True:
            o = _unchunk(o, where)
        if isinstance(o, np.ndarray):
            name = ".".join(s for s in path if s != "params")
            claim(name, path)
            tensors[name] = o
            return
        if not isinstance(o, dict):
            return  # a step counter, a string: not a parameter
        if _kind(o) is not None:  # a cell not under nn.RNN's 'cell'
            add(_layer_name(path, strip_cell=True), [[_cell(o, where)]], where, path)
            return
        u = unit(o, where)
        if u is not None:
            add(_layer_name(path), [u], where, path)
            return
        st = stacked(o, where)
        if st is not None:
            add(_layer_name(path), st, where, path)
            return
        rest = o
        fw, bw = o.get(naming.FORWARD), o.get(naming.BACKWARD)
        if fw is not None and bw is not None:  # a Bidirectional beside other parameters
            u = unit({naming.FORWARD: fw, naming.BACKWARD: bw}, where)
            if u is not None:
                add(_layer_name(path), [u], where, path)
                rest = {k: v for k, v in o.items() if k not in (naming.FORWARD, naming.BACKWARD)}
        for k, v in rest.items():
            walk(v, path + (str(k),), depth + 1)

    walk(tree, (), 0)
    budget.check_count(p, "names", len(layers) + len(tensors), "layers and tensors")
    if not layers:
        raise FormatError(f"{p}: no Flax recurrent cell found (LSTMCell/OptimizedLSTMCell ii..ho, GRUCell ir..hn, "
                          "SimpleCell i/h, NNX dense_i/dense_h; a Haiku tree of renamed cores: --read-opt "
                          "cells=MODULE:lstm, with --from haiku for a .msgpack)")
    meta: dict[str, Any] = {"path": str(p), "notes": sorted(notes) + [
        "Flax cells' gate_fn/activation_fn are not stored: Flax's defaults (sigmoid, tanh) assumed"]}
    if any(la.bidirectional for la in layers):
        meta["notes"].append("Flax Bidirectional's merge_fn is not stored: its default (concatenation) assumed")
    return Checkpoint(layers=layers, tensors=tensors, format=fmt, meta=meta)
