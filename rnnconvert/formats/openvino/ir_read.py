"""The OpenVINO IR reader: ``LSTMSequence``, ``GRUSequence`` and ``RNNSequence`` nodes of an IR (``model.xml`` +
``model.bin``), read without OpenVINO.

Layout (OpenVINO opset specifications ``LSTMSequence-5``, ``GRUSequence-5``, ``RNNSequence-5``; the IR format,
docs.openvino.ai "OpenVINO IR format"): each ``<layer type="Const">`` names ``element_type``, ``shape``,
``offset`` and ``size`` of its bytes in the ``.bin``; ``<edges>`` connect ``from-layer``/``from-port`` to
``to-layer``/``to-port``, a layer's input ports numbered in input order. ``W [D, G*H, I]``, ``R [D, G*H, H]``
(``W x`` orientation, PyTorch's), gates LSTM ``f, i, c, o``, GRU ``z, r, h`` (``core/gates.py`` rows
``("openvino", cell)``); LSTM and RNN ``B [D, G*H]`` is one summed bias (canonical ``b_ih = B``, ``b_hh = 0``);
GRU ``linear_before_reset=true``: ``B [D, 4H]`` = ``[b_z, b_r`` (input and recurrent summed), ``b_h`` (input),
``b_hn`` (recurrent, inside the reset product)``]`` -> ``b_ih = [b_r, b_z, b_h]``, ``b_hh = [0, 0, b_hn]``;
``linear_before_reset=false``: ``B [D, 3H]`` summed, a reset-before GRU (``reset_after=False``). A weight may
reach the node through a ``Convert`` (an f16 IR: ``compress_to_fp16`` stores f16 constants and converts them
at run time): the stored f16 array is read as it is (the conversion to f32 is exact). All copies: bit-exact.

Safety: the XML (at most :data:`MAX_XML` bytes) is parsed by expat (Python's ``xml.parsers.expat``, which finds
the document's encoding itself: UTF-8, UTF-16 with its byte-order mark, a declared encoding) into an
``xml.etree`` tree, and a document type declaration refuses the file as soon as expat meets it, in any encoding
(no DTD, so no entity is declared, expanded or fetched); numbers (shapes, offsets, sizes, ``hidden_size``) are
ASCII digits only (Python's ``int`` also takes other scripts' digits, ``_`` and spaces); at most the
``graph_nodes`` budget of layers; the ``.bin`` is the ``.xml``'s stem beside it, found and opened inside the
IR's folder, a regular file (``rnnconvert.safety.paths``: a ``model.bin`` symlink leaving the folder, a FIFO,
a directory are refused); a constant is read only inside the ``.bin`` and only when its declared size equals
its shape's.

Each sequence node is one canonical layer (one stacked layer; ``bidirectional`` from ``direction``), named by its
friendly name (:func:`.naming.layer_name`).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.parsers import expat
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ...errors import FormatError, UnsupportedError
from ...safety import budget
from ...safety.paths import folder_of, inside, open_inside
from . import naming

#: the largest ``.xml`` read
MAX_XML = 256 << 20
#: IR element types the reader takes for weights
DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64}
#: every element type a Const may declare (for its size check)
ITEMSIZE = {"f32": 4, "f16": 2, "f64": 8, "bf16": 2, "i64": 8, "i32": 4, "u64": 8, "u32": 4, "i8": 1, "u8": 1,
            "boolean": 1, "i16": 2, "u16": 2}


def paths(path: str | Path) -> tuple[Path, Path]:
    """``(xml, bin)`` of an IR given as its ``.xml`` or as a folder holding one ``.xml`` (rnnconvert writes
    ``model.xml``/``model.bin``); the ``.bin`` has the ``.xml``'s stem and is the real path of that name in the
    IR's folder (:func:`rnnconvert.safety.paths.inside`: inside the folder once symlinks are resolved, a
    regular file); an ``.xml`` found in a folder is checked the same way.

    Raises:
        FormatError: no ``.xml``, several, no ``.bin`` beside it, either leading out of the folder or not a
            regular file.
    """
    p = Path(path)
    if p.is_dir():
        xmls = sorted(p.glob("*.xml"))
        if len(xmls) != 1:
            raise FormatError(f"{p}: a folder with {len(xmls)} .xml files; give the IR's .xml")
        p = xmls[0]
        inside(folder_of(p), p.name, p, "IR file")
    b = Path(p.name).with_suffix(".bin").name
    folder = folder_of(p)
    if not os.path.lexists(folder / b):
        raise FormatError(f"{p}: no weights file {b} beside it (an OpenVINO IR is .xml + .bin)")
    return p, inside(folder, b, p, "weights file")


class _Doctype(Exception):
    """A document type declaration met by expat (refused before its internal subset is read)."""


def _tree(text: bytes) -> ET.Element:
    """The element tree of ``text`` built from expat's events, refusing a DTD in any encoding (expat reads the
    byte-order mark and the declared encoding; a byte test for ``<!DOCTYPE`` misses UTF-16).

    Raises:
        _Doctype: a document type, entity or notation declaration, an external entity reference.
        expat.ExpatError: not well-formed XML (an undeclared entity among them)."""
    def refuse(*_: Any) -> None:
        raise _Doctype

    builder = ET.TreeBuilder()
    p = expat.ParserCreate()
    p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    p.StartDoctypeDeclHandler = refuse
    p.EntityDeclHandler = refuse
    p.UnparsedEntityDeclHandler = refuse
    p.NotationDeclHandler = refuse
    p.ExternalEntityRefHandler = refuse
    p.buffer_text = True
    p.StartElementHandler = builder.start
    p.EndElementHandler = builder.end
    p.CharacterDataHandler = builder.data
    p.Parse(text, True)
    return builder.close()


def parse(xml: Path) -> ET.Element:
    """The IR's XML root (``<net>``), parsed safely (module docstring).

    Raises:
        FormatError: too large, a DTD or entity declaration (in any encoding), not XML, not an IR.
    """
    size = xml.stat().st_size
    if size > MAX_XML:
        raise FormatError(f"{xml}: {size} bytes of XML; rnnconvert reads IRs up to {MAX_XML} bytes")
    text = xml.read_bytes()
    try:
        root = _tree(text)
    except _Doctype:
        raise FormatError(f"{xml}: the XML declares a DTD or entities; refused (an OpenVINO IR has none)") from None
    except (expat.ExpatError, ValueError) as exc:  # ValueError: an encoding expat does not know
        raise FormatError(f"{xml}: not readable as XML ({str(exc)[:120]})") from None
    if root.tag != "net" or root.find("layers") is None:
        raise FormatError(f"{xml}: not an OpenVINO IR (no <net><layers>)")
    return root


#: a number of the IR: ASCII digits (``int`` alone also takes other scripts' digits, ``_`` and spaces)
_INT = re.compile(r"-?[0-9]{1,19}")


def number(text: object, what: str, where: object) -> int:
    """``text`` as an int when it is ASCII digits (an optional ``-``), else a FormatError naming ``what``."""
    if not isinstance(text, str) or not _INT.fullmatch(text.strip(" ")):
        raise FormatError(f"{where}: {what} {str(text)[:40]!r} is not a decimal number (ASCII digits)")
    return int(text.strip(" "))


class Graph:
    """The layers and edges of a parsed IR, and its constants read from the ``.bin`` on demand."""

    def __init__(self, xml: Path, binp: Path) -> None:
        root = parse(xml)
        self.xml, self.bin, self.bin_size = xml, binp, binp.stat().st_size
        self.folder = folder_of(xml)
        self.layers: dict[str, ET.Element] = {}
        for el in root.find("layers"):
            if el.tag == "layer":
                self.layers[el.get("id", "")] = el
        budget.check_count(xml, "graph_nodes", len(self.layers), "IR layers")
        self.into: dict[tuple[str, str], tuple[str, str]] = {}
        edges = root.find("edges")
        for e in (edges if edges is not None else []):
            self.into[(e.get("to-layer", ""), e.get("to-port", ""))] = (e.get("from-layer", ""), e.get("from-port", ""))

    def inputs(self, el: ET.Element) -> list[str]:
        """The port ids of ``el``'s inputs, in input order."""
        ins = el.find("input")
        return [] if ins is None else [p.get("id", "") for p in ins if p.tag == "port"]

    def producer(self, el: ET.Element, i: int) -> ET.Element | None:
        """The layer feeding input ``i`` of ``el`` (``None``: not connected)."""
        ports = self.inputs(el)
        if i >= len(ports):
            return None
        src = self.into.get((el.get("id", ""), ports[i]))
        return None if src is None else self.layers.get(src[0])

    def const(self, el: ET.Element, where: str) -> np.ndarray:
        """The stored array of a ``Const`` layer, or of a ``Const`` through one ``Convert`` (f16 IR), in its
        stored element type.

        Raises:
            FormatError: a bad record, bytes outside the ``.bin``; UnsupportedError: computed at run time, or
            an element type rnnconvert does not read (bf16).
        """
        if el.get("type") == "Convert":
            src = self.producer(el, 0)
            if src is None or src.get("type") != "Const":
                raise UnsupportedError(f"{where}: comes from a Convert of a {src.get('type') if src is not None else 'missing'} "
                                       "layer, not of a constant")
            el = src
        if el.get("type") != "Const":
            raise UnsupportedError(f"{where}: comes from a {el.get('type')} layer '{el.get('name')}', computed at "
                                   "run time; rnnconvert reads weights stored as constants")
        data = el.find("data")
        if data is None:
            raise FormatError(f"{where}: a Const record rnnconvert cannot read (no <data>)")
        et = data.get("element_type")
        shape = tuple(number(s, "a shape entry", where)
                      for s in data.get("shape", "").split(",") if s.strip(" ") != "")
        off, size = number(data.get("offset"), "offset", where), number(data.get("size"), "size", where)
        if et not in DTYPES:
            raise UnsupportedError(f"{where}: element type {et}; rnnconvert reads f32, f16 and f64 weights")
        n = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[et]
        if min(shape, default=1) < 0 or size != n or off < 0 or off + size > self.bin_size:
            raise FormatError(f"{where}: constant of shape {shape} ({et}) declares {size} bytes at offset {off} "
                              f"of a {self.bin_size}-byte .bin")
        with open_inside(self.folder, self.bin, self.xml, "weights file") as fh:
            fh.seek(off)
            raw = fh.read(size)
        if len(raw) != size:
            raise FormatError(f"{where}: the .bin ended before the constant's {size} bytes at offset {off}")
        return np.frombuffer(raw, np.dtype(DTYPES[et]).newbyteorder("<")).reshape(shape).astype(DTYPES[et])


