"""Generators of the second attack corpus (issue 29), one function per family; each writes a small file (or
folder) into the path it is given and returns it. Nothing here is committed as data:
``tests/security/test_attack_corpus_outside_data.py`` regenerates every case under a temporary folder, and
``python bench/fuzz/attack_corpus2.py OUTDIR`` writes the whole corpus for a manual run.

Families (the issue's numbering): 1 data from outside the file (HDF5 external storage, virtual datasets,
external links, in every HDF5 route); 2 the budget on the plain HDF5 route; 3 output amplification
(aliased safetensors offsets, ``.pt`` views of one storage); 4 layer counts; 5 internal errors on bad
values; 6 strict headers; 7 paths outside the named ones; 9 left from the first corpus (HDF5 DAG, cuDNN spec,
huge safetensors header, ``STACK_GLOBAL``). Family 8 (warnings) is checked on every case: one line.

``secret(path)`` writes the "outside" file whose bytes must never reach an output.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

H = 4  # hidden size of the small LSTMs below
IN = 5


def secret(path: Path, n: int = 4 * H * (IN + H) + 64) -> Path:
    """An outside file of distinctive float32 bytes (the "/etc/passwd" of these tests)."""
    path.write_bytes((np.arange(n, dtype=np.float32) * 0.001 + 0.4321).tobytes())
    return path


def _lstm(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"kernel": rng.standard_normal((IN, 4 * H)).astype(np.float32) * 0.1,
            "recurrent_kernel": rng.standard_normal((H, 4 * H)).astype(np.float32) * 0.1,
            "bias": np.zeros(4 * H, np.float32)}


def _torch_lstm(seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"lstm.weight_ih_l0": (rng.standard_normal((4 * H, IN)) * 0.1).astype(dtype),
            "lstm.weight_hh_l0": (rng.standard_normal((4 * H, H)) * 0.1).astype(dtype),
            "lstm.bias_ih_l0": np.zeros(4 * H, dtype), "lstm.bias_hh_l0": np.zeros(4 * H, dtype)}


# ------------------------------------------------------------------------------------------- HDF5 files


def keras2_h5(path: Path, layers: list[tuple[str, dict]] | None = None, listed: list[str] | None = None,
              dataset=None) -> Path:
    """A Keras 2 weights-only file: ``layers`` (name, {weight: array}) as tf.keras 2.15 writes them
    (``<layer>/<layer>/lstm_cell/<weight>:0``); ``listed`` overrides ``layer_names``; ``dataset(group, name,
    array)`` makes each dataset (the default: a plain one)."""
    import h5py

    layers = layers if layers is not None else [("lstm", _lstm())]
    with h5py.File(path, "w", libver="latest") as f:
        names = listed if listed is not None else [n for n, _ in layers]
        f.attrs["layer_names"] = np.array([n.encode() for n in names])
        f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.15.0"
        for name, ws in layers:
            g = f.require_group(name)
            wn = [f"{name}/lstm_cell/{k}:0" for k in ws]
            g.attrs["weight_names"] = np.array([w.encode() for w in wn])
            for w, arr in zip(wn, ws.values()):
                (dataset or (lambda grp, n, a: grp.create_dataset(n, data=a)))(g, w, arr)
    return path


def _external(outside: Path):
    def make(g, name, arr):
        if "kernel:0" in name and "recurrent" not in name:
            g.create_dataset(name, shape=arr.shape, dtype=arr.dtype, external=[(str(outside), 0, arr.nbytes)])
        else:
            g.create_dataset(name, data=arr)
    return make


def _virtual(outside_h5: Path):
    import h5py

    def make(g, name, arr):
        if "kernel:0" in name and "recurrent" not in name:
            layout = h5py.VirtualLayout(shape=arr.shape, dtype=arr.dtype)
            layout[...] = h5py.VirtualSource(str(outside_h5), "data", shape=arr.shape)
            g.create_virtual_dataset(name, layout)
        else:
            g.create_dataset(name, data=arr)
    return make


def outside_h5(path: Path, shape=(IN, 4 * H)) -> Path:
    """An HDF5 file outside the source's folder that a virtual dataset maps."""
    import h5py

    with h5py.File(path, "w") as f:
        f["data"] = np.frombuffer(secret(path.with_suffix(".bin")).read_bytes(), np.float32)[:int(np.prod(shape))].reshape(shape)
    return path


