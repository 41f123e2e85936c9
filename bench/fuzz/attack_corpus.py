"""Generators of the outside attack corpus (issue 19), one function per family; each writes a small file
(kilobytes) that declares far more work or memory than it holds, or that a careless reader would follow.

Nothing here is committed as data: ``tests/security/test_attack_corpus.py`` regenerates what it needs under a
temporary folder, and ``python bench/fuzz/attack_corpus.py OUTDIR`` writes the whole corpus for a manual
run (``for f in OUTDIR/*; do rnnconvert "$f" /tmp/out.npz; done`` under ``ulimit -v``/``timeout``).

Every generator takes the output path and returns it (or the folder it made).
"""

from __future__ import annotations

import io
import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np


# ---------------------------------------------------------------------------------------------- .pt


def pt_billion_laughs(path: Path, levels: int = 30, tensor_leaves: bool = True) -> Path:
    """A ``torch.save`` zip whose ``data.pkl`` nests dicts that each hold the same child twice, ``levels``
    deep: the pickle stays small (its memo shares the child), a path-by-path walk does 2**levels work."""
    import torch

    d: dict = {"w": torch.zeros(2)} if tensor_leaves else {"w": 1}
    for _ in range(levels):
        d = {"a": d, "b": d}
    torch.save(d, path)
    return path


def pt_stride0(path: Path, numel: int = 800_000_000, bfloat16: bool = False) -> Path:
    """A state dict whose tensor has stride 0: one stored float presented as ``numel`` (3.2 GB). With
    ``bfloat16`` the restricted reader declines the storage type, so the ``torch.load`` route reads it."""
    import torch

    torch.save({"big": torch.zeros(1, dtype=torch.bfloat16 if bfloat16 else torch.float32).expand(numel)}, path)
    return path


