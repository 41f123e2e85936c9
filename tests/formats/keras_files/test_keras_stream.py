"""Streaming Keras 2 HDF5 (issue 7): the lazy reader (one layer's datasets read at a time, row block by row
block) and the h5py stream writer, whose file must hold what tf_keras' own ``model.save(..., 'h5')`` writes."""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rnnconvert.runtimes import tf_keras as tf_keras_rt
import rnnconvert
from rnnconvert import api
from rnnconvert.core import gates
from rnnconvert.errors import FormatError
from rnnconvert.conventions import keras_interpreter as interpreter
from rnnconvert.formats.keras import h5_read as keras_h5, h5_write as keras_h5_write
from rnnconvert.core.model import Cell, is_placeholder
from rnnconvert.engine.stream import writer_view

from conftest import FIXTURES, FnSlabs, torch_rnn

h5py = pytest.importorskip("h5py")
ROOT = Path(__file__).resolve().parents[3]
H5_FIXTURES = sorted(p.name for p in (FIXTURES / "keras").glob("*.h5"))


def rows_mode(monkeypatch, mode: str) -> list:
    """How ``interpreter._rows`` gets its row blocks: ``rows`` (read into a buffer of exactly the stored rows),
    ``padded_rows`` (long rows padded), ``direct`` (every plain 2-D dataset read from the file by
    speed/filerows.py instead of h5py, into padded rows). Returns the list of direct readers made (the
    test asserts the mode was really taken)."""
    from rnnconvert.speed import filerows

    monkeypatch.setattr(interpreter, "PAD_MIN_ROW_BYTES", 1 << 30 if mode == "rows" else 0)
    monkeypatch.setattr(filerows, "DIRECT_MIN_BYTES", 0 if mode == "direct" else 1 << 60)
    made: list = []
    if mode == "direct":
        real = filerows.FileRows.__init__

        def spy(self, *a, **k):
            real(self, *a, **k)
            made.append(a)
        monkeypatch.setattr(filerows.FileRows, "__init__", spy)
    return made


MODES = ["rows", "padded_rows", "direct"]


# ------------------------------------------------------------------------------------------ reader
def _independent(layer, d: int):
    """Canonical w_ih, w_hh of direction ``d`` from the file's whole tensors by the whole-array
    permutations of :mod:`rnnconvert.core.gates` (not the row-block path under test)."""
    raw = layer.source["raw"][d]
    cell, H = layer.cell, layer.hidden_size
    fam = layer.source["family"]
    ra = cell is Cell.GRU and layer.semantics.reset_after and fam == "keras"
    conv = gates.convention("keras_ra" if ra else fam, cell)
    out = []
    for key in ("kernel", "recurrent_kernel"):
        m = np.asarray(raw[key])
        if fam == "keras_cudnn":
            out.append(gates.reorder(interpreter._cudnn_bytes_to_rows(m, cell.gates, H, m.shape[0]), conv.gate_order,
                                     gates.CANONICAL[cell]))
        else:
            out.append(gates.to_canonical(m, conv, cell))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", H5_FIXTURES)
