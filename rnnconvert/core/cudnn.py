"""The cuDNN parameter buffer ("opaque params", "weight space"): its layout, pack and unpack.

Numpy only. Everything here follows from ONE pure function, :func:`layout`, which turns a
:class:`Spec` into the list of :class:`Region` records of the buffer; :func:`pack` and
:func:`unpack` use nothing else.

The layout, and how sure we are of each part (details and sources: ``docs/cudnn-layout.md``):

* linLayerID meaning [documented: cuDNN ``cudnnGetRNNLinLayerMatrixParams`` doc, LAYOUTS §11.1]:
  LSTM 0-3 = W_i, W_f, W_g, W_o applied to the layer input, 4-7 = R_i, R_f, R_g, R_o applied to
  the recurrent input, 8 = projection matrix (``proj_size > 0``); GRU 0-2 = W_r, W_z, W_n,
  3-5 = R_r, R_z, R_n; RNN_TANH/RNN_RELU 0 = W, 1 = R. Every id except 8 has a bias
  (``b_ih`` for input ids, ``b_hh`` for recurrent ids); the buffer always holds two bias sets
  (``CUDNN_RNN_DOUBLE_BIAS``, what PyTorch and TF use; LAYOUTS §10).
* Element order inside a matrix region: row-major ``(H, in)`` (``W x`` orientation); the projection
  region is ``(P, H)`` [five code bases, LAYOUTS §11.4; and the oracles below, bit for bit].
* Where the regions sit [third-party oracles in the test suite, ``tests/formats/cudnn_buffers/test_cudnn_oracles.py``]:
  first the matrices of every pseudo-layer ``p = layer * dirs + direction`` (forward before backward) in
  turn -- input ids ``0..G-1``, recurrent ids ``G..2G-1``, then the projection (id 8) -- and after the
  matrices of ALL pseudo-layers the biases of every pseudo-layer in turn, ids ``0..2G-1``; no padding.
  Oracles: JAX ``jax.experimental.rnn`` (``unpack_lstm_weights``/``lstm_ref``, LSTM, 1-3 layers, uni- and
  bidirectional) and MXNet 1.9.1's fused ``RNN`` operator on CPU (LSTM, GRU, RNN_TANH, RNN_RELU, 1-3
  layers, uni-/bidirectional, LSTM projection with 1-3 layers): :func:`pack` equals their buffers and
  :func:`unpack` their own unpacking, bit for bit. Both hand the same buffer unchanged to cuDNN on a GPU
  and test it there against host code (JAX ``tests/experimental_rnn_test.py`` ``test_lstm``: cuDNN vs
  ``lstm_ref``, 1 and 4 layers, uni-/bidirectional; MXNet ``tests/python/gpu/test_gluon_gpu.py``
  ``test_layer_bidirectional[_proj]``: fused cuDNN layer vs unfused cells): strongly supported, not
  measured on a GPU here. The projection position rests on MXNet alone (cuDNN v7 API,
  ``cudnnSetRNNProjectionLayers``; its GPU test has one bidirectional layer, so with more than one layer
  it is MXNet's code, CPU operator included, not a GPU measurement). Single pseudo-layer: also
  tf_keras' ``canonical_to_params`` (``tests/formats/cudnn_buffers/test_cudnn.py``). Where a GPU is present,
  :func:`rnnconvert.verify.cudnn_layout.check_layout` compares :func:`layout` with the offsets cuDNN reports.
* Until ``.cudnn.npz`` spec version 2, rnnconvert stored each pseudo-layer as one block (its matrices,
  then its biases): :func:`layout_v1`, kept only to read version-1 files (:func:`from_layout_v1`).

Gate order of the blocks is the canonical one (LSTM i f g o, GRU r z n): the ``"cudnn"`` entries
of :data:`rnnconvert.core.gates.TABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from . import gates
from ..errors import FormatError, UnsupportedError
from .model import Cell, DirectionParams, RNNLayer, Semantics
from .transforms import fold_forget_bias

#: linLayerID of the LSTM recurrent projection matrix (cuDNN ``cudnnSetRNNProjectionLayers``).
PROJECTION_ID = 8


@dataclass(frozen=True)
class Spec:
    """What decides the buffer layout.

    Attributes:
        cell: :class:`~rnnconvert.core.model.Cell` (LSTM, GRU, RNN_TANH, RNN_RELU).
        input_size, hidden_size: ``I`` and ``H``.
        num_layers: stacked physical layers.
        bidirectional: two directions per layer.
        proj_size: LSTM projection width ``P`` (0 = none).
    """

    cell: Cell
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    proj_size: int = 0

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1

    def layer_input_size(self, k: int) -> int:
        return self.input_size if k == 0 else (self.proj_size or self.hidden_size) * self.dirs

    @classmethod
    def of(cls, layer: RNNLayer) -> "Spec":
        """The spec of a canonical layer."""
        return cls(layer.cell, layer.input_size, layer.hidden_size, layer.num_layers, layer.bidirectional,
                   layer.proj_size)


@dataclass(frozen=True)
class Region:
    """One region of the buffer.

    Attributes:
        pseudo_layer: ``layer * dirs + direction``.
        linear_layer_id: cuDNN linLayerID (see module docstring).
        kind: ``'matrix'`` or ``'bias'``.
        offset: start, in elements (not bytes) from the start of the buffer.
        shape: ``(rows, cols)`` for a matrix (row-major), ``(H,)`` for a bias.
    """

    pseudo_layer: int
    linear_layer_id: int
    kind: str
    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def _check(spec: Spec) -> tuple[Cell, int, int]:
    cell, H, P = Cell(spec.cell), spec.hidden_size, spec.proj_size
    if min(spec.input_size, H, spec.num_layers) < 1 or P < 0:
        raise ValueError(f"invalid cuDNN spec {spec}")
    if P and (cell is not Cell.LSTM or P >= H):
        raise ValueError(f"proj_size={P} needs an LSTM with proj_size < hidden_size ({spec})")
    return cell, H, P


def _matrices(spec: Spec, p: int) -> list[tuple[int, tuple[int, int]]]:
    """``(linLayerID, shape)`` of the matrices of pseudo-layer ``p``, in buffer order."""
    cell, H, P = Cell(spec.cell), spec.hidden_size, spec.proj_size
    G, k = cell.gates, p // spec.dirs
    out = [(lid, (H, spec.layer_input_size(k))) for lid in range(G)]
    out += [(lid, (H, P or H)) for lid in range(G, 2 * G)]
    if P:
        out.append((PROJECTION_ID, (P, H)))
    return out


def layout(spec: Spec) -> list[Region]:
    """The regions of the cuDNN buffer of ``spec``, in buffer order (a pure function).

    First the matrices of every pseudo-layer ``p = layer * dirs + direction`` in turn: ids ``0 .. G-1``
    (``(H, in_k)``, applied to the layer input), ids ``G .. 2G-1`` (``(H, P or H)``, recurrent), then the
    projection ``(P, H)`` (id 8, LSTM with ``proj_size``); after the matrices of ALL pseudo-layers, the
    biases ``(H,)`` of every pseudo-layer in turn, ids ``0 .. 2G-1``. No padding. Sources and strength
    of each part: module docstring and ``docs/cudnn-layout.md``.

    Raises:
        ValueError: non-positive sizes, or a projection on a non-LSTM cell / ``proj_size >= hidden_size``.
    """
    cell, H, _ = _check(spec)
    G, n = cell.gates, spec.num_layers * spec.dirs
    regions: list[Region] = []
    off = 0
    for p in range(n):
        for lid, shp in _matrices(spec, p):
            regions.append(Region(p, lid, "matrix", off, shp))
            off += shp[0] * shp[1]
    for p in range(n):
        for lid in range(2 * G):
            regions.append(Region(p, lid, "bias", off, (H,)))
            off += H
    return regions


def layout_v1(spec: Spec) -> list[Region]:
    """The WRONG layout rnnconvert used before ``.cudnn.npz`` spec version 2: each pseudo-layer in
    turn as one block, its matrices then its biases. Kept only to read version-1 ``.cudnn.npz`` files
    written with it (:func:`from_layout_v1`); it equals :func:`layout` for one pseudo-layer."""
    cell, H, _ = _check(spec)
    regions: list[Region] = []
    off = 0
    for p in range(spec.num_layers * spec.dirs):
        for lid, shp in _matrices(spec, p):
            regions.append(Region(p, lid, "matrix", off, shp))
            off += shp[0] * shp[1]
        for lid in range(2 * cell.gates):
            regions.append(Region(p, lid, "bias", off, (H,)))
            off += H
    return regions


def from_layout_v1(buffer: np.ndarray, spec: Spec) -> np.ndarray:
    """A buffer written in :func:`layout_v1` moved into :func:`layout` (a permutation, bit-exact).

    Raises:
        FormatError: the buffer is not 1-D or has the wrong number of elements.
    """
    buf = np.asarray(buffer)
    n = param_count(spec)
    if buf.ndim != 1 or buf.size != n:
        raise FormatError(f"cuDNN buffer of shape {buf.shape}; {spec} needs ({n},)")
    where = {(r.pseudo_layer, r.kind, r.linear_layer_id): r for r in layout_v1(spec)}
    out = np.empty_like(buf)
    for r in layout(spec):
        old = where[(r.pseudo_layer, r.kind, r.linear_layer_id)]
        out[r.offset:r.offset + r.size] = buf[old.offset:old.offset + old.size]
    return out


def param_count(spec: Spec) -> int:
    """Number of elements of the buffer of ``spec``."""
    last = layout(spec)[-1]
    return last.offset + last.size


def refusals(layer: RNNLayer) -> list[str]:
    """What the cuDNN equations (LAYOUTS.md §10) cannot compute about ``layer``; empty when they can.

    ``torch.nn.LSTM/GRU/RNN`` compute the same equations (on the CPU too), so the PyTorch-family
    writers refuse through this one list as well."""
    s, why = layer.semantics, []
    want_act = "relu" if layer.cell is Cell.RNN_RELU else "tanh"
    if layer.cell in (Cell.LSTM, Cell.GRU) and s.gate_activation != "sigmoid":
        why.append(f"recurrent_activation={s.gate_activation} (cuDNN/torch gates are sigmoid only)")
    if s.activation != want_act:
        why.append(f"activation={s.activation} (cuDNN/torch {layer.cell.value} uses {want_act})")
    if layer.cell is Cell.GRU and not s.reset_after:
        why.append("reset_after=False (cuDNN/torch GRU applies the reset gate after the recurrent matmul)")
    if any(p.peep is not None for dirs in layer.params for p in dirs):
        why.append("peephole connections")
    if s.cell_clip is not None or s.proj_clip is not None:
        why.append("TF1 cell_clip/proj_clip")
    if s.go_backwards and not layer.bidirectional:
        why.append("go_backwards=True (reverse the sequence yourself and convert the layer without it)")
    return why


def pack(layer: RNNLayer) -> np.ndarray:
    """The 1-D cuDNN buffer of ``layer`` (dtype of the layer), laid out by :func:`layout`.

    A run-time ``forget_bias`` is folded into ``b_ih`` of the forget gate first (one rounding);
    everything else is a bit-exact copy. (The ``cudnn_npz`` writer gets layers the engine already folded
    -- ``FormatSpec.forget_bias`` -- and this fold is then a no-op; it stays because a cuDNN buffer has no
    run-time forget_bias, so ``pack`` must mean the same function for any canonical layer, e.g. a TF1
    ``LSTMCell`` read back with ``forget_bias=1.0`` by ``verify --device cuda``, :mod:`rnnconvert.speed.gpu`.) ``bias=False`` layers give zero bias regions (as PyTorch does).

    Raises:
        UnsupportedError: the layer computes something cuDNN cannot (peepholes, clipping, other
            activations, GRU reset-before, lone ``go_backwards``), naming the layer and the feature.
    """
    why = refusals(layer)
    if why:
        raise UnsupportedError(f"layer '{layer.name}' cannot be packed into a cuDNN buffer: {'; '.join(why)}. "
                               "Convert to .onnx instead")
    layer = fold_forget_bias(layer)
    spec = Spec.of(layer)
    conv = gates.convention("cudnn", layer.cell)
    G, H = layer.cell.gates, layer.hidden_size
    out = np.zeros(param_count(spec), dtype=layer.dtype)
    turned: dict = {}  # each matrix and bias in cuDNN's gate order, made once for its G regions
    for r in layout(spec):
        k, d = divmod(r.pseudo_layer, spec.dirs)
        p = layer.params[k][d]
        out[r.offset:r.offset + r.size] = _source(p, conv, layer.cell, r, G, H, turned, (k, d)).reshape(-1)
    return out


def _source(p: DirectionParams, conv: gates.Convention, cell: Cell, r: Region, G: int, H: int,
            turned: dict | None = None, where: tuple = ()) -> np.ndarray:
    """The canonical array slice that region ``r`` holds (``turned``: the whole arrays already put in cuDNN's
    gate order, by ``(where, kind, matrix)``, filled as they are made)."""
    if r.linear_layer_id == PROJECTION_ID and r.kind == "matrix" and cell is Cell.LSTM:
        return p.w_hr
    key = (where, r.kind, r.linear_layer_id // G)
    full = None if turned is None else turned.get(key)
    if full is None:
        src = {("matrix", 0): p.w_ih, ("matrix", 1): p.w_hh, ("bias", 0): p.b_ih, ("bias", 1): p.b_hh}
        full = gates.from_canonical(src[(r.kind, r.linear_layer_id // G)], conv, cell) if r.kind == "matrix" \
            else gates.vec_from_canonical(src[(r.kind, r.linear_layer_id // G)], conv, cell)
        if turned is not None:
            turned.clear()  # one array at a time: the regions of an array are consecutive in layout()
            turned[key] = full
    j = r.linear_layer_id % G
    return full[j * H:(j + 1) * H]


def unpack(buffer: np.ndarray, spec: Spec, *, name: str = "cudnn", bias: bool = True,
           semantics: Semantics | None = None, source: dict | None = None) -> RNNLayer:
    """Read a 1-D cuDNN buffer laid out by :func:`layout` back into a canonical :class:`RNNLayer`.

    Args:
        buffer: 1-D array of exactly :func:`param_count` elements (any float dtype, kept).
        spec: the layout's :class:`Spec`.
        name, bias, semantics, source: copied into the layer (semantics default: cuDNN's,
            with ``activation='relu'`` for RNN_RELU).

    Bit-exact (copies only). Raises:
        FormatError: the buffer is not 1-D or its length differs from the spec's, giving both.
    """
    buf = np.asarray(buffer)
    if buf.ndim != 1:
        raise FormatError(f"cuDNN buffer '{name}' must be 1-D, got shape {buf.shape}")
    n = param_count(spec)
    if buf.size != n:
        raise FormatError(f"cuDNN buffer '{name}' has {buf.size} elements; {spec} needs {n}")
    cell = Cell(spec.cell)
    conv = gates.convention("cudnn", cell)
    G = cell.gates
    parts: dict[tuple[int, str, int], np.ndarray] = {}
    for r in layout(spec):
        parts[(r.pseudo_layer, r.kind, r.linear_layer_id)] = buf[r.offset:r.offset + r.size].reshape(r.shape)
    params = []
    for k in range(spec.num_layers):
        row = []
        for d in range(spec.dirs):
            pl = k * spec.dirs + d

            def cat(kind: str, ids: Iterable[int]) -> np.ndarray:
                return np.concatenate([parts[(pl, kind, i)] for i in ids], axis=0)

            row.append(DirectionParams(
                w_ih=gates.to_canonical(cat("matrix", range(G)), conv, cell),
                w_hh=gates.to_canonical(cat("matrix", range(G, 2 * G)), conv, cell),
                b_ih=gates.vec_to_canonical(cat("bias", range(G)), conv, cell),
                b_hh=gates.vec_to_canonical(cat("bias", range(G, 2 * G)), conv, cell),
                w_hr=parts[(pl, "matrix", PROJECTION_ID)].copy() if spec.proj_size else None,
            ))
        params.append(row)
    sem = semantics or Semantics(activation="relu" if cell is Cell.RNN_RELU else "tanh")
    return RNNLayer(name=name, cell=cell, input_size=spec.input_size, hidden_size=spec.hidden_size,
                    num_layers=spec.num_layers, bidirectional=spec.bidirectional, proj_size=spec.proj_size,
                    bias=bias, semantics=sem, params=params, source=dict(source or {"format": "cudnn"}))


def candidate_specs(size: int, cell: Cell, *, input_size: int | None = None, hidden_size: int | None = None,
                    num_layers: int | None = None, bidirectional: bool | None = None,
                    max_layers: int = 8, max_hidden: int = 8192, max_input: int = 1 << 16) -> list[Spec]:
    """Every spec without projection whose buffer has ``size`` elements, given what is known.

    Unknown sizes are searched (hidden up to ``max_hidden``, layers up to ``max_layers``); ``input_size``
    is solved from the size. Used to read ``opaque_kernel`` variables whose spec is not recorded.
    """
    cell = Cell(cell)
    G = cell.gates
    out = []
    hs = [hidden_size] if hidden_size else range(1, max_hidden + 1)
    ls = [num_layers] if num_layers else range(1, max_layers + 1)
    bs = [bidirectional] if bidirectional is not None else [False, True]
    for H in hs:
        for L in ls:
            for bi in bs:
                dirs = 2 if bi else 1
                # per pseudo-layer: G*H*(in + H) + 2*G*H; layers >= 1 have in = dirs*H
                rest = (L - 1) * dirs * (G * H * (dirs * H + H) + 2 * G * H)
                first = size - rest
                if first <= 0 or first % dirs:
                    continue
                per = first // dirs - G * H * H - 2 * G * H
                if per <= 0 or per % (G * H):
                    continue
                I = per // (G * H)
                if (input_size and I != input_size) or I > max_input:
                    continue
                spec = Spec(cell, I, H, L, bi)
                if param_count(spec) == size:
                    out.append(spec)
    return out
