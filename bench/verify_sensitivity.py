"""The smallest perturbation verification detects, per cell kind (issues #14, #28; docs/cli.md "Verification").

For real files converted by rnnconvert (textgenrnn LSTM -> .pt, the fixtures' bidirectional GRU and
SimpleRNN -> .pt, the Mycroft GRU -> .onnx; issue #28's fixtures/loose, where the one-step bound is loose and
rule A decides: the tf_keras bidirectional reset-before hard_sigmoid GRU and the TF1 GRUCell stack -> .onnx,
SimpleRNN relu/linear -> .onnx, the TF1 projected peephole LSTM -> .npz), one bias element of the first
direction is moved by ``rel * max|b|`` of its bias vector; a bisection on ``rel`` (log scale) finds the smallest
move that makes ``rnnconvert.api.verify`` FAIL with the default batch. One element per gate block is tried.
Then the smallest swap: the rows of ONE hidden unit exchanged between two gate blocks (in W_ih, W_hh and
the bias at once; a whole-block swap is that for every unit), for unit 0 of every pair of gate blocks:
how many of the pairs FAIL.

    PYTHONPATH=$PWD python bench/verify_sensitivity.py [label-substring]
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rnnconvert import api  # noqa: E402

FX = ROOT / "fixtures"
CASES = [  # (label, source, target ext, bias key, hidden size, gates)
    ("LSTM (textgenrnn rnn_1, torch)", FX / "realworld/textgenrnn-reddit-cudnnlstm/reddit_rarepuppers_politics.hdf5",
     "pt", "rnn_1.bias_ih_l0", 128, "ifgo"),
    ("GRU reset_after (bidi_gru_sum, torch)", FX / "keras/bidi_gru_sum.h5", "pt", "bidi.bias_ih_l0", 3, "rzn"),
    ("GRU reset_before, linear (Mycroft, onnxruntime)", FX / "realworld/mycroft-precise-gru/hey-mycroft.net",
     "onnx", "net.B", 20, "zrh"),
    ("SimpleRNN tanh (simple_rnn_tanh, torch)", FX / "keras/simple_rnn_tanh.h5", "pt", "rnn.bias_ih_l0", 6, "h"),
    ("GRU reset_before, hard_sigmoid, bidi, loose (keras_bidi_gru_before bg2, onnxruntime)",
     FX / "loose/keras_bidi_gru_before.h5", "onnx", "bg2.B", 40, "zrh"),
    ("GRU reset_before TF1 GRUCell, loose (tf1_gru_stack l1, onnxruntime)", FX / "loose/tf1_gru_stack.pb", "onnx",
     "stack.l1.B", 80, "zrh"),
    ("SimpleRNN relu (keras_simple_rnn_stack, onnxruntime)", FX / "loose/keras_simple_rnn_stack.h5", "onnx",
     "rnn_relu.B", 16, "h"),
    ("SimpleRNN linear (keras_simple_rnn_stack, onnxruntime)", FX / "loose/keras_simple_rnn_stack.h5", "onnx",
     "rnn_linear.B", 16, "h"),
    ("LSTM projected + peepholes (tf1_lstm_proj_peep, numpy reference on .npz)", FX / "loose/tf1_lstm_proj_peep.pb",
     "npz", "layers/0/l0/d0/b_ih", 16, "ifgo"),
]

#: the weight keys (rows in gate blocks along axis 0, or axis 1 of ONNX's (dirs, G*H, .) tensors) of each bias key
WEIGHTS = {"rnn_1.bias_ih_l0": ("rnn_1.weight_ih_l0", "rnn_1.weight_hh_l0", "rnn_1.bias_hh_l0"),
           "bidi.bias_ih_l0": ("bidi.weight_ih_l0", "bidi.weight_hh_l0", "bidi.bias_hh_l0"),
           "layers/0/l0/d0/b_ih": ("layers/0/l0/d0/w_ih", "layers/0/l0/d0/w_hh", "layers/0/l0/d0/b_hh")}


def _edit(good: Path, ext: str, out: Path, fn) -> Path:
    """``good`` with ``fn(arrays)`` applied to its arrays (a dict of numpy arrays, edited in place), as ``out``."""
    if ext == "pt":
        import torch

        sd = {k: v.numpy().copy() for k, v in torch.load(good, weights_only=True).items()}
        fn(sd)
        torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, out)
        return out
    if ext == "npz":
        z = dict(np.load(good))
        fn(z)
        np.savez(out, **z)
        return out
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(good))
    arrays = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    fn(arrays)
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    onnx.save(model, str(out))
    return out


def _mutated(good: Path, ext: str, key: str, j: int, rel: float, out: Path) -> Path:
    def fn(arrays):
        flat = arrays[key].reshape(-1)
        flat[j] += np.float32(rel * float(np.abs(flat).max()))
    return _edit(good, ext, out, fn)


def _unit_swap(good: Path, ext: str, key: str, H: int, G: int, a: int, b: int, out: Path) -> Path:
    """The rows of hidden unit 0 of gate blocks ``a`` and ``b`` exchanged in W_ih, W_hh and the biases."""
    def fn(arrays):
        if ext == "onnx":
            node = key[:-2]
            for k in ("W", "R"):
                w = arrays[f"{node}.{k}"][0]
                w[[a * H, b * H]] = w[[b * H, a * H]]
            bias = arrays[f"{node}.B"][0]
            for half in (0, G * H):
                bias[[half + a * H, half + b * H]] = bias[[half + b * H, half + a * H]]
            return
        for k in (key, *WEIGHTS[key]):
            w = arrays[k]
            w[[a * H, b * H]] = w[[b * H, a * H]]
    return _edit(good, ext, out, fn)


def smallest(src: Path, good: Path, ext: str, key: str, j: int, lo: float = 1e-9, hi: float = 1e-1,
             rounds: int = 10) -> float:
    """Smallest ``rel`` (within a factor ``(hi/lo)**(2**-rounds)``) that fails; ``inf`` if ``hi`` passes."""
    tmp = good.parent / f"m.{ext}"

    def fails(rel: float) -> bool:
        return api.verify(src, _mutated(good, ext, key, j, rel, tmp)).failed

    if not fails(hi):
        return math.inf
    for _ in range(rounds):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    return hi


def main(only: str = "") -> None:
    import itertools

    with tempfile.TemporaryDirectory() as d:
        for label, src, ext, key, H, gates in CASES:
            if only not in label:
                continue
            good = Path(d) / f"good.{ext}"
            good.unlink(missing_ok=True)
            rep = api.convert(src, good).verification
            found = {g: smallest(src, good, ext, key, i * H) for i, g in enumerate(gates)}
            line = (f"{label} [{rep.verdict}]: smallest detected bias move (x max|b|), element 0 of each gate "
                    f"block: " + ", ".join(f"{g} {v:.1e}" for g, v in found.items()))
            pairs = list(itertools.combinations(range(len(gates)), 2))
            if pairs and (ext == "onnx" or key in WEIGHTS):
                caught = [api.verify(src, _unit_swap(good, ext, key, H, len(gates), a, b, Path(d) / f"s.{ext}")).failed
                          for a, b in pairs]
                line += f"; one unit's rows swapped between two gate blocks: {sum(caught)} of {len(pairs)} pairs FAIL"
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