def test_lazy_skeleton_and_loader(name, mode, monkeypatch):
    """``lazy=True``: placeholders only until ``loader(i, 0)``; what it loads (in many row blocks, read into a
    buffer whose rows are exactly the stored rows, or padded as long rows are, or read from the file by
    speed/filerows.py) equals the whole-tensor permutation of the file's datasets bit for bit, and the eager read."""
    monkeypatch.setattr(interpreter, "BLOCK_BYTES", 256)  # 16-row blocks: every kernel takes several
    made = rows_mode(monkeypatch, mode)
    path = FIXTURES / "keras" / name
    try:
        eager = rnnconvert.load(path)
    except rnnconvert.RNNConvertError as exc:  # e.g. a weights-only file that needs --gate-activation
        with pytest.raises(type(exc)):
            rnnconvert.load(path, lazy=True)
        return
    lazy = rnnconvert.load(path, lazy=True)
    assert lazy.lazy and [l.name for l in lazy.layers] == [l.name for l in eager.layers]
    assert lazy.tensors.keys() == eager.tensors.keys()
    assert all(np.array_equal(lazy.tensors[k], eager.tensors[k]) for k in eager.tensors)
    for i, layer in enumerate(lazy.layers):
        assert all(is_placeholder(a) for dp in layer.params[0] for a in dp.arrays().values())
        dirs = lazy.slab(i, 0)
        for d, (got, want) in enumerate(zip(dirs, eager.layers[i].params[0])):
            for key, arr in want.arrays().items():
                assert np.array_equal(getattr(got, key), arr) and getattr(got, key).dtype == arr.dtype
            if layer.source["family"] != "keras1":
                w_ih, w_hh = _independent(layer, d)
                assert np.array_equal(got.w_ih, w_ih) and np.array_equal(got.w_hh, w_hh)
    keras1 = all(layer.source["family"] == "keras1" for layer in lazy.layers)  # per-gate datasets, joined
    assert bool(made) == (mode == "direct" and not keras1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["bidi_lstm_concat.h5", "gru_reset_before.h5", "cudnn_gru.h5"])
def test_lazy_loader_float16(name, mode, tmp_path, monkeypatch):
    """float16 kernels take their own turn (one pass, tiles straight into the canonical rows): a copy of a
    tf_keras file with every dataset stored as float16 loads lazily, in many row blocks, bit-equal to the
    whole-tensor permutation of its datasets."""
    monkeypatch.setattr(interpreter, "BLOCK_BYTES", 256)
    made = rows_mode(monkeypatch, mode)
    path = tmp_path / name
    with h5py.File(FIXTURES / "keras" / name, "r") as src, h5py.File(path, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v

        def copy(nm, obj):
            if isinstance(obj, h5py.Dataset):
                data = obj[()]
                dst.create_dataset(nm, data=data.astype(np.float16) if data.dtype.kind == "f" else data)
            else:
                dst.require_group(nm)
            for k, v in obj.attrs.items():
                dst[nm].attrs[k] = v
        src.visititems(copy)
    lazy = rnnconvert.load(path, lazy=True)
    for i, layer in enumerate(lazy.layers):
        for d, got in enumerate(lazy.slab(i, 0)):
            w_ih, w_hh = _independent(layer, d)
            assert got.w_ih.dtype == np.float16 and w_ih.dtype == np.float16
            assert np.array_equal(got.w_ih, w_ih) and np.array_equal(got.w_hh, w_hh)
    assert bool(made) == (mode == "direct")


def test_lazy_read_probes_in_the_child_first(monkeypatch):
    """The lazy loader reads in this process: the file's metadata was walked in the isolated child first,
    so a libhdf5 loop (a file found by bench/fuzz) is cut off there."""
    monkeypatch.setenv("RNNCONVERT_READ_TIMEOUT", "2")
    src = ROOT / "tests" / "data" / "fuzz_found" / "h5_libhdf5_loop.h5"
    with pytest.raises(FormatError, match="did not finish"):
        keras_h5.read(src, lazy=True)


@pytest.mark.parametrize("mode", MODES)
def test_lazy_loader_refuses_non_finite(mode, monkeypatch):
    made = rows_mode(monkeypatch, mode)
    ck = rnnconvert.load(ROOT / "tests" / "data" / "bad" / "h5_nan.h5", lazy=True)
    with pytest.raises(FormatError, match="kernel.*NaN or Inf"):
        ck.slab(0, 0)
    assert bool(made) == (mode == "direct")


# ------------------------------------------------------------------------------------------ writer
def _dump(path: Path) -> dict:
    """Everything of an HDF5 file that a reader sees: each object's kind and attributes (HDF5 type class,
    variable-length or not, shape, values; ``model_config`` parsed) and each dataset's shape, dtype, bytes."""
    out = {}

    def attrs(obj):
        d = {}
        for k in obj.attrs:
            aid = obj.attrs.get_id(k)
            v = obj.attrs[k]
            v = json.loads(v) if k == "model_config" else (v.tolist() if isinstance(v, np.ndarray) else v)
            vlen = aid.get_type().is_variable_str() if hasattr(aid.get_type(), "is_variable_str") else None
            d[k] = (type(aid.get_type()).__name__, vlen, aid.shape, str(aid.dtype), v)
        return d

    with h5py.File(path, "r") as f:
        out["/"] = ("File", attrs(f))

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = ("Dataset", attrs(obj), obj.shape, str(obj.dtype), obj[()].tobytes())
            else:
                out[name] = ("Group", attrs(obj))

        f.visititems(visit)
    return out


def _pt(tmp_path, kind, name, **kw):
    import torch

    half = kw.pop("half", False)
    mod = torch_rnn(kind, 5, 6, seed=len(name), **kw)
    if half:
        mod = mod.half()
    path = tmp_path / f"{name}.pt"
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, path)
    return path, {"nonlinearity": kw.get("nonlinearity", "tanh")} if kind == "RNN" else {}


