"""Issue 5 speed benchmark: the cuDNN route against torch on CPU and the numpy reference.

    .venv/bin/python bench/bench_cudnn.py [--hidden 1024 --steps 500 --batch 64 --layers 2]

A 2-layer bidirectional LSTM (H=1024, T=500, batch 64 by default) with gate-distinct random weights:

* ``numpy reference``: :func:`rnnconvert.core.reference.forward` in float64 (the verification oracle) and float32;
* ``torch CPU``: ``nn.LSTM`` on the CPU (oneDNN);
* ``cuDNN module``: ``nn.LSTM`` on CUDA (TF32 off), after one warm-up call, synchronised;
* ``cuDNN packed buffer``: our :func:`rnnconvert.core.cudnn.pack` buffer through ``torch._cudnn_rnn``.

Rows that need a GPU are reported as "no GPU" on a machine without one. Prints a markdown table (median of
``--repeat`` runs; the numpy rows run once when they take more than 20 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rnnconvert.speed.kernels import FAST
from rnnconvert.verify import cudnn_layout as cudnn_check
from rnnconvert.core import reference  # noqa: E402
from rnnconvert.core.model import Cell, DirectionParams, RNNLayer  # noqa: E402


def make_layer(I: int, H: int, layers: int, seed: int = 0) -> RNNLayer:
    rng = np.random.default_rng(seed)
    params = []
    for k in range(layers):
        width = I if k == 0 else 2 * H
        row = []
        for _ in range(2):
            centre = np.repeat(np.arange(4) - 1.5, H)[:, None] * 0.02
            s = 1.0 / np.sqrt(H)
            row.append(DirectionParams(
                (centre + rng.uniform(-s, s, (4 * H, width))).astype(np.float32),
                (centre + rng.uniform(-s, s, (4 * H, H))).astype(np.float32),
                rng.uniform(-s, s, 4 * H).astype(np.float32), rng.uniform(-s, s, 4 * H).astype(np.float32)))
        params.append(row)
    return RNNLayer("bench", Cell.LSTM, I, H, num_layers=layers, bidirectional=True, params=params)


def timed(fn, repeat: int) -> tuple[float, object]:
    out, runs = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - t0)
        if runs[-1] > 20:
            break
    return statistics.median(runs), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--input", type=int, default=256)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import torch

    layer = make_layer(a.input, a.hidden, a.layers)
    x = np.random.default_rng(1).standard_normal((a.batch, a.steps, a.input)).astype(np.float32)
    rows = []
    t, ref = timed(lambda: reference.forward(layer, x, kernels=FAST), 1)
    rows.append(("numpy reference, float64", t, 0.0))
    t, y = timed(lambda: reference.forward(layer, x, np.float32, kernels=FAST), 1)
    rows.append(("numpy reference, float32", t, float(np.abs(y - ref).max())))
    mod = torch.nn.LSTM(a.input, a.hidden, num_layers=a.layers, bidirectional=True, batch_first=True)
    sd = {}
    for k in range(a.layers):
        for d, sfx in enumerate(("", "_reverse")):
            p = layer.params[k][d]
            sd.update({f"weight_ih_l{k}{sfx}": torch.from_numpy(p.w_ih), f"weight_hh_l{k}{sfx}": torch.from_numpy(p.w_hh),
                       f"bias_ih_l{k}{sfx}": torch.from_numpy(p.b_ih), f"bias_hh_l{k}{sfx}": torch.from_numpy(p.b_hh)})
    mod.load_state_dict(sd)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        t, y = timed(lambda: mod(xt)[0].numpy(), a.repeat)
    rows.append((f"torch CPU ({torch.get_num_threads()} threads)", t, float(np.abs(y - ref).max())))
    if cudnn_check.cuda_available():
        for name, fn in (("cuDNN module (nn.LSTM on CUDA)", cudnn_check.forward_module),
                         ("cuDNN packed buffer (torch._cudnn_rnn)", cudnn_check.forward_buffer)):
            fn(layer, x[:, :5])  # warm-up: cuDNN plans, allocations

            def run(fn=fn):
                out = fn(layer, x)
                torch.cuda.synchronize()
                return out

            t, y = timed(run, a.repeat)
            rows.append((name, t, float(np.abs(y - ref).max())))
    else:
        rows.append(("cuDNN routes", float("nan"), float("nan")))
    base = rows[2][1]
    print(f"2-layer bidirectional LSTM, I={a.input}, H={a.hidden}, T={a.steps}, batch {a.batch}\n")
    print("| route | wall time (s) | vs torch CPU | max abs error vs float64 reference |\n|---|---|---|---|")
    for name, t, err in rows:
        if np.isnan(t):
            print(f"| {name} | no GPU on this machine | | |")
        else:
            print(f"| {name} | {t:.3f} | {base / t:.1f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
