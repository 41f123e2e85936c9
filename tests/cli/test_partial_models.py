"""Partial models (issue #41): a Keras full model holding a layer the whole-model writers cannot build is written
as its recurrent layers alone (what ``--recurrent-only`` writes), exit 0, with a note naming the layer and its
class; ``--whole`` (API ``whole=True``) insists and gets today's refusal (exit 4); ``--whole`` with
``--recurrent-only`` is a usage error (exit 2).

Fixtures made by tf_keras through committed scripts: ``keras_whole/refuse_lambda.h5`` (a ``Lambda`` named
``double`` between an LSTM and a Dense; ``fixtures/gen_keras_whole.py``) and ``keras_savedmodel/sm_custom`` (a
layer of a custom class ``Scale`` named ``scale``; ``fixtures/gen_keras_savedmodel.py``). The written files are
verified by the conversion itself (the target's own runtime, onnxruntime or Keras 3, against the float64
reference equations of the source's weights)."""

from __future__ import annotations

import json

import pytest

import rnnconvert
from rnnconvert.cli import main

from conftest import FIXTURES

LAMBDA = FIXTURES / "keras_whole" / "refuse_lambda.h5"
CUSTOM = FIXTURES / "keras_savedmodel" / "sm_custom"

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("tf_keras")


def test_default_writes_the_recurrent_layers_with_a_note_naming_the_layer(tmp_path, capsys):
    dst, ref = tmp_path / "m.onnx", tmp_path / "r.onnx"
    assert main([str(LAMBDA), str(dst), "-q"]) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if "partial model" in ln]
    assert len(notes) == 1 and "layer 'double' (Lambda)" in notes[0] and "--whole" in notes[0], out
    assert "verified lstm" in out  # the written file checked by onnxruntime against the reference equations
    # what --recurrent-only writes, byte for byte
    assert main([str(LAMBDA), str(ref), "-q", "--recurrent-only", "--no-verify"]) == 0
    assert dst.read_bytes() == ref.read_bytes()


def test_the_note_is_in_the_json_and_the_html_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    dst, html = tmp_path / "m.onnx", tmp_path / "r.html"
    assert main([str(LAMBDA), str(dst), "-q", "--json", "--report", str(html)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert any("partial model" in n and "'double' (Lambda)" in n for n in got["notes"]), got["notes"]
    assert got["verification"]["ok"] is True
    page = html.read_text()
    assert "partial model" in page and "&#x27;double&#x27; (Lambda)" in page


def test_whole_insists_and_is_refused_naming_the_layer(tmp_path, capsys):
    dst = tmp_path / "m.onnx"
    assert main([str(LAMBDA), str(dst), "-q", "--whole"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer 'double' (Lambda)" in err and "--recurrent-only" in err
    assert not dst.exists() and not list(tmp_path.iterdir())


def test_whole_and_recurrent_only_together_are_a_usage_error(tmp_path, capsys):
    dst = tmp_path / "m.onnx"
    assert main([str(LAMBDA), str(dst), "--whole", "--recurrent-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--whole" in err and "--recurrent-only" in err
    assert not list(tmp_path.iterdir())
    with pytest.raises(rnnconvert.OptionError):
        rnnconvert.convert(LAMBDA, dst, whole=True, write_opts={"recurrent_only": True})
    assert not list(tmp_path.iterdir())


def test_api_whole_raises_a_whole_model_error_with_the_layer(tmp_path):
    """The API's ``whole=True``: :class:`rnnconvert.WholeModelError` (an ``UnsupportedError``, exit code 4) naming
    the custom layer of a SavedModel; by default the same source gives its recurrent layers and the note."""
    with pytest.raises(rnnconvert.WholeModelError) as e:
        rnnconvert.convert(CUSTOM, tmp_path / "c.onnx", whole=True)
    assert (e.value.layer, e.value.layer_class, e.value.exit_code) == ("scale", "Scale", 4)
    assert isinstance(e.value, rnnconvert.UnsupportedError) and not list(tmp_path.iterdir())
    rep = rnnconvert.convert(CUSTOM, tmp_path / "c.onnx")
    assert "layer 'scale' (Scale)" in rep.notes[0] and rep.verification.ok
    assert [m.split(":")[0] for m in rep.modules] == ["lstm"]


def test_keras3_target_writes_the_recurrent_layers_of_a_lambda_model(tmp_path):
    """The ``.keras`` writer's own whole-model refusal (Keras 3 translation) takes the same way: the recurrent
    layers, verified by Keras 3 loading the written file."""
    pytest.importorskip("keras")
    rep = rnnconvert.convert(LAMBDA, tmp_path / "k.keras")
    assert "partial model" in rep.notes[0] and "layer 'double' (Lambda)" in rep.notes[0]
    assert rep.verification.ok and [c.name for c in rep.verification.layers] == ["lstm"]
