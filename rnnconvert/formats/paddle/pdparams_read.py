"""The PaddlePaddle ``.pdparams`` reader: ``paddle.save(layer.state_dict())`` files, read without Paddle and
without running anything from the file.

Layout (``paddle/framework/io.py`` ``save`` of PaddlePaddle 3.3.1, and ``pickletools.dis`` of its output): a
protocol-4 pickle of a dict ``{name: numpy.ndarray}``, each array pickled by numpy
(``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')`` then ``BUILD`` with ``(1, shape,
numpy.dtype(code, False, True) + its state, is_fortran, raw bytes)``). :class:`Unpickler` resolves only those
names -- to stand-ins that record the arguments, never numpy's own constructors -- and the arrays are built here
from the raw bytes after checking the dtype (numeric only: no object arrays) and the size. Anything else
(another global, a persistent id) is refused with one line. Before the unpickler runs, the stream is bounded by
:func:`rnnconvert.safety.pickle_scan.scan` (object size, nesting, memo, hashed keys) and must end at its ``STOP``.

Names and equations: :mod:`.naming` (``paddle/nn/layer/rnn.py``): gates LSTM ``i f g o``, GRU ``r z n`` with
``r`` applied after the recurrent product, weights ``(G*H, in)`` applied as ``x @ W.T`` -- PyTorch's layout
(``core/gates.py`` rows ``("paddle", cell)``); ``weight_ho`` ``(H, P)`` is the transpose of PyTorch's
``weight_hr`` (canonical ``w_hr = weight_ho.T``). Every parameter is stored twice (per cell and under a flat
alias): the per-cell names are read (what the cells compute with; the flat aliases are shifted when there is a
projection, :mod:`.naming`), and every flat alias must equal one of them bit for bit, or the file is refused.
"""

from __future__ import annotations

import collections
import io
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ...errors import FormatError
from ...safety import budget
from ...safety import pickle_scan
from ...safety.pickle_scan import brief
from . import naming

#: numpy dtype codes the reader builds (``numpy.dtype(code)``); anything else (object ``O``, void, strings) is refused
CODES = {"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"}
#: the largest file read into memory
MAX_BYTES = 8 << 30


class Declined(FormatError):
    """The pickle names something outside the allow-list."""


class _NDArrayClass:
    """Stands for ``numpy.ndarray`` (only passed to :func:`_reconstruct`)."""


class _DType:
    """Stands for ``numpy.dtype(code, align, copy)``; ``BUILD`` gives its byte order."""

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(code, str) or code not in CODES:
            raise Declined(f"array dtype {brief(code, 20)} (numeric dtypes only)")
        self.code, self.order = code, "|"

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) >= 2 and state[1] in ("<", ">", "|", "=")):
            raise Declined("a dtype state rnnconvert does not read")
        if any(s not in (None, -1, 0) for s in state[2:7]):
            raise Declined("structured or sub-array dtype")
        self.order = state[1]

    def dtype(self) -> np.dtype:
        return np.dtype(self.code).newbyteorder("<" if self.order in ("|", "=") else self.order)


class _Pending:
    """An array being unpickled: ``__setstate__`` receives ``(version, shape, dtype, is_fortran, raw)``."""

    def __init__(self) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def array(self, where: str) -> np.ndarray:
        st = self.state
        if not (isinstance(st, tuple) and len(st) == 5 and isinstance(st[2], _DType)
                and isinstance(st[1], tuple) and all(type(d) is int and d >= 0 for d in st[1])
                and isinstance(st[4], (bytes, bytearray))):
            raise FormatError(f"{where}: an array record rnnconvert cannot read")
        shape, dt, fortran, raw = st[1], st[2].dtype(), bool(st[3]), st[4]
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise FormatError(f"{where}: array of shape {shape} ({dt}) holds {len(raw)} bytes")
        a = np.frombuffer(raw, dt).reshape(shape, order="F" if fortran else "C")
        return np.ascontiguousarray(a, dtype=dt.newbyteorder("="))


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _Pending:
    if cls is not _NDArrayClass:
        raise Declined("_reconstruct of something other than numpy.ndarray")
    return _Pending()


class Unpickler(pickle.Unpickler):
    """The allow-list unpickler of a ``.pdparams`` (module docstring)."""

    def find_class(self, module: str, name: str):
        if module in ("numpy._core.multiarray", "numpy.core.multiarray") and name == "_reconstruct":
            return _reconstruct
        if (module, name) == ("numpy", "ndarray"):
            return _NDArrayClass
        if (module, name) == ("numpy", "dtype"):
            return _DType
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise Declined(f"the pickle names '{module}.{name}', which rnnconvert does not load (allow-list: numpy "
                       "arrays in dicts)")

    def persistent_load(self, pid):
        raise Declined("the pickle uses persistent ids (not a paddle.save state dict)")


