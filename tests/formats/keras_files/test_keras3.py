"""Keras 3 format: Keras 2 -> .keras migration checked by keras.saving.load_model, Keras 3 files read back,
Keras-2 hard_sigmoid rescaled (whole models: tests/formats/whole_models/test_keras_whole.py), unsafe archives refused."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

import rnnconvert
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError


def _run3(k3, path, names, x):
    """keras.saving.load_model on the written file; run the named layers in a chain."""
    m = k3.saving.load_model(path, compile=False)
    h = x
    for n in names:
        h = m.get_layer(n)(h)
    return k3.ops.convert_to_numpy(h).astype(np.float64)


def test_textgenrnn_cudnnlstm_to_keras3(tmp_path, realworld, k3):
    src = realworld / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5"
    ora = np.load(realworld / "textgenrnn-reddit-cudnnlstm" / "oracle_out.npz", allow_pickle=False)
    dst = tmp_path / "textgen.keras"
    rep = rnnconvert.convert(src, dst)
    assert rep.verification.ok and any("CuDNNLSTM becomes Keras 3 LSTM" in n for n in rep.notes)
    for layer in ("rnn_1", "rnn_2"):
        got = _run3(k3, dst, [layer], ora[f"{layer}__in"])
        np.testing.assert_allclose(got, ora[f"{layer}__out"], atol=1e-5, rtol=0)
    with zipfile.ZipFile(dst) as z:
        cfg = json.loads(z.read("config.json"))
    classes = [l["class_name"] for l in cfg["config"]["layers"]]
    assert "LSTM" in classes and not any("CuDNN" in c for c in classes)


def test_keras2_model_to_keras3_and_back(tmp_path, k2, k3):
    """tf_keras LSTM + GRU(reset_after=False) + Bidirectional GRU + SimpleRNN(relu) -> .keras and
    .weights.h5; Keras 3 computes what tf_keras computed; the Keras 3 files read back bit-exactly."""
    rng = np.random.default_rng(5)
    ins, outs = [], []
    for name, layer in [("l", k2.layers.LSTM(5, return_sequences=True, name="lstm_a")),
                        ("g", k2.layers.GRU(4, reset_after=False, return_sequences=True, name="gru_rb")),
                        ("b", k2.layers.Bidirectional(k2.layers.GRU(3, return_sequences=True), name="bidi")),
                        ("s", k2.layers.SimpleRNN(4, activation="relu", return_sequences=True, name="srnn"))]:
        i = k2.Input((None, 6), name=f"{name}_in")
        ins.append(i)
        outs.append(layer(i))
    model = k2.Model(ins, outs)
    for w in model.weights:  # gate-distinct columns: block j centred on 0.1 (j+1)
        a = rng.uniform(-0.3, 0.3, w.shape)
        n = w.shape[-1]
        g = 4 if "lstm" in w.name else 3 if "gru" in w.name else 1
        for j in range(g):
            a[..., j * n // g:(j + 1) * n // g] += 0.1 * (j + 1) * (-1) ** j
        w.assign(a.astype(np.float32))
    src = tmp_path / "k2.h5"
    model.save(src)
    x = rng.standard_normal((3, 7, 6)).astype(np.float32)
    want = [o.numpy().astype(np.float64) for o in model([x] * 4)]
    for out in (tmp_path / "m.keras", tmp_path / "m.weights.h5"):
        rnnconvert.convert(src, out)
        assert registry.detect(out).name == "keras3"
        if out.suffix == ".keras":
            for nm, w in zip(["lstm_a", "gru_rb", "bidi", "srnn"], want):
                np.testing.assert_allclose(_run3(k3, out, [nm], x), w, atol=1e-5, rtol=0)
        back = rnnconvert.load(out)
        src_ck = rnnconvert.load(src)
        # a .weights.h5 keeps no cross-class layer order (groups are class names): compare by name
        assert sorted(l.name for l in back.layers) == sorted(l.name for l in src_ck.layers)
        if out.suffix == ".keras":
            assert [l.name for l in back.layers] == [l.name for l in src_ck.layers]
        for a in src_ck.layers:
            b = back.layer(a.name)
            assert (a.semantics.reset_after, a.bidirectional) == (b.semantics.reset_after, b.bidirectional)
            if out.suffix == ".keras":  # a weights-only file does not store activations (relu here)
                assert (a.cell, a.semantics) == (b.cell, b.semantics)
            for pa, pb in zip(a.params[0], b.params[0]):
                for key in ("w_ih", "w_hh", "b_ih", "b_hh"):
                    assert np.array_equal(getattr(pa, key), getattr(pb, key)), (a.name, key)
    # Keras 3 -> Keras 2 HDF5 -> tf_keras, from the .keras file
    rnnconvert.convert(tmp_path / "m.keras", tmp_path / "again.h5")
    again = k2.models.load_model(tmp_path / "again.h5", compile=False)
    np.testing.assert_allclose(again.get_layer("bidi")(x).numpy(), want[2], atol=1e-5, rtol=0)


def test_keras3_hard_sigmoid_is_read_as_keras3(tmp_path, k3):
    """A Keras 3 'hard_sigmoid' (x/6 + 1/2) model: read as hard_sigmoid_k3, verified against Keras 3 itself."""
    i = k3.Input((None, 3))
    m = k3.Model(i, k3.layers.LSTM(4, recurrent_activation="hard_sigmoid", return_sequences=True, name="hs")(i))
    rng = np.random.default_rng(1)
    m.set_weights([rng.uniform(-2, 2, w.shape).astype(np.float32) for w in m.get_weights()])
    src = tmp_path / "hs.keras"
    m.save(src)
    ck = rnnconvert.load(src)
    assert ck.layers[0].semantics.gate_activation == "hard_sigmoid_k3"
    out = tmp_path / "hs2.keras"
    rep = rnnconvert.convert(src, out)
    assert rep.verification.ok
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(_run3(k3, out, ["hs"], x), k3.ops.convert_to_numpy(m(x)), atol=1e-6, rtol=0)
    # Keras 2 has no x/6 hard_sigmoid: its 0.2x one on gate weights scaled by 5/6 (issue #17); oracle tf_keras
    rep = rnnconvert.convert(src, tmp_path / "hs.h5")
    assert rep.verification.ok and any("5/6" in n and "not bit-exact" in n for n in rep.notes)
    k2 = pytest.importorskip("tf_keras")
    old = k2.models.load_model(tmp_path / "hs.h5", compile=False)
    assert old.get_layer("hs").get_config()["recurrent_activation"] == "hard_sigmoid"
    np.testing.assert_allclose(old.get_layer("hs")(x).numpy(), k3.ops.convert_to_numpy(m(x)), atol=2e-5, rtol=0)
    legacy = tmp_path / "hs_legacy.h5"  # Keras 3's own legacy HDF5 (keras_version 3.x): same meaning
    m.save(legacy)
    assert rnnconvert.load(legacy).layers[0].semantics.gate_activation == "hard_sigmoid_k3"
    out2 = tmp_path / "hs3.keras"
    assert rnnconvert.convert(legacy, out2).verification.ok
    np.testing.assert_allclose(_run3(k3, out2, ["hs"], x), k3.ops.convert_to_numpy(m(x)), atol=1e-6, rtol=0)


def test_unsafe_archives_refused(tmp_path):
    bad = tmp_path / "evil.keras"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"x")
        z.writestr("../escape.txt", "x")
    with pytest.raises(FormatError, match="unsafe"):
        rnnconvert.load(bad)
    dup = tmp_path / "dup.keras"
    with zipfile.ZipFile(dup, "w") as z:
        z.writestr("config.json", "{}")
        with pytest.warns(UserWarning):
            z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"x")
    with pytest.raises(FormatError, match="duplicated"):
        rnnconvert.load(dup)
    bomb = tmp_path / "bomb.keras"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"\0" * (8 << 20))
    with pytest.raises(FormatError, match="zip bomb"):
        rnnconvert.load(bomb)


def test_pytorch_to_keras3(tmp_path, k3):
    """nn.LSTM(num_layers=2, bidirectional) and nn.GRU -> .keras; Keras 3 reproduces torch."""
    torch = pytest.importorskip("torch")
    from test_keras_h5_write import _save_pt, gate_distinct_

    x = np.random.default_rng(2).standard_normal((3, 6, 5)).astype(np.float32)
    for mod, names in [(torch.nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True), ["rnn_l0", "rnn_l1"]),
                       (torch.nn.GRU(5, 4, batch_first=True), ["rnn"])]:
        gate_distinct_(mod, 4)
        src, dst = tmp_path / "t.pt", tmp_path / "t.keras"
        _save_pt(mod, src)
        rnnconvert.convert(src, dst, force=True)
        with torch.no_grad():
            want = mod(torch.from_numpy(x))[0].double().numpy()
        np.testing.assert_allclose(_run3(k3, dst, names, x), want, atol=1e-5, rtol=0)


def test_keras3_nested_model_read(tmp_path, k3):
    """A Keras 3 model with a nested Sequential, TimeDistributed(Dense) and Bidirectional(LSTM), made by
    Keras 3: read without Keras, converted to .pt, torch reproduces Keras 3's layer outputs."""
    torch = pytest.importorskip("torch")
    inner = k3.Sequential([k3.Input((None, 4)), k3.layers.LSTM(6, return_sequences=True, name="inner_lstm")],
                          name="sub")
    i = k3.Input((None, 4))
    h = inner(i)
    h = k3.layers.TimeDistributed(k3.layers.Dense(5), name="td")(h)
    y = k3.layers.Bidirectional(k3.layers.LSTM(3, return_sequences=True), name="bidi")(h)
    m = k3.Model(i, y)
    rng = np.random.default_rng(7)
    m.set_weights([rng.uniform(-0.7, 0.7, w.shape).astype(np.float32) for w in m.get_weights()])
    src = tmp_path / "nested.keras"
    m.save(src)
    ck = rnnconvert.load(src)
    assert [l.name for l in ck.layers] == ["sub.inner_lstm", "bidi"]
    m.save_weights(tmp_path / "nested.weights.h5")  # the same store without config: same tensors
    wo = rnnconvert.load(tmp_path / "nested.weights.h5")
    for layer in ck.layers:
        other = wo.layer(layer.name)
        for pa, pb in zip(layer.params[0], other.params[0]):
            assert all(np.array_equal(u, v) for u, v in zip(pa.arrays().values(), pb.arrays().values()))
    assert set(ck.tensors) == {"td.weight", "td.bias"}
    mods = rnnconvert.torch_modules(ck)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    h1 = k3.ops.convert_to_numpy(inner(x))
    h2 = k3.ops.convert_to_numpy(m.get_layer("td")(h1))
    y = k3.ops.convert_to_numpy(m(x))
    with torch.no_grad():
        np.testing.assert_allclose(mods["sub.inner_lstm"](torch.from_numpy(x))[0].numpy(), h1, atol=1e-5, rtol=0)
        np.testing.assert_allclose(mods["bidi"](torch.from_numpy(h2))[0].numpy(), y, atol=1e-5, rtol=0)