def h5_external_storage(path: Path, outside: Path, keras: bool = True) -> Path:
    """A dataset whose raw bytes live in ``outside`` (``create_dataset(external=...)``): a Keras 2 file's kernel,
    or (``keras=False``) a plain HDF5 file's only dataset."""
    if keras:
        return keras2_h5(path, dataset=_external(outside))
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("lstm/weight_ih_l0", shape=(4 * H, IN), dtype="<f4", external=[(str(outside), 0, 4 * 4 * H * IN)])
        f["lstm/weight_hh_l0"] = np.zeros((4 * H, H), np.float32)
    return path


def h5_virtual(path: Path, outside: Path, keras: bool = True) -> Path:
    """A virtual dataset mapping ``outside`` (an HDF5 file made by :func:`outside_h5`)."""
    if keras:
        return keras2_h5(path, dataset=_virtual(outside))
    import h5py

    with h5py.File(path, "w") as f:
        layout = h5py.VirtualLayout(shape=(IN, 4 * H), dtype="<f4")
        layout[...] = h5py.VirtualSource(str(outside), "data", shape=(IN, 4 * H))
        f.create_virtual_dataset("lstm/weight_ih_l0", layout)
    return path


def h5_plain_external_link(path: Path, outside: Path) -> Path:
    import h5py

    with h5py.File(path, "w") as f:
        f["lstm/weight_hh_l0"] = np.zeros((4 * H, H), np.float32)
        f["lstm/weight_ih_l0"] = h5py.ExternalLink(str(outside), "data")
    return path


def keras3_external(path: Path, outside: Path, virtual: bool = False) -> Path:
    """A Keras 3 ``.weights.h5`` whose LSTM kernel is external storage (or a virtual dataset) of ``outside``."""
    import h5py

    w = _lstm()
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = b"3.3.3"
        g = f.create_group("layers/lstm/cell/vars")
        f.create_group("vars")
        for i, k in enumerate(("kernel", "recurrent_kernel", "bias")):
            if k == "kernel":
                if virtual:
                    layout = h5py.VirtualLayout(shape=w[k].shape, dtype="<f4")
                    layout[...] = h5py.VirtualSource(str(outside), "data", shape=w[k].shape)
                    g.create_virtual_dataset(str(i), layout)
                else:
                    g.create_dataset(str(i), shape=w[k].shape, dtype="<f4", external=[(str(outside), 0, w[k].nbytes)])
            else:
                g[str(i)] = w[k]
    return path


def h5_plain_gzip(path: Path, rows: int = 475_000, cols: int = 1000) -> Path:
    """A plain HDF5 file (no Keras markers) whose dataset declares ``rows * cols`` float32 (1.9 GB), gzip-
    compressed to a few MB (written chunk by chunk: never held in memory)."""
    import h5py

    with h5py.File(path, "w") as f:
        d = f.create_dataset("w", shape=(rows, cols), dtype="<f4", chunks=(min(rows, 4096), cols), compression="gzip")
        d[:4096] = 0  # one chunk written; the others are the fill value (no storage at all)
    return path


