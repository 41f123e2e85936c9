"""``rnnconvert inspect`` of a file whose tensors rnnconvert does not recognise (issue #42): its tensors (names,
shapes, dtypes, as numpy / torch / safetensors / h5py / onnx wrote them), at most 40, a ``--map`` read from the
shapes, and the error (exit 3). The suggested map, taken, converts a torch LSTM's weights stored under names of
no table into a .pt that torch runs to the module's own output (the oracle)."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from rnnconvert.cli import main
from rnnconvert.errors import UnrecognisedError

torch = pytest.importorskip("torch")


def _lstm():
    torch.manual_seed(3)
    return torch.nn.LSTM(3, 5, batch_first=True)


def _odd_names(m) -> dict[str, np.ndarray]:
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    return {"enc/A": sd["weight_ih_l0"], "enc/B": sd["weight_hh_l0"], "enc/C": sd["bias_ih_l0"],
            "enc/D": sd["bias_hh_l0"], "vocab": np.arange(7, dtype=np.int64)}


def _write(kind: str, path, arrays: dict[str, np.ndarray]) -> None:
    if kind == "npz":
        np.savez(path, **arrays)
    elif kind == "safetensors":
        from safetensors.numpy import save_file

        save_file(arrays, str(path))
    elif kind == "pt":
        torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path)
    elif kind == "h5":
        h5py = pytest.importorskip("h5py")
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f[k] = v
    else:  # an ONNX graph without a recurrent node: its initializers
        onnx = pytest.importorskip("onnx")
        from onnx import TensorProto, helper, numpy_helper

        g = helper.make_graph([helper.make_node("MatMul", ["X", "enc/B"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 20])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
        onnx.save(helper.make_model(g), str(path))


@pytest.mark.parametrize("kind", ["npz", "safetensors", "pt", "h5", "onnx"])
def test_inspect_lists_an_unrecognised_file(kind, tmp_path, capsys):
    arrays = _odd_names(_lstm())
    src = tmp_path / f"w.{kind}"
    _write(kind, src, arrays)
    assert main(["inspect", str(src)]) == 3
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{len(arrays)} tensor(s), none recognised" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") == 4}
    for name, a in arrays.items():
        row = rows[name]
        assert str(tuple(a.shape)) in row and str(a.dtype) in row, row
    if kind == "onnx":  # the ONNX reader takes no --map: nothing suggested
        assert "--map" not in out
    else:
        assert "--map enc/A=enc.w_ih --map enc/B=enc.w_hh --map enc/C=enc.b_ih --map enc/D=enc.b_hh" in out


def test_inspect_suggested_map_taken_converts_to_torchs_output(tmp_path, capsys):
    m = _lstm()
    src = tmp_path / "w.npz"
    _write("npz", src, _odd_names(m))
    assert main(["inspect", str(src)]) == 3
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("rnnconvert inspect"))
    args = shlex.split(line)[3:]
    assert "--map" in args and "enc.gate_order=ifgo" in args  # torch's order, which this file holds
    assert main([str(src), str(tmp_path / "o.pt"), *args]) == 0
    sd = torch.load(tmp_path / "o.pt", weights_only=True)
    got = torch.nn.LSTM(3, 5, batch_first=True)
    got.load_state_dict({k.split(".", 1)[1]: v for k, v in sd.items() if k.startswith("enc.")})
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 1, (2, 6, 3)).astype(np.float32))
    with torch.no_grad():
        assert torch.equal(got(x)[0], m(x)[0])


def test_inspect_listing_is_bounded(tmp_path, capsys):
    src = tmp_path / "many.npz"
    np.savez(src, **{f"t{i:03d}": np.zeros((i % 3 + 1,), np.float32) for i in range(260)})
    assert main(["inspect", str(src)]) == 3
    out = capsys.readouterr().out
    assert "260 tensor(s)" in out and "... and 220 more" in out
    assert sum(line.count("│") == 4 for line in out.splitlines()) == 40  # 40 rows (the header is drawn with ┃)
    from rnnconvert import api

    with pytest.raises(UnrecognisedError) as info:
        api.load(src)
    assert info.value.total == 260 and len(info.value.tensors) == 200  # what the error carries is capped too


def test_inspect_lists_a_tf1_checkpoint_of_unknown_scopes(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        vs = [v1.Variable(np.ones((8, 2), np.float32), name="net/proj"), v1.Variable(np.ones(4, np.float32),
                                                                                      name="net/scale")]
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            v1.train.Saver(vs).save(s, str(tmp_path / "ck"), write_meta_graph=False)
    assert main(["inspect", str(tmp_path / "ck")]) == 3
    out = capsys.readouterr().out
    assert "net/proj" in out and "(8, 2)" in out and "net/scale" in out and "(4,)" in out
