"""``verify SRC DST`` of a whole Keras model runs the conversion's whole-model check on every whole target (issue #39):
``.pt2``, ``.keras`` and a whole-model ``.tflite`` (which ``verify`` read layer by layer before, and refused: exit 4)
give the verdicts the conversion gave, check by check; ``--inputs`` takes integer token ids for an Embedding model's
input. The oracle of each verdict is the source framework (tf_keras) run inside the check; this file tests that
``verify`` and the conversion run that same check.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf_keras")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras_whole"


def _verdicts(rep) -> dict:
    return {c.name: c.verdict for c in rep.layers}


@pytest.mark.parametrize("suffix,needs", [(".pt2", "torch"), (".keras", "keras"), (".tflite", "tensorflow")])
def test_verify_gives_the_conversion_verdicts(tmp_path, suffix, needs):
    pytest.importorskip(needs)
    src = FIX / "whole_masked_stack.h5"
    dst = tmp_path / f"model{suffix}"
    conv = _verdicts(rnnconvert.convert(src, dst).verification)
    assert any(n.startswith("model output") for n in conv) and set(conv.values()) == {"ok"}, conv
    assert _verdicts(rnnconvert.verify(src, dst)) == conv


def test_verify_takes_token_ids(tmp_path):
    """``whole_multi_io`` (an Embedding on ``tokens``): the fixture's own token ids (tf_keras made them, within the
    vocabulary) as ``--inputs`` of ``verify``, with its float ``feats``; every whole-model check runs on them."""
    pytest.importorskip("onnxruntime")
    src = FIX / "whole_multi_io.h5"
    dst = tmp_path / "m.onnx"
    rnnconvert.convert(src, dst)
    z = np.load(src.with_suffix(".npz"))
    assert z["in__tokens"].dtype.kind == "i"
    rep = rnnconvert.verify(src, dst, inputs={"tokens": z["in__tokens"], "feats": z["in__feats"]})
    whole = {n: v for n, v in _verdicts(rep).items() if n.startswith("model")}
    assert whole and set(whole.values()) == {"ok"}, whole


def test_model_inputs_for_a_recurrent_only_file_are_refused(tmp_path):
    """A DST of the recurrent layers alone has no whole-model check: model inputs given for it are a usage error
    (exit 3, one line), not silently ignored."""
    pytest.importorskip("onnxruntime")
    from rnnconvert.cli import main

    src = FIX / "whole_masked_stack.h5"
    dst = tmp_path / "ro.onnx"
    rnnconvert.convert(src, dst, verify=None, write_opts={"recurrent_only": True})
    feats = tmp_path / "feats.npz"
    np.savez(feats, feats=np.load(src.with_suffix(".npz"))["in__feats"])
    assert main(["verify", str(src), str(dst), "--inputs", str(feats)]) == 3
