"""Writing TF1 checkpoints: torch / TF sources -> TF1 checkpoint directory, restored and run by TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES, manifest
from rnnconvert import api
from rnnconvert.errors import OutputExistsError, UnsupportedError

B, T = 2, 5


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf  # noqa: PLC0415

    return tf


def _torch_source(tmp_path, name, module, seed=0):
    import torch  # noqa: PLC0415

    torch.manual_seed(seed)
    with torch.no_grad():
        for j, p in enumerate(module.parameters()):
            p.uniform_(-0.5, 0.5)
            p.add_(0.1 * j)
    src = tmp_path / f"{name}.pt"
    torch.save({f"{name}.{k}": v for k, v in module.state_dict().items()}, src)
    x = np.random.default_rng(seed).normal(size=(B, T, module.input_size)).astype(np.float32)
    with torch.no_grad():
        y = module(torch.from_numpy(x))[0].numpy()
    return src, x, y


def _run_v1(tf, ckpt_dir, x, build):
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        xp = v1.placeholder(tf.float32, x.shape)
        y = build(xp)
        with v1.Session() as s:
            v1.train.Saver().restore(s, str(ckpt_dir / "ckpt"))  # every graph variable must be in the file
            return s.run(y, {xp: x})


def _multi(tf, scope, cells, x):
    v1 = tf.compat.v1
    with v1.variable_scope(scope):
        y, _ = v1.nn.dynamic_rnn(v1.nn.rnn_cell.MultiRNNCell(cells), x, dtype=tf.float32)
    return y


def test_lstm_projection_restores_into_lstmcell(tf, tmp_path):
    import torch  # noqa: PLC0415

    src, x, want = _torch_source(tmp_path, "lstm", torch.nn.LSTM(3, 4, num_layers=2, proj_size=2, batch_first=True))
    out = tmp_path / "out"
    rep = api.convert(src, out, to="tf_checkpoint")
    assert "lstm_cell" in rep.modules[0]
    rc = tf.compat.v1.nn.rnn_cell
    y = _run_v1(tf, out, x, lambda xp: _multi(tf, "lstm", [rc.LSTMCell(4, num_proj=2), rc.LSTMCell(4, num_proj=2)], xp))
    np.testing.assert_allclose(y, want, atol=1e-5)


def test_rnn_restores_into_basicrnncell(tf, tmp_path):
    import torch  # noqa: PLC0415

    src, x, want = _torch_source(tmp_path, "rnn", torch.nn.RNN(3, 4, batch_first=True), seed=1)
    out = tmp_path / "out"
    api.convert(src, out, to="tf_checkpoint")
    rc = tf.compat.v1.nn.rnn_cell
    np.testing.assert_allclose(_run_v1(tf, out, x, lambda xp: _multi(tf, "rnn", [rc.BasicRNNCell(4)], xp)), want,
                               atol=1e-5)


def test_plain_lstm_as_cudnn_compatible_runs_in_blocklstm(tf, tmp_path):
    """CudnnCompatibleLSTMCell = LSTMBlockCell(forget_bias=0): TF's BlockLSTM op on the written tensors."""
    import torch  # noqa: PLC0415

    src, x, want = _torch_source(tmp_path, "enc", torch.nn.LSTM(3, 4, batch_first=True), seed=2)
    out = tmp_path / "out"
    api.convert(src, out, to="tf_checkpoint")
    r = tf.train.load_checkpoint(str(out / "ckpt"))
    scope = "enc/rnn/multi_rnn_cell/cell_0/cudnn_compatible_lstm_cell"
    z = np.zeros((B, 4), np.float32)
    zh = np.zeros(4, np.float32)
    y = tf.raw_ops.BlockLSTM(seq_len_max=np.int64(T), x=np.transpose(x, (1, 0, 2)), cs_prev=z, h_prev=z,
                             w=r.get_tensor(f"{scope}/kernel"), wci=zh, wcf=zh, wco=zh,
                             b=r.get_tensor(f"{scope}/bias"), forget_bias=0.0, cell_clip=-1.0,
                             use_peephole=False)[6].numpy()
    np.testing.assert_allclose(np.transpose(y, (1, 0, 2)), want, atol=1e-5)


def test_tf1_gru_fixture_round_trip_restores_into_grucell(tf, tmp_path):
    e = next(e for e in manifest("tf") if e["file"].startswith("tf/gru_cell/"))
    out = tmp_path / "out"
    api.convert(FIXTURES / e["file"], out, to="tf_checkpoint")
    oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
    rc = tf.compat.v1.nn.rnn_cell
    y = _run_v1(tf, out, oracle["x"], lambda xp: _multi(tf, "dec", [rc.GRUCell(4)], xp))
    np.testing.assert_allclose(y, oracle["dec__out"], atol=1e-6)