def _activations(el: ET.Element, cls: str, where: str, directions: int = 1) -> tuple[str, str]:
    """The (gate, candidate) activations of a sequence node's ``activations`` attribute.

    OpenVINO's own converters write one list per cell (``sigmoid, tanh, tanh`` for LSTM); its ONNX frontend copies
    an ONNX bidirectional node's list, which ONNX gives per direction (``relu, relu`` for a bidirectional relu
    RNN). Both are read; a per-direction list is accepted only when the directions name the same activations
    (OpenVINO's CPU runtime applies the first list to both directions: measured with OpenVINO 2026.4, so a
    list that differs per direction has no one reading). Source: IRs saved by OpenVINO (the fixtures of
    ``fixtures/gen_openvino.py``, ``openvino/onnx_birnn_relu.xml`` among them) and that runtime's outputs.
    """
    data = el.find("data")
    acts = [a.strip() for a in (data.get("activations", "") if data is not None else "").split(",") if a.strip()]
    default = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"], "RNN": ["tanh"]}[cls]
    acts = acts or default
    n = len(default)
    unknown = sorted({a for a in acts if a not in ("sigmoid", "tanh", "relu")})
    if unknown:
        raise UnsupportedError(f"{where}: activation {', '.join(unknown)}; rnnconvert reads sigmoid, tanh and relu")
    if directions == 2 and len(acts) == 2 * n:
        if acts[:n] != acts[n:]:
            raise UnsupportedError(f"{where}: activations differ per direction (forward {', '.join(acts[:n])}; "
                                   f"backward {', '.join(acts[n:])}); rnnconvert reads one list for both")
        acts = acts[:n]
    if len(acts) != n:
        raise UnsupportedError(f"{where}: {len(acts)} activations ({', '.join(acts)}) for a {cls}Sequence of "
                               f"{directions} direction(s); it takes {n}" + (f" or {2 * n}" if directions == 2 else ""))
    if cls == "LSTM" and acts[1] != acts[2]:
        raise UnsupportedError(f"{where}: LSTM candidate and output activations differ ({acts[1]}, {acts[2]})")
    return ("sigmoid", acts[0]) if cls == "RNN" else (acts[0], acts[1])


