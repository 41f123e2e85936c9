"""TensorFlow checkpoints: fixtures made by TF 2.21 (fixtures/gen_tf.py), read and run, converted to .pt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, assert_within_float32_spread, manifest
from rnnconvert.verify import tf1_equations
from rnnconvert import api
from rnnconvert.core import cudnn, reference
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, UnsupportedError

ENTRIES = manifest("tf")
if not ENTRIES:
    pytest.skip("no tf fixtures in fixtures/manifest.json (run fixtures/make_fixtures.py tf)", allow_module_level=True)
IDS = [e["file"].split("/")[1] for e in ENTRIES]


def _x(oracle, name):
    return oracle[f"{name}__in"] if f"{name}__in" in oracle else oracle["x"]


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf  # noqa: PLC0415

    return tf


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_fixture_matches_tf_outputs(entry):
    """Our reading + numpy reference reproduces what TF computed for every recurrent layer."""
    ckpt = api.load(FIXTURES / entry["file"], **entry.get("read_opts", {}))
    assert ckpt.format == "tf_checkpoint"
    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    assert sorted(l.name for l in ckpt.layers) == sorted(entry["layers"])
    for layer in ckpt.layers:
        y = reference.forward(layer, _x(oracle, layer.name))
        np.testing.assert_allclose(y, oracle[f"{layer.name}__out"], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_fixture_to_pt(entry, tmp_path):
    """Expressible layers convert to .pt (verified) and torch reproduces TF; others are refused by name."""
    src = FIXTURES / entry["file"]
    dst = tmp_path / "out.pt"
    opts = entry.get("read_opts", {})
    if entry["torch"] != "ok":
        with pytest.raises(UnsupportedError, match=entry["torch"].split(": ", 1)[1].split(" (")[0]):
            api.convert(src, dst, read_opts=opts)
        assert not dst.exists()
        return
    rep = api.convert(src, dst, read_opts=opts)
    assert dst.exists() and rep.verification is not None
    import torch  # noqa: PLC0415

    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    mods = api.torch_modules(api.load(src, **opts))
    for name, mod in mods.items():
        with torch.no_grad():
            y = mod(torch.from_numpy(_x(oracle, name)))[0].numpy()
        np.testing.assert_allclose(y, oracle[f"{name}__out"], atol=1e-5, rtol=1e-5)


def test_prefix_index_and_directory_all_accepted():
    e = next(e for e in ENTRIES if e["file"].startswith("tf/lstm_cell/"))
    pre = FIXTURES / e["file"]
    for p in (pre, pre.with_name(pre.name + ".index"), pre.parent):
        assert registry.detect(p).name == "tf_checkpoint"
        ck = api.load(p)
        assert [l.name for l in ck.layers] == ["enc"] and ck.layers[0].semantics.forget_bias == 1.0


def test_forget_bias_option_overrides_default():
    e = next(e for e in ENTRIES if e["file"].startswith("tf/lstm_cell/"))
    assert api.load(FIXTURES / e["file"], forget_bias=0.25).layers[0].semantics.forget_bias == 0.25


@pytest.mark.parametrize("which", ["cudnn_lstm", "cudnn_gru"])
def test_cudnn_checkpoint_read_from_opaque_kernel_checked_against_companions(which):
    """The layer comes from the unpacked opaque_kernel, whose matrices equal the canonical companions."""
    e = next(e for e in ENTRIES if e["file"].startswith(f"tf/{which}/"))
    lay = api.load(FIXTURES / e["file"]).layers[0]
    assert lay.semantics.forget_bias == 0.0 and lay.source.get("opaque") and lay.semantics.reset_after


def _save_vars(tf, path, values: dict):
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        vs = [v1.Variable(val, name=name) for name, val in values.items()]
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            v1.train.Saver(vs).save(s, str(path), write_meta_graph=False)


def test_opaque_kernel_alone_needs_spec(tf, tmp_path):
    """A lone opaque_kernel: ambiguous size lists candidates; with --hidden-size it reproduces TF's output."""
    e = next(e for e in ENTRIES if e["file"].startswith("tf/cudnn_lstm/"))
    buf = tf.train.load_checkpoint(str(FIXTURES / e["file"])).get_tensor("cudnn_lstm/opaque_kernel")
    _save_vars(tf, tmp_path / "ck", {"cudnn_lstm/opaque_kernel": buf})
    with pytest.raises(FormatError, match="fits .* cuDNN specs: num_layers"):
        api.load(tmp_path / "ck")
    lay = api.load(tmp_path / "ck", hidden_size=4, num_layers=1, bidirectional=False).layers[0]
    assert cudnn.Spec.of(lay) == cudnn.Spec(lay.cell, 3, 4)
    oracle = np.load(FIXTURES / e["oracle"])
    np.testing.assert_allclose(reference.forward(lay, oracle["x"]), oracle["cudnn_lstm__out"], atol=2e-6)


