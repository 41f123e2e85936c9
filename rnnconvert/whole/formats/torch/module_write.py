"""``--emit-module``: a whole Keras model as readable ``torch.nn.Module`` source plus its state dict (issue #30).

Built from the same :class:`rnnconvert.whole.conventions.keras_graph.Graph` as the ``.pt2`` program
(:mod:`.pt2_write`) and the ONNX graph, so the three follow one description of the model. Nothing here runs
the source it writes (verification imports it: :func:`rnnconvert.whole.runtimes.torch_export.verify_module`).

The written file holds one class ``Model(nn.Module)``: every layer with weights is an attribute named after
its Keras layer (path sanitised to a Python identifier; a clash with an ``nn.Module`` attribute, class or instance
(``forward``, ``state_dict``, ``to``, ``eval``, ``training``...: :func:`module_attributes`), a keyword or another layer
gets a ``_`` or ``_<k>`` suffix, a name starting ``__`` (which Python would mangle) a ``layer`` prefix),
``forward`` takes the model inputs positionally (token ids for an input feeding an ``Embedding``, float32
otherwise) and follows the Keras graph call by call; it returns the one output, or a tuple of the outputs in the
model's order. Layers (tf_keras 2.21 ``layers/``):

* ``Dense`` / ``TimeDistributed(Dense)`` -> ``nn.Linear`` (weight = Keras ``kernel`` ``(in, out)`` transposed);
  ``Embedding`` -> ``nn.Embedding``; ``Conv1D`` -> ``nn.Conv1d`` on channels-first (weight = ``kernel``
  ``(k, in, out)`` permuted to ``(out, in, k)``; ``same``/``causal`` padding as an explicit ``F.pad``);
  ``BatchNormalization`` -> ``nn.BatchNorm1d`` (``momentum = 1 - keras momentum``; a missing gamma/beta is
  stored as ones/zeros); ``LayerNormalization`` -> ``nn.LayerNorm``; ``Dropout`` -> ``nn.Dropout``; noise
  layers are the identity (at inference they are in tf_keras too).
* ``LSTM`` / ``GRU`` / ``SimpleRNN`` / ``Bidirectional`` -> ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``
  (``batch_first=True``) where torch.nn computes the cell (:func:`rnnconvert.conventions.torch_state.refusals`
  empty but for ``go_backwards``, which reads a flipped input); a Keras mask through ``masked_run`` (written in
  the same file: each row's unmasked steps moved together in order, run packed to their count, the outputs put
  back per step: a masked step keeps the state (tf_keras ``backend.rnn``), so this is exact for padding anywhere;
  a unidirectional layer's output there is the previous output, a Bidirectional's zero); otherwise
  ``KerasRecurrent``, a small class in the same file computing the Keras equations step by step, both directions
  in one loop (one batched product a step, the input products of all steps before it; Keras 2 ``hard_sigmoid`` =
  ``clip(0.2 x + 0.5, 0, 1)``, reset-before GRU, ``go_backwards``, masks as above). Both take the same
  state-dict keys in torch.nn's names and gate order (``weight_ih_l0`` ``(G*H, I)``, ``weight_hh_l0``,
  ``bias_ih_l0``, ``bias_hh_l0``, ``*_reverse``; gates i f g o / r z n, :data:`rnnconvert.core.gates.TABLE` ``('torch', cell)``): the canonical
  arrays copied bit for bit (a Keras layer with one bias has ``bias_hh`` zeros).
* ``Attention`` / ``AdditiveAttention`` -> ``keras_attention`` (the source of
  :func:`rnnconvert.whole.formats.torch.attention.keras_attention`, written into the file; the ``.pt2`` program
  calls the same function) with an ``nn.ParameterDict`` of ``scale`` / ``concat_score_weight`` where the layer has
  them (issue #41).
* Parameter-free layers (activations, merges, reshapes, pooling, masking) are expressions in ``forward``.

What only training uses is not carried: a recurrent layer's ``dropout`` / ``recurrent_dropout``, noise layers,
regularizers and constraints (inference, which verification checks, is unaffected; ``Dropout`` layers are
``nn.Dropout``).

The state dict (:func:`state_bytes`) is ``torch.save`` of plain tensors (float32; ``num_batches_tracked``
int64), loadable with ``torch.load(path, weights_only=True)``. Source and state are deterministic (the same
graph gives the same bytes).

Oracle: tf_keras running the source model (:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`), every
model output, in ``tests/formats/whole_models/test_emit_module.py``.
"""

from __future__ import annotations

import builtins
import io
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....conventions import torch_state
from ...conventions import keras_graph
from ....core.model import Cell
from ....errors import require

