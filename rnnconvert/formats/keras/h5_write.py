"""Keras 2 HDF5 writer (tf_keras full-model ``.h5``) and the tf_keras side of verification.

The written file is a complete model that ``tf_keras.models.load_model(path)`` opens: one
``Input`` per recurrent layer of the checkpoint (named ``<layer>_input``, shape ``(None, None, I)``,
batch-major) feeding that layer; a stacked source layer (``num_layers = L``) becomes ``L`` chained
Keras layers ``<layer>_l0 .. <layer>_l{L-1}``; two directions become ``Bidirectional``. Every layer
has ``return_sequences=True``; the model's outputs are the last Keras layer of each source layer.
Layer names are the source names with every character outside ``[A-Za-z0-9_]`` replaced by ``_``.
Other tensors (Dense, Embedding) are not written (a note says so).

Two forms (LAYOUTS.md §2, §4, §15):

* default: ``LSTM`` / ``GRU`` / ``SimpleRNN``: ``kernel (I, G*H)``, ``recurrent_kernel (H, G*H)``,
  gate columns LSTM i,f,c,o, GRU z,r,h (``gates.TABLE['keras']``); LSTM and SimpleRNN receive the
  summed bias ``b_ih + b_hh`` ``(G*H,)`` (one float rounding; exact when one is zero); GRU
  ``reset_after=True`` keeps both rows ``(2, 3H)``, ``reset_after=False`` gets the summed ``(3H,)``
  (exact: in a reset-before GRU ``b_hn`` sits outside ``r``, so it adds to ``b_in``).
* ``cudnn=True``: ``CuDNNLSTM`` / ``CuDNNGRU``: each ``(in, H)`` kernel slice holds the row-major
  bytes of cuDNN's ``(H, in)`` matrix (inverse of ``interpreter._cudnn_bytes_to_rows``), bias
  ``(2*G*H,)`` = input biases then recurrent biases, Keras slice order (``gates.TABLE['keras_cudnn']``).
  Bit-exact (no arithmetic). A file of this form can be run on a GPU only; on a CPU,
  ``tf_keras`` converts it on ``load_weights`` into ``LSTM`` / ``GRU(reset_after=True)``.

Streamed (``STREAM = True``, :func:`open_stream`): the file is written with h5py, one slab at a time,
holding what tf_keras' ``model.save(path, save_format='h5', include_optimizer=False)`` writes for
:func:`build`'s model (config and weight names from tf_keras itself, run on a size-1 stand-in;
docs/keras.md "Writing Keras 2 HDF5").

Refused (``UnsupportedError``): LSTM projection, peepholes, cell/proj clip, activations Keras 2 has
not (Keras 3 ``hard_sigmoid``); for ``cudnn=True`` also non-sigmoid gates, non-tanh activations,
GRU ``reset_after=False`` and simple RNNs. A TF1 ``forget_bias`` is folded into the bias.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...engine import refusal, stream
from ...errors import UnsupportedError, require
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer
from ...core.transforms import summed_bias
from ...conventions import keras_names as naming
from ...speed import transpose

_K2_ACTS = {"sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "softsign"}


def tf_keras():
    """Import tf_keras (the Keras 2 implementation); raises DependencyError when missing."""
    return require("tf_keras", "tensorflow")


def keras_name(name: str) -> str:
    """A Keras-safe layer name: characters outside ``[A-Za-z0-9_]`` become ``_``, and leading ``_`` go: TensorFlow
    name scopes must start with ``[A-Za-z0-9.]`` (a PyTorch-exported ONNX node ``/recurrent/LSTM`` gave
    ``_recurrent_LSTM``, which tf_keras refused while building the model)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name).lstrip("_") or "rnn"


def plan(ckpt: Checkpoint) -> list[tuple[RNNLayer, str, list[str]]]:
    """``(layer, input name, [Keras layer names])`` per recurrent layer, names unique in the model."""
    used: set[str] = set()
    out = []

    def uniq(n: str) -> str:
        base, i = n, 1
        while n in used:
            n, i = f"{base}_{i}", i + 1
        used.add(n)
        return n

    for layer in ckpt.layers:
        base = keras_name(layer.name)
        names = [uniq(base if layer.num_layers == 1 else f"{base}_l{k}") for k in range(layer.num_layers)]
        out.append((layer, uniq(f"{base}_input"), names))
    return out


