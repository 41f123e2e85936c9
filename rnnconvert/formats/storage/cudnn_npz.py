"""Raw cuDNN parameter buffers (``.cudnn.npz``): writer and reader.

One numpy ``.npz`` (written with ``np.savez``, read with ``allow_pickle=False``) holding, for every
recurrent layer, its 1-D cuDNN buffer under the layer's name (laid out by
:func:`rnnconvert.core.cudnn.layout`; see ``docs/cudnn-layout.md`` for what is established and what is
inferred), plus ``__cudnn_spec__``: a JSON string

    {"format": "rnnconvert-cudnn-buffer", "version": 2,
     "layers": [{"name", "cell" (LSTM|GRU|RNN_TANH|RNN_RELU), "input_size", "hidden_size",
                 "num_layers", "bidirectional", "proj_size", "bias", "dtype", "elements"}]}

so that a C++/CUDA program can hand each buffer to ``cudnnRNNForward`` as its weight space (double
bias mode, ``CUDNN_LINEAR_INPUT``; the matrices of all pseudo-layers, then the biases of all
pseudo-layers) and ``load`` reads it back.

Versions: ``2`` (written since the layout fix) uses :func:`rnnconvert.core.cudnn.layout`. ``1`` files were
written with the old, wrong layout (each pseudo-layer's matrices then its biases,
:func:`rnnconvert.core.cudnn.layout_v1`); the two agree for one pseudo-layer, and a version-1 buffer of
several pseudo-layers is read with the old layout it was written in (its layer's ``source`` says
``"layout": "v1"``). A spec without ``version`` is read only where the versions agree (one
pseudo-layer); otherwise it is refused. A run-time
``forget_bias`` is folded into the forget-gate input bias. Layers cuDNN cannot express (peepholes,
clipping, non-cuDNN activations, GRU reset-before) are refused.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ...core import cudnn
from ...errors import FormatError
from ...core.model import Cell, Checkpoint, RNNLayer
from .sniff import SPEC_KEY

MAGIC = "rnnconvert-cudnn-buffer"
#: Spec version written; 1 = the old per-pseudo-layer layout (read, never written).
VERSION = 2



def refusals(layer) -> list[str]:
    """What a cuDNN buffer cannot express about ``layer`` (empty when it can)."""
    return cudnn.refusals(layer)


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Raises UnsupportedError for layers cuDNN cannot run (see :func:`rnnconvert.core.cudnn.pack`)."""
    from ...engine import refusal

    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "cudnn_npz", "a cuDNN buffer")
    notes = []
    for layer in ckpt.layers:
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: merge_mode='{layer.semantics.merge_mode}' must be applied to cuDNN's output")
    if ckpt.tensors:
        notes.append(f"{len(ckpt.tensors)} non-recurrent tensors are not written into a cuDNN buffer file")
    return notes


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write every layer's packed buffer and the JSON spec; one line per layer describing its buffer."""
    arrays, spec, lines = {}, [], []
    for layer in ckpt.layers:
        if layer.name == SPEC_KEY or layer.name in arrays:
            raise FormatError(f"layer name '{layer.name}' cannot be used twice or as '{SPEC_KEY}'")
        buf = cudnn.pack(layer)
        arrays[layer.name] = buf
        s = cudnn.Spec.of(layer)
        spec.append({"name": layer.name, "cell": layer.cell.value, "input_size": s.input_size,
                     "hidden_size": s.hidden_size, "num_layers": s.num_layers, "bidirectional": s.bidirectional,
                     "proj_size": s.proj_size, "bias": layer.bias, "dtype": str(buf.dtype), "elements": int(buf.size)})
        lines.append(f"{layer.name}: cuDNN {layer.cell.value} buffer, {buf.size} x {buf.dtype} "
                     f"(I={s.input_size}, H={s.hidden_size}, layers={s.num_layers}, "
                     f"{'bidirectional' if s.bidirectional else 'unidirectional'}"
                     f"{f', P={s.proj_size}' if s.proj_size else ''})")
    doc = json.dumps({"format": MAGIC, "version": VERSION, "layers": spec})
    with open(path, "wb") as fh:
        np.savez(fh, **arrays, **{SPEC_KEY: np.array(doc)})
    return lines


