"""The canonical, gate-ordered representation that every format is read into and written from.

Numpy only. Per layer and direction the parameters are, in cuDNN/PyTorch canonical form
(gate order LSTM ``i f g o``, GRU ``r z n``, see :mod:`rnnconvert.core.gates`):

======== ==================== ==========================================================
name     shape                meaning
======== ==================== ==========================================================
``w_ih`` ``(G*H, I_k)``       input-to-hidden weights, applied as ``W_ih x``
``w_hh`` ``(G*H, H or P)``    hidden-to-hidden weights (width ``P`` with a projection)
``b_ih`` ``(G*H,)``           input bias (zeros when the layer has no bias)
``b_hh`` ``(G*H,)``           recurrent bias (zeros for single-bias sources)
``w_hr`` ``(P, H)``           LSTM projection (``h = W_hr (o * tanh(c))``), or ``None``
``peep`` ``(3, H)``           LSTM peepholes ``p_i, p_f, p_o`` (TF1 ``w_*_diag``), or ``None``
======== ==================== ==========================================================

``G`` = 4 (LSTM), 3 (GRU), 1 (simple RNN); ``I_0`` = ``input_size``, ``I_k`` = ``dirs * (P or H)``
for ``k >= 1``. Arrays keep the dtype of the source (float32 normally, float16/float64 kept).

Bias rule: a single-bias source is stored as ``b_ih = bias, b_hh = 0`` (bit-exact round trips);
a single-bias target receives ``b_ih + b_hh`` (one float rounding per element).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import weight_dtypes
from ..errors import FormatError


class Cell(str, enum.Enum):
    """Recurrent cell kind. ``gates`` is the number of gate blocks ``G``."""

    LSTM = "LSTM"
    GRU = "GRU"
    RNN_TANH = "RNN_TANH"
    RNN_RELU = "RNN_RELU"

    @property
    def gates(self) -> int:
        return {"LSTM": 4, "GRU": 3}.get(self.value, 1)


#: Activation names understood by the reference implementation and the writers.
#: ``hard_sigmoid`` is the Keras 1/2 definition ``clip(0.2 x + 0.5, 0, 1)``
#: (tf_keras ``backend.hard_sigmoid``); ``hard_sigmoid_k3`` is Keras 3's ``clip(x / 6 + 0.5, 0, 1)``
#: (keras ``src/activations/activations.py``); ``linear`` is the identity.
ACTIVATIONS = ("sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "hard_sigmoid_k3", "softsign")


@dataclass(frozen=True)
class Semantics:
    """What the layer computes beyond its weights; decides which targets can express it.

    Attributes:
        gate_activation: activation of the gates (LSTM i, f, o; GRU r, z). cuDNN/PyTorch: sigmoid.
        activation: candidate and cell-output activation (LSTM g and ``act(c)``; GRU n; RNN h).
        reset_after: GRU only. ``True``: ``n = act(W_in x + b_in + r * (W_hn h + b_hn))`` (cuDNN,
            PyTorch, Keras ``reset_after=True``, ONNX ``linear_before_reset=1``). ``False``:
            ``n = act(W_in x + b_in + W_hn (r * h) + b_hn)`` (Keras ``reset_after=False``, TF1
            ``GRUCell``, ONNX ``linear_before_reset=0``).
        forget_bias: constant added to the LSTM forget-gate pre-activation at run time, never stored
            (TF1 cells). 0 for every other format.
        cell_clip: TF1 ``cell_clip``: ``c`` clipped to ``[-cell_clip, cell_clip]``; ``None`` = none.
        proj_clip: TF1 ``proj_clip`` on the projected output; ``None`` = none.
        go_backwards: a unidirectional layer that reads the sequence in reverse (Keras
            ``go_backwards=True``) and returns outputs in processing order.
        merge_mode: Keras ``Bidirectional`` merge of the two directions: ``concat`` (what
            cuDNN/PyTorch/ONNX return), ``sum``, ``mul``, ``ave`` or ``None`` (a list).
    """

    gate_activation: str = "sigmoid"
    activation: str = "tanh"
    reset_after: bool = True
    forget_bias: float = 0.0
    cell_clip: float | None = None
    proj_clip: float | None = None
    go_backwards: bool = False
    merge_mode: str | None = "concat"


def placeholder(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A read-only NaN array of ``shape``/``dtype`` holding no memory (``np.broadcast_to`` of one element).

    It stands for a tensor of a *lazy* checkpoint that is not loaded yet (see :class:`Checkpoint`):
    shape and dtype are right, so structural checks (refusals, names, offsets) work on it, while any
    use of its values gives NaN, which :func:`rnnconvert.api.check_finite` and verification reject --
    a placeholder can never be written out silently."""
    return np.broadcast_to(np.full((), np.nan, dtype=dtype), tuple(shape))