def test_bidirectional_gru_and_lstm_peepholes_round_trip(tmp_path):
    """Stacked bidirectional reset-after GRU and a peephole LSTM: written, read back, same numbers."""
    import torch  # noqa: PLC0415

    src, x, want = _torch_source(tmp_path, "g", torch.nn.GRU(3, 4, num_layers=2, bidirectional=True,
                                                                 batch_first=True), seed=3)
    api.convert(src, tmp_path / "g_out", to="tf_checkpoint")
    from rnnconvert.core import reference  # noqa: PLC0415

    back = api.load(tmp_path / "g_out").layer("g")
    assert back.bidirectional and back.num_layers == 2 and back.source["class_name"] == "cudnn_compatible_gru_cell"
    np.testing.assert_allclose(reference.forward(back, x), want, atol=1e-5)
    e = next(e for e in manifest("tf") if e["file"].startswith("tf/lstm_peep_clip/"))
    api.convert(FIXTURES / e["file"], tmp_path / "p_out", to="tf_checkpoint", read_opts=e["read_opts"])
    lay = api.load(tmp_path / "p_out", **e["read_opts"]).layers[0]
    oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
    assert lay.params[0][0].peep is not None
    np.testing.assert_allclose(reference.forward(lay.with_semantics(forget_bias=1.0), oracle["x"]),
                               oracle["enc__out"], atol=2e-6)


def test_refusal_and_existing_directory(tmp_path):
    d = tmp_path / "keep"
    d.mkdir()
    (d / "mine.txt").write_text("x")
    e = next(e for e in manifest("tf") if e["file"].startswith("tf/lstm_cell/"))
    with pytest.raises(OutputExistsError):
        api.convert(FIXTURES / e["file"], d, to="tf_checkpoint", force=True)
    assert (d / "mine.txt").exists()
    with pytest.raises(UnsupportedError, match="hard_sigmoid"):
        api.convert(_mycroft(), tmp_path / "m", to="tf_checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]


def _mycroft():
    from conftest import REALWORLD  # noqa: PLC0415

    p = REALWORLD / "mycroft-precise-gru" / "hey-mycroft.pb"
    if not p.exists():
        pytest.skip("realworld files absent")
    return p


def test_tf2_object_checkpoint_loads_into_tf_keras_model(tf, tmp_path):
    """torch GRU (2 layers) -> TF2 object checkpoint -> tf_keras model.load_weights restores it."""
    import torch  # noqa: PLC0415
    import tf_keras as keras  # noqa: PLC0415

    src, x, want = _torch_source(tmp_path, "g", torch.nn.GRU(3, 4, num_layers=2, batch_first=True), seed=5)
    out = tmp_path / "out"
    rep = api.convert(src, out, to="tf2_checkpoint")
    assert "layer_with_weights-0..1" in rep.modules[0]
    L = keras.layers
    inp = keras.Input((T, 3))
    h = L.GRU(4, return_sequences=True, reset_after=True)(inp)
    h = L.GRU(4, return_sequences=True, reset_after=True)(h)
    model = keras.Model(inp, h)
    model.load_weights(str(out / "ckpt-1")).assert_existing_objects_matched()
    np.testing.assert_allclose(model(x).numpy(), want, atol=1e-5)
    back = api.load(out)
    assert [l.name for l in back.layers] == ["layer_with_weights-0", "layer_with_weights-1"]


def test_tf2_object_checkpoint_from_tf1_lstm_with_forget_bias(tf, tmp_path):
    """TF1 BasicLSTMCell stack (forget_bias 1.0 folded) -> tf_keras LSTMs restored by TensorFlow."""
    import tf_keras as keras  # noqa: PLC0415

    e = next(e for e in manifest("tf") if e["file"].startswith("tf/multi_basic_lstm/"))
    out = tmp_path / "out"
    api.convert(FIXTURES / e["file"], out, to="tf2_checkpoint")
    L = keras.layers
    oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
    inp = keras.Input((T, 3))
    model = keras.Model(inp, L.LSTM(4, return_sequences=True)(L.LSTM(4, return_sequences=True)(inp)))
    model.load_weights(str(out / "ckpt-1")).assert_existing_objects_matched()
    np.testing.assert_allclose(model(oracle["x"]).numpy(), oracle["stack__out"], atol=1e-5)


def test_tf2_object_checkpoint_bidirectional(tf, tmp_path):
    import tf_keras as keras  # noqa: PLC0415

    e = next(e for e in manifest("tf") if e["file"].startswith("tf/bidi_lstm/"))
    out = tmp_path / "out"
    api.convert(FIXTURES / e["file"], out, to="tf2_checkpoint")
    oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
    inp = keras.Input((T, 4))
    model = keras.Model(inp, keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))(inp))
    model.load_weights(str(out / "ckpt-1")).assert_existing_objects_matched()
    np.testing.assert_allclose(model(oracle["x"]).numpy(), oracle["bi__out"], atol=1e-5)