def test_slow_contrib_cell_refused_by_name(tf, tmp_path):
    _save_vars(tf, tmp_path / "ck", {"rnn/layer_norm_basic_lstm_cell/kernel": np.ones((5, 8), np.float32) * 0.1})
    with pytest.raises(UnsupportedError, match="layer_norm_basic_lstm_cell .*layer normalisation"):
        api.load(tmp_path / "ck")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FormatError):
        api.load(tmp_path, format="tf_checkpoint")


def test_realworld_dinornn_gru_to_pt(dinornn, tmp_path):
    """The DinoRNN TF2 checkpoint converts to .pt and torch reproduces the oracle's GRU outputs."""
    import torch  # noqa: PLC0415

    d = dinornn
    api.convert(d, tmp_path / "dino.pt")
    sd = torch.load(tmp_path / "dino.pt", weights_only=True)
    gru = torch.nn.GRU(64, 256, batch_first=True)
    gru.load_state_dict({k.split(".", 1)[1]: v for k, v in sd.items() if k.startswith("layer_with_weights-1.")})
    oracle = np.load(d / "oracle_out.npz", allow_pickle=False)
    for k in range(4):
        with torch.no_grad():
            y = gru(torch.from_numpy(oracle[f"p{k}_gru__in"][None]))[0][0].numpy()
        np.testing.assert_allclose(y, oracle[f"p{k}_gru__out"], atol=2e-5)
    assert tuple(sd["layer_with_weights-0.weight"].shape) == (27, 64)  # the Embedding is carried along


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_source_side_equations_match_tf(entry):
    """The verification source side (TF1/Keras equations on the stored tensors) reproduces TF too."""
    from rnnconvert.formats.tf import checkpoint_read as tf_checkpoint  # noqa: PLC0415

    ckpt = api.load(FIXTURES / entry["file"], **entry.get("read_opts", {}))
    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    for layer in ckpt.layers:
        if layer.source.get("raw") is None:
            continue
        y = tf1_equations.source_forward(layer, _x(oracle, layer.name))
        np.testing.assert_allclose(y, oracle[f"{layer.name}__out"], atol=2e-6, rtol=1e-5)


def test_realworld_mycroft_frozen_graph(realworld, tmp_path):
    """The Mycroft frozen GraphDef: GRU read from Const nodes, activations from the graph's ops; the Keras
    equations on its tensors reproduce TF running that graph; refused into .pt."""

    d = realworld / "mycroft-precise-gru"
    layer = api.load(d / "hey-mycroft.pb").layer("net")
    s = layer.semantics
    assert (layer.cell.value, s.gate_activation, s.activation, s.reset_after) == ("GRU", "hard_sigmoid", "linear", False)
    oracle = np.load(d / "oracle_out.npz", allow_pickle=False)
    # ill-conditioned layer: bound measured on this CPU as verification does (see test_realworld_keras)
    assert_within_float32_spread(layer, oracle["net__in"], oracle["net__out"], last_step=True, what="the oracle")
    with pytest.raises(UnsupportedError, match="'net'.*hard_sigmoid.*reset_after"):
        api.convert(d / "hey-mycroft.pb", tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.get("frozen")], ids=lambda e: e["frozen"])
def test_frozen_graph_fixture_matches_tf(entry):
    """The same TF1 graph frozen to a .pb reads to the same numbers TF computed."""
    ckpt = api.load(FIXTURES / entry["frozen"], **entry.get("read_opts", {}))
    assert ckpt.format == "tf_graph"
    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    for layer in ckpt.layers:
        np.testing.assert_allclose(reference.forward(layer, oracle["x"]), oracle[f"{layer.name}__out"], atol=2e-6)