def keras_structure_refusals(layer: RNNLayer) -> list[str]:
    """What no Keras (2 or 3) recurrent layer has: projection, peepholes, TF1 clipping."""
    s, why = layer.semantics, []
    if layer.proj_size:
        why.append(f"LSTM projection proj_size={layer.proj_size}")
    if any(p.peep is not None for dirs in layer.params for p in dirs):
        why.append("peephole connections")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("cell_clip/proj_clip")
    return why


#: Keras-3 hard_sigmoid(x) = clip(x/6 + 0.5) = Keras-2 hard_sigmoid(K3_TO_K2_SCALE * x) (Keras 2:
#: clip(0.2x + 0.5), tf_keras ``backend.hard_sigmoid``; Keras 3.15 ``backend/tensorflow/nn.py``); the
#: mirror of :data:`.keras_config.HARD_SIGMOID_SCALE` (1.2).
K3_TO_K2_SCALE = 5.0 / 6.0


def k3_hard_sigmoid_blocks(layer: RNNLayer) -> list[int]:
    """Canonical gate blocks (LSTM i f g o, GRU r z n, simple RNN: the one block) whose pre-activation goes
    through a Keras-3 ``hard_sigmoid``; their rows of ``W_ih``, ``W_hh``, ``b_ih``, ``b_hh`` are scaled by
    :data:`K3_TO_K2_SCALE` for Keras 2's ``hard_sigmoid`` (each gate's pre-activation is linear in its own
    rows; an LSTM's ``activation`` is refused instead, see :func:`refusals`)."""
    s = layer.semantics
    if layer.cell is Cell.LSTM:
        return [0, 1, 3] if s.gate_activation == "hard_sigmoid_k3" else []
    if layer.cell is Cell.GRU:
        return ([0, 1] if s.gate_activation == "hard_sigmoid_k3" else []) + \
            ([2] if s.activation == "hard_sigmoid_k3" else [])
    return [0] if s.activation == "hard_sigmoid_k3" else []


def k3_rescaled(layer: RNNLayer) -> RNNLayer:
    """``layer`` with the rows of :func:`k3_hard_sigmoid_blocks` scaled by 5/6 (one float32 rounding per
    weight, through float64) and ``hard_sigmoid_k3`` renamed ``hard_sigmoid``: the same function in Keras 2's
    definition, up to that rounding ("rescaled, not bit-exact"). Unchanged when no block needs it."""
    blocks = k3_hard_sigmoid_blocks(layer)
    if not blocks:
        return layer
    H = layer.hidden_size
    rows = np.concatenate([np.arange(b * H, (b + 1) * H) for b in blocks])

    def sc(a: np.ndarray) -> np.ndarray:
        out = np.array(a, copy=True)
        out[rows] = (out[rows].astype(np.float64) * K3_TO_K2_SCALE).astype(a.dtype)
        return out

    params = [[DirectionParams(sc(p.w_ih), sc(p.w_hh), sc(p.b_ih), sc(p.b_hh), p.w_hr, p.peep) for p in dirs]
              for dirs in layer.params]
    s = layer.semantics
    out = layer.with_semantics(**{a: "hard_sigmoid" for a in ("gate_activation", "activation")
                                  if getattr(s, a) == "hard_sigmoid_k3"})
    return replace(out, params=params)


def refusals(layer: RNNLayer, cudnn: bool = False) -> list[str]:
    """What a Keras 2 layer (CuDNN form when ``cudnn``) cannot express about ``layer``. A Keras-3
    ``hard_sigmoid`` is written as Keras 2's on rescaled weights (:func:`k3_rescaled`), except as an LSTM's
    ``activation`` (it also squashes the cell state)."""
    s, why = layer.semantics, keras_structure_refusals(layer)
    if layer.cell is Cell.LSTM and s.activation == "hard_sigmoid_k3":
        why.append("activation=hard_sigmoid in Keras 3's definition clip(x/6+0.5) (Keras 2's is clip(0.2x+0.5), "
                   "and an LSTM's activation also squashes the cell state, which no weight scaling reaches)")
    for what, a in (("activation", s.activation), ("recurrent_activation", s.gate_activation)):
        if a == "hard_sigmoid_k3":
            continue
        if a not in _K2_ACTS:
            why.append(f"{what}={a} (Keras 2 has no such activation)")
    if cudnn:
        if layer.cell not in (Cell.LSTM, Cell.GRU):
            why.append("simple RNN (there is no CuDNN SimpleRNN layer)")
        if s.gate_activation != "sigmoid" or s.activation != "tanh":
            why.append(f"activations {s.gate_activation}/{s.activation} (CuDNN layers are sigmoid/tanh only)")
        if layer.cell is Cell.GRU and not s.reset_after:
            why.append("GRU reset_after=False (CuDNNGRU resets after the recurrent matmul)")
    return why


