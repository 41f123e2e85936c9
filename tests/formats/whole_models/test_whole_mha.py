"""Keras ``MultiHeadAttention`` in whole models (issue #41): the ONNX graph (onnxruntime), the ``.pt2`` program and
the emitted module against the frameworks' own outputs; refusals of what is not built; odd config values.

Oracle: ``fixtures/gen_whole_mha.py`` (tf_keras 2.21 ``.h5`` and Keras 3.15 ``.keras`` models, random weights
uniform in +-0.4, token rows padded at none, the end, the front and inside; float contexts longer than the
queries; every model output at each stored length). Tolerance: ``WHOLE_TOL`` (2e-5) relative to
``max(1, max|ref|)``: float32 rounding of these small graphs (projections of at most 8 terms, scores of at most
4, a softmax, sums of at most 12 weighted values) stays near 1e-6; a reordered sum on another CPU moves it by the
same order. A wrong mask, head split, scale or causal triangle moves outputs by 1e-2 or more
(:func:`test_masks_and_causal_change_the_outputs`).
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
from conftest import whole_onnx_model as _onnx  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "whole_mha"
CASES = ["mha_text.h5", "mha_cross.h5", "k3_mha.keras"]


def _graph(name, edit=None):
    return whole_fixture_graph(FIX, name, edit)


def _cases(name):
    return whole_length_cases(FIX, name)


@pytest.mark.parametrize("name", CASES)
def test_onnx_matches_framework(name):
    """onnxruntime on the written graph: every output at every stored length (rows padded anywhere)."""
    assert_whole_onnx_lengths(_onnx(_graph(name)), FIX, name)


@pytest.mark.parametrize("name", CASES)
def test_pt2_matches_framework(name, tmp_path):
    """The exported ``.pt2`` program, saved and loaded back: every output at every stored length."""
    g = _graph(name)
    assert_whole_torch_lengths(whole_pt2_program(g, tmp_path), g, FIX, name, np.int32, shape=True)


@pytest.mark.parametrize("name", CASES)
def test_emitted_module_matches_framework(name, tmp_path):
    """The emitted ``nn.Module`` source (imported from its file, state loaded with weights_only) computes the
    framework's outputs."""
    g = _graph(name)
    assert_whole_torch_lengths(whole_emitted_module(g, tmp_path, "mha_mod"), g, FIX, name, np.int64)


def _edit_call(layer, **kw):
    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == layer:
                rec["inbound_nodes"][0][0][3].update(kw)
                for k, v in list(rec["inbound_nodes"][0][0][3].items()):
                    if v is None:
                        del rec["inbound_nodes"][0][0][3][k]
    return edit