#: the activations ``KerasRecurrent`` computes (our names, :data:`rnnconvert.core.reference.ACT`)
RECURRENT_ACTS = ("sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "softsign")
#: the class name of the written module
CLASS = "Model"

_HARD_SIGMOID = '''

def hard_sigmoid(x):
    """Keras 2's hard_sigmoid: clip(0.2 * x + 0.5, 0, 1) (tf_keras activations.py; not torch's x / 6 + 0.5)."""
    return torch.clamp(0.2 * x + 0.5, 0.0, 1.0)
'''

_RECURRENT = '''

ACTIVATIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu, "linear": lambda x: x,
               "hard_sigmoid": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0), "softsign": F.softsign}


class KerasRecurrent(nn.Module):
    """A Keras LSTM / GRU / SimpleRNN layer (optionally Bidirectional) in the Keras equations, one step at a time,
    for what torch.nn.LSTM/GRU/RNN cannot compute: Keras 2 hard_sigmoid gates, GRU reset_after=False, other
    activations, go_backwards, Keras masks.

    Parameters are named, shaped and gate-ordered as torch.nn's: weight_ih_l0 (G*H, I), weight_hh_l0 (G*H, H),
    bias_ih_l0 and bias_hh_l0 (G*H,), "_reverse" for the backward direction; gates i f g o (LSTM), r z n (GRU).

    forward(x (B, T, I), hx=None, mask=None) returns (y (B, T, D*H), h_n (D, B, H)), for an LSTM
    (y, (h_n, c_n)), as torch.nn's do; hx as torch.nn's. mask (B, T) bool: a masked step keeps the state;
    a unidirectional layer's output there is the previous output, a bidirectional one's is zero (tf_keras); so
    each row's unmasked steps are moved to the front, run, and each step's output put back (exact for padding
    anywhere). go_backwards: the sequence is read from its end and y is in processing order (Keras).
    """

    def __init__(self, mode, input_size, hidden_size, bidirectional=False, gate_activation="sigmoid",
                 activation="tanh", reset_after=True, go_backwards=False):
        super().__init__()
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.bidirectional, self.go_backwards, self.reset_after = bidirectional, go_backwards, reset_after
        self.gate_activation, self.activation = gate_activation, activation
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[mode]
        for sfx in self.suffixes():
            self.register_parameter("weight_ih_l0" + sfx, nn.Parameter(torch.empty(gates * hidden_size, input_size)))
            self.register_parameter("weight_hh_l0" + sfx, nn.Parameter(torch.empty(gates * hidden_size, hidden_size)))
            self.register_parameter("bias_ih_l0" + sfx, nn.Parameter(torch.empty(gates * hidden_size)))
            self.register_parameter("bias_hh_l0" + sfx, nn.Parameter(torch.empty(gates * hidden_size)))
        self.reset_parameters()

    def suffixes(self):
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self):
        bound = self.hidden_size ** -0.5  # torch.nn's initialisation
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x, hx=None, mask=None):
        B, H, T = x.shape[0], self.hidden_size, x.shape[1]
        sfxs = self.suffixes()
        D = len(sfxs)
        if hx is None:
            h0 = c0 = x.new_zeros(D, B, H)
        else:
            h0, c0 = hx if self.mode == "LSTM" else (hx, x.new_zeros(D, B, H))
        rev = [d == 1 or self.go_backwards for d in range(D)]  # each direction read in its processing order
        xs = [x.flip(1) if r else x for r in rev]
        if mask is not None:  # a masked step keeps the state (tf_keras): each row's unmasked steps moved to the front
            ms = [mask.flip(1) if r else mask for r in rev]
            orders = [torch.argsort((~m).to(torch.uint8), dim=1, stable=True) for m in ms]
            xs = [torch.gather(xd, 1, o.unsqueeze(-1).expand(-1, -1, xd.shape[-1])) for xd, o in zip(xs, orders)]
        w_hh = torch.stack([getattr(self, "weight_hh_l0" + sfx).t() for sfx in sfxs])  # (D, H, G*H)
        b_hh = torch.stack([getattr(self, "bias_hh_l0" + sfx) for sfx in sfxs]).unsqueeze(1)  # (D, 1, G*H)
        fold = b_hh  # the part of b_hh added to the input products (all but a reset-after GRU's n columns)
        if self.mode == "GRU" and self.reset_after:
            fold = torch.cat([b_hh[..., :2 * H], torch.zeros_like(b_hh[..., 2 * H:])], -1)
        # the input products of every step in one product per direction, before the loop: (D, B, T, G*H)
        xin = torch.stack([xd @ getattr(self, "weight_ih_l0" + sfx).t() + getattr(self, "bias_ih_l0" + sfx)
                           for xd, sfx in zip(xs, sfxs)]) + fold.unsqueeze(1)
        gate, act = ACTIVATIONS[self.gate_activation], ACTIVATIONS[self.activation]
        h, c, ys, cs = h0, c0, [], []
        if self.mode == "GRU":  # the r, z columns and the n columns apart, each step's a view (no slicing a step)
            x_rz, x_n = xin[..., :2 * H].unbind(2), xin[..., 2 * H:].unbind(2)
            w_rz, w_n, b_n = w_hh[..., :2 * H], w_hh[..., 2 * H:], b_hh[..., 2 * H:].expand(D, B, H)
        else:
            x_all = xin.unbind(2)
        for t in range(T):  # both directions at once: one batched product per step
            if self.mode == "LSTM":
                i, f, g, o = torch.baddbmm(x_all[t], h, w_hh).chunk(4, -1)
                c = torch.addcmul(gate(f) * c, gate(i), act(g))
                h = gate(o) * act(c)
                cs.append(c)
            elif self.mode == "GRU":
                r, z = gate(torch.baddbmm(x_rz[t], h, w_rz)).chunk(2, -1)
                if self.reset_after:  # Keras reset_after=True, torch.nn.GRU: n = act(x_n + r * (W_hn h + b_hn))
                    n = act(torch.addcmul(x_n[t], r, torch.baddbmm(b_n, h, w_n)))
                else:  # Keras reset_after=False: the reset gate before the recurrent product of n
                    n = act(torch.baddbmm(x_n[t], r * h, w_n))
                h = torch.lerp(n, h, z)  # (1 - z) n + z h
            else:
                h = act(torch.baddbmm(x_all[t], h, w_hh))
            ys.append(h)
        y = torch.stack(ys, 2) if T else x.new_zeros(D, B, 0, H)  # (D, B, T, H), processing order
        if mask is not None:  # each step's output put back: the one of the last unmasked step at or before it
            count = torch.stack([m.sum(1) for m in ms])  # (D, B)
            pos = torch.stack([m.long().cumsum(1) - 1 for m in ms])  # (D, B, T)
            at_last = (count - 1).clamp(min=0).view(D, B, 1, 1).expand(-1, -1, 1, H)
            kept = (count > 0).view(D, B, 1)  # a row with no unmasked step keeps its initial state
            h = torch.where(kept, torch.gather(y, 2, at_last)[:, :, 0], h0)
            if self.mode == "LSTM" and T:
                c = torch.where(kept, torch.gather(torch.stack(cs, 2), 2, at_last)[:, :, 0], c0)
            y = torch.gather(y, 2, pos.clamp(min=0).unsqueeze(-1).expand(-1, -1, -1, H))
            # zero where masked (Bidirectional, tf_keras zero_output_for_mask) / before the first unmasked step
            y = torch.where((torch.stack(ms) if self.bidirectional else pos >= 0).unsqueeze(-1), y, 0.0)
        y = torch.cat([y[0], y[1].flip(1)], -1) if D == 2 else y[0]  # the backward direction in input order
        return (y, (h, c)) if self.mode == "LSTM" else (y, h)
'''

_MASKED = '''

def masked_run(rnn, x, mask, hx=None, go_backwards=False):
    """A torch.nn LSTM/GRU/RNN (batch_first) under a Keras mask (B, T) bool, padding anywhere: a masked step keeps
    the state (tf_keras backend.rnn), so each row's unmasked steps are moved to the front in order, run packed to
    their count, and put back: the output at a step is the one of the last unmasked step at or before it (the initial
    zeros before the first), a bidirectional layer's is zero where masked (tf_keras zero_output_for_mask).
    go_backwards: the sequence read from its end, outputs in that order (Keras). Returns what rnn returns."""
    if go_backwards:
        x, mask = x.flip(1), mask.flip(1)
    B, T = mask.shape
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    xc = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    count = mask.sum(1)
    packed = nn.utils.rnn.pack_padded_sequence(xc, count.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    yp, state = rnn(packed, hx)
    yc, _ = nn.utils.rnn.pad_packed_sequence(yp, batch_first=True, total_length=T)
    pos = mask.long().cumsum(1) - 1
    y = torch.gather(yc, 1, pos.clamp(min=0).unsqueeze(-1).expand(-1, -1, yc.shape[-1]))
    D = 2 if rnn.bidirectional else 1
    hs = list(state) if isinstance(state, tuple) else [state]
    h0s = [h.new_zeros(h.shape) for h in hs] if hx is None else (list(hx) if isinstance(hx, tuple) else [hx])
    empty = (count == 0).view(1, B, 1)
    hs = [torch.where(empty, h0, h) for h, h0 in zip(hs, h0s)]  # a row with no unmasked step keeps its state
    # zero where masked (Bidirectional) / before a row's first unmasked step (tf_keras: the previous output starts
    # as zeros, whatever the initial state)
    y = torch.where((mask if D == 2 else pos >= 0).unsqueeze(-1), y, 0.0)
    return y, (tuple(hs) if isinstance(state, tuple) else hs[0])
'''


_RESERVED = {"self", "torch", "nn", "F", "hard_sigmoid", "ACTIVATIONS", "KerasRecurrent", "masked_run", CLASS}


def _identifier(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name) or "layer"
    if s[0].isdigit():
        s = "_" + s
    return s


class _Names:
    """Unique identifiers in one namespace."""

    def __init__(self, taken=()):
        self.used: set[str] = set(taken)

    def get(self, name: str, forbid=lambda s: False) -> str:
        base = _identifier(name)
        if base.startswith("__"):  # a class-private name: Python would mangle it to _Model__x (issue #40)
            base = "layer" + base
        if keyword.iskeyword(base) or forbid(base):
            base += "_"
        s, k = base, 1
        while s in self.used:
            s, k = f"{base}_{k}", k + 1
        self.used.add(s)
        return s


#: instance attributes ``nn.Module.__init__`` sets, whichever torch (``training`` is not a class attribute)
MODULE_INSTANCE = frozenset({"training", "call_super_init", "dump_patches"})


def module_attributes(torch) -> frozenset:
    """Every name an emitted layer attribute must not take: ``nn.Module``'s class attributes and methods
    (``forward``, ``state_dict``, ``to``, ``eval``...) and the instance attributes its ``__init__`` sets
    (``training``, ``_parameters``...; :data:`MODULE_INSTANCE` and those of a fresh ``nn.Module()``), issue #40."""
    return frozenset(dir(torch.nn.Module)) | MODULE_INSTANCE | frozenset(vars(torch.nn.Module()))


@dataclass
class Emitted:
    """The written module: ``source`` (Python text), ``state`` (``{state-dict key: array}`` in the module's own
    ``state_dict()`` order), ``inputs`` (the ``forward`` argument names, the graph's input order), ``outputs``
    (how many)."""

    source: str
    state: dict[str, np.ndarray]
    inputs: list[str]
    outputs: int


def _act(name: str | None, x: str, helpers: set) -> str:
    if name in (None, "linear"):
        return x
    if name == "hard_sigmoid":
        helpers.add("hard_sigmoid")
        return f"hard_sigmoid({x})"
    return {"relu": f"torch.relu({x})", "sigmoid": f"torch.sigmoid({x})", "tanh": f"torch.tanh({x})",
            "softmax": f"torch.softmax({x}, -1)", "softplus": f"F.softplus({x})", "softsign": f"F.softsign({x})",
            "elu": f"F.elu({x})", "selu": f"torch.selu({x})", "exponential": f"torch.exp({x})"}[name]


def _lit(v) -> str:
    """A float as a Python literal of the same value (``float('inf')`` where repr is not one)."""
    v = float(v)
    return repr(v) if np.isfinite(v) else f"float({str(v)!r})"


def _int(v) -> int:
    return int(v[0] if isinstance(v, (list, tuple)) else v)


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


_MODES = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}