def check(ckpt: Checkpoint, *, cudnn: bool = False, **_: Any) -> list[str]:
    """Refuse what Keras 2 cannot express; return notes.

    Raises:
        UnsupportedError: one line naming the layer, the features, and the way out.
    """
    for layer in ckpt.layers:
        why = refusals(layer, cudnn)
        # (a simple RNN has no CuDNN class: refused below, its message names CuDNNGRU as it always has)
        form = naming.CUDNN_CLASS.get(layer.cell, "CuDNNGRU") if cudnn else naming.KERAS_CLASS[layer.cell]
        if why and cudnn and not refusals(layer):
            what = f"layer '{layer.name}' cannot be written as Keras 2 {form}: {'; '.join(why)}. Write the plain Keras form "
            raise UnsupportedError(what + "(without the cudnn write option) instead", cli=what + "(without --cudnn) instead")
        refusal.refuse(layer, why, "keras_h5", f"Keras 2 {form}")
    notes = [f"{layer.name}: Keras-3 hard_sigmoid clip(x/6+0.5) written as Keras 2's clip(0.2x+0.5) on weights "
             "scaled by 5/6 (one float32 rounding per weight): rescaled, not bit-exact"
             for layer in ckpt.layers if k3_hard_sigmoid_blocks(layer)]
    if ckpt.tensors:
        notes.append(f"{len(ckpt.tensors)} non-recurrent tensors (e.g. {next(iter(ckpt.tensors))}) are not "
                     "written to the Keras file; only the recurrent layers are")
    return notes


def keras_weights(layer: RNNLayer, p: DirectionParams, cudnn: bool) -> list[np.ndarray]:
    """Keras weights ``[kernel, recurrent_kernel(, bias)]`` of one direction of one stacked layer."""
    cell, H, G = layer.cell, layer.hidden_size, layer.cell.gates
    if cudnn:
        conv = naming.convention(cell, True, "keras_cudnn")
        out = []
        for w in (p.w_ih, p.w_hh):
            rows = transpose.reorder(w, gates.CANONICAL[cell], conv.gate_order)  # (G*H, in), file slice order
            width = rows.shape[1]
            out.append(np.ascontiguousarray(np.concatenate(
                [np.ascontiguousarray(rows[j * H:(j + 1) * H]).reshape(width, H) for j in range(G)], axis=1)))
        out.append(np.concatenate([gates.vec_from_canonical(p.b_ih, conv, cell),
                                   gates.vec_from_canonical(p.b_hh, conv, cell)]))
        return out
    ra = cell is Cell.GRU and layer.semantics.reset_after
    conv = naming.convention(cell, layer.semantics.reset_after)
    out = [transpose.from_canonical(p.w_ih, conv, cell), transpose.from_canonical(p.w_hh, conv, cell)]
    if layer.bias:
        if ra:
            out.append(np.stack([gates.vec_from_canonical(p.b_ih, conv, cell),
                                 gates.vec_from_canonical(p.b_hh, conv, cell)]))
        else:
            out.append(gates.vec_from_canonical(summed_bias(p), conv, cell))
    return out