def arrays(p: Path) -> dict[str, np.ndarray]:
    """The arrays of a ``.pdparams``, keys joined with ``.`` where dicts nest (module docstring).

    The stream is checked by :func:`rnnconvert.safety.pickle_scan.scan` before the unpickler runs (expanded
    size, nesting, memo, hashed keys), and must end at its ``STOP``.

    Raises:
        FormatError: not such a pickle, data after ``STOP``, a structure the scan refuses, a name outside the
        allow-list, a bad array record; BudgetError.
    """
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise FormatError(f"{p}: {size} bytes; rnnconvert reads .pdparams files up to {MAX_BYTES} bytes")
    data = p.read_bytes()
    end = pickle_scan.scan(data, p)  # structure bounded before the unpickler runs
    if end != len(data):
        raise FormatError(f"{p}: data after the pickle's STOP opcode; refused (paddle.save writes none)")
    try:
        obj = Unpickler(io.BytesIO(data)).load()
    except FormatError as exc:
        raise type(exc)(f"{p}: {exc}") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise FormatError(f"{p}: not a readable paddle.save pickle ({type(exc).__name__}: {exc})"[:300]) from exc
    if not isinstance(obj, dict):
        raise FormatError(f"{p}: the pickle holds a {type(obj).__name__}, not a state dict")
    leaves = budget.leaves(obj, _Pending, p, ".pdparams")
    return {k: v.array(f"{p}: '{k}'") for k, v in leaves.items()}


def _direction(p: Path, t: dict[str, np.ndarray], pre: str, k: int, cell: Cell, H: int, P: int) -> DirectionParams:
    G = cell.gates
    w_ih, w_hh = t["weight_ih"], t["weight_hh"]
    if w_ih.ndim != 2 or w_hh.shape != (G * H, P or H) or w_ih.shape[0] != G * H:
        raise FormatError(f"{p}: layer '{pre}' {k}: weight_ih {w_ih.shape} / weight_hh {w_hh.shape} do not fit "
                          f"{G} gates of {H}")
    dt = w_ih.dtype
    b = [t.get(n, np.zeros(G * H, dt)) for n in ("bias_ih", "bias_hh")]
    if any(x.shape != (G * H,) for x in b):
        raise FormatError(f"{p}: layer '{pre}' {k}: bias shapes {[x.shape for x in b]}, expected {(G * H,)}")
    cv = gates.convention("paddle", cell)
    w_hr = None
    if P:
        ho = t["weight_ho"]
        if ho.shape != (H, P):
            raise FormatError(f"{p}: layer '{pre}' {k}: weight_ho {ho.shape}, expected (H, P) = {(H, P)}")
        w_hr = np.ascontiguousarray(ho.T)  # paddle: h @ weight_ho (H, P); canonical w_hr (P, H)
    return DirectionParams(gates.to_canonical(w_ih, cv, cell), gates.to_canonical(w_hh, cv, cell),
                           gates.vec_to_canonical(b[0], cv, cell), gates.vec_to_canonical(b[1], cv, cell), w_hr)


