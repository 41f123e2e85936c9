"""MLX recurrent modules' parameter names (``mlx.nn.LSTM``, ``GRU``, ``RNN``), shared by the MLX family's sniffer
and reader and by the storage family's safetensors sniffer (which declines MLX key sets, so that a file is
claimed once). Light: no numpy, no mlx.

Source: ``mlx/nn/layers/recurrent.py`` (ml-explore/mlx, read at v0.32.4):

* ``LSTM``: ``Wx`` ``(4H, I)``, ``Wh`` ``(4H, H)``, ``bias`` ``(4H,)`` (absent with ``bias=False``); gates
  split ``i, f, g, o`` (``mx.split(ifgo, 4)``).
* ``GRU``: ``Wx`` ``(3H, I)``, ``Wh`` ``(3H, H)``, ``b`` ``(3H,)`` and ``bhn`` ``(H,)`` (both absent with
  ``bias=False``); gates ``r, z, n`` (``x_rz`` then ``x_n``; ``r, z = mx.split(rz, 2)``).
* ``RNN``: ``Wxh`` ``(H, I)``, ``Whh`` ``(H, H)``, ``bias`` ``(H,)``.

Before MLX 0.18.0 (commit c6739ba "Faster RNN layers", 2024-09-17) every weight was stored transposed,
``(in, G*H)`` applied as ``x @ W``: :func:`orientation` tells the two apart from shapes.

A module's parameters are saved (``Module.save_weights``) under its attribute path joined with ``.``
(``layers.0.Wx``, ``encoder.lstm.Wh``; a bare layer saved by itself: ``Wx``).
"""

from __future__ import annotations

#: the parameter names of each MLX module, with and without bias (``mlx/nn/layers/recurrent.py``)
KEYSETS: dict[frozenset[str], tuple[str, bool]] = {
    frozenset({"Wx", "Wh", "bias"}): ("LSTM", True),
    frozenset({"Wx", "Wh", "b", "bhn"}): ("GRU", True),
    frozenset({"Wx", "Wh"}): ("LSTM or GRU", False),  # told apart by Wh's shape (4H or 3H rows)
    frozenset({"Wxh", "Whh", "bias"}): ("RNN", True),
    frozenset({"Wxh", "Whh"}): ("RNN", False),
}
#: every name an MLX recurrent module stores
NAMES = frozenset().union(*KEYSETS)
#: the gate count of each class
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def split(key: str) -> tuple[str, str]:
    """``'enc.lstm.Wx' -> ('enc.lstm', 'Wx')``; ``'Wx' -> ('', 'Wx')``."""
    prefix, _, leaf = key.rpartition(".")
    return prefix, leaf


def join(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def modules(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The MLX recurrent modules among tensors ``name -> shape``: ``{prefix: 'LSTM' | 'GRU' | 'RNN'}``, in
    the order their first tensor appears. A prefix is a module when its direct children are exactly one of
    :data:`KEYSETS` with 2-D weights whose shapes fit the class (``Wh`` ``(G*H, H)`` or ``(H, G*H)``); a
    bias-free ``Wx``/``Wh`` pair is an LSTM when ``Wh`` has 4 times as many rows (or columns) as columns (or
    rows), a GRU at 3 times. Anything else (hand-written ``Wx``/``Wh``/``b`` cells) is no MLX module."""
    children: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        prefix, leaf = split(key)
        children.setdefault(prefix, {})[leaf] = tuple(shape)
    out = {}
    for prefix, kids in children.items():
        kind = KEYSETS.get(frozenset(kids))
        if kind is None:
            continue
        cls = kind[0]
        wh = kids.get("Wh", kids.get("Whh"))
        wx = kids.get("Wx", kids.get("Wxh"))
        if wh is None or wx is None or len(wh) != 2 or len(wx) != 2 or min(wh) <= 0:
            continue
        if cls == "LSTM or GRU":
            cls = next((c for c in ("LSTM", "GRU") if orientation(wh, GATES[c]) is not None), None)
            if cls is None:
                continue
        elif orientation(wh, GATES[cls]) is None:
            continue
        out[prefix] = cls
    return out


def orientation(wh: tuple[int, ...], gates: int) -> str | None:
    """How a recurrent weight of shape ``wh`` is stored for a cell of ``gates`` gates: ``'out_in'``
    (``(G*H, H)``, MLX >= 0.18), ``'in_out'`` (``(H, G*H)``, MLX < 0.18), ``'square'`` (an RNN's ``(H, H)``:
    either), or ``None`` (neither)."""
    a, b = wh
    if gates == 1:
        return "square" if a == b else None
    if a == gates * b:
        return "out_in"
    if b == gates * a:
        return "in_out"
    return None


def prefix(name: str, num_layers: int, k: int) -> str:
    """The module path rnnconvert's MLX writer gives stacked layer ``k`` of layer ``name``: ``name`` itself
    for one layer, ``name.layers.k`` for a stack (a list attribute ``layers`` of MLX modules)."""
    return name if num_layers == 1 else f"{name}.layers.{k}"
