"""Whole Keras models from tf_keras SavedModel folders (``keras_metadata.pb`` + ``variables/``) to one ONNX graph
and a ``.pt2`` program (issue #30).

Oracle: tf_keras 2.21 (``fixtures/gen_keras_savedmodel.py`` saved each model with ``model.save(dir,
save_format='tf')`` and its outputs ``out__<i>`` on ``in__<name>`` beside it); the targets are onnxruntime on the
written graph and torch on the loaded program. Tolerance ``2e-5 * max(1, max|ref|)`` (issue #30). The default
verification runs tf_keras on the model rebuilt from the config with the folder's weights (never its
``saved_model.pb`` functions) and must fail on mutated graphs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.cli import main  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.errors import FormatError, UnsupportedError  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402
from rnnconvert.formats.tf import savedmodel_keras  # noqa: E402

from conftest import ort_run as _ort_run, whole_close as _close  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras_savedmodel"
MODELS = [FIX / "sm_masked_bidir_gru", FIX / "sm_conv_lstm"]


def _whole(path):
    """The checkpoint (recurrent layers re-read with the config) and the whole model of a SavedModel folder."""
    ckpt = rnnconvert.load(path)
    full = savedmodel_keras.read_full_model(ckpt)
    assert full is not None
    return full.renamed(ckpt), full


def _feeds(z):
    return {k[len("in__"):]: z[k] for k in z.files if k.startswith("in__")}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_onnx_graph_reproduces_tf_keras(path):
    """The graph built from keras_metadata.pb and variables/ (no TensorFlow), run by onnxruntime, gives the
    outputs tf_keras computed before saving; recurrent layers are native LSTM/GRU nodes (no Loop/Scan)."""
    ckpt, full = _whole(path)
    g = keras_graph.build(full.config, full.weights, ckpt)
    model = model_write.build(g)
    ops = [n.op_type for n in model.graph.node]
    assert "LSTM" in ops and "Loop" not in ops and "Scan" not in ops
    if path.name == "sm_masked_bidir_gru":
        gru = next(n for n in model.graph.node if n.op_type == "GRU")
        attrs = {a.name: a for a in gru.attribute}
        assert attrs["linear_before_reset"].i == 0 and attrs["activations"].strings[0] == b"HardSigmoid"
    z = np.load(path.with_name(path.name + ".npz"))
    outs = _ort_run(model.SerializeToString(), _feeds(z), [f"output_{i}" for i in range(len(g.outputs))])
    for i, y in enumerate(outs):
        assert _close(y, z[f"out__{i}"]), (path.name, i)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_convert_verified_to_onnx_and_pt2(path, tmp_path):
    """The default conversion (verified end to end by tf_keras) to .onnx and .pt2; both files, run by
    onnxruntime and torch, reproduce the oracle."""
    pytest.importorskip("tf_keras")
    torch = pytest.importorskip("torch")
    z = np.load(path.with_name(path.name + ".npz"))
    rep = rnnconvert.convert(path, tmp_path / "m.onnx")
    whole = [c for c in rep.verification.layers if c.name.startswith("model")]
    assert whole and all(c.verdict == "ok" for c in whole), [(c.name, c.reason) for c in whole]
    assert any(c.name == "model output 0" and "tf_keras" in c.source_route for c in whole)
    (y,) = _ort_run(str(tmp_path / "m.onnx"), _feeds(z), ["output_0"])
    assert _close(y, z["out__0"])
    rep = rnnconvert.convert(path, tmp_path / "m.pt2")
    assert any(c.name == "model output 0" and c.verdict == "ok" for c in rep.verification.layers)
    args = [torch.from_numpy(v) for v in _feeds(z).values()]
    (y,) = torch.export.load(str(tmp_path / "m.pt2")).module()(*args)
    assert _close(y.detach().numpy(), z["out__0"])


def test_recurrent_only_and_no_metadata_keep_the_recurrent_layers(tmp_path):
    """``--recurrent-only`` writes the recurrent layers alone, named by the Keras names the model's author gave
    them (``fixtures/gen_keras_savedmodel.py``: ``bilstm``, ``gru``; issue #42), not by the checkpoint's object
    paths; a SavedModel without keras_metadata.pb has only the object paths (``layer_with_weights-N``)."""
    import onnx

    src = FIX / "sm_masked_bidir_gru"
    layers = rnnconvert.load(src).layers
    assert [layer.name for layer in layers] == ["bilstm", "gru"]
    assert all(layer.source["object_path"].startswith("layer_with_weights-") for layer in layers)
    rnnconvert.convert(src, tmp_path / "r.onnx", verify=None, write_opts={"recurrent_only": True})
    assert [i.name for i in onnx.load(str(tmp_path / "r.onnx")).graph.input] == ["bilstm__in", "gru__in"]
    bare = tmp_path / "bare"
    shutil.copytree(src, bare)
    (bare / "keras_metadata.pb").unlink()
    names = [f"{layer.source['object_path']}__in" for layer in layers]
    assert [f"{layer.name}__in" for layer in rnnconvert.load(bare).layers] == names
    assert savedmodel_keras.read_full_model(rnnconvert.load(bare)) is None
    rnnconvert.convert(bare, tmp_path / "b.onnx", verify=None)
    assert [i.name for i in onnx.load(str(tmp_path / "b.onnx")).graph.input] == names


def test_pt_keys_carry_the_keras_names(tmp_path):
    """A SavedModel into ``.pt`` (verified, the default): state-dict keys carry the layer names given in
    ``fixtures/gen_keras_savedmodel.py`` (``conv``, ``bn``, ``lstm``, ``dense``), not ``layer_with_weights-N``
    (issue #42); torch's nn.LSTM loads the recurrent tensors."""
    torch = pytest.importorskip("torch")
    rep = rnnconvert.convert(FIX / "sm_conv_lstm", tmp_path / "m.pt")
    assert [(c.name, c.verdict) for c in rep.verification.layers] == [("lstm", "ok")]
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    assert {k.split(".", 1)[0] for k in sd} == {"conv", "bn", "lstm", "dense"}
    lstm = torch.nn.LSTM(sd["lstm.weight_ih_l0"].shape[1], sd["lstm.weight_hh_l0"].shape[1], batch_first=True)
    lstm.load_state_dict({k.split(".", 1)[1]: v for k, v in sd.items() if k.startswith("lstm.")})


def test_damaged_metadata_keeps_object_paths_for_the_recurrent_layers(tmp_path):
    """A keras_metadata.pb that cannot name the layers leaves them named by object path (the recurrent-only
    conversion still reads them); the whole-model reader refuses the file (test_crafted_metadata_one_line_nonzero)."""
    src = tmp_path / "sm"
    shutil.copytree(FIX / "sm_conv_lstm", src)
    (src / "keras_metadata.pb").write_bytes(CRAFTED["non_json"])
    ckpt = rnnconvert.load(src)
    assert [layer.name for layer in ckpt.layers] == ["layer_with_weights-2"]
    assert "keras_metadata.pb" in ckpt.meta["keras_names"]


def test_custom_layer_refused_by_name_and_class(tmp_path, capsys):
    with pytest.raises(UnsupportedError) as e:
        rnnconvert.convert(FIX / "sm_custom", tmp_path / "c.onnx", verify=None, whole=True)  # refused when asked whole
    assert "'scale' (Scale)" in str(e.value) and "recurrent" in str(e.value)
    assert not (tmp_path / "c.onnx").exists()


# ----------------------------------------------------------------------------- mutations: the check must FAIL
def _mutated(tmp_path, path, mutate):
    """The written graph mutated, then judged by the onnxruntime runtime's whole-model check (tf_keras on the
    model rebuilt from the SavedModel's config and weights)."""
    import onnx

    from rnnconvert.whole.runtimes import onnx_whole as ort_rt

    rnnconvert.convert(path, tmp_path / "m.onnx", verify=None)
    m = onnx.load(str(tmp_path / "m.onnx"))
    mutate(m)
    onnx.save(m, str(tmp_path / "bad.onnx"))
    ckpt, _ = _whole(path)
    return ort_rt.verify_whole(ckpt, path, tmp_path / "bad.onnx")


def _set(model, name, fn):
    from onnx import numpy_helper

    t = next(t for t in model.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), t.name))