def read(path: str | Path, **_: Any) -> Checkpoint:
    """Read a ``.cudnn.npz`` written by :func:`write` (or by hand with the same spec).

    Every ``.npy`` header is checked against its member's size before numpy allocates (as for
    ``.npz``, :func:`rnnconvert.formats.storage.npz_fmt.check_members`); damaged zip members (bad CRC,
    bad local headers, zlib errors) are refused.

    Raises:
        FormatError: no or malformed spec, a buffer missing, damaged or of the wrong length (the
            spec's sizes disagree with the buffer: both counts are named).
    """
    from .npz_fmt import check_members

    p = Path(path)
    try:
        check_members(p)
        with np.load(str(p), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FormatError:
        raise
    except (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error, UnicodeDecodeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise FormatError(f"{p}: not a readable .npz without pickle ({type(exc).__name__}: {first})") from exc
    if SPEC_KEY not in arrays:
        raise FormatError(f"{p}: no '{SPEC_KEY}' entry; not an rnnconvert cuDNN buffer file")
    try:
        doc = json.loads(str(arrays[SPEC_KEY]))
        if not isinstance(doc, dict) or doc.get("format") != MAGIC or not isinstance(doc.get("layers"), list):
            raise ValueError(f"expected {{'format': '{MAGIC}', 'layers': [...]}}")
        recs = doc["layers"]
        version = doc.get("version")
        if version not in (1, 2, None) or isinstance(version, bool):
            raise ValueError(f"version {str(version)[:20]} is not 1 or 2")
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{p}: malformed '{SPEC_KEY}' ({str(exc)[:160]})") from exc
    ckpt = Checkpoint(format="cudnn_npz", meta={"path": str(p), "spec_version": version})
    for i, r in enumerate(recs):
        try:
            spec = cudnn.Spec(Cell(r["cell"]), int(r["input_size"]), int(r["hidden_size"]),
                              int(r.get("num_layers", 1)), bool(r.get("bidirectional", False)),
                              int(r.get("proj_size", 0)))
            name = r["name"]
            if not isinstance(name, str) or min(spec.input_size, spec.hidden_size, spec.num_layers) < 1 \
                    or spec.proj_size < 0:
                raise ValueError("sizes must be positive and the name a string")
        except (KeyError, ValueError, TypeError, AttributeError, OverflowError) as exc:
            raise FormatError(f"{p}: layer record {i} of '{SPEC_KEY}' is incomplete or invalid ({exc})") from exc
        if name not in arrays or name == SPEC_KEY:
            raise FormatError(f"{p}: the spec names layer '{name}' but the file has no such buffer")
        buf = arrays[name]
        if buf.dtype.kind != "f":
            raise FormatError(f"{p}: buffer '{name}' has dtype {buf.dtype}; a cuDNN weight space is float")
        if spec.num_layers > buf.size:  # every layer holds weights: bounds the layout walk below
            raise FormatError(f"{p}: the spec of '{name}' declares {spec.num_layers} layers for {buf.size} elements")
        source = {"format": "cudnn_npz", "class_name": f"cuDNN {spec.cell.value}"}
        try:
            if spec.num_layers * spec.dirs > 1 and version != VERSION:
                if version is None:
                    raise FormatError(f"'{SPEC_KEY}' has no version and buffer '{name}' has "
                                      f"{spec.num_layers * spec.dirs} pseudo-layers, whose layout differs between "
                                      "versions 1 and 2; add \"version\": 2 (all matrices, then all biases) or 1 "
                                      "(each pseudo-layer's matrices then its biases; docs/cudnn-layout.md)")
                buf = cudnn.from_layout_v1(buf, spec)
                source["layout"] = "v1"
            ckpt.layers.append(cudnn.unpack(buf, spec, name=name, bias=bool(r.get("bias", True)), source=source))
        except FormatError as exc:  # the spec's sizes disagree with the buffer's length
            raise FormatError(f"{p}: {exc}") from exc
    return ckpt


def load(path: str | Path, name: str, k: int | None = None) -> RNNLayer:
    """The canonical runtime's view of a written buffer file (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`):
    layer ``name`` unpacked (:func:`read`), or its stacked layer ``k`` alone as a one-layer layer."""
    layer = read(path).layer(name)
    return layer if k is None else layer.one_slab(k)

