"""Small-file benchmark (issue 2): run by hand, results go in docs/performance.md.

    .venv/bin/python bench/bench_small.py [--repeat 5]

Times, each as a fresh process (what a user waits for), median of ``--repeat`` runs:

1. ``rnnconvert --help``;
2. ``rnnconvert textgenrnn.hdf5 out.pt`` (read, convert, write, verify with torch, rename);
3. the same with ``--no-verify``;
4. the baseline users run today: rebuild the textgenrnn model in tf_keras with LSTM layers
   (tf_keras' legacy loader converts the CuDNNLSTM weights), ``load_weights``, and copy each
   layer into ``torch.nn.LSTM`` by hand (kernel.T, recurrent_kernel.T, bias into bias_ih), ``torch.save``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT.parent / "shared" / "realworld" / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5"
EXE = Path(sys.executable).parent / "rnnconvert"

BASELINE = r'''
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"; os.environ["CUDA_VISIBLE_DEVICES"] = ""; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tf_keras as K, torch
inp = K.Input((40,), dtype="int32")
e = K.layers.Embedding(465, 100, name="embedding")(inp)
r1 = K.layers.LSTM(128, return_sequences=True, name="rnn_1")(e)
r2 = K.layers.LSTM(128, return_sequences=True, name="rnn_2")(r1)
c = K.layers.concatenate([e, r1, r2])
class Att(K.layers.Layer):
    def build(self, s): self.W = self.add_weight(name="attention_W", shape=(s[-1], 1))
    def call(self, x): return K.backend.sum(x * K.backend.softmax(K.backend.dot(x, self.W), axis=1), axis=1)
a = Att(name="attention")(c)
out = K.layers.Dense(465, activation="softmax", name="output")(a)
m = K.Model(inp, out)
m.load_weights(sys.argv[1])
sd = {}
for n in ("rnn_1", "rnn_2"):
    k, r, b = m.get_layer(n).get_weights()
    sd[n + ".weight_ih_l0"] = torch.from_numpy(k.T.copy()); sd[n + ".weight_hh_l0"] = torch.from_numpy(r.T.copy())
    sd[n + ".bias_ih_l0"] = torch.from_numpy(b); sd[n + ".bias_hh_l0"] = torch.zeros_like(sd[n + ".bias_ih_l0"])
torch.save(sd, sys.argv[2])
'''


def timed(cmd: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.pt"
        rows = [
            ("rnnconvert --help", [str(EXE), "--help"]),
            ("rnnconvert textgenrnn.hdf5 out.pt (verified)", [str(EXE), str(SRC), str(out), "--force"]),
            ("rnnconvert ... --no-verify", [str(EXE), str(SRC), str(out), "--force", "--no-verify"]),
            ("baseline: tf_keras rebuild + load_weights + hand copy to torch",
             [sys.executable, "-c", BASELINE, str(SRC), str(out)]),
        ]
        res = [(name, timed(cmd, args.repeat)) for name, cmd in rows]
    base = res[-1][1]
    print("| command | median wall time (s) | vs baseline |\n|---|---|---|")
    for name, t in res:
        print(f"| {name} | {t:.3f} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