CASES = {  # id: (source, cudnn forms to write)
    "pt-lstm-2x-bidi": (("LSTM", dict(num_layers=2, bidirectional=True)), (False, True)),
    "pt-lstm-nobias": (("LSTM", dict(bias=False)), (False, True)),
    "pt-gru-bidi": (("GRU", dict(bidirectional=True)), (False, True)),
    "pt-gru-2x": (("GRU", dict(num_layers=2)), (False,)),
    "pt-rnn-relu-bidi": (("RNN", dict(nonlinearity="relu", bidirectional=True)), (False,)),
    "pt-lstm-f16": (("LSTM", dict(bidirectional=True, half=True)), (False, True)),
    "gru_reset_before.h5": (None, (False,)),
    "bidi_gru_sum.h5": (None, (False, True)),
    "lstm_go_backwards.h5": (None, (False,)),
    "cudnn_bidi_lstm.h5": (None, (False, True)),
    "keras1_lstm_gru_weights.h5": (None, (False,)),
    "lstm_hard_sigmoid.h5": (None, (False,)),
}
PARAMS = [(c, cud) for c, (_, forms) in CASES.items() for cud in forms]


def _source(case, tmp_path):
    spec = CASES[case][0]
    if spec is None:
        return FIXTURES / "keras" / case, {}
    return _pt(tmp_path, spec[0], case, **dict(spec[1]))


@pytest.mark.parametrize("case,cudnn", PARAMS, ids=[f"{c}-{'cudnn' if u else 'plain'}" for c, u in PARAMS])
def test_stream_file_is_what_model_save_writes(case, cudnn, tmp_path, k2):
    """The oracle: for the same model, the streamed file and tf_keras' ``model.save(.., save_format='h5')``
    have equal parsed ``model_config``, the same groups, attributes, dataset names, shapes, dtypes and
    bytes. The streamed source is lazy where the reader can be (Keras HDF5), so slabs arrive one by one."""
    src, opts = _source(case, tmp_path)
    ours = tmp_path / "ours.h5"
    # the writer's view: a TF1 run-time forget_bias folded, as the engine hands it over (FormatSpec.forget_bias)
    keras_h5_write.write(writer_view(rnnconvert.load(src, lazy=True, **opts), "fold"), ours, cudnn=cudnn)
    theirs = tmp_path / "theirs.h5"
    model = keras_h5_write.build(writer_view(rnnconvert.load(src, **opts), "fold"), cudnn=cudnn)
    model.save(theirs, save_format="h5", include_optimizer=False)
    a, b = _dump(ours), _dump(theirs)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], key


@pytest.mark.parametrize("case", ["pt-lstm-2x-bidi", "pt-gru-bidi", "bidi_gru_sum.h5", "keras1_lstm_gru_weights.h5"])
def test_stream_written_file_runs_in_tf_keras(case, tmp_path, k2):
    """``tf_keras.models.load_model`` opens the streamed file and computes what the source computes
    (the conversion's verification runs the file in tf_keras: ``keras_h5_write.target_forward``)."""
    src, opts = _source(case, tmp_path)
    rep = rnnconvert.convert(src, tmp_path / "out.h5", read_opts=opts)
    assert rep.verification.ok and rep.verification.layers


