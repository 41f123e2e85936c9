"""TF1 RNN cells in name-based checkpoints and frozen graphs: scopes, variables, canonical parameters.

Shared by :mod:`.checkpoint_read` and :mod:`.graph_read` (LAYOUTS §8, §9). Gate conventions come from
:data:`rnnconvert.core.gates.TABLE` (``("tf1", LSTM)`` i, j, f, o columns; ``("tf1_gates", GRU)`` r, u).
Numpy only.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from ...core import gates
from ...errors import FormatError, UnsupportedError
from ...core.model import Cell, DirectionParams, Semantics
from . import naming as n
from .naming import CELL_RE, CELL_SCOPES, REFUSED
from ...speed import transpose


def cell_vars(shapes) -> dict[tuple[str, str], dict[str, str | tuple[str, ...]]]:
    """``{(scope, cell): {var: key}}`` for every recognised TF1 cell.

    A variable stored in shards ``<var>/part_0``, ``<var>/part_1``, ... (separate keys: Const nodes of a
    frozen graph of a partitioned variable; pre-1.0 sharded names as renamed by ``checkpoint_convert.py``,
    ``lstm_cell/weights/part_N``) maps to the tuple of its shard keys in order; :func:`getter` concatenates
    them along axis 0 (LAYOUTS §8.6). A name-based checkpoint written by TF's ``Saver`` stores a
    partitioned variable as slices of one key, which TF's reader already assembles.
    """
    out: dict[tuple[str, str], dict[str, str | tuple[str, ...]]] = defaultdict(dict)
    shards: dict[tuple[str, str], dict[str, dict[int, str]]] = defaultdict(lambda: defaultdict(dict))
    for key in shapes:
        parts = key.split("/")
        for bad, why in REFUSED.items():
            if bad in parts:
                raise UnsupportedError(f"variable '{key}': {bad} ({why}) is not supported by rnnconvert; "
                                       "no target format expresses it")
        m = CELL_RE.match(key)
        if not m:
            continue
        var = m.group("var")
        if n.OPTIMIZER_SLOT_RE.search(var):
            continue  # optimizer slots
        if re.fullmatch(r"(.*/)?bias_cudnn[ _]\d+", var):
            raise UnsupportedError(f"variable '{key}': the oldest CudnnLSTM/CudnnGRU saveable names (bias_cudnn_0/1, "
                                   "LAYOUTS §9.3) are not read: no such checkpoint was available to check their "
                                   "layout; re-save it with a TF 1.x version whose saveable writes kernel/bias only")
        part = re.fullmatch(r"(.+)/part_(\d+)", var)
        if part:
            var = part.group(1)
        for a, b in n.RENAME:
            var = re.sub(rf"(^|/){a}$", rf"\1{b}", var)
        cell = (m.group("prefix"), m.group("cell"))
        if part:
            shards[cell][var][int(part.group(2))] = key
        else:
            out[cell][var] = key
    for cell, found in shards.items():
        for var, keys in found.items():
            if var in out[cell] or sorted(keys) != list(range(len(keys))):
                raise FormatError(f"variable '{keys[min(keys)]}': shards {sorted(keys)} of '{var}' are incomplete "
                                  "or duplicate an unsharded variable")
            out[cell][var] = tuple(keys[i] for i in range(len(keys)))
    return out


def getter(get):
    """``get`` extended to shard tuples from :func:`cell_vars`: the shards concatenated along axis 0."""
    def get_any(key):
        if isinstance(key, tuple):
            return np.concatenate([np.asarray(get(k)) for k in key], axis=0)
        return get(key)
    return get_any


def _lstm(v, get, name) -> tuple[DirectionParams, int, int, int]:
    kern, bias = get(v[n.KERNEL]), get(v[n.BIAS])
    H = bias.shape[0] // 4
    proj = get(v[n.PROJECTION_KERNEL]) if n.PROJECTION_KERNEL in v else None
    P = proj.shape[1] if proj is not None else 0
    I = kern.shape[0] - (P or H)
    if kern.shape[1] != 4 * H or I < 1 or (proj is not None and proj.shape[0] != H):
        raise FormatError(f"cell '{name}': kernel {kern.shape}, bias {bias.shape} do not fit an LSTM")
    conv = gates.convention("tf1", Cell.LSTM)
    peep = None
    if n.peephole("i") in v:
        peep = np.stack([get(v[n.peephole(g)]) for g in "ifo"])
    dp = DirectionParams(transpose.to_canonical(kern[:I], conv, Cell.LSTM), transpose.to_canonical(kern[I:], conv, Cell.LSTM),
                         gates.vec_to_canonical(bias, conv, Cell.LSTM), np.zeros(4 * H, bias.dtype),
                         None if proj is None else np.ascontiguousarray(proj.T), peep)
    return dp, I, H, P


def _gru(v, get, name, compat: bool) -> tuple[DirectionParams, int, int, int]:
    gk, gb = get(v[n.GATES_KERNEL]), get(v[n.GATES_BIAS])
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
        wi, bi = get(v[n.CAND_INPUT_KERNEL]), get(v[n.CAND_INPUT_BIAS])
        wh, bh = get(v[n.CAND_HIDDEN_KERNEL]), get(v[n.CAND_HIDDEN_BIAS])
    else:
        ck, cb = get(v[n.CANDIDATE_KERNEL]), get(v[n.CANDIDATE_BIAS])
        wi, bi, wh, bh = ck[:I], cb, ck[I:], zeros
        if ck.shape != (I + H, H):
            raise FormatError(f"cell '{name}': candidate/kernel {ck.shape}, expected {(I + H, H)}")
    if gk.shape != (I + H, 2 * H) or wi.shape != (I, H) or wh.shape != (H, H):
        raise FormatError(f"cell '{name}': gates/kernel {gk.shape} does not fit a GRU")
    dp = DirectionParams(np.concatenate([rz(gk[:I]), wi.T]), np.concatenate([rz(gk[I:]), wh.T]),
                         np.concatenate([rzb(gb), bi]), np.concatenate([np.zeros(2 * H, gb.dtype), bh]))
    return dp, I, H, 0


def _rnn(v, get, name) -> tuple[DirectionParams, int, int, int]:
    kern, bias = get(v[n.KERNEL]), get(v[n.BIAS])
    H = bias.shape[0]
    I = kern.shape[0] - H
    if kern.shape[1] != H or I < 1:
        raise FormatError(f"cell '{name}': kernel {kern.shape} does not fit a basic RNN cell of {H} units")
    conv = gates.convention("tf1", Cell.RNN_TANH)
    return DirectionParams(transpose.to_canonical(kern[:I], conv, Cell.RNN_TANH),
                           transpose.to_canonical(kern[I:], conv, Cell.RNN_TANH), bias.copy(),
                           np.zeros(H, bias.dtype)), I, H, 0


def read_cell(cellname: str, v: dict[str, str], get, name: str):
    try:
        if "lstm" in cellname:
            return Cell.LSTM, _lstm(v, get, name)
        if "gru" in cellname:
            return Cell.GRU, _gru(v, get, name, cellname.startswith("cudnn"))
        return Cell.RNN_TANH, _rnn(v, get, name)
    except KeyError as exc:
        raise FormatError(f"cell '{name}' ({cellname}) lacks variable {exc}; has {sorted(v)}") from exc


def cell_structure(prefix: str, cname: str) -> tuple[str, int, int]:
    """``(base scope, stacked layer k, direction d)`` of a cell found under ``prefix`` (LAYOUTS §8.5).

    Raises:
        UnsupportedError: a MultiRNNCell inside each direction of ``bidirectional_dynamic_rnn`` (two
            independent stacks, not a stacked bidirectional layer).
    """
    parts = prefix.split("/") if prefix else []
    k = d = None
    while len(parts) >= 2:
        if parts[-1] in n.DIRECTIONS and parts[-2] == n.BIDIRECTIONAL_RNN:
            if k is not None:
                raise UnsupportedError(f"scope '{prefix}': a MultiRNNCell inside each direction of a bidirectional "
                                       "RNN runs two independent stacks; rnnconvert reads only stacked "
                                       "bidirectional layers (stack_bidirectional_rnn)")
            d = n.DIRECTIONS.index(parts[-1])
        elif n.STACKED_CELL_RE.fullmatch(parts[-1]) and parts[-2] in (n.MULTI_RNN_CELL, n.STACK_BIDIRECTIONAL):
            k = int(parts[-1][5:])
        else:
            break
        parts = parts[:-2]
    if parts and parts[-1] == n.RNN_SCOPE:
        parts = parts[:-1]
    return "/".join(parts) or cname, k or 0, d or 0


def cell_semantics(cname: str, cell: Cell, forget_bias, cell_clip, proj_clip) -> Semantics:
    fb = CELL_SCOPES[cname] if forget_bias is None else forget_bias
    lstm = cell is Cell.LSTM
    return Semantics(reset_after=cname == "cudnn_compatible_gru_cell" if cell is Cell.GRU else True,
                     forget_bias=float(fb or 0.0) if lstm else 0.0, cell_clip=cell_clip if lstm else None,
                     proj_clip=proj_clip if lstm else None)
