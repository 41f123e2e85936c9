"""Haiku recurrent cores' module and parameter names (``haiku/_src/recurrent.py``, dm-haiku v0.0.17), and which
modules of a parameter tree are cores: shared by the JAX family's sniffer and the Haiku convention
(:mod:`.haiku_params`, which holds the layout and equations). Light: no numpy.

A Haiku tree is ``{module path: {parameter name: array}}``. ``w_i``/``w_h``/``b`` is ``hk.GRU``'s own set (a
core under any module name); ``hk.LSTM`` (``<m>/linear``) and ``hk.VanillaRNN`` (``<m>/linear``,
``<m>/linear_1``) hold ``hk.Linear`` parameters, which any module has, so they are cores only under Haiku's
default names (``lstm``, ``lstm_1``, ``vanilla_rnn``, ...) or where the read option ``cells`` names them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..errors import OptionError

#: the Haiku cores rnnconvert reads, by the name ``cells=`` gives them (Haiku's default module names)
KINDS = ("lstm", "gru", "vanilla_rnn")
#: Haiku's default module names of the cores (``hk.LSTM`` -> ``lstm``, the second one ``lstm_1``)
DEFAULT = re.compile(r"^(lstm|gru|vanilla_rnn)(_\d+)?$")
#: ``hk.GRU``'s own parameter names
GRU_PARAMS = frozenset({"w_i", "w_h", "b"})
LINEAR, LINEAR_1 = "linear", "linear_1"


def split(key: str) -> tuple[str, str] | None:
    """``'lstm/linear/w' -> ('lstm/linear', 'w')`` (also at a last ``.``: ``'lstm/linear.w'``, a walked
    pickle's name); ``None`` without a module part."""
    cut = max(key.rfind("/"), key.rfind("."))
    if cut <= 0 or cut == len(key) - 1:
        return None
    return key[:cut], key[cut + 1:]


def parse_cells(cells: Any) -> dict[str, str]:
    """``cells`` (``"enc:lstm,dec/~/x:vanilla_rnn"``, a list of such items, or a dict) as ``{module: kind}``.

    Raises:
        OptionError: an item that is not ``MODULE:KIND`` with a kind of :data:`KINDS`."""
    if cells is None:
        return {}
    if isinstance(cells, dict):
        items = list(cells.items())
    else:
        parts = cells if isinstance(cells, (list, tuple)) else str(cells).split(",")
        items = [str(p).rpartition(":")[::2] for p in parts if str(p).strip()]
    out = {}
    for mod, kind in items:
        mod, kind = str(mod).strip().replace(".", "/"), str(kind).strip().lower()
        if not mod or kind not in KINDS:
            raise OptionError(f"cells={cells!r}: give MODULE:KIND items, KIND one of {', '.join(KINDS)} "
                              "(e.g. cells=encoder:lstm)")
        out[mod] = kind
    return out


def cores(names: Mapping[str, Any], cells: Any = None) -> dict[str, str]:
    """The recurrent cores among modules (``{module path: its parameter names}``): ``{core path: kind}`` in the
    order of ``names``. A core's path is the module that owns its ``linear``/``linear_1`` (LSTM, VanillaRNN)
    or its ``w_i``/``w_h``/``b`` (GRU; a module under a GRU's name holding some of them is one too, so that
    its reading refuses what else it holds instead of carrying it silently).

    Raises:
        OptionError: a malformed ``cells``, or one naming a module that holds no core's parameters."""
    named = parse_cells(cells)
    out: dict[str, str] = {}
    for mod, params in names.items():
        parent, _, leaf = mod.rpartition("/")
        default = DEFAULT.match(leaf or mod)
        gru_named = named.get(mod) == "gru" or (default is not None and default.group(1) == "gru" and mod not in named)
        if (set(params) == GRU_PARAMS and named.get(mod, "gru") == "gru") or (gru_named and set(params) & GRU_PARAMS):
            out[mod] = "gru"
        elif leaf in (LINEAR, LINEAR_1) and parent:
            kind = named.get(parent)
            if kind is None:
                m = DEFAULT.match(parent.rsplit("/", 1)[-1])
                kind = m.group(1) if m else None
            if kind in ("lstm", "vanilla_rnn"):
                out.setdefault(parent, kind)
    missing = [m for m in named if m not in out]
    if missing:
        raise OptionError(f"cells names {', '.join(missing)}, which hold(s) no Haiku core's parameters "
                          f"(modules: {', '.join(list(names)[:12])})")
    return out
