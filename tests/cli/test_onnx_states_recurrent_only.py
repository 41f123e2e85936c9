"""``--states`` of an ``.onnx`` of the recurrent layers alone (issue #39): the graph of the recurrent layers takes
no initial states and gives no final states, so the option is refused with one line (exit 4, UnsupportedError,
nothing written), never silently ignored: ``--recurrent-only``, a partial conversion (``keras_whole/refuse_lambda.h5``
falls back to the recurrent layers alone) and a weights-only source alike. Without ``--states`` the same conversions
still succeed (the conversion's own verification: onnxruntime against the reference equations).

Fixtures made by tf_keras through committed scripts (``fixtures/gen_keras.py``, ``fixtures/gen_keras_whole.py``)."""

from __future__ import annotations

import pytest

from rnnconvert.cli import main
from rnnconvert.errors import UnsupportedError

from conftest import FIXTURES

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

CASES = [
    (FIXTURES / "keras" / "lstm.h5", ["--recurrent-only"]),
    (FIXTURES / "keras" / "lstm_weights.h5", []),
    (FIXTURES / "keras_whole" / "refuse_lambda.h5", []),
]


@pytest.mark.parametrize("src,extra", CASES, ids=["recurrent-only", "weights-only", "partial"])
def test_states_refused_with_one_line_and_nothing_written(tmp_path, capsys, src, extra):
    if src.name == "refuse_lambda.h5":
        pytest.importorskip("tf_keras")
    dst = tmp_path / "m.onnx"
    assert main([str(src), str(dst), "-q", "--states", *extra]) == UnsupportedError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--states" in err[0] and "Traceback" not in err[0], err
    assert not dst.exists() and list(tmp_path.iterdir()) == []


def test_without_states_the_same_conversion_succeeds(tmp_path):
    dst = tmp_path / "m.onnx"
    assert main([str(CASES[0][0]), str(dst), "-q", "--recurrent-only"]) == 0
    assert dst.exists()
