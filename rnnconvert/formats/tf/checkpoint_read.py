"""TensorFlow checkpoints (``<prefix>.index`` + ``<prefix>.data-*``): reader.

Two kinds, told apart by their keys (``docs/LAYOUTS.md`` §§7-9):

* **TF2 object-based** (tf.keras / tf_keras ``save_weights`` without ``.h5``, ``tf.train.Checkpoint``):
  keys ``layer_with_weights-N/[forward_layer/|backward_layer/]cell/{kernel,recurrent_kernel,bias}
  /.ATTRIBUTES/VARIABLE_VALUE`` (CuDNNLSTM/CuDNNGRU without ``cell/``). The Keras layer kind is
  decided from the shapes exactly as for weights-only HDF5 files (recurrent width ``G*H``; bias
  ``(4H,)`` LSTM, ``(8H,)`` CuDNNLSTM, ``(3H,)`` GRU reset_after=False, ``(2, 3H)`` GRU
  reset_after=True, ``(6H,)`` CuDNNGRU) by the Keras interpreter (:mod:`rnnconvert.conventions.keras_interpreter`); gate
  orders from :data:`rnnconvert.core.gates.TABLE` ``keras*`` entries. Object checkpoints carry no layer
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
  ``tf.contrib.cudnn_rnn`` ``opaque_kernel`` buffers are unpacked with :func:`rnnconvert.core.cudnn.unpack`
  (spec from the companion canonical variables, else from ``num_layers``/``hidden_size``/
  ``bidirectional`` options and the size). Slow contrib cells are refused by name.

Two readers. :class:`rnnconvert.formats.tf.bundle_read.BundleReader` (pure Python and numpy) reads every V2
bundle of plain dtypes (partitioned variables and several shards included) -- the common case -- and
TensorFlow is then not imported at all; it runs in this process, without the forked child, because no
C++ code runs: a damaged file can only raise FormatError from our own checks. A bundle it declines
(:class:`~.table_read.BundleUnsupported`: big-endian, compressed index blocks, other dtypes) is read by
TensorFlow (imported only then). TensorFlow's C++ reader aborts the whole process on some forged
``.index`` files, so that read runs in a forked child under a deadline (:func:`rnnconvert.safety.guard.isolated`),
as HDF5 reads do; for checkpoints over 64 MiB the child only opens the checkpoint and lists its variables
(where the aborts are), then this process reads the tensors. ``RNNCONVERT_TF_READER=tensorflow`` forces
the TensorFlow path (to compare the two).
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import cudnn
from ...safety import guard
from ...safety.paths import folder_of, inside
from ...speed.pool import ArrayPool
from ...errors import FormatError, require
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, placeholder
from . import bundle_read
from . import naming
from .naming import ATTR, CELL_SCOPES, CUDNN_SCOPES, OPAQUE_KERNEL, SLOTS
from .tf1_cells import read_cell, cell_semantics, cell_vars, cell_structure, getter
from .sniff import prefix_of
from .tensors import BundleTensors, CheckedGetter, bundle, tensor


def check_inside(path: str | Path, pre: str) -> None:
    """Refuse a checkpoint whose files leave its folder through symlinks or are not regular files: the
    ``.index``, every ``.data-*`` shard of ``pre`` and (a SavedModel) its ``variables/`` folder, each resolved,
    must lie inside the folder given (``path`` when it is a folder, else the prefix's own folder) and be a regular
    file (a folder for ``variables/``): :func:`rnnconvert.safety.paths.inside`, the rule of every multi-file
    source. A symlink inside the folder to another file of the folder is fine.

    Raises:
        FormatError: naming the file.
    """
    root = folder_of(path) if Path(path).is_dir() else folder_of(pre)
    folder = Path(pre).parent
    stem = Path(pre).name
    inside(root, os.path.abspath(folder), path, "folder", "dir", scope="checkpoint's folder")
    for f in folder.iterdir():
        if f.name == stem + ".index" or f.name.startswith(stem + ".data-"):
            inside(root, os.path.abspath(f), path, "file", "file", scope="checkpoint's folder")



#: TF2 object checkpoints read by the bundle reader can be read lazily (one Keras layer at a time).
LAZY = True


def read(path: str | Path, *, forget_bias: float | None = None, gate_activation: str | None = None,
         num_layers: int | None = None, hidden_size: int | None = None, bidirectional: bool | None = None,
         cell_clip: float | None = None, proj_clip: float | None = None, lazy: bool = False,
         **_: Any) -> Checkpoint:
    """Read a TF1 name-based or TF2 object-based checkpoint.

    Args:
        path: the prefix (``ckpt-1``), the ``.index`` file, or the directory with a ``checkpoint`` file.
        forget_bias: TF1 LSTM cells: override the run-time forget bias (default per cell, see module).
        gate_activation: TF2 Keras layers: ``'sigmoid'`` (default) or ``'hard_sigmoid'``.
        num_layers, hidden_size, bidirectional: spec of a cuDNN ``opaque_kernel`` without companions.
        cell_clip, proj_clip: TF1 LSTMCell clipping used at training time (not stored in checkpoints).
        lazy: a TF2 object checkpoint read by :mod:`.bundle_read` comes back as the structure with
            placeholder parameters and a slab source that reads one Keras layer's tensors when asked
            (streaming conversion, :class:`~rnnconvert.core.model.Checkpoint`); other checkpoints are read
            eagerly either way.

    Returns:
        a :class:`Checkpoint` in canonical form (dtype as stored); TF2 object checkpoints' layers named by object
        path (``layer_with_weights-0``; the format records read through :func:`.savedmodel_keras.read`, which
        names a SavedModel folder's layers by their Keras names).

    Raises:
        FormatError: unreadable checkpoint (damaged ``.index``, ``.data`` shorter than the index says or
            failing its checksums: :mod:`.bundle_read`), unexpected shapes, NaN/Inf, ambiguous opaque buffer
            size; on the TensorFlow path also its reader crashing (SIGABRT on forged ``.index`` shapes) or
            running past the deadline.
        UnsupportedError: a cell rnnconvert refuses (named, with the reason).
    """
    pre = prefix_of(path)
    if pre is None:
        raise FormatError(f"{path}: not a TensorFlow checkpoint (no .index file or 'checkpoint' file)")
    check_inside(path, pre)
    args = (path, pre, forget_bias, gate_activation, num_layers, hidden_size, bidirectional, cell_clip, proj_clip)
    rd = bundle(pre, path)
    if rd is not None:  # no TensorFlow, no child process: only our own checks run on the file
        ckpt = _interpret(rd, rd.get_variable_to_shape_map(), {"reader": "rnnconvert.tf_bundle"}, *args,
                          dtypes=rd.get_variable_to_dtype_map())
        return ckpt if lazy else ckpt.materialize()
    require("tensorflow", "tensorflow")  # imported before the fork: the child does not import it again
    index = Path(pre + ".index")
    stem = index.name[: -len(".index")] + ".data-"
    size = sum(f.stat().st_size for f in index.parent.iterdir() if f.name.startswith(stem) and f.is_file())
    if size <= FULL_ISOLATION_MAX:
        return guard.isolated(_read_prefix, args, index, "TensorFlow checkpoint")
    guard.isolated(_probe_prefix, (path, pre), index, "TensorFlow checkpoint")  # large: metadata in the child
    return _read_prefix(*args)



#: Checkpoints whose ``.data`` files hold up to this many bytes are read wholly in the isolated child.
FULL_ISOLATION_MAX = 64 << 20


def _open(path, pre: str):
    """``tf.train.load_checkpoint(pre)`` and its variable-to-shape map; TF errors become FormatError.

    TensorFlow's C++ reader aborts the process (a failed ``CHECK``: SIGABRT) on an ``.index`` whose
    entries declare negative or overflowing shapes (``tests/data/bad/tfck_index_*``), which is why
    :func:`read` runs this in a child process (:mod:`rnnconvert.safety.guard`)."""
    import tensorflow as tf

    try:
        rd = tf.train.load_checkpoint(pre)
        return rd, rd.get_variable_to_shape_map(), rd.get_variable_to_dtype_map()
    except Exception as exc:  # tf raises several kinds
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise FormatError(f"{path}: cannot read TensorFlow checkpoint ({type(exc).__name__}: {first})") from exc


def _probe_prefix(path, pre: str) -> None:
    """Open the checkpoint and list its variables, shapes and dtypes (runs in the isolated child)."""
    _open(path, pre)


def _read_prefix(path, pre, forget_bias, gate_activation, num_layers, hidden_size, bidirectional,
                 cell_clip, proj_clip) -> Checkpoint:
    """The TensorFlow path of :func:`read` (runs in the isolated child for all but large checkpoints)."""
    import tensorflow as tf

    rd, shapes, _ = _open(path, pre)
    return _interpret(rd, shapes, {"reader": "tensorflow", "tensorflow": tf.__version__}, path, pre, forget_bias,
                      gate_activation, num_layers, hidden_size, bidirectional, cell_clip, proj_clip)


def _interpret(rd, shapes, info, path, pre, forget_bias, gate_activation, num_layers, hidden_size, bidirectional,
               cell_clip, proj_clip, dtypes=None) -> Checkpoint:
    """Layers from a reader with ``get_tensor(key)`` (either reader) and its variable-to-shape map. With
    ``dtypes`` (numpy dtypes by key: the bundle reader) a TF2 object checkpoint's recurrent tensors are
    placeholders and the checkpoint gets a slab source (:class:`KerasBundleSlabs`, :func:`_read_tf2`)."""
    get = CheckedGetter(rd, path)

    meta = {"path": str(path), "prefix": pre, **info}
    if any(k.endswith(ATTR) for k in shapes):
        names = {k: k[: -len(ATTR)] for k in shapes if k.endswith(ATTR) and "/.OPTIMIZER_SLOT/" not in k}
        slots = sum(k.endswith(ATTR) and ("/.OPTIMIZER_SLOT/" in k or k.startswith("optimizer/")) for k in shapes)
        if slots:  # the training state (TF 2.11+ optimizers under optimizer/, older ones as slots): said, not lost
            meta["notes"] = [f"{slots} optimizer tensor(s) (the training state: step count, Adam's m and v, ...) "
                             "are not carried: the output holds the model's weights only"]
        if any(not n.startswith("layer") for n in names.values()) and "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes:
            paths = object_paths(tensor(rd, "_CHECKPOINTABLE_OBJECT_GRAPH", path, raw=True), path)
            names = {k: (n if n.startswith("layer") else paths.get(k, n)) for k, n in names.items()}
        meta_of = None if dtypes is None else (lambda key: placeholder(shapes[key], dtypes[key]))
        return _read_tf2(path, names, get, gate_activation, meta, meta_of, getattr(rd, "rows", None))
    return read_tf1(path, shapes, get, meta, forget_bias=forget_bias, opts=dict(
        num_layers=num_layers, hidden_size=hidden_size, bidirectional=bidirectional),
        cell_clip=cell_clip, proj_clip=proj_clip)



# ------------------------------------------------------------------------------------------------
# TF2 object-based
# ------------------------------------------------------------------------------------------------

def natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def object_paths(blob: bytes, where="") -> dict[str, str]:
    """Checkpoint key -> the shortest ``layer_with_weights-N/...`` object path reaching it, from the
    serialized ``TrackableObjectGraph`` (SavedModel ``variables/`` keys are ``variables/<k>/...``; LAYOUTS §7)."""
    nodes = bundle_read.object_graph(blob, where)  # our own protobuf decoding: no TensorFlow needed
    best: dict[str, str] = {}
    seen, queue = {0}, [(0, "")] if nodes else []
    while queue:
        i, path = queue.pop(0)
        children, attributes = nodes[i]
        for name, _, key in attributes:
            if name == naming.VARIABLE_VALUE and path.startswith(naming.LAYER_WITH_WEIGHTS):
                if key not in best or len(path) < len(best[key]):
                    best[key] = path
        for node_id, local in children:
            if node_id not in seen and 0 <= node_id < len(nodes) and not local.startswith(
                    ("keras_api", "variables", "trainable_", "non_trainable_", "signatures")):
                seen.add(node_id)
                queue.append((node_id, f"{path}/{local}" if path else local))
    return best


def _read_tf2(path, names: dict[str, str], get, gate_activation, meta, meta_of=None, rows_of=None) -> Checkpoint:
    """``names``: checkpoint key -> object path (``layer_with_weights-N/...``). With ``meta_of(key)`` (a
    placeholder of the variable's shape and dtype) the Keras interpreter (:mod:`rnnconvert.conventions.keras_interpreter`) builds the
    structure from placeholders, and ``ckpt.slabs`` (:class:`KerasBundleSlabs`) reads layer ``i``'s tensors (``rows_of(key)``:
    kernels as row-block sources, :class:`.bundle_read.RowSource`, turned block by block as HDF5 datasets
    are; else ``get``) and converts them as the eager reader does (``interpreter.convert_direction``); other tensors
    (Dense) are read now."""
    from ...conventions.keras_interpreter import LayerEntry, Interpreter

    by_path = {n: k for k, n in names.items()}
    keys = sorted(n for n in by_path if n.split("/")[0].startswith("layer"))
    rank = {"kernel": 0, "recurrent_kernel": 1, "bias": 2}
    groups: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        groups[k.split("/")[0]].append(k)
    # the Keras tensors are re-read for verification (through lazy_get), not kept beside the canonical copy
    kr = Interpreter(str(path), "2.4.0", gate_activation, BundleTensors(str(path)))
    # "2.4.0" only selects the TF2 Keras defaults (sigmoid gates, reset_after); the file names no Keras version
    kr.ckpt.meta.pop("keras_version", None)
    kr.ckpt = replace(kr.ckpt, format="tf_checkpoint")
    kr.ckpt.meta.update(meta, kind="tf2_object")
    for top in sorted(groups, key=natural_key):
        names = sorted(groups[top], key=lambda k: (
            0 if "/forward_layer/" in k else 1 if "/backward_layer/" in k else 0,
            natural_key(k.rsplit("/", 1)[0]), rank.get(k.rsplit("/", 1)[-1], 3)))
        rel = [k.split("/", 1)[1] if "/" in k else k for k in names]
        read = meta_of or get
        kr.entry(LayerEntry(top, rel, [read(by_path[k]) for k in names], locations=[by_path[k] for k in names]), "")
    if not kr.ckpt.layers:
        raise FormatError(f"{path}: TF2 object checkpoint without a recurrent layer (LSTM, GRU, SimpleRNN, "
                          "CuDNNLSTM, CuDNNGRU)")
    for lay in kr.ckpt.layers:
        lay.source["format"] = "tf_checkpoint"
    if meta_of is not None:
        return replace(kr.ckpt, slabs=KerasBundleSlabs(str(path), kr.layer_specs(), rows_of or get))
    return kr.ckpt


class KerasBundleSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a lazily read TF2 object checkpoint of Keras layers:
    slab ``(i, 0)`` = layer ``i``'s directions, each tensor read by ``read(key)`` (kernels as row-block
    sources, :class:`.bundle_read.RowSource`) and converted as the eager reader does
    (``interpreter.convert_direction``, from the interpreter's ``specs[i]``) into arrays of released slabs
    nothing holds any more (:class:`~rnnconvert.speed.pool.ArrayPool`); ``release_array`` does nothing."""

    def __init__(self, path: str, specs: list, read) -> None:
        self.path, self.specs, self.get = path, specs, read
        self.pool = ArrayPool()

    def read(self, i: int, k: int) -> list[DirectionParams]:
        from ...conventions.keras_interpreter import convert_direction

        if k != 0:
            raise IndexError(f"a Keras layer holds one stacked layer, not {k + 1}")
        return [convert_direction(spec, {key: self.get(loc) for key, loc in srcs.items()},
                                  f"{self.path}: {srcs.get('kernel')}", functools.partial(self.pool.take, (i, k)))
                for spec, srcs in self.specs[i]]

    def release(self, i: int, k: int) -> None:
        self.pool.give_back((i, k))  # the slab's arrays nothing holds any more go to the next slab

    def release_array(self, a: np.ndarray) -> None:
        pass



# ------------------------------------------------------------------------------------------------
# TF1 name-based
# ------------------------------------------------------------------------------------------------


def read_tf1(path, shapes, get, meta, *, forget_bias, opts, cell_clip, proj_clip) -> Checkpoint:
    ckpt = Checkpoint(format="tf_checkpoint", meta={**meta, "kind": "tf1_name"})
    cells = cell_vars(shapes)
    get = getter(get)  # sharded variables: part_N keys concatenated along axis 0
    # group cells into layers: base scope -> {(k, d): (cellname, vars)}
    layers: dict[str, dict[tuple[int, int], tuple[str, dict]]] = defaultdict(dict)
    for (prefix, cname), v in cells.items():
        base, k, d = cell_structure(prefix, cname)
        layers[base][(k, d)] = (cname, v)
    used_opaque = set()
    for base in sorted(layers, key=natural_key):
        found = layers[base]
        dirs = 2 if any(d for _, d in found) else 1
        nl = 1 + max(k for k, _ in found)
        built = {}
        for (k, d), (cname, v) in found.items():
            built[(k, d)] = (cname, *read_cell(cname, v, get, f"{base}/cell_{k}/{'bw' if d else 'fw'}"))
        kinds = {(c, cell) for c, cell, _ in built.values()}
        cname, cell, _ = next(iter(built.values()))
        sem = cell_semantics(cname, cell, forget_bias, cell_clip, proj_clip)
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
                                            semantics=cell_semantics(cn, cl, forget_bias, cell_clip, proj_clip),
                                            params=[[dp]], source={**src, "class_name": cn, "raw": raw,
                                                                   "keys": [dict(found[(k, d)][1])]}))
            continue
        opaque = next((k for k in shapes if k == f"{base}/{OPAQUE_KERNEL}"), None)
        if opaque:
            used_opaque.add(opaque)
            layer = _check_opaque(path, layer, get(opaque), CUDNN_SCOPES.get(base.split("/")[-1]))
            wrong = {k: v for k, v in opts.items() if v is not None and getattr(layer, k) != v}
            lone = [k for k in shapes if k.endswith("/" + OPAQUE_KERNEL) and k[: -len("/" + OPAQUE_KERNEL)] not in layers]
            if wrong and not lone:  # the spec options are for lone buffers; here the companions decide
                raise FormatError(f"{path}: {', '.join(f'{k}={v}' for k, v in wrong.items())} given, but the canonical "
                                  f"variables of '{base}' say " + ", ".join(f"{k}={getattr(layer, k)}" for k in wrong))
            _opaque_slots(ckpt, shapes, get, opaque, layer)
        ckpt.layers.append(layer)
    for key in sorted(shapes):
        if key.endswith("/" + OPAQUE_KERNEL) and key not in used_opaque:
            ckpt.layers.append(_opaque_alone(path, key, get(key), opts))
            _opaque_slots(ckpt, shapes, get, key, ckpt.layers[-1])
    if not ckpt.layers:
        from types import SimpleNamespace

        from ...core import names  # the variables listed for `inspect` (UnrecognisedError); dtypes not known here

        raise names.unrecognised(f"{path}: no recurrent cell variables found (looked for "
                                 f"{', '.join(CELL_SCOPES)} scopes and opaque_kernel)",
                                 {k: SimpleNamespace(shape=tuple(v), dtype=None) for k, v in shapes.items()},
                                 suggest=False)  # the TF readers take no map
    return ckpt