def _make_layer(k, layer: RNNLayer, name: str, cudnn: bool, twin: bool = False, zeros: bool = False):
    # a Keras-3 hard_sigmoid is written as Keras 2's (the weights are rescaled by k3_rescaled)
    layer = layer.with_semantics(**{a: "hard_sigmoid" for a in ("gate_activation", "activation")
                                    if getattr(layer.semantics, a) == "hard_sigmoid_k3"})
    s, H = layer.semantics, layer.hidden_size
    dtype = str(layer.dtype)
    kw: dict[str, Any] = {"return_sequences": True, "dtype": dtype}
    if zeros:  # weights set right after (see _zero_init)
        kw.update(kernel_initializer="zeros", recurrent_initializer="zeros", bias_initializer="zeros")
    kw["name"] = name  # inside Bidirectional: copies named forward_<name> / backward_<name> (not auto-numbered)
    if s.go_backwards and not layer.bidirectional:
        kw["go_backwards"] = True
    if cudnn:
        if layer.cell is Cell.LSTM:
            from tf_keras.src.layers.rnn.cudnn_lstm import CuDNNLSTM as cls
        else:
            from tf_keras.src.layers.rnn.cudnn_gru import CuDNNGRU as cls
        inner = cls(H, **kw)
    else:
        kw.update(activation=s.activation, use_bias=layer.bias or twin)
        if layer.cell is Cell.LSTM:
            inner = k.layers.LSTM(H, recurrent_activation=s.gate_activation, unit_forget_bias=False, **kw)
        elif layer.cell is Cell.GRU:
            inner = k.layers.GRU(H, recurrent_activation=s.gate_activation, reset_after=s.reset_after, **kw)
        else:
            inner = k.layers.SimpleRNN(H, **kw)
    if layer.bidirectional:
        return k.layers.Bidirectional(inner, merge_mode=s.merge_mode, name=name, dtype=dtype)
    return inner


def build(ckpt: Checkpoint, *, cudnn: bool = False, with_weights: bool = True, twin: bool = False):
    """The tf_keras ``Model`` that :func:`write` saves (see the module docstring).

    ``twin=True, with_weights=False``: the untrained plain-layer model (always with bias, as CuDNN
    layers are) into which tf_keras' ``load_weights`` converts a CuDNN-form file.
    """
    k = tf_keras()
    inputs, outputs = [], []
    for layer, in_name, names in plan(ckpt):
        layer = k3_rescaled(layer) if with_weights else layer
        inp = k.Input(shape=(None, layer.input_size), name=in_name, dtype=str(layer.dtype))
        h = inp
        for kk, nm in enumerate(names):
            lay = _make_layer(k, layer, nm, cudnn, twin)
            h = lay(h)
            if with_weights:
                lay.set_weights([w for p in layer.params[kk] for w in keras_weights(layer, p, cudnn)])
        inputs.append(inp)
        outputs.extend(h if isinstance(h, (list, tuple)) else [h])
    return k.Model(inputs, outputs, name="rnnconvert")


def _lines(ckpt: Checkpoint, cudnn: bool) -> list[str]:
    lines = []
    for layer, in_name, names in plan(ckpt):
        form = naming.class_name(layer.cell, cudnn)
        lines.append(f"{layer.name}: tf_keras {form} layer(s) {', '.join(names)} (input '{in_name}', "
                     "return_sequences=True); tf_keras.models.load_model(path)")
    return lines


def write(ckpt: Checkpoint, path: str | Path, *, cudnn: bool = False, **_: Any) -> list[str]:
    """Write ``ckpt`` as a tf_keras full-model HDF5 file; one line per layer saying how to load it.

    The stream loop of :func:`open_stream` (one slab of parameters converted at a time).

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    return stream.stream_write(open_stream(ckpt, path, cudnn=cudnn), ckpt)


# --------------------------------------------------------------------------------------------
# Streaming: the file tf_keras' model.save(path, save_format='h5') writes, written with h5py
# --------------------------------------------------------------------------------------------

#: tf_keras splits a string-list attribute above this many bytes into ``name0, name1, ...``
#: (``saving/legacy/hdf5_format.py`` ``HDF5_OBJECT_HEADER_LIMIT``).
HDF5_OBJECT_HEADER_LIMIT = 64512
#: Checkpoints larger than this get their Keras template from a separate Python process when tf_keras is
#: not imported yet (importing TensorFlow costs ~550 MB RSS, more than a slab of the benchmark model).
TEMPLATE_SUBPROCESS_BYTES = 256 << 20
#: Bytes of one row block of a kernel converted and written at a time.
BLOCK_BYTES = 2 << 20
#: The recurrent classes :func:`build` makes.
_RNN_CLASSES = tuple(dict.fromkeys(naming.KERAS_CLASS.values())) + tuple(naming.CUDNN_CLASS.values())


def _stand_in(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt``'s structure with every size 1 (placeholder weights): what :func:`build` needs for names,
    classes, options and wiring, at no memory cost."""
    from dataclasses import replace

    from ...core.model import placeholder

    layers = []
    for layer in ckpt.layers:
        G, D, dt = layer.cell.gates, layer.num_directions, layer.dtype
        params = [[DirectionParams(placeholder((G, 1 if k == 0 else D), dt), placeholder((G, 1), dt),
                                   placeholder((G,), dt), placeholder((G,), dt))] * D
                  for k in range(layer.num_layers)]
        layers.append(replace(layer, input_size=1, hidden_size=1, proj_size=0, source={},
                              semantics=replace(layer.semantics, forget_bias=0.0), params=params))
    return Checkpoint(layers=layers)