def test_go_backwards_merge_sum_and_dtypes(tmp_path, k2, k3):
    """go_backwards LSTM and Bidirectional(merge_mode='sum') survive to Keras 2 .h5 and Keras 3 .keras
    (checked against tf_keras' outputs); float64/float16 torch layers are written in their dtype."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    i = k2.Input((None, 3))
    y1 = k2.layers.LSTM(4, go_backwards=True, return_sequences=True, name="gb")(i)
    y2 = k2.layers.Bidirectional(k2.layers.GRU(4, return_sequences=True), merge_mode="sum", name="bs")(i)
    m = k2.Model(i, [y1, y2])
    m.set_weights([rng.uniform(-0.8, 0.8, w.shape).astype(np.float32) for w in m.get_weights()])
    m.save(tmp_path / "c.h5")
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    ref = [t.numpy() for t in m(x)]
    rnnconvert.convert(tmp_path / "c.h5", tmp_path / "c2.keras")
    rnnconvert.convert(tmp_path / "c.h5", tmp_path / "c2.h5")
    n3 = k3.saving.load_model(tmp_path / "c2.keras", compile=False)
    n2 = k2.models.load_model(tmp_path / "c2.h5", compile=False)
    for j, nm in enumerate(("gb", "bs")):
        np.testing.assert_allclose(k3.ops.convert_to_numpy(n3.get_layer(nm)(x)), ref[j], atol=1e-6, rtol=0)
        np.testing.assert_allclose(n2.get_layer(nm)(x).numpy(), ref[j], atol=1e-6, rtol=0)
    for dt, tdt in (("float64", torch.float64), ("float16", torch.float16)):
        mod = torch.nn.GRU(3, 4, batch_first=True).to(tdt)
        torch.save({f"r.{k}": v for k, v in mod.state_dict().items()}, tmp_path / f"{dt}.pt")
        for ext in ("keras", "h5"):
            rep = rnnconvert.convert(tmp_path / f"{dt}.pt", tmp_path / f"{dt}.{ext}")
            assert rep.verification.ok
            assert str(rnnconvert.load(tmp_path / f"{dt}.{ext}").layers[0].dtype) == dt


@pytest.fixture(scope="module")
def k3_store(tmp_path_factory, k3):
    """The model.weights.h5 bytes of a small Keras 3 model (LSTM, Bidirectional GRU)."""
    i = k3.Input((None, 3))
    y = k3.layers.Bidirectional(k3.layers.GRU(2, return_sequences=True), name="b")(
        k3.layers.LSTM(4, return_sequences=True, name="a")(i))
    path = tmp_path_factory.mktemp("k3") / "m.keras"
    k3.Model(i, y).save(path)
    with zipfile.ZipFile(path) as z:
        return z.read("model.weights.h5")


def test_malformed_config_never_crashes(tmp_path, k3_store):
    """Arbitrary JSON in config.json / metadata.json: a Checkpoint or an RNNConvertError, nothing else."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    from rnnconvert.errors import RNNConvertError

    leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(
        ["LSTM", "GRU", "Bidirectional", "a", "b", "sigmoid", "hard_sigmoid"])
    js = st.recursive(leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(
        st.sampled_from(["config", "layers", "class_name", "name", "layer", "recurrent_activation",
                         "reset_after", "keras_version", "merge_mode"]), c, max_size=5), max_leaves=20)

    @hyp.settings(max_examples=60, deadline=None, suppress_health_check=list(hyp.HealthCheck))
    @hyp.given(cfg=js, meta=js)
    def run(cfg, meta):
        p = tmp_path / "fuzz.keras"
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("config.json", json.dumps(cfg))
            z.writestr("metadata.json", json.dumps(meta))
            z.writestr("model.weights.h5", k3_store)
        try:
            rnnconvert.load(p)
        except RNNConvertError:
            pass

    run()