def _layer(g: Graph, el: ET.Element, name: str) -> RNNLayer:
    op = el.get("type")
    cls, wi = naming.SEQUENCE_OPS[op]
    where = f"{g.xml}: layer '{el.get('name')}' ({op})"
    data = el.find("data")
    at = dict(data.attrib) if data is not None else {}
    direction = at.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise FormatError(f"{where}: direction {direction!r:.40} is not forward, reverse or bidirectional")
    if direction == "reverse":
        raise UnsupportedError(f"{where}: direction=reverse alone (reverse the sequence and convert the forward layer)")
    if float(at.get("clip", "0") or 0) != 0:
        raise UnsupportedError(f"{where}: clip={at['clip']} clips the gates' inputs; no other format computes that")
    gate_act, act = _activations(el, cls, where, 2 if direction == "bidirectional" else 1)
    cell = {"LSTM": Cell.LSTM, "GRU": Cell.GRU}.get(cls) or (Cell.RNN_RELU if act == "relu" else Cell.RNN_TANH)
    lbr = at.get("linear_before_reset", "false").lower() in ("true", "1")
    for i, what in ((1, "initial hidden state"), (2, "initial cell state")):
        if i == 2 and cls != "LSTM":
            continue
        src = g.producer(el, i)
        if src is not None and src.get("type") in ("Const", "Convert"):
            try:
                v = g.const(src, f"{where} {what}")
            except UnsupportedError:
                continue
            if np.any(v):
                raise UnsupportedError(f"{where}: a stored non-zero {what}; rnnconvert layers start from zero state")
    W, R, B = (g.const(g.producer(el, wi + j) if g.producer(el, wi + j) is not None else el, f"{where} input {w}")
               for j, w in enumerate("WRB"))
    D = 2 if direction == "bidirectional" else 1
    G = cell.gates
    if W.ndim != 3 or R.ndim != 3 or W.shape[:2] != (D, W.shape[1]) or W.shape[1] % G or R.shape != (D, W.shape[1], W.shape[1] // G):
        raise FormatError(f"{where}: W {W.shape} / R {R.shape} do not fit {D} direction(s) of {cls}")
    H = W.shape[1] // G
    if number(at.get("hidden_size", str(H)), "hidden_size", where) != H:
        raise FormatError(f"{where}: hidden_size={at.get('hidden_size')} but W holds {H} per gate")
    nb = 4 * H if (cell is Cell.GRU and lbr) else G * H
    if B.shape != (D, nb):
        raise FormatError(f"{where}: B has shape {B.shape}, expected {(D, nb)}")
    cv = gates.convention("openvino", cell)
    row = []
    for d in range(D):
        w_ih, w_hh = gates.to_canonical(W[d], cv, cell), gates.to_canonical(R[d], cv, cell)
        b_hh = np.zeros(G * H, B.dtype)
        if cell is Cell.GRU and lbr:
            b_ih = gates.vec_to_canonical(np.ascontiguousarray(B[d, :3 * H]), cv, cell)
            b_hh[gates.gate_slice(cell, "n", H)] = B[d, 3 * H:]
        else:
            b_ih = gates.vec_to_canonical(np.ascontiguousarray(B[d]), cv, cell)
        row.append(DirectionParams(w_ih, w_hh, b_ih, b_hh))
    try:
        return RNNLayer(name=name, cell=cell, input_size=W.shape[2], hidden_size=H, bidirectional=D == 2,
                        semantics=Semantics(gate_activation=gate_act, activation=act,
                                            reset_after=lbr if cell is Cell.GRU else True),
                        params=[row], source={"format": "openvino", "class_name": op, "node": el.get("name")})
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}") from exc