def pt_duplicate_pickle(path: Path) -> Path:
    """A ``torch.save`` zip holding two ``archive/data.pkl`` members (the second one a different state
    dict): which one a reader takes is not defined."""
    import torch

    buf = io.BytesIO()
    torch.save({"x": torch.zeros(2)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            zf.writestr(info, src.read(info))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
            zf.writestr("archive/data.pkl", src.read("archive/data.pkl"))
    return path


# ---------------------------------------------------------------------------------------------- HDF5


def h5_gzip_bomb(path: Path, elements: int = 400_000_000, weights_only: bool = True) -> Path:
    """A Keras 2 weights file whose LSTM kernel is a gzip dataset of ``elements`` zeros (1.6 GB declared,
    a few KB stored: chunks never written read as the fill value)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"lstm"]
        f.attrs["keras_version"] = b"2.15.0"
        g = f.create_group("lstm")
        g.attrs["weight_names"] = [b"lstm/kernel:0", b"lstm/recurrent_kernel:0", b"lstm/bias:0"]
        rows = elements // 400
        g.create_dataset("lstm/kernel:0", shape=(rows, 400), dtype="f4", compression="gzip", chunks=(1024, 400))
        g.create_dataset("lstm/recurrent_kernel:0", data=np.zeros((100, 400), "f4"))
        g.create_dataset("lstm/bias:0", data=np.zeros(400, "f4"))
    return path


def h5_gzip_written(path: Path, rows: int = 40_000) -> Path:
    """A Keras 2 weights file whose LSTM kernel ``(rows, 400)`` float32 is *written*: zeros but for one
    value per row, gzip (a few hundred to one: the shape of a real 18 MB file that inflates to 2 GB, where
    every chunk is stored, scaled down to 64 MB declared)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"lstm"]
        f.attrs["keras_version"] = b"2.15.0"
        g = f.create_group("lstm")
        g.attrs["weight_names"] = [b"lstm/kernel:0", b"lstm/recurrent_kernel:0", b"lstm/bias:0"]
        ds = g.create_dataset("lstm/kernel:0", shape=(rows, 400), dtype="f4", compression="gzip",
                              compression_opts=4, chunks=(4096, 400))
        block = np.zeros((4096, 400), "f4")
        block[:, 0] = np.arange(4096, dtype="f4") / 4096
        for r in range(0, rows, 4096):
            n = min(4096, rows - r)
            ds[r:r + n] = block[:n]
        g.create_dataset("lstm/recurrent_kernel:0", data=np.zeros((100, 400), "f4"))
        g.create_dataset("lstm/bias:0", data=np.zeros(400, "f4"))
    return path


def keras3_gzip_bomb(path: Path, elements: int = 400_000_000) -> Path:
    """A Keras 3 store (``.weights.h5``, or a ``.keras`` zip around it when ``path`` ends so) whose LSTM
    kernel (``layers/lstm/cell/vars/0``) is a gzip dataset of ``elements`` never-written zeros."""
    import h5py

    store = path if path.suffix == ".h5" else path.with_suffix(".weights.h5")
    with h5py.File(store, "w") as f:
        v = f.create_group("layers/lstm/cell/vars")
        v.create_dataset("0", shape=(elements // 400, 400), dtype="f4", compression="gzip", chunks=(1024, 400))
        v.create_dataset("1", data=np.zeros((100, 400), "f4"))
        v.create_dataset("2", data=np.zeros(400, "f4"))
    if store != path:
        cfg = {"class_name": "Sequential", "config": {"name": "s", "layers": [
            {"class_name": "LSTM", "config": {"name": "lstm", "units": 100}}]}}
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("metadata.json", json.dumps({"keras_version": "3.5.0"}))
            zf.writestr("config.json", json.dumps(cfg))
            zf.write(store, "model.weights.h5")
        store.unlink()
    return path


def h5_many_layer_names(path: Path, count: int = 1_000_000) -> Path:
    """A Keras 2 weights file whose ``layer_names`` lists ``count`` names (stored in a dataset-sized
    attribute; no groups behind them)."""
    import h5py

    with h5py.File(path, "w", libver="latest") as f:  # dense attribute storage: large attributes allowed
        f.attrs["layer_names"] = np.array([f"l{i}".encode() for i in range(count)])
        f.attrs["keras_version"] = b"2.15.0"
    return path


def h5_markup_name(path: Path, name: str = "[bold]x[/]\nsecond line\x1b[31m") -> Path:
    """The tf_keras-made fixture ``fixtures/keras/lstm_weights.h5`` with its LSTM layer's group renamed
    ``name`` (rich markup, a newline, an escape sequence; ``/`` is not allowed in HDF5 names)."""
    import shutil

    import h5py

    src = Path(__file__).resolve().parents[2] / "fixtures" / "keras" / "lstm_weights.h5"
    shutil.copyfile(src, path)
    name = name.replace("/", "_")
    with h5py.File(path, "r+") as f:
        old = [v.decode() if isinstance(v, bytes) else str(v) for v in f.attrs["layer_names"]]
        lstm = next(n for n in old if "lstm" in n)
        f.move(lstm, name)
        f.attrs["layer_names"] = [(name if n == lstm else n).encode() for n in old]
    return path


def h5_external_link(path: Path, target: str = "/etc/passwd") -> Path:
    """An HDF5 file whose root holds an external link to ``target`` (a converted-looking DST for ``verify``)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"lstm"]
        f["lstm"] = h5py.ExternalLink(target, "/")
    return path


# ---------------------------------------------------------------------------------------------- npz / zip


def npz_bomb(path: Path, elements: int = 400_000_000) -> Path:
    """An rnnconvert-looking ``.npz`` whose one member is ``elements`` float32 zeros, deflated (~1000:1)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("big.npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as fh:
            fh.write(header.getvalue())
            chunk = bytes(1 << 24)
            left = elements * 4
            while left:
                n = min(left, len(chunk))
                fh.write(chunk[:n])
                left -= n
    return path


def npz_duplicate_member(path: Path) -> Path:
    """An ``.npz`` holding two members named ``a.npy``."""
    import warnings

    one = io.BytesIO()
    np.lib.format.write_array(one, np.zeros(2, "f4"))
    with zipfile.ZipFile(path, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zf.writestr("a.npy", one.getvalue())
        zf.writestr("a.npy", one.getvalue())
    return path


def keras_config_list(path: Path) -> Path:
    """A ``.keras`` zip whose ``config.json`` is a JSON list, not an object."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.5.0"}))
        zf.writestr("config.json", json.dumps([{"class_name": "LSTM"}]))
        zf.writestr("model.weights.h5", b"")
    return path


# ---------------------------------------------------------------------------------------------- ONNX


def onnx_identity_chain(path: Path, length: int = 20_000) -> Path:
    """An ONNX model whose LSTM's W comes through a ``length``-long chain of Identity nodes after a
    Constant, listed in reverse order (the worst case of a fixed-point folding loop)."""
    from onnx import TensorProto, helper, numpy_helper

    H, I = 2, 3
    w = numpy_helper.from_array(np.full((1, 4 * H, I), 0.1, "f4"), "c0")
    nodes = [helper.make_node("Constant", [], ["c0"], value=w)]
    for i in range(length):
        nodes.append(helper.make_node("Identity", [f"c{i}"], [f"c{i + 1}"]))
    nodes = [nodes[0]] + nodes[1:][::-1]
    inits = [numpy_helper.from_array(np.full((1, 4 * H, H), 0.1, "f4"), "R")]
    nodes.append(helper.make_node("LSTM", ["X", f"c{length}", "R"], ["Y"], hidden_size=H, name="lstm"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, I])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    path.write_bytes(m.SerializeToString())
    return path


# ---------------------------------------------------------------------------------------------- TF


def tf_checkpoint_escape(folder: Path, target: str = "../outside/model.ckpt") -> Path:
    """A folder whose ``checkpoint`` state file points outside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "{target}"\n'
                                       f'all_model_checkpoint_paths: "{target}"\n')
    return folder


# ---------------------------------------------------------------------------------------------- special files


def fifo(path: Path) -> Path:
    """A FIFO named like a checkpoint (nothing ever writes to it)."""
    os.mkfifo(path)
    return path


def symlink_to_device(path: Path, device: str = "/dev/zero") -> Path:
    """A symlink named like a checkpoint pointing at ``device``."""
    os.symlink(device, path)
    return path


FAMILIES = {
    "pt_billion_laughs.pt": pt_billion_laughs,
    "pt_stride0.pt": pt_stride0,
    "pt_duplicate_pickle.pt": pt_duplicate_pickle,
    "h5_gzip_bomb.h5": h5_gzip_bomb,
    "h5_gzip_written.h5": h5_gzip_written,
    "keras3_gzip_bomb.weights.h5": keras3_gzip_bomb,
    "keras3_gzip_bomb.keras": keras3_gzip_bomb,
    "h5_many_layer_names.h5": h5_many_layer_names,
    "h5_markup_name.h5": h5_markup_name,
    "npz_bomb.npz": npz_bomb,
    "npz_duplicate_member.npz": npz_duplicate_member,
    "keras_config_list.keras": keras_config_list,
    "onnx_identity_chain.onnx": onnx_identity_chain,
    "fifo.pt": fifo,
    "dev_zero.pt": symlink_to_device,
}


if __name__ == "__main__":  # pragma: no cover - manual corpus
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "attack_corpus")
    out.mkdir(parents=True, exist_ok=True)
    for name, gen in FAMILIES.items():
        gen(out / name)
    tf_checkpoint_escape(out / "tf_escape")
    print(f"wrote {len(FAMILIES) + 1} cases to {out}")
