"""The catalogue of known hand-conversion slips, one tensor or one field at a time (used by
:mod:`rnnconvert.verify.diagnose`).

Every slip is stated against the *canonical* layers both files are read into (:mod:`rnnconvert.core.model`:
``W_ih (G*H, I)``, ``W_hh (G*H, H)``, ``b_ih``, ``b_hh`` ``(G*H,)``, gates LSTM ``i f g o``, GRU ``r z n``,
:data:`rnnconvert.core.gates.CANONICAL`): what the source's tensor becomes in the slipped file.

==================== ======================================================================================
kind                 what DST holds (``E``: the source's canonical tensor, a TF1 forget bias folded)
==================== ======================================================================================
``gate_order``       ``E``'s gate blocks in another order (``from``: the order DST's blocks hold, ``to``: canonical)
``reshaped``         ``K.reshape(G*H, in)`` of the ``(in, G*H)`` kernel ``K = E.T`` (a Keras/TF kernel reshaped,
                     not transposed)
``blocks_transposed``  every gate block ``b`` as ``b.reshape(in, H).T``: ``(H, H)`` blocks of a Keras kernel
                     stacked without turning each, or a Keras CuDNN kernel's slices transposed, not reinterpreted
``blocks_reshaped``  every gate block's ``(in, H)`` Keras slice reshaped to ``(H, in)``, not transposed
``biases_summed``    ``b_ih + b_hh`` in one vector, the other zero (the same function for LSTM and simple RNN:
                     not a slip there; for a GRU ``b_hn`` sits inside ``r * (W_hn h + b_hn)``)
``bias_dropped``     a nonzero bias stored as zeros
``forget_bias_not_folded``  TF1's run-time ``forget_bias`` missing from the LSTM's bias (the checkpoint's bias
                     copied as is into ``b_ih``, or into ``b_hh`` with ``b_ih`` zero)
``directions_exchanged``  forward and backward parameter sets swapped
``stacked_layers_exchanged``  two stacked layers' parameter sets swapped
``layers_exchanged``  DST's layer holds another source layer's parameters
``gate_activation``, ``activation``, ``reset_after``, ``go_backwards``  the layer run with another semantics
                     (Keras-2 ``hard_sigmoid`` as ``sigmoid``, a ``linear`` activation as ``tanh``, reset-before
                     and reset-after GRUs confused -- a PyTorch GRU in ONNX with ``linear_before_reset=0`` --,
                     ``go_backwards`` ignored)
==================== ======================================================================================

Pure numpy on canonical arrays; equality is exact (``np.array_equal``) for every rearrangement (a permutation,
reshape or transpose moves bits, it never rounds), and within two float32 roundings for a sum.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..core.gates import CANONICAL
from ..core.model import Cell

#: the tensors a slip is searched in, canonical names (:class:`rnnconvert.core.model.DirectionParams` fields)
TENSORS = ("w_ih", "w_hh", "b_ih", "b_hh")

#: the semantics fields whose mix-up is a slip (:class:`rnnconvert.core.model.Semantics`)
SEMANTIC = ("gate_activation", "activation", "reset_after", "go_backwards")

#: foreign gate orders people copy blocks in, by name (canonical letters; source: core/gates.TABLE)
KNOWN_ORDERS: dict[Cell, dict[str, str]] = {
    Cell.LSTM: {"iofg": "ONNX's i,o,f,c", "igfo": "TF1's i,j,f,o (Keras 1's i,c,f,o)"},
    Cell.GRU: {"zrn": "Keras's and ONNX's z,r,h"},
}

#: each framework's own letters for the canonical gates (Keras c/h, TF1 j/u), for messages
TORCH_STEM = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}


@dataclass
class Slip:
    """One slip found in one layer.

    Attributes:
        layer: DST's layer name; ``depth``, ``direction``: the stacked layer and direction (``None`` when the
            slip concerns the whole layer, e.g. its semantics).
        tensor: canonical tensor name (``w_ih``, ``w_hh``, ``b_ih``, ``b_hh``) or semantics field, or ``None``.
        kind: one of the kinds in the module docstring.
        frm, to: what DST holds and what it should hold (a gate order, an activation, a direction...).
        message: the one line a person can act on.
    """

    layer: str
    depth: int | None
    direction: int | None
    tensor: str | None
    kind: str
    frm: Any
    to: Any
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["from"] = d.pop("frm")
        return d


# ---------------------------------------------------------------------------------------------------------
# matching

def close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal within two roundings of the wider of both dtypes' precisions (a sum of two float32 biases
    computed in float32 or float64 and stored in float32)."""
    if a.shape != b.shape:
        return False
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    eps = float(np.finfo(np.result_type(a.dtype, b.dtype, np.float32)).eps)
    return bool(np.all(np.abs(a64 - b64) <= 2 * eps * np.maximum(np.abs(a64), np.abs(b64)) + 1e-30))


def same(a: np.ndarray, b: np.ndarray, exact: bool = True) -> bool:
    """``a`` and ``b`` hold the same numbers: bit for bit (``exact``) or within :func:`close`."""
    if a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b)) if exact else close(a, b)