class _Emitter:
    def __init__(self, graph: keras_graph.Graph, states: bool = False):
        self.g = graph
        self.attrs = _Names(_RESERVED)
        self.vars = _Names(_RESERVED | set(dir(builtins)) | ({"states"} if states else set()))
        from .pt2_write import carried  # states (issue #41): the same layer calls and names as the .pt2 program's
        self.state_keys = carried(graph) if states else []
        self.carried = {n: [k for m, k, _ in self.state_keys if m == n] for n, _, _ in self.state_keys}
        self.state_outs: list[tuple[str, str]] = []  # (state_out name, expression)
        self.attr_of: dict[str, str] = {}  # layer path -> attribute
        self.var_of: dict[str, str] = {}  # tensor name -> local variable
        self.init: list[str] = []
        self.body: list[str] = []
        self.state: dict[str, np.ndarray] = {}
        self.helpers: set[str] = set()
        self.made_masks: dict[str, str] = {}

    def attr(self, node: keras_graph.Node, ctor: str, state: dict[str, np.ndarray], comment: str = "") -> str:
        """The attribute of ``node``'s layer (created on its first call; a shared layer's later calls reuse it)."""
        if node.path in self.attr_of:
            return self.attr_of[node.path]
        torch = require("torch", "torch")  # an attribute must not shadow one of nn.Module's (class or instance)
        taken = module_attributes(torch)
        a = self.attrs.get(node.path, lambda s: s in taken or s.startswith("_"))
        self.attr_of[node.path] = a
        self.init.append(f"        self.{a} = {ctor}" + (f"  # {comment}" if comment else ""))
        for k, v in state.items():
            self.state[f"{a}.{k}"] = v
        return a

    def var(self, tensor: str, hint: str) -> str:
        v = self.vars.get(hint)
        self.var_of[tensor] = v
        return v

    def mask(self, name: str) -> str:
        if name not in self.made_masks:
            kind = self.g.masks[name]
            src = self.var_of[kind[1]]
            v = self.vars.get(f"mask_{src}")
            if kind[0] == "ids":
                self.body.append(f"        {v} = {src} != 0  # Embedding(mask_zero=True)")
            else:
                self.body.append(f"        {v} = ({src} != {_lit(kind[2])}).any(-1)  # Masking")
            self.made_masks[name] = v
        return self.made_masks[name]

    def emit(self, stmt: str, node: keras_graph.Node, why: str = "") -> None:
        self.body.append(f"        {stmt}  # {text(node.name)} ({text(node.cls)}{': ' + why if why else ''})")

    # ------------------------------------------------------------------------------------------- layers
    def layer(self, node: keras_graph.Node) -> None:
        cls, conf, ws = node.cls, node.config, node.weights
        xs = [self.var_of[i] for i in node.inputs]
        x = xs[0]
        mask = self.mask(node.masks[0]) if node.masks and node.masks[0] is not None else None
        if cls in keras_graph.RECURRENT or cls == "Bidirectional":
            self.recurrent(node, xs, mask)
            return
        out = self.var(node.outputs[0], node.path.rsplit(".", 1)[-1])
        if cls == "Dropout":
            a = self.attr(node, f"nn.Dropout({_lit(conf.get('rate', 0.0))})", {})
            self.emit(f"{out} = self.{a}({x})", node)
        elif cls in keras_graph.IDENTITY:
            self.emit(f"{out} = {x}", node, "the identity at inference")
        elif cls == "Embedding":
            w = ws[0]
            a = self.attr(node, f"nn.Embedding({w.shape[0]}, {w.shape[1]})", {"weight": _f32(w)})
            self.emit(f"{out} = self.{a}({x}.long())", node)
        elif cls == "Masking":
            mv = float(conf.get("mask_value", 0.0))
            self.emit(f"{out} = {x} * ({x} != {_lit(mv)}).any(-1, keepdim=True).to({x}.dtype)", node)
        elif cls == "Dense" or (cls == "TimeDistributed" and node.inner[0] == "Dense"):
            iconf = conf if cls == "Dense" else node.inner[1]
            bias = bool(iconf.get("use_bias", True)) and len(ws) > 1
            st = {"weight": _f32(np.asarray(ws[0]).T)}
            if bias:
                st["bias"] = _f32(ws[1])
            a = self.attr(node, f"nn.Linear({ws[0].shape[0]}, {ws[0].shape[1]}{'' if bias else ', bias=False'})", st)
            self.emit(f"{out} = {_act(iconf.get('activation'), f'self.{a}({x})', self.helpers)}", node)
        elif cls == "TimeDistributed":
            icls, iconf = node.inner
            expr = _act(iconf.get("activation"), x, self.helpers) if icls == "Activation" else x
            self.emit(f"{out} = {expr}", node)
        elif cls == "Activation":
            self.emit(f"{out} = {_act(conf.get('activation'), x, self.helpers)}", node)
        elif cls == "ReLU":
            if conf.get("max_value") is not None or float(conf.get("negative_slope", 0) or 0) or float(
                    conf.get("threshold", 0) or 0):
                keras_graph.refuse(node.path, cls, "ReLU with max_value / negative_slope / threshold")
            self.emit(f"{out} = torch.relu({x})", node)
        elif cls in keras_graph.SMALL:  # issue #41: PReLU, Rescaling, UnitNormalization, UpSampling1D, EinsumDense
            from . import small_layers

            alpha = None
            if cls == "PReLU":
                a = self.attr(node, f"nn.Parameter(torch.zeros({tuple(int(d) for d in node.weights[0].shape)!r}))",
                              {}, "PReLU alpha")
                self.state[a] = node.weights[0]
                alpha = f"self.{a}"
            if cls == "EinsumDense":
                st = dict(zip(("kernel", "bias"), node.weights))
                ctor = "nn.ParameterDict({" + ", ".join(
                    f"{k!r}: nn.Parameter(torch.zeros({tuple(int(d) for d in v.shape)!r}))" for k, v in st.items())
                a = self.attr(node, ctor + "})", st, "Keras EinsumDense weights")
                alpha = f"self.{a}"
                self.emit(f"{out} = {_act(conf.get('activation'), small_layers.source(node, x, alpha), self.helpers)}",
                          node)
                return
            self.emit(f"{out} = {small_layers.source(node, x, alpha)}", node)
        elif cls == "LeakyReLU":
            self.emit(f"{out} = F.leaky_relu({x}, {_lit(conf.get('alpha', 0.3))})", node)
        elif cls == "ELU":
            self.emit(f"{out} = F.elu({x}, {_lit(conf.get('alpha', 1.0))})", node)
        elif cls == "Softmax":
            if conf.get("axis", -1) != -1:
                keras_graph.refuse(node.path, cls, "softmax over an axis other than the last")
            self.emit(f"{out} = torch.softmax({x}, -1)", node)
        elif cls == "Conv1D":
            self.conv1d(node, x, out)
        elif cls in ("MaxPooling1D", "AveragePooling1D"):
            size = _int(conf.get("pool_size", 2))
            st = _int(conf.get("strides") or size)
            if conf.get("padding", "valid") != "valid":
                keras_graph.refuse(node.path, cls, "padding='same' pooling in an emitted module")
            fn = "F.max_pool1d" if cls == "MaxPooling1D" else "F.avg_pool1d"
            self.emit(f"{out} = {fn}({x}.transpose(1, 2), {size}, {st}).transpose(1, 2)", node)
        elif cls == "GlobalMaxPooling1D":
            self.emit(f"{out} = {x}.amax(1{', keepdim=True' if conf.get('keepdims') else ''})", node)
        elif cls == "GlobalAveragePooling1D":
            kd = ", keepdim=True" if conf.get("keepdims") else ""
            if mask is None:
                self.emit(f"{out} = {x}.mean(1{kd})", node)
            else:
                self.emit(f"{out} = ({x} * {mask}.unsqueeze(-1).to({x}.dtype)).sum(1{kd}) / "
                          f"{mask}.unsqueeze(-1).to({x}.dtype).sum(1{kd})", node, "the mean over unmasked steps")
        elif cls == "Flatten":
            self.emit(f"{out} = {x}.flatten(1)", node)
        elif cls == "Reshape":
            dims = ", ".join(str(int(d)) for d in conf["target_shape"])
            self.emit(f"{out} = {x}.reshape({x}.shape[0], {dims})", node)
        elif cls == "Permute":
            self.emit(f"{out} = {x}.permute(0, {', '.join(str(int(d)) for d in conf['dims'])})", node)
        elif cls == "RepeatVector":
            self.emit(f"{out} = {x}.unsqueeze(1).expand(-1, {int(conf['n'])}, -1)", node)
        elif cls == "Concatenate":
            self.emit(f"{out} = torch.cat([{', '.join(xs)}], {int(conf.get('axis', -1))})", node)
        elif cls in ("Add", "Subtract", "Multiply", "Average"):
            op = {"Add": " + ", "Subtract": " - ", "Multiply": " * ", "Average": " + "}[cls]
            expr = op.join(xs)
            self.emit(f"{out} = " + (f"({expr}) / {len(xs)}" if cls == "Average" else expr), node)
        elif cls in ("Maximum", "Minimum"):
            fn = "torch.maximum" if cls == "Maximum" else "torch.minimum"
            expr = xs[0]
            for z in xs[1:]:
                expr = f"{fn}({expr}, {z})"
            self.emit(f"{out} = {expr}", node)
        elif cls in ("BatchNormalization", "LayerNormalization"):
            self.norm(node, x, out)
        elif cls in keras_graph.ATTENTION:
            self.attention(node, xs, out)
        elif cls in keras_graph.MHA:
            self.mha(node, xs, out)
        elif cls in ("ZeroPadding1D", "Cropping1D"):
            p = conf.get("padding" if cls == "ZeroPadding1D" else "cropping", 1)
            a, b = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
            self.emit(f"{out} = F.pad({x}, (0, 0, {a}, {b}))" if cls == "ZeroPadding1D"
                      else f"{out} = {x}[:, {a}:{x}.shape[1] - {b}]", node)
        else:  # pragma: no cover - keras_graph.LAYERS and this list agree
            keras_graph.refuse(node.path, cls, "no nn.Module source for it")

    def attention(self, node, xs, out):
        """An attention call (issue #41): ``keras_attention`` (the source of
        :func:`rnnconvert.whole.formats.torch.attention.keras_attention`, written into the file) on its inputs,
        masks and weights (an ``nn.ParameterDict`` of ``scale`` / ``concat_score_weight`` where it has them)."""
        conf = node.config
        scale, cw = keras_graph.attention_weights(node)
        st = {k: v for k, v in (("scale", scale), ("concat_score_weight", cw)) if v is not None}
        ref = {k: "None" for k in ("scale", "concat_score_weight")}
        if st:
            ctor = "nn.ParameterDict({" + ", ".join(
                f"{k!r}: nn.Parameter(torch.zeros({tuple(int(d) for d in v.shape)!r}))" for k, v in st.items()) + "})"
            a = self.attr(node, ctor, st, "Keras attention weights")
            ref.update({k: f"self.{a}[{k!r}]" for k in st})
        ms = [self.mask(m) if m is not None else "None" for m in (node.masks + [None, None])[:2]]
        self.helpers.add("keras_attention")
        k = xs[2] if len(xs) > 2 else xs[1]
        call = (f"keras_attention({xs[0]}, {xs[1]}, {k}, {ms[0]}, {ms[1]}, {bool(conf.get('causal'))}, "
                f"{conf['mode']!r}, {ref['scale']}, {ref['concat_score_weight']})")
        self.attention_out(node, out, call, bool(conf.get("scores")))

    def attention_out(self, node, out, call: str, scores: bool):
        """``out = call[0]``, or ``out, <name>_scores = call`` where the layer returns its attention scores (the
        ``keras_attention`` and ``keras_mha`` helpers return ``(output, scores)``)."""
        if scores:
            w = self.var(node.outputs[1], node.path.rsplit(".", 1)[-1] + "_scores")
            self.emit(f"{out}, {w} = {call}", node)
        else:
            self.emit(f"{out} = {call}[0]", node)

    def mha(self, node, xs, out):
        """A ``MultiHeadAttention`` call (issue #41): ``keras_mha`` (the source of
        :func:`rnnconvert.whole.formats.torch.attention.keras_mha`, written into the file) on its inputs, masks and
        an ``nn.ParameterDict`` of its weights (``query_kernel`` ... ``output_bias``, Keras' shapes)."""
        conf = node.config
        names = ("query_kernel", "query_bias", "key_kernel", "key_bias", "value_kernel", "value_bias",
                 "output_kernel", "output_bias")
        st = dict(zip(names, node.weights))
        ctor = "nn.ParameterDict({" + ", ".join(
            f"{k!r}: nn.Parameter(torch.zeros({tuple(int(d) for d in v.shape)!r}))" for k, v in st.items()) + "})"
        a = self.attr(node, ctor, st, "Keras MultiHeadAttention weights")
        ms = [self.mask(m) if m is not None else "None" for m in (node.masks + [None] * 3)[:3]]
        self.helpers.add("keras_mha")
        k = xs[2] if len(xs) > 2 else xs[1]
        ws = ", ".join(f"self.{a}[{n!r}]" for n in names)
        call = (f"keras_mha({xs[0]}, {xs[1]}, {k}, {ms[0]}, {ms[1]}, {ms[2]}, {bool(conf.get('causal'))}, "
                f"{conf['masked']!r}, {ws})")
        self.attention_out(node, out, call, bool(conf.get("scores")))

    def conv1d(self, node, x, out):
        conf, ws = node.config, node.weights
        k, cin, cout = (int(d) for d in ws[0].shape)
        dil, st = _int(conf.get("dilation_rate", 1)), _int(conf.get("strides", 1))
        if int(conf.get("groups", 1) or 1) != 1:
            keras_graph.refuse(node.path, node.cls, "grouped convolution")
        pad = conf.get("padding", "valid")
        tot = (k - 1) * dil
        if pad == "causal":
            pads = (tot, 0)
        elif pad == "same" and st == 1:  # TensorFlow's split: the odd one at the end
            pads = (tot // 2, tot - tot // 2)
        elif pad == "valid":
            pads = None
        else:
            keras_graph.refuse(node.path, node.cls, f"padding={pad!r} with strides {st} in an emitted module")
        bias = bool(conf.get("use_bias", True)) and len(ws) > 1
        st_d = {"weight": _f32(np.transpose(ws[0], (2, 1, 0)))}
        if bias:
            st_d["bias"] = _f32(ws[1])
        extra = (f", stride={st}" if st != 1 else "") + (f", dilation={dil}" if dil != 1 else "") + \
            ("" if bias else ", bias=False")
        a = self.attr(node, f"nn.Conv1d({cin}, {cout}, {k}{extra})", st_d)
        xc = f"{x}.transpose(1, 2)" if pads is None else f"F.pad({x}.transpose(1, 2), {pads})"
        self.emit(f"{out} = {_act(conf.get('activation'), f'self.{a}({xc}).transpose(1, 2)', self.helpers)}", node)

    def norm(self, node, x, out):
        conf, ws = node.config, node.weights
        it = iter(ws)
        gamma = next(it) if conf.get("scale", True) else None
        beta = next(it) if conf.get("center", True) else None
        eps = float(conf.get("epsilon", 1e-3))
        if node.cls == "LayerNormalization":
            if gamma is None and beta is None:
                self.emit(f"{out} = F.layer_norm({x}, {x}.shape[-1:], eps={_lit(eps)})", node)
                return
            C = int((gamma if gamma is not None else beta).shape[0])
            st = {"weight": _f32(gamma if gamma is not None else np.ones(C)),
                  "bias": _f32(beta if beta is not None else np.zeros(C))}
            a = self.attr(node, f"nn.LayerNorm({C}, eps={_lit(eps)})", st)
            self.emit(f"{out} = self.{a}({x})", node)
            return
        mean, var = next(it), next(it)
        C = int(mean.shape[0])
        st = {"weight": _f32(gamma if gamma is not None else np.ones(C)),
              "bias": _f32(beta if beta is not None else np.zeros(C)),
              "running_mean": _f32(mean), "running_var": _f32(var), "num_batches_tracked": np.zeros((), np.int64)}
        mom = float(f"{1.0 - float(conf.get('momentum', 0.99)):.12g}")
        a = self.attr(node, f"nn.BatchNorm1d({C}, eps={_lit(eps)}, momentum={_lit(mom)})", st,
                      "Keras momentum m is torch's 1 - m")
        if node.rank == 2:
            self.emit(f"{out} = self.{a}({x})", node)
        elif node.rank == 3:
            self.emit(f"{out} = self.{a}({x}.transpose(1, 2)).transpose(1, 2)", node)
        else:
            keras_graph.refuse(node.path, node.cls, f"an input of rank {node.rank} in an emitted module")

    def recurrent(self, node, xs, mask):
        layer, conf = node.layer, node.config
        s = layer.semantics
        inner = (conf.get("layer") or {}).get("config", {}) if node.cls == "Bidirectional" else conf
        seqs = bool(inner.get("return_sequences"))
        merge = s.merge_mode if layer.bidirectional else "concat"
        if merge not in ("concat", "sum", "ave", "mul"):
            keras_graph.refuse(node.path, node.cls, f"merge_mode={merge!r} (several outputs) is not built")
        if s.forget_bias or s.cell_clip is not None or s.proj_clip is not None or layer.proj_size or any(
                p.peep is not None for dirs in layer.params for p in dirs) or layer.num_layers != 1:
            keras_graph.refuse(node.path, node.cls, "TF1 cell features in a Keras model")
        mode = _MODES[layer.cell]
        for a in (s.gate_activation, s.activation):
            if a not in RECURRENT_ACTS:
                keras_graph.refuse(node.path, node.cls, f"recurrent activation {a!r} in an emitted module")
        H, D = layer.hidden_size, layer.num_directions
        init = xs[1:]
        backwards = bool(s.go_backwards and not layer.bidirectional)  # torch.nn reads a flipped sequence
        native = not [w for w in torch_state.refusals(layer) if not w.startswith("go_backwards")]
        st = {}
        for d, p in enumerate(layer.params[0]):
            sfx = "_reverse" if d else ""
            st[f"weight_ih_l0{sfx}"] = _f32(p.w_ih)
            st[f"weight_hh_l0{sfx}"] = _f32(p.w_hh)
            st[f"bias_ih_l0{sfx}"] = _f32(p.b_ih if p.b_ih is not None else np.zeros(p.w_ih.shape[0]))
            st[f"bias_hh_l0{sfx}"] = _f32(p.b_hh if p.b_hh is not None else np.zeros(p.w_ih.shape[0]))
        bi = ", bidirectional=True" if layer.bidirectional else ""
        if native:
            nl = ", nonlinearity='relu'" if layer.cell is Cell.RNN_RELU else ""
            ctor = f"nn.{mode}({layer.input_size}, {H}, batch_first=True{bi}{nl})"
            note = "Keras' one bias is bias_ih; bias_hh zeros" if mode != "GRU" else ""
        else:
            self.helpers.add("KerasRecurrent")
            opts = [repr(mode), str(layer.input_size), str(H)]
            if layer.bidirectional:
                opts.append("bidirectional=True")
            if s.gate_activation != "sigmoid" and mode != "RNN":
                opts.append(f"gate_activation={s.gate_activation!r}")
            if s.activation != "tanh":
                opts.append(f"activation={s.activation!r}")
            if mode == "GRU" and not s.reset_after:
                opts.append("reset_after=False")
            if s.go_backwards and not layer.bidirectional:
                opts.append("go_backwards=True")
            ctor = f"KerasRecurrent({', '.join(opts)})"
            note = ""
        a = self.attr(node, ctor, st, note)
        x = xs[0]
        base = node.path.rsplit(".", 1)[-1]
        y = self.vars.get(base)
        hn = self.vars.get(f"{base}_h")
        args = [x]
        if init:
            if layer.bidirectional:
                keras_graph.refuse(node.path, node.cls, "a Bidirectional layer with initial_state")
            hx = f"({init[0]}.unsqueeze(0), {init[1]}.unsqueeze(0))" if mode == "LSTM" else f"{init[0]}.unsqueeze(0)"
            args.append(hx)
        keys = self.carried.get(node.name)
        if keys:  # states (issue #41): the initial states from forward's states dict, zeros where it is None
            hxv = self.vars.get(f"{base}_hx")
            parts = [f"states[{f'state_in:{node.name}:{k}'!r}].unsqueeze(0)" for k in keys]
            hx = f"({parts[0]}, {parts[1]})" if mode == "LSTM" else parts[0]
            self.body.append(f"        {hxv} = None if states is None else {hx}  # initial states (--states)")
            init = [hxv]
            args.append(hxv)
        if native and mask is not None:
            self.helpers.add("masked_run")
            call = f"masked_run(self.{a}, {x}, {mask}" + (f", {args[1]}" if init else "") + \
                (", go_backwards=True" if backwards else "") + ")"
        else:
            if native and backwards:
                args[0] = f"{x}.flip(1)"  # go_backwards: read from the end, outputs in that order (Keras)
            if mask is not None:
                args.append(f"mask={mask}")
            call = f"self.{a}({', '.join(args)})"
        if mode == "LSTM":
            cn = self.vars.get(f"{base}_c")
            self.emit(f"{y}, ({hn}, {cn}) = {call}", node)
        else:
            cn = None
            self.emit(f"{y}, {hn} = {call}", node)
        if keys:  # states: the final states to forward's states output
            self.state_outs += [(f"state_out:{node.name}:{k}", f"{hn if k == 'h' else cn}[0]") for k in keys]
        if seqs:
            if merge != "concat":
                a1, b1 = f"{y}[..., :{H}]", f"{y}[..., {H}:]"
                expr = {"sum": f"{a1} + {b1}", "mul": f"{a1} * {b1}", "ave": f"({a1} + {b1}) / 2"}[merge]
                self.body.append(f"        {y} = {expr}  # merge_mode={merge!r}")
        else:
            if D == 1 and init and mask is not None and not keys:  # Keras initial_state, a row with no unmasked
                self.body.append(f"        {y} = torch.where({mask}.any(1, keepdim=True), {hn}[0], 0.0)  "
                                 "# step: output zeros, state the initial one (tf_keras backend.rnn)")
            elif D == 1:
                self.body.append(f"        {y} = {hn}[0]  # return_sequences=False: the last state")
            else:
                expr = {"concat": f"torch.cat([{hn}[0], {hn}[1]], -1)", "sum": f"{hn}[0] + {hn}[1]",
                        "mul": f"{hn}[0] * {hn}[1]", "ave": f"({hn}[0] + {hn}[1]) / 2"}[merge]
                self.body.append(f"        {y} = {expr}  # return_sequences=False: both directions' last states")
        self.var_of[node.outputs[0]] = y
        if len(node.outputs) > 1:  # return_state: [output, h] (GRU, SimpleRNN), [output, h, c] (LSTM)
            h1 = self.vars.get(f"{base}_state_h")
            self.body.append(f"        {h1} = {hn}[0]  # return_state: the final h")
            self.var_of[node.outputs[1]] = h1
            if len(node.outputs) > 2:
                c1 = self.vars.get(f"{base}_state_c")
                self.body.append(f"        {c1} = {cn}[0]  # return_state: the final c")
                self.var_of[node.outputs[2]] = c1


def text(s: str) -> str:
    """``s`` safe inside a comment or docstring of the written source: names come from the file (untrusted), so
    anything but ASCII letters, digits and ``_ .:#/+-`` becomes ``?`` (no newline or quote can end a comment)."""
    return re.sub(r"[^A-Za-z0-9_ .:#/+-]", "?", str(s))[:200]


def emit(graph: keras_graph.Graph, origin: str = "", module_name: str = "model",
         state_name: str = "model_state.pt", states: bool = False) -> Emitted:
    """The module source and state dict of ``graph`` (module docstring). ``origin`` (the source file's base name),
    ``module_name`` and ``state_name`` (how the user imports it and its state file's name) appear in the written
    docstring only; every name from the file is sanitised (:func:`text`, identifiers by ``_identifier``).
    ``states`` (issue #41, CLI ``--states``): ``forward(*inputs, states=None)`` takes a dict of the initial states
    of every unidirectional recurrent layer call (:func:`.pt2_write.carried`: ``"state_in:<call>:h"`` (and
    ``":c"``) ``(B, units)`` float32; ``None``: zeros) and returns the outputs followed by the dict of their final
    states (``"state_out:<call>:h"``...), as the ``.pt2`` program and the ONNX graph name them; the written file's
    ``STATES`` maps each initial state's name to its size.

    Raises:
        UnsupportedError: a layer or feature the emitted module does not build (one line: layer, class, way out);
            ``states`` with a Bidirectional or go_backwards layer.
    """
    e = _Emitter(graph, states)
    ins = [e.var(name, name) for name, *_ in graph.inputs]
    for node in graph.nodes:
        e.layer(node)
    outs = [e.var_of[o] for o in graph.outputs]
    doc_in = ", ".join(f"{v}: {'token ids' if emb is not None else 'float32'} "
                       f"(B, {', '.join('T' if d is None else str(d) for d in shape)})"
                       for v, (_, shape, _, emb) in zip(ins, graph.inputs))
    mod = _identifier(module_name)
    lines = [f'"""The Keras model {text(graph.name)!r}{" of " + text(origin) if origin else ""} as a torch.nn.Module, '
             "written by rnnconvert --emit-module.", "",
             "    import torch", f"    from {mod} import {CLASS}", "",
             f"    m = {CLASS}()",
             f"    m.load_state_dict(torch.load({text(state_name)!r}, weights_only=True))",
             "    m.eval()  # inference, as Keras computes it (m.train() to train on)",
             f"    y = m({', '.join(ins)})", "",
             f"forward({doc_in}) -> "
             + ("the output" if len(outs) == 1 else f"a tuple of {len(outs)} outputs in the Keras model's order") + "."
             if not states else
             f"forward({doc_in}, states=None) -> a tuple of the {len(outs)} output(s) in the Keras model's order and "
             "the dict of the recurrent layers' final states ('state_out:<layer>:h', ':c'); states: the dict of their "
             "initial states ('state_in:<layer>:h', ':c', (B, units) float32, sizes in STATES; None: zeros), to run "
             "a sequence in chunks, each chunk from the previous one's final states.",
             '"""', "", "import torch", "from torch import nn", "import torch.nn.functional as F"]
    if "hard_sigmoid" in e.helpers:
        lines.append(_HARD_SIGMOID.rstrip("\n"))
    if "KerasRecurrent" in e.helpers:
        lines.append(_RECURRENT.rstrip("\n"))
    if "masked_run" in e.helpers:
        lines.append(_MASKED.rstrip("\n"))
    if "keras_attention" in e.helpers:  # one definition of the equations with the .pt2 program's
        import inspect

        from . import attention

        lines += ["", "", inspect.getsource(attention.keras_attention).rstrip("\n")]
    if "keras_mha" in e.helpers:
        import inspect

        from . import attention

        lines += ["", "", inspect.getsource(attention.keras_mha).rstrip("\n")]
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    if states:  # the outputs, then the final states by name
        ret = "(" + ", ".join(outs) + ", {" + ", ".join(f"{k!r}: {v}" for k, v in e.state_outs) + "})"
        lines += ["", "", "#: the initial states forward(..., states) takes (zeros for a first chunk): name -> units",
                  "STATES = {" + ", ".join(f"{f'state_in:{n}:{k}'!r}: {size}" for n, k, size in e.state_keys) + "}"]
    lines += ["", "", f"class {CLASS}(nn.Module):",
              f'    """The Keras model {text(graph.name)!r}: layers as attributes named after the Keras layers, forward '
              'following the Keras graph."""',
              "", "    def __init__(self):", "        super().__init__()"]
    lines += e.init or ["        pass"]
    lines += ["", f"    def forward(self, {', '.join(ins + (['states=None'] if states else []))}):"]
    lines += e.body
    lines += [f"        return {ret}", ""]
    return Emitted("\n".join(lines), e.state, ins, len(outs))


def state_bytes(state: dict[str, np.ndarray]) -> bytes:
    """``torch.save`` of ``state`` as plain tensors (loadable with ``torch.load(..., weights_only=True)``); the
    same state gives the same bytes (saved to a buffer: the archive's folder is ``archive``, not the file's
    name)."""
    torch = require("torch", "torch")
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, buf)
    return buf.getvalue()


def state_path(module_path) -> Path:
    """Where the state dict of an emitted module goes: ``<stem>_state.pt`` beside it."""
    p = Path(module_path)
    return p.with_name(p.stem + "_state.pt")