def test_one_slab_alive_and_nothing_left_on_failure(tmp_path, k2):
    """``write`` holds no slab after writing it (each loaded slab is freed before the next is loaded); a
    slab that fails to load leaves no file and no temporary behind (``abort`` closes the HDF5 file)."""
    src, _ = _pt(tmp_path, "LSTM", "stack", num_layers=3, bidirectional=True)
    eager = rnnconvert.load(src)
    ck = rnnconvert.load(src)
    alive: list[weakref.ref] = []

    def loader(i, k):
        assert all(r() is None for r in alive), "an earlier slab is still referenced"
        dirs = [type(p)(*(a.copy() for a in (p.w_ih, p.w_hh, p.b_ih, p.b_hh))) for p in eager.layers[i].params[k]]
        alive.append(weakref.ref(dirs[0].w_ih))
        return dirs

    ck = replace(ck, slabs=FnSlabs(loader))
    api.save(ck, tmp_path / "ok.h5")
    assert len(alive) == 3

    def failing(i, k):
        if k == 2:
            raise FormatError("slab 2 is damaged")
        return loader(i, k)

    alive.clear()
    ck = replace(ck, slabs=FnSlabs(failing))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FormatError, match="slab 2"):
        api.save(ck, out / "bad.h5")
    assert list(out.iterdir()) == []


def test_template_subprocess_equals_in_process(tmp_path, k2):
    """Large checkpoints get tf_keras' template from a fresh process (TensorFlow's 550 MB stay out of the
    converting process): the same as computed here."""
    src, _ = _pt(tmp_path, "GRU", "tpl", num_layers=2, bidirectional=True)
    stand_in = keras_h5_write._stand_in(rnnconvert.load(src, lazy=True))
    t0 = time.perf_counter()
    assert keras_h5_write._template_subprocess(stand_in, True) == keras_h5_write._template_here(stand_in, True)
    assert time.perf_counter() - t0 < 120


@pytest.mark.parametrize("cudnn", [False, True], ids=["plain", "cudnn"])
def test_target_side_sees_a_damaged_layer(cudnn, tmp_path, k2):
    """The per-layer target side (tf_keras deserialize + legacy weight conversion of one layer) runs the
    file's own values: a small change to the second stacked layer's backward kernel fails verification."""
    src, _ = _pt(tmp_path, "LSTM", "dmg", num_layers=2, bidirectional=True)
    dst = tmp_path / "out.h5"
    rnnconvert.convert(src, dst, write_opts={"cudnn": cudnn})
    assert rnnconvert.verify(src, dst).ok
    with h5py.File(dst, "r+") as f:
        g = f["model_weights/rnn_l1"]
        ds = g[[n for n in g.attrs["weight_names"] if "backward" in n][0]]  # its kernel (first of three)
        ds[...] = ds[()] * np.float32(1.01)
    rep = rnnconvert.verify(src, dst)
    assert not rep.ok and [c.ok for c in rep.layers] == [False]


def test_target_forward_slab_chains_to_target_forward(tmp_path, k2):
    """Slab by slab (each Keras layer alone, its input the previous slab's output) gives what the whole
    chain gives: the per-slab target side of a streamed verification."""
    src, _ = _pt(tmp_path, "GRU", "slabs", num_layers=3, bidirectional=True)
    dst = tmp_path / "out.h5"
    rnnconvert.convert(src, dst, verify=None)
    ck = rnnconvert.load(src)
    x = np.random.default_rng(1).standard_normal((2, 5, 5)).astype(np.float32)
    y = x
    for k in range(3):
        y = tf_keras_rt.forward_slab(dst, ck, "rnn", k, y, keras_h5_write.load)
    np.testing.assert_allclose(y, tf_keras_rt.forward(dst, ck, "rnn", x, keras_h5_write.load), atol=1e-6, rtol=0)
