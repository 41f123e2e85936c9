"""Whole Keras 3 ``.keras`` models to one ONNX graph and a torch.export ``.pt2`` program (issue #30).

Oracle: Keras 3.15 (``fixtures/gen_keras3_whole.py`` made every fixture with ``model.save`` and its outputs
``out__<i>`` on ``in__<name>``); the targets are onnxruntime on the written graph and torch on the loaded
program. Tolerance: ``2e-5 * max(1, max|ref|)`` (issue #17/#30). The end-to-end checks run Keras 3 on the
source archive (``rnnconvert.whole.verify.keras_whole_check.compare_whole``); the mutation tests make them fail.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import rnnconvert  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.errors import UnsupportedError  # noqa: E402
from rnnconvert.whole.formats.keras import whole_source  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

from conftest import whole_feeds as _feeds  # noqa: E402
from conftest import whole_graph, whole_model  # noqa: E402
from conftest import assert_whole_outputs, whole_mutated_check, whole_onnx_outputs, whole_pt2_program  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras3_whole"
K3 = sorted(FIX.glob("k3whole_*.keras"))


def _full(path):
    return whole_model(path, whole_source.whole_source)


def _graph(path):
    return whole_graph(path, source=whole_source.whole_source)


def _keras3():
    k = pytest.importorskip("keras")
    if not k.__version__.startswith("3"):
        pytest.skip("needs Keras 3")
    return k


def test_fixtures_are_whole_models():
    """The reader gives the config and every layer's variables (Keras 3 ``layer.weights`` order); a nested
    model's as ``<inner>/var<i>``."""
    assert len(K3) == 3
    _, full = _full(FIX / "k3whole_conv_zoo.keras")
    assert full.framework == "keras3"
    assert [a.shape for _, a in full.weights["bn"]] == [(6,)] * 4  # gamma beta moving_mean moving_variance
    assert [n for n, _ in full.weights["inner"]] == ["idense/var0", "idense/var1"]


@pytest.mark.parametrize("path", K3, ids=lambda p: p.stem)
def test_onnx_graph_matches_keras3(path):
    """Every Keras 3 fixture as one ONNX graph, run by onnxruntime, gives Keras 3's outputs (oracle npz)."""
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    outs = whole_onnx_outputs(g, _feeds(g, z))
    assert len(outs) == len([k for k in z.files if k.startswith("out__")])
    assert_whole_outputs(outs, z, path.name)


@pytest.mark.parametrize("path", K3, ids=lambda p: p.stem)
def test_pt2_program_matches_keras3(path, tmp_path):
    """The same fixtures as .pt2 programs, loaded and run by torch: Keras 3's outputs."""
    torch = pytest.importorskip("torch")
    g = _graph(path)
    prog = whole_pt2_program(g, tmp_path)
    z = np.load(path.with_suffix(".npz"))
    assert_whole_outputs(prog(*[torch.from_numpy(v) for v in _feeds(g, z).values()]), z, path.name)


def test_keras3_masks_and_hard_sigmoid_are_read():
    """Keras 3 records masks as NotEqual/Any op layers and ``mask=`` keywords: they reach the recurrent layers
    and the masked mean; 'hard_sigmoid' in a Keras 3 config is Keras 3's (alpha 1/6 in ONNX)."""
    g = _graph(FIX / "k3whole_masked_text.keras")
    by = {n.name: n for n in g.nodes}
    for name in ("bilstm", "gru", "srnn", "gap"):
        assert by[name].masks[0] is not None and g.masks[by[name].masks[0]] == ("ids", "tokens")
    assert by["head"].config["activation"] == "hard_sigmoid_k3"
    assert by["gru"].layer.semantics.gate_activation == "hard_sigmoid_k3"
    hs = [n for n in model_write.build(g).graph.node if n.op_type == "HardSigmoid"]
    assert hs and all(abs(a.f - 1 / 6) < 1e-7 for n in hs for a in n.attribute if a.name == "alpha")


def _refused(path, edit) -> str:
    ckpt, full = _full(path)
    cfg = copy.deepcopy(full.config)
    edit(cfg)
    with pytest.raises(UnsupportedError) as e:
        keras_graph.build(cfg, full.weights, ckpt)
    return str(e.value)


def _rec(cfg, name):
    return next(r for r in cfg["config"]["layers"] if r["config"].get("name") == name)


def test_keras3_refusals_name_the_layer():
    """Lambda / custom classes, a mask handed to a layer whose writer does not follow it, keyword arguments
    such as initial_state and a mixed-precision policy are refused by layer name with the way out."""
    path = FIX / "k3whole_masked_text.keras"
    msg = _refused(path, lambda c: _rec(c, "head").update(class_name="Lambda"))
    assert "'head' (Lambda)" in msg and "recurrent_only" in msg

    def softmax_masked(c):
        r = _rec(c, "td")
        r["class_name"], r["config"] = "Softmax", {"name": "td", "axis": -1}
    assert "'td' (Softmax)" in _refused(path, softmax_masked) and "mask" in _refused(path, softmax_masked)

    def init_state(c):
        _rec(c, "gru")["inbound_nodes"][0]["kwargs"]["initial_state"] = None
    assert "'gru' (GRU)" in _refused(path, init_state)

    def mixed(c):
        _rec(c, "head")["config"]["dtype"] = {"module": "keras", "class_name": "DTypePolicy",
                                              "config": {"name": "mixed_float16"}}
    assert "mixed_float16" in _refused(path, mixed)