def test_masks_and_causal_change_the_outputs():
    """The fixtures tell the causal triangle and the masks apart: the graph built without them misses tf_keras."""
    n, feeds, outs = next(_cases("mha_text.h5"))
    got = ort_run(_onnx(_graph("mha_text.h5", _edit_call("mha_self", use_causal_mask=None))), feeds, ["output_3"])
    assert not whole_close(got[0], outs[3])

    def unmasked(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "emb":
                rec["config"]["mask_zero"] = False

    got = ort_run(_onnx(_graph("mha_text.h5", unmasked)), feeds, ["output_1", "output_2"])
    assert not whole_close(got[0], outs[1]) and not whole_close(got[1], outs[2])


@pytest.mark.parametrize("key,value,match", [
    ("attention_axes", [2], "attention_axes"), ("use_gate", True, "use_gate"),
    ("sliding_window", 3, "sliding_window"), ("output_shape", [2, 3], "output_shape")])
def test_unbuilt_settings_refused_by_name(key, value, match):
    """Settings the writers do not build: one WholeModelError line naming the layer and the setting."""
    from rnnconvert.errors import WholeModelError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "mha_self":
                rec["config"][key] = value

    with pytest.raises(WholeModelError, match=f"mha_self.*{match}"):
        _graph("mha_text.h5", edit)


@pytest.mark.parametrize("kw", [{"attention_mask": ["tokens", 0, 0]}, {"frobnicate": 1},
                                {"use_causal_mask": "yes"}, {"value": "<script>"}])
def test_unknown_call_keyword_refused(kw):
    """A call keyword the writers do not follow (an explicit attention_mask, an unknown one, a flag that is not a
    bool, a value that is not a tensor reference): refused by name."""
    from rnnconvert.errors import WholeModelError

    with pytest.raises(WholeModelError, match="mha_self"):
        _graph("mha_text.h5", _edit_call("mha_self", **kw))


@pytest.mark.parametrize("heads,key_dim", [(4, 3), (2, 5), (3, 2)])
def test_weights_unlike_config_refused(heads, key_dim):
    """num_heads / key_dim other than the stored kernels say (an attacker's config against real weights): one
    UnsupportedError line naming the layer; nothing is sized from the config alone."""
    from rnnconvert.errors import UnsupportedError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "mha_self":
                rec["config"].update(num_heads=heads, key_dim=key_dim)

    with pytest.raises(UnsupportedError, match="mha_self"):
        _graph("mha_text.h5", edit)


@pytest.mark.parametrize("key,value", [
    ("num_heads", -2), ("num_heads", 0), ("num_heads", 2**40), ("num_heads", "2"), ("key_dim", -1),
    ("key_dim", 10**400), ("key_dim", 3.5), ("value_dim", 0), ("attention_axes", "<b>1</b>"),
    ("attention_axes", ["1"]), ("softmax_robust_masking", "true"), ("query_shape", [None, "x"]),
    ("sliding_window", -4)])
def test_sanitizer_refuses_odd_values(key, value):
    """The whitelist (rnnconvert/safety/keras_sanitize.py) refuses odd MultiHeadAttention values before any
    reader or Keras sees them: one line naming the layer and the key (FormatError, exit 3)."""
    from rnnconvert.errors import FormatError
    from rnnconvert.safety import keras_sanitize

    conf = {"name": "mha", "num_heads": 2, "key_dim": 3, key: value}
    with pytest.raises(FormatError, match=f"mha.*{key}"):
        keras_sanitize.layer_config("MultiHeadAttention", conf, "model.h5", "mha")


def test_sanitizer_keeps_real_configs():
    """The tf_keras and Keras 3 configs of the fixtures pass the whitelist unchanged."""
    import json
    import zipfile

    import h5py

    from rnnconvert.safety import keras_sanitize

    with h5py.File(FIX / "mha_text.h5", "r") as f:
        cfg = json.loads(f.attrs["model_config"])
    assert keras_sanitize.model_config(cfg, "mha_text.h5") == cfg
    cfg3 = json.loads(zipfile.ZipFile(FIX / "k3_mha.keras").read("config.json"))
    assert keras_sanitize.model_config(cfg3, "k3_mha.keras")["config"] == cfg3["config"]


def test_keras3_erased_mask_refused():
    """Keras 3's MultiHeadAttention erases its inputs' masks when it runs: a masked embedding read by a second
    attention layer that Keras 3 may run before or after it is refused by name (the fixture gives each attention an
    embedding of its own; an ancestor (the key's Dense) and the residual Add are accepted, as built above)."""
    from rnnconvert.errors import WholeModelError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "cross_scores":
                rec["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = "emb1"

    with pytest.raises(WholeModelError, match="erases the mask"):
        _graph("k3_mha.keras", edit)


def test_huge_sizes_without_bias_allocate_nothing():
    """num_heads / key_dim of 2**31 - 1 on a layer without bias (sizes the whitelist accepts): refused by the weight
    check before any array of the config's size is made."""
    from rnnconvert.errors import UnsupportedError

    def edit(cfg):
        for rec in cfg["config"]["layers"]:
            if rec["config"]["name"] == "mha_cross":
                rec["config"].update(num_heads=2**31 - 1, key_dim=2**31 - 1, value_dim=2**31 - 1)

    with pytest.raises(UnsupportedError, match="mha_cross"):
        _graph("mha_text.h5", edit)
