"""A Keras HDF5 file's structure without its data, and the file rebuilt from it on a machine without TensorFlow
(the GPU machine of ``bench/device_bench.sh``, issue #33).

    .venv/bin/python bench/h5_skeleton.py make /tmp/rnnbig/keras_f32.h5 bench/data/keras_big_skeleton.h5
    python3 bench/h5_skeleton.py fill bench/data/keras_big_skeleton.h5 /tmp/big.h5 [--seed 7]

``make``: every group, dataset and attribute of a file tf_keras wrote (``bench/gen_large.py``), each dataset
with its shape, dtype and chunking but no data written (HDF5 allocates a contiguous dataset's space at its
first write: the skeleton of the 3.1 GB benchmark is a few tens of KB). ``fill``: the skeleton copied and every
dataset written with gate-distinct values (``gen_large.gate_block_fill``: gate block ``j`` of the last axis in
its own range), the hidden size taken from each LSTM's recurrent kernel ``(H, 4H)``. The groups and attributes
are tf_keras's own; only the values are ours (as ``gen_large`` makes them: tf_keras only stores them).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np


def make(src: Path, dst: Path) -> None:
    import h5py

    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for k, v in f.attrs.items():
            g.attrs[k] = v

        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                grp = g.require_group(name)
            else:
                grp = g.create_dataset(name, shape=obj.shape, dtype=obj.dtype, chunks=obj.chunks)
            for k, v in obj.attrs.items():
                grp.attrs[k] = v
        f.visititems(visit)


def fill(skel: Path, out: Path, seed: int) -> None:
    import h5py

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_large import gate_block_fill

    shutil.copyfile(skel, out)
    rng = np.random.default_rng(seed)
    with h5py.File(out, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        hidden = {}
        for n in names:  # H of each cell from its recurrent kernel (H, 4H)
            if n.endswith("recurrent_kernel:0"):
                hidden[n.rsplit("/", 1)[0]] = f[n].shape[0]
        for n in names:
            ds = f[n]
            H = hidden.get(n.rsplit("/", 1)[0])
            if H is None:
                raise SystemExit(f"{n}: no recurrent kernel beside it to take H from")
            a = np.empty(ds.shape, np.float32)
            gate_block_fill(a, H, rng, axis=a.ndim - 1)
            ds[...] = a.astype(ds.dtype)
            del a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("src", type=Path)
    m.add_argument("dst", type=Path)
    fl = sub.add_parser("fill")
    fl.add_argument("skeleton", type=Path)
    fl.add_argument("out", type=Path)
    fl.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.src, a.dst)
    else:
        fill(a.skeleton, a.out, a.seed)


if __name__ == "__main__":
    main()
