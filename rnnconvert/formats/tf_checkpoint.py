"""TensorFlow checkpoints (``<prefix>.index`` + ``<prefix>.data-*``): reader.

Two kinds, told apart by their keys (``../shared/LAYOUTS.md`` §§7-9):

* **TF2 object-based** (tf.keras / tf_keras ``save_weights`` without ``.h5``, ``tf.train.Checkpoint``):
  keys ``layer_with_weights-N/[forward_layer/|backward_layer/]cell/{kernel,recurrent_kernel,bias}
  /.ATTRIBUTES/VARIABLE_VALUE`` (CuDNNLSTM/CuDNNGRU without ``cell/``). The Keras layer kind is
  decided from the shapes exactly as for weights-only HDF5 files (recurrent width ``G*H``; bias
  ``(4H,)`` LSTM, ``(8H,)`` CuDNNLSTM, ``(3H,)`` GRU reset_after=False, ``(2, 3H)`` GRU
  reset_after=True, ``(6H,)`` CuDNNGRU) by :mod:`rnnconvert.formats.keras_h5`'s interpreter; gate
  orders from :data:`rnnconvert.gates.TABLE` ``keras*`` entries. Object checkpoints carry no layer
  config: activations are the TF2 defaults (sigmoid gates, tanh) unless ``gate_activation`` is given
  (TF 1.x tf.keras defaulted to hard_sigmoid). Optimizer slots are skipped; Dense/Embedding tensors
  are carried along in PyTorch naming.
* **TF1 name-based** (``tf.compat.v1.train.Saver``): cells found by their scope (LAYOUTS §8.5):
  ``lstm_cell``, ``basic_lstm_cell`` (LSTMCell/BasicLSTMCell/LSTMBlockCell: ``kernel (I+Hr, 4H)``
  columns i, j, f, o = ``("tf1", LSTM)``; rows ``[:I]`` input, ``[I:]`` recurrent; ``bias (4H,)``;
  peepholes ``w_{i,f,o}_diag (H,)``; ``projection/kernel (H, P)``), ``gru_cell`` (GRUCell:
  ``gates/kernel (I+H, 2H)`` columns r, u = ``("tf1_gates", GRU)``, ``candidate/kernel (I+H, H)``;
  reset before the matmul), ``cudnn_compatible_lstm_cell`` (forget_bias 0),
  ``cudnn_compatible_gru_cell`` (``candidate/{input,hidden}_projection``; reset after),
  ``basic_rnn_cell``; old ``weights``/``biases`` names too. ``multi_rnn_cell/cell_N`` stacks become one
  layer with ``num_layers`` when the sizes chain; ``bidirectional_rnn/{fw,bw}`` pairs one
  bidirectional layer. ``forget_bias`` (never stored) is each cell's default -- 1.0 for
  LSTMCell/BasicLSTMCell/LSTMBlockCell, 0 for CudnnCompatibleLSTMCell -- or the ``forget_bias`` option.
  ``tf.contrib.cudnn_rnn`` ``opaque_kernel`` buffers are unpacked with :func:`rnnconvert.cudnn.unpack`
  (spec from the companion canonical variables, else from ``num_layers``/``hidden_size``/
  ``bidirectional`` options and the size). Slow contrib cells are refused by name.

TensorFlow is imported only inside :func:`read`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .. import cudnn, gates
from ..errors import FormatError, UnsupportedError, require
from ..model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics

ATTR = "/.ATTRIBUTES/VARIABLE_VALUE"
#: TF1 cell scopes and their default run-time forget_bias (LAYOUTS §8.1-8.4, §9.1, §9.3).
CELL_SCOPES = {"lstm_cell": 1.0, "basic_lstm_cell": 1.0, "lstm_block_wrapper": 1.0, "lstm_fused_cell": 1.0,
               "cudnn_compatible_lstm_cell": 0.0, "gru_cell": None, "cudnn_compatible_gru_cell": None,
               "basic_rnn_cell": None}
#: Contrib cells refused by name, with the reason (LAYOUTS §16.4; checkpoint_convert.py name list).
REFUSED = {"layer_norm_basic_lstm_cell": "layer normalisation inside the cell",
           "layer_norm_lstm_cell": "layer normalisation inside the cell",
           "nas_cell": "NASCell's searched architecture", "phased_lstm_cell": "PhasedLSTM time gate",
           "ugrnn_cell": "UGRNN update rule", "glstm_cell": "grouped LSTM (GLSTMCell)",
           "conv1d_lstm_cell": "convolutional kernels", "conv2d_lstm_cell": "convolutional kernels",
           "conv_lstm_cell": "convolutional kernels"}
_CUDNN_SCOPES = {"cudnn_lstm": Cell.LSTM, "cudnn_gru": Cell.GRU, "cudnn_rnn_tanh": Cell.RNN_TANH,
                 "cudnn_rnn_relu": Cell.RNN_RELU}
_CELL_RE = re.compile(r"^(?P<prefix>.*?)(?:^|/)(?P<cell>" + "|".join(CELL_SCOPES) + r")/(?P<var>.+)$")


def prefix_of(path: str | Path) -> str | None:
    """The checkpoint prefix for a prefix, a ``.index`` file, or a directory holding ``checkpoint``."""
    p = Path(path)
    if p.is_dir() and (p / "variables" / "variables.index").is_file():  # a SavedModel directory
        return str(p / "variables" / "variables")
    if p.is_dir():
        ck = p / "checkpoint"
        if not ck.is_file():
            return None
        m = re.search(r'^model_checkpoint_path:\s*"(.*)"', ck.read_text(errors="replace"), re.M)
        if not m:
            return None
        q = Path(m.group(1))
        q = q if q.is_absolute() else p / q
        if not Path(str(q) + ".index").is_file():  # an absolute path written elsewhere: look beside the file
            q = p / q.name
        return str(q)
    s = str(p)
    if s.endswith(".index"):
        return s[: -len(".index")]
    return s if Path(s + ".index").is_file() else None


def sniff(head: bytes, path: Path) -> bool:
    """A ``.index`` file, a directory with a ``checkpoint`` file, or a prefix whose ``.index`` exists."""
    try:
        pre = prefix_of(path)
    except OSError:
        return False
    return pre is not None and Path(pre + ".index").is_file()


def read(path: str | Path, *, forget_bias: float | None = None, gate_activation: str | None = None,
         num_layers: int | None = None, hidden_size: int | None = None, bidirectional: bool | None = None,
         cell_clip: float | None = None, proj_clip: float | None = None, **_: Any) -> Checkpoint:
    """Read a TF1 name-based or TF2 object-based checkpoint.

    Args:
        path: the prefix (``ckpt-1``), the ``.index`` file, or the directory with a ``checkpoint`` file.
        forget_bias: TF1 LSTM cells: override the run-time forget bias (default per cell, see module).
        gate_activation: TF2 Keras layers: ``'sigmoid'`` (default) or ``'hard_sigmoid'``.
        num_layers, hidden_size, bidirectional: spec of a cuDNN ``opaque_kernel`` without companions.
        cell_clip, proj_clip: TF1 LSTMCell clipping used at training time (not stored in checkpoints).

    Returns:
        a :class:`Checkpoint` in canonical form (dtype as stored).

    Raises:
        FormatError: unreadable checkpoint, unexpected shapes, ambiguous opaque buffer size.
        UnsupportedError: a cell rnnconvert refuses (named, with the reason).
    """
    tf = require("tensorflow", "tensorflow")
    pre = prefix_of(path)
    if pre is None:
        raise FormatError(f"{path}: not a TensorFlow checkpoint (no .index file or 'checkpoint' file)")
    try:
        rd = tf.train.load_checkpoint(pre)
        shapes = rd.get_variable_to_shape_map()
    except Exception as exc:  # tf raises several kinds
        raise FormatError(f"{path}: cannot read TensorFlow checkpoint ({str(exc).splitlines()[0]})") from exc

    def get(key: str) -> np.ndarray:
        arr = np.asarray(rd.get_tensor(key))
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise FormatError(f"{path}: variable '{key}' contains NaN or Inf")
        return arr

    meta = {"path": str(path), "prefix": pre, "tensorflow": tf.__version__}
    if any(k.endswith(ATTR) for k in shapes):
        names = {k: k[: -len(ATTR)] for k in shapes if k.endswith(ATTR) and "/.OPTIMIZER_SLOT/" not in k}
        if any(not n.startswith("layer") for n in names.values()) and "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes:
            paths = _object_paths(rd.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
            names = {k: (n if n.startswith("layer") else paths.get(k, n)) for k, n in names.items()}
        return _read_tf2(path, names, get, gate_activation, meta)
    return _read_tf1(path, shapes, get, meta, forget_bias=forget_bias, opts=dict(
        num_layers=num_layers, hidden_size=hidden_size, bidirectional=bidirectional),
        cell_clip=cell_clip, proj_clip=proj_clip)


# ------------------------------------------------------------------------------------------------
# TF2 object-based
# ------------------------------------------------------------------------------------------------

def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _object_paths(blob: bytes) -> dict[str, str]:
    """Checkpoint key -> the shortest ``layer_with_weights-N/...`` object path reaching it, from the
    serialized ``TrackableObjectGraph`` (SavedModel ``variables/`` keys are ``variables/<k>/...``; LAYOUTS §7)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    g = trackable_object_graph_pb2.TrackableObjectGraph()
    g.ParseFromString(blob)
    best: dict[str, str] = {}
    seen, queue = {0}, [(0, "")]
    while queue:
        i, path = queue.pop(0)
        for a in g.nodes[i].attributes:
            if a.name == "VARIABLE_VALUE" and path.startswith("layer_with_weights-"):
                if a.checkpoint_key not in best or len(path) < len(best[a.checkpoint_key]):
                    best[a.checkpoint_key] = path
        for c in g.nodes[i].children:
            if c.node_id not in seen and not c.local_name.startswith(("keras_api", "variables", "trainable_",
                                                                       "non_trainable_", "signatures")):
                seen.add(c.node_id)
                queue.append((c.node_id, f"{path}/{c.local_name}" if path else c.local_name))
    return best


