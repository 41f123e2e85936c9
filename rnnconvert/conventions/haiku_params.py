"""Haiku parameter trees (``hk.transform(f).init``): the recurrent cores' names, shapes and equations, and their
canonical layers. Shared by the JAX family's reader (``.npz``, ``flax.serialization`` msgpack) and the pickle
family's reader (a pickled tree), so that each container holds the one rule. Numpy only.

Source: ``haiku/_src/recurrent.py`` (google-deepmind/dm-haiku, read at v0.0.17), confirmed by running Haiku
(``fixtures/gen_haiku.py``, ``tests/formats/jax_files/test_haiku.py``):

* A Haiku tree is two levels, ``{module path: {parameter name: array}}``; a module path joins the names of the
  modules it sits in with ``/`` (``lstm/linear``; ``model/~/lstm/linear`` for a core built inside another
  module's ``__init__``), the n-th unnamed instance of a class gets ``_n`` (``lstm_1``). ``hk.DeepRNN`` adds no
  level (its cores are built by the caller), so stacked cores are separate modules whose chaining is not
  stored: each is read as its own layer.
* ``hk.LSTM(H)``: ``<m>/linear`` ``w`` ``(I+H, 4H)`` (rows: input, then hidden; ``x_and_h = concat([x, h])``),
  ``b`` ``(4H,)``; columns split ``i, g, f, o``; ``f = sigmoid(f + 1)``: a forget bias of 1 added at run time,
  never stored (:class:`rnnconvert.core.model.Semantics` ``forget_bias=1.0``, as TF1's ``forget_bias``).
* ``hk.GRU(H)``: ``<m>`` ``w_i`` ``(I, 3H)``, ``w_h`` ``(H, 3H)``, ``b`` ``(3H,)``; columns ``z, r, a``; the
  reset gate multiplies ``h`` before ``W_ha`` (reset-before: ``a = tanh(x W_ia + (r h) W_ha + b_a)``); one bias;
  and ``h' = (1 - z) h + z a``: Haiku's ``z`` is the weight of the *candidate*, where the canonical (PyTorch,
  cuDNN) equation ``h' = (1 - z) n + z h`` weighs the old state. The canonical update gate is therefore
  ``1 - z_haiku = sigmoid(-(x W_iz + h W_hz + b_z))``: the z block of ``W_ih``, ``W_hh`` and ``b_ih`` is
  stored negated (exact in floating point; ``sigmoid(-u) = 1 - sigmoid(u)``), ``reset_after=False``.
* ``hk.VanillaRNN(H, double_bias=True)``: ``<m>/linear`` (input, ``w`` ``(I, H)``, ``b``) and ``<m>/linear_1``
  (hidden, ``w`` ``(H, H)``, ``b`` unless ``double_bias=False``); ``h' = relu(x W_i + b_i + h W_h + b_h)``:
  a ReLU simple RNN.

Which modules are cores: :mod:`.haiku_names` (``hk.GRU``'s own ``w_i``/``w_h``/``b`` under any name; LSTM and
VanillaRNN ``hk.Linear`` parameters only under Haiku's default names or where the read option ``cells`` names
them, ``cells=encoder:lstm,decoder/~/core:vanilla_rnn``); every other array is carried as a tensor.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..core import gates
from ..core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from ..errors import FormatError
from . import haiku_names

#: the canonical cell of each Haiku core (:data:`.haiku_names.KINDS`)
CELLS = {"lstm": Cell.LSTM, "gru": Cell.GRU, "vanilla_rnn": Cell.RNN_RELU}
#: the run-time forget bias of ``hk.LSTM`` (``f = jax.nn.sigmoid(f + 1)``)
FORGET_BIAS = 1.0
#: class names for the report
CLASS = {Cell.LSTM: "hk.LSTM", Cell.GRU: "hk.GRU", Cell.RNN_RELU: "hk.VanillaRNN"}
LINEAR, LINEAR_1 = haiku_names.LINEAR, haiku_names.LINEAR_1


def modules(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Haiku's two levels from a flat ``{name: value}`` (:func:`.haiku_names.split`: ``lstm/linear/w`` from
    ``np.savez``, ``lstm/linear.w`` from a walked pickle), or ``None`` when a name has no module part."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in flat.items():
        cut = haiku_names.split(k)
        if cut is None:
            return None
        out.setdefault(cut[0], {})[cut[1]] = v
    return out


def two_levels(obj: Any) -> bool:
    """Whether ``obj`` has Haiku's shape: a non-empty dict of non-empty dicts of numpy arrays, string keys."""
    return isinstance(obj, dict) and bool(obj) and all(
        isinstance(k, str) and isinstance(v, dict) and v
        and all(isinstance(p, str) and isinstance(a, np.ndarray) for p, a in v.items()) for k, v in obj.items())