def _template_here(stand_in: Checkpoint, cudnn: bool) -> dict[str, Any]:
    """tf_keras' own metadata for the model of :func:`build`, computed on the size-1 ``stand_in``: the
    ``model_config`` JSON as ``model.save`` writes it (``saving_utils.model_metadata`` with the legacy
    config, ``json_utils.get_json_type``), the layer names and each layer's weight names."""
    import json
    import warnings

    tk = tf_keras()
    from tf_keras.src.saving.legacy import hdf5_format, saving_utils
    from tf_keras.src.saving.legacy.saved_model import json_utils

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(stand_in, cudnn=cudnn, with_weights=False)
        model.use_legacy_config = True
        meta = saving_utils.model_metadata(model, include_optimizer=False)
    return {
        "keras_version": str(meta["keras_version"]), "backend": str(meta["backend"]),
        "model_config": json.dumps(meta["model_config"], default=json_utils.get_json_type),
        "layer_names": [lay.name for lay in model.layers],
        "weights": {lay.name: [w.name for w in hdf5_format._legacy_weights(lay)] for lay in model.layers},
        "top_level": [w.name for w in model._trainable_weights + model._non_trainable_weights],
        "tf_keras": tk.__version__,
    }


def _template_main() -> None:  # pragma: no cover - runs in the subprocess of keras_template
    import json
    import pickle
    import sys

    ckpt, cudnn = pickle.loads(sys.stdin.buffer.read())  # our own parent's stand-in, not file content
    sys.stdout.write("\n" + json.dumps(_template_here(ckpt, cudnn)) + "\n")


def keras_template(ckpt: Checkpoint, cudnn: bool = False) -> dict[str, Any]:
    """:func:`_template_here` for ``ckpt`` with the real sizes patched in (``units`` of every recurrent
    layer, ``batch_input_shape`` of every ``Input``: the only size-dependent fields of a functional
    model's config). Computed in this process when tf_keras is imported already or the checkpoint is
    small; else in a fresh Python process (see :data:`TEMPLATE_SUBPROCESS_BYTES`).

    Raises:
        DependencyError: tf_keras is not installed.
    """
    import json
    import sys

    stand_in = _stand_in(ckpt)
    size = sum(a.nbytes for lay in ckpt.layers for dirs in lay.params for p in dirs for a in p.arrays().values())
    if "tf_keras" in sys.modules or size <= TEMPLATE_SUBPROCESS_BYTES:
        tpl = _template_here(stand_in, cudnn)
    else:
        tpl = _template_subprocess(stand_in, cudnn)
    cfg = json.loads(tpl["model_config"])
    sizes = {}
    for layer, in_name, names in plan(ckpt):
        sizes[in_name] = ("input", layer.input_size)
        for nm in names:
            sizes[nm] = ("units", layer.hidden_size)
    for rec in cfg["config"]["layers"]:
        kind, n = sizes[rec["config"]["name"]]
        c = rec["config"]
        if kind == "input":
            c["batch_input_shape"] = [None, None, n]
        elif rec["class_name"] == "Bidirectional":
            for key in ("layer", "backward_layer"):
                if isinstance(c.get(key), dict):
                    c[key]["config"]["units"] = n
        elif rec["class_name"] in _RNN_CLASSES:
            c["units"] = n
        else:
            raise RuntimeError(f"unexpected layer class {rec['class_name']} in the Keras template")
    tpl["model_config"] = json.dumps(cfg)
    return tpl


