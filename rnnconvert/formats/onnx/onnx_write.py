"""ONNX models (``.onnx``) with ``LSTM`` / ``GRU`` / ``RNN`` nodes: writer (onnxruntime runs what it writes:
:mod:`rnnconvert.runtimes.onnxruntime`; the reader is :mod:`rnnconvert.formats.onnx.onnx_read`).

Layout facts (ONNX operator spec, op set 7-22; LAYOUTS.md §13):

* ``W [dirs, G*H, I]``, ``R [dirs, G*H, H]``, ``B [dirs, 2*G*H] = [Wb, Rb]``; gate blocks LSTM
  ``i, o, f, c``, GRU ``z, r, h``, RNN one block (the ``"onnx"`` rows of :data:`rnnconvert.core.gates.TABLE`);
  LSTM peepholes ``P [dirs, 3H] = [p_i, p_o, p_f]``; forward direction first.
* GRU ``linear_before_reset=1`` is the reset-after form (cuDNN, PyTorch, Keras ``reset_after=True``),
  ``0`` the reset-before form (Keras ``reset_after=False``, TF1 ``GRUCell``).
* ``activations`` (LSTM f, g, h; GRU f, g; RNN f; repeated per direction) with ``activation_alpha`` /
  ``activation_beta`` consumed in order by the activations that take them (onnxruntime
  ``rnn_helpers.cc``); a missing value is the activation op's default.

Graph written by :func:`write` (design: every recurrent layer can be run and checked alone): per layer
``<name>`` one float graph input ``<name>__in`` ``(batch, time, input_size)`` and one output ``<name>__out``
``(batch, time, dirs*H)`` (directions concatenated, forward first, like ``nn.LSTM(batch_first=True)``);
between them ``Transpose`` to time-major, one ``LSTM``/``GRU``/``RNN`` node per stacked layer (named
``<name>``, or ``<name>.l{k}`` when there are several), ``Transpose``+``Reshape`` between stacked layers.
A ``go_backwards`` layer uses ``direction='reverse'`` and a final time-reversing ``Slice``, so that
``<name>__out`` is in processing order as Keras returns it. Stacked layers and Keras-only facts are
recorded in the model's ``metadata_props['rnnconvert']`` (JSON) so that reading the file back restores
the same layer records. Weights above 2 GB go to an external data file ``<file>.data`` beside the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...engine import refusal
from ...engine.protocol import located
from ...speed import directio
from ...errors import FormatError, OutputExistsError, UnsupportedError, require
from ...core.model import Cell, Checkpoint, RNNLayer
from .onnx_read import META_KEY, read  # noqa: F401  (the reader lives in its own module)

ROUTE = "onnxruntime"
OPSET = 14
#: onnxruntime 1.31 refuses IR version 14 (onnx 1.23's default); 8 is the IR of op set 14 (LAYOUTS §13.5).
IR_VERSION = 8
EXTERNAL_THRESHOLD = 2_000_000_000  # bytes of initializers above which external data is used (protobuf limit 2 GB)
#: the note of a Keras file without a model_config (the reason the recurrent layers alone are written)
WEIGHTS_ONLY = ("weights-only Keras file: it holds no architecture (no chaining, no classes or activations of the "
                "other layers), so only the recurrent layers are written")
OP = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}
# our activation name -> (ONNX name, alpha, beta); alpha/beta None = the op takes none.
_TO_ONNX = {
    "sigmoid": ("Sigmoid", None, None),
    "tanh": ("Tanh", None, None),
    "relu": ("Relu", None, None),
    "softsign": ("Softsign", None, None),
    "linear": ("Affine", 1.0, 0.0),
    "hard_sigmoid": ("HardSigmoid", 0.2, 0.5),  # Keras 2: clip(0.2 x + 0.5, 0, 1)
    "hard_sigmoid_k3": ("HardSigmoid", 1.0 / 6.0, 0.5),  # Keras 3: clip(x / 6 + 0.5, 0, 1)
}



# ----------------------------------------------------------------------------------------- writer
def refusals(layer: RNNLayer) -> list[str]:
    s, why = layer.semantics, []
    if layer.proj_size:
        why.append(f"LSTM projection proj_size={layer.proj_size} (ONNX LSTM has none)")
    if s.cell_clip is not None:
        why.append("cell_clip (ONNX 'clip' clips the activations' inputs, not the cell state)")
    if s.proj_clip is not None:
        why.append("proj_clip (no ONNX equivalent)")
    for a in (s.gate_activation, s.activation):
        if a not in _TO_ONNX:
            why.append(f"activation '{a}' has no ONNX RNN activation")
    return why


def check(ckpt: Checkpoint, *, recurrent_only: bool = False, **_: Any) -> list[str]:
    """Refuse what an ONNX ``LSTM``/``GRU``/``RNN`` node cannot compute; return notes (the recurrent-layers
    file; a whole model is checked by :func:`rnnconvert.whole.formats.onnx.model_write.check`).

    Raises:
        UnsupportedError: projection, ``cell_clip``/``proj_clip``, an activation ONNX lacks (one line
            naming the layer, the features, and the way out).
    """
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "onnx", f"ONNX {OP[layer.cell]}")
    if recurrent_only:
        notes.append("recurrent_only: only the recurrent layers are written, each with its own input")
    for layer in ckpt.layers:
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': '{layer.name}__out' holds both "
                         "directions concatenated; apply the merge to it")
        if layer.dtype == np.float16:
            notes.append(f"{layer.name}: float16 weights stored as float32 (exact; onnxruntime CPU runs RNNs in float32)")
    if ckpt.tensors:
        names = list(ckpt.tensors)
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        notes.append(f"{len(names)} non-recurrent tensor(s) ({shown}) are not written: the ONNX file holds "
                     "the recurrent layers only")
    return notes


def rnn_activations(layer: RNNLayer) -> tuple[list[str], list[float], list[float]]:
    s = layer.semantics
    names = {Cell.LSTM: [s.gate_activation, s.activation, s.activation],
             Cell.GRU: [s.gate_activation, s.activation]}.get(layer.cell, [s.activation])
    acts, alpha, beta = [], [], []
    for n in names * layer.num_directions:
        op, a, b = _TO_ONNX[n]
        acts.append(op)
        if a is not None:
            alpha.append(a)
            beta.append(b)
    return acts, alpha, beta


class Initializers:
    """Makes initializer ``TensorProto`` s: with the weights inside (``data_fh`` ``None``), or streamed to the
    external data file ``data_fh`` as they are made (tensors of ``min_bytes`` or more; offsets aligned to
    4096 bytes), so that no copy of a multi-GB model is held in memory (docs/performance.md)."""

    def __init__(self, numpy_helper, helper, TensorProto, data_fh=None, location: str = "", min_bytes: int = 1024):
        self.nh, self.helper, self.TP = numpy_helper, helper, TensorProto
        self.fh, self.location, self.min_bytes = data_fh, location, min_bytes

    def __call__(self, arr: np.ndarray, name: str):
        return self.pieces([arr], arr.shape, arr.dtype, name)

    def pieces(self, parts: list[np.ndarray], shape: tuple[int, ...], dtype, name: str):
        """The initializer ``name`` of ``shape`` and ``dtype`` whose C-order elements are those of ``parts``
        one after the other (e.g. each direction's gate blocks in ONNX order): written piece by piece to
        the external data file, cast piece by piece when ``dtype`` differs (float16 weights: float32), so
        that no reordered or stacked copy of a multi-GB matrix is made."""
        dt = np.dtype(dtype).newbyteorder("<")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if self.fh is None or nbytes < self.min_bytes:
            whole = np.concatenate([np.asarray(a, dtype=dt).reshape(-1) for a in parts]).reshape(shape)
            return self.nh.from_array(whole, name)
        t = self.TP()
        t.name = name
        t.data_type = self.helper.np_dtype_to_tensor_dtype(dt)
        t.dims.extend(shape)
        pad = -self.fh.tell() % 4096
        self.fh.write(b"\0" * pad)
        offset = self.fh.tell()
        for a in parts:  # the data file (directio.DirectWriter) stages the bytes in aligned blocks
            self.fh.write(memoryview(np.ascontiguousarray(a, dtype=dt).reshape(-1)).cast("B"))
        if self.fh.tell() != offset + nbytes:
            raise FormatError(f"internal: initializer '{name}' has {self.fh.tell() - offset} bytes, not {nbytes}")
        t.data_location = self.TP.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, value
        return t


def slab_inits(layer: RNNLayer, k: int, dirs: list, init: Initializers) -> tuple[list, list[str]]:
    """The initializers of stacked layer ``k`` of ``layer`` (its directions ``dirs``: ``W``, ``R``, and ``B``,
    ``P`` when it has them; the weight matrices written to the external data file now, when there is one)
    and the names of its node's inputs after ``X``."""
    dt = np.float32 if layer.dtype == np.float16 else layer.dtype
    cv = gates.convention("onnx", layer.cell)
    H, D = layer.hidden_size, layer.num_directions
    nn_ = layer.name if layer.num_layers == 1 else f"{layer.name}.l{k}"
    ins, inits = [f"{nn_}.W", f"{nn_}.R"], []
    if cv.orientation != "out_in":
        raise FormatError(f"internal: ONNX weights are {cv.orientation}, the writer expects out_in; please report")
    moves = sorted(gates.gate_moves(gates.CANONICAL[layer.cell], cv.gate_order, H), key=lambda m: m[1].start)
    for key, field in (("W", "w_ih"), ("R", "w_hh")):  # ONNX (D, G*H, in): each direction's gate row blocks in
        mats = [getattr(p, field) for p in dirs]  # ONNX order, written from the canonical arrays (no copy)
        inits.append(init.pieces([m[src] for m in mats for src, _ in moves], (D, *mats[0].shape), dt,
                                 f"{nn_}.{key}"))
    if layer.bias:
        B = np.stack([np.concatenate([gates.vec_from_canonical(p.b_ih, cv, layer.cell),
                                      gates.vec_from_canonical(p.b_hh, cv, layer.cell)]) for p in dirs])
        inits.append(init(B.astype(dt, copy=False), f"{nn_}.B"))
        ins.append(f"{nn_}.B")
    else:
        ins.append("")
    if dirs[0].peep is not None:
        # canonical peep rows p_i, p_f, p_o -> ONNX P[iof] = p_i, p_o, p_f
        P = np.stack([np.concatenate([p.peep[0], p.peep[2], p.peep[1]]) for p in dirs]).astype(dt, copy=False)
        inits.append(init(P, f"{nn_}.P"))
        ins += ["", "", "", f"{nn_}.P"]
    return inits, ins


def _layer_nodes(layer: RNNLayer, helper, init: Initializers, TensorProto,
                 slabs: list | None = None) -> tuple[list, list, list, list, dict]:
    """Nodes, initializers, graph input and output of one layer; plus its metadata record. ``slabs``: each
    stacked layer's :func:`slab_inits` when already made (the streaming writer), else made here."""
    dt = np.float32 if layer.dtype == np.float16 else layer.dtype
    elem = TensorProto.DOUBLE if dt == np.float64 else TensorProto.FLOAT
    H, D = layer.hidden_size, layer.num_directions
    name, s = layer.name, layer.semantics
    reverse = s.go_backwards and not layer.bidirectional
    direction = "bidirectional" if layer.bidirectional else ("reverse" if reverse else "forward")
    acts, alpha, beta = rnn_activations(layer)
    nodes, inits = [], []
    cur = f"{name}__tm0"
    nodes.append(helper.make_node("Transpose", [f"{name}__in"], [cur], name=f"{name}__to_time_major", perm=[1, 0, 2]))
    node_names = []
    for k in range(layer.num_layers):
        nn_ = name if layer.num_layers == 1 else f"{name}.l{k}"
        node_names.append(nn_)
        made, more = slab_inits(layer, k, layer.params[k], init) if slabs is None else slabs[k]
        inits += made
        ins = [cur] + more
        attrs: dict[str, Any] = {"hidden_size": H, "direction": direction, "activations": acts}
        if alpha:
            attrs["activation_alpha"] = alpha
            attrs["activation_beta"] = beta
        if layer.cell is Cell.GRU:
            attrs["linear_before_reset"] = 1 if s.reset_after else 0
        y = f"{nn_}__Y"
        nodes.append(helper.make_node(OP[layer.cell], ins, [y], name=nn_, **attrs))
        # Y (T, D, B, H) -> (T, B, D, H) -> (T, B, D*H)
        nodes.append(helper.make_node("Transpose", [y], [f"{nn_}__Yt"], name=f"{nn_}__merge_dirs_t", perm=[0, 2, 1, 3]))
        cur = f"{name}__tm{k + 1}"
        nodes.append(helper.make_node("Reshape", [f"{nn_}__Yt", f"{name}__shape3"], [cur], name=f"{nn_}__merge_dirs"))
    inits.append(init.nh.from_array(np.array([0, 0, -1], dtype=np.int64), f"{name}__shape3"))
    last = f"{name}__bm" if reverse else f"{name}__out"
    nodes.append(helper.make_node("Transpose", [cur], [last], name=f"{name}__to_batch_major", perm=[1, 0, 2]))
    if reverse:
        for key, v in (("starts", [-1]), ("ends", [-(2 ** 63)]), ("axes", [1]), ("steps", [-1])):
            inits.append(init.nh.from_array(np.array(v, dtype=np.int64), f"{name}__rev_{key}"))
        nodes.append(helper.make_node("Slice", [last] + [f"{name}__rev_{k}" for k in ("starts", "ends", "axes", "steps")],
                                      [f"{name}__out"], name=f"{name}__processing_order"))
    inp = helper.make_tensor_value_info(f"{name}__in", elem, ["batch", "time", layer.input_size])
    out = helper.make_tensor_value_info(f"{name}__out", elem, ["batch", "time", D * H])
    meta = {"name": name, "nodes": node_names, "go_backwards": bool(s.go_backwards),
            "merge_mode": s.merge_mode, "return_sequences": layer.return_sequences,
            "source_class": layer.source.get("class_name")}
    return nodes, inits, [inp], [out], meta


def build_model(ckpt: Checkpoint, *, check_model: bool = True, init: Initializers | None = None,
                slabs: dict | None = None):
    """The ``onnx.ModelProto`` of ``ckpt`` (see the module docstring); deterministic.

    ``check_model``: run ``onnx.checker`` on the in-memory model (it cannot check external data;
    :func:`write` checks those models by path after saving them). ``init``: where the weights go
    (default: inside the model). ``slabs``: ``{(i, k): slab_inits(...)}`` already made by the streaming
    writer (:class:`OnnxStream`); then no parameter of ``ckpt`` is read.

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    onnx = require("onnx", "onnx")
    from onnx import TensorProto, helper, numpy_helper

    init = init or Initializers(numpy_helper, helper, TensorProto)
    nodes, inits, ins, outs, meta = [], [], [], [], []
    for li, layer in enumerate(ckpt.layers):
        n, i, a, b, m = _layer_nodes(layer, helper, init, TensorProto,
                                     None if slabs is None else [slabs[li, k] for k in range(layer.num_layers)])
        nodes += n
        inits += i
        ins += a
        outs += b
        meta.append(m)
    graph = helper.make_graph(nodes, "rnnconvert", ins, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rnnconvert",
                              ir_version=IR_VERSION)
    helper.set_model_props(model, {META_KEY: json.dumps({"layers": meta}, sort_keys=True)})
    if check_model:
        onnx.checker.check_model(model)
    return model


def _final_name(path: Path) -> str:
    """The name the file will have: :mod:`rnnconvert.api` writes ``.<name>.<random>.rnnconvert-tmp`` first."""
    n = path.name
    if n.startswith(".") and n.endswith(".rnnconvert-tmp"):
        return n[1:-len(".rnnconvert-tmp")].rsplit(".", 1)[0]
    return n


def write(ckpt: Checkpoint, path: str | Path, *, external_data: bool | None = None, external_min_bytes: int = 1024,
          **_: Any) -> list[str]:
    """Write ``ckpt`` as an ONNX model runnable by onnxruntime; one line per layer says how to run it
    (:class:`OnnxStream` fed every slab in order).

    Args:
        external_data: ``True`` forces the weights into ``<file>.data`` beside the model, ``False``
            forbids it, ``None`` (default) uses it when the initializers exceed 2 GB.
        external_min_bytes: tensors smaller than this stay inside the model (the int64 shape constants
            must: onnxruntime's shape inference cannot read them from external data).
        recurrent_only: accepted (this writer writes the recurrent layers only; whole models: :mod:`rnnconvert.whole.formats.onnx.model_write`).

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    from ...engine import stream

    return stream.stream_write(open_stream(ckpt, path, external_data=external_data,
                                           external_min_bytes=external_min_bytes), ckpt)


def open_stream(ckpt: Checkpoint, path: str | Path, *, external_data: bool | None = None,
                external_min_bytes: int = 1024, **_: Any) -> "OnnxStream":
    """An :class:`OnnxStream` writing ``ckpt`` (lazy or not) to ``path``: the engine's streaming writer
    (:mod:`rnnconvert.engine.protocol`); options as :func:`write`."""
    return OnnxStream(ckpt, path, external_data, external_min_bytes)


class OnnxStream:
    """An ONNX model written slab by slab: each slab's weight matrices go to the external data file when it
    is given (:meth:`write_slab`; the model holds only their locations), the graph and the small tensors
    at :meth:`close`. Without external data (models under 2 GB) the initializers are kept in memory until
    :meth:`close` writes the model. Bytes are those of the whole-model writer (:func:`build_model`)."""

    WRITE_BEHIND = False

    def __init__(self, ckpt: Checkpoint, path: str | Path, external_data: bool | None, min_bytes: int) -> None:
        self.onnx = require("onnx", "onnx")
        from onnx import TensorProto, helper, numpy_helper

        self.ckpt, self.path, self.fh = ckpt, Path(path), None
        if external_data is None:  # the weights' size as written (float16 is stored as float32)
            size = sum(int(a.size) * 4 if a.dtype == np.float16 else int(a.size) * a.dtype.itemsize
                       for layer in ckpt.layers for dirs in layer.params for p in dirs for a in p.arrays().values())
            external_data = size > EXTERNAL_THRESHOLD
        location = ""
        if external_data:
            # the weights stream into '<final name>.data' (truncated first) as each slab is given
            location = _final_name(self.path) + ".data"
            if (self.path.parent / location).exists() and not (self.path.parent / _final_name(self.path)).exists():
                # a data file without its model: someone else's; never overwrite it (with an existing model,
                # api.convert only gets here under --force, which covers the model's own data file).
                raise OutputExistsError(f"{self.path.parent / location} exists; remove it or choose another output name")
            self.fh = directio.DirectWriter(self.path.parent / location)  # around the page cache where allowed
        self.external = external_data
        self.init = Initializers(numpy_helper, helper, TensorProto, self.fh, location,
                                  min_bytes if external_data else 1024)
        self.slabs: dict = {}

    def write_slab(self, i: int, k: int, dirs: list) -> None:
        self.slabs[i, k] = slab_inits(self.ckpt.layers[i], k, dirs, self.init)

    def close(self) -> list[str]:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        model = build_model(self.ckpt, check_model=not self.external, init=self.init, slabs=self.slabs)
        self.slabs = {}
        self.onnx.save_model(model, str(self.path))
        if self.external:
            self.onnx.checker.check_model(str(self.path))  # by path: the checker cannot see external data in memory
        recs = json.loads(model.metadata_props[0].value)["layers"]
        return [f"{l.name}: ONNX {OP[l.cell]} node(s) {', '.join(r['nodes'])}; feed '{l.name}__in' (batch, time, "
                f"{l.input_size}), read '{l.name}__out'" for l, r in zip(self.ckpt.layers, recs)]

    def abort(self) -> None:
        """Close and remove the external data file this writer made (the model itself is the engine's
        temporary file)."""
        fh, self.fh, self.slabs = self.fh, None, {}
        if fh is not None:
            try:
                fh.close()
            finally:
                Path(fh.path).unlink(missing_ok=True)


#: the whole-model ONNX writer (:mod:`rnnconvert.whole.formats.onnx.model_write`), loaded when a whole model is written
WHOLE_CHECK = located("rnnconvert.whole.formats.onnx.model_write:check")
WHOLE_WRITE = located("rnnconvert.whole.formats.onnx.model_write:write")


def container_check(ckpt: Checkpoint, *, recurrent_only: bool = False, whole_model: Any = None,
                    **options: Any) -> list[str]:
    """The ``onnx`` container's check: a whole model (the engine's write option ``whole_model``, not
    ``recurrent_only``) by the whole-model writer (:data:`WHOLE_CHECK`), else the recurrent layers' refusals
    (:func:`check`), noting a Keras file without architecture (:data:`WEIGHTS_ONLY`).

    Raises:
        UnsupportedError: as :func:`check`, or the whole-model writer's refusals (layer, class, way out); the write
            option ``states`` (CLI ``--states``) for the recurrent layers alone (``recurrent_only``, or a source
            without a whole model): their nodes' ``initial_h``/``Y_h`` are not graph inputs and outputs of this
            writer, and the option is refused rather than ignored (issue #39)."""
    if whole_model is not None and not recurrent_only:
        return WHOLE_CHECK(ckpt, whole_model=whole_model, **options)
    options.pop("mask_layout", None)  # the recurrent layers alone take no mask
    runtime = options.pop("runtime", None)  # nor a runtime profile (whole-model graphs only)
    if options.pop("states", None):
        raise UnsupportedError(
            "states (--states): the ONNX graph of the recurrent layers alone (--recurrent-only, a partial conversion, "
            "or a source without a whole Keras model) takes no initial states and gives no final states; --states "
            "applies to a whole Keras model written whole (drop --states)")
    out = check(ckpt, recurrent_only=recurrent_only, **options)
    if runtime not in (None, "onnxruntime"):
        out.append(f"runtime={runtime!r} applies to a whole-model graph; the recurrent layers are written as native "
                   "ONNX nodes")
    if ckpt.format == "keras_h5" and not recurrent_only:
        out.insert(0, WEIGHTS_ONLY)
    return out


def container_write(ckpt: Checkpoint, path: str | Path, *, recurrent_only: bool = False, whole_model: Any = None,
                    **options: Any) -> list[str]:
    """The ``onnx`` container's write: a whole model as one graph (:data:`WHOLE_WRITE`), else the recurrent
    layers (:func:`write`). Assumes :func:`container_check` passed."""
    if whole_model is not None and not recurrent_only:
        return WHOLE_WRITE(ckpt, path, whole_model=whole_model, **options)
    options.pop("mask_layout", None)
    options.pop("runtime", None)
    options.pop("states", None)
    return write(ckpt, path, **options)