def test_cli_inspect_and_read_opt(capsys):
    """`rnnconvert inspect` takes the checkpoint directory; --read-opt forget_bias=... reaches the reader."""
    import json  # noqa: PLC0415

    from rnnconvert.cli import main  # noqa: PLC0415

    e = next(e for e in ENTRIES if e["file"].startswith("tf/lstm_cell/"))
    d = str((FIXTURES / e["file"]).parent)
    assert main(["inspect", d, "--json", "--read-opt", "forget_bias=0.5"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "tf_checkpoint" and info["layers"][0]["forget_bias"] == 0.5
    assert main(["inspect", d, "--read-opt", "nonsense"]) == 2


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["torch"] == "ok"], ids=lambda e: e["file"].split("/")[1])
def test_fixture_to_cudnn_buffer_and_back(entry, tmp_path):
    """TF checkpoint -> .cudnn.npz (verified through torch) -> read back: torch/reference reproduce TF."""
    dst = tmp_path / "w.cudnn.npz"
    api.convert(FIXTURES / entry["file"], dst, read_opts=entry.get("read_opts", {}))
    assert registry.detect(dst).name == "cudnn_npz"
    back = api.load(dst)
    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    for layer in back.layers:
        assert layer.semantics.forget_bias == 0.0
        np.testing.assert_allclose(reference.forward(layer, _x(oracle, layer.name)), oracle[f"{layer.name}__out"],
                                   atol=2e-6, rtol=1e-5)


def test_cudnn_buffer_refuses_gru_reset_before(tmp_path):
    e = next(e for e in ENTRIES if e["file"].startswith("tf/gru_cell/"))
    with pytest.raises(UnsupportedError, match="'dec'.*reset_after=False"):
        api.convert(FIXTURES / e["file"], tmp_path / "w.cudnn.npz")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.get("savedmodel")], ids=lambda e: e["savedmodel"])
def test_savedmodel_variables_match_tf(entry):
    """SavedModel variables/ (keys variables/<k>/...): layers found through the object graph."""
    ckpt = api.load(FIXTURES / entry["savedmodel"])
    oracle = np.load(FIXTURES / entry["oracle"], allow_pickle=False)
    assert sorted(l.name for l in ckpt.layers) == sorted(entry["layers"])
    for layer in ckpt.layers:
        np.testing.assert_allclose(reference.forward(layer, _x(oracle, layer.name)), oracle[f"{layer.name}__out"],
                                   atol=2e-6, rtol=1e-5)


def test_opaque_kernel_disagreeing_with_companions_is_an_error(tf, tmp_path):
    e = next(e for e in ENTRIES if e["file"].startswith("tf/cudnn_lstm/"))
    r = tf.train.load_checkpoint(str(FIXTURES / e["file"]))
    vals = {k: r.get_tensor(k) for k in r.get_variable_to_shape_map()}
    vals["cudnn_lstm/opaque_kernel"] = vals["cudnn_lstm/opaque_kernel"][::-1].copy()
    _save_vars(tf, tmp_path / "ck", vals)
    with pytest.raises(FormatError, match="disagrees with its canonical variables"):
        api.load(tmp_path / "ck")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["torch"] == "ok" and not e["file"].startswith("tf/cudnn")
                                   and "shards" not in e["file"]], ids=lambda e: e["file"].split("/")[1])
def test_verify_framework_runs_tensorflow_on_the_source(entry, tmp_path):
    """--verify framework: TensorFlow restores and runs the source layer; the .pt output must match it."""
    rep = api.convert(FIXTURES / entry["file"], tmp_path / "o.pt", verify="framework",
                      read_opts=entry.get("read_opts", {}))
    assert rep.verification.layers and all(c.source_route.endswith("; source framework (sequence)") for c in rep.verification.layers)


def test_framework_forward_equals_oracle():
    """The framework route itself reproduces the fixture outputs TF computed when the fixture was made."""
    from rnnconvert.formats.tf import checkpoint_read as tf_checkpoint  # noqa: PLC0415
    from rnnconvert.runtimes import tensorflow as tf_framework  # noqa: PLC0415

    for e in ENTRIES:
        if "shards" in e["file"]:
            continue  # refused by this route: test_sharded_kernel_read_and_framework_route_refused
        ckpt = api.load(FIXTURES / e["file"], **e.get("read_opts", {}))
        oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
        for layer in ckpt.layers:
            if layer.source.get("class_name") in ("cudnn_compatible_lstm_cell", "cudnn_compatible_gru_cell"):
                continue
            y = tf_framework.framework_forward(FIXTURES / e["file"], ckpt, layer.name, _x(oracle, layer.name))
            np.testing.assert_allclose(y, oracle[f"{layer.name}__out"], atol=1e-6, err_msg=e["file"])