def _template_subprocess(stand_in: Checkpoint, cudnn: bool) -> dict[str, Any]:
    import json
    import os
    import pickle
    import subprocess
    import sys

    from ...errors import DependencyError

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    code = "from rnnconvert.formats.keras.h5_write import _template_main; _template_main()"
    data = pickle.dumps((_materialized(stand_in), cudnn))
    res = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, env=env, check=False)
    if res.returncode != 0:
        last = (res.stderr.decode("utf8", "replace").strip().splitlines() or ["no message"])[-1]
        if "DependencyError" in last or "No module named" in last:
            raise DependencyError(f"writing Keras 2 HDF5 needs tf_keras ({last})")
        raise RuntimeError(f"tf_keras could not describe the model: {last}")
    return json.loads(res.stdout.decode("utf8").strip().splitlines()[-1])


def _materialized(ckpt: Checkpoint) -> Checkpoint:
    """The size-1 stand-in with real (tiny) arrays instead of placeholders, so that it pickles small."""
    from dataclasses import replace

    layers = [replace(lay, params=[[DirectionParams(*(np.zeros(a.shape, a.dtype) for a in
                                                      (p.w_ih, p.w_hh, p.b_ih, p.b_hh))) for p in dirs]
                                   for dirs in lay.params]) for lay in ckpt.layers]
    return Checkpoint(layers=layers)


def _weight_shapes(layer: RNNLayer, k: int, cudnn: bool) -> list[tuple[tuple[int, ...], Any]]:
    """Shapes and dtypes of :func:`keras_weights` for stacked layer ``k`` of ``layer`` (one direction)."""
    G, H = layer.cell.gates, layer.hidden_size
    p = layer.params[k][0]
    out = [((layer.layer_input_size(k), G * H), p.w_ih.dtype), ((H, G * H), p.w_hh.dtype)]
    if cudnn:
        out.append(((2 * G * H,), np.result_type(p.b_ih, p.b_hh)))
    elif layer.bias:
        ra = layer.cell is Cell.GRU and layer.semantics.reset_after
        out.append((((2, G * H) if ra else (G * H,)), np.result_type(p.b_ih, p.b_hh)))
    return out


def _attr_strings(group, name: str, values: list[str]) -> None:
    """A string-list attribute as tf_keras writes it (``save_attributes_to_hdf5_group``): the list of
    UTF-8 bytes itself (h5py: variable-length strings; an empty list: float64 ``(0,)``), or, when the
    fixed-width array of them exceeds the header limit, fixed-width pieces ``name0, name1, ...``."""
    items = [v.encode("utf8") for v in values]
    data = np.asarray(items)
    chunks = 1
    while any(c.nbytes > HDF5_OBJECT_HEADER_LIMIT for c in np.array_split(data, chunks)):
        chunks += 1
    if chunks == 1:
        group.attrs[name] = items
    else:
        for j, c in enumerate(np.array_split(data, chunks)):
            group.attrs[f"{name}{j}"] = c


