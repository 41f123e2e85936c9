"""``PReLU``, ``Rescaling``, ``UnitNormalization`` and ``UpSampling1D`` in whole models (issue #41): the ONNX graph
(onnxruntime), the ``.pt2`` program and the emitted module against tf_keras' and Keras 3's own outputs; refusals.

Oracle: ``fixtures/gen_whole_mha.py`` (``small_layers.h5`` by tf_keras 2.21, ``k3_small_layers.keras`` by Keras
3.15; random weights uniform in +-0.4, token rows padded at none, the end, the front and inside, so the masks reach
the GRU through PReLU and UnitNormalization; every model output at each stored length). Tolerance: ``WHOLE_TOL``
(2e-5) relative to ``max(1, max|ref|)``, as the other whole-model tests (float32 rounding of a few hundred terms).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from conftest import assert_whole_onnx_lengths, assert_whole_torch_lengths, ort_run, whole_close  # noqa: E402
from conftest import whole_emitted_module, whole_fixture_graph, whole_length_cases, whole_pt2_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "whole_mha"
CASES = ["small_layers.h5", "k3_small_layers.keras"]


def _graph(name, edit=None):
    return whole_fixture_graph(FIX, name, edit)


def _cases(name):
    return whole_length_cases(FIX, name)


@pytest.mark.parametrize("name", CASES)
def test_onnx_matches_framework(name):
    """onnxruntime on the written graph: every output at every stored length."""
    from rnnconvert.whole.formats.onnx import model_write

    assert_whole_onnx_lengths(model_write.build(_graph(name)), FIX, name)


@pytest.mark.parametrize("name", CASES)
def test_pt2_matches_framework(name, tmp_path):
    """The exported ``.pt2`` program, saved and loaded back: every output at every stored length."""
    g = _graph(name)
    assert_whole_torch_lengths(whole_pt2_program(g, tmp_path), g, FIX, name, np.int32)


@pytest.mark.parametrize("name", CASES)
def test_emitted_module_matches_framework(name, tmp_path):
    """The emitted ``nn.Module`` source (imported from its file, state loaded with weights_only)."""
    g = _graph(name)
    assert_whole_torch_lengths(whole_emitted_module(g, tmp_path, "small_mod"), g, FIX, name, np.int64)


def test_masks_reach_the_gru():
    """PReLU and UnitNormalization hand the embedding's mask on (tf_keras): without it the output misses."""
    from rnnconvert.whole.formats.onnx import model_write

    def unmasked(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "emb":
                rec["config"]["mask_zero"] = False

    n, feeds, outs = next(_cases("small_layers.h5"))
    got = ort_run(model_write.build(_graph("small_layers.h5", unmasked)), feeds, ["output_0"])[0]
    assert not whole_close(got, outs[0])


@pytest.mark.parametrize("layer,key,value,match", [
    ("unit", "axis", 1, "axis"), ("up2", "size", 0, "size"), ("rescale", "scale", [[1.0, 2.0]], "scale")])
def test_unbuilt_settings_refused_by_name(layer, key, value, match):
    """Settings the writers do not build: one refusal naming the layer and the setting (whitelist or writer)."""
    from rnnconvert.errors import RNNConvertError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == layer:
                rec["config"][key] = value

    with pytest.raises(RNNConvertError, match=f"{layer}.*{match}"):
        _graph("small_layers.h5", edit)


def test_prelu_weight_unlike_input_refused():
    """A PReLU alpha of another rank than its input makes: UnsupportedError naming the layer."""
    from rnnconvert.errors import UnsupportedError
    from rnnconvert.whole.conventions import keras_graph

    g = _graph("small_layers.h5")
    node = next(n for n in g.nodes if n.path == "prelu_vec")
    node.weights = [np.zeros((2, 2, 4), np.float32)]
    with pytest.raises(UnsupportedError, match="prelu_vec"):
        keras_graph._small(node)


@pytest.mark.parametrize("eq", ["<script>abc,cd->abd</script>", "...c,cd->...d", "abc,cd->bad", "abc,cd->abe",
                                "aac,cd->aad", "abcd,de->abce", "abc,cd->abd; import os", ""])
def test_einsum_equation_refused(eq):
    """An EinsumDense equation other than a checked '<x>,<kernel>-><out>' (markup, ellipsis, the batch moved, an
    unknown letter, a repeated letter, another rank, trailing text): refused by name; the equation never reaches
    an einsum."""
    from rnnconvert.errors import RNNConvertError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "einsum_seq":
                rec["config"]["equation"] = eq

    with pytest.raises(RNNConvertError, match="einsum_seq"):
        _graph("small_layers.h5", edit)


def test_einsum_weights_unlike_equation_refused():
    """An EinsumDense kernel of another rank than its equation says: UnsupportedError naming the layer."""
    from rnnconvert.errors import UnsupportedError
    from rnnconvert.whole.conventions import keras_graph

    g = _graph("small_layers.h5")
    node = next(n for n in g.nodes if n.path == "einsum_vec")
    node.weights = [np.zeros((4, 3, 2), np.float32)]
    with pytest.raises(UnsupportedError, match="einsum_vec"):
        keras_graph._einsum(node)