def test_opaque_kernel_adam_slots_carried_in_torch_naming(tmp_path):
    """Adam m/v of the opaque kernel (packed by tf_keras' helper at fixture time) come out per parameter."""
    import torch  # noqa: PLC0415

    e = next(e for e in ENTRIES if e["file"].startswith("tf/cudnn_lstm/"))
    ckpt = api.load(FIXTURES / e["file"])
    oracle = np.load(FIXTURES / e["oracle"], allow_pickle=False)
    for slot, ours in (("Adam", "adam_m"), ("Adam_1", "adam_v")):
        for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            assert np.array_equal(ckpt.tensors[f"cudnn_lstm.{p}_l0.{ours}"], oracle[f"slot_{slot}_{p}"])
    api.convert(FIXTURES / e["file"], tmp_path / "o.pt")
    sd = torch.load(tmp_path / "o.pt", weights_only=True)
    assert np.array_equal(sd["cudnn_lstm.weight_hh_l0.adam_v"].numpy(), oracle["slot_Adam_1_weight_hh"])


def test_batch_reads_a_checkpoint_through_its_index_only(tmp_path):
    """Directory batches skip a checkpoint's data shards and `checkpoint` file; the .index converts."""
    import shutil  # noqa: PLC0415

    from rnnconvert.batch import convert_tree  # noqa: PLC0415

    e = next(e for e in ENTRIES if e["file"].startswith("tf/lstm_cell/"))
    shutil.copytree((FIXTURES / e["file"]).parent, tmp_path / "in" / "lstm_cell")
    res = convert_tree(tmp_path / "in", tmp_path / "out", to="pt")
    assert [(Path(r.src).name, r.status) for r in res] == [("ckpt.index", "converted")]


def test_sharded_kernel_read_and_framework_route_refused(tmp_path):
    """Separate part_N keys (pre-1.0 sharded names): concatenated along axis 0, the layer reproduces TF's
    outputs (test_fixture_matches_tf_outputs); TF cannot restore them into one cell variable by name, so
    --verify framework says so and points to the reference route."""
    from rnnconvert.errors import VerificationError  # noqa: PLC0415

    e = next(e for e in ENTRIES if e["file"].startswith("tf/lstm_cell_shards/"))
    lay = api.load(FIXTURES / e["file"]).layer("enc")
    assert isinstance(lay.source["keys"][0]["kernel"], tuple) and len(lay.source["keys"][0]["kernel"]) == 2
    unsharded = api.load(FIXTURES / "tf/lstm_cell/ckpt").layer("enc")
    for a, b in zip(lay.params[0][0].arrays().values(), unsharded.params[0][0].arrays().values()):
        assert np.array_equal(a, b)
    with pytest.raises(VerificationError, match="part_N shards; use verify='reference'") as exc:
        api.convert(FIXTURES / e["file"], tmp_path / "o.pt", verify="framework")
    assert "--" not in str(exc.value) and "part_N shards; use --verify reference" in exc.value.cli_message()
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("name", ["cudnn_compatible_lstm_cell/bias_cudnn_0", "cudnn_compatible_gru_cell/bias_cudnn 1"])
def test_oldest_cudnn_saveable_names_refused(tf, tmp_path, name):
    """bias_cudnn_0/1 (GRU: with a space) of the oldest CudnnRNN saveable: not read, said so (LAYOUTS §9.3)."""
    scope = "cudnn/rnn/multi_rnn_cell/cell_0/"
    rng = np.random.default_rng(0)
    values = {scope + name.split("/")[0] + "/kernel": rng.uniform(-1, 1, (7, 16)).astype(np.float32),
              scope + name: rng.uniform(-1, 1, 16).astype(np.float32)}
    v1 = tf.compat.v1
    with tf.Graph().as_default():  # checkpoint keys given by a Saver dict: "bias_cudnn 1" is no variable name
        vs = {key: v1.Variable(val, name=f"v{i}") for i, (key, val) in enumerate(values.items())}
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            v1.train.Saver(vs).save(s, str(tmp_path / "ck"), write_meta_graph=False)
    with pytest.raises(UnsupportedError, match="bias_cudnn.* are not read"):
        api.load(tmp_path / "ck")


def test_spec_options_contradicting_companions_are_an_error():
    """num_layers/hidden_size/bidirectional are for a lone opaque_kernel; with companions they must agree."""
    e = next(e for e in ENTRIES if e["file"].startswith("tf/cudnn_lstm/"))
    assert api.load(FIXTURES / e["file"], hidden_size=4, num_layers=1).layers[0].hidden_size == 4
    with pytest.raises(FormatError, match="num_layers=2 given, but the canonical variables of 'cudnn_lstm' say "
                                          "num_layers=1"):
        api.load(FIXTURES / e["file"], num_layers=2)
