"""The cuDNN weight-space layout against third-party oracles, on CPU, every run.

Oracles (``fixtures/make_cudnn_oracles.py``; provenance in ``fixtures/manifest.json`` family ``cudnn``):

* JAX ``jax.experimental.rnn`` (LSTM): buffer in the order of ``_get_params_shapes_in_lstm``, canonical
  arrays by ``unpack_lstm_weights``, outputs by ``lstm_ref`` -- the host reference JAX's own GPU tests
  hold its cuDNN ``rnn.lstm`` (which hands the buffer unchanged to ``cudnnRNNForward``) to.
* MXNet 1.9.1's fused ``RNN`` operator on CPU (LSTM, GRU, RNN_TANH, RNN_RELU, LSTM with projection):
  buffer by ``FusedRNNCell.pack_weights`` (projection: gluon ``LSTM``'s own concatenation), canonical
  arrays by ``FusedRNNCell.unpack_weights``; the same buffer goes unchanged to cuDNN on MXNet's GPU path.

Checked here: ``cudnn.unpack`` (bit-exact against the oracle's own unpacking; outputs through our numpy
reference), ``cudnn.pack`` (bit-exact against the oracle's buffer), the TF1 ``opaque_kernel`` reader
(lone, with ``cudnn_compatible_*`` companions, Adam slots), ``.cudnn.npz`` both ways, version-1
``.cudnn.npz`` files written by the old rnnconvert, and ``.pt``/``.onnx`` results run by torch and
onnxruntime: all against the oracles' outputs (within 2e-5). Where JAX or MXNet can be run (importable
here, or ``RNNCONVERT_ORACLE_JAX`` / ``RNNCONVERT_ORACLE_MXNET`` naming a Python that has it), the
oracle script also runs live.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, manifest
from rnnconvert.runtimes import onnxruntime as ort_rt
from rnnconvert import api
from rnnconvert.core import cudnn, reference
from rnnconvert.core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from rnnconvert.errors import FormatError
from rnnconvert.formats.onnx import onnx_write as onnx_fmt
from rnnconvert.formats.storage import cudnn_npz

ENTRIES = manifest("cudnn")
ORACLES = [e for e in ENTRIES if e["kind"] == "oracle"]
LONE = [e for e in ENTRIES if e["kind"] == "tf1_opaque_lone"]
COMPANIONS = [e for e in ENTRIES if e["kind"] == "tf1_opaque_companions"]
TOL = 2e-5
FIELDS = ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr")


def _id(e):
    return e["file"].split("/")[-1].replace(".npz", "") if e["kind"] == "oracle" else e["file"].split("/")[-2]


def _spec(e) -> cudnn.Spec:
    s = e["spec"]
    return cudnn.Spec(Cell(s["cell"]), s["input_size"], s["hidden_size"], s["num_layers"], s["bidirectional"],
                      s["proj_size"])


def _oracle(e):
    return np.load(FIXTURES / e["oracle"], allow_pickle=False)


def _their_layer(z, spec: cudnn.Spec, prefix: str = "") -> RNNLayer:
    """The canonical layer as the ORACLE unpacked its buffer (its arrays, gate order = cuDNN's)."""
    params = [[DirectionParams(*(z[f"{prefix}{n}_{k * spec.dirs + d}"] for n in FIELDS[:4]),
                               w_hr=z[f"{prefix}w_hr_{k * spec.dirs + d}"] if spec.proj_size else None)
               for d in range(spec.dirs)] for k in range(spec.num_layers)]
    return RNNLayer("oracle", spec.cell, spec.input_size, spec.hidden_size, spec.num_layers, spec.bidirectional,
                    spec.proj_size, params=params,
                    semantics=Semantics(activation="relu" if spec.cell is Cell.RNN_RELU else "tanh"))


def _assert_same_params(ours: RNNLayer, theirs: RNNLayer) -> None:
    for k, (a_dirs, b_dirs) in enumerate(zip(ours.params, theirs.params)):
        for d, (a, b) in enumerate(zip(a_dirs, b_dirs)):
            for f in FIELDS:
                x, y = getattr(a, f), getattr(b, f)
                assert (x is None and y is None) or np.array_equal(x, y), f"layer {k} dir {d} {f}"


def _torch_run(mod, x):
    import torch

    with torch.no_grad():
        y, st = mod(torch.from_numpy(x).to(next(mod.parameters()).dtype))
    h, c = st if isinstance(st, tuple) else (st, None)
    return y.numpy(), h.numpy(), None if c is None else c.numpy()


def _pt_modules(path, spec: cudnn.Spec):
    """torch modules of a written .pt (``nn.RNN``'s activation is not stored in a .pt: told here)."""
    return api.torch_modules(path, nonlinearity="relu" if spec.cell is Cell.RNN_RELU else "tanh")


def _assert_torch_reproduces(mod, z) -> None:
    y, h, c = _torch_run(mod, z["x"])
    assert np.abs(y - z["y"]).max() <= TOL
    assert np.abs(h - z["h_n"]).max() <= TOL
    if "c_n" in z.files:
        assert np.abs(c - z["c_n"]).max() <= TOL


# ---- the oracle buffers: unpack, pack, slots -------------------------------------------------------

def test_fixtures_present():
    """Both oracles made fixtures: every cell kind, 1-3 layers, uni/bi, and projections (MXNet)."""
    fw = {(e["producer"].split()[0], e["spec"]["cell"]) for e in ORACLES}
    assert {("jax", "LSTM"), ("mxnet", "LSTM"), ("mxnet", "GRU"), ("mxnet", "RNN_TANH"), ("mxnet", "RNN_RELU")} <= fw
    assert any(e["spec"]["proj_size"] and e["spec"]["num_layers"] > 1 for e in ORACLES)
    assert {3, 2, 1} <= {e["spec"]["num_layers"] for e in ORACLES}
    assert len(LONE) == len(COMPANIONS) > 0


@pytest.mark.parametrize("e", ORACLES, ids=_id)
def test_unpack_equals_oracle_unpacking_and_outputs(e):
    """unpack(oracle buffer) == the oracle's own unpacking, bit for bit; our reference reproduces it."""
    z, spec = _oracle(e), _spec(e)
    ours = cudnn.unpack(z["buffer"], spec)
    _assert_same_params(ours, _their_layer(z, spec))
    assert np.abs(reference.forward(ours, z["x"]) - z["y"]).max() <= TOL


@pytest.mark.parametrize("e", ORACLES, ids=_id)
def test_pack_equals_oracle_buffer(e):
    """pack(the oracle's canonical arrays) == the oracle's buffer, bit for bit (slot buffers too)."""
    z, spec = _oracle(e), _spec(e)
    buf = cudnn.pack(_their_layer(z, spec))
    assert buf.dtype == z["buffer"].dtype and np.array_equal(buf, z["buffer"])
    for slot in ("Adam", "Adam_1"):
        assert np.array_equal(cudnn.pack(_their_layer(z, spec, f"{slot}__")), z[f"slot_{slot}"])


@pytest.mark.parametrize("e", [e for e in ORACLES if e["spec"]["num_layers"] > 1 or e["spec"]["bidirectional"]],
                         ids=_id)
def test_old_layout_is_caught(e):
    """Mutation: read with the old per-pseudo-layer layout (v1), the oracle's outputs are missed by far."""
    z, spec = _oracle(e), _spec(e)
    where = {(r.pseudo_layer, r.kind, r.linear_layer_id): r for r in cudnn.layout(spec)}
    as_if_v1 = np.empty_like(z["buffer"])  # the buffer read as if its regions sat where layout_v1 says
    for r in cudnn.layout_v1(spec):
        w = where[(r.pseudo_layer, r.kind, r.linear_layer_id)]
        as_if_v1[w.offset:w.offset + w.size] = z["buffer"][r.offset:r.offset + r.size]
    wrong = cudnn.unpack(as_if_v1, spec)
    assert np.abs(reference.forward(wrong, z["x"]) - z["y"]).max() > 100 * TOL


# ---- .cudnn.npz both ways; .pt and .onnx of the oracle buffers ----------------------------------

def _write_v2(path, z, spec: cudnn.Spec, name="rnn"):
    """A version-2 ``.cudnn.npz`` holding the oracle's buffer as a third party would write it (spec by hand)."""
    doc = {"format": "rnnconvert-cudnn-buffer", "version": 2,
           "layers": [{"name": name, "cell": spec.cell.value, "input_size": spec.input_size,
                       "hidden_size": spec.hidden_size, "num_layers": spec.num_layers,
                       "bidirectional": spec.bidirectional, "proj_size": spec.proj_size, "bias": True,
                       "dtype": "float32", "elements": int(z["buffer"].size)}]}
    np.savez(path, **{name: z["buffer"], "__cudnn_spec__": np.array(json.dumps(doc))})


@pytest.mark.parametrize("e", ORACLES, ids=_id)
def test_cudnn_npz_written_holds_oracle_buffer(e, tmp_path):
    z, spec = _oracle(e), _spec(e)
    cudnn_npz.write(Checkpoint(layers=[_their_layer(z, spec)]), tmp_path / "w.cudnn.npz")
    with np.load(tmp_path / "w.cudnn.npz", allow_pickle=False) as got:
        assert json.loads(str(got["__cudnn_spec__"]))["version"] == 2
        assert np.array_equal(got["oracle"], z["buffer"])


@pytest.mark.parametrize("e", ORACLES, ids=_id)
def test_cudnn_npz_of_oracle_to_pt_and_onnx(e, tmp_path):
    """An oracle buffer in a ``.cudnn.npz`` -> .pt (torch) and .onnx (onnxruntime) reproduce the oracle."""
    z, spec = _oracle(e), _spec(e)
    src = tmp_path / "o.cudnn.npz"
    _write_v2(src, z, spec)
    back = cudnn_npz.read(src).layers[0]
    _assert_same_params(back, _their_layer(z, spec))
    rep = api.convert(src, tmp_path / "o.pt")
    assert rep.verification.ok
    _assert_torch_reproduces(_pt_modules(tmp_path / "o.pt", spec)["rnn"], z)
    if not spec.proj_size:  # ONNX LSTM has no projection (refused)
        api.convert(src, tmp_path / "o.onnx")
        assert np.abs(ort_rt.forward(tmp_path / "o.onnx", None, "rnn", z["x"]) - z["y"]).max() <= TOL


V1 = sorted((FIXTURES / "cudnn" / "v1").glob("*.cudnn.npz"))


@pytest.mark.parametrize("path", V1, ids=lambda p: p.name)
def test_version1_files_of_the_old_writer_read_correctly(path):
    """``.cudnn.npz`` version 1 written by rnnconvert 58666a2 (fixtures/make_cudnn_v1.py) from an oracle's
    canonical weights: read with the old layout, they reproduce that oracle."""
    z = np.load(FIXTURES / "cudnn" / f"{path.name[:-len('.cudnn.npz')]}.npz", allow_pickle=False)
    ck = cudnn_npz.read(path)
    layer = ck.layers[0]
    assert ck.meta["spec_version"] == 1
    assert layer.source.get("layout") == ("v1" if layer.num_layers * layer.num_directions > 1 else None)
    assert np.abs(reference.forward(layer, z["x"]) - z["y"]).max() <= TOL


def test_cudnn_npz_without_version_refused_when_layouts_differ(tmp_path):
    e = next(e for e in ORACLES if e["spec"]["bidirectional"] and e["spec"]["num_layers"] == 2)
    z, spec = _oracle(e), _spec(e)
    _write_v2(tmp_path / "a.cudnn.npz", z, spec)
    with np.load(tmp_path / "a.cudnn.npz") as f:
        arrays = dict(f)
    doc = json.loads(str(arrays["__cudnn_spec__"]))
    del doc["version"]
    arrays["__cudnn_spec__"] = np.array(json.dumps(doc))
    np.savez(tmp_path / "b.cudnn.npz", **arrays)
    with pytest.raises(FormatError, match="no version.*pseudo-layers"):
        cudnn_npz.read(tmp_path / "b.cudnn.npz")
    doc["version"] = 3
    arrays["__cudnn_spec__"] = np.array(json.dumps(doc))
    np.savez(tmp_path / "c.cudnn.npz", **arrays)
    with pytest.raises(FormatError, match="version 3"):
        cudnn_npz.read(tmp_path / "c.cudnn.npz")


# ---- TF1 opaque_kernel checkpoints holding the oracle buffers ----------------------------------

def _check_slots(ckpt, e, z, spec):
    layer = ckpt.layers[0]
    for slot, tag in (("Adam", "adam_m"), ("Adam_1", "adam_v")):
        theirs = _their_layer(z, spec, f"{slot}__")
        for k, dirs in enumerate(theirs.params):
            for d, p in enumerate(dirs):
                sfx = f"_l{k}{'_reverse' if d else ''}"
                for f, tn in (("w_ih", "weight_ih"), ("w_hh", "weight_hh"), ("b_ih", "bias_ih"), ("b_hh", "bias_hh")):
                    assert np.array_equal(ckpt.tensors[f"{layer.name}.{tn}{sfx}.{tag}"], getattr(p, f)), (slot, k, d, f)


@pytest.mark.parametrize("e", LONE + COMPANIONS, ids=_id)
def test_tf1_opaque_kernel_reads_as_the_oracle(e):
    """Lone (spec from the read options) or with canonical companions (read, not refused), with Adam slots."""
    z, spec = _oracle(e), _spec(e)
    ckpt = api.load(FIXTURES / e["file"], **e.get("read_opts", {}))
    assert len(ckpt.layers) == 1
    layer = ckpt.layers[0]
    assert layer.cell is spec.cell and layer.source.get("opaque")
    _assert_same_params(layer, _their_layer(z, spec))
    assert np.abs(reference.forward(layer, z["x"]) - z["y"]).max() <= TOL
    _check_slots(ckpt, e, z, spec)


@pytest.mark.parametrize("e", LONE + COMPANIONS, ids=_id)
def test_tf1_opaque_kernel_to_pt_reproduces_oracle(e, tmp_path):
    """The issue's "done when": TF1 opaque_kernel -> .pt; torch reproduces JAX's / MXNet's outputs (2e-5)."""
    z = _oracle(e)
    rep = api.convert(FIXTURES / e["file"], tmp_path / "m.pt", read_opts=e.get("read_opts"))
    assert rep.verification.ok
    _assert_torch_reproduces(_pt_modules(tmp_path / "m.pt", _spec(e))[e["scope"]], z)


@pytest.mark.parametrize("e", [e for e in LONE if e["spec"]["bidirectional"] and e["spec"]["num_layers"] > 1],
                         ids=_id)
def test_tf1_opaque_kernel_to_onnx_reproduces_oracle(e, tmp_path):
    z = _oracle(e)
    api.convert(FIXTURES / e["file"], tmp_path / "m.onnx", read_opts=e["read_opts"])
    assert np.abs(ort_rt.forward(tmp_path / "m.onnx", None, e["scope"], z["x"]) - z["y"]).max() <= TOL


def test_cli_lone_opaque_to_pt(tmp_path):
    from rnnconvert.cli import main

    e = next(e for e in LONE if e["spec"]["cell"] == "GRU" and e["spec"]["num_layers"] == 3)
    o = e["read_opts"]
    args = ["convert", str(FIXTURES / e["file"]), str(tmp_path / "g.pt")]
    for k, v in o.items():
        args += ["--read-opt", f"{k}={str(v).lower()}"]
    assert main(args) == 0
    _assert_torch_reproduces(_pt_modules(tmp_path / "g.pt", _spec(e))[e["scope"]], _oracle(e))


def test_companions_that_disagree_are_refused(tmp_path):
    """Mutation: a companion checkpoint whose opaque_kernel has two pseudo-layers' bias regions swapped
    (everything else equal) is refused as disagreeing, naming where."""
    from rnnconvert.formats.tf import checkpoint_read as tf_checkpoint

    e = next(e for e in COMPANIONS if e["spec"]["cell"] == "LSTM" and e["spec"]["num_layers"] == 2
             and e["spec"]["bidirectional"])
    spec = _spec(e)
    ck = tf_checkpoint.read(FIXTURES / e["file"])
    companion = ck.layers[0]
    buf = _oracle(e)["buffer"].copy()
    regs = {(r.pseudo_layer, r.kind, r.linear_layer_id): r for r in cudnn.layout(spec)}
    a, b = regs[(0, "bias", 1)], regs[(1, "bias", 1)]
    buf[a.offset:a.offset + a.size], buf[b.offset:b.offset + b.size] = (buf[b.offset:b.offset + b.size].copy(),
                                                                        buf[a.offset:a.offset + a.size].copy())
    with pytest.raises(FormatError, match="disagrees.*layer 0, forward"):
        tf_checkpoint._check_opaque("x", companion, buf, spec.cell)


# ---- the oracles live, where their environment exists ------------------------------------------

def _oracle_python(module: str, env: str):
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    exe = os.environ.get(env)
    if exe and os.path.exists(exe):
        return exe
    pytest.skip(f"{module} is not importable here and {env} does not name a Python that has it "
                f"(see fixtures/make_cudnn_oracles.py); the committed oracle fixtures are checked instead")


@pytest.mark.parametrize("fw,env", [("jax", "RNNCONVERT_ORACLE_JAX"), ("mxnet", "RNNCONVERT_ORACLE_MXNET")])
def test_live_oracle(fw, env, tmp_path):
    """Run the oracle script now (fresh buffers from the framework) and check unpack and pack against it."""
    exe = _oracle_python(fw, env)
    script = FIXTURES / "make_cudnn_oracles.py"
    res = subprocess.run([exe, str(script), fw, "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    cases = [c for c in json.loads((tmp_path / f"oracles_{fw}.json").read_text()) if "file" in c]
    assert cases
    for c in cases:
        z = np.load(tmp_path / c["file"], allow_pickle=False)
        spec = cudnn.Spec(Cell(c["cell"]), c["input_size"], c["hidden_size"], c["num_layers"], c["bidirectional"],
                          c["proj_size"])
        ours = cudnn.unpack(z["buffer"], spec)
        _assert_same_params(ours, _their_layer(z, spec))
        assert np.array_equal(cudnn.pack(_their_layer(z, spec)), z["buffer"])
        assert np.abs(reference.forward(ours, z["x"]) - z["y"]).max() <= TOL, c["case"]


def test_basic_rnn_cell_companions_need_the_scope_to_tell_tanh_from_relu():
    """CudnnRNNTanh and CudnnRNNRelu save the same ``basic_rnn_cell`` names: the scope decides; an unnamed
    scope is refused, not read as tanh."""
    from rnnconvert.formats.tf import checkpoint_read as tf_checkpoint

    e = next(e for e in COMPANIONS if e["spec"]["cell"] == "RNN_RELU" and e["spec"]["bidirectional"])
    companion = tf_checkpoint.read(FIXTURES / e["file"]).layers[0]
    assert companion.cell is Cell.RNN_RELU and companion.semantics.activation == "relu"
    buf = _oracle(e)["buffer"]
    assert tf_checkpoint._check_opaque("x", companion, buf, Cell.RNN_TANH).semantics.activation == "tanh"
    with pytest.raises(FormatError, match="basic_rnn_cell.*cudnn_rnn_tanh or cudnn_rnn_relu"):
        tf_checkpoint._check_opaque("x", companion, buf, None)
    e = next(e for e in COMPANIONS if e["spec"]["cell"] == "LSTM" and e["spec"]["bidirectional"])
    with pytest.raises(FormatError, match="in a GRU scope but its canonical variables are LSTM"):
        tf_checkpoint._check_opaque("x", tf_checkpoint.read(FIXTURES / e["file"]).layers[0], _oracle(e)["buffer"],
                                    Cell.GRU)
