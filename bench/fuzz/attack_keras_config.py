"""Generators of the Keras-config family of the third attack corpus (issue 40: HIGH 1, MEDIUM 6, the LOW config
values), one function per case; each writes a small file (or folder) into the path it is given and returns it.
Nothing here is committed as data: ``tests/security/test_keras_config_payload.py`` regenerates every case under a
temporary folder, and ``python bench/fuzz/attack_keras_config.py OUTDIR`` writes the family for a manual run.

The payload: a ``Lambda`` object (tf_keras' serialized form: ``function`` = base64 of ``marshal.dumps`` of a
code object, ``function_type: 'lambda'``, ``__passive_serialization__: true``) put where tf_keras deserializes any
object: a layer's ``activity_regularizer`` (called on every output), ``kernel_regularizer``, ``kernel_constraint``
or ``kernel_initializer``, in a ``Dense``, ``LSTM``, ``Masking``, a ``Bidirectional`` or the layer it wraps. The
code, if it ever ran, would write the file ``marker``. It is compiled here (``compile``) and never called: the
generators only write JSON and HDF5 attributes (h5py) or a protobuf message.

Cases (a Keras 2 full-model HDF5 file copied from ``fixtures/`` and its ``model_config`` rewritten):
``payload_h5`` (the HIGH 1 file), ``savedmodel_payload`` (a tf_keras SavedModel folder whose ``keras_metadata.pb``
config holds the Lambda without a ``name``), ``config_value`` (LOW: ``Infinity`` in ``batch_input_shape``, a rate of
``10**400``, a layer name of 100,000 characters), ``named`` (MEDIUM 6: a layer renamed ``training``, ``forward``...).
"""

from __future__ import annotations

import base64
import json
import marshal
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
#: the Keras 2 files the cases start from (tf_keras-made, committed with their generators)
STACK = FIXTURES / "keras_whole" / "whole_masked_stack.h5"  # Masking, GRU, GRU, LSTM, Dense (Sequential)
BILSTM = FIXTURES / "keras_whole" / "whole_embed_conv_bilstm.h5"  # Embedding, Conv1D, Bidirectional(LSTM) ...
SAVEDMODEL = FIXTURES / "keras_savedmodel" / "sm_masked_bidir_gru"
#: config slots tf_keras deserializes objects from
SLOTS = ("activity_regularizer", "kernel_regularizer", "kernel_constraint", "kernel_initializer")


def payload_function(marker: Path) -> list:
    """The ``function`` entry of a serialized tf_keras ``Lambda`` (``generic_utils.func_dump``: base64 of the
    marshalled code object, defaults, closure) whose code would write ``marker``. Compiled, never called."""
    src = f"lambda x: (__import__('pathlib').Path({str(marker)!r}).write_text('payload ran'), x)[1]"
    code = compile(src, "<payload>", "eval").co_consts[0]
    return [base64.encodebytes(marshal.dumps(code)).decode("ascii"), None, None]


def lambda_object(marker: Path, named: bool = True) -> dict[str, Any]:
    """The Lambda object as tf_keras' passive serialization writes it (``__passive_serialization__``)."""
    conf: dict[str, Any] = {"trainable": True, "dtype": "float32", "function": payload_function(marker),
                            "function_type": "lambda", "module": "__main__", "output_shape": None,
                            "output_shape_type": "raw", "output_shape_module": None, "arguments": {}}
    if named:
        conf = {"name": "payload", **conf}
    return {"class_name": "Lambda", "config": conf, "__passive_serialization__": True}


def _records(cfg: dict) -> list[dict]:
    inner = cfg["config"]
    return inner if isinstance(inner, list) else inner["layers"]


def _layer(cfg: dict, name: str) -> dict:
    for r in _records(cfg):
        if (r.get("config") or {}).get("name") == name:
            return r
    raise KeyError(name)