def _read_tf2(path, names: dict[str, str], get, gate_activation, meta) -> Checkpoint:
    """``names``: checkpoint key -> object path (``layer_with_weights-N/...``)."""
    from .keras_h5 import _Entry, _Reader

    by_path = {n: k for k, n in names.items()}
    keys = sorted(n for n in by_path if n.split("/")[0].startswith("layer"))
    rank = {"kernel": 0, "recurrent_kernel": 1, "bias": 2}
    groups: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        groups[k.split("/")[0]].append(k)
    kr = _Reader(str(path), "2.4.0", gate_activation)
    kr.ckpt.format = "tf_checkpoint"
    kr.ckpt.meta.update(meta, kind="tf2_object")
    for top in sorted(groups, key=_natural):
        names = sorted(groups[top], key=lambda k: (
            0 if "/forward_layer/" in k else 1 if "/backward_layer/" in k else 0,
            _natural(k.rsplit("/", 1)[0]), rank.get(k.rsplit("/", 1)[-1], 3)))
        rel = [k.split("/", 1)[1] if "/" in k else k for k in names]
        kr.entry(_Entry(top, rel, [get(by_path[k]) for k in names]), "")
    if not kr.ckpt.layers:
        raise FormatError(f"{path}: TF2 object checkpoint without a recurrent layer (LSTM, GRU, SimpleRNN, "
                          "CuDNNLSTM, CuDNNGRU)")
    for lay in kr.ckpt.layers:
        lay.source["format"] = "tf_checkpoint"
    return kr.ckpt