@pytest.mark.parametrize("kind", ["swap_gates", "dense_bias"])
def test_mutations_fail(tmp_path, kind):
    pytest.importorskip("tf_keras")
    if kind == "swap_gates":  # the GRU's W: gate blocks z and r swapped
        def mutate(m):
            def swap(a):
                H = a.shape[1] // 3
                a[:, :H], a[:, H:2 * H] = a[:, H:2 * H].copy(), a[:, :H].copy()
                return a
            _set(m, next(t.name for t in m.graph.initializer if t.name.startswith("gru.W")), swap)
    else:
        def mutate(m):
            def nudge(a):  # one logit only: softmax does not see a shift of all of them
                a[0] += np.float32(1e-3)
                return a
            _set(m, next(t.name for t in m.graph.initializer if t.name.startswith("head.bias")), nudge)
    checks = _mutated(tmp_path, FIX / "sm_masked_bidir_gru", mutate)
    assert checks and any(c.verdict == "fail" for c in checks), [(c.name, c.max_abs_err) for c in checks]


# ----------------------------------------------------------------------------- crafted keras_metadata.pb
def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


CRAFTED = {
    "bad_varint": b"\x0a" + b"\xff" * 12,
    "huge_length": b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 8,
    "non_json": _field(1, _field(3, b"root") + _field(5, b"{not json")),
    "json_not_object": _field(1, _field(3, b"root") + _field(5, b"[1, 2]")),
    "wrong_wire_type": _field(1, b"") + _varint(1 << 3 | 0) + b"\x05",
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_crafted_metadata_one_line_nonzero(tmp_path, capsys, kind):
    src = tmp_path / "sm"
    shutil.copytree(FIX / "sm_conv_lstm", src)
    (src / "keras_metadata.pb").write_bytes(CRAFTED[kind])
    with pytest.raises(FormatError):
        savedmodel_keras.read_full_model(rnnconvert.load(src))
    code = main([str(src), str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "keras_metadata.pb" in err
    assert not (tmp_path / "o.onnx").exists()
