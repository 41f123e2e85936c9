"""A broken copy of a large converted ``.pt`` for verification to catch (issue #18): run by hand after
``bench/gen_large.py`` and a conversion of its Keras file to ``.pt``; result in docs/performance.md.

    .venv/bin/python bench/mutate_large.py [--dir /tmp/rnnbench] [--hidden 2048]

torch itself loads ``<dir>/out_f32.pt`` (the conversion of ``keras_f32.h5``), swaps the f and g gate blocks
of ``blstm_3.weight_hh_l0`` and the i and f blocks of ``blstm_5.bias_ih_l0_reverse`` alone (torch gate order
i f g o), saves ``<dir>/bad.pt`` with ``torch.save`` and runs ``rnnconvert verify keras_f32.h5 bad.pt``,
which must exit 5 with those two layers FAILED and the others ok.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/rnnbench")
    ap.add_argument("--hidden", type=int, default=2048)
    args = ap.parse_args()
    import torch

    d, H = Path(args.dir), args.hidden
    sd = dict(torch.load(d / "out_f32.pt", mmap=True, weights_only=True))

    def swap(t, a: int, b: int):
        t, blk = t.clone(), (lambda j: slice(j * H, (j + 1) * H))
        t[blk(a)], t[blk(b)] = t[blk(b)].clone(), t[blk(a)].clone()
        return t

    sd["blstm_3.weight_hh_l0"] = swap(sd["blstm_3.weight_hh_l0"], 1, 2)
    sd["blstm_5.bias_ih_l0_reverse"] = swap(sd["blstm_5.bias_ih_l0_reverse"], 0, 1)
    torch.save(sd, d / "bad.pt")
    del sd
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "verify", str(d / "keras_f32.h5"), str(d / "bad.pt")],
                       capture_output=True, text=True)
    print(f"exit {r.returncode} in {time.perf_counter() - t0:.1f} s\n{r.stdout}{r.stderr}")


if __name__ == "__main__":
    main()