def rewrite_h5(src: Path, out: Path, change: Callable[[dict], None]) -> Path:
    """A copy of the Keras 2 file ``src`` at ``out`` whose ``model_config`` is ``change``d (h5py, JSON only)."""
    import h5py

    shutil.copyfile(src, out)
    with h5py.File(out, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        change(cfg)
        f.attrs["model_config"] = json.dumps(cfg).encode("utf-8")
    return out


#: (case name, source file, layer, wrapped layer or None, slot)
PAYLOADS = [
    ("dense_activity", STACK, "dense", None, "activity_regularizer"),
    ("lstm_activity", STACK, "lstm", None, "activity_regularizer"),
    ("masking_activity", STACK, "mask", None, "activity_regularizer"),
    ("bidir_activity", BILSTM, "bilstm", None, "activity_regularizer"),
    ("bidir_inner_activity", BILSTM, "bilstm", "layer", "activity_regularizer"),
    ("lstm_kernel_regularizer", STACK, "lstm", None, "kernel_regularizer"),
    ("dense_kernel_constraint", STACK, "dense", None, "kernel_constraint"),
    ("lstm_kernel_initializer", STACK, "lstm", None, "kernel_initializer"),
]


def payload_h5(out: Path, marker: Path, case: str) -> Path:
    """The HIGH 1 file of ``case`` (:data:`PAYLOADS`)."""
    _, src, name, inner, slot = next(p for p in PAYLOADS if p[0] == case)

    def change(cfg: dict) -> None:
        conf = _layer(cfg, name)["config"]
        if inner:
            conf = conf[inner]["config"]
        conf[slot] = lambda_object(marker)
    return rewrite_h5(src, out, change)


def savedmodel_payload(out: Path, marker: Path) -> Path:
    """A copy of a tf_keras SavedModel folder whose ``keras_metadata.pb`` root config holds a nameless Lambda as
    the first recurrent layer's activity regularizer (the form ``_built_in_only`` missed: no ``name``)."""
    from tf_keras.protobuf import saved_metadata_pb2

    shutil.copytree(SAVEDMODEL, out)
    pb = out / "keras_metadata.pb"
    msg = saved_metadata_pb2.SavedMetadata()
    msg.ParseFromString(pb.read_bytes())
    for node in msg.nodes:
        md = json.loads(node.metadata) if node.metadata else {}
        if node.node_path == "root" and isinstance(md.get("config"), dict):
            for r in _records(md):
                if r.get("class_name") in ("Bidirectional", "GRU", "LSTM"):
                    r["config"]["activity_regularizer"] = lambda_object(marker, named=False)
                    break
            node.metadata = json.dumps(md)
    pb.write_bytes(msg.SerializeToString())
    return out


def config_value(out: Path, case: str) -> Path:
    """LOW: a config value rnnconvert's own code used to trip over (``inf_shape``: ``Infinity`` in
    ``batch_input_shape``; ``huge_rate``: a dropout rate of ``10**400``; ``long_name``: a 100,000-character layer
    name; ``nan_mask``: a ``NaN`` mask value)."""
    def change(cfg: dict) -> None:
        if case == "inf_shape":
            _records(cfg)[0]["config"]["batch_input_shape"] = [None, float("inf"), 4]
        elif case == "huge_rate":
            _layer(cfg, "lstm")["config"]["dropout"] = 10**400
        elif case == "long_name":
            _layer(cfg, "lstm")["config"]["name"] = "l" * 100_000
        elif case == "nan_mask":
            _layer(cfg, "mask")["config"]["mask_value"] = float("nan")
        else:
            raise KeyError(case)
    return rewrite_h5(STACK, out, change)  # json.dumps writes Infinity, NaN and 401-digit integers as given


def named(out: Path, name: str, src: Path = STACK, layer: str = "dense") -> Path:
    """MEDIUM 6: ``src`` with its layer ``layer`` renamed ``name`` (config and weight groups, as tf_keras would
    have written a layer of that name)."""
    import h5py

    shutil.copyfile(src, out)
    with h5py.File(out, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        _layer(cfg, layer)["config"]["name"] = name
        for r in _records(cfg):  # a functional model's references to it
            for node in r.get("inbound_nodes") or []:
                for e in node:
                    if isinstance(e, list) and e and e[0] == layer:
                        e[0] = name
        if isinstance(cfg["config"], dict):
            for key in ("input_layers", "output_layers"):
                for e in cfg["config"].get(key) or []:
                    if isinstance(e, list) and e and e[0] == layer:
                        e[0] = name
        f.attrs["model_config"] = json.dumps(cfg).encode("utf-8")
        g = f["model_weights"]
        g.move(layer, name)
        grp = g[name]
        wn = [w.decode() if isinstance(w, bytes) else w for w in grp.attrs["weight_names"]]
        if layer in grp:
            grp.move(layer, name)
        grp.attrs["weight_names"] = [w.replace(f"{layer}/", f"{name}/", 1).encode() for w in wn]
        names = [n.decode() if isinstance(n, bytes) else n for n in g.attrs["layer_names"]]
        g.attrs["layer_names"] = [(name if n == layer else n).encode() for n in names]
    return out


def main(outdir: str) -> None:
    d = Path(outdir)
    d.mkdir(parents=True, exist_ok=True)
    marker = d / "MARKER"
    for case, *_ in PAYLOADS:
        payload_h5(d / f"{case}.h5", marker, case)
    savedmodel_payload(d / "sm_payload", marker)
    for case in ("inf_shape", "huge_rate", "long_name", "nan_mask"):
        config_value(d / f"{case}.h5", case)
    for name in ("training", "forward", "state_dict"):
        named(d / f"named_{name}.h5", name)
    print(f"wrote the family into {d}; the payload's marker would be {marker}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "keras_config_corpus")
