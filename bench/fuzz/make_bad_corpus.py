"""Write the seed corpus of crafted bad files into ``tests/data/bad/`` (replayed by tests/security/test_bad_inputs.py).

Each file is tiny and breaks one rule a reader must enforce; ``expected.json`` maps file name to
the exit code the CLI must give (3: FormatError, 4: UnsupportedError). Made with the real
libraries (h5py, torch, safetensors, onnx, TensorFlow, Keras 3) plus byte surgery. A TF checkpoint
is a pair ``<name>.index`` + ``<name>.data-00000-of-00001``; ``expected.json`` lists the ``.index``.
Run from the repository root::

    python bench/fuzz/make_bad_corpus.py
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "bad"
sys.path.insert(0, str(ROOT))


def keras_weights(path: Path, kernel, rec, bias, **dataset_kw) -> None:
    """A Keras 2 weights-only file with one LSTM layer (names as tf_keras writes them)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"lstm"]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.15.0"
        g = f.create_group("lstm")
        names = [b"lstm/lstm_cell/kernel:0", b"lstm/lstm_cell/recurrent_kernel:0", b"lstm/lstm_cell/bias:0"]
        g.attrs["weight_names"] = names
        for n, a in zip(names, (kernel, rec, bias)):
            g.create_dataset(n.decode(), data=a)