def _opaque_slots(ckpt: Checkpoint, shapes, get, opaque: str, layer: RNNLayer) -> None:
    """Optimizer slots of an ``opaque_kernel`` (same layout as the kernel) carried as tensors named
    ``<layer>.<torch parameter>.<slot>`` (e.g. ``cudnn_lstm.weight_ih_l0.adam_m``), canonical orientation."""
    spec = cudnn.Spec.of(layer)
    for suffix, slot in SLOTS.items():
        key = f"{opaque}/{suffix}"
        if key not in shapes:
            continue
        s = cudnn.unpack(np.asarray(get(key)).reshape(-1), spec, name=layer.name)
        for k, dirs in enumerate(s.params):
            for d, p in enumerate(dirs):
                sfx = f"_l{k}{'_reverse' if d else ''}"
                for field, torch_name in (("w_ih", "weight_ih"), ("w_hh", "weight_hh"), ("b_ih", "bias_ih"),
                                          ("b_hh", "bias_hh"), ("w_hr", "weight_hr")):
                    arr = getattr(p, field)
                    if arr is not None:
                        ckpt.tensors[f"{layer.name}.{torch_name}{sfx}.{slot}"] = arr


def _check_opaque(path, companion: RNNLayer, buf: np.ndarray, scope_cell: Cell | None = None) -> RNNLayer:
    """Unpack an opaque buffer with the companion's spec; refuse if the two disagree.

    The companions are what TF's saveable wrote from the same buffer (LAYOUTS §9.3): the matrices must be
    equal bit for bit, and the bias sums ``b_ih + b_hh`` of every gate too (the LSTM and RNN saveables store
    ``b_W + b_R``; the GRU one the r/z sums and the two n biases). The cell kind comes from the companions;
    ``basic_rnn_cell`` companions (saved alike by CudnnRNNTanh and CudnnRNNRelu) take tanh or relu from the
    layer scope (``cudnn_rnn_tanh``/``cudnn_rnn_relu``), ``scope_cell``.
    """
    cell = companion.cell
    if companion.source.get("class_name") == "basic_rnn_cell":
        if scope_cell not in (Cell.RNN_TANH, Cell.RNN_RELU):
            raise FormatError(f"{path}: '{companion.name}/opaque_kernel' sits beside basic_rnn_cell variables, which "
                              "CudnnRNNTanh and CudnnRNNRelu save alike, and the scope does not say which (expected "
                              "it to end in cudnn_rnn_tanh or cudnn_rnn_relu)")
        cell = scope_cell
    elif scope_cell is not None and scope_cell is not cell:
        raise FormatError(f"{path}: opaque_kernel of '{companion.name}' is in a {scope_cell.value} scope but its "
                          f"canonical variables are {cell.value}")
    spec = replace(cudnn.Spec.of(companion), cell=cell)
    if buf.size != cudnn.param_count(spec):
        raise FormatError(f"{path}: opaque_kernel of '{companion.name}' has {buf.size} elements, its canonical "
                          f"variables need {cudnn.param_count(spec)}")
    lay = cudnn.unpack(np.asarray(buf).reshape(-1), spec, name=companion.name,
                       source={**companion.source, "opaque": True})
    for k, (a, b) in enumerate(zip(lay.params, companion.params)):
        for d, (pa, pb) in enumerate(zip(a, b)):
            same = np.array_equal(pa.w_ih, pb.w_ih) and np.array_equal(pa.w_hh, pb.w_hh) and \
                np.array_equal(pa.b_ih + pa.b_hh, pb.b_ih + pb.b_hh)
            if not same:
                raise FormatError(f"{path}: opaque_kernel of '{companion.name}' disagrees with its canonical "
                                  f"variables (layer {k}, {'backward' if d else 'forward'} direction); read with the "
                                  "canonical variables only")
    return lay