def is_placeholder(arr: Any) -> bool:
    """Whether ``arr`` is a :func:`placeholder` (every stride 0, read-only; of shape ``()``: a read-only float NaN,
    as an attention layer's scalar ``scale`` stands before it is read, issue #41)."""
    if isinstance(arr, np.ndarray) and arr.ndim == 0:
        return not arr.flags.writeable and arr.dtype.kind == "f" and bool(np.isnan(arr))
    return (isinstance(arr, np.ndarray) and arr.ndim > 0 and not arr.flags.writeable
            and all(s == 0 for s in arr.strides))


@dataclass(frozen=True)
class DirectionParams:
    """Canonical parameters of one direction of one layer (shapes in the module docstring)."""

    w_ih: np.ndarray
    w_hh: np.ndarray
    b_ih: np.ndarray
    b_hh: np.ndarray
    w_hr: np.ndarray | None = None
    peep: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The non-``None`` arrays by field name."""
        out = {"w_ih": self.w_ih, "w_hh": self.w_hh, "b_ih": self.b_ih, "b_hh": self.b_hh}
        if self.w_hr is not None:
            out["w_hr"] = self.w_hr
        if self.peep is not None:
            out["peep"] = self.peep
        return out


@dataclass(frozen=True)
class RNNLayer:
    """One recurrent layer (possibly several stacked layers and two directions, like ``nn.LSTM``).

    Attributes:
        name: the layer's name in its source (nested containers joined with ``.``).
        cell: the cell kind.
        input_size, hidden_size: ``I`` and ``H``.
        num_layers: stacked layers held by this one record (a Keras layer is 1).
        bidirectional: two directions per layer; ``params[k] = [forward, backward]``.
        proj_size: ``P`` of an LSTM projection, 0 when there is none.
        bias: whether the source has bias terms at all (``False``: the bias arrays are zeros).
        semantics: see :class:`Semantics`.
        params: ``params[layer][direction]`` -> :class:`DirectionParams`.
        return_sequences: whether the source layer returns the whole sequence (Keras) -- informative.
        source: provenance: format, class name, original tensor names; for Keras and TF1 sources
            ``source['raw']``, one mapping per direction of the file's own tensors (``kernel``, ...; the
            Keras HDF5 / TF2 readers' ``LazyRaw`` re-reads them from the file on access), which
            verification reads (``source_forward(..., raw=...)``) and never replaces.

    Frozen: fields are never reassigned (``dataclasses.replace``, :meth:`with_semantics`,
    :meth:`one_slab` make changed copies); the ``params`` lists and ``source`` dict are built by the
    reader and not changed afterwards.

    Raises:
        ValueError: on creation, when an array has the wrong shape for the declared sizes.
    """

    name: str
    cell: Cell
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    proj_size: int = 0
    bias: bool = True
    semantics: Semantics = field(default_factory=Semantics)
    params: list[list[DirectionParams]] = field(default_factory=list)
    return_sequences: bool = True
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """Width of one direction's output ``h``: ``P`` with a projection, else ``H``."""
        return self.proj_size or self.hidden_size

    @property
    def dtype(self) -> np.dtype:
        return self.params[0][0].w_ih.dtype

    def layer_input_size(self, k: int) -> int:
        return self.input_size if k == 0 else self.output_size * self.num_directions

    def validate(self) -> None:
        """Check every array's shape against the declared sizes.

        Raises:
            ValueError: naming the layer, the tensor and both shapes.
            FormatError: integer, boolean, complex or extended-float parameters (:mod:`.weight_dtypes`); an
                input or hidden size of 0.
        """
        g, h, p = self.cell.gates, self.hidden_size, self.proj_size
        if self.input_size < 1 or h < 1:  # a (0, 4H) kernel: a layer of no inputs or no units computes nothing
            raise FormatError(f"layer '{self.name}': input size {self.input_size}, hidden size {h}: an empty "
                              "layer is not a trained RNN's parameters; refused")
        if p and self.cell is not Cell.LSTM:
            raise ValueError(f"layer '{self.name}': a projection exists only for LSTM")
        if len(self.params) != self.num_layers:
            raise ValueError(f"layer '{self.name}': {len(self.params)} parameter sets for {self.num_layers} layers")
        for k, dirs in enumerate(self.params):
            if len(dirs) != self.num_directions:
                raise ValueError(f"layer '{self.name}': layer {k} has {len(dirs)} directions")
            want = {
                "w_ih": (g * h, self.layer_input_size(k)),
                "w_hh": (g * h, p or h),
                "b_ih": (g * h,),
                "b_hh": (g * h,),
                "w_hr": (p, h),
                "peep": (3, h),
            }
            for d, dp in enumerate(dirs):
                if (dp.w_hr is not None) != bool(p):
                    raise ValueError(f"layer '{self.name}': projection weights and proj_size={p} disagree")
                for key, arr in dp.arrays().items():
                    weight_dtypes.check(f"layer '{self.name}' (layer {k}, direction {d})", key, arr.dtype)
                    if tuple(arr.shape) != want[key]:
                        raise ValueError(
                            f"layer '{self.name}' (layer {k}, direction {d}): {key} has shape "
                            f"{tuple(arr.shape)}, expected {want[key]}"
                        )

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (kinds, sizes, semantics) used by ``rnnconvert inspect``."""
        s = self.semantics
        out = {
            "name": self.name,
            "cell": self.cell.value,
            "input_size": self.input_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "bidirectional": self.bidirectional,
            "proj_size": self.proj_size,
            "bias": self.bias,
            "dtype": str(self.dtype),
            "gate_activation": s.gate_activation,
            "activation": s.activation,
            "return_sequences": self.return_sequences,
            "source_class": self.source.get("class_name"),
        }
        if self.cell is Cell.GRU:
            out["reset_after"] = s.reset_after
        if self.cell is Cell.LSTM:
            out["forget_bias"] = s.forget_bias
            out["peepholes"] = self.params[0][0].peep is not None
        for key in ("cell_clip", "proj_clip"):
            if getattr(s, key) is not None:
                out[key] = getattr(s, key)
        if s.go_backwards:
            out["go_backwards"] = True
        if self.bidirectional:
            out["merge_mode"] = s.merge_mode
        return out

    def one_slab(self, k: int, dirs: list[DirectionParams] | None = None) -> RNNLayer:
        """Stacked layer ``k`` as a one-layer :class:`RNNLayer` (same name and semantics; params ``dirs``, or
        the held ones, which may be placeholders): the unit of streaming writers and verification."""
        return replace(self, input_size=self.layer_input_size(k), num_layers=1,
                       params=[self.params[k] if dirs is None else dirs])

    def with_semantics(self, **changes: Any) -> "RNNLayer":
        """A copy with some :class:`Semantics` fields replaced."""
        return replace(self, semantics=replace(self.semantics, **changes))


@runtime_checkable
class SlabSource(Protocol):
    """Where a *lazy* :class:`Checkpoint`'s recurrent parameters come from (the file, still open or mapped).

    A reader called with ``lazy=True`` builds its checkpoint with one of these as
    :attr:`Checkpoint.slabs`; the checkpoint's ``layers[i].params[k]`` are then :func:`placeholder`
    arrays (right shapes and dtypes, no memory) until a slab is read. Slab ``(i, k)`` = stacked layer
    ``k`` of ``layers[i]``, all its directions (the unit of streaming conversion and verification).
    Implementations: ``torch_pt.ZipSlabs`` (memory-mapped ``torch.save`` zip), ``keras_h5``'s HDF5
    source, ``tf_checkpoint``'s TF2 bundle source, and ``rnnconvert.api``'s checking wrapper.
    """

    def read(self, i: int, k: int) -> list[DirectionParams]:
        """Slab ``(i, k)`` read from the file: one :class:`DirectionParams` per direction, in canonical
        form (shapes and dtypes those of the placeholders). Not kept by the source: the caller holds
        the arrays while it needs them. Raises what the file's damage makes it raise (the api turns it
        into ``FormatError``)."""
        ...

    def release(self, i: int, k: int) -> None:
        """Give back what the source holds for slab ``(i, k)`` once it is written (e.g. the pages of a
        memory-mapped file); a no-op for sources holding nothing."""
        ...

    def release_array(self, a: np.ndarray) -> None:
        """Give back what the source holds for one array of a read slab (the pages of a memory-mapped
        file inside it), for a writer done with it before the rest of its slab; ``a`` stays readable
        (read again from the file). A no-op for sources holding nothing."""
        ...


@dataclass(frozen=True)
class Checkpoint:
    """Everything read from one file.

    Attributes:
        layers: recurrent layers in source order.
        tensors: other tensors carried along, keyed by their target name (Dense/Embedding already
            in PyTorch naming and orientation: ``<layer>.weight`` ``(out, in)``, ``<layer>.bias``).
        format: the format name the checkpoint was read from (see :mod:`rnnconvert.engine.registry`).
        meta: provenance (path, framework version, ...).
        slabs: ``None`` for an eagerly read checkpoint (every parameter held). For a *lazy* one
            (readers called with ``lazy=True``: streaming conversion), the :class:`SlabSource` its
            slabs are read from, one at a time (:meth:`slab`); until then ``layers[i].params[k]``
            hold :func:`placeholder` arrays. Set when the checkpoint is built, never afterwards.

    Frozen: no field is reassigned; a changed checkpoint is a new one (``dataclasses.replace``,
    :meth:`materialize`). Nothing stored in it is a callback.
    """

    layers: list[RNNLayer] = field(default_factory=list)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    format: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    slabs: SlabSource | None = None

    @property
    def lazy(self) -> bool:
        """Whether some parameters are still placeholders to be read from :attr:`slabs`."""
        return self.slabs is not None

    def slab(self, i: int, k: int) -> list[DirectionParams]:
        """The directions of stacked layer ``k`` of ``layers[i]``: read from :attr:`source` for a lazy
        checkpoint (not stored back: the caller holds them while it needs them), else the held params.

        The unit of streaming conversion: a bidirectional stacked layer's two directions. Raises
        ``ValueError`` when the loaded arrays' shapes or dtypes differ from the placeholders'."""
        held = self.layers[i].params[k]
        if self.slabs is None:
            return held
        dirs = self.slabs.read(i, k)
        if len(dirs) != len(held):
            raise ValueError(f"layer '{self.layers[i].name}' (layer {k}): {len(dirs)} directions loaded, "
                             f"{len(held)} declared")
        for d, (got, want) in enumerate(zip(dirs, held)):
            g, w = got.arrays(), want.arrays()
            if g.keys() != w.keys() or any(g[n].shape != w[n].shape or g[n].dtype != w[n].dtype for n in w):
                raise ValueError(f"layer '{self.layers[i].name}' (layer {k}, direction {d}): loaded tensors "
                                 f"differ from the declared ones")
        return dirs

    def release(self, i: int, k: int) -> None:
        """:meth:`SlabSource.release` of a lazy checkpoint's slabs; nothing for an eager one."""
        if self.slabs is not None:
            self.slabs.release(i, k)

    def release_array(self, a: np.ndarray) -> None:
        """:meth:`SlabSource.release_array` of a lazy checkpoint's slabs; nothing for an eager one."""
        if self.slabs is not None:
            self.slabs.release_array(a)

    def materialize(self) -> "Checkpoint":
        """An eager checkpoint: every slab of a lazy one read (through :meth:`slab`) into new layers;
        ``self`` unchanged. An eager checkpoint is returned as it is."""
        if self.slabs is None:
            return self
        layers = [replace(layer, params=[self.slab(i, k) for k in range(layer.num_layers)])
                  for i, layer in enumerate(self.layers)]
        return replace(self, layers=layers, slabs=None)

    def layer(self, name: str) -> RNNLayer:
        """The layer called ``name``; raises ``KeyError`` listing the names there are."""
        for lay in self.layers:
            if lay.name == name:
                return lay
        raise KeyError(f"no recurrent layer '{name}'; layers: {', '.join(l.name for l in self.layers)}")