def block_order(dst: np.ndarray, src: np.ndarray, cell: Cell, exact: bool = True) -> str | None:
    """The gate order DST's blocks hold ``src``'s gates in: ``dst``'s block ``j`` equals ``src``'s block of
    gate ``order[j]`` (canonical letters; ``CANONICAL[cell]`` when in place), or ``None`` when no permutation
    of ``src``'s gate blocks gives ``dst``. Blocks are the ``G`` equal row groups of axis 0. Identity is
    preferred where blocks repeat (zeros)."""
    letters = CANONICAL[cell]
    G = len(letters)
    if dst.shape != src.shape or dst.shape[0] % G:
        return None
    db, sb = np.split(dst, G), np.split(src, G)
    if all(same(d, s, exact) for d, s in zip(db, sb)):
        return letters
    if G == 1:
        return None
    for perm in itertools.permutations(range(G)):
        if all(same(db[j], sb[perm[j]], exact) for j in range(G)):
            return "".join(letters[p] for p in perm)
    return None


def reorder(a: np.ndarray, order: str, cell: Cell, inverse: bool = False) -> np.ndarray:
    """``a``'s canonical gate blocks put in ``order`` (block ``j`` = gate ``order[j]``), or with ``inverse`` a
    DST held in ``order`` put back in canonical order."""
    letters = CANONICAL[cell]
    blocks = np.split(a, len(letters))
    if inverse:
        out = [None] * len(letters)
        for j, g in enumerate(order):
            out[letters.index(g)] = blocks[j]
        return np.ascontiguousarray(np.concatenate(out))
    return np.ascontiguousarray(np.concatenate([blocks[letters.index(g)] for g in order]))


def unreshape(w: np.ndarray) -> np.ndarray:
    """The ``(G*H, in)`` matrix a reshaped (not transposed) kernel came from: ``w.reshape(in, G*H).T``
    (``w = K.reshape(G*H, in)`` with ``K = E.T`` gives back ``E``)."""
    gh, n = w.shape
    return np.ascontiguousarray(w.reshape(n, gh).T)


def reshape_slip(e: np.ndarray) -> np.ndarray:
    """The slip itself: canonical ``e`` ``(G*H, in)`` as a ``(in, G*H)`` kernel, reshaped to ``(G*H, in)``."""
    return np.ascontiguousarray(np.ascontiguousarray(e.T).reshape(e.shape))


def blocks_transposed(w: np.ndarray, G: int) -> np.ndarray:
    """Each ``(H, in)`` gate block ``b`` of ``w`` as ``b.reshape(in, H).T``: a block transposed where it should
    have been reinterpreted -- square ``(H, H)`` blocks simply transposed (a Keras recurrent kernel split into
    gate blocks stacked without turning each), or a Keras ``CuDNNLSTM``/``CuDNNGRU`` kernel slice, whose bytes
    are cuDNN's ``(H, in)`` matrix (core/gates.TABLE ``keras_cudnn``), transposed. The inverse of
    :func:`blocks_reshaped`."""
    return np.ascontiguousarray(np.concatenate([b.reshape(b.shape[1], b.shape[0]).T for b in np.split(w, G)]))


def blocks_reshaped(w: np.ndarray, G: int) -> np.ndarray:
    """Each ``(H, in)`` gate block ``b`` of ``w`` as ``b.T.reshape(H, in)``: a Keras kernel's ``(in, H)`` gate
    slice reshaped instead of transposed. The inverse of :func:`blocks_transposed`."""
    return np.ascontiguousarray(np.concatenate([np.ascontiguousarray(b.T).reshape(b.shape) for b in np.split(w, G)]))


# ---------------------------------------------------------------------------------------------------------
# wording

def target_name(fmt: str) -> str:
    """The framework a DST format is run by, for "where X expects"."""
    return {"pt": "PyTorch", "safetensors": "PyTorch", "onnx": "ONNX", "keras_h5": "Keras", "keras3": "Keras",
            "cudnn_npz": "cuDNN"}.get(fmt, "the canonical layout")


def tensor_name(fmt: str, tensor: str, k: int | None, d: int | None) -> str:
    """A canonical tensor's name as DST's owner sees it: ``weight_hh_l0_reverse`` for PyTorch files, else the
    canonical ``W_hh``."""
    if fmt in ("pt", "safetensors") and tensor in TORCH_STEM and k is not None:
        return f"{TORCH_STEM[tensor]}_l{k}" + ("_reverse" if d else "")
    return {"w_ih": "W_ih", "w_hh": "W_hh", "b_ih": "b_ih", "b_hh": "b_hh"}.get(tensor, tensor)


def order_words(cell: Cell, order: str, fmt: str) -> str:
    """``'in order i,o,f,g (ONNX's i,o,f,c) where PyTorch expects i,f,g,o (f and o exchanged)'``."""
    canon = CANONICAL[cell]
    known = KNOWN_ORDERS.get(cell, {}).get(order)
    moved = [g for j, g in enumerate(order) if canon[j] != g]
    how = (f"{moved[0]} and {moved[1]} exchanged" if len(moved) == 2 else f"{', '.join(moved)} moved")
    return (f"in order {','.join(order)}" + (f" ({known} order)" if known else "")
            + f" where {target_name(fmt)} expects {','.join(canon)} ({how})")


def where(layer: str, k: int | None, d: int | None) -> str:
    """``"rnn_1 (layer 0, forward)"``."""
    if k is None:
        return layer
    return f"{layer} (layer {k}, {'backward' if d else 'forward'})"