# ------------------------------------------------------------------------------------------------
# TF1 name-based
# ------------------------------------------------------------------------------------------------

#: old names -> current: pre-1.0 ``weights``/``biases`` (checkpoint_convert.py), GRUBlockCell (V1) ``w_ru``,
#: ``b_ru``, ``w_c``, ``b_c`` (= GRUCell's gates/candidate variables; LAYOUTS §8.6, §9.2).
_RENAME = (("weights", "kernel"), ("biases", "bias"), ("w_ru", "gates/kernel"), ("b_ru", "gates/bias"),
           ("w_c", "candidate/kernel"), ("b_c", "candidate/bias"))


def _cell_vars(shapes) -> dict[tuple[str, str], dict[str, str]]:
    """``{(scope, cell): {var: key}}`` for every recognised TF1 cell."""
    out: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for key in shapes:
        parts = key.split("/")
        for bad, why in REFUSED.items():
            if bad in parts:
                raise UnsupportedError(f"variable '{key}': {bad} ({why}) is not supported by rnnconvert; "
                                       "no target format expresses it")
        m = _CELL_RE.match(key)
        if not m:
            continue
        var = m.group("var")
        if re.search(r"(^|/)(Adam(_\d+)?|Momentum|Adagrad|RMSProp(_\d+)?|ExponentialMovingAverage)$", var):
            continue  # optimizer slots
        for a, b in _RENAME:
            var = re.sub(rf"(^|/){a}$", rf"\1{b}", var)
        out[(m.group("prefix"), m.group("cell"))][var] = key
    return out