class KerasH5Stream:
    """The stream writer of :func:`open_stream`: the file is laid out up front, each slab's datasets are
    filled when it arrives (kernels one row block at a time, converted from the canonical arrays)."""

    def __init__(self, ckpt: Checkpoint, path: str | Path, cudnn: bool):
        import h5py

        self.ckpt, self.cudnn, self.path = ckpt, cudnn, Path(path)
        tpl = keras_template(ckpt, cudnn)
        self.plan = plan(ckpt)
        self.f = h5py.File(str(path), "w")
        try:
            self._layout(tpl)
        except BaseException:
            self.abort()
            raise

    def _layout(self, tpl: dict[str, Any]) -> None:
        f = self.f
        f.attrs["keras_version"] = tpl["keras_version"]
        f.attrs["backend"] = tpl["backend"]
        f.attrs["model_config"] = tpl["model_config"].encode("utf8")
        g = f.create_group("model_weights")
        _attr_strings(g, "layer_names", tpl["layer_names"])
        g.attrs["backend"] = tpl["backend"].encode("utf8")
        g.attrs["keras_version"] = tpl["keras_version"].encode("utf8")
        shapes: dict[str, list] = {}
        for layer, _, names in self.plan:
            for kk, nm in enumerate(names):
                shapes[nm] = _weight_shapes(layer, kk, self.cudnn) * layer.num_directions
        self.ds: dict[str, list] = {}
        for nm in sorted(tpl["layer_names"]):
            sub = g.create_group(nm)
            wn = tpl["weights"][nm]
            _attr_strings(sub, "weight_names", wn)
            want = shapes.get(nm, [])
            if len(wn) != len(want):
                raise RuntimeError(f"Keras layer {nm}: tf_keras names {len(wn)} weights, rnnconvert has {len(want)}")
            self.ds[nm] = [sub.create_dataset(w, shape, dtype=dt) for w, (shape, dt) in zip(wn, want)]
        top = g.create_group("top_level_model_weights")
        _attr_strings(top, "weight_names", tpl["top_level"])

    def write_slab(self, i: int, k: int, dirs: list[DirectionParams]) -> None:
        """Fill stacked layer ``k`` of ``ckpt.layers[i]`` (all directions) from canonical ``dirs``."""
        layer, _, names = self.plan[i]
        view = k3_rescaled(layer.one_slab(k, dirs))
        targets = iter(self.ds[names[k]])
        for p in view.params[0]:
            for src, ds in zip((p.w_ih, p.w_hh), (next(targets), next(targets))):
                self._kernel(view, src, ds)
            if self.cudnn or view.bias:
                ds = next(targets)
                ds[...] = _bias(view, p, self.cudnn)

    def _kernel(self, layer: RNNLayer, w: np.ndarray, ds) -> None:
        """Write canonical ``w`` ``(G*H, in)`` into the Keras kernel dataset ``ds`` ``(in, G*H)``, row block
        by row block (bit-exact; see :func:`rnnconvert.speed.transpose.from_canonical_block`)."""
        cell, H = layer.cell, layer.hidden_size
        w = np.ascontiguousarray(w)
        width, GH = ds.shape
        step = max(16, (BLOCK_BYTES // max(1, GH * w.dtype.itemsize)) // 16 * 16)
        if self.cudnn:
            conv = naming.convention(cell, True, "keras_cudnn")
            moves = gates.gate_moves(conv.gate_order, gates.CANONICAL[cell], H)
        else:
            conv = naming.convention(cell, layer.semantics.reset_after)
        for r0 in range(0, width, step):
            r1 = min(width, r0 + step)
            if self.cudnn:  # slice j's rows are a contiguous piece of cuDNN's row-major (H, in) matrix
                block = np.empty((r1 - r0, GH), w.dtype)
                for cols, rows in moves:
                    block[:, cols] = w[rows].reshape(-1)[r0 * H:r1 * H].reshape(r1 - r0, H)
            else:
                block = transpose.from_canonical_block(w, conv, cell, r0, r1)
            ds.write_direct(block, np.s_[0:r1 - r0], np.s_[r0:r1])

    def close(self) -> list[str]:
        """Finish the file; the lines :func:`write` returns."""
        self.f.flush()
        self.f.close()
        return _lines(self.ckpt, self.cudnn)

    def abort(self) -> None:
        """Close the file after an error (the caller deletes it)."""
        try:
            self.f.close()
        except Exception:  # noqa: BLE001 - already failing; the file is discarded
            pass


def _bias(layer: RNNLayer, p: DirectionParams, cudnn: bool) -> np.ndarray:
    """The Keras bias of one direction (see :func:`keras_weights`)."""
    cell = layer.cell
    if cudnn:
        conv = naming.convention(cell, True, "keras_cudnn")
        return np.concatenate([gates.vec_from_canonical(p.b_ih, conv, cell), gates.vec_from_canonical(p.b_hh, conv, cell)])
    ra = cell is Cell.GRU and layer.semantics.reset_after
    conv = naming.convention(cell, layer.semantics.reset_after)
    if ra:
        return np.stack([gates.vec_from_canonical(p.b_ih, conv, cell), gates.vec_from_canonical(p.b_hh, conv, cell)])
    return gates.vec_from_canonical(summed_bias(p), conv, cell)


#: The writer streams (see :func:`open_stream`).
STREAM = True


def open_stream(ckpt: Checkpoint, path: str | Path, *, cudnn: bool = False, **_: Any) -> KerasH5Stream:
    """Open a streamed write of ``ckpt`` (a lazy skeleton is enough: only shapes, dtypes and structure are
    looked at) to ``path``: the HDF5 file tf_keras' ``model.save(path, save_format='h5',
    include_optimizer=False)`` writes for :func:`build`'s model -- the same ``model_config`` (tf_keras'
    own, from a size-1 stand-in, sizes patched in), attributes, dataset names, shapes, dtypes and values
    -- written with h5py one slab at a time. Call ``write_slab`` per slab in order, then ``close()``
    (or ``abort()`` on error).

    Raises:
        DependencyError: tf_keras is not installed (it describes the model).
    """
    return KerasH5Stream(ckpt, path, cudnn)



def _text(v: Any) -> str:
    return v.decode("utf8") if isinstance(v, bytes) else str(v)


def _zero_init(cfg: Any) -> Any:
    """A layer config with every ``*_initializer`` set to ``Zeros``: the weights are replaced right after
    building, and the default ``Orthogonal`` recurrent initializer costs a QR decomposition of each
    ``(H, G*H)`` matrix (seconds at H=2048). Nothing else changes."""
    if isinstance(cfg, dict):
        return {key: ({"class_name": "Zeros", "config": {}} if key.endswith("_initializer") else _zero_init(v))
                for key, v in cfg.items()}
    if isinstance(cfg, list):
        return [_zero_init(v) for v in cfg]
    return cfg



def _planned(ckpt: Checkpoint, name: str) -> tuple[RNNLayer, list[str]]:
    for layer, _, names in plan(ckpt):
        if layer.name == name:
            return layer, names
    raise KeyError(name)


def load(path: str | Path, ckpt: Checkpoint, name: str, which=None):
    """The tf_keras runtime's view of a written file (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`,
    :mod:`rnnconvert.runtimes.tf_keras`): ``(dtype, iterator of (k, Keras layer))`` for the stacked layers ``k`` in
    ``which`` (``None``: all) of layer ``name``, each made and loaded as ``load_model`` does (:func:`_loaded_layers`),
    one at a time."""
    layer, names = _planned(ckpt, name)
    return layer.dtype, _loaded_layers(path, layer, names, range(len(names)) if which is None else which)


def _loaded_layers(path: str | Path, layer: RNNLayer, names: list[str], which):
    """Yield ``(k, Keras layer names[k])`` for ``k`` in ``which``, each made and loaded from the file as
    ``load_model`` does it, after the previous one is dropped: ``layers.deserialize`` of the layer's record
    in the file's ``model_config``, tf_keras' legacy HDF5 weight conversion
    (``hdf5_format.preprocess_weights_for_loading`` with the file's ``keras_version``/``backend``) and
    assignment of the layer's datasets in ``weight_names`` order. ``CuDNNLSTM``/``CuDNNGRU`` records
    (layers that run on a GPU only) are made as their plain twin ``LSTM``/``GRU(reset_after=True)``, whose
    weights that conversion produces from the CuDNN ones (as ``load_weights`` into the twin model does)."""
    import gc
    import json

    import h5py

    from ...safety import hdf5_checks, keras_sanitize
    from .h5_read import attr_list

    k = tf_keras()
    from tf_keras.src.saving.legacy import hdf5_format

    with h5py.File(str(path), "r") as f:
        hdf5_checks.check_file(f)  # `verify SRC DST` hands a stranger's file here: nothing read from outside it
        recs = {r["config"]["name"]: r for r in json.loads(_text(f.attrs["model_config"]))["config"]["layers"]}
        g = f["model_weights"]
        version, backend = _text(g.attrs.get("keras_version", "")), _text(g.attrs.get("backend", ""))
        for kk in which:
            klayer = None
            gc.collect()  # the previous Keras layer (reference cycles) and its variables go before the next
            nm = names[kk]
            rec = recs[nm]
            if "CuDNN" in json.dumps(rec):
                klayer = _make_layer(k, layer, nm, cudnn=False, twin=True, zeros=True)
            else:
                clean = keras_sanitize.layer_config(rec["class_name"], rec["config"], path, nm)  # issue #40
                klayer = k.layers.deserialize({"class_name": rec["class_name"], "config": _zero_init(clean)})
            klayer.build((None, None, layer.layer_input_size(kk)))
            values = hdf5_format.preprocess_weights_for_loading(
                klayer, [np.asarray(g[nm][w]) for w in attr_list(g[nm], "weight_names")],
                original_keras_version=version, original_backend=backend)
            variables = hdf5_format._legacy_weights(klayer)  # the order load_weights assigns in
            if len(variables) != len(values):
                raise ValueError(f"Keras layer {nm}: {len(values)} weights in the file, {len(variables)} in the layer")
            for var in variables:  # each array released once assigned
                var.assign(values.pop(0))
            yield kk, klayer
