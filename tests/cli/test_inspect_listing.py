"""``rnnconvert inspect`` of a file whose tensors no reader recognises (issue #42): the text listing and
``inspect --json`` give the same listing (names, shapes, dtypes as numpy / safetensors wrote them, at most 40, the
count of the rest, the ``--map`` read from the shapes and the command that tries it), names escaped (control
characters visible in the text, JSON's own escapes in the JSON), the error last (exit 3, one line). The files are
made here by numpy and safetensors under names of no table; their shapes and dtypes come from those libraries'
own readers (``np.load``, ``safetensors.safe_open``), the oracle."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

from rnnconvert.cli import main

ODD = "enc\x1b[31m\nname"  # an escape sequence and a newline in a tensor name: data, never layout


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"enc/A": rng.normal(size=(20, 3)).astype(np.float32), "enc/B": rng.normal(size=(20, 5)).astype(np.float32),
            "enc/C": rng.normal(size=(20,)).astype(np.float32), ODD: np.zeros((2, 2), np.float16),
            "vocab": np.arange(7, dtype=np.int64)}


def _write(kind: str, path, arrays) -> None:
    if kind == "npz":
        np.savez(path, **arrays)
    else:
        st = pytest.importorskip("safetensors.numpy")
        st.save_file(arrays, str(path))


def _truth(kind: str, path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) as the writing library reads its own file back."""
    if kind == "npz":
        with np.load(path) as z:
            return {k: (tuple(z[k].shape), str(z[k].dtype)) for k in z.files}
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        return {k: (tuple(f.get_tensor(k).shape), str(f.get_tensor(k).dtype)) for k in f.keys()}


def _json(args, capsys):
    assert main(args) == 3
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", ["npz", "safetensors"])
def test_text_and_json_give_the_same_listing(kind, tmp_path, capsys):
    src = tmp_path / f"w.{kind}"
    _write(kind, src, _arrays())
    truth = _truth(kind, src)
    doc = _json(["inspect", "--json", str(src)], capsys)
    assert doc["error"]["exit_code"] == 3 and doc["error"]["type"] == "UnrecognisedError"
    lst = doc["unrecognised"]
    assert lst["path"] == str(src) and lst["total"] == len(truth) and lst["more"] == 0
    assert {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in lst["tensors"]} == truth
    assert lst["suggested_map"][:3] == ["enc/A=enc.w_ih", "enc/B=enc.w_hh", "enc/C=enc.bias"]
    assert all(ODD not in m for m in lst["suggested_map"])  # a name --map could not hold is never suggested
    assert shlex.split(lst["command"])[:3] == ["rnnconvert", "inspect", str(src)]

    assert main(["inspect", str(src)]) == 3
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("rnnconvert: error: ") and "Traceback" not in err
    assert "\x1b" not in out and "enc\\x1b[31m\\nname" in out  # escaped, on one row
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") == 4}
    assert len(rows) == len(truth)
    for t in lst["tensors"]:
        row = rows[t["name"].replace("\x1b", "\\x1b").replace("\n", "\\n")]
        assert str(tuple(t["shape"])) in row and t["dtype"] in row
    assert lst["command"] in out


def test_json_listing_is_bounded_like_the_text(tmp_path, capsys):
    src = tmp_path / "many.npz"
    np.savez(src, **{f"t{i:03d}": np.zeros((i % 3 + 1,), np.float32) for i in range(130)})
    lst = _json(["inspect", "--json", str(src)], capsys)["unrecognised"]
    assert lst["total"] == 130 and len(lst["tensors"]) == 40 and lst["more"] == 90
    assert [t["name"] for t in lst["tensors"]] == [f"t{i:03d}" for i in range(40)]
    assert main(["inspect", str(src)]) == 3
    out = capsys.readouterr().out
    assert "130 tensor(s)" in out and "... and 90 more" in out


def test_json_of_a_recognised_file_is_unchanged(tmp_path, capsys):
    """A file that is recognised: ``inspect --json`` prints its layers as before, no listing, exit 0."""
    rng = np.random.default_rng(1)
    src = tmp_path / "rnn.npz"
    np.savez(src, **{"rnn.weight_ih_l0": rng.normal(size=(12, 3)).astype(np.float32),
                     "rnn.weight_hh_l0": rng.normal(size=(12, 3)).astype(np.float32)})
    assert main(["inspect", "--json", str(src)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "unrecognised" not in doc and doc["layers"]


def test_other_errors_carry_no_listing(tmp_path, capsys):
    src = tmp_path / "bad.npz"
    src.write_bytes(b"PK\x03\x04 not a zip")
    assert main(["inspect", "--json", str(src)]) != 0
    doc = json.loads(capsys.readouterr().out)
    assert "error" in doc and "unrecognised" not in doc


def test_tflite_without_recurrent_ops_lists_its_constants(tmp_path, capsys):
    """A .tflite with no LSTM op and no WHILE loop (TF's converter, a matmul + bias + relu): its constant tensors
    are listed (no --map: the TFLite reader takes none); each as tf.lite.Interpreter describes it (name, shape,
    dtype), the oracle."""
    pytest.importorskip("tflite")
    tf = pytest.importorskip("tensorflow")
    w = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    b = tf.constant(np.ones(4, np.float32))
    cf = tf.function(lambda x: tf.nn.relu(tf.matmul(x, w) + b)).get_concrete_function(tf.TensorSpec([2, 3]))
    src = tmp_path / "dense.tflite"
    src.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([cf]).convert())
    it = tf.lite.Interpreter(model_path=str(src))
    details = {d["name"]: (tuple(int(v) for v in d["shape"]), np.dtype(d["dtype"]).name)
               for d in it.get_tensor_details()}
    lst = _json(["inspect", "--json", str(src)], capsys)["unrecognised"]
    assert lst["total"] == len(lst["tensors"]) == 2 and lst["suggested_map"] == [] and lst["command"] is None
    for t in lst["tensors"]:
        assert details[t["name"]] == (tuple(t["shape"]), t["dtype"])
    assert sorted(tuple(t["shape"]) for t in lst["tensors"]) == [(4,), (4, 3)]  # the bias, the transposed kernel
    assert main(["inspect", str(src)]) == 3
    out, err = capsys.readouterr()
    assert "2 tensor(s), none recognised" in out and "nothing recurrent to read" in err
