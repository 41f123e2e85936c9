"""Large synthetic checkpoints for ``bench/bench_large.py`` (issue 7), made by the real frameworks.

    .venv/bin/python bench/gen_large.py [--out /tmp/rnnbench] [--hidden 2048] [--layers 8] [--input 80]
                                        [--dtypes float32,float16] [--formats h5,pt,tf]

Writes, per dtype (``f32`` / ``f16``):

* ``keras_<dt>.h5``: a tf_keras ``Sequential`` of ``--layers`` ``Bidirectional(LSTM(H, return_sequences=True))``
  saved with ``model.save(..., save_format='h5')`` (full model: config + ``model_weights``);
* ``torch_<dt>.pt``: ``torch.save`` of the state dict of ``nn.LSTM(I, H, num_layers, bidirectional=True)``;
* ``tfckpt_<dt>/ckpt.{index,data-00000-of-00001}`` (``--formats tf``): the same tf_keras model (same
  weights: same seed) saved with ``model.save_weights(..., save_format='tf')``, a TF2 object-based checkpoint.

The default (H=2048, 8 layers, I=80) is the issue's size: about 740 M parameters, 2.96 GB in float32.
``--hidden 512`` gives a quick ~190 MB run. Never commit the output (it goes under /tmp/rnnbench).

Weights are gate-distinct and cheap to make: the layers are built with ``zeros`` initializers (no
orthogonal/glorot work on GB-sized matrices), then each gate block ``j`` is filled uniformly in its own
range ``s * [-1 + 0.5 j, -0.5 + 0.5 j]`` (``s = 1/sqrt(fan_in)``), so activations stay O(1) and a gate
permutation slip would show in verification. One layer's arrays exist in numpy at a time.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def gate_block_fill(arr: np.ndarray, H: int, rng: np.random.Generator, axis: int) -> np.ndarray:
    """Fill ``arr`` in place: gate block ``j`` (along ``axis``, width ``H``) uniform in ``s*[-1+0.5j, -0.5+0.5j]``."""
    fan_in = arr.shape[1 - axis] if arr.ndim == 2 else H
    s = np.float32(1.0 / np.sqrt(fan_in))
    tmp = rng.random(arr.shape, dtype=np.float32)
    tmp *= np.float32(0.5)
    for j in range(arr.shape[axis] // H):
        sl = [slice(None)] * arr.ndim
        sl[axis] = slice(j * H, (j + 1) * H)
        tmp[tuple(sl)] += np.float32(-1.0 + 0.5 * j)
    tmp *= s
    arr[...] = tmp
    return arr


def make_keras(path: Path, H: int, layers: int, I: int, dtype: str, seed: int, tf_ckpt: bool = False) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tf_keras as K

    rng = np.random.default_rng(seed)
    model = K.Sequential(name="speech")
    model.add(K.Input((None, I), dtype=dtype))
    for k in range(layers):
        model.add(K.layers.Bidirectional(
            K.layers.LSTM(H, return_sequences=True, kernel_initializer="zeros", recurrent_initializer="zeros",
                          bias_initializer="zeros", dtype=dtype), name=f"blstm_{k}", dtype=dtype))
    for lay in model.layers:
        ws = []
        for w in lay.get_weights():  # forward kernel, recurrent, bias, then backward
            a = np.empty(w.shape, np.float32)
            gate_block_fill(a, H, rng, axis=a.ndim - 1)
            ws.append(a.astype(dtype))
        lay.set_weights(ws)
        del ws
    if tf_ckpt:  # TF2 object-based checkpoint: <dir>/ckpt.index + ckpt.data-00000-of-00001
        path.mkdir(parents=True, exist_ok=True)
        model.save_weights(str(path / "ckpt"), save_format="tf")
    else:
        model.save(str(path), save_format="h5")


def make_torch(path: Path, H: int, layers: int, I: int, dtype: str, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(I, H, num_layers=layers, bidirectional=True, batch_first=True, device="meta")
    lstm = lstm.to_empty(device="cpu")  # no default init: every parameter is filled below
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for _, p in lstm.named_parameters():
            a = np.empty(tuple(p.shape), np.float32)
            gate_block_fill(a, H, rng, axis=0)
            p.copy_(torch.from_numpy(a))
    if dtype == "float16":
        lstm = lstm.half()
    torch.save(lstm.state_dict(), str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/rnnbench")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--input", type=int, default=80)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--formats", default="h5,pt,tf")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for dt in args.dtypes.split(","):
        tag = {"float32": "f32", "float16": "f16"}[dt]
        for fmt in args.formats.split(","):
            path = out / {"h5": f"keras_{tag}.h5", "pt": f"torch_{tag}.pt", "tf": f"tfckpt_{tag}"}[fmt]
            t0 = time.perf_counter()
            if fmt == "pt":
                make_torch(path, args.hidden, args.layers, args.input, dt, args.seed)
            else:
                make_keras(path, args.hidden, args.layers, args.input, dt, args.seed, tf_ckpt=fmt == "tf")
            size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            print(f"{path}: {size / 1e9:.3f} GB in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