def test_cli_writes_and_verifies_keras3_source(tmp_path):
    """The default path: `.keras` -> `.onnx` and `.pt2`, verified against Keras 3 running the source."""
    _keras3()
    pytest.importorskip("torch")
    path = FIX / "k3whole_masked_text.keras"
    for ext in ("onnx", "pt2"):
        rep = rnnconvert.convert(path, tmp_path / f"m.{ext}")
        assert rep.verification.ok
        outs = [c for c in rep.verification.layers if c.name == "model output 0"]
        assert outs and outs[0].ok and outs[0].source_route == "keras 3 (whole model)", ext


# ----------------------------------------------------------------------------- mutations: the check must FAIL
def _mutated_check(path, mutate):
    """compare_whole (Keras 3 vs onnxruntime) on a written graph after ``mutate(model)``."""
    return whole_mutated_check(path, mutate, whole_source.whole_source)


@pytest.mark.parametrize("kind", ["keras2_hard_sigmoid", "drop_mask", "dense_bias"])
def test_keras3_mutations_fail(kind):
    """Keras 2's hard_sigmoid (alpha 0.2) where Keras 3's is meant, a recurrent node without its Keras 3 mask,
    a nudged Dense bias: the check against Keras 3 fails."""
    _keras3()
    path = FIX / "k3whole_masked_text.keras"
    if kind == "keras2_hard_sigmoid":
        def mutate(m):
            for n in m.graph.node:
                for a in n.attribute:
                    if n.op_type == "HardSigmoid" and a.name == "alpha":
                        a.f = 0.2
    elif kind == "drop_mask":
        def mutate(m):
            for n in m.graph.node:
                if n.op_type == "RNN" and len(n.input) > 4:  # srnn: go_backwards, its last state
                    n.input[4] = ""
    else:
        def mutate(m):
            from onnx import numpy_helper

            t = next(t for t in m.graph.initializer if t.name.startswith("head.bias"))
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + np.float32(1e-3), t.name))
    checks = _mutated_check(path, mutate)
    assert any(c.verdict == "fail" for c in checks), [(c.name, c.max_abs_err) for c in checks]


def test_keras3_written_by_tf_keras_is_not_a_keras3_whole_model(tmp_path):
    """An archive whose metadata says Keras 2.x (tf_keras writes .keras too, with Keras 2's hard_sigmoid) is not
    read as a Keras 3 whole model."""
    import zipfile

    src = FIX / "k3whole_masked_seq.keras"
    dst = tmp_path / "tfk.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "metadata.json":
                data = json.dumps({**json.loads(data), "keras_version": "2.15.0"}).encode()
            zout.writestr(item, data)
    assert whole_source.whole_source(rnnconvert.load(dst)) is None


@pytest.mark.parametrize("target", ["onnx", "pt2"])
def test_malformed_keras3_configs_are_one_line_refusals(tmp_path, target):
    """Bad input (security standard): a .keras archive whose config.json values are of the wrong kind (a number where
    a layer's call history was, a list where a mask was, a key dropped ...) is refused in one line (an rnnconvert
    error), never an internal error. 25 seeded mutations of one fixture's config (a fuzz found 14 tracebacks in
    150 before the writers and the archive reader caught malformed values, session 12)."""
    import json
    import random
    import zipfile

    from rnnconvert.errors import RNNConvertError

    pytest.importorskip("torch" if target == "pt2" else "onnx")
    src = FIX / "k3whole_masked_text.keras"
    with zipfile.ZipFile(src) as z:
        blobs = {k: z.read(k) for k in z.namelist()}
    base = json.loads(blobs["config.json"])

    def paths(o, p=()):
        yield p
        for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
            yield from paths(v, p + (k,))
    every = list(paths(base))[1:]
    rng = random.Random(0)
    for case in range(25):
        c = json.loads(blobs["config.json"])
        for _ in range(rng.randint(1, 3)):
            p = rng.choice(every)
            try:
                par = c
                for k in p[:-1]:
                    par = par[k]
                if rng.random() < 0.3 and isinstance(par, dict):
                    del par[p[-1]]
                else:
                    par[p[-1]] = rng.choice([None, -1, 10 ** 12, "x", [], {}, 3.5, True, [1, 2]])
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change removed the path
        bad = tmp_path / f"m{case}.keras"
        with zipfile.ZipFile(bad, "w") as z:
            for k, v in blobs.items():
                z.writestr(k, json.dumps(c) if k == "config.json" else v)
        try:
            rnnconvert.convert(bad, tmp_path / f"o{case}.{target}", verify=None)
        except RNNConvertError as exc:
            assert len(exc.cli_message().splitlines()) == 1
