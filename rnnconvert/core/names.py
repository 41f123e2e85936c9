"""Recognise recurrent weights in tensor containers that use their owner's own names.

Published projects ship RNN weights as plain ``.npz``/``.safetensors``/``.pt``/HDF5 files keyed by their
own names (``encoder_w_ih``, ``dec/Wx``, ``lstm/recurrent_kernel``, ...). This module is the one table of
those names (in the spirit of llama.cpp's ``gguf-py/gguf/tensor_mapping.py``: canonical roles, each
alias with the family that uses it) and the rules that turn a flat ``{name: array}`` into canonical
:class:`~rnnconvert.core.model.RNNLayer` records. Numpy only; readers hand it their tensors
(:func:`recognise`) when their own naming finds no recurrent module, or when the user gives a map.

Roles (canonical names of :mod:`rnnconvert.core.model`): ``w_ih``, ``w_hh``, ``b_ih``, ``b_hh``, ``bias``
(one bias vector ``b_ih + b_hh``, or Keras' ``(2, G*H)`` rows input/recurrent), ``w_hr`` (LSTM
projection), ``peep_i``/``peep_f``/``peep_o`` (LSTM peepholes, ``(H,)`` each).

A tensor name is read as ``[<prefix><sep>]<alias>[_l<k>][_reverse]`` (``<sep>`` one of ``. / : _ -``, a
trailing TensorFlow ``:0`` ignored). In the prefix, a token ``bw``/``bwd``/``backward``/``reverse`` marks
the backward direction (``fw``/``fwd``/``forward`` the forward one) and ``l<k>``/``layer<k>``/``layer_<k>``
the stacked layer ``k``; these tokens are removed and what remains names the layer (``rnn`` when
nothing remains). Tensors of one name form one layer (stacked layers and directions together).

Sizes, cell kind and orientation come from the shapes: ``w_hh`` is ``(G*H, H)`` (``out_in``, applied as
``W h``) or ``(H, G*H)`` (``in_out``, ``h @ U``) with ``G`` = 4 (LSTM), 3 (GRU) or 1 (simple RNN);
``w_ih`` must then have ``G*H`` on the same side. Only a square ``w_hh`` (``G = 1``) with ``I == H``
leaves the orientation open; it is then the family's (:data:`FAMILIES`), or an error.

Gate order: the family's own (:data:`FAMILIES`; PyTorch names -> LSTM ``i f g o``, GRU ``r z n``;
Keras names -> LSTM ``i f c o``, GRU ``z r h``). Names that do not tell a family (``Wx``/``Wh``/``W``/``U``
/``b``, used with many gate orders) need the user to state the gate order (:class:`NameMap`,
``--map gate_order=...``); rnnconvert never guesses it. A GRU's reset variant likewise: PyTorch names
-> ``reset_after`` (PyTorch's equation), Keras names -> from the bias shape (``(2, 3H)`` reset_after,
``(3H,)`` not), other names -> the user says it. A simple RNN's activation is not in any file: ``tanh``
unless ``nonlinearity='relu'`` (the readers' option) or the map's ``activation`` says otherwise.

Errors (:class:`~rnnconvert.errors.FormatError`, one line): two tensors claiming one role of one
layer (both listed), shapes that fit no cell or fit two orientations, an unknown gate order.
What was recognised and how is kept in ``layer.source['recognised']`` and in
``ckpt.meta['recognised']`` (one line per layer), which ``rnnconvert inspect`` prints.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import gates
from ..errors import FormatError, UnrecognisedError
from .model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics

ROLES = ("w_ih", "w_hh", "b_ih", "b_hh", "bias", "w_hr", "peep_i", "peep_f", "peep_o")
#: the map role of a tensor that is not a recurrent weight (carried along as it is)
OTHER = "other"


@dataclass(frozen=True)
class Alias:
    """One tensor-name ending: the canonical ``role`` it stands for and the ``family`` that uses it
    (``None``: the name says nothing about the family, e.g. TF1's peephole names)."""

    name: str
    role: str
    family: str | None
    used_by: str


#: The name table. Case matters (``W``/``w``). Longer names are tried first where two could match.
ALIASES: tuple[Alias, ...] = (
    # PyTorch nn.LSTM/GRU/RNN and nn.*Cell parameter names (torch/nn/modules/rnn.py)
    Alias("weight_ih", "w_ih", "torch", "PyTorch nn.LSTM/GRU/RNN, nn.*Cell"),
    Alias("weight_hh", "w_hh", "torch", "PyTorch nn.LSTM/GRU/RNN, nn.*Cell"),
    Alias("bias_ih", "b_ih", "torch", "PyTorch nn.LSTM/GRU/RNN, nn.*Cell"),
    Alias("bias_hh", "b_hh", "torch", "PyTorch nn.LSTM/GRU/RNN, nn.*Cell"),
    Alias("weight_hr", "w_hr", "torch", "PyTorch nn.LSTM(proj_size)"),
    # the ih/hh vocabulary of PyTorch, abbreviated by projects exporting its weights (numpy dumps, custom cells)
    Alias("w_ih", "w_ih", "torch", "PyTorch weights under abbreviated names (<prefix>_w_ih)"),
    Alias("W_ih", "w_ih", "torch", "PyTorch weights under abbreviated names, PyTorch docs' W_ih"),
    Alias("w_hh", "w_hh", "torch", "PyTorch weights under abbreviated names"),
    Alias("W_hh", "w_hh", "torch", "PyTorch weights under abbreviated names, PyTorch docs' W_hh"),
    Alias("b_ih", "b_ih", "torch", "PyTorch weights under abbreviated names"),
    Alias("b_hh", "b_hh", "torch", "PyTorch weights under abbreviated names"),
    Alias("w_hr", "w_hr", "torch", "PyTorch weights under abbreviated names"),
    Alias("W_hr", "w_hr", "torch", "PyTorch weights under abbreviated names"),
    # Keras LSTM/GRU/SimpleRNN cell variables (tf_keras layers/rnn/*.py, keras 3 src/layers/rnn/*.py)
    Alias("recurrent_kernel", "w_hh", "keras", "Keras/TF2 LSTM, GRU, SimpleRNN cells"),
    Alias("kernel", "w_ih", "keras", "Keras/TF2 LSTM, GRU, SimpleRNN cells"),
    Alias("bias", "bias", "keras", "Keras/TF2 LSTM, GRU, SimpleRNN cells"),
    # names that many hand-written RNNs use with different gate orders (numpy courses: Wx, Wh, b;
    # Theano tutorials: W, U, b): no family, so no gate order without the user's word
    Alias("Wx", "w_ih", None, "hand-written numpy RNNs (x @ Wx)"),
    Alias("Wh", "w_hh", None, "hand-written numpy RNNs (h @ Wh)"),
    Alias("W", "w_ih", None, "Theano-style RNNs (W input, U recurrent)"),
    Alias("U", "w_hh", None, "Theano-style RNNs (W input, U recurrent)"),
    Alias("b", "bias", None, "hand-written and Theano-style RNNs"),
    # TF1 LSTMCell(use_peepholes=True) diagonal peephole weights (rnn_cell_impl.py)
    Alias("w_i_diag", "peep_i", None, "TF1 LSTMCell peepholes"),
    Alias("w_f_diag", "peep_f", None, "TF1 LSTMCell peepholes"),
    Alias("w_o_diag", "peep_o", None, "TF1 LSTMCell peepholes"),
)


@dataclass(frozen=True)
class Family:
    """What a family's names imply: gate order per cell (canonical letters), orientation, GRU variant."""

    name: str
    gate_order: dict[Cell, str]
    orientation: str
    reset_after: str  # "true", "from_bias" (Keras: (2, 3H) bias -> True) or "unknown"
    source: str


#: Family facts, each from :data:`rnnconvert.gates.TABLE` (one place for each layout fact).
FAMILIES: dict[str, Family] = {
    "torch": Family("torch", {c: gates.convention("torch", c).gate_order for c in Cell}, "out_in", "true",
                    gates.convention("torch", Cell.LSTM).source),
    "keras": Family("keras", {c: gates.convention("keras", c).gate_order for c in Cell}, "in_out", "from_bias",
                    gates.convention("keras", Cell.LSTM).source),
}

_SEP = r"[._/:\-]"
_ALIAS_RE = re.compile(
    r"^(?:(?P<pre>.*?)" + _SEP + r")??(?P<alias>"
    + "|".join(re.escape(a.name) for a in sorted(ALIASES, key=lambda a: -len(a.name)))
    + r")(?:_l(?P<k>\d+))?(?P<rev>_reverse)?$")
_BY_NAME = {a.name: a for a in ALIASES}
_DIR_RE = re.compile(r"(?:^|" + _SEP + r")(?P<tok>bw|bwd|backward|reverse|fw|fwd|forward)(?=" + _SEP + r"|$)")
_LAYER_RE = re.compile(r"(?:^|" + _SEP + r")(?:l|layer|layer_)(?P<k>\d+)(?=" + _SEP + r"|$)")
_ROLE_RE = re.compile(r"^(?:(?P<group>.+)\.)?(?P<role>" + "|".join(sorted((*ROLES, OTHER), key=len, reverse=True))
                      + r")(?:_l(?P<k>\d+))?(?P<rev>_reverse)?$")
#: gate letters people use for the canonical ones (Keras c, TF1 j for g; TF1 u for z; Keras h for n)
_LETTER = {Cell.LSTM: {"c": "g", "j": "g"}, Cell.GRU: {"u": "z", "h": "n"}}


@dataclass
class NameMap:
    """What the user says that no name rule can know (``--map``; API keyword ``map``).

    Attributes:
        rules: ``(pattern, role)`` pairs. ``pattern`` is a glob over tensor names (``*`` any text, ``?``
            one character); ``role`` is ``[LAYER.]ROLE[_l<k>][_reverse]`` with ``ROLE`` one of
            :data:`ROLES`, or ``other`` (not a recurrent weight: carried along as it is). Without ``LAYER``
            the layer is named by the text the pattern's wildcards matched (joined with ``.``), or ``rnn``
            when it has none. The first matching rule wins;
            tensors no rule matches go through the name table.
        gate_order: the stored gate order in canonical letters (LSTM ``i f g o`` -- ``c``/``j`` accepted
            for ``g``; GRU ``r z n`` -- ``u`` for ``z``, ``h`` for ``n``), e.g. ``ifog``; ``None``: the family's.
        orientation: ``out_in`` (``(G*H, in)``, ``W x``) or ``in_out`` (``(in, G*H)``, ``x @ W``); ``None``:
            from the shapes.
        cell: ``LSTM``, ``GRU``, ``RNN_TANH`` or ``RNN_RELU``; ``None``: from the shapes.
        reset_after: GRU variant (:class:`~rnnconvert.core.model.Semantics`); ``None``: the family's.
        activation, gate_activation: override the cell's defaults (``tanh``; ``sigmoid``).
        layers: the same options for one layer only (by the name rnnconvert gives it, as ``inspect``
            shows), over the ones above: ``{"decoder": NameMap(gate_order="rzn")}``.
    """

    rules: list[tuple[str, str]] = field(default_factory=list)
    gate_order: str | None = None
    orientation: str | None = None
    cell: str | None = None
    reset_after: bool | None = None
    activation: str | None = None
    gate_activation: str | None = None
    layers: dict[str, "NameMap"] = field(default_factory=dict)

    def for_layer(self, name: str) -> "NameMap":
        """The options that hold for layer ``name``: its own (:attr:`layers`) over the global ones."""
        own = self.layers.get(name)
        if own is None:
            return self
        merged = {k: getattr(own, k) if getattr(own, k) is not None else getattr(self, k) for k in _OPTION_KEYS}
        return NameMap(rules=self.rules, **merged)

    def __post_init__(self) -> None:
        for pat, role in self.rules:
            if not _ROLE_RE.match(role):
                raise FormatError(f"map: '{pat}={role}': role must be [LAYER.]ROLE[_l<k>][_reverse] with ROLE one "
                                  f"of {', '.join(ROLES)}")
        if self.orientation not in (None, "out_in", "in_out"):
            raise FormatError(f"map: orientation '{self.orientation}' must be out_in (W x) or in_out (x @ W)")
        if self.cell is not None and self.cell.upper() not in {c.value for c in Cell}:
            raise FormatError(f"map: cell '{self.cell}' must be one of {', '.join(c.value for c in Cell)}")
        from .model import ACTIVATIONS

        for key in ("activation", "gate_activation"):
            v = getattr(self, key)
            if v is not None and v not in ACTIVATIONS:
                raise FormatError(f"map: {key} '{v}' must be one of {', '.join(ACTIVATIONS)}")

    def role_of(self, name: str) -> tuple[str, str, int | None, bool] | None:
        """``(layer, role, k, reverse)`` of the first rule whose pattern matches ``name``, else ``None``."""
        if len(name) > MAX_NAME:
            return None
        for pat, spec in self.rules:
            m = _glob(pat).fullmatch(name)
            if m is None:
                continue
            r = _ROLE_RE.match(spec)
            group = r.group("group") or ".".join(g for g in m.groups() if g) or "rnn"
            return group, r.group("role"), None if r.group("k") is None else int(r.group("k")), bool(r.group("rev"))
        return None


def _glob(pat: str) -> re.Pattern:
    out = []
    for ch in pat:
        out.append("(.*)" if ch == "*" else "(.)" if ch == "?" else re.escape(ch))
    return re.compile("".join(out))


_OPTION_KEYS = ("gate_order", "orientation", "cell", "reset_after", "activation", "gate_activation")


def _bool(v: Any, key: str) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("true", "1", "yes"):
        return True
    if str(v).lower() in ("false", "0", "no"):
        return False
    raise FormatError(f"map: {key} must be true or false, not {v!r}")


def _options(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    opts: dict[str, Any] = {k: d[k] for k in _OPTION_KEYS if d.get(k) is not None}
    if "reset_after" in opts:
        opts["reset_after"] = _bool(opts["reset_after"], "reset_after")
    for k, v in opts.items():
        if k != "reset_after" and not isinstance(v, str):
            raise FormatError(f"{where}: {k} must be a string")
    return opts


def _from_dict(d: Mapping[str, Any], where: str, top: bool = True) -> NameMap:
    keys = {"tensors", "layers", *_OPTION_KEYS} if top else set(_OPTION_KEYS)
    unknown = set(d) - keys
    if unknown:
        raise FormatError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; known: "
                          f"{', '.join(sorted(keys))}")
    layers = d.get("layers", {})
    if not isinstance(layers, Mapping) or not all(isinstance(v, Mapping) for v in layers.values()):
        raise FormatError(f"{where}: 'layers' must map layer names to tables of options")
    per = {str(k): _from_dict(v, f"{where}: layers.{k}", top=False) for k, v in layers.items()}
    tensors = d.get("tensors", {})
    if not isinstance(tensors, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in tensors.items()):
        raise FormatError(f"{where}: 'tensors' must map name patterns to roles (strings)")
    return NameMap(rules=list(tensors.items()), layers=per, **_options(d, where))


def parse_map(spec: Any) -> NameMap | None:
    """A :class:`NameMap` from what a user gives: ``None``; a ``NameMap``; a dict (the file's content);
    a path to a ``.json``/``.toml`` file; or a list of such paths and ``PATTERN=ROLE`` /
    ``gate_order=ifog`` / ``orientation=in_out`` / ``cell=GRU`` / ``reset_after=false`` items, merged in
    order. File content: ``{"tensors": {PATTERN: ROLE, ...}, "gate_order": ..., "orientation": ...,
    "cell": ..., "reset_after": ..., "activation": ..., "gate_activation": ...}`` (all optional).

    Raises:
        FormatError: an unreadable file, an unknown key, a malformed item or role.
    """
    if spec is None or isinstance(spec, NameMap):
        return spec
    if isinstance(spec, Mapping):
        return _from_dict(spec, "map")
    items = [spec] if isinstance(spec, (str, Path)) else list(spec)
    rules: list[tuple[str, str]] = []
    opts: dict[str, Any] = {}
    per: dict[str, dict[str, Any]] = {}
    for item in items:
        text = str(item)
        if isinstance(item, Path) or (("=" not in text) and text.lower().endswith((".json", ".toml"))):
            sub = _from_dict(_load_file(Path(text)), text)
            rules += sub.rules
            opts.update({k: getattr(sub, k) for k in _OPTION_KEYS if getattr(sub, k) is not None})
            for lname, lm in sub.layers.items():
                per.setdefault(lname, {}).update({k: getattr(lm, k) for k in _OPTION_KEYS
                                                  if getattr(lm, k) is not None})
            continue
        pat, sep, role = text.rpartition("=")
        if not sep or not pat or not role:
            raise FormatError(f"map: '{text}' is neither PATTERN=ROLE, OPTION=VALUE nor a .json/.toml file")
        pat, role = pat.strip(), role.strip()
        lname, dot, key = pat.rpartition(".")
        if pat in _OPTION_KEYS:
            opts.update(_options({pat: role}, "map"))
        elif dot and key in _OPTION_KEYS:  # LAYER.gate_order=rzn: one layer's option
            per.setdefault(lname, {}).update(_options({key: role}, "map"))
        else:
            rules.append((pat, role))
    return NameMap(rules=rules, layers={k: NameMap(**v) for k, v in per.items()}, **opts)


def _load_file(p: Path) -> dict:
    try:
        if p.stat().st_size > 1 << 20:
            raise FormatError(f"{p}: a name map larger than 1 MiB; refused")
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(f"{p}: cannot read the name map ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise FormatError(f"{p}: the name map is not UTF-8 text") from exc
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            d = tomllib.loads(text)
        else:
            d = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise FormatError(f"{p}: not a valid {p.suffix[1:].upper()} name map ({exc})") from exc
    if not isinstance(d, dict):
        raise FormatError(f"{p}: a name map must be an object/table")
    return d


@dataclass
class _Hit:
    name: str
    layer: str
    role: str
    k: int
    rev: bool
    rule: str          # the alias or map rule that matched
    family: str | None


MAX_NAME = 1024


def classify(name: str) -> _Hit | None:
    """Where the name table puts tensor ``name``: ``_Hit(layer, role, k, reverse, rule, family)`` or ``None``
    (also for names longer than :data:`MAX_NAME`, which no framework writes: the matching stays linear)."""
    if len(name) > MAX_NAME:
        return None
    base = re.sub(r":\d+$", "", name)
    m = _ALIAS_RE.match(base)
    if m is None:
        return None
    alias = _BY_NAME[m.group("alias")]
    pre = m.group("pre") or ""
    k = int(m.group("k")) if m.group("k") is not None else None
    rev = bool(m.group("rev"))
    for d in list(_DIR_RE.finditer(pre)):
        rev = rev or d.group("tok") in ("bw", "bwd", "backward", "reverse")
    pre = _DIR_RE.sub("", pre)
    lk = list(_LAYER_RE.finditer(pre))
    if lk:
        if k is not None or len(lk) > 1:
            raise FormatError(f"tensor '{name}': more than one stacked-layer index in its name")
        k = int(lk[0].group("k"))
        pre = _LAYER_RE.sub("", pre)
    pre = re.sub(_SEP + r"{2,}", lambda s: s.group(0)[0], pre).strip("._/:-")
    return _Hit(name, pre or "rnn", alias.role, k or 0, rev, alias.name, alias.family)


def _shape_options(w_hh: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """``(orientation, H, G)`` readings of a recurrent matrix's shape."""
    if len(w_hh) != 2:
        return []
    a, b = w_hh
    out = []
    for g in (4, 3, 1):
        if b and a == g * b:
            out.append(("out_in", b, g))
        if a and b == g * a:
            out.append(("in_out", a, g))
    return list(dict.fromkeys(out))


def _order(nm: NameMap | None, cell: Cell, family: str | None, layer: str, where: str) -> tuple[str, str]:
    """The stored gate order (canonical letters) of ``layer`` and where it comes from."""
    canon = gates.CANONICAL[cell]
    if nm is not None and nm.gate_order:
        want = "".join(_LETTER.get(cell, {}).get(ch, ch) for ch in nm.gate_order.replace(" ", "").lower())
        if sorted(want) != sorted(canon):
            raise FormatError(f"map: gate_order '{nm.gate_order}' is not an order of the {cell.value} gates "
                              f"{' '.join(canon)}")
        return want, "--map gate_order"
    if len(canon) == 1:
        return canon, "one gate block"
    if family is None:
        raise FormatError(f"{where}: layer '{layer}': its tensor names do not tell the gate order of this {cell.value} "
                          f"(they are used with several); say it with --map gate_order=... (in {cell.value} "
                          f"letters {' '.join(canon)}, e.g. gate_order={canon})")
    return FAMILIES[family].gate_order[cell], f"{family} family default"


def recognise(tensors: Mapping[str, np.ndarray], where: str, fmt: str, *, map: Any = None,
              nonlinearity: str = "tanh", strict: bool = True) -> Checkpoint:
    """Group the tensors of a foreign container into canonical recurrent layers.

    Args:
        tensors: ``{name: array}`` (numpy arrays of any float dtype, kept as they are; a
            :func:`~rnnconvert.core.model.placeholder` would do for the shapes but the result is eager).
        where: the file, for messages. fmt: the format name recorded in the checkpoint.
        map: a :class:`NameMap` or anything :func:`parse_map` takes.
        nonlinearity: ``tanh``/``relu``: a simple RNN's activation, which no file stores.
        strict: ``False`` (the tensors a reader's own naming left over): a group of names that cannot be
            read as a layer stays among the other tensors, with a line in ``meta['recognised']`` saying
            why, and finding no layer is no error.

    Returns:
        a :class:`~rnnconvert.core.model.Checkpoint` with the recognised layers (canonical gate order,
        ``out_in``; bit-exact permutations/transposes of the stored arrays) and every other tensor in
        ``tensors``; ``meta['recognised']`` says per layer which rules, orientation and gate order were used.

    Raises:
        FormatError: no recurrent weights found, ambiguity (the candidates listed), shapes that fit no
            cell, an unknown gate order or GRU variant (with the ``--map`` item that settles it).
    """
    nm = parse_map(map)
    slots: dict[str, dict[int, dict[bool, dict[str, _Hit]]]] = {}
    clash: dict[str, str] = {}  # layer -> why it cannot be read (strict=False)
    for name in tensors:
        hit = None
        if nm is not None:
            r = nm.role_of(name)
            if r is not None:
                hit = _Hit(name, r[0], r[1], r[2] or 0, r[3], "--map", None)
        if hit is None:
            try:
                hit = classify(name)
            except FormatError:
                if strict:
                    raise
                continue
        if hit is None or hit.role == "other":
            continue
        if getattr(getattr(tensors[name], "dtype", None), "kind", "") != "f":  # a step counter, a vocabulary
            continue
        slot = slots.setdefault(hit.layer, {}).setdefault(hit.k, {}).setdefault(hit.rev, {})
        if hit.role in slot:
            other = slot[hit.role]
            msg = (f"ambiguous names: '{other.name}' (rule {other.rule}) and '{hit.name}' (rule {hit.rule}) both "
                   f"read as {hit.role} of layer '{hit.layer}'{f' l{hit.k}' if hit.k else ''}"
                   f"{' reverse' if hit.rev else ''}; say which is which with --map PATTERN=ROLE")
            if strict:
                raise FormatError(f"{where}: {msg}")
            clash.setdefault(hit.layer, msg)
            continue
        slot[hit.role] = hit
    ckpt = Checkpoint(format=fmt, meta={"path": where, "recognised": []})
    used: set[str] = set()
    for lname, layers in slots.items():
        first = layers.get(0, {}).get(False, {})
        mapped = any(h.rule == "--map" for ks in layers.values() for d in ks.values() for h in d.values())
        if "w_hh" not in first or "w_ih" not in first:
            if mapped:
                have = sorted({h.name for ks in layers.values() for d in ks.values() for h in d.values()})
                raise FormatError(f"{where}: layer '{lname}' (from --map) needs w_ih and w_hh of its first "
                                  f"forward layer; it has {', '.join(have)}")
            continue  # not a recurrent layer (a Dense W/b, an embedding kernel): carried along
        try:
            if lname in clash:
                raise FormatError(f"{where}: {clash[lname]}")
            layer = _build(lname, layers, tensors, where, fmt, nm, nonlinearity)
        except FormatError as exc:
            if strict:
                some = next(h.name for ks in layers.values() for d in ks.values() for h in d.values())
                raise FormatError(f"{exc} (if '{lname}' is no recurrent layer, mark its tensors with --map "
                                  f"'{some}=other')") from exc
            ckpt.meta["recognised"].append(f"{lname}: not read as a recurrent layer: "
                                           f"{str(exc).removeprefix(where + ': ')}")
            continue
        ckpt.layers.append(layer)
        ckpt.meta["recognised"].append(layer.source["recognised"]["line"])
        used.update(h.name for ks in layers.values() for d in ks.values() for h in d.values())
    if not ckpt.layers and strict:
        raise unrecognised(f"{where}: no recurrent weights recognised (neither PyTorch names nor any name of the "
                           "foreign-name table: w_ih/w_hh, weight_ih/weight_hh, kernel/recurrent_kernel, Wx/Wh, W/U, "
                           "...); name them with --map PATTERN=ROLE (docs/foreign-names.md)", tensors)
    return replace(ckpt, tensors={k: v for k, v in tensors.items() if k not in used})


def _build(lname: str, layers: dict, tensors: Mapping[str, np.ndarray], where: str, fmt: str,
           nm: NameMap | None, nonlinearity: str) -> RNNLayer:
    nm = nm.for_layer(lname) if nm is not None else None
    hits = [h for ks in layers.values() for d in ks.values() for h in d.values()]
    # the family: the one family of every weight/bias name (a --map rule or a family-less name: none)
    fams = {h.family for h in hits if not h.role.startswith("peep")}
    family = next(iter(fams)) if len(fams) == 1 else None
    first = layers[0][False]
    w_hh0, w_hr0 = tensors[first["w_hh"].name], first.get("w_hr")
    # --- sizes, cell and orientation from the shapes
    proj = 0
    if w_hr0 is not None:
        w_hr_shape = tensors[w_hr0.name].shape
        orient0 = (nm.orientation if nm and nm.orientation else
                   FAMILIES[family].orientation if family else None)
        if orient0 is None or len(w_hr_shape) != 2:
            raise FormatError(f"{where}: layer '{lname}': a projection '{w_hr0.name}' needs a known orientation; "
                              "pass --map orientation=out_in|in_out")
        P, H = w_hr_shape if orient0 == "out_in" else w_hr_shape[::-1]
        gh = w_hh0.shape[0] if orient0 == "out_in" else (w_hh0.shape[1] if w_hh0.ndim == 2 else 0)
        cands = [(orient0, H, gh // H)] if H and gh % H == 0 and gh // H == 4 else []
        proj = P
    else:
        cands = _shape_options(tuple(w_hh0.shape))
    w_ih0 = tensors[first["w_ih"].name]
    cands = [c for c in cands if w_ih0.ndim == 2 and w_ih0.shape[0 if c[0] == "out_in" else 1] == c[1] * c[2]]
    if nm and nm.cell:
        want = Cell(nm.cell.upper()).gates
        cands = [c for c in cands if c[2] == want]
    if not cands:
        raise FormatError(f"{where}: layer '{lname}': '{first['w_ih'].name}' {tuple(w_ih0.shape)} and "
                          f"'{first['w_hh'].name}' {tuple(w_hh0.shape)} fit no LSTM/GRU/RNN "
                          "(w_hh must be (G*H, H) or (H, G*H), G = 4, 3 or 1, w_ih with G*H on the same side)")
    orient_how = "from the shapes"
    if nm and nm.orientation:
        cands = [c for c in cands if c[0] == nm.orientation]
        orient_how = "--map orientation"
        if not cands:
            raise FormatError(f"{where}: layer '{lname}': the shapes {tuple(w_ih0.shape)}, {tuple(w_hh0.shape)} do "
                              f"not fit --map orientation={nm.orientation}")
    elif len(cands) > 1 and family is not None:
        cands = [c for c in cands if c[0] == FAMILIES[family].orientation]
        orient_how = f"{family} family default (square shapes fit both)"
    if len(cands) > 1:
        listing = "; ".join(f"{o} H={h} G={g}" for o, h, g in cands)
        raise FormatError(f"{where}: layer '{lname}': the shapes fit several readings ({listing}); "
                          "say which with --map orientation=out_in|in_out")
    orientation, H, G = cands[0]
    cell = {4: Cell.LSTM, 3: Cell.GRU}.get(G, Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH)
    if nm and nm.cell:
        cell = Cell(nm.cell.upper())
    order, order_how = _order(nm, cell, family, lname, where)
    # --- GRU variant
    reset_after, ra_how = True, ""
    if cell is Cell.GRU:
        bias_shapes = {h.role: tensors[h.name].shape for h in first.values()}
        if nm and nm.reset_after is not None:
            reset_after, ra_how = nm.reset_after, "--map reset_after"
        elif family is not None and FAMILIES[family].reset_after == "true":
            reset_after, ra_how = True, f"{family} family"
        elif family is not None and FAMILIES[family].reset_after == "from_bias" and "bias" in bias_shapes:
            reset_after = len(bias_shapes["bias"]) == 2
            ra_how = f"{family} family, bias shape {tuple(bias_shapes['bias'])}"
        else:
            raise FormatError(f"{where}: layer '{lname}': the names do not tell this GRU's reset variant; "
                              "say it with --map reset_after=true|false (true: r * (W_hn h + b_hn), PyTorch; "
                              "false: W_hn (r * h), Keras reset_after=False)")
    conv = gates.Convention(order, orientation, "double", f"rnnconvert.core.names ({order_how})")
    gh = G * H
    # --- every stacked layer and direction
    nl = 1 + max(layers)
    bidi = any(True in d for d in layers.values())
    params, names_used = [], {}
    has_bias = False
    for k in range(nl):
        row = []
        for rev in ([False, True] if bidi else [False]):
            slot = layers.get(k, {}).get(rev)
            tag = f"l{k}{' reverse' if rev else ''}"
            if not slot or "w_ih" not in slot or "w_hh" not in slot:
                raise FormatError(f"{where}: layer '{lname}': no w_ih/w_hh for stacked layer {k}"
                                  f"{' (backward)' if rev else ''} (found: {', '.join(sorted(h.name for h in hits))})")
            arr = {role: tensors[h.name] for role, h in slot.items()}
            names_used[tag] = {role: h.name for role, h in slot.items()}
            try:
                row.append(_direction(arr, cell, conv, gh))
            except ValueError as exc:
                raise FormatError(f"{where}: layer '{lname}' {tag}: {exc}") from exc
            has_bias = has_bias or any(r in arr for r in ("b_ih", "b_hh", "bias"))
        params.append(row)
    act = {Cell.RNN_RELU: "relu"}.get(cell, "tanh")
    sem = Semantics(gate_activation=(nm.gate_activation if nm and nm.gate_activation else "sigmoid"),
                    activation=(nm.activation if nm and nm.activation else act), reset_after=reset_after)
    rules = sorted({h.rule for h in hits})
    line = (f"{lname}: {cell.value} H={H}{f' P={proj}' if proj else ''}, {nl} layer(s)"
            f"{', bidirectional' if bidi else ''}"
            f" -- names {', '.join(rules)} ({'family ' + family if family else 'no family'}); "
            f"orientation {orientation} ({orient_how}); gate order {' '.join(order)} ({order_how})"
            + (f"; reset_after {reset_after} ({ra_how})" if cell is Cell.GRU else "")
            + (f"; activation {sem.activation} (not stored in the file)" if G == 1 else ""))
    try:
        return RNNLayer(name=lname, cell=cell, input_size=params[0][0].w_ih.shape[1], hidden_size=H,
                        num_layers=nl, bidirectional=bidi, proj_size=proj, bias=has_bias, semantics=sem,
                        params=params, source={"format": fmt, "class_name": f"foreign names ({family or 'no family'})",
                                               "recognised": {"line": line, "family": family, "rules": rules,
                                                              "orientation": orientation, "gate_order": order,
                                                              "tensors": names_used}})
    except ValueError as exc:
        raise FormatError(f"{where}: layer '{lname}': {exc}") from exc


def _direction(arr: dict[str, np.ndarray], cell: Cell, conv: gates.Convention, gh: int) -> DirectionParams:
    """Canonical parameters of one direction from its arrays by role, stored under ``conv`` (only
    transposes and block permutations: bit-exact). Raises ``ValueError`` on a shape that does not fit."""
    def mat(role: str) -> np.ndarray:
        m = np.asarray(arr[role])
        if m.ndim != 2:
            raise ValueError(f"{role} has shape {m.shape}, not a matrix")
        return gates.to_canonical(m, conv, cell)

    def vec(v: np.ndarray, what: str) -> np.ndarray:
        v = np.asarray(v)
        if v.shape != (gh,):
            raise ValueError(f"{what} has shape {v.shape}, expected ({gh},)")
        return gates.vec_to_canonical(v, conv, cell)

    w_ih, w_hh = mat("w_ih"), mat("w_hh")
    zeros = np.zeros(gh, dtype=w_ih.dtype)
    b_ih = vec(arr["b_ih"], "b_ih") if "b_ih" in arr else None
    b_hh = vec(arr["b_hh"], "b_hh") if "b_hh" in arr else None
    if "bias" in arr:
        if b_ih is not None or b_hh is not None:
            raise ValueError("both a single bias and b_ih/b_hh")
        b = np.asarray(arr["bias"])
        if b.shape == (2, gh):  # Keras GRU reset_after: row 0 input, row 1 recurrent (gates.TABLE keras_ra)
            b_ih, b_hh = vec(b[0], "bias[0]"), vec(b[1], "bias[1]")
        elif b.shape == (2 * gh,):
            raise ValueError(f"bias of shape {b.shape} may be input+recurrent or something else; name its halves "
                             "b_ih/b_hh with --map")
        else:
            b_ih = vec(b, "bias")
    w_hr = None
    if "w_hr" in arr:
        m = np.asarray(arr["w_hr"])
        w_hr = np.ascontiguousarray(m if conv.orientation == "out_in" else m.T)
    peep = None
    if any(r in arr for r in ("peep_i", "peep_f", "peep_o")):
        if cell is not Cell.LSTM or not all(r in arr for r in ("peep_i", "peep_f", "peep_o")):
            raise ValueError("peepholes need an LSTM and all three of peep_i, peep_f, peep_o")
        peep = np.stack([np.asarray(arr[r]).reshape(-1) for r in ("peep_i", "peep_f", "peep_o")])
    return DirectionParams(w_ih, w_hh, zeros if b_ih is None else b_ih, zeros.copy() if b_hh is None else b_hh,
                           w_hr, peep)


def fallback(tensors: Mapping[str, np.ndarray], where: str, fmt: str, opts: Mapping[str, Any]) -> Checkpoint:
    """What a reader calls when its own naming found no recurrent module, or the user gave a map:
    :func:`recognise` with the reader options ``map`` and ``nonlinearity``."""
    return recognise(tensors, where, fmt, map=opts.get("map"), nonlinearity=opts.get("nonlinearity") or "tanh")


def candidates(tensors: Mapping[str, Any]) -> bool:
    """Whether some name of ``tensors`` is in the table (a recurrent weight may hide among them)."""
    def known(k: str) -> bool:
        try:
            return classify(k) is not None
        except FormatError:
            return False

    return any(known(k) for k in tensors)


def add_rest(ckpt: Checkpoint, where: str, fmt: str, nonlinearity: str = "tanh") -> Checkpoint:
    """Read the tensors a reader's own naming left in ``ckpt.tensors`` through the table too
    (``strict=False``): a hand-written cell beside ``nn.LSTM`` modules in one file. Recognised layers are
    appended (``ckpt`` must be eager), their tensors leave ``ckpt.tensors``; ``meta['recognised']`` gets
    the lines. Returns a new checkpoint (``ckpt`` itself when nothing is recognised; ``ckpt`` is not
    changed)."""
    if not candidates(ckpt.tensors):
        return ckpt
    rest = recognise(ckpt.tensors, where, fmt, nonlinearity=nonlinearity, strict=False)
    if rest.layers or rest.meta["recognised"]:
        meta = {**ckpt.meta, "recognised": [*ckpt.meta.get("recognised", []), *rest.meta["recognised"]]}
        return replace(ckpt, layers=[*ckpt.layers, *rest.layers], tensors=rest.tensors, meta=meta)
    return ckpt


#: how many tensors an :class:`~rnnconvert.errors.UnrecognisedError` lists (the CLI shows fewer)
LISTED = 200

_MAP_UNSAFE = re.compile(r"[=\s'\"*?\[\]]")


def listing(tensors: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """``[(name, shape, dtype)]`` of the first :data:`LISTED` entries of ``tensors`` (arrays or placeholders:
    anything with ``shape`` and ``dtype``; a record without them is listed with ``()`` and ``'?'``); names cut
    to :data:`MAX_NAME` characters."""
    out = []
    for name, v in tensors.items():
        if len(out) >= LISTED:
            break
        shape = tuple(int(d) for d in getattr(v, "shape", ()) or ())
        dt = getattr(v, "dtype", None)
        out.append((str(name)[:MAX_NAME], shape, str(np.dtype(dt)) if dt is not None else "?"))
    return out


def suggest_map(tensors: list[tuple[str, tuple[int, ...], str]]) -> list[str]:
    """``--map`` items (``PATTERN=ROLE``, ``gate_order=...``) a user can start from, read from shapes alone:
    per group of floating-point tensors sharing a prefix (the name up to its last ``. / : _ -``), a 2-D tensor
    whose shape reads as a recurrent matrix (``(G*H, H)`` or ``(H, G*H)``, G = 4, 3, 1: :func:`_shape_options`)
    is ``w_hh``, another 2-D tensor with ``G*H`` on the same side ``w_ih``, 1-D tensors of ``G*H`` ``b_ih`` then
    ``b_hh`` (one alone: ``bias``); groups without such a pair are left out; where shapes fit several cells,
    the first of LSTM, GRU, simple RNN is taken. The gate order is in no file (docs/foreign-names.md): for
    G = 4 or 3 a ``LAYER.gate_order=`` item with PyTorch's order (``ifgo``, ``rzn``) is added, to be checked.
    Never applied by rnnconvert: the CLI prints it after the tensors of an :class:`UnrecognisedError`."""
    groups: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, shape, dtype in tensors:
        if not (dtype.startswith(("float", "bfloat")) or dtype == "?") or _MAP_UNSAFE.search(name):
            continue
        m = re.match(r"^(?P<pre>.*)" + _SEP + r"[^._/:\-]*$", name)
        groups.setdefault(m.group("pre") if m else "", []).append((name, shape))
    items: list[str] = []
    for pre, members in groups.items():
        mats = [(n, sh) for n, sh in members if len(sh) == 2]
        readings = sorted(((-g, i, n_hh, orient, h, g) for i, (n_hh, sh_hh) in enumerate(mats)
                           for orient, h, g in _shape_options(sh_hh)))  # LSTM first, then GRU, then RNN
        found = None
        for _, _, n_hh, orient, h, g in readings:
            side = 0 if orient == "out_in" else 1
            ih = [n for n, sh in mats if n != n_hh and sh[side] == g * h]
            if len(ih) == 1:
                found = (n_hh, ih[0], g * h, g)
                break
        if found is None:
            continue
        n_hh, n_ih, gh, g = found
        layer = re.sub(r"[^A-Za-z0-9_]", "_", pre).strip("_") or "rnn"
        items += [f"{n_ih}={layer}.w_ih", f"{n_hh}={layer}.w_hh"]
        biases = [n for n, sh in members if sh in ((gh,), (2, gh))]
        if len(biases) == 1:
            items.append(f"{biases[0]}={layer}.bias")
        elif len(biases) == 2:
            items += [f"{biases[0]}={layer}.b_ih", f"{biases[1]}={layer}.b_hh"]
        if g > 1:
            items.append(f"{layer}.gate_order=" + ("ifgo" if g == 4 else "rzn"))
    return items


def unrecognised(message: str, tensors: Mapping[str, Any], *, suggest: bool = True) -> UnrecognisedError:
    """The :class:`~rnnconvert.errors.UnrecognisedError` of a file whose ``tensors`` (name -> array or
    placeholder, in the file's order) hold no recurrent weight rnnconvert recognises: ``message`` with their
    :func:`listing` and, when the format's reader takes ``map`` (``suggest``), :func:`suggest_map`."""
    listed = listing(tensors)
    return UnrecognisedError(message, tensors=listed, total=len(tensors),
                             suggested_map=suggest_map(listed) if suggest else [])