def is_tree(obj: Any) -> bool:
    """Whether ``obj`` is a Haiku parameter tree holding a recurrent core: :func:`two_levels` with at least one
    module :func:`.haiku_names.cores` recognises by Haiku's names (shapes are checked when it is read)."""
    return two_levels(obj) and bool(haiku_names.cores({m: set(d) for m, d in obj.items()}))


def _f(a: Any, where: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
        raise FormatError(f"{where}: not a float array ({type(a).__name__} {getattr(a, 'dtype', '')})")
    if shape is not None and a.shape != shape:
        raise FormatError(f"{where}: shape {a.shape}, expected {shape}")
    return a


def _only(d: Mapping[str, Any], keys: set[str], where: str) -> None:
    extra = set(d) - keys
    if extra:
        raise FormatError(f"{where}: holds {', '.join(sorted(extra))} beside {', '.join(sorted(keys))}")


def direction(tree: Mapping[str, Mapping[str, Any]], core: str, cell: Cell, where: str
              ) -> tuple[int, int, DirectionParams]:
    """One core's canonical parameters (module docstring): ``(I, H, params)``; transposes and block moves are
    bit-exact, the GRU's z block is negated (exact).

    Raises:
        FormatError: a missing parameter, shapes that do not fit the core, non-float arrays."""
    at = f"{where}: Haiku {CLASS[cell]} '{core}'"
    if cell is Cell.LSTM:
        lin = tree.get(f"{core}/{LINEAR}", {})
        if f"{core}/{LINEAR_1}" in tree:
            raise FormatError(f"{at}: has a linear_1 beside linear (hk.LSTM has one Linear)")
        _only(lin, {"w", "b"}, f"{at}/linear")
        w = _f(lin.get("w"), f"{at}/linear/w")
        if w.ndim != 2 or w.shape[1] % 4 or w.shape[0] <= w.shape[1] // 4:
            raise FormatError(f"{at}/linear/w: shape {w.shape} is not hk.LSTM's (I+H, 4H)")
        H = w.shape[1] // 4
        I = w.shape[0] - H
        b = _f(lin.get("b"), f"{at}/linear/b", (4 * H,))
        conv = gates.convention("haiku", cell)
        dp = DirectionParams(gates.to_canonical(w[:I], conv, cell), gates.to_canonical(w[I:], conv, cell),
                             gates.vec_to_canonical(b, conv, cell), np.zeros(4 * H, w.dtype))
        return I, H, dp
    if cell is Cell.GRU:
        d = tree.get(core, {})
        _only(d, set(haiku_names.GRU_PARAMS), at)
        w_h = _f(d.get("w_h"), f"{at}/w_h")
        if w_h.ndim != 2 or w_h.shape[1] != 3 * w_h.shape[0]:
            raise FormatError(f"{at}/w_h: shape {w_h.shape} is not hk.GRU's (H, 3H)")
        H = w_h.shape[0]
        w_i = _f(d.get("w_i"), f"{at}/w_i")
        if w_i.ndim != 2 or w_i.shape[1] != 3 * H or w_i.shape[0] < 1:
            raise FormatError(f"{at}/w_i: shape {w_i.shape} does not fit w_h {w_h.shape} (I, 3H)")
        b = _f(d.get("b"), f"{at}/b", (3 * H,))
        conv = gates.convention("haiku", cell)
        w_ih, w_hh = gates.to_canonical(w_i, conv, cell), gates.to_canonical(w_h, conv, cell)
        b_ih = gates.vec_to_canonical(b, conv, cell)
        z = gates.gate_slice(cell, "z", H)
        for a in (w_ih, w_hh, b_ih):  # canonical z = 1 - Haiku's z: the pre-activation negated (exact)
            a[z] = -a[z]
        return w_i.shape[0], H, DirectionParams(w_ih, w_hh, b_ih, np.zeros(3 * H, w_h.dtype))
    lin, lin1 = tree.get(f"{core}/{LINEAR}", {}), tree.get(f"{core}/{LINEAR_1}")
    if lin1 is None:
        raise FormatError(f"{at}: no linear_1 (hk.VanillaRNN's hidden-to-hidden Linear)")
    _only(lin, {"w", "b"}, f"{at}/linear")
    _only(lin1, {"w", "b"}, f"{at}/linear_1")
    w_h = _f(lin1.get("w"), f"{at}/linear_1/w")
    if w_h.ndim != 2 or w_h.shape[0] != w_h.shape[1]:
        raise FormatError(f"{at}/linear_1/w: shape {w_h.shape} is not hk.VanillaRNN's (H, H)")
    H = w_h.shape[0]
    w_i = _f(lin.get("w"), f"{at}/linear/w")
    if w_i.ndim != 2 or w_i.shape[1] != H:
        raise FormatError(f"{at}/linear/w: shape {w_i.shape} does not fit linear_1/w {w_h.shape}")
    b_i = _f(lin.get("b"), f"{at}/linear/b", (H,))
    b_h = lin1.get("b")
    b_h = np.zeros(H, w_h.dtype) if b_h is None else _f(b_h, f"{at}/linear_1/b", (H,))
    conv = gates.convention("haiku", cell)
    dp = DirectionParams(gates.to_canonical(w_i, conv, cell), gates.to_canonical(w_h, conv, cell),
                         np.ascontiguousarray(b_i), np.ascontiguousarray(b_h))
    return w_i.shape[0], H, dp


def layer_name(core: str) -> str:
    """``model/~/lstm`` -> ``model.lstm`` (Haiku's ``~`` marks a module built in another's ``__init__``)."""
    return ".".join(p for p in core.split("/") if p and p != "~")


def read(tree: Mapping[str, Mapping[str, Any]], where: str, fmt: str, cells: Any = None) -> Checkpoint:
    """Canonical layers of every Haiku core in ``tree`` (``{module path: {param: array}}``, module docstring).

    Returns:
        one layer per core (LSTM ``i f g o`` with ``Semantics(forget_bias=1.0)``; GRU ``r z n`` reset-before
        with the z block negated; VanillaRNN as ``RNN_RELU``), named :func:`layer_name`; every other array a
        carried tensor under ``<module>.<param>`` (``/`` turned into ``.``).

    Raises:
        FormatError: no core found (naming the ``cells`` option and the modules that could be one), shapes that
        do not fit a core. OptionError: a bad ``cells``.
    """
    found = {core: CELLS[kind] for core, kind in haiku_names.cores({m: set(d) for m, d in tree.items()}, cells).items()}
    if not found:
        maybe = [m.rsplit("/", 1)[0] for m, d in tree.items() if m.endswith(f"/{LINEAR}") and set(d) <= {"w", "b"}]
        hint = f" (modules with a Linear: {', '.join(maybe[:6])})" if maybe else ""
        raise FormatError(f"{where}: no Haiku recurrent core found under Haiku's names (lstm, gru, vanilla_rnn); "
                          f"name renamed cores with --read-opt cells=MODULE:lstm|gru|vanilla_rnn{hint}")
    used: set[str] = set()
    layers = []
    for core, cell in found.items():
        I, H, dp = direction(tree, core, cell, where)
        used.update([core] if cell is Cell.GRU else [f"{core}/{LINEAR}", f"{core}/{LINEAR_1}"])
        sem = Semantics(forget_bias=FORGET_BIAS) if cell is Cell.LSTM else \
            Semantics(reset_after=False) if cell is Cell.GRU else Semantics(activation="relu")
        name = layer_name(core)
        try:
            layers.append(RNNLayer(name=name, cell=cell, input_size=I, hidden_size=H, semantics=sem,
                                   params=[[dp]], source={"format": fmt, "class_name": CLASS[cell], "path": core}))
        except ValueError as exc:
            raise FormatError(f"{where}: {name}: {exc}") from exc
    if len({la.name for la in layers}) != len(layers):
        raise FormatError(f"{where}: two Haiku cores map to one layer name ({', '.join(la.name for la in layers)})")
    tensors = {}
    for mod, d in tree.items():
        if mod in used:
            continue
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                tensors[f"{layer_name(mod)}.{k}"] = v
    notes = []
    if any(la.cell is Cell.LSTM for la in layers):
        notes.append("hk.LSTM adds 1 to the forget gate at run time (not stored): kept as forget_bias=1.0 "
                     "(folded into b_ih[f] for targets without one)")
    if any(la.cell is Cell.GRU for la in layers):
        notes.append("hk.GRU computes h' = (1 - z) h + z a (reset before W_ha): its z block is stored negated "
                     "(canonical z = 1 - Haiku's z), reset_after=False")
    if len(layers) > 1:
        notes.append("Haiku stores no chaining of cores: each core is its own layer (hk.DeepRNN's too: feed one's output "
                     "to the next)")
    return Checkpoint(layers=layers, tensors=tensors, format=fmt, meta={"path": where, "notes": notes})
