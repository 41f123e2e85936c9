"""An ONNX ``LSTM`` / ``GRU`` / ``RNN`` node as elementwise ops in a ``Scan`` over time (issue #41, runtime
profiles: :mod:`.profiles`), for runtimes that refuse some native nodes or compute them otherwise (OpenVINO 2026.4
refuses activations other than ``Sigmoid`` / ``Tanh`` / ``Relu`` there and returns other states where
``sequence_lens`` or initial states are given).

:func:`node` takes the native node's inputs and attributes as :mod:`.model_write` builds them and returns tensors
of the same meaning (ONNX operator spec, op set 14), from the same ``W`` / ``R`` / ``B`` initializers (kept as
the native node would have them: the per-layer checks run them as that node,
:func:`rnnconvert.runtimes.onnxruntime.one_node`) and a transposed copy of each direction's ``R`` read by the Scan
body (OpenVINO 2026.4's ``Scan`` reads initializers of the outer graph, not values computed there): ``Y``
``(T, D, B, H)``, ``Y_h`` ``(D, B, H)`` and, for an LSTM, ``Y_c``. Each direction is one ``Scan`` (a ``reverse``
direction with ``scan_input_directions`` / ``scan_output_directions`` 1, so ``Y`` stays in time order); the
input products ``X W^T + bias`` are one ``MatMul`` over the whole sequence outside it, the body computes the
recurrent product and the cell:

- LSTM (gates ``i o f c``): ``c' = f(g_f) * c + f(g_i) * g(g_c)``, ``h' = f(g_o) * h(c')``;
- GRU (gates ``z r h``): ``z = f(.)``, ``r = f(.)``, ``linear_before_reset=0``: ``n = g(x W_h + (r * h) R_h^T +
  Rb_h + Wb_h)``, ``=1``: ``n = g(x W_h + Wb_h + r * (h R_h^T + Rb_h))``; ``h' = (1 - z) * n + z * h``;
- RNN: ``h' = f(x W^T + h R^T + Wb + Rb)``.

With ``sequence_lens``, a step ``t >= len`` keeps the state and outputs zero (the spec's and onnxruntime's
behaviour; a reverse direction starts at ``len - 1``). Activations: ``HardSigmoid(alpha, beta)`` as ``Clip(alpha
* x + beta, 0, 1)`` (tf_keras ``hard_sigmoid``'s own order of operations), ``Affine(alpha, beta)`` as ``alpha * x
+ beta``, the others by their op. Peepholes are not built (Keras layers have none). Checked by OpenVINO and
onnxruntime against tf_keras in ``tests/formats/whole_models/test_whole_runtime_openvino.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: activations that take ``alpha`` and ``beta`` from the node's lists (ONNX operator spec)
_AB = ("HardSigmoid", "Affine")
_PLAIN = ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus")


def _i64(v) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


def activations(attrs: dict) -> list[tuple[str, float | None, float | None]]:
    """The node's activations as ``(op, alpha, beta)`` in order (every direction's, ONNX layout)."""
    alpha, beta = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    out = []
    for a in attrs["activations"]:
        if a in _AB:
            out.append((a, alpha.pop(0), beta.pop(0)))
        elif a in _PLAIN:
            out.append((a, None, None))
        else:  # pragma: no cover - onnx_write writes no other
            raise AssertionError(a)
    return out


class _Body:
    """The nodes of one Scan body: constants as ``Constant`` nodes (inside the body)."""

    def __init__(self, g, base: str):
        self.g, self.base, self.nodes = g, base, []

    def op(self, op: str, ins: list[str], n_out: int = 1, **attrs):
        outs = [self.g.fresh(self.base + "_s") for _ in range(n_out)]
        self.nodes.append(self.g.h.make_node(op, ins, outs, name=self.g.fresh(self.base + "_s" + op), **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, arr: np.ndarray) -> str:
        return self.op("Constant", [], value=self.g.nh.from_array(np.ascontiguousarray(arr), self.g.fresh("c")))

    def act(self, x: str, a: tuple) -> str:
        op, alpha, beta = a
        if op == "HardSigmoid":  # tf_keras hard_sigmoid: clip(0.2 * x + 0.5, 0, 1)
            y = self.op("Add", [self.op("Mul", [x, self.const(np.float32(alpha))]), self.const(np.float32(beta))])
            return self.op("Clip", [y, self.const(np.float32(0.0)), self.const(np.float32(1.0))])
        if op == "Affine":
            if alpha == 1.0 and beta == 0.0:
                return x
            return self.op("Add", [self.op("Mul", [x, self.const(np.float32(alpha))]), self.const(np.float32(beta))])
        return self.op(op, [x])


def _arr(g, name: str) -> np.ndarray:
    t = next(t for t in g.inits if t.name == name)
    return g.nh.to_array(t)


def node(g, op: str, ins: list[str], attrs: dict[str, Any], base: str) -> list[str]:
    """``[Y, Y_h(, Y_c)]`` of the ``op`` node of inputs ``ins`` (``X W R B sequence_lens initial_h initial_c``,
    empty names for the absent ones) and attributes ``attrs``, built as Scans (module docstring). The node's
    ``R`` / ``B`` initializers are read from ``g`` for the body's copies.

    Raises:
        AssertionError: a peephole input or an activation outside the ones ``onnx_write`` writes (internal)."""
    ins = list(ins) + [""] * (8 - len(ins))
    x, w_name, r_name, b_name, lens, init_h, init_c, peep = ins[:8]
    assert not peep, "peepholes are not decomposed"
    R = _arr(g, r_name)
    D, GH, H = R.shape
    acts = activations(attrs)
    per = len(acts) // D
    lbr = int(attrs.get("linear_before_reset", 0))
    direction = attrs.get("direction", "forward")
    tp = g.TP
    shape_x = g.op("Shape", [x], base)
    bh = g.op("Concat", [g.op("Slice", [shape_x, g.const(_i64([1]), "s"), g.const(_i64([2]), "e")], base),
                         g.const(_i64([H]), "H")], base, axis=0)
    zeros = g.op("Expand", [g.const(np.zeros((), np.float32), "zero"), bh], base)  # (B, H)
    active = None
    if lens:  # (T, B, 1): step t of sequence b is run (t < len)
        T = g.op("Slice", [shape_x, g.const(_i64([0]), "s"), g.const(_i64([1]), "e")], base)
        t = g.op("Range", [g.const(_i64(0), "zero"), g.op("Squeeze", [T, g.const(_i64([0]), "ax")], base),
                           g.const(_i64(1), "one")], base)
        active = g.op("Unsqueeze", [g.op("Less", [g.op("Unsqueeze", [t, g.const(_i64([1]), "ax")], base),
                                                  g.op("Unsqueeze", [g.op("Cast", [lens], base, to=tp.INT64),
                                                                     g.const(_i64([0]), "ax")], base)], base),
                                    g.const(_i64([2]), "ax")], base)
    ys, hs, cs = [], [], []
    for d in range(D):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        dd = g.const(_i64([d]), "d")

        def part(name: str) -> str:  # direction d of initializer ``name``, its leading axis dropped
            return g.op("Squeeze", [g.op("Gather", [name, dd], base, axis=0), g.const(_i64([0]), "ax")], base)

        def cut(t: str, a: int, b: int, axis: int) -> str:
            return g.op("Slice", [t, g.const(_i64([a]), "s"), g.const(_i64([b]), "e"), g.const(_i64([axis]), "a")],
                        base)

        xw = g.op("MatMul", [x, g.op("Transpose", [part(w_name)], base, perm=[1, 0])], base)  # (T, B, G*H)
        # the body reads initializers of the outer graph (OpenVINO 2026.4's Scan takes no computed outer value)
        rts = np.ascontiguousarray(R[d].T.astype(np.float32))  # (H, G*H)
        rt = g.const(rts, base + ".Rt") if op != "GRU" else None
        rbh = None
        if b_name:
            bd = part(b_name)
            rb = cut(bd, GH, 2 * GH, 0)
            if op == "GRU" and lbr:  # R_bh stays inside r * (h R_h^T + R_bh)
                rbh = g.const(_arr(g, b_name)[d, GH + 2 * H:].astype(np.float32), base + ".Rbh")
                rb = g.op("Mul", [rb, g.const(np.repeat(np.float32([1, 1, 0]), H), "keep")], base)
            xw = g.op("Add", [xw, g.op("Add", [cut(bd, 0, GH, 0), rb], base)], base)
        states = [init_h, init_c][:2 if op == "LSTM" else 1]
        first = [g.op("Squeeze", [g.op("Gather", [s, g.const(_i64([d]), "d")], base, axis=0), g.const(_i64([0]), "ax")],
                      base) if s else zeros for s in states]  # (B, H)
        body = _Body(g, base)
        names = [g.fresh(base + "_h"), g.fresh(base + "_c")][:len(states)]
        xt, at = g.fresh(base + "_x"), g.fresh(base + "_a")
        h = names[0]
        a = acts[d * per:(d + 1) * per]
        if op == "LSTM":
            gates = body.op("Add", [xt, body.op("MatMul", [h, rt])])
            gi, go, gf, gc = body.op("Split", [gates], n_out=4, axis=1)
            c_new = body.op("Add", [body.op("Mul", [body.act(gf, a[0]), names[1]]),
                                    body.op("Mul", [body.act(gi, a[0]), body.act(gc, a[1])])])
            h_new = body.op("Mul", [body.act(go, a[0]), body.act(c_new, a[2])])
            new = [h_new, c_new]
        elif op == "GRU":
            xz, xr, xh = body.op("Split", [xt], n_out=3, axis=1)
            hz, hr = body.op("Split", [body.op("MatMul", [h, g.const(np.ascontiguousarray(rts[:, :2 * H]),
                                                                      base + ".Rzr")])], n_out=2, axis=1)
            z = body.act(body.op("Add", [xz, hz]), a[0])
            r = body.act(body.op("Add", [xr, hr]), a[0])
            rh = g.const(np.ascontiguousarray(rts[:, 2 * H:]), base + ".Rh")
            if lbr:
                hr_h = body.op("MatMul", [h, rh])
                inner = body.op("Mul", [r, body.op("Add", [hr_h, rbh]) if rbh else hr_h])
            else:
                inner = body.op("MatMul", [body.op("Mul", [r, h]), rh])
            n = body.act(body.op("Add", [xh, inner]), a[1])
            one_minus = body.op("Sub", [body.const(np.float32(1.0)), z])
            h_new = body.op("Add", [body.op("Mul", [one_minus, n]), body.op("Mul", [z, h])])
            new = [h_new]
        else:
            h_new = body.act(body.op("Add", [xt, body.op("MatMul", [h, rt])]), a[0])
            new = [h_new]
        if active is not None:
            outs = [body.op("Where", [at, v, s]) for v, s in zip(new, names)]
            y = body.op("Where", [at, h_new, body.const(np.zeros((), np.float32))])
        else:
            outs = [body.op("Identity", [v]) for v in new]
            y = body.op("Identity", [h_new])
        vi = g.h.make_tensor_value_info
        b_in = [vi(nm, tp.FLOAT, ["B", H]) for nm in names] + [vi(xt, tp.FLOAT, ["B", GH])]
        if active is not None:
            b_in.append(vi(at, tp.BOOL, ["B", 1]))
        b_out = [vi(o, tp.FLOAT, ["B", H]) for o in outs] + [vi(y, tp.FLOAT, ["B", H])]
        graph = g.h.make_graph(body.nodes, g.fresh(base + "_body"), b_in, b_out)
        scans = [xw] + ([active] if active is not None else [])
        res = g.op("Scan", first + scans, base, n_out=len(states) + 1, body=graph, num_scan_inputs=len(scans),
                   scan_input_directions=[int(reverse)] * len(scans), scan_output_directions=[int(reverse)])
        ax0 = g.const(_i64([0]), "ax")
        hs.append(g.op("Unsqueeze", [res[0], ax0], base))
        if op == "LSTM":
            cs.append(g.op("Unsqueeze", [res[1], ax0], base))
        ys.append(g.op("Unsqueeze", [res[-1], g.const(_i64([1]), "ax")], base))  # (T, 1, B, H)

    def cat(parts: list[str], axis: int) -> str:
        return parts[0] if len(parts) == 1 else g.op("Concat", parts, base, axis=axis)

    return [cat(ys, 1), cat(hs, 0)] + ([cat(cs, 0)] if op == "LSTM" else [])
