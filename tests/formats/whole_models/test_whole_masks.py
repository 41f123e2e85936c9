"""Any padding exact in the whole-model ONNX graph (issue #41): Keras masks reaching recurrent layers, with padding
at the end, at the front, inside and everywhere (an all-padded row).

Oracle: tf_keras 2.21's own outputs (``fixtures/gen_whole_masks.py`` made every fixture and its ``out__<i>`` on
``in__<name>``; rows in ``gen_whole_masks.ROWS``); the target is onnxruntime on the written graph. Tolerance as
``tests/formats/whole_models/test_whole_graph.py``: ``2e-5 * max(1, max|ref|)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

from conftest import WHOLE_TOL as TOL, ort_run, whole_err as _err, whole_feeds, whole_graph as _graph  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "whole_masks"
CASES = sorted(FIX.glob("masks_*.h5"))
#: the rows of gen_whole_masks.ROWS whose padding (if any) is at the end: no padding, end padding
END_ROWS = [0, 1]


def _run(model, g, z, rows=None):
    feeds = whole_feeds(g, z)
    if rows is not None:
        feeds = {k: v[rows] for k, v in feeds.items()}
    return ort_run(model, feeds, [f"output_{i}" for i in range(len(g.outputs))])


def test_fixtures_present():
    assert len(CASES) == 4


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_any_padding_matches_tf_keras(path):
    """The default graph on rows padded at the end, the front, inside and everywhere: tf_keras' outputs."""
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    for i, y in enumerate(_run(model_write.build(g), g, z)):
        assert _err(y, z[f"out__{i}"]) <= TOL, (path.stem, i)


@pytest.mark.parametrize("path", [p for p in CASES if "backwards" not in p.stem], ids=lambda p: p.stem)
def test_end_layout_matches_tf_keras_on_end_padding(path):
    """``mask_layout='end'`` (sequence_lens alone) gives tf_keras' outputs where the padding is at the end, in a
    graph of fewer nodes than the general form."""
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    small = model_write.build(g, mask_layout="end")
    for i, y in enumerate(_run(small, g, z, END_ROWS)):
        assert _err(y, z[f"out__{i}"][END_ROWS]) <= TOL, (path.stem, i)
    assert len(small.graph.node) < len(model_write.build(g).graph.node)


def test_end_layout_differs_on_front_and_inner_padding():
    """What ``mask_layout='end'`` is not for: rows padded at the front or inside, through sequence_lens alone, miss
    tf_keras' outputs (the reason the general form is the default; the fixtures' rows tell the two apart)."""
    path = FIX / "masks_bidir.h5"
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    ys = _run(model_write.build(g, mask_layout="end"), g, z, [2, 3, 4])
    assert max(_err(y, z[f"out__{i}"][[2, 3, 4]]) for i, y in enumerate(ys)) > 1000 * TOL


def test_masked_go_backwards_sequence_is_built():
    """A masked go_backwards layer returning sequences, refused with sequence_lens alone, is built by default."""
    g = _graph(FIX / "masks_masking_backwards.h5")
    ops = [n.op_type for n in model_write.build(g).graph.node]
    assert ops.count("LSTM") == 1 and ops.count("GRU") == 1 and ops.count("RNN") == 2 and "Loop" not in ops
    with pytest.raises(rnnconvert.errors.UnsupportedError, match="go_backwards"):
        model_write.build(g, mask_layout="end")


def test_convert_verifies_any_padding_and_end_layout(tmp_path):
    """``rnnconvert.convert`` of a masked model: by default the graph is verified on generated rows padded at the
    end, the front and inside (``keras_whole.padded_steps``) and matches tf_keras' stored outputs; with the write
    option ``mask_layout='end'`` the smaller graph is verified on end padding, its metadata and note say so."""
    import json

    import onnx

    src = FIX / "masks_bidir.h5"
    g = _graph(src)
    z = np.load(src.with_suffix(".npz"))
    rep = rnnconvert.convert(src, tmp_path / "any.onnx")
    assert rep.verification.ok and any("any padding" in n for n in rep.notes)
    m = onnx.load(str(tmp_path / "any.onnx"))
    for i, y in enumerate(_run(m, g, z)):
        assert _err(y, z[f"out__{i}"]) <= TOL
    rep = rnnconvert.convert(src, tmp_path / "end.onnx", write_opts={"mask_layout": "end"})
    assert rep.verification.ok and any("mask_layout='end'" in n for n in rep.notes)
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "end.onnx")).metadata_props}
    assert json.loads(meta[model_write.META_KEY])["mask_layout"] == "end"


def test_generated_verification_inputs_pad_front_and_inside():
    """The whole-model check's generated masks: row 1 padded at its end, row 2 at its front and inside (issue #41);
    end padding only for a graph written with ``mask_layout='end'``."""
    assert keras_whole.padded_steps(3, 9) == [(1, [6, 7, 8]), (2, [0, 1, 5])]
    assert keras_whole.padded_steps(3, 9, "end") == [(1, [6, 7, 8])]


def test_cli_refuses_an_unknown_mask_layout(tmp_path):
    """``--mask-layout`` takes ``any`` or ``end``: another value is one line and exit 2 (OptionError), nothing
    written."""
    import subprocess
    import sys

    dst = tmp_path / "x.onnx"
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "convert", str(FIX / "masks_gru_stack.h5"), str(dst),
                        "--mask-layout", "front", "--no-verify"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "mask_layout" in r.stderr and "Traceback" not in r.stderr and not dst.exists()
