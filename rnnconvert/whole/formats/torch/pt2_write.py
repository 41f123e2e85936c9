"""``.pt2``: a whole Keras model, or the recurrent layers of any checkpoint, as a ``torch.export`` program (issue #30).

Output only: rnnconvert never reads a ``.pt2`` (``torch.export.load`` unpickles; a crafted file runs code). Users
load what we write with ``torch.export.load(path).module()`` -- only files they trust, as for any pickle.

The program is ``WholeModule`` (a class :func:`build_module` defines) exported by ``torch.export.export`` with
the batch and free time dimensions dynamic (a declared time length ``Dim.AUTO``: :func:`export`); the recurrent
layers are exact modules of their own (issue #41): an LSTM torch computes as ``aten.mkldnn_rnn_layer``
(:func:`native_lstm`; masks by :func:`compact`; the program then needs a torch built with oneDNN,
``torch.backends.mkldnn.is_available()``, as the x86 wheels are), every other layer one
``torch._higher_order_ops.scan`` over chunks of :data:`CHUNK` steps for all its directions of the canonical
equations of
:mod:`rnnconvert.core.reference` (gate order i f g o / r z n from :data:`rnnconvert.core.gates.TABLE`; any
gate activation and activation of :data:`ACTS`, Keras 2 ``hard_sigmoid`` = ``clip(0.2 x + 0.5, 0, 1)``,
reset-before and reset-after GRU, peepholes, TF1 cell and projection clips, forget bias), so ``.pt2`` refuses
no recurrent layer that ``.onnx`` carries. Keras masks are exact whatever their shape (a masked step keeps the
state, so each row's unmasked steps are moved to the front, run, and put back, :func:`compact`; a unidirectional
layer's output at a masked step is the previous output, a Bidirectional's zero, as tf_keras computes);
``return_state`` outputs are the states at each row's last unmasked step, ``initial_state`` inputs the first
(:mod:`rnnconvert.whole.conventions.keras_graph` "States"). The write option ``states`` (CLI ``--states``) adds
every unidirectional layer call's initial states as an input and final states as an output (:func:`carried`,
:func:`build_module`), named as the ONNX form names them. Other layers follow :mod:`rnnconvert.whole.formats.onnx.model_write` (the same
:class:`rnnconvert.whole.conventions.keras_graph.Graph`). Inputs: int32 token ids for an input feeding
an Embedding, float32 otherwise, positional in the model's input order; outputs: a tuple of the model outputs.
Convolutions and pools pad as TensorFlow does (:func:`tf_same_pads`, from the length the program is given);
a program whose strided layers shrink a free time axis runs the lengths at which no layer's time axis is one
step (``torch.export`` specializes sizes of 1; :func:`_example_steps`).

A source without a whole model (weights-only files, other formats) gives a program with one input and one
output per recurrent layer (``(B, T, I)`` -> ``(B, T, dirs*H)``, directions concatenated forward first), the
layers' own semantics as :func:`rnnconvert.core.reference.forward` computes them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...conventions import keras_graph
from ....core.gates import CANONICAL, gate_slice
from ....core.model import Cell, Checkpoint, RNNLayer
from ....errors import RNNConvertError, UnsupportedError, require

ROUTE = "torch.export"
#: hard sigmoid gate activations ``clip(a z + 0.5, 0, 1)`` by their slope ``a`` (Keras 2's and Keras 3's)
HARD = {"hard_sigmoid": 0.2, "hard_sigmoid_k3": 1.0 / 6.0}
#: activations the recurrent modules compute (our names, :data:`rnnconvert.core.reference.ACT`)
ACTS = ("sigmoid", "tanh", "relu", "linear", "hard_sigmoid", "hard_sigmoid_k3", "softsign")
#: steps a recurrent scan's body computes per iteration (:meth:`Recurrent.layer_scan`): the scan's own per-iteration
#: work (slicing inputs, storing outputs) once per CHUNK steps; measured in ``bench/bench_pt2_speed.py``
CHUNK = 16


def _act(torch, name: str | None):
    F = torch.nn.functional
    return {None: lambda x: x, "linear": lambda x: x, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
            "relu": torch.relu, "softsign": F.softsign, "softplus": F.softplus, "elu": F.elu, "selu": torch.selu,
            "exponential": torch.exp, "softmax": lambda x: torch.softmax(x, dim=-1),
            "hard_sigmoid": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0),
            "hard_sigmoid_k3": lambda x: torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)}[name]


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def refusals(layer: RNNLayer) -> list[str]:
    """What the ``.pt2`` recurrent module cannot compute (an activation outside :data:`ACTS`)."""
    s = layer.semantics
    return [f"activation '{a}' is not built" for a in (s.gate_activation, s.activation) if a not in ACTS]


def native_lstm(layer: RNNLayer) -> bool:
    """Whether ``layer`` is an LSTM that ``torch.ops.aten.mkldnn_rnn_layer`` (torch's own oneDNN LSTM kernel, what
    ``nn.LSTM`` runs on the CPU) computes exactly: sigmoid gates, tanh, no peepholes, clips, projection or
    run-time forget bias. ``.pt2`` programs run such layers as that one op per direction (a free time axis; the
    op has a fake-tensor rule, unlike ``aten.lstm``, whose export unrolls time) when oneDNN is built in."""
    s = layer.semantics
    return (layer.cell is Cell.LSTM and s.gate_activation == "sigmoid" and s.activation == "tanh"
            and not s.forget_bias and s.cell_clip is None and s.proj_clip is None and not layer.proj_size
            and all(p.peep is None for dirs in layer.params for p in dirs))


def compact(torch, x, mask):
    """Keras masking as a sequence without masked steps: ``x`` ``(B, T, F)`` with each row's unmasked steps moved
    to the front in order (a stable sort of ``~mask``), ``pos`` ``(B, T)`` the index among them of the last
    unmasked step at or before each step (-1 before the first) and ``count`` ``(B,)``. A masked step keeps the
    state (tf_keras ``backend.rnn``), so a run over the compacted rows has, at compacted step ``pos[t]``, the state
    the step-by-step run has at ``t``, whatever the padding (front, end or inside)."""
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    xc = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    pos = torch.cumsum(mask.to(torch.int64), 1) - 1
    return xc, pos, mask.to(torch.int64).sum(1)


def uncompact(torch, yc, pos, zero_masked: bool, mask):
    """The step-by-step outputs from the compacted run's ``yc`` ``(B, T, H)`` (:func:`compact`): at each step the
    output of the last unmasked step, zeros before the first (tf_keras ``backend.rnn``: the previous output starts
    as zeros, whatever the initial state); zeros at every masked step where ``zero_masked`` (a Bidirectional's,
    tf_keras ``zero_output_for_mask``)."""
    got = torch.gather(yc, 1, pos.clamp(min=0).unsqueeze(-1).expand(-1, -1, yc.shape[-1]))
    keep = mask if zero_masked else pos >= 0
    return torch.where(keep.unsqueeze(-1), got, 0.0)


def _module_class():
    torch = require("torch", "torch")
    from torch._higher_order_ops.scan import scan

    class Recurrent(torch.nn.Module):
        """One canonical recurrent layer (every stacked layer, every direction) in exact equations: an exact
        torch.nn LSTM as oneDNN's kernel (:func:`native_lstm`), any other cell as one ``scan`` over time for both
        directions at once (weights stacked ``(D, ...)``, one batched product per step; the input products of all
        steps in one product before it)."""

        def __init__(self, layer: RNNLayer):
            super().__init__()
            self.cell, self.H, self.sem = layer.cell, layer.hidden_size, layer.semantics
            self.D, self.L = layer.num_directions, layer.num_layers
            self.proj = bool(layer.proj_size)
            self.native = native_lstm(layer) and torch.backends.mkldnn.is_available()
            H = self.H
            for k, dirs in enumerate(layer.params):
                for d, p in enumerate(dirs):
                    for key, a in p.arrays().items():
                        if a is not None:
                            self.register_buffer(f"l{k}_d{d}_{key}", torch.from_numpy(np.array(a, np.float32)))
                self.register_buffer(f"l{k}_whhT", torch.stack([torch.from_numpy(np.array(p.w_hh, np.float32)).t()
                                                                for p in dirs]).contiguous())
                b = np.stack([np.zeros(p.w_hh.shape[0], np.float32) if p.b_hh is None else np.array(p.b_hh, np.float32)
                              for p in dirs])
                fold = b.copy()  # the part of b_hh added to the input products before the scan (outside the gates)
                if layer.cell is Cell.GRU and layer.semantics.reset_after:
                    fold[:, 2 * H:] = 0.0
                    b[:, :2 * H] = 0.0
                self.register_buffer(f"l{k}_bfold", torch.from_numpy(fold).unsqueeze(1))  # (D, 1, G*H)
                self.register_buffer(f"l{k}_bhh", torch.from_numpy(b).unsqueeze(1))
                if dirs[0].peep is not None:
                    self.register_buffer(f"l{k}_peep", torch.stack(
                        [torch.from_numpy(np.array(p.peep, np.float32)) for p in dirs]).unsqueeze(2))  # (D, 3, 1, H)
                if dirs[0].w_hr is not None:
                    self.register_buffer(f"l{k}_whrT", torch.stack(
                        [torch.from_numpy(np.array(p.w_hr, np.float32)).t() for p in dirs]).contiguous())
            if layer.cell is Cell.GRU and not layer.semantics.reset_after:  # the reset-before split of W_hh
                for k in range(self.L):
                    w = getattr(self, f"l{k}_whhT")
                    self.register_buffer(f"l{k}_whhT_rz", w[..., :2 * H].contiguous())
                    self.register_buffer(f"l{k}_whhT_n", w[..., 2 * H:].contiguous())

        def p(self, k, d, key):
            return getattr(self, f"l{k}_d{d}_{key}", None)

        def native_direction(self, x, mask, k, d, zero_masked, h0, c0):
            """``x`` ``(B, T, I)`` in processing order through ``aten.mkldnn_rnn_layer`` (float32; ``mask``:
            through :func:`compact`); returns ``(ys, h_T, c_T)`` (``c_T`` ``None`` with a mask)."""
            b_hh = self.p(k, d, "b_hh")
            if b_hh is None:
                b_hh = torch.zeros_like(self.p(k, d, "b_ih"))
            xs = x if mask is None else compact(torch, x, mask)[0]
            y, hT, cT, _ = torch.ops.aten.mkldnn_rnn_layer(
                xs.transpose(0, 1).contiguous(), self.p(k, d, "w_ih"), self.p(k, d, "w_hh"), self.p(k, d, "b_ih"),
                b_hh, h0, c0, False, [], 2, self.H, 1, True, False, False, False)
            y = y.transpose(0, 1)
            if mask is None:
                return y, hT, cT
            _, pos, count = compact(torch, x[..., :1], mask)
            last = torch.gather(y, 1, (count - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, y.shape[-1]))[:, 0]
            hT = torch.where((count > 0).unsqueeze(-1), last, h0)
            return uncompact(torch, y, pos, zero_masked, mask), hT, None

        def layer_scan(self, xin, k: int, h0, c0, count=None, need_c: bool = False):
            """The scan over time of layer ``k``: ``xin`` ``(T, D, B, G*H)`` (input products, processing order; a
            masked layer's unmasked steps moved to the front, :func:`compact`), ``count`` ``(D, B)`` the steps of
            each row that count (``None``: all ``T``); returns ``(ys (T, D, B, out), h_T, c_T)``, the final states
            those at each row's last counted step (``h0``/``c0`` for a row with none; ``c_T`` ``None`` unless
            ``need_c`` for an LSTM).

            The scan runs over chunks of :data:`CHUNK` steps (time padded at the end to a multiple of it, steps
            whose outputs are never read), each chunk's steps written out in the scan's body: the scan's own
            bookkeeping (slicing its inputs, storing its outputs) once a chunk, not once a step. Fewest ops a step:
            a hard sigmoid gate ``clip(a z + 0.5, 0, 1)`` (:data:`HARD`) is one ``clamp`` of ``z`` computed from
            the gate columns of ``W_hh`` and the input products scaled by ``a`` (and 0.5 added to the latter)
            before the scan (not with peepholes or a forget bias, whose terms are not scaled); a GRU's gate
            pre-activations one ``baddbmm`` (``b_hh`` folded into the input products), its reset-after ``n`` an
            ``addcmul``, ``(1 - z) n + z h`` a ``lerp``."""
            H, cell, s = self.H, self.cell, self.sem
            act = _act(torch, s.activation)
            whhT, bhh = getattr(self, f"l{k}_whhT"), getattr(self, f"l{k}_bhh")
            peep, whrT = getattr(self, f"l{k}_peep", None), getattr(self, f"l{k}_whrT", None)
            G = whhT.shape[-1] // H
            gate_cols = {Cell.LSTM: (0, 1, 3), Cell.GRU: (0, 1)}.get(cell, ())
            a = HARD.get(s.gate_activation) if peep is None and not s.forget_bias and gate_cols else None
            if a is not None:
                gates = [g in gate_cols for g in range(G)]
                scale = torch.tensor([a if g else 1.0 for g in gates], dtype=xin.dtype).repeat_interleave(H)
                offset = torch.tensor([0.5 if g else 0.0 for g in gates], dtype=xin.dtype).repeat_interleave(H)
                xin = xin * scale + offset
                whhT = whhT * scale
                gact = lambda z: torch.clamp(z, 0.0, 1.0)  # noqa: E731
            else:
                gact = _act(torch, s.gate_activation)
            T = xin.shape[0]
            K = CHUNK
            N = (T + K - 1) // K + 1  # at least 2 chunks: torch.export would specialize a count of 1
            xin = torch.nn.functional.pad(xin, (0, 0, 0, 0, 0, 0, 0, N * K - T)).reshape(N, K, *xin.shape[1:])
            if cell is Cell.GRU:  # the r, z columns and the n columns as two scan inputs (no slicing a step)
                w_rz, w_n = whhT[..., :2 * H].clone(), whhT[..., 2 * H:].clone()  # scan refuses aliased inputs
                b_n = bhh[..., 2 * H:].clone()  # reset-after: b_hh of n, inside the reset (zeros reset-before)
                xs = (xin[..., :2 * H].clone(), xin[..., 2 * H:].clone())
            else:
                xs = (xin,)

            def cellf(h, c, xt):
                if cell is Cell.LSTM:
                    zi, zf, zg, zo = torch.baddbmm(xt[0], h, whhT).chunk(4, -1)  # b_hh is in xt (bfold)
                    if peep is not None:
                        zi = zi + peep[:, 0] * c
                        zf = zf + peep[:, 1] * c
                    if s.forget_bias:
                        zf = zf + s.forget_bias
                    c1 = gact(zf) * c + gact(zi) * act(zg)
                    if s.cell_clip is not None:
                        c1 = torch.clamp(c1, -s.cell_clip, s.cell_clip)
                    if peep is not None:
                        zo = zo + peep[:, 2] * c1
                    h1 = gact(zo) * act(c1)
                    if whrT is not None:
                        h1 = torch.bmm(h1, whrT)
                        if s.proj_clip is not None:
                            h1 = torch.clamp(h1, -s.proj_clip, s.proj_clip)
                    return h1, c1
                if cell is Cell.GRU:
                    xrz, xn = xt  # b_hh of r, z in xrz (and of n too, reset-before)
                    r, z = gact(torch.baddbmm(xrz, h, w_rz)).chunk(2, -1)
                    if s.reset_after:
                        n = act(torch.addcmul(xn, r, torch.baddbmm(b_n, h, w_n)))
                    else:  # the reset before the recurrent product of n
                        n = act(torch.baddbmm(xn, r * h, w_n))
                    return torch.lerp(n, h, z), c  # (1 - z) n + z h
                return act(torch.baddbmm(xt[0], h, whhT)), c

            lstm = cell is Cell.LSTM  # the carry: (h, c) for an LSTM, (h,) otherwise (no aliased carry)
            keep_c = lstm and need_c

            def chunkf(carry, xc):
                h, c = carry[0], carry[-1]
                steps = [x.unbind(0) for x in xc]
                hs, cs = [], []
                for j in range(K):
                    h, c = cellf(h, c, [st[j] for st in steps])
                    hs.append(h)
                    if keep_c:
                        cs.append(c)
                out = (torch.stack(hs),) + ((torch.stack(cs),) if keep_c else ())
                return ((h, c) if lstm else (h,)), out

            _, outs = scan(chunkf, (h0, c0) if lstm else (h0,), xs)
            outs = [o.reshape(N * K, *o.shape[2:])[:T] for o in outs]  # (T, D, B, out)
            ys = outs[0]

            def last(seq, init):  # the state at each row's last counted step (init where none)
                if count is None:
                    return seq[T - 1]
                got = torch.gather(seq, 0, (count - 1).clamp(min=0).view(1, *count.shape, 1).expand(
                    1, -1, -1, seq.shape[-1]))[0]
                return torch.where((count > 0).unsqueeze(-1), got, init)

            return ys, last(ys, h0), (last(outs[1], c0) if keep_c else None)

        def forward(self, x, mask=None, sequences: bool = True, processing_order: bool = True, init=None,
                    states: bool = False):
            """``x`` (B, T, I); returns (B, T, D*out) (``sequences``) or the final states (B, D*out); ``init``: Keras'
            ``initial_state`` tensors; ``states``: ``[output, h, c]`` (Keras ``return_state``)."""
            D, H = self.D, self.H
            backwards = self.sem.go_backwards and D == 1
            B = x.shape[0]
            for k in range(self.L):
                rev = [backwards or d == 1 for d in range(D)]
                xs = [x.flip(1) if r else x for r in rev]  # each direction in its processing order
                ms = None if mask is None else [mask.flip(1) if r else mask for r in rev]
                w_hr = self.p(k, 0, "w_hr")
                out_size = w_hr.shape[0] if w_hr is not None else H
                h0 = torch.stack([init[0]] * D) if init else x.new_zeros(D, B, out_size)
                c0 = torch.stack([init[1]] * D) if init and len(init) > 1 else x.new_zeros(D, B, H)
                if self.native and x.dtype == torch.float32 and not (states and mask is not None):
                    res = [self.native_direction(xs[d], None if ms is None else ms[d], k, d, D == 2, h0[d], c0[d])
                           for d in range(D)]
                    outs, lasts = [r[0] for r in res], [r[1] for r in res]
                    cT = res[-1][2]
                else:
                    bias = getattr(self, f"l{k}_bfold")
                    comp = None if ms is None else [compact(torch, xs[d], ms[d]) for d in range(D)]
                    xr = xs if comp is None else [cp[0] for cp in comp]  # masked: the unmasked steps in front
                    xin = torch.stack([xr[d] @ self.p(k, d, "w_ih").t() + (bias[d] if self.p(k, d, "b_ih") is None
                                       else self.p(k, d, "b_ih") + bias[d]) for d in range(D)])  # (D, B, T, G*H)
                    count = None if comp is None else torch.stack([cp[2] for cp in comp])  # (D, B)
                    ys, hT, cT = self.layer_scan(xin.permute(2, 0, 1, 3).contiguous(), k, h0, c0, count,
                                                 states and self.cell is Cell.LSTM)
                    outs = [ys[:, d].transpose(0, 1) for d in range(D)]
                    if comp is not None:  # each step's output put back (:func:`uncompact`)
                        outs = [uncompact(torch, y, cp[1], D == 2, m_) for y, cp, m_ in zip(outs, comp, ms)]
                    lasts, cT = [hT[d] for d in range(D)], (cT[-1] if cT is not None else c0[-1])
                outs = [y.flip(1) if d == 1 or (backwards and not processing_order) else y
                        for d, y in enumerate(outs)]
                x = torch.cat(outs, -1) if D == 2 else outs[0]
            y = x if sequences else (torch.cat(lasts, -1) if D == 2 else lasts[0])
            return [y, lasts[-1], cT] if states else y  # return_state: one direction (keras_graph refuses two)

    return torch, Recurrent


def recurrent_module(layer: RNNLayer):
    """``(torch, module)``: a fresh module of the class a program computes ``layer`` with (``Recurrent`` of
    :func:`build_module`; its buffers ``l<k>_d<d>_<key>``, ``l<k>_whhT``... from ``layer``'s parameters). The
    ``torch_export`` runtime loads a written program's constants into it to run one step from given states
    (:func:`rnnconvert.whole.runtimes.torch_export.step`)."""
    torch, Recurrent = _module_class()
    return torch, Recurrent(layer)


def state_prefix(name: str) -> str:
    """The prefix of recurrent layer ``name``'s constants in a program's ``state_dict``: ``'rnns.<name>.'``
    (the name made safe for a module attribute as :func:`build_module` makes it)."""
    return f"rnns.{_safe(name)}."


def _f(torch, a) -> Any:
    return torch.from_numpy(np.array(a, np.float32))


def tf_same_pads(torch, length, k_eff: int, stride: int):
    """TensorFlow's ``SAME`` padding of one dimension (``tensorflow/core/framework/kernel_shape_util.cc``
    ``GetWindowedOutputSize``): ``total = max((ceil(L/s) - 1) * s + k_eff - L, 0)``, ``left = total // 2``, the odd
    one at the end; ``length`` an int or a ``torch.export`` symbolic size (then ``torch.sym_max``, no guard)."""
    total = ((length + stride - 1) // stride - 1) * stride + k_eff - length
    total = max(total, 0) if isinstance(total, int) else torch.sym_max(total, 0)
    left = total // 2
    return left, total - left


def _ints(v, n: int) -> list[int]:
    return [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)] * n


def conv_nd(torch, x, w, b, conf: dict, nd: int):
    """Keras ``Conv1D``/``Conv2D`` (channels_last ``x``; kernel ``(*k, in, out)`` as stored) with TensorFlow's
    padding: ``valid``, ``causal`` (1-D: ``(k-1)*d`` zeros before), ``same`` (:func:`tf_same_pads` on every spatial
    dimension, any stride); activation not applied. Returns channels_last."""
    F = torch.nn.functional
    ks, dil, st = list(w.shape[:nd]), _ints(conf.get("dilation_rate", 1), nd), _ints(conf.get("strides", 1), nd)
    pad = conf.get("padding", "valid")
    xc = x.movedim(-1, 1)  # (B, C, *spatial)
    if pad == "causal":
        xc = F.pad(xc, ((ks[0] - 1) * dil[0], 0))
    elif pad == "same":
        pads: list = []
        for i in reversed(range(nd)):  # F.pad lists the last dimension first
            pads += list(tf_same_pads(torch, xc.shape[2 + i], (ks[i] - 1) * dil[i] + 1, st[i]))
        xc = F.pad(xc, pads)
    wt = w.permute(*range(nd + 1, -1, -1)) if nd == 1 else w.permute(3, 2, 0, 1)  # (out, in, *k)
    conv = F.conv1d if nd == 1 else F.conv2d
    return conv(xc, wt, b, stride=st, dilation=dil).movedim(1, -1)


def pool_nd(torch, x, conf: dict, is_max: bool, nd: int):
    """Keras ``MaxPooling1D/2D`` / ``AveragePooling1D/2D`` (channels_last): ``valid`` as torch's pools (floor),
    ``same`` padded by :func:`tf_same_pads` first, with ``-inf`` for the max and, for the average, divided by the
    count of valid elements in each window (TensorFlow's ``avg_pool``). Returns channels_last."""
    F = torch.nn.functional
    size = _ints(conf.get("pool_size", 2), nd)
    st = _ints(conf.get("strides") or size, nd)
    xc = x.movedim(-1, 1)
    pads: list = []
    if conf.get("padding", "valid") == "same":
        for i in reversed(range(nd)):
            pads += list(tf_same_pads(torch, xc.shape[2 + i], size[i], st[i]))

    def windows(t):  # (B, C, *out, *size) by unfold: torch 2.13's pools specialize a dynamic length when exported
        for i in range(nd):
            t = t.unfold(2 + i, size[i], st[i])
        return t

    dims = tuple(range(-nd, 0))
    if is_max:
        y = windows(F.pad(xc, pads, value=float("-inf")) if pads else xc).amax(dims)
    elif pads:
        ones = F.pad(torch.ones_like(xc), pads)  # full size: no broadcast (export guards on sizes of 1)
        y = windows(F.pad(xc, pads)).sum(dims) / windows(ones).sum(dims)
    else:
        y = windows(xc).mean(dims)
    return y.movedim(1, -1)


def carried(graph: keras_graph.Graph) -> list[tuple[str, str, int]]:
    """The states the write option ``states`` carries from one chunk to the next (issue #41), as the ONNX form's
    (:func:`rnnconvert.whole.formats.onnx.model_write.carried`): ``(node name, key, size)`` for every unidirectional
    recurrent layer call that does not take its initial state from the model, key ``h`` (and ``c`` for an LSTM,
    :data:`rnnconvert.whole.conventions.keras_graph.STATES`), size its units; the inputs are named
    ``state_in:<call>:<key>``, the outputs ``state_out:<call>:<key>``.

    Raises:
        UnsupportedError: a Bidirectional or go_backwards layer (its run starts at the sequence's end: a chunk
            cannot hand its state to the next), naming it."""
    return [(n.name, key, n.layer.hidden_size) for n in keras_graph.streamed(graph, "model")
            for key in keras_graph.STATES[n.cls]]


def build_module(graph: keras_graph.Graph, states: bool = False):
    """The ``torch.nn.Module`` computing ``graph`` (module docstring): ``forward(*inputs) -> tuple of outputs``;
    with ``module.record = True`` (eager runs), ``module.layer_outputs`` holds the last run's
    ``{layer name: output}``. ``states`` (issue #41): ``forward(*inputs, states)``, ``states`` a dict of the
    initial states ``{"state_in:<call>:h": (B, units) float32, ...}`` of :func:`carried` (zeros for a first chunk),
    returns the outputs and then the dict of the final states ``{"state_out:<call>:h": ...}``.

    Raises:
        UnsupportedError: ``states`` with a Bidirectional or go_backwards layer (:func:`carried`)."""
    torch, Recurrent = _module_class()
    state_keys = carried(graph) if states else []
    F = torch.nn.functional

    class WholeModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = graph
            self.rnns = torch.nn.ModuleDict()
            for i, node in enumerate(graph.nodes):
                if node.layer is not None:
                    if _safe(node.path) not in self.rnns:
                        self.rnns[_safe(node.path)] = Recurrent(node.layer)
                else:
                    for j, w in enumerate(node.weights):
                        name = f"w_{_safe(node.path)}_{j}"
                        if not hasattr(self, name):
                            self.register_buffer(name, _f(torch, w))
            self.layer_outputs: dict = {}
            self.record = False
            self.carried = {name: [k for n, k, _ in state_keys if n == name] for name, _, _ in state_keys}

        def w(self, node, j):
            return getattr(self, f"w_{_safe(node.path)}_{j}")

        def dense(self, node, x, conf):
            y = x @ self.w(node, 0)
            if conf.get("use_bias", True) and len(node.weights) > 1:
                y = y + self.w(node, 1)
            return _act(torch, conf.get("activation"))(y)

        def attention(self, node, xs, env):
            from .attention import keras_attention

            keras_graph.attention_weights(node)  # the stored weights checked against the config
            ms = [self.mask_of(m, env) if m is not None else None for m in (node.masks + [None, None])[:2]]
            j, conf = 0, node.config
            scale = cw = None
            if conf.get("use_scale", node.cls == "AdditiveAttention"):
                scale, j = self.w(node, 0), 1
            if conf["mode"] == "concat":
                cw = self.w(node, j)
            out, w = keras_attention(xs[0], xs[1], xs[2] if len(xs) > 2 else xs[1], ms[0], ms[1],
                                     bool(conf.get("causal")), conf["mode"], scale, cw)
            return [out, w] if conf.get("scores") else out

        def mask_of(self, name, env):
            kind = graph.masks[name]
            src = env[kind[1]]
            if kind[0] == "ids":
                return src != 0
            return (src != kind[2]).any(-1)

        def layer(self, node, xs, mask, env):
            cls, conf = node.cls, node.config
            x = xs[0]
            if cls in keras_graph.IDENTITY:
                return x
            if cls in keras_graph.ATTENTION:  # issue #41: the query's and the value's masks
                return self.attention(node, xs, env)
            if cls in keras_graph.MHA:  # issue #41: the query's, the value's and the key's masks
                from .attention import keras_mha

                ms = [self.mask_of(m, env) if m is not None else None for m in (node.masks + [None] * 3)[:3]]
                out, w = keras_mha(xs[0], xs[1], xs[2] if len(xs) > 2 else xs[1], *ms, bool(conf.get("causal")),
                                   conf["masked"], *(self.w(node, j) for j in range(8)))
                return [out, w] if conf.get("scores") else out
            if cls in keras_graph.RECURRENT or cls == "Bidirectional":
                inner = (conf.get("layer") or {}).get("config", {}) if cls == "Bidirectional" else conf
                seqs = bool(inner.get("return_sequences"))
                rnn = self.rnns[_safe(node.path)]
                merge = node.layer.semantics.merge_mode if node.layer.bidirectional else "concat"
                if merge not in ("concat", "sum", "ave", "mul"):
                    keras_graph.refuse(node.path, cls, f"merge_mode={merge!r} (several outputs) is not built")
                keys = self.carried.get(node.name)
                if keys:  # states: the initial states from the states input, the final ones to the states output
                    y, h, c = rnn(x, mask, seqs, init=[env[f"state_in:{node.name}:{k}"] for k in keys], states=True)
                    env.update({f"state_out:{node.name}:{k}": t for k, t in zip(keys, (h, c))})
                    return [y, h, c][:len(node.outputs)] if len(node.outputs) > 1 else y
                if len(xs) > 1 or len(node.outputs) > 1:  # initial_state / return_state (unidirectional)
                    y, h, c = rnn(x, mask, seqs, init=xs[1:], states=True)
                    if not seqs and mask is not None and len(xs) > 1:  # a row with no unmasked step: its output
                        y = torch.where(mask.any(1, keepdim=True), y, 0.0)  # zeros, its state the initial one
                    return [y, h, c][:len(node.outputs)]  # (tf_keras backend.rnn: the previous output starts at 0)
                y = rnn(x, mask, seqs)
                if merge != "concat":
                    a, b = y[..., :rnn.H], y[..., rnn.H:]
                    y = a + b if merge == "sum" else (a * b if merge == "mul" else (a + b) / 2)
                return y
            if cls == "Embedding":
                return F.embedding(x.long(), self.w(node, 0))
            if cls == "Masking":
                return x * (x != float(conf.get("mask_value", 0.0))).any(-1, keepdim=True).to(x.dtype)
            if cls == "Dense":
                return self.dense(node, x, conf)
            if cls == "TimeDistributed":
                icls, iconf = node.inner
                if icls == "Dense":
                    return self.dense(node, x, iconf)
                return _act(torch, iconf.get("activation")) (x) if icls == "Activation" else x
            if cls == "Activation":
                return _act(torch, conf.get("activation"))(x)
            if cls == "ReLU":
                return torch.relu(x)
            if cls in keras_graph.SMALL:  # issue #41: PReLU, Rescaling, UnitNormalization, UpSampling1D, EinsumDense
                from .small_layers import forward

                if cls == "EinsumDense":
                    y = forward(node, x, [self.w(node, j) for j in range(len(node.weights))])
                    return _act(torch, conf.get("activation"))(y)
                return forward(node, x, self.w(node, 0) if node.weights else None)
            if cls == "LeakyReLU":
                return F.leaky_relu(x, float(conf.get("alpha", 0.3)))
            if cls == "ELU":
                return F.elu(x, float(conf.get("alpha", 1.0)))
            if cls == "Softmax":
                return torch.softmax(x, -1)
            if cls == "Conv1D":
                k = int(node.weights[0].shape[0])
                dil = conf.get("dilation_rate", 1)
                dil = int(dil[0] if isinstance(dil, (list, tuple)) else dil)
                st = conf.get("strides", 1)
                st = int(st[0] if isinstance(st, (list, tuple)) else st)
                pad = conf.get("padding", "valid")
                xc = x.transpose(1, 2)
                if pad == "causal":
                    xc = F.pad(xc, ((k - 1) * dil, 0))
                elif pad == "same":
                    if st != 1:  # TensorFlow's SAME at strides > 1: pads that depend on the length
                        b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                        return _act(torch, conf.get("activation"))(conv_nd(torch, x, self.w(node, 0), b, conf, 1))
                    tot = (k - 1) * dil
                    xc = F.pad(xc, (tot // 2, tot - tot // 2))
                wt = self.w(node, 0).permute(2, 1, 0)
                b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                y = F.conv1d(xc, wt, b, stride=st, dilation=dil).transpose(1, 2)
                return _act(torch, conf.get("activation"))(y)
            if cls in ("MaxPooling1D", "AveragePooling1D"):
                size = conf.get("pool_size", 2)
                size = int(size[0] if isinstance(size, (list, tuple)) else size)
                st = conf.get("strides") or size
                st = int(st[0] if isinstance(st, (list, tuple)) else st)
                if conf.get("padding", "valid") != "valid":  # TensorFlow's SAME pooling
                    return pool_nd(torch, x, conf, cls == "MaxPooling1D", 1)
                fn = F.max_pool1d if cls == "MaxPooling1D" else F.avg_pool1d
                return fn(x.transpose(1, 2), size, st).transpose(1, 2)
            if cls == "GlobalMaxPooling1D":
                return x.amax(1, keepdim=bool(conf.get("keepdims")))
            if cls == "GlobalAveragePooling1D":
                keep = bool(conf.get("keepdims"))
                if mask is None:
                    return x.mean(1, keepdim=keep)
                m = mask.to(x.dtype).unsqueeze(-1)
                return (x * m).sum(1, keepdim=keep) / m.sum(1, keepdim=keep)
            if cls == "Flatten":
                return x.flatten(1)
            if cls == "Reshape":
                return x.reshape([x.shape[0]] + [int(d) for d in conf["target_shape"]])
            if cls == "Permute":
                return x.permute([0] + [int(d) for d in conf["dims"]])
            if cls == "RepeatVector":
                return x.unsqueeze(1).expand(-1, int(conf["n"]), -1)
            if cls == "Concatenate":
                return torch.cat(xs, int(conf.get("axis", -1)))
            if cls in ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"):
                y = xs[0]
                for z in xs[1:]:
                    y = {"Add": torch.add, "Subtract": torch.sub, "Multiply": torch.mul, "Average": torch.add,
                         "Maximum": torch.maximum, "Minimum": torch.minimum}[cls](y, z)
                return y / len(xs) if cls == "Average" else y
            if cls in ("BatchNormalization", "LayerNormalization"):
                j = 0  # axis: the last (keras_graph checked it)
                gamma = beta = None
                if conf.get("scale", True):
                    gamma, j = self.w(node, j), j + 1
                if conf.get("center", True):
                    beta, j = self.w(node, j), j + 1
                eps = float(conf.get("epsilon", 1e-3))
                if cls == "BatchNormalization":
                    mean, var = self.w(node, j), self.w(node, j + 1)
                else:
                    mean = x.mean(-1, keepdim=True)
                    var = ((x - mean) ** 2).mean(-1, keepdim=True)
                y = (x - mean) / torch.sqrt(var + eps)
                if gamma is not None:
                    y = y * gamma
                return y + beta if beta is not None else y
            if cls in ("ZeroPadding1D", "Cropping1D"):
                key = "padding" if cls == "ZeroPadding1D" else "cropping"
                p = conf.get(key, 1)
                a, b = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
                if cls == "ZeroPadding1D":
                    return F.pad(x, (0, 0, a, b))
                return x[:, a:x.shape[1] - b]
            if cls == "Conv2D":
                if int(conf.get("groups", 1) or 1) != 1:
                    keras_graph.refuse(node.path, cls, "grouped convolution")
                b = self.w(node, 1) if conf.get("use_bias", True) and len(node.weights) > 1 else None
                return _act(torch, conf.get("activation"))(conv_nd(torch, x, self.w(node, 0), b, conf, 2))
            if cls in ("MaxPooling2D", "AveragePooling2D"):
                return pool_nd(torch, x, conf, cls == "MaxPooling2D", 2)
            if cls in ("GlobalMaxPooling2D", "GlobalAveragePooling2D"):
                keep = bool(conf.get("keepdims"))
                return x.amax((1, 2), keepdim=keep) if cls == "GlobalMaxPooling2D" else x.mean((1, 2), keepdim=keep)
            keras_graph.refuse(node.path, cls, "no torch builder")  # pragma: no cover

        def forward(self, *inputs):
            env = {name: t for (name, *_), t in zip(graph.inputs, inputs)}
            if state_keys:  # the last input: the initial states by name
                env.update({f"state_in:{n}:{k}": inputs[-1][f"state_in:{n}:{k}"] for n, k, _ in state_keys})
            masks: dict = {}
            for node in graph.nodes:
                mname = node.masks[0] if node.masks else None
                mask = None
                if mname is not None:
                    if mname not in masks:
                        masks[mname] = self.mask_of(mname, env)
                    mask = masks[mname]
                y = self.layer(node, [env[i] for i in node.inputs], mask, env)
                if isinstance(y, list):  # return_state: [output, h(, c)]
                    env.update(zip(node.outputs[1:], y[1:]))
                    y = y[0]
                env[node.outputs[0]] = y
                if self.record:  # eager runs only (never while exporting)
                    self.layer_outputs[node.name] = y
            if state_keys:
                return tuple(env[o] for o in graph.outputs) + (
                    {f"state_out:{n}:{k}": env[f"state_out:{n}:{k}"] for n, k, _ in state_keys},)
            return tuple(env[o] for o in graph.outputs)

    return WholeModule()


def run_float64(graph: keras_graph.Graph, xs: dict[str, np.ndarray], double: bool = True) -> tuple[list, dict]:
    """``graph`` run eagerly in float64 (weights widened exactly; ``double=False``: in float32, the same module)
    on ``xs`` (by input name): ``(outputs, {layer name: output})`` as numpy arrays; the second stage of the
    whole-model check measures the model's own float32 drift on the batch with the two."""
    torch = require("torch", "torch")
    m = build_module(graph).double() if double else build_module(graph)
    m.record = True
    fl = np.float64 if double else np.float32
    args = [torch.from_numpy(np.asarray(xs[n]).astype(fl if e is None else np.int64))
            for n, _, _, e in graph.inputs]
    with torch.no_grad():
        outs = m(*args)
    return ([o.numpy() for o in outs], {k: v.numpy() for k, v in m.layer_outputs.items()})


def _recurrent_graph(ckpt: Checkpoint) -> keras_graph.Graph:
    """A graph of the recurrent layers alone (one input ``<name>__in`` and output per layer)."""
    nodes, inputs = [], []
    for layer in ckpt.layers:
        inputs.append((f"{layer.name}__in", (None, layer.input_size), "float32", None))
        conf = {"return_sequences": True} if not layer.bidirectional else {"layer": {"config": {"return_sequences": True}}}
        nodes.append(keras_graph.Node(layer.name, layer.name, "Bidirectional" if layer.bidirectional else "LSTM",
                                      conf, [f"{layer.name}__in"], [f"{layer.name}:0"], [None], layer=layer))
    return keras_graph.Graph("rnnconvert", inputs, nodes, [n.outputs[0] for n in nodes])


def check(ckpt: Checkpoint, *, recurrent_only: bool = False, whole_model: Any = None, states: bool = False,
          **_: Any) -> list[str]:
    """Refuse what the program cannot compute (:func:`refusals`; a whole model's layers outside the whitelist, by
    name); return notes. ``states`` (CLI ``--states``): a whole model's program carries states (:func:`carried`;
    their names kept in ``ckpt.meta["pt2_states"]`` for the check of the written file).

    Raises:
        UnsupportedError: one line naming the layer, the feature and the way out; ``states`` with a Bidirectional or
            go_backwards layer.
    """
    from ....engine import refusal

    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "pt2", "a torch.export recurrent module")
    if recurrent_only:
        ckpt.meta["pt2_recurrent_only"] = True  # read by the torch_export runtime's verify_whole
    if whole_model is None or recurrent_only:
        why = (["weights-only Keras file: it holds no architecture, so only the recurrent layers are written"]
               if ckpt.format == "keras_h5" and not recurrent_only else [])
        return why + ["a torch.export program of the recurrent layers: one input '<layer>__in' (B, T, I) and one output "
                "per layer, positional in layer order"] + (
            ["states: written for whole models only; this program's layers take zero initial states"] if states else [])
    graph = keras_graph.build(whole_model.config, whole_model.weights, ckpt)
    keras_graph.from_config(build_module, graph, bool(states))
    notes = [f"whole model written: {len(graph.nodes)} layer call(s) in one torch.export program; inputs "
             + ", ".join(f"'{n}' ({'token ids' if e is not None else 'float32'})" for n, _, _, e in graph.inputs)
             + "; recurrent layers: torch's own LSTM kernel where it computes the Keras cell (masks by moving "
             "the unmasked steps together), else one scan over time of the Keras equations"]
    steps = program_steps(graph)
    if steps is not None:
        notes.append(f"strided layers shrink the free time axis: the program runs the lengths at which no layer's "
                     f"time axis shrinks to one step (torch.export specializes sizes of 1; exported and verified "
                     f"at {steps} steps)")
    if states:
        keys = carried(graph)
        ckpt.meta["pt2_states"] = {f"state_in:{n}:{k}": size for n, k, size in keys}
        notes.append(f"states: the program's last input is a dict of the initial states of "
                     f"{', '.join(sorted({repr(n) for n, _, _ in keys})) or 'no layer'} by name 'state_in:<layer>:h' "
                     "(and ':c'), (batch, units) float32 (zeros for a first chunk); its last output the dict of their "
                     "final states 'state_out:<layer>:h' (':c'): feed a chunk's to the next chunk")
    return notes


def graph_of(ckpt: Checkpoint, whole_model: Any, recurrent_only: bool) -> keras_graph.Graph:
    """The graph ``.pt2`` writes: the whole model, or the recurrent layers alone."""
    if whole_model is None or recurrent_only:
        return _recurrent_graph(ckpt)
    return keras_graph.build(whole_model.config, whole_model.weights, ckpt)


#: strided / pooling layers: the time axis shrinks, so the example length of :func:`export` is chosen with care
SHRINKING = {"Conv1D", "Conv2D", "MaxPooling1D", "AveragePooling1D", "MaxPooling2D", "AveragePooling2D"}


def shrinks_time(graph: keras_graph.Graph) -> bool:
    """Whether ``graph`` has a free dimension that strided or pooling layers shrink (see :func:`_example_steps`)."""
    free = any(d is None for _, shape, _, _ in graph.inputs for d in shape)
    return free and any(n.cls in SHRINKING and (n.config.get("strides") not in (None, 1, [1], [1, 1])
                                                or "Pooling" in n.cls) for n in graph.nodes)


def program_steps(graph: keras_graph.Graph) -> int | None:
    """The example length the program of ``graph`` is exported at when strided layers shrink its free time axis
    (verification's generated inputs use it: the program runs the lengths at which no time-derived size is 1),
    else ``None``."""
    return _example_steps(graph, build_module(graph)) if shrinks_time(graph) else None


def _example_steps(graph: keras_graph.Graph, module) -> int:
    """The example length of free dimensions for ``torch.export``: 13, or, when strided layers shrink the time axis
    to one step at that length, a longer one (61, 253) with which no time-derived size is 1 (``torch.export``
    specializes sizes of 0 and 1: the program would then run that length only). Found by running ``module``
    eagerly at ``T`` and ``2T + 1``: a size that differs is time-derived."""
    torch = require("torch", "torch")
    if not shrinks_time(graph):
        return 13

    def shapes(steps):
        args = [torch.ones([2] + [steps if d is None else int(d) for d in shape],
                           dtype=torch.int32 if emb is not None else torch.float32)
                for _, shape, _, emb in graph.inputs]
        module.record = True
        with torch.no_grad():
            module(*args)
        module.record = False
        return {k: tuple(v.shape) for k, v in module.layer_outputs.items()}

    for steps in (13, 61, 253):
        a, b = shapes(steps), shapes(2 * steps + 1)
        if not any(x == 1 and x != y for k in a for x, y in zip(a[k], b.get(k, a[k]))):
            return steps
    return 253


def export(graph: keras_graph.Graph, states: bool = False):
    """``torch.export.export`` of :func:`build_module` on example inputs (batch 2; a free time dimension at
    :func:`_example_steps`, a declared one at its declared length), the batch and free dimensions dynamic and a
    declared time (first) dimension ``Dim.AUTO``: free wherever the model computes every length (a declared time
    axis is a length Keras built the model at, not one it needs), fixed where a layer needs that size (``Flatten`` or a
    ``Reshape`` over time, a declared ``RepeatVector``...); :func:`free_dims` says which stayed free. ``states``:
    the program of ``build_module(graph, states=True)``, its last input the dict of initial states (batch dynamic).
    """
    torch = require("torch", "torch")
    m = build_module(graph, states).eval()
    args, dyn = [], []
    steps = _example_steps(graph, build_module(graph).eval() if states else m)
    for name, shape, _, emb in graph.inputs:
        dims = [2] + [steps if d is None else int(d) for d in shape]
        args.append(torch.ones(dims, dtype=torch.int32) if emb is not None else torch.zeros(dims))
        spec = {0: torch.export.Dim.DYNAMIC}
        spec.update({i + 1: torch.export.Dim.DYNAMIC if d is None else torch.export.Dim.AUTO
                     for i, d in enumerate(shape) if d is None or i == 0})  # declared features stay static
        dyn.append(spec)
    if states:
        keys = carried(graph)
        args.append({f"state_in:{n}:{k}": torch.zeros(2, size) for n, k, size in keys})
        dyn.append({f"state_in:{n}:{k}": {0: torch.export.Dim.DYNAMIC} for n, k, _ in keys})
    torch._dynamo.reset()  # a scan traced for an earlier program (a fixed time length) must not be reused
    with torch.no_grad():
        return torch.export.export(m, tuple(args), dynamic_shapes=(tuple(dyn),))


def free_dims(ep) -> list[list[bool]]:
    """For each user input of the exported program ``ep``, whether each dimension is free (symbolic) in it."""
    import torch

    names = set(ep.graph_signature.user_inputs)
    return [[isinstance(d, torch.SymInt) for d in n.meta["val"].shape]
            for n in ep.graph.nodes if n.op == "placeholder" and n.name in names]


def dims_note(graph: keras_graph.Graph, ep) -> str:
    """One line on the program's input sizes: ``B`` and ``T`` where free, a number where fixed (a declared time
    axis a layer needs, ``Flatten`` over time...)."""
    parts = []
    for (name, shape, _, _), free in zip(graph.inputs, free_dims(ep)):
        dims = ["B" if i == 0 else ("T" if i == 1 else "free") if f else str(int(shape[i - 1]))
                for i, f in enumerate(free)]
        why = " (time fixed: a layer needs that length)" if len(free) > 1 and not free[1] else ""
        parts.append(f"'{name}' ({', '.join(dims)}){why}")
    return "program inputs: " + "; ".join(parts)


def write(ckpt: Checkpoint, path, *, recurrent_only: bool = False, whole_model: Any = None, states: bool = False,
          **_: Any) -> list[str]:
    """Write the ``torch.export`` program (module docstring) to ``path``; one line says how to load it, one the
    program's input dimensions (:func:`dims_note`). The latter and, with strided layers, the lengths the program
    does not run are also stored in the file as ``extra_files["rnnconvert_inputs.txt"]`` (``torch.export.load(f,
    extra_files={"rnnconvert_inputs.txt": ""})`` fills it). ``states``: the program of :func:`build_module` with
    states (a whole model; the state names also in that file). Assumes :func:`check` passed."""
    torch = require("torch", "torch")
    graph = graph_of(ckpt, whole_model, recurrent_only)
    states = bool(states) and whole_model is not None and not recurrent_only
    try:
        ep = export(graph, states)
        limits = [dims_note(graph, ep)]
        state_line = []
        if states:
            keys = carried(graph)
            state_line = ["states: last input {" + ", ".join(f"'state_in:{n}:{k}': (B, {s})" for n, k, s in keys)
                          + "}, last output {" + ", ".join(f"'state_out:{n}:{k}'" for n, k, _ in keys) + "}"]
            limits += state_line
        steps = program_steps(graph)
        if steps is not None:
            limits.append(f"strided layers shrink the time axis: lengths at which some layer's time axis is one "
                          f"step or none are not run (exported at {steps} steps)")
        with open(path, "wb") as fh:  # the limits also inside the file, for whoever loads it
            torch.export.save(ep, fh, extra_files={"rnnconvert_inputs.txt": "\n".join(limits) + "\n"})
    except (RNNConvertError, OSError):  # an OSError is the output's (a full disk): the engine reports it
        raise
    except Exception as exc:  # noqa: BLE001 - tracing a module built from an untrusted config: one line, not a trace
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UnsupportedError(f"'{graph.name}': torch.export could not trace or save the program built from this "
                               f"model's config ({type(exc).__name__}: {first}); convert to .onnx, or "
                               "--recurrent-only") from exc
    ins = ", ".join(n for n, *_ in graph.inputs) + (", states" if states else "")
    return [f"'{graph.name}': torch.export.load(path).module()({ins}) -> tuple of {len(graph.outputs)} output(s) "
            + ("and the dict of final states " if states else "")
            + "(load only files you trust: torch.export.load unpickles)", limits[0]] + state_line