@pytest.mark.parametrize("cfg,match", [
    ({"config": {"layers": [{"class_name": "Bidirectional", "config": {"name": "b", "merge_mode": 5}}]}}, "merge_mode"),
    ({"config": {"layers": [{"class_name": "LSTM", "config": {"name": "b"}}]}}, "inconsistent"),
    ({"config": {"layers": [{"class_name": "Bidirectional", "config": {"name": "a"}}]}}, "inconsistent"),
    ({"config": {"layers": [{"class_name": "LSTM", "config": {"name": "a", "recurrent_activation": {"x": 1}}}]}},
     "not supported"),
])
def test_contradictory_config_refused(tmp_path, k3_store, cfg, match):
    p = tmp_path / "bad.keras"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("config.json", json.dumps(cfg))
        z.writestr("model.weights.h5", k3_store)
    with pytest.raises((FormatError, UnsupportedError), match=match):
        rnnconvert.load(p)


def test_reset_before_gru_with_recurrent_bias(tmp_path, k2, k3):
    """A reset-before GRU with a non-zero recurrent bias b_hh (TF1 / ONNX linear_before_reset=0 style:
    b_hn outside r) goes to Keras GRU(reset_after=False) with the summed bias; tf_keras and Keras 3 agree
    with the reference equations."""
    from rnnconvert.core import reference
    from rnnconvert.core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics

    rng = np.random.default_rng(11)
    H, I = 4, 3
    p = DirectionParams(*(rng.uniform(-0.8, 0.8, s).astype(np.float32) for s in ((3 * H, I), (3 * H, H), (3 * H,), (3 * H,))))
    layer = RNNLayer("g", Cell.GRU, I, H, semantics=Semantics(reset_after=False), params=[[p]])
    ck = Checkpoint(layers=[layer])
    x = rng.standard_normal((2, 6, I)).astype(np.float32)
    want = reference.forward(layer, x)
    rnnconvert.save(ck, tmp_path / "g.h5")
    rnnconvert.save(ck, tmp_path / "g.keras")
    got2 = k2.models.load_model(tmp_path / "g.h5", compile=False)(x).numpy()
    got3 = k3.ops.convert_to_numpy(k3.saving.load_model(tmp_path / "g.keras", compile=False)(x))
    np.testing.assert_allclose(got2, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got3, want, atol=1e-5, rtol=0)