def read(path: str | Path, **_: Any) -> Checkpoint:
    """Read every ``LSTMSequence``/``GRUSequence``/``RNNSequence`` node of an IR (its ``.xml``, or a folder
    holding one ``.xml`` and its ``.bin``) into canonical layers (module docstring), in the order of the XML.

    Raises:
        FormatError: unreadable or unsafe XML, no ``.bin``, no sequence node, bad constants or shapes;
        UnsupportedError: weights computed at run time, clip, other activations, a lone reverse direction,
        stored non-zero initial states, bf16 weights.
    """
    p = Path(path)
    budget.regular_source(p)
    try:
        xml, binp = paths(p)
        g = Graph(xml, binp)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    nodes = [el for el in g.layers.values() if el.get("type") in naming.SEQUENCE_OPS]
    if not nodes:
        raise FormatError(f"{xml}: no LSTMSequence, GRUSequence or RNNSequence layer")
    ckpt = Checkpoint(format="openvino", meta={"path": str(xml)})
    seen: set[str] = set()
    for el in nodes:
        name = naming.layer_name(el.get("name", ""))
        base, n = name, 2
        while name in seen:
            name, n = f"{base}_{n}", n + 1
        seen.add(name)
        try:
            ckpt.layers.append(_layer(g, el, name))
        except OSError as exc:
            raise FormatError(f"{xml}: cannot read the .bin ({exc.strerror})") from exc
    return ckpt