def main() -> dict[str, int]:
    import h5py

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    exp: dict[str, int] = {}
    rng = np.random.default_rng(0)
    H, I = 2, 1
    k, r, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((I, 4 * H), (H, 4 * H), (4 * H,)))

    # ---------------------------------------------------------------- HDF5
    good = OUT / "_good.h5"
    keras_weights(good, k, r, b)
    data = good.read_bytes()
    (OUT / "h5_truncated.h5").write_bytes(data[: len(data) // 2])
    exp["h5_truncated.h5"] = 3
    flipped = bytearray(data)
    flipped[136] ^= 0xFF  # the root group's B-tree signature
    (OUT / "h5_flipped.h5").write_bytes(bytes(flipped))
    exp["h5_flipped.h5"] = 3
    kn = k.copy()
    kn[0, 3] = np.nan
    keras_weights(OUT / "h5_nan.h5", kn, r, b)
    exp["h5_nan.h5"] = 3
    ri = r.copy()
    ri[1, 1] = np.inf
    keras_weights(OUT / "h5_inf.h5", k, ri, b)
    exp["h5_inf.h5"] = 3
    keras_weights(OUT / "h5_wrong_shape.h5", k[:, :5], r, b)
    exp["h5_wrong_shape.h5"] = 3
    good.unlink()
    for name, how in (("h5_softlink.h5", "soft"), ("h5_extlink.h5", "ext"), ("h5_extdataset.h5", "extds"),
                      ("h5_huge_shape.h5", "huge")):
        p = OUT / name
        keras_weights(p, k, r, b)
        with h5py.File(p, "a") as f:
            g = f["lstm"]
            del g["lstm/lstm_cell/bias:0"]
            if how == "soft":
                g["lstm/lstm_cell/bias:0"] = h5py.SoftLink("/lstm/lstm/lstm_cell/kernel:0")
            elif how == "ext":
                g["lstm/lstm_cell/bias:0"] = h5py.ExternalLink("/etc/passwd", "/x")
            elif how == "extds":
                g.create_dataset("lstm/lstm_cell/bias:0", shape=(4 * H,), dtype="f4",
                                 external=[("/etc/hostname", 0, 4 * 4 * H)])
            else:
                g.create_dataset("lstm/lstm_cell/bias:0", shape=(1 << 20, 1 << 16), dtype="f4")
        exp[name] = 3

    # ---------------------------------------------------------------- npz
    def npz(name: str, members: dict[str, bytes]) -> None:
        with zipfile.ZipFile(OUT / name, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for m, raw in members.items():
                z.writestr(m, raw)

    def npy(arr, **kw) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arr, **kw)
        return buf.getvalue()

    meta = npy(np.array(json.dumps({"schema": 1, "layers": []})))
    forged = npy(np.zeros(4, np.float32)).replace(b"(4,), }", b"(99999999999,)}")
    npz("npz_forged_shape.npz", {"__rnnconvert__.npy": meta, "l0.w_ih.npy": forged})
    exp["npz_forged_shape.npz"] = 3
    npz("npz_object_array.npz", {"__rnnconvert__.npy": meta,
                                 "l0.w_ih.npy": npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)})
    exp["npz_object_array.npz"] = 3
    npz("npz_deep_json.npz", {"__rnnconvert__.npy": npy(np.array("[" * 100000 + "]" * 100000))})
    exp["npz_deep_json.npz"] = 3
    raw = (OUT / "npz_object_array.npz").read_bytes()
    (OUT / "npz_truncated.npz").write_bytes(raw[: len(raw) // 2])
    exp["npz_truncated.npz"] = 3

    # ---------------------------------------------------------------- torch / safetensors / onnx
    import torch
    from safetensors.numpy import save_file

    torch.manual_seed(0)
    sd = {k_: v.clone() for k_, v in torch.nn.LSTM(1, 2).state_dict().items()}
    bad = dict(sd)
    bad["weight_hh_l0"] = bad["weight_hh_l0"].clone()
    bad["weight_hh_l0"][0, 0] = float("nan")
    torch.save(bad, OUT / "pt_nan.pt")
    exp["pt_nan.pt"] = 3
    nested: dict = dict(sd)
    for _ in range(100):
        nested = {"x": nested}
    torch.save(nested, OUT / "pt_deep_nesting.pt")
    exp["pt_deep_nesting.pt"] = 3
    buf = io.BytesIO()
    torch.save(sd, buf)
    (OUT / "pt_truncated.pt").write_bytes(buf.getvalue()[:300])
    exp["pt_truncated.pt"] = 3
    wrong = dict(sd)
    wrong["weight_hh_l0"] = torch.zeros(8, 3)
    torch.save(wrong, OUT / "pt_wrong_shape.pt")
    exp["pt_wrong_shape.pt"] = 3
    save_file({k_: (v.numpy() if k_ != "bias_ih_l0" else np.full(8, np.inf, np.float32)) for k_, v in sd.items()},
              str(OUT / "st_inf.safetensors"))
    exp["st_inf.safetensors"] = 3
    save_file({k_: v.numpy() for k_, v in sd.items()}, str(OUT / "_good.safetensors"))
    raw = (OUT / "_good.safetensors").read_bytes()
    (OUT / "_good.safetensors").unlink()
    (OUT / "st_header_too_long.safetensors").write_bytes(struct.pack("<Q", len(raw) * 4) + raw[8:])
    exp["st_header_too_long.safetensors"] = 3
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    first = next(k_ for k_ in hdr if k_ != "__metadata__")
    hdr[first]["shape"] = [100000, 100000]
    h = json.dumps(hdr).encode()
    (OUT / "st_shape_vs_bytes.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    exp["st_shape_vs_bytes.safetensors"] = 3

    import onnx

    from rnnconvert import api

    src = OUT / "_src.pt"
    torch.save(sd, src)
    good_onnx = OUT / "_good.onnx"
    api.save(api.load(src), good_onnx, force=True)
    src.unlink()
    m = onnx.load(str(good_onnx))
    good_onnx.unlink()
    init = m.graph.initializer[0]
    raw_len = len(init.raw_data) or 4
    init.ClearField("raw_data")
    init.data_location = onnx.TensorProto.EXTERNAL
    for kv in (("location", "../../../../etc/passwd"), ("offset", "0"), ("length", str(raw_len))):
        e = init.external_data.add()
        e.key, e.value = kv
    onnx.save(m, str(OUT / "onnx_external_escape.onnx"))
    exp["onnx_external_escape.onnx"] = 3
    raw = onnx.load(str(OUT / "onnx_external_escape.onnx"), load_external_data=False).SerializeToString()
    (OUT / "onnx_truncated.onnx").write_bytes(raw[: len(raw) // 3])
    exp["onnx_truncated.onnx"] = 3
    tf_and_keras3(OUT, exp, sd)
    (OUT / "expected.json").write_text(json.dumps(exp, indent=1, sort_keys=True) + "\n")
    return exp


# ---- TensorFlow's table format (tensorflow/core/lib/io/table_builder.cc, format.cc; LevelDB's layout):
# blocks of entries (varint shared, varint non-shared, varint value length, key part, value), a uint32
# restart array and its count; each block followed by a type byte (0: raw) and the masked crc32c of
# block + type; a 48-byte footer: metaindex and index BlockHandles (varint offset, size) padded to 40
# bytes, then the magic 0xdb4775248b80fb57.
def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        n |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not b[i - 1] & 0x80:
            return n, i


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    nrest = struct.unpack("<I", block[-4:])[0]
    end, i, key, out = len(block) - 4 - 4 * nrest, 0, b"", []
    while i < end:
        shared, i = _read_varint(block, i)
        nonshared, i = _read_varint(block, i)
        vlen, i = _read_varint(block, i)
        key = key[:shared] + block[i:i + nonshared]
        out.append((key, block[i + nonshared:i + nonshared + vlen]))
        i += nonshared + vlen
    return out


def _sstable_entries(raw: bytes) -> list[tuple[bytes, bytes]]:
    """All (key, value) pairs of a TF table file (the data blocks its index block points to)."""
    foot = raw[-48:]
    _, i = _read_varint(foot, 0)
    _, i = _read_varint(foot, i)
    off, i = _read_varint(foot, i)
    size, _ = _read_varint(foot, i)
    out = []
    for _, handle in _block_entries(raw[off:off + size]):
        o, j = _read_varint(handle, 0)
        n, _ = _read_varint(handle, j)
        out += _block_entries(raw[o:o + n])
    return out


def _sstable(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A TF table file holding ``entries`` (sorted keys) in one data block."""
    out = bytearray()

    def block(items):
        body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in items)
        return body + struct.pack("<II", 0, 1)  # one restart point, at 0

    def put(contents: bytes) -> bytes:
        off = len(out)
        crc = _crc32c(contents + b"\0")
        masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
        out.extend(contents + b"\0" + struct.pack("<I", masked))
        return _varint(off) + _varint(len(contents))

    data_h = put(block(entries))
    meta_h = put(block([]))
    index_h = put(block([(entries[-1][0], data_h)]))
    return bytes(out + (meta_h + index_h).ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57))


def tf_and_keras3(out: Path, exp: dict[str, int], sd: dict) -> None:
    """TensorFlow checkpoints and graphs, cuDNN buffer files and Keras 3 archives (``sd``: a torch LSTM(1, 2))."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from rnnconvert import api

    rng = np.random.default_rng(1)
    H, I = 2, 1
    kernel = rng.uniform(-1, 1, (I + H, 4 * H)).astype(np.float32)
    bias = rng.uniform(-1, 1, (4 * H,)).astype(np.float32)

    def tf1_ckpt(name: str, k: np.ndarray) -> bytes:
        """A TF1 name-based checkpoint of one LSTMCell written by TF's SaveV2 op; returns the .data bytes."""
        tf.raw_ops.SaveV2(prefix=str(out / name), tensor_names=["rnn/lstm_cell/kernel", "rnn/lstm_cell/bias"],
                          shape_and_slices=["", ""], tensors=[tf.constant(k), tf.constant(bias)])
        return (out / f"{name}.data-00000-of-00001").read_bytes()

    kn = kernel.copy()
    kn[1, 5] = np.nan
    tf1_ckpt("tfck_nan", kn)
    exp["tfck_nan.index"] = 3
    data = tf1_ckpt("tfck_short_data", kernel)
    (out / "tfck_short_data.data-00000-of-00001").write_bytes(data[: len(data) // 2])
    exp["tfck_short_data.index"] = 3
    tf1_ckpt("tfck_truncated_index", kernel)
    idx = (out / "tfck_truncated_index.index").read_bytes()
    (out / "tfck_truncated_index.index").write_bytes(idx[: len(idx) - 20])  # the footer is cut
    exp["tfck_truncated_index.index"] = 3
    tf1_ckpt("tfck_flipped_data", kernel)
    p = out / "tfck_flipped_data.data-00000-of-00001"
    raw = bytearray(p.read_bytes())
    raw[10] ^= 0x40  # a weight's bits: the stored crc32c no longer matches
    p.write_bytes(bytes(raw))
    exp["tfck_flipped_data.index"] = 3

    # .index files whose entry declares a shape TF's C++ reader aborts on (SIGABRT) or that disagrees with
    # the .data size: the index is re-written as an SSTable around the entry TF made, re-shaped
    from tensorflow.core.protobuf import tensor_bundle_pb2

    tf1_ckpt("_forge", kernel)
    entries = _sstable_entries((out / "_forge.index").read_bytes())
    data = (out / "_forge.data-00000-of-00001").read_bytes()
    for f in out.glob("_forge.*"):
        f.unlink()
    for name, dims in (("tfck_index_negative_dim", (-5, 8)), ("tfck_index_overflow_shape", (1 << 31,) * 3),
                       ("tfck_index_shape_vs_data", (1 << 20, 1 << 20))):
        forged = []
        for k, v in entries:
            if k == b"rnn/lstm_cell/kernel":
                e = tensor_bundle_pb2.BundleEntryProto()
                e.ParseFromString(v)
                del e.shape.dim[:]
                for s_ in dims:
                    e.shape.dim.add(size=s_)
                v = e.SerializeToString()
            forged.append((k, v))
        (out / f"{name}.index").write_bytes(_sstable(forged))
        (out / f"{name}.data-00000-of-00001").write_bytes(data)
        exp[f"{name}.index"] = 3

    # frozen graph (the committed fixture, made by TF) whose kernel Const declares a huge shape
    g = tf.compat.v1.GraphDef()
    g.ParseFromString((ROOT / "fixtures" / "tf" / "lstm_cell.pb").read_bytes())
    node = next(n for n in g.node if n.op == "Const" and n.name.endswith("lstm_cell/kernel"))
    keep = tf.make_tensor_proto(kernel)
    for name, how in (("pb_huge_shape.pb", "content"), ("pb_huge_splat.pb", "splat")):
        t = node.attr["value"].tensor
        t.CopyFrom(keep)
        if how == "splat":  # one stored value filled out to 2^40 elements by make_ndarray
            t.ClearField("tensor_content")
            t.float_val.append(0.5)
        for d, size in zip(t.tensor_shape.dim, (1 << 20, 1 << 20)):
            d.size = size
        small = tf.compat.v1.GraphDef()
        small.node.extend(n for n in g.node if n.op == "Const")  # the weights alone keep the file tiny
        (out / name).write_bytes(small.SerializeToString())
        exp[name] = 3

    # a cuDNN buffer file (rnnconvert's writer, torch-made layer) whose spec disagrees with the buffer
    src = out / "_src.pt"
    import torch

    torch.save(sd, src)
    ckpt = api.load(src)
    src.unlink()
    good = out / "_good.cudnn.npz"
    api.save(ckpt, good, force=True)
    with np.load(good, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    good.unlink()
    spec = json.loads(str(arrays["__cudnn_spec__"]))
    spec["layers"][0]["hidden_size"] = 3
    arrays["__cudnn_spec__"] = np.array(json.dumps(spec))
    with open(out / "cudnn_spec_vs_buffer.cudnn.npz", "wb") as fh:
        np.savez(fh, **arrays)
    exp["cudnn_spec_vs_buffer.cudnn.npz"] = 3

    # .keras archives written by Keras 3 (rnnconvert's keras3 writer), then repacked with a bad member
    good = out / "_good.keras"
    api.save(ckpt, good, force=True)
    with zipfile.ZipFile(good) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    good.unlink()

    def keras_zip(name: str, extra: dict[str, bytes], replace: dict[str, bytes] | None = None) -> None:
        with zipfile.ZipFile(out / name, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for m, raw in {**members, **(replace or {}), **extra}.items():
                info = zipfile.ZipInfo(m, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, raw)
        exp[name] = 3

    keras_zip("keras3_dotdot_member.keras", {"../../evil.txt": b"outside"})
    keras_zip("keras3_zip_bomb.keras", {}, {"model.weights.h5": b"\0" * (8 << 20)})  # deflates ~1000:1


if __name__ == "__main__":
    for name, code in sorted(main().items()):
        print(f"{code}  {name}  {(OUT / name).stat().st_size} bytes")