def test_tf_keras_written_keras_archive(tmp_path, k2):
    """tf_keras 2.x also writes .keras archives (keras_version 2.x, no @name attributes): layers are found
    by their class-name store keys, and 'hard_sigmoid' keeps its Keras 2 meaning (rescaled for Keras 3)."""
    i = k2.Input((None, 3))
    y = k2.layers.LSTM(4, recurrent_activation="hard_sigmoid", return_sequences=True, name="hs")(i)
    y = k2.layers.Bidirectional(k2.layers.GRU(2, return_sequences=True), name="bb")(y)
    m = k2.Model(i, y)
    rng = np.random.default_rng(0)
    m.set_weights([rng.uniform(-2, 2, w.shape).astype(np.float32) for w in m.get_weights()])
    src = tmp_path / "k2.keras"
    m.save(src)
    ck = rnnconvert.load(src)
    assert [l.name for l in ck.layers] == ["hs", "bb"]
    assert ck.layers[0].semantics.gate_activation == "hard_sigmoid"
    rnnconvert.convert(src, tmp_path / "k2.h5")
    again = k2.models.load_model(tmp_path / "k2.h5", compile=False)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(again.get_layer("hs")(x).numpy(), m.get_layer("hs")(x).numpy(), atol=1e-5, rtol=0)
    # Keras 3 target: the Keras-2 hard_sigmoid gates become Keras 3's on weights scaled by 1.2 (issue #17)
    rep = rnnconvert.convert(src, tmp_path / "k3.keras")
    assert rep.verification.ok and any("hs" in n and "rescaled, not bit-exact" in n for n in rep.notes)
    k3 = pytest.importorskip("keras")
    np.testing.assert_allclose(_run3(k3, tmp_path / "k3.keras", ["hs"], x), m.get_layer("hs")(x).numpy(),
                               atol=2e-5, rtol=0)