def read(path: str | Path, *, nonlinearity: str = "tanh", **_: Any) -> Checkpoint:
    """Read the ``paddle.nn.LSTM``/``GRU``/``SimpleRNN`` layers of a ``.pdparams`` state dict (module docstring):
    one canonical layer per ``RNNBase`` (all its stacked layers and directions), named by its prefix (a bare
    layer: ``lstm``, ``gru``, ``rnn``); other arrays carried along. ``nonlinearity`` (``tanh``/``relu``): a
    ``SimpleRNN``'s activation, which the file does not hold.

    Raises:
        FormatError: unreadable or refused pickle, no recurrent layer, shapes that fit no cell, a flat alias that
        differs from every per-cell parameter (two copies disagree), missing stacked layers.
    """
    p = Path(path)
    budget.regular_source(p, dirs=False)
    if nonlinearity not in ("tanh", "relu"):
        raise FormatError(f"nonlinearity={nonlinearity!r}: use tanh or relu")
    try:
        sd = arrays(p)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    groups: dict[str, dict[tuple[int, str], dict[str, np.ndarray]]] = {}
    used = set()
    for key, a in sd.items():
        m = naming.CELL_KEY.match(key)
        if m:
            groups.setdefault(m["pre"], {}).setdefault((int(m["k"]), m["cell"]), {})[m["p"]] = a
            used.add(key)
    if not groups:
        raise FormatError(f"{p}: no paddle.nn.LSTM/GRU/SimpleRNN parameters ('<k>.cell.weight_ih' names)")
    ckpt = Checkpoint(format="paddle", meta={"path": str(p)})
    for pre, cells in groups.items():
        ks = sorted({k for k, _ in cells})
        kinds = {c for _, c in cells}
        bidi = kinds == {"cell_fw", "cell_bw"}
        if ks != list(range(len(ks))) or not (bidi or kinds == {"cell"}) or \
                len(cells) != len(ks) * (2 if bidi else 1):
            raise FormatError(f"{p}: layer '{pre}': stacked cells {sorted(cells)} are not 0..n-1 of one kind")
        first = cells[(0, "cell_fw" if bidi else "cell")]
        if "weight_ih" not in first or "weight_hh" not in first:
            raise FormatError(f"{p}: layer '{pre}': weight_ih or weight_hh is missing")
        if "weight_ho" in first:
            H, P = first["weight_ho"].shape if first["weight_ho"].ndim == 2 else (0, 0)
            G = first["weight_hh"].shape[0] // max(H, 1)
        else:
            H, P = first["weight_hh"].shape[1], 0
            G = first["weight_hh"].shape[0] // max(H, 1)
        if G not in naming.CLASS or G * H != first["weight_hh"].shape[0] or (P and G != 4):
            raise FormatError(f"{p}: layer '{pre}': weight_hh {first['weight_hh'].shape} fits no LSTM/GRU/SimpleRNN")
        cell = {4: Cell.LSTM, 3: Cell.GRU}.get(G) or (Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH)
        params = []
        for k in ks:
            names = ("cell_fw", "cell_bw") if bidi else ("cell",)
            params.append([_direction(p, cells[(k, c)], pre, k, cell, H, P) for c in names])
        own = [a for k in ks for c in (("cell_fw", "cell_bw") if bidi else ("cell",)) for a in cells[(k, c)].values()]
        for key, a in sd.items():  # the flat aliases: each must be one of the per-cell arrays, bit for bit
            m = naming.FLAT_KEY.match(key)
            if m and m["pre"] == pre:
                if not any(a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) for b in own):
                    raise FormatError(f"{p}: '{key}' differs from every per-cell parameter of layer '{pre}': the "
                                      "file's two copies of the weights disagree; refused")
                used.add(key)
        has_bias = any(n in cells[(0, names[0])] for n in ("bias_ih", "bias_hh"))
        name = pre[:-1] if pre else {Cell.LSTM: "lstm", Cell.GRU: "gru"}.get(cell, "rnn")
        try:
            ckpt.layers.append(RNNLayer(
                name=name, cell=cell, input_size=params[0][0].w_ih.shape[1], hidden_size=H, num_layers=len(ks),
                bidirectional=bidi, proj_size=P, bias=has_bias,
                semantics=Semantics(activation="relu" if cell is Cell.RNN_RELU else "tanh"), params=params,
                source={"format": "paddle", "class_name": f"paddle.nn.{naming.CLASS[G]}"}))
        except ValueError as exc:
            raise FormatError(f"{p}: {exc}") from exc
    return replace(ckpt, tensors={k: v for k, v in sd.items() if k not in used})


def load(path: str | Path, layer: RNNLayer | None, k: int | None = None, view: str = "torch") -> dict | None:
    """A written ``.pdparams`` as the ``paddle`` runtime's operations take it
    (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`, :mod:`rnnconvert.runtimes.paddle`).

    ``view="torch"`` (the runtime's fallback without Paddle: the torch runtime): layer ``layer.name`` read back from
    the file by :func:`read` (Paddle's per-cell names; ``weight_ho`` turned back), as ``torch.nn`` state-dict
    tensors ``{name}.weight_ih_l0``... (``torch.nn``, whose equations Paddle's cells share, runs the file's
    tensors; the module is built from the written layer, so a relu SimpleRNN runs as relu).
    ``view="checked"`` (before ``paddle.load`` unpickles the file): the file passed through the allow-list
    unpickler (:func:`arrays`); returns ``None``.

    Raises:
        FormatError: the pickle holds something outside the allow-list, or a tensor is malformed."""
    if view == "checked":
        arrays(path)
        return None
    from ...conventions import torch_state
    from ...errors import require

    torch = require("torch", "torch")
    back = read(path).layer(layer.name)
    sd = torch_state.state_dict(Checkpoint(layers=[back]))
    return {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in sd.items()}