def h5_plain_unallocated(path: Path, rows: int = 475_000, cols: int = 1000) -> Path:
    """A plain HDF5 file whose contiguous dataset declares 1.9 GB and stores nothing (the fill value)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("w", shape=(rows, cols), dtype="<f4")
    return path


def h5_dag(path: Path, levels: int = 40, keras: bool = False) -> Path:
    """Groups ``g0 .. g<levels>`` where each holds two hard links (``a``, ``b``) to the next: 2**levels paths
    to the last group, ``levels + 1`` objects."""
    import h5py

    if keras:
        keras2_h5(path)
    with h5py.File(path, "a") as f:
        groups = [f.create_group(f"g{i}") for i in range(levels + 1)]
        for a, b in zip(groups, groups[1:]):
            a["a"], a["b"] = b, b
        groups[-1]["x"] = np.zeros(3, np.float32)
    return path


def h5_layer_listed_many_times(path: Path, times: int = 99_000) -> Path:
    return keras2_h5(path, listed=["lstm"] * times)


def h5_many_tiny_layers(path: Path, count: int = 10_000) -> Path:
    w = _lstm()
    return keras2_h5(path, [(f"l{i}", w) for i in range(count)])


def h5_float128_kernel(path: Path) -> Path:
    w = _lstm()
    w["kernel"] = w["kernel"].astype(np.longdouble)
    return keras2_h5(path, [("lstm", w)])


def h5_empty_kernel(path: Path) -> Path:
    w = _lstm()
    w["kernel"] = np.zeros((0, 4 * H), np.float32)
    return keras2_h5(path, [("lstm", w)])


# ------------------------------------------------------------------------------------------ safetensors


def safetensors_raw(path: Path, head: object, data: bytes, *, encode=None, pad: int = 0) -> Path:
    """A safetensors file with header ``head`` (a dict, JSON-encoded; or bytes as they are) and ``data``."""
    raw = head if isinstance(head, bytes) else (encode or (lambda s: s.encode()))(json.dumps(head))
    raw += b" " * pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _st_head(sd: dict[str, np.ndarray]) -> tuple[dict, bytes]:
    names = {"float32": "F32", "float64": "F64", "int32": "I32", "bool": "BOOL", "int64": "I64", "float16": "F16"}
    head, pos, data = {}, 0, b""
    for k, a in sd.items():
        head[k] = {"dtype": names[str(a.dtype)], "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
        data += a.tobytes()
    return head, data


def safetensors_aliased(path: Path, copies: int = 2000, nbytes: int = 1 << 20) -> Path:
    """``copies`` entries sharing one ``nbytes`` range of ``data_offsets``: 2 GB out from 1 MB."""
    n = nbytes // 4
    head, data = _st_head(_torch_lstm())
    end = len(data)
    head.update({f"extra.t{i}": {"dtype": "F32", "shape": [n], "data_offsets": [end, end + nbytes]}
                 for i in range(copies)})
    return safetensors_raw(path, head, data + b"\0" * nbytes)


def safetensors_overlap(path: Path) -> Path:
    """Two recurrent tensors whose byte ranges overlap (the second starts inside the first)."""
    sd = _torch_lstm()
    head, data = _st_head(sd)
    k = "lstm.weight_hh_l0"
    b = head["lstm.weight_ih_l0"]["data_offsets"][0] + 16
    head[k]["data_offsets"] = [b, b + sd[k].nbytes]
    return safetensors_raw(path, head, data)


def safetensors_dtype(path: Path, dtype) -> Path:
    head, data = _st_head(_torch_lstm(dtype=dtype))
    return safetensors_raw(path, head, data)


def safetensors_header_variant(path: Path, kind: str) -> Path:
    """A valid LSTM header made lenient-only: ``utf16`` / ``bom`` encodings, ``float_shape`` (16.5),
    ``bool_shape``, ``str_offset``, ``float_offset``."""
    head, data = _st_head(_torch_lstm())
    k = "lstm.weight_ih_l0"
    if kind == "utf16":
        return safetensors_raw(path, head, data, encode=lambda s: s.encode("utf-16"))
    if kind == "bom":
        return safetensors_raw(path, head, data, encode=lambda s: b"\xef\xbb\xbf" + s.encode())
    if kind == "float_shape":
        head[k]["shape"] = [16.5, 5]
    elif kind == "bool_shape":
        head[k]["shape"] = [16, True]  # (16, 1) as far as int() goes
    elif kind == "str_offset":
        head[k]["data_offsets"] = [str(v) for v in head[k]["data_offsets"]]
    elif kind == "float_offset":
        head[k]["data_offsets"] = [float(v) for v in head[k]["data_offsets"]]
    return safetensors_raw(path, head, data)


def safetensors_huge_header(path: Path, nbytes: int = 90 << 20) -> Path:
    """A header of ``nbytes`` (a valid JSON object of many small entries: what costs memory to parse)."""
    rec = '"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
    parts, size, i = [], 2, 0
    while size < nbytes:
        s = rec % i
        parts.append(s)
        size += len(s)
        i += 1
    raw = ("{" + "".join(parts)[:-1] + "}").encode()
    return safetensors_raw(path, raw, b"")


# ------------------------------------------------------------------------------------------------- .pt


def pt_views(path: Path, views: int = 2000, numel: int = 1 << 18, legacy: bool = False) -> Path:
    """``views`` state-dict entries viewing one ``numel``-float storage (1 MiB): 2 GB of output. ``legacy``:
    the pre-zip ``torch.save`` format (read by ``torch.load(weights_only=True)``, not the restricted reader)."""
    import torch

    base = torch.zeros(numel)
    sd = {k: torch.from_numpy(v) for k, v in _torch_lstm().items()}
    torch.save({**sd, **{f"extra.t{i}": base[:] for i in range(views)}}, path,
               _use_new_zipfile_serialization=not legacy)
    return path


def pt_dtype(path: Path, dtype: str) -> Path:
    import torch

    sd = {k: torch.from_numpy(v) for k, v in _torch_lstm().items()}
    sd = {k: v.to(getattr(torch, dtype)) if dtype != "bool" else v > 0 for k, v in sd.items()}
    torch.save(sd, path)
    return path


def pt_stack_global(path: Path) -> Path:
    """A zip ``.pt`` whose ``data.pkl`` calls ``os.system`` through ``STACK_GLOBAL`` (protocol 4)."""
    import pickle

    payload = (b"\x80\x04" + b"\x8c\x02os" + b"\x94" + b"\x8c\x06system" + b"\x94" + b"\x93"
               + b"\x8c\x05true " + b"\x85R" + b".")
    pickle.loads  # noqa: B018 - never called on the payload
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", "3\n")
    return path


# ------------------------------------------------------------------------------------------------ ONNX


def onnx_many_lstm_nodes(path: Path, nodes: int = 50_000) -> Path:
    """``nodes`` LSTM nodes in a chain, all sharing one set of weight initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((1, 4 * H, H), np.float32), "W")
    r = numpy_helper.from_array(np.zeros((1, 4 * H, H), np.float32), "R")
    ns, prev = [], "x"
    for i in range(nodes):
        ns.append(helper.make_node("LSTM", [prev, "W", "R"], [f"y{i}"], hidden_size=H, name=f"lstm{i}"))
        sq = helper.make_node("Squeeze", [f"y{i}", "axes1"], [f"s{i}"], name=f"sq{i}")
        ns.append(sq)
        prev = f"s{i}"
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    g = helper.make_graph(ns, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, H])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], [w, r, axes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def onnx_negative_dim(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    w = TensorProto()
    w.name, w.data_type = "W", TensorProto.FLOAT
    w.dims.extend([1, -16, IN])
    w.raw_data = np.zeros(4 * H * IN, np.float32).tobytes()
    r = helper.make_tensor("R", TensorProto.FLOAT, [1, 4 * H, H], np.zeros(4 * H * H, np.float32).tolist())
    n = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=H, name="lstm")
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, IN])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, r])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def onnx_external_symlink(folder: Path) -> Path:
    """A valid ONNX LSTM whose weights are external data reached through an in-folder symlink
    (``model.data`` -> ``real/weights.bin``): allowed, the resolved target is inside the folder."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((1, 4 * H, IN)) * 0.1).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((1, 4 * H, H)) * 0.1).astype(np.float32), "R")
    n = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=H, name="lstm")
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, IN])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, r])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    (folder / "real").mkdir(exist_ok=True)
    onnx.save(m, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="real/weights.bin", size_threshold=0)
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "model.data"
    onnx.save(m, str(folder / "model.onnx"))
    (folder / "model.data").symlink_to("real/weights.bin")
    return folder / "model.onnx"


# -------------------------------------------------------------------------------------- npz, cudnn.npz


def _edit_json_member(src: Path, dst: Path, key: str, edit) -> Path:
    """``src`` (an npz) written to ``dst`` with its JSON string member ``key`` changed by ``edit(dict)``."""
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    doc = json.loads(str(arrays[key]))
    edit(doc)
    arrays[key] = np.array(json.dumps(doc))
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)
    src.unlink()
    return dst


def npz_schema_string_bias(path: Path) -> Path:
    """An rnnconvert ``.npz`` whose schema says ``"forget_bias": "NaN"`` (a string)."""
    import rnnconvert.api as api

    ok = path.with_name("ok_" + path.name)
    api.save(api.load(Path(__file__).resolve().parents[2] / "fixtures" / "keras" / "lstm.h5"), ok, "npz")

    def edit(doc):
        doc["layers"][0].setdefault("semantics", {})["forget_bias"] = "NaN"
    return _edit_json_member(ok, path, "__rnnconvert__", edit)


def npz_complex(path: Path) -> Path:
    sd = {k: v.astype(np.complex64) for k, v in _torch_lstm().items()}
    np.savez(path, **sd)
    return path


def cudnn_huge_spec(path: Path) -> Path:
    """A ``.cudnn.npz`` whose spec declares 2**62 elements (input and hidden sizes of 2**31)."""
    import rnnconvert.api as api

    ok = path.with_name("ok.cudnn.npz")
    api.save(api.load(Path(__file__).resolve().parents[2] / "fixtures" / "keras" / "lstm.h5"), ok, "cudnn_npz")
    return _edit_json_member(ok, path, "__cudnn_spec__", _grow)


def _grow(js) -> None:
    if isinstance(js, dict):
        for k, v in js.items():
            if k in ("hidden_size", "input_size") and isinstance(v, int):
                js[k] = 1 << 31
            else:
                _grow(v)
    elif isinstance(js, list):
        for v in js:
            _grow(v)


# --------------------------------------------------------------------------------------- TF checkpoints


def tf_folder_with_outside_symlink(folder: Path, fixture: Path, which: str) -> Path:
    """A copy of TF checkpoint folder ``fixture`` where the ``.index`` or ``data`` shard (``which``) is a
    symlink to the same file outside the folder."""
    import shutil

    outside = folder.parent / (folder.name + "_outside")
    shutil.copytree(fixture, outside)
    shutil.copytree(fixture, folder)
    for p in sorted(folder.iterdir()):
        if (which == "index" and p.name.endswith(".index")) or (which == "data" and ".data-" in p.name):
            p.unlink()
            p.symlink_to(outside / p.name)
    return folder


def tf_savedmodel_outside_variables(folder: Path, fixture: Path) -> Path:
    """A SavedModel-shaped folder whose ``variables/`` is a symlink to a folder outside it holding
    ``variables.index`` and ``variables.data-*`` (the checkpoint of ``fixture``)."""
    outside = folder.parent / (folder.name + "_vars_outside")
    outside.mkdir(parents=True)
    for p in fixture.iterdir():
        if p.name.endswith(".index") or ".data-" in p.name:
            (outside / ("variables" + p.name[p.name.index("."):])).write_bytes(p.read_bytes())
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"")
    (folder / "variables").symlink_to(outside)
    return folder


def tf_state_nul(folder: Path, fixture: Path) -> Path:
    import shutil

    shutil.copytree(fixture, folder)
    state = folder / "checkpoint"
    state.write_bytes(b'model_checkpoint_path: "ck\x00pt"\n')
    return folder


# ---------------------------------------------------------------------------------------------- main


if __name__ == "__main__":  # pragma: no cover - a manual run
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    s = secret(out / "secret.bin")
    o = outside_h5(out / "outside.h5")
    h5_external_storage(out / "ext_keras.h5", s)
    h5_external_storage(out / "ext_plain.h5", s, keras=False)
    h5_virtual(out / "vds_keras.h5", o)
    h5_virtual(out / "vds_plain.h5", o, keras=False)
    keras3_external(out / "ext.weights.h5", s)
    h5_plain_gzip(out / "gzip_plain.h5")
    h5_dag(out / "dag.h5")
    safetensors_aliased(out / "aliased.safetensors")
    pt_views(out / "views.pt")
    os.sync()