def _lstm(v, get, name) -> tuple[DirectionParams, int, int, int]:
    kern, bias = get(v["kernel"]), get(v["bias"])
    H = bias.shape[0] // 4
    proj = get(v["projection/kernel"]) if "projection/kernel" in v else None
    P = proj.shape[1] if proj is not None else 0
    I = kern.shape[0] - (P or H)
    if kern.shape[1] != 4 * H or I < 1 or (proj is not None and proj.shape[0] != H):
        raise FormatError(f"cell '{name}': kernel {kern.shape}, bias {bias.shape} do not fit an LSTM")
    conv = gates.convention("tf1", Cell.LSTM)
    peep = None
    if "w_i_diag" in v:
        peep = np.stack([get(v[f"w_{g}_diag"]) for g in "ifo"])
    dp = DirectionParams(gates.to_canonical(kern[:I], conv, Cell.LSTM), gates.to_canonical(kern[I:], conv, Cell.LSTM),
                         gates.vec_to_canonical(bias, conv, Cell.LSTM), np.zeros(4 * H, bias.dtype),
                         None if proj is None else np.ascontiguousarray(proj.T), peep)
    return dp, I, H, P


def _gru(v, get, name, compat: bool) -> tuple[DirectionParams, int, int, int]:
    gk, gb = get(v["gates/kernel"]), get(v["gates/bias"])
    H = gb.shape[0] // 2
    I = gk.shape[0] - H
    conv = gates.convention("tf1_gates", Cell.GRU)

    def rz(m: np.ndarray) -> np.ndarray:  # (rows, 2H) in conv order -> canonical r, z blocks (2H, rows)
        parts = dict(zip(conv.gate_order, np.split(m.T, 2, axis=0)))
        return np.concatenate([parts["r"], parts["z"]], axis=0)

    def rzb(b: np.ndarray) -> np.ndarray:
        parts = dict(zip(conv.gate_order, np.split(b, 2)))
        return np.concatenate([parts["r"], parts["z"]])

    zeros = np.zeros(H, gb.dtype)
    if compat:
        wi, bi = get(v["candidate/input_projection/kernel"]), get(v["candidate/input_projection/bias"])
        wh, bh = get(v["candidate/hidden_projection/kernel"]), get(v["candidate/hidden_projection/bias"])
    else:
        ck, cb = get(v["candidate/kernel"]), get(v["candidate/bias"])
        wi, bi, wh, bh = ck[:I], cb, ck[I:], zeros
        if ck.shape != (I + H, H):
            raise FormatError(f"cell '{name}': candidate/kernel {ck.shape}, expected {(I + H, H)}")
    if gk.shape != (I + H, 2 * H) or wi.shape != (I, H) or wh.shape != (H, H):
        raise FormatError(f"cell '{name}': gates/kernel {gk.shape} does not fit a GRU")
    dp = DirectionParams(np.concatenate([rz(gk[:I]), wi.T]), np.concatenate([rz(gk[I:]), wh.T]),
                         np.concatenate([rzb(gb), bi]), np.concatenate([np.zeros(2 * H, gb.dtype), bh]))
    return dp, I, H, 0


def _rnn(v, get, name) -> tuple[DirectionParams, int, int, int]:
    kern, bias = get(v["kernel"]), get(v["bias"])
    H = bias.shape[0]
    I = kern.shape[0] - H
    if kern.shape[1] != H or I < 1:
        raise FormatError(f"cell '{name}': kernel {kern.shape} does not fit a basic RNN cell of {H} units")
    conv = gates.convention("tf1", Cell.RNN_TANH)
    return DirectionParams(gates.to_canonical(kern[:I], conv, Cell.RNN_TANH),
                           gates.to_canonical(kern[I:], conv, Cell.RNN_TANH), bias.copy(),
                           np.zeros(H, bias.dtype)), I, H, 0