def test_outputs_are_byte_stable(tmp_path, k3):
    """The same source written twice gives identical .keras and .h5 bytes (no timestamps, no id()s)."""
    torch = pytest.importorskip("torch")
    from test_keras_h5_write import _save_pt, gate_distinct_

    mod = torch.nn.GRU(3, 4, bidirectional=True, batch_first=True)
    gate_distinct_(mod, 9)
    _save_pt(mod, tmp_path / "s.pt")
    for ext in ("keras", "h5"):
        a, b = tmp_path / f"a.{ext}", tmp_path / f"b.{ext}"
        rnnconvert.convert(tmp_path / "s.pt", a, verify=None)
        rnnconvert.convert(tmp_path / "s.pt", b)
        assert a.read_bytes() == b.read_bytes(), ext


def test_textgenrnn_via_pt_to_keras3(tmp_path, realworld, k3):
    """Real CuDNNLSTM file -> .pt -> .keras: Keras 3 still reproduces the oracle."""
    pytest.importorskip("torch")
    d = realworld / "textgenrnn-reddit-cudnnlstm"
    ora = np.load(d / "oracle_out.npz", allow_pickle=False)
    rnnconvert.convert(d / "reddit_rarepuppers_politics.hdf5", tmp_path / "tg.pt")
    rnnconvert.convert(tmp_path / "tg.pt", tmp_path / "tg.keras")
    for layer in ("rnn_1", "rnn_2"):
        np.testing.assert_allclose(_run3(k3, tmp_path / "tg.keras", [layer], ora[f"{layer}__in"]),
                                   ora[f"{layer}__out"], atol=1e-5, rtol=0)


def test_dinornn_via_pt_to_keras3(tmp_path, dinornn, k3):
    """Real TF2 GRU checkpoint -> .pt -> .keras: Keras 3 still reproduces the oracle."""
    pytest.importorskip("torch")
    d = dinornn
    ora = np.load(d / "oracle_out.npz", allow_pickle=False)
    rnnconvert.convert(d, tmp_path / "dino.pt")
    rnnconvert.convert(tmp_path / "dino.pt", tmp_path / "dino.keras")
    m = k3.saving.load_model(tmp_path / "dino.keras", compile=False)
    gru = m.get_layer("layer_with_weights_1")  # '-' is not a Keras name character: replaced by '_'
    for k in range(4):
        got = k3.ops.convert_to_numpy(gru(ora[f"p{k}_gru__in"][None]))[0]
        np.testing.assert_allclose(got, ora[f"p{k}_gru__out"], atol=2e-5, rtol=0)
