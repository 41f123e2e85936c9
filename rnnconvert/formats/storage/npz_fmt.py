"""``.npz`` archives in rnnconvert's canonical schema (version 1): writer, reader, verification.

Members (all plain numeric arrays, read with ``np.load(allow_pickle=False)``):

* ``layers/{i}/l{k}/d{d}/{field}`` for recurrent layer ``i`` (file order), stacked layer ``k``,
  direction ``d`` (0 forward, 1 backward), ``field`` one of ``w_ih (G*H, I_k)``, ``w_hh (G*H, H or P)``,
  ``b_ih (G*H,)``, ``b_hh (G*H,)``, ``w_hr (P, H)`` (projection only), ``peep (3, H)`` (rows
  ``p_i, p_f, p_o``; peepholes only) -- the canonical arrays of :mod:`rnnconvert.core.model`, gate order
  LSTM ``i, f, g, o``, GRU ``r, z, n`` (cuDNN/PyTorch order), ``W x`` orientation. A layer without bias
  has zero ``b_ih``/``b_hh`` and ``"bias": false``.
* ``tensors/{key}`` for each non-recurrent tensor carried along (PyTorch naming).
* ``__rnnconvert__``: a 0-d unicode array holding JSON ``{"schema": 1, "layers": [{"name", "cell"
  (LSTM|GRU|RNN_TANH|RNN_RELU), "input_size", "hidden_size", "num_layers", "bidirectional",
  "proj_size", "bias", "return_sequences", "source_class", "semantics": {gate_activation, activation,
  reset_after, forget_bias, cell_clip, proj_clip, go_backwards, merge_mode}}]}`` (the fields of
  :class:`rnnconvert.core.model.Semantics`: every semantics a source can have is kept, so any layer is
  written without loss). Arrays keep their dtype; every array is stored as written (bit-exact).

Written with fixed zip timestamps, members in a fixed order: identical input gives identical bytes.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import budget
from ...errors import FormatError
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from .sniff import META

SCHEMA = 1
ROUTE = "torch (re-read arrays) or numpy reference"
_FIELDS = ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr", "peep")



def _member(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    """Stream one ``.npy`` member into the archive (numpy writes it in chunks: no in-memory copy of
    the array, which matters for GB-sized checkpoints)."""
    arr = np.asanyarray(arr)
    info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    with zf.open(info, "w", force_zip64=arr.nbytes > (1 << 31) - (1 << 20)) as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=False)


#: The writer streams (one slab at a time; docs/performance.md "Streaming conversion").
STREAM = True


class StreamWriter:
    """Writes the archive one slab at a time (:func:`open_stream`): members ``layers/{i}/l{k}/d{d}/*`` in
    slab order as slabs arrive, then ``tensors/*`` and ``__rnnconvert__`` on :meth:`close` -- the member
    order of the whole-checkpoint writer, so the bytes do not depend on how the source was read."""

    def __init__(self, ckpt: Checkpoint, path: str | Path) -> None:
        self.ckpt, self.next = ckpt, 0
        self.order = [(i, k) for i, layer in enumerate(ckpt.layers) for k in range(layer.num_layers)]
        self.zf = zipfile.ZipFile(path, "w")

    def write_slab(self, i: int, k: int, dirs: list[DirectionParams]) -> None:
        if self.next >= len(self.order) or self.order[self.next] != (i, k):
            raise FormatError(f"npz stream: slab ({i}, {k}) out of order")
        self.next += 1
        for d, p in enumerate(dirs):
            for f, arr in p.arrays().items():
                _member(self.zf, f"layers/{i}/l{k}/d{d}/{f}", arr)
                self.ckpt.release_array(arr)  # written: its pages of a mapped source go now

    def close(self) -> list[str]:
        if self.next != len(self.order):
            raise FormatError(f"npz stream closed with {len(self.order) - self.next} slab(s) not written")
        meta = {"schema": SCHEMA, "layers": [{
            "name": layer.name, "cell": layer.cell.value, "input_size": layer.input_size,
            "hidden_size": layer.hidden_size, "num_layers": layer.num_layers,
            "bidirectional": layer.bidirectional, "proj_size": layer.proj_size, "bias": layer.bias,
            "return_sequences": layer.return_sequences, "source_class": layer.source.get("class_name"),
            "semantics": asdict(layer.semantics)} for layer in self.ckpt.layers]}
        for key, arr in self.ckpt.tensors.items():
            _member(self.zf, f"tensors/{key}", arr)
        _member(self.zf, META, np.array(json.dumps(meta, sort_keys=True)))
        self.zf.close()
        return [f"{l.name}: npz members layers/{i}/l*/d*/* (canonical gate order, see docs/pytorch.md)"
                for i, l in enumerate(self.ckpt.layers)]

    def abort(self) -> None:
        try:
            self.zf.close()
        except Exception:  # noqa: BLE001 -- the half-written file is deleted by the caller anyway
            pass


def open_stream(ckpt: Checkpoint, path: str | Path, **_: Any) -> StreamWriter:
    """Start writing ``ckpt`` (a lazy skeleton is enough) in schema 1; nothing is refused."""
    return StreamWriter(ckpt, path)


def write(ckpt: Checkpoint, path: str | Path, **opts: Any) -> list[str]:
    """Write ``ckpt`` in schema 1 (module docstring). Nothing is refused: the schema holds every layer."""
    from ...engine import stream

    return stream.stream_write(open_stream(ckpt, path, **opts), ckpt)


MAX_MEMBERS = 4096


def check_members(p: Path) -> None:
    """Refuse, before numpy allocates anything, members whose ``.npy`` header declares more bytes
    than the member holds (a forged shape), and archives with absurd member counts.

    Raises:
        FormatError; zip/zlib errors pass through to :func:`read`, which translates them.
    """
    with zipfile.ZipFile(p) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise FormatError(f"{p}: {len(infos)} members; an rnnconvert .npz has far fewer")
        budget.zip_members(p, infos)  # duplicate names, deflate ratio (docs/security.md "Resource budget")
        for info in infos:
            if not info.filename.endswith(".npy"):
                continue
            with zf.open(info) as fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if need > info.file_size:
                    raise FormatError(f"{p}: member '{info.filename}' declares shape {shape} ({need} bytes) "
                                      f"but holds {info.file_size} bytes")


def read(path: str | Path, **opts: Any) -> Checkpoint:
    """Read a schema-1 archive (``np.load(allow_pickle=False)``: object arrays are refused). An ``.npz``
    without the ``__rnnconvert__`` member (a project's own ``np.savez`` of its weights) is read by the
    foreign-name table (:mod:`rnnconvert.core.names`; reader options ``map`` and ``nonlinearity``).

    Raises:
        FormatError: not a readable npz, an unknown schema, missing members, inconsistent shapes, or
            (foreign names) no recognised recurrent weights or an ambiguity.
    """
    return _read(Path(path), foreign=opts)


def _read(p: Path, only: str | None = None, slab: int | None = None, foreign: dict | None = None) -> Checkpoint:
    """:func:`read`; with ``only``, the members of recurrent layer ``only`` alone are decompressed/read
    (verification of one layer of a multi-GB archive) and the checkpoint holds that layer only; with
    ``slab`` too, only its stacked layer ``slab``, as a one-layer :class:`RNNLayer`."""
    try:
        check_members(p)
        with np.load(p, allow_pickle=False) as z:
            keep = None
            if only is not None and META in z.files:
                m = json.loads(str(z[META]))
                recs = m.get("layers", []) if isinstance(m, dict) else []
                keep = [f"layers/{i}/" + ("" if slab is None else f"l{slab}/")
                        for i, r in enumerate(recs) if isinstance(r, dict) and r.get("name") == only]
            arrays = {k: z[k] for k in z.files if keep is None or k == META or k.startswith(tuple(keep))}
    except (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error) as exc:
        raise FormatError(f"{p}: not readable as .npz without pickle: {exc}") from exc
    if META not in arrays and foreign is not None:
        from ...core import names

        return names.fallback(arrays, str(p), "npz", foreign)
    if META not in arrays:
        raise FormatError(f"{p}: no '{META}' member; not an rnnconvert .npz (schema in docs/pytorch.md)")
    try:
        meta = json.loads(str(arrays[META]))
    except ValueError as exc:
        raise FormatError(f"{p}: '{META}' is not JSON") from exc
    if meta.get("schema") != SCHEMA:
        raise FormatError(f"{p}: npz schema {meta.get('schema')!r}; this rnnconvert reads schema {SCHEMA}")
    ckpt = Checkpoint(format="npz", meta={"path": str(p)})
    known = {f.name for f in fields(Semantics)}
    for i, rec in enumerate(meta["layers"]):
        if only is not None and (not isinstance(rec, dict) or rec.get("name") != only):
            continue
        try:
            params = []
            for k in range(rec["num_layers"]) if slab is None else [slab]:
                row = []
                for d in range(2 if rec["bidirectional"] else 1):
                    pre = f"layers/{i}/l{k}/d{d}/"
                    row.append(DirectionParams(**{f: arrays.get(pre + f) for f in _FIELDS}))
                    if row[-1].w_ih is None or row[-1].w_hh is None or row[-1].b_ih is None:
                        raise FormatError(f"{p}: member {pre}w_ih, w_hh or b_ih is missing")
                params.append(row)
            sem = Semantics(**{k: _semantic(p, rec.get("name"), k, v)
                               for k, v in rec.get("semantics", {}).items() if k in known})
            n_in, n_layers = rec["input_size"], rec["num_layers"]
            if slab is not None:  # stacked layer `slab` alone: its input is the previous one's output
                if not 0 <= slab < n_layers:
                    raise FormatError(f"{p}: layer '{only}' has no stacked layer {slab}")
                n_in = n_in if slab == 0 else (rec.get("proj_size") or rec["hidden_size"]) * len(params[0])
                n_layers = 1
            ckpt.layers.append(RNNLayer(
                name=rec["name"], cell=Cell(rec["cell"]), input_size=n_in,
                hidden_size=rec["hidden_size"], num_layers=n_layers, bidirectional=rec["bidirectional"],
                proj_size=rec.get("proj_size", 0), bias=rec.get("bias", True), semantics=sem, params=params,
                return_sequences=rec.get("return_sequences", True),
                source={"format": "npz", "class_name": rec.get("source_class")}))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{p}: layer record {i}: {exc}") from exc
    return replace(ckpt, tensors={k[len("tensors/"):]: v for k, v in arrays.items() if k.startswith("tensors/")})


_NUMBERS = ("forget_bias", "cell_clip", "proj_clip")
_FLAGS = ("reset_after", "go_backwards")


def _semantic(p: Path, layer: object, key: str, v: Any) -> Any:
    """Semantics field ``key`` of the schema checked for its JSON type: numbers finite (``"NaN"``, a string, or
    ``NaN`` would reach the arithmetic), flags booleans, activations and merge modes strings."""
    import math

    if key in _NUMBERS:
        ok = (v is None and key != "forget_bias") or (type(v) in (int, float) and math.isfinite(v))
    elif key in _FLAGS:
        ok = type(v) is bool
    else:
        ok = isinstance(v, str) or (v is None and key == "merge_mode")
    if not ok:
        raise FormatError(f"{p}: layer '{layer}': semantics field '{key}' is {v!r:.40}, not a "
                          f"{'finite number' if key in _NUMBERS else 'boolean' if key in _FLAGS else 'string'}")
    return float(v) if key in _NUMBERS and v is not None else v



def load(path: str | Path, name: str, k: int | None = None) -> RNNLayer:
    """The canonical runtime's view of a written ``.npz`` (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`):
    layer ``name`` re-read (only its members), or its stacked layer ``k`` alone as a one-layer layer."""
    return _read(Path(path), only=name, slab=k).layer(name)