def _cell(cellname: str, v: dict[str, str], get, name: str):
    try:
        if "lstm" in cellname:
            return Cell.LSTM, _lstm(v, get, name)
        if "gru" in cellname:
            return Cell.GRU, _gru(v, get, name, cellname.startswith("cudnn"))
        return Cell.RNN_TANH, _rnn(v, get, name)
    except KeyError as exc:
        raise FormatError(f"cell '{name}' ({cellname}) lacks variable {exc}; has {sorted(v)}") from exc


def _structure(prefix: str, cname: str) -> tuple[str, int, int]:
    """``(base scope, stacked layer k, direction d)`` of a cell found under ``prefix`` (LAYOUTS §8.5).

    Raises:
        UnsupportedError: a MultiRNNCell inside each direction of ``bidirectional_dynamic_rnn`` (two
            independent stacks, not a stacked bidirectional layer).
    """
    parts = prefix.split("/") if prefix else []
    k = d = None
    while len(parts) >= 2:
        if parts[-1] in ("fw", "bw") and parts[-2] == "bidirectional_rnn":
            if k is not None:
                raise UnsupportedError(f"scope '{prefix}': a MultiRNNCell inside each direction of a bidirectional "
                                       "RNN runs two independent stacks; rnnconvert reads only stacked "
                                       "bidirectional layers (stack_bidirectional_rnn)")
            d = 1 if parts[-1] == "bw" else 0
        elif re.fullmatch(r"cell_\d+", parts[-1]) and parts[-2] in ("multi_rnn_cell", "stack_bidirectional_rnn"):
            k = int(parts[-1][5:])
        else:
            break
        parts = parts[:-2]
    if parts and parts[-1] == "rnn":
        parts = parts[:-1]
    return "/".join(parts) or cname, k or 0, d or 0


def _cell_sem(cname: str, cell: Cell, forget_bias, cell_clip, proj_clip) -> Semantics:
    fb = CELL_SCOPES[cname] if forget_bias is None else forget_bias
    lstm = cell is Cell.LSTM
    return Semantics(reset_after=cname == "cudnn_compatible_gru_cell" if cell is Cell.GRU else True,
                     forget_bias=float(fb or 0.0) if lstm else 0.0, cell_clip=cell_clip if lstm else None,
                     proj_clip=proj_clip if lstm else None)


