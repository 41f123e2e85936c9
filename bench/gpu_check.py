"""Check rnnconvert's cuDNN buffer layout against real cuDNN; print a markdown report to stdout.

    PYTHONPATH=$PWD .venv/bin/python bench/gpu_check.py > report.md

On a machine without CUDA it prints a report saying so and exits 0. Checks (see docs/gpu-validation.md):
1. region offsets from ``torch._cudnn_rnn_flatten_weight`` (via ``flatten_parameters``) against
   ``rnnconvert.core.cudnn.layout`` for a grid of specs (float32 and float16);
2. cuDNN forward of ``nn.LSTM/GRU/RNN`` loaded from ``unpack(pack(layer))`` against ``reference.forward``;
3. cuDNN forward of our packed buffer handed to ``torch._cudnn_rnn`` against ``reference.forward``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from rnnconvert.gpu import cudnn_check
from rnnconvert.core import reference  # noqa: E402


def main() -> int:
    print("# cuDNN layout check\n")
    if not cudnn_check.cuda_available():
        print("No CUDA device with cuDNN is visible to torch: nothing was checked.")
        return 0
    import torch

    from test_cudnn import CUDA_GRID, random_layer  # the same grid and weights as the cuda tests

    v = cudnn_check.versions()
    print("| item | value |\n|---|---|")
    for k, val in v.items():
        print(f"| {k} | {val} |")
    failures = 0
    print("\n## Region offsets (layout() vs cuDNN via torch._cudnn_rnn_flatten_weight)\n")
    print("| spec | dtype | result |\n|---|---|---|")
    for spec in CUDA_GRID:
        for dt in (torch.float32, torch.float16):
            try:
                bad = cudnn_check.compare_offsets(spec, dt)
            except Exception as exc:  # report, do not stop
                bad = [f"error: {exc!r}"]
            failures += bool(bad)
            print(f"| {spec} | {dt} | {'ok' if not bad else '; '.join(bad[:4])} |")
    print("\n## Forward: cuDNN vs numpy reference (float32, TF32 off)\n")
    print("| spec | route | max abs err | max rel err | time (s) |\n|---|---|---|---|---|")
    for spec in CUDA_GRID:
        layer = random_layer(spec, seed=3)
        x = np.random.default_rng(4).normal(size=(2, 6, spec.input_size)).astype(np.float32)
        ref = reference.forward(layer, x)
        for route, fn in (("module", cudnn_check.forward_module), ("buffer", cudnn_check.forward_buffer)):
            t0 = time.perf_counter()
            try:
                y = fn(layer, x)
                err = float(np.max(np.abs(y - ref)))
                rel = float(np.max(np.abs(y - ref) / (np.abs(ref) + 1e-6)))
                ok = np.allclose(y, ref, atol=2e-5, rtol=1e-4)
                cell = f"{err:.2e} | {rel:.2e}" + ("" if ok else " FAIL")
            except Exception as exc:
                ok, cell = False, f"error: {exc!r} | -"
            failures += not ok
            print(f"| {spec} | {route} | {cell} | {time.perf_counter() - t0:.3f} |")
    print(f"\n**{failures} failing checks.**")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
