"""The smallest perturbation verification detects, per cell kind (issue #14; docs/cli.md "Verification").

For real files converted by rnnconvert (textgenrnn LSTM -> .pt, the fixtures' bidirectional GRU and
SimpleRNN -> .pt, the Mycroft GRU -> .onnx), one bias element of the first direction is moved by
``rel * max|b|`` of its bias vector; a bisection on ``rel`` (log scale) finds the smallest move that
makes ``rnnconvert.api.verify`` FAIL with the default batch. One element per gate block is tried.

    PYTHONPATH=$PWD python bench/verify_sensitivity.py
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
]


def _mutated(good: Path, ext: str, key: str, j: int, rel: float, out: Path) -> Path:
    if ext == "pt":
        import torch

        sd = torch.load(good, weights_only=True)
        b = sd[key].clone()
        b[j] += rel * float(b.abs().max())
        sd[key] = b
        torch.save(sd, out)
        return out
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(good))
    for t in model.graph.initializer:
        if t.name == key:
            a = numpy_helper.to_array(t).copy()
            flat = a.reshape(-1)
            flat[j] += np.float32(rel * float(np.abs(flat).max()))
            t.CopyFrom(numpy_helper.from_array(a, key))
    onnx.save(model, str(out))
    return out


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


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for label, src, ext, key, H, gates in CASES:
            good = Path(d) / f"good.{ext}"
            good.unlink(missing_ok=True)
            api.convert(src, good)
            found = {g: smallest(src, good, ext, key, i * H) for i, g in enumerate(gates)}
            print(f"{label}: smallest detected bias move (x max|b|), element 0 of each gate block: "
                  + ", ".join(f"{g} {v:.1e}" for g, v in found.items()), flush=True)


if __name__ == "__main__":
    main()
