"""Read Equinox recurrent cells from an ``eqx.tree_serialise_leaves`` file, without JAX or Equinox.

Layout facts:

* The file (``equinox/_serialisation.py``, equinox v0.13.8, ``default_serialise_filter_spec``) is the model's
  array leaves, in ``jax.tree_util`` leaf order, each written by ``jnp.save``/``np.save`` as one ``.npy`` record
  (magic ``\\x93NUMPY``, version, header dict, C- or Fortran-order data), one after the other; no names, no
  sizes, no count. Static fields (``input_size``, ``hidden_size``, ``use_bias``) are not leaves; ``None``
  (``bias`` with ``use_bias=False``) is no leaf either.
* ``eqx.nn.LSTMCell`` (``equinox/nn/_rnn.py``): ``weight_ih`` ``(4H, I)``, ``weight_hh`` ``(4H, H)``, ``bias``
  ``(4H,)`` (absent with ``use_bias=False``); ``lin = W_ih x + W_hh h + bias`` split ``i, f, g, o``: PyTorch's
  equation with one bias (``b_ih = bias``, ``b_hh = 0``).
* ``eqx.nn.GRUCell``: ``weight_ih`` ``(3H, I)``, ``weight_hh`` ``(3H, H)``, ``bias`` ``(3H,)`` and ``bias_n``
  ``(H,)`` (both absent with ``use_bias=False``); ``r = sigmoid(i_r + h_r)``, ``z = sigmoid(i_z + h_z)``,
  ``n = tanh(i_n + r (h_n + bias_n))`` with ``i = W_ih x + bias``, ``h = W_hh h``; ``h' = n + z (h - n)`` =
  ``(1 - z) n + z h``: PyTorch's reset-after GRU with ``b_ih = bias``, ``b_hh = [0, 0, bias_n]``.

Sizes are never guessed: the read option ``cells`` states the leaves (``cells=lstm:3:4,gru:4:3:nobias,skip:2``:
one item per cell, ``KIND:I:H`` plus ``:nobias`` for ``use_bias=False``, and ``skip:N`` for N leaves of other
modules, carried as tensors ``leaf<k>``). Without it the sizes are inferred from the shapes only when the whole
file parses as a sequence of cells (each cell's ``weight_hh`` is ``(G*H, H)``, which fixes G and H; a cell
never starts with a 1-D leaf, so a following 1-D leaf of ``(G*H,)`` is its bias); any other leaf makes it
refuse, naming the option.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer
from ...errors import FormatError, OptionError
from ...safety import budget

MAGIC = b"\x93NUMPY"
#: the longest ``.npy`` header read (numpy writes a few hundred bytes)
MAX_HEADER = 1 << 16
KINDS = {"lstm": Cell.LSTM, "gru": Cell.GRU}
CLASS = {Cell.LSTM: "eqx.nn.LSTMCell", Cell.GRU: "eqx.nn.GRUCell"}


def leaves(p: Path) -> list[np.ndarray]:
    """The file's ``.npy`` records in order (copies; plain number dtypes only, ``allow_pickle`` never).

    Raises:
        FormatError: not a sequence of ``.npy`` records, a header that is not numpy's, object or structured
        dtypes, data past the end. BudgetError: more records than the ``names`` limit."""
    data = p.read_bytes()
    out: list[np.ndarray] = []
    pos = 0
    while pos < len(data):
        at = f"{p}: leaf {len(out)} (byte {pos})"
        if data[pos:pos + 6] != MAGIC or pos + 10 > len(data):
            raise FormatError(f"{at}: not a .npy record (eqx.tree_serialise_leaves writes one per leaf)")
        major = data[pos + 6]
        if major == 1:
            hlen, hstart = int.from_bytes(data[pos + 8:pos + 10], "little"), pos + 10
        elif major in (2, 3):
            hlen, hstart = int.from_bytes(data[pos + 8:pos + 12], "little"), pos + 12
        else:
            raise FormatError(f"{at}: .npy version {major}")
        if hlen > MAX_HEADER or hstart + hlen > len(data):
            raise FormatError(f"{at}: a .npy header of {hlen} bytes")
        try:
            header = ast.literal_eval(data[hstart:hstart + hlen].decode("latin1"))
            shape, descr, fortran = header["shape"], header["descr"], header["fortran_order"]
            dt = np.dtype(descr) if isinstance(descr, str) else None
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
            raise FormatError(f"{at}: a damaged .npy header") from None
        if dt is None or dt.kind not in "fiub" or dt.fields is not None or dt.subdtype is not None:
            raise FormatError(f"{at}: dtype {descr!r:.40} (plain number arrays only; bfloat16 leaves: save float32)")
        if not (isinstance(shape, tuple) and len(shape) <= 32 and all(type(s) is int and s >= 0 for s in shape)):
            raise FormatError(f"{at}: shape {shape!r:.60}")
        n = int(np.prod(shape, dtype=object)) * dt.itemsize
        start = hstart + hlen
        if start + n > len(data):
            raise FormatError(f"{at}: shape {shape} needs {n} bytes, the file holds {len(data) - start} more")
        a = np.frombuffer(data, dt, count=n // dt.itemsize if dt.itemsize else 0, offset=start)
        a = a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
        out.append(a.astype(dt.newbyteorder("="), copy=True))
        budget.check_count(p, "names", len(out), "leaves")
        pos = start + n
    if not out:
        raise FormatError(f"{p}: an empty file")
    return out


def parse_cells(cells: Any) -> list[tuple[str, int, int, bool]]:
    """``cells`` as ``[(kind, I, H, bias)]`` items, ``("skip", N, 0, False)`` for N other leaves.

    Raises:
        OptionError: an item that is not ``lstm:I:H[:nobias]``, ``gru:I:H[:nobias]`` or ``skip:N``."""
    parts = cells if isinstance(cells, (list, tuple)) else str(cells).split(",")
    out = []
    for item in parts:
        f = [s.strip().lower() for s in str(item).split(":")]
        try:
            if f[0] == "skip" and len(f) == 2 and int(f[1]) > 0:
                out.append(("skip", int(f[1]), 0, False))
                continue
            if f[0] in KINDS and len(f) in (3, 4) and int(f[1]) > 0 and int(f[2]) > 0 and f[3:] in ([], ["nobias"]):
                out.append((f[0], int(f[1]), int(f[2]), len(f) == 3))
                continue
        except ValueError:
            pass
        raise OptionError(f"cells={cells!r}: items are lstm:I:H, gru:I:H (':nobias' for use_bias=False) or skip:N "
                          "(e.g. cells=lstm:3:4,skip:2)")
    return out


def _need(kind: str, I: int, H: int, bias: bool) -> list[tuple[int, ...]]:
    G = 4 if kind == "lstm" else 3
    shapes = [(G * H, I), (G * H, H)]
    if bias:
        shapes += [(G * H,)] + ([(H,)] if kind == "gru" else [])
    return shapes


def infer(shapes: list[tuple[int, ...]]) -> list[tuple[str, int, int, bool]] | None:
    """The cells the leaf shapes spell when every leaf belongs to one (module docstring), else ``None``."""
    out, k = [], 0
    while k < len(shapes):
        if k + 1 >= len(shapes) or len(shapes[k]) != 2 or len(shapes[k + 1]) != 2:
            return None
        rows, H = shapes[k + 1]
        kind = {4 * H: "lstm", 3 * H: "gru"}.get(rows) if H else None
        if kind is None or shapes[k][0] != rows or shapes[k][1] < 1:
            return None
        I = shapes[k][1]
        bias = shapes[k + 2:k + 2 + len(_need(kind, I, H, True)) - 2] == _need(kind, I, H, True)[2:]
        out.append((kind, I, H, bias))
        k += len(_need(kind, I, H, bias))
    return out


def read(path: str | Path, cells: Any = None) -> Checkpoint:
    """Read the Equinox cells of a ``tree_serialise_leaves`` file (module docstring).

    Args:
        cells: the leaves' cells (``"lstm:3:4,gru:4:3:nobias,skip:2"``); inferred from the shapes when omitted
            and the file holds cells only.

    Returns:
        one layer per cell (``cell0``, ``cell1``, ... in leaf order; LSTM ``i f g o`` one bias as ``b_ih``; GRU
        ``r z n`` reset-after, ``bias_n`` as ``b_hh[n]``), skipped leaves as tensors ``leaf<k>``.

    Raises:
        FormatError: see :func:`leaves`; leaves that do not form cells without ``cells`` (naming it), shapes
        that do not match ``cells``. OptionError: a malformed ``cells``.
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    arrs = leaves(p)
    shapes = [a.shape for a in arrs]
    shown = ", ".join(str(s) for s in shapes[:8]) + (", ..." if len(shapes) > 8 else "")
    if cells is None:
        plan = infer(shapes)
        if plan is None:
            raise FormatError(f"{p}: the {len(shapes)} leaves ({shown}) are not Equinox LSTMCell/GRUCell leaves "
                              "only, so their sizes cannot be inferred; give them with --read-opt "
                              "cells=lstm:I:H,gru:I:H[:nobias],skip:N (in leaf order)")
        notes = [f"cell sizes inferred from the {len(shapes)} leaf shapes (the file holds Equinox cells only)"]
    else:
        plan, notes = parse_cells(cells), []
    layers, tensors, k = [], {}, 0
    for kind, I, H, bias in plan:
        if kind == "skip":
            if k + I > len(arrs):
                raise FormatError(f"{p}: cells skips {I} leaves at leaf {k}; the file has {len(arrs)}")
            tensors.update({f"leaf{j}": arrs[j] for j in range(k, k + I)})
            k += I
            continue
        need = _need(kind, I, H, bias)
        got = shapes[k:k + len(need)]
        if got != need or any(a.dtype.kind != "f" or a.dtype != arrs[k].dtype for a in arrs[k:k + len(need)]):
            raise FormatError(f"{p}: leaves {k}..{k + len(need) - 1} are {got}, not eqx.nn.{kind.upper()}Cell({I}, "
                              f"{H}{'' if bias else ', use_bias=False'})'s {need} of one float dtype")
        cell = KINDS[kind]
        conv = gates.convention("equinox", cell)
        w_ih, w_hh = arrs[k], arrs[k + 1]
        zeros = np.zeros(cell.gates * H, w_ih.dtype)
        b_ih = gates.vec_to_canonical(arrs[k + 2], conv, cell) if bias else zeros
        b_hh = zeros.copy()
        if bias and cell is Cell.GRU:
            b_hh[gates.gate_slice(cell, "n", H)] = arrs[k + 3]
        dp = DirectionParams(gates.to_canonical(w_ih, conv, cell), gates.to_canonical(w_hh, conv, cell), b_ih, b_hh)
        name = f"cell{len(layers)}"
        try:
            layers.append(RNNLayer(name=name, cell=cell, input_size=I, hidden_size=H, bias=bias, params=[[dp]],
                                   source={"format": "equinox", "class_name": CLASS[cell], "path": f"leaves {k}.."}))
        except ValueError as exc:
            raise FormatError(f"{p}: {name}: {exc}") from exc
        k += len(need)
    if k != len(arrs):
        raise FormatError(f"{p}: cells accounts for {k} of the {len(arrs)} leaves; name the rest with skip:N")
    if not layers:
        raise FormatError(f"{p}: cells names no LSTMCell or GRUCell")
    return Checkpoint(layers=layers, tensors=tensors, format="equinox", meta={"path": str(p), "notes": notes})