def source_forward(layer: RNNLayer, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """The source side of verification, from the tensors as stored: TF1 cell equations
    (:mod:`.tf1_math`) for TF1 cells, Keras equations (:mod:`.keras_math`) for TF2 Keras layers."""
    if layer.source.get("class_name") in CELL_SCOPES:
        from .tf1_math import source_forward as fwd
    else:
        from .keras_math import source_forward as fwd
    return fwd(layer, x, dtype)


def _read_tf1(path, shapes, get, meta, *, forget_bias, opts, cell_clip, proj_clip) -> Checkpoint:
    ckpt = Checkpoint(format="tf_checkpoint", meta={**meta, "kind": "tf1_name"})
    cells = _cell_vars(shapes)
    # group cells into layers: base scope -> {(k, d): (cellname, vars)}
    layers: dict[str, dict[tuple[int, int], tuple[str, dict]]] = defaultdict(dict)
    for (prefix, cname), v in cells.items():
        base, k, d = _structure(prefix, cname)
        layers[base][(k, d)] = (cname, v)
    used_opaque = set()
    for base in sorted(layers, key=_natural):
        found = layers[base]
        dirs = 2 if any(d for _, d in found) else 1
        nl = 1 + max(k for k, _ in found)
        built = {}
        for (k, d), (cname, v) in found.items():
            built[(k, d)] = (cname, *_cell(cname, v, get, f"{base}/cell_{k}/{'bw' if d else 'fw'}"))
        kinds = {(c, cell) for c, cell, _ in built.values()}
        cname, cell, _ = next(iter(built.values()))
        sem = _cell_sem(cname, cell, forget_bias, cell_clip, proj_clip)
        src = {"format": "tf_checkpoint", "class_name": cname, "scope": base}
        try:
            if len(kinds) != 1 or len(found) != nl * dirs:
                raise ValueError("cells differ")
            params = [[built[(k, d)][2][0] for d in range(dirs)] for k in range(nl)]
            _, I, H, P = built[(0, 0)][2]
            raw = [{n: get(key) for n, key in found[(k, d)][1].items()} for k in range(nl) for d in range(dirs)]
            keys = [dict(found[(k, d)][1]) for k in range(nl) for d in range(dirs)]
            layer = RNNLayer(base, cell, I, H, nl, dirs == 2, P, semantics=sem, params=params,
                             source={**src, "raw": raw, "keys": keys})
        except ValueError:  # sizes do not chain: one layer per cell
            for (k, d), (cn, cl, (dp, I, H, P)) in sorted(built.items()):
                raw = [{n: get(key) for n, key in found[(k, d)][1].items()}]
                ckpt.layers.append(RNNLayer(f"{base}.cell_{k}{'.bw' if d else ''}", cl, I, H, proj_size=P,
                                            semantics=_cell_sem(cn, cl, forget_bias, cell_clip, proj_clip),
                                            params=[[dp]], source={**src, "class_name": cn, "raw": raw,
                                                                   "keys": [dict(found[(k, d)][1])]}))
            continue
        opaque = next((k for k in shapes if k == f"{base}/opaque_kernel"), None)
        if opaque:
            used_opaque.add(opaque)
            layer = _check_opaque(path, layer, get(opaque))
        ckpt.layers.append(layer)
    for key in sorted(shapes):
        if key.endswith("/opaque_kernel") and key not in used_opaque:
            ckpt.layers.append(_opaque_alone(path, key, get(key), opts))
    if not ckpt.layers:
        raise FormatError(f"{path}: no recurrent cell variables found (looked for "
                          f"{', '.join(CELL_SCOPES)} scopes and opaque_kernel)")
    return ckpt


def _check_opaque(path, companion: RNNLayer, buf: np.ndarray) -> RNNLayer:
    """Unpack an opaque buffer with the companion's spec; refuse if the two disagree."""
    spec = cudnn.Spec.of(companion)
    if buf.size != cudnn.param_count(spec):
        raise FormatError(f"{path}: opaque_kernel of '{companion.name}' has {buf.size} elements, its canonical "
                          f"variables need {cudnn.param_count(spec)}")
    lay = cudnn.unpack(buf, spec, name=companion.name, source={**companion.source, "opaque": True})
    for a, b in zip(lay.params, companion.params):
        for pa, pb in zip(a, b):
            if not (np.array_equal(pa.w_ih, pb.w_ih) and np.array_equal(pa.w_hh, pb.w_hh)):
                raise FormatError(f"{path}: opaque_kernel of '{companion.name}' disagrees with its canonical "
                                  "variables (cuDNN layout differs); read with the canonical variables only")
    return lay


def _opaque_alone(path, key: str, buf: np.ndarray, opts: dict) -> RNNLayer:
    scope = key.rsplit("/", 1)[0]
    cell = _CUDNN_SCOPES.get(scope.split("/")[-1])
    if cell is None:
        raise FormatError(f"{path}: '{key}': cannot tell the cell kind from scope '{scope}' "
                          f"(expected one of {', '.join(_CUDNN_SCOPES)})")
    cands = cudnn.candidate_specs(buf.size, cell, **{k: v for k, v in opts.items() if v is not None})
    if len(cands) != 1:
        listed = "; ".join(f"num_layers={s.num_layers} hidden_size={s.hidden_size} "
                           f"bidirectional={s.bidirectional} input_size={s.input_size}" for s in cands[:8])
        raise FormatError(f"{path}: '{key}' ({buf.size} elements) fits {len(cands)} cuDNN specs"
                          f"{': ' + listed if cands else ''}; pass --num-layers/--hidden-size/--bidirectional")
    return cudnn.unpack(buf.reshape(-1), cands[0], name=scope,
                        source={"format": "tf_checkpoint", "class_name": f"opaque {cell.value}", "opaque": True})


# Writing (a TF1 checkpoint directory): see :mod:`.tf1_writer`.
from .tf1_writer import check, target_forward, write  # noqa: E402,F401
from .tf_framework import framework_forward  # noqa: E402,F401