def _opaque_alone(path, key: str, buf: np.ndarray, opts: dict) -> RNNLayer:
    scope = key.rsplit("/", 1)[0]
    cell = CUDNN_SCOPES.get(scope.split("/")[-1])
    if cell is None:
        raise FormatError(f"{path}: '{key}': cannot tell the cell kind from scope '{scope}' "
                          f"(expected one of {', '.join(CUDNN_SCOPES)})")
    cands = cudnn.candidate_specs(buf.size, cell, **{k: v for k, v in opts.items() if v is not None})
    if len(cands) != 1:
        listed = "; ".join(f"num_layers={s.num_layers} hidden_size={s.hidden_size} "
                           f"bidirectional={s.bidirectional} input_size={s.input_size}" for s in cands[:8])
        what = (f"{path}: '{key}' ({buf.size} elements) fits {len(cands)} cuDNN specs"
                f"{': ' + listed if cands else ''}; give ")
        raise FormatError(what + "the read options num_layers, hidden_size, bidirectional",
                          cli=what + "--read-opt num_layers=N, hidden_size=N, bidirectional=true|false")
    return cudnn.unpack(buf.reshape(-1), cands[0], name=scope,
                        source={"format": "tf_checkpoint", "class_name": f"opaque {cell.value}", "opaque": True})
