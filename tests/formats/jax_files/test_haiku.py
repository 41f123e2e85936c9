"""Haiku parameter trees and Equinox leaf files (issue 31; rnnconvert/formats/jax, conventions/haiku_params,
docs/jax.md "Haiku", "Equinox"): files saved by the users' own save calls from cells that Haiku / Equinox
initialised and ran (fixtures/gen_haiku.py, fixtures/gen_equinox.py).

Oracle: Haiku (``hk.dynamic_unroll``) and Equinox (the cell under ``jax.lax.scan``) ran each core on a fixed
input (``<dir>/<name>.oracle.npz``: ``<layer>__in``, ``<layer>__out``); here torch (``nn.LSTM``/``nn.RNN`` from the
converted ``.pt`` by ``load_state_dict``) or onnxruntime (the converted ``.onnx``) runs the conversion on the same
inputs. None of these tests needs JAX, Haiku or Equinox.

Tolerance: 2e-5 relative plus 1e-6 absolute (issue 31's criterion): H <= 5, T = 5, weights below 0.5, so the
sides differ by float32 rounding only (8.9e-8 at most through onnxruntime, measured); every trap below moves the outputs by more than 1e-3.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import FIXTURES
from rnnconvert import api
from rnnconvert.core import reference
from rnnconvert.core.model import Semantics
from rnnconvert.engine import registry
from rnnconvert.errors import FormatError, OptionError, UnsupportedError

HK, EQ = FIXTURES / "haiku", FIXTURES / "equinox"
RTOL, ATOL = 2e-5, 1e-6
FAR = 1e-3
torch = pytest.importorskip("torch")


def _orc(d, name="params"):
    return np.load(d / f"{name}.oracle.npz")


def _run_chain(run, orc, layers=("lstm", "gru", "vanilla_rnn", "vanilla_rnn_1")) -> dict:
    """``{oracle key: (ours, Haiku's)}``: each core run by ``run(layer, x)`` on Haiku's input; the DeepRNN
    (``deep``) as ``lstm_1`` then ``lstm_2`` on its output, as ``hk.DeepRNN`` chains them."""
    out = {k: (run(k, orc[f"{k}__in"]), orc[f"{k}__out"]) for k in layers}
    mid = run("lstm_1", orc["deep__in"]).astype(np.float32)
    out["deep"] = (run("lstm_2", mid), orc["deep__out"])
    return out


# --- detection


def test_plain_npy_is_not_equinox(tmp_path):
    """One np.save array (an input, not a model) is not claimed; the same leaves under another name are."""
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(FormatError, match="unrecognised"):
        registry.detect(tmp_path / "x.npy")
    (tmp_path / "leaves.bin").write_bytes((EQ / "cells.eqx").read_bytes())
    assert registry.detect(tmp_path / "leaves.bin").name == "equinox"


def test_detected_once_and_nothing_else_stolen():
    """The Haiku .npz is claimed by 'haiku' alone; its msgpack stays flax_msgpack's and its pickle the pickle
    format's (both readers hand the tree to Haiku's convention); the Equinox file by 'equinox'. Other families'
    .npz/.msgpack fixtures keep their formats."""
    want = {HK / "params.npz": "haiku", HK / "params.msgpack": "flax_msgpack", HK / "params.pkl": "pickle",
            EQ / "cells.eqx": "equinox", FIXTURES / "jax" / "linen.msgpack": "flax_msgpack"}
    for p, name in want.items():
        found = [f.name for f in registry.FORMATS if f.sniffer() and f.sniffer()(p.read_bytes()[:64], p)]
        assert found == [name], (p, found)
        assert registry.detect(p).name == name
    for p in sorted(FIXTURES.glob("*/*.npz")) + sorted(FIXTURES.glob("*/*.msgpack")):
        if p.parent.name != "haiku":
            assert registry.detect(p).name != "haiku", p


@pytest.mark.parametrize("ext", ["npz", "msgpack", "pkl"])
def test_haiku_layers_as_read(ext):
    ckpt = api.load(HK / f"params.{ext}")
    got = {la.name: (la.cell.value, la.input_size, la.hidden_size, la.source["class_name"]) for la in ckpt.layers}
    assert got == {"lstm": ("LSTM", 3, 4, "hk.LSTM"), "gru": ("GRU", 5, 3, "hk.GRU"),
                   "vanilla_rnn": ("RNN_RELU", 3, 4, "hk.VanillaRNN"), "vanilla_rnn_1": ("RNN_RELU", 4, 2, "hk.VanillaRNN"),
                   "lstm_1": ("LSTM", 2, 3, "hk.LSTM"), "lstm_2": ("LSTM", 3, 3, "hk.LSTM")}
    assert ckpt.layer("lstm").semantics.forget_bias == 1.0
    assert ckpt.layer("gru").semantics.reset_after is False
    assert not ckpt.tensors


# --- Haiku: oracle comparisons through .onnx and .pt


@pytest.mark.parametrize("ext", ["npz", "msgpack", "pkl"])
def test_haiku_to_onnx_matches_haiku(tmp_path, ext):
    """Every core (the GRU too: ONNX's linear_before_reset=0 is Haiku's reset-before) in onnxruntime."""
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    api.convert(HK / f"params.{ext}", tmp_path / "out.onnx")
    ckpt = api.load(tmp_path / "out.onnx")
    orc = _orc(HK)
    for layer, (y, want) in _run_chain(lambda k, x: ort_rt.forward(tmp_path / "out.onnx", ckpt, k, x), orc).items():
        np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL, err_msg=layer)


def _without_gru(tmp_path):
    """The fixture's own arrays without hk.GRU's (np.savez, as a user would save a GRU-less model)."""
    with np.load(HK / "params.npz") as z:
        np.savez(tmp_path / "nogru.npz", **{k: z[k] for k in z.files if not k.startswith("gru/")})
    return tmp_path / "nogru.npz"


def test_haiku_to_pt_matches_haiku_and_the_gru_is_refused(tmp_path):
    """torch's nn.LSTM (forget bias folded into b_ih[f]) and nn.RNN(relu) reproduce Haiku; hk.GRU's reset-before
    equation is refused for .pt in one line naming the feature and the formats that express it."""
    with pytest.raises(UnsupportedError, match=r"'gru' \(hk.GRU\).*reset_after=False.*onnx"):
        api.convert(HK / "params.npz", tmp_path / "all.pt")
    assert not (tmp_path / "all.pt").exists()
    rep = api.convert(_without_gru(tmp_path), tmp_path / "out.pt")
    assert any("relu" in m for m in rep.modules), rep.modules  # the state dict cannot say it: the report does
    mods = api.torch_modules(tmp_path / "out.pt", nonlinearity="relu")  # nn.RNN(nonlinearity='relu')
    orc = _orc(HK)

    def run(k, x):
        with torch.no_grad():
            return mods[k](torch.from_numpy(x))[0].numpy()

    assert sorted(mods) == ["lstm", "lstm_1", "lstm_2", "vanilla_rnn", "vanilla_rnn_1"]
    for layer, (y, want) in _run_chain(run, orc, ("lstm", "vanilla_rnn", "vanilla_rnn_1")).items():
        np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL, err_msg=layer)


# --- Haiku: the traps, each failed by a naive port


def _layer(name):
    return api.load(HK / "params.npz").layer(name)


def test_trap_lstm_gate_order_igfo():
    """A port that reads hk.LSTM's columns as PyTorch's i f g o (instead of Haiku's i g f o) is far off."""
    orc, la = _orc(HK), _layer("lstm")
    p, H = la.params[0][0], la.hidden_size
    np.testing.assert_allclose(reference.forward(la, orc["lstm__in"]), orc["lstm__out"], rtol=RTOL, atol=ATOL)
    # canonical i f g o rows back to the stored i g f o blocks, then read as if they were i f g o
    perm = np.r_[0:H, 2 * H:3 * H, H:2 * H, 3 * H:4 * H]
    naive = replace(la, params=[[replace(p, w_ih=p.w_ih[perm], w_hh=p.w_hh[perm], b_ih=p.b_ih[perm])]])
    assert np.max(np.abs(reference.forward(naive, orc["lstm__in"]) - orc["lstm__out"])) > FAR


def test_trap_lstm_run_time_forget_bias():
    """hk.LSTM adds 1 to the forget gate at run time; a port that takes the stored bias alone is far off, and
    the .pt written has it folded into b_ih[f] (the stored bias + 1)."""
    orc, la = _orc(HK), _layer("lstm")
    naive = replace(la, semantics=Semantics())
    assert np.max(np.abs(reference.forward(naive, orc["lstm__in"]) - orc["lstm__out"])) > FAR


def test_trap_gru_inverted_update_gate():
    """hk.GRU: h' = (1 - z) h + z a. A port with PyTorch's h' = (1 - z) n + z h on the stored z (not negated)
    is far off; so is one that applies the reset after W_ha (reset_after=True)."""
    orc, la = _orc(HK), _layer("gru")
    p, H = la.params[0][0], la.hidden_size
    np.testing.assert_allclose(reference.forward(la, orc["gru__in"]), orc["gru__out"], rtol=RTOL, atol=ATOL)
    z = slice(H, 2 * H)
    w_ih, w_hh, b_ih = p.w_ih.copy(), p.w_hh.copy(), p.b_ih.copy()
    for a in (w_ih, w_hh, b_ih):
        a[z] = -a[z]
    naive = replace(la, params=[[replace(p, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih)]])
    assert np.max(np.abs(reference.forward(naive, orc["gru__in"]) - orc["gru__out"])) > FAR
    after = replace(la, semantics=Semantics(reset_after=True))
    assert np.max(np.abs(reference.forward(after, orc["gru__in"]) - orc["gru__out"])) > FAR


def test_trap_vanilla_rnn_is_relu():
    orc, la = _orc(HK), _layer("vanilla_rnn")
    naive = replace(la, cell=type(la.cell).RNN_TANH, semantics=Semantics())
    assert np.max(np.abs(reference.forward(naive, orc["vanilla_rnn__in"]) - orc["vanilla_rnn__out"])) > FAR


# --- Haiku: renamed cores, bad files


def test_renamed_cores_need_cells(tmp_path):
    """hk.LSTM(name='encoder') holds a plain Linear: not read as an LSTM unless cells= says so (one line naming
    the option); with it, Haiku's outputs again."""
    with np.load(HK / "params.npz") as z:
        np.savez(tmp_path / "renamed.npz", **{"encoder/linear/w": z["lstm/linear/w"], "encoder/linear/b": z["lstm/linear/b"]})
    src = tmp_path / "renamed.npz"
    assert registry.detect(src).name != "haiku"
    with pytest.raises(FormatError, match="cells=MODULE:lstm"):
        api.load(src, "haiku")
    la = api.load(src, "haiku", cells="encoder:lstm").layer("encoder")
    orc = _orc(HK)
    np.testing.assert_allclose(reference.forward(la, orc["lstm__in"]), orc["lstm__out"], rtol=RTOL, atol=ATOL)
    with pytest.raises(OptionError, match="cells"):
        api.load(src, "haiku", cells="encoder:conv")
    with pytest.raises(OptionError, match="decoder"):
        api.load(src, "haiku", cells="decoder:lstm")


def test_bad_haiku_files(tmp_path):
    with np.load(HK / "params.npz") as z:
        arrays = {k: z[k] for k in z.files}
    cases = {"shape": {**arrays, "lstm/linear/w": arrays["lstm/linear/w"][:, :15]},
             "extra": {**arrays, "gru/w_x": arrays["gru/b"]},
             "int": {**arrays, "gru/b": arrays["gru/b"].astype(np.int32)}}
    for name, arrs in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrs)
        with pytest.raises(FormatError):
            api.load(tmp_path / f"{name}.npz", "haiku")
    data = (HK / "params.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError):
        api.load(tmp_path / "trunc.npz", "haiku")


# --- Equinox


@pytest.mark.parametrize("name,opts", [("cells", {}), ("head", {"cells": "lstm:3:4:nobias,skip:2"})])
def test_equinox_to_pt_and_onnx_matches_equinox(tmp_path, name, opts):
    """eqx.nn.LSTMCell (one bias) and GRUCell (bias_n inside the reset product: PyTorch's b_hn) in torch and
    onnxruntime reproduce Equinox."""
    orc = _orc(EQ, name)
    layers = sorted(k[: -len("__out")] for k in orc.files if k.endswith("__out"))
    api.convert(EQ / f"{name}.eqx", tmp_path / "out.pt", read_opts=opts)
    mods = api.torch_modules(tmp_path / "out.pt")
    assert sorted(mods) == layers
    for layer in layers:
        with torch.no_grad():
            y = mods[layer](torch.from_numpy(orc[f"{layer}__in"]))[0].numpy()
        np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    api.convert(EQ / f"{name}.eqx", tmp_path / "out.onnx", read_opts=opts)
    ckpt = api.load(tmp_path / "out.onnx")
    for layer in layers:
        y = ort_rt.forward(tmp_path / "out.onnx", ckpt, layer, orc[f"{layer}__in"])
        np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)


def test_equinox_sizes_never_guessed(tmp_path):
    """Leaves that are not cells only (an eqx.nn.Linear after the cell) are refused naming cells=; a cells=
    that does not match the shapes, or leaves leftover, likewise."""
    with pytest.raises(FormatError, match="cells=lstm:I:H"):
        api.load(EQ / "head.eqx")
    with pytest.raises(FormatError, match="not eqx.nn.LSTMCell"):
        api.load(EQ / "head.eqx", cells="lstm:3:4,skip:1")
    with pytest.raises(FormatError, match="skip:N"):
        api.load(EQ / "head.eqx", cells="lstm:3:4:nobias")
    with pytest.raises(OptionError, match="cells"):
        api.load(EQ / "head.eqx", cells="lstm:3")


def test_trap_equinox_gru_bias_n():
    """Equinox adds bias_n inside r * (W_hn h + bias_n): folding it into the input bias (as a one-bias port
    would) is far off Equinox's outputs."""
    orc = _orc(EQ, "cells")
    la = api.load(EQ / "cells.eqx").layer("cell1")
    p, H = la.params[0][0], la.hidden_size
    b_ih = p.b_ih.copy()
    b_ih[2 * H:] += p.b_hh[2 * H:]
    naive = replace(la, params=[[replace(p, b_ih=b_ih, b_hh=np.zeros_like(p.b_hh))]])
    assert np.max(np.abs(reference.forward(naive, orc["cell1__in"]) - orc["cell1__out"])) > FAR


def test_bad_equinox_files(tmp_path):
    data = (EQ / "cells.eqx").read_bytes()
    cases = {"trunc": data[:-7], "trailing": data + b"\x00", "header": data[:10] + b"{'descr': '|O'" + data[24:],
             "obj": data.replace(b"'<f4'", b"'|O8'", 1)}
    for name, blob in cases.items():
        (tmp_path / f"{name}.eqx").write_bytes(blob)
        with pytest.raises(FormatError):
            api.load(tmp_path / f"{name}.eqx", "equinox")


# --- Orbax checkpoint folders (tensorstore reads the arrays)


@pytest.mark.parametrize("name", ["flax", "haiku"])
def test_orbax_folder_to_onnx_matches_the_framework(tmp_path, name):
    """A folder ocp.StandardCheckpointer wrote (OCDBT + zarr) of a Flax linen tree (LSTMCell, Bidirectional
    GRUCell) and of a Haiku tree (hk.LSTM, hk.GRU): onnxruntime on the converted .onnx reproduces Flax / Haiku,
    and torch on the .pt the Flax tree (the Haiku GRU's reset-before equation is .pt's refusal, tested above)."""
    pytest.importorskip("tensorstore")
    pytest.importorskip("onnxruntime")
    from rnnconvert.runtimes import onnxruntime as ort_rt

    src = FIXTURES / "orbax" / name
    assert registry.detect(src).name == "orbax"
    orc = np.load(FIXTURES / "orbax" / f"{name}.oracle.npz")
    rep = api.convert(src, tmp_path / "out.onnx")
    assert rep.src_format == "orbax"
    ckpt = api.load(tmp_path / "out.onnx")
    layers = sorted(k[: -len("__out")] for k in orc.files if k.endswith("__out"))
    assert sorted(la.name for la in ckpt.layers) == layers
    for layer in layers:
        y = ort_rt.forward(tmp_path / "out.onnx", ckpt, layer, orc[f"{layer}__in"])
        np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)
    if name == "flax":  # linen cells are PyTorch's equations: the .pt too
        api.convert(src, tmp_path / "out.pt")
        mods = api.torch_modules(tmp_path / "out.pt")
        for layer in layers:
            with torch.no_grad():
                y = mods[layer](torch.from_numpy(orc[f"{layer}__in"]))[0].numpy()
            np.testing.assert_allclose(y, orc[f"{layer}__out"], rtol=RTOL, atol=ATOL, err_msg=layer)


def test_orbax_bad_folders(tmp_path):
    """Damaged metadata, a missing data file, leaves of other types: one line each, nothing run."""
    import shutil

    pytest.importorskip("tensorstore")
    src = FIXTURES / "orbax" / "haiku"
    bad = tmp_path / "ck"
    shutil.copytree(src, bad)
    (bad / "_METADATA").write_text("{not json")
    with pytest.raises(FormatError, match="not JSON"):
        api.load(bad, "orbax")
    meta = (src / "_METADATA").read_text()
    (bad / "_METADATA").write_text(meta.replace('"np.ndarray"', '"PLACEHOLDER"', 1).replace('"jax.Array"', '"PLACEHOLDER"', 1))
    with pytest.raises(UnsupportedError, match="PLACEHOLDER"):
        api.load(bad, "orbax")
    (bad / "_METADATA").write_text(meta)
    for f in bad.rglob("*"):
        if f.parent.name == "d":  # every OCDBT data file
            f.write_bytes(b"\x00" * 16)
    with pytest.raises(FormatError, match="damaged"):
        api.load(bad, "orbax")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="step folder"):
        api.load(tmp_path / "empty", "orbax")


def test_cli_orbax_folder_is_one_checkpoint_and_equinox_option(tmp_path, capsys):
    """The CLI converts an Orbax folder as one checkpoint (not a batch of its files), and takes Equinox's cells
    through --read-opt; without it, one line naming the option and exit code 3."""
    from rnnconvert.cli import main

    pytest.importorskip("tensorstore")
    assert main([str(FIXTURES / "orbax" / "haiku"), str(tmp_path / "o.onnx"), "-q"]) == 0
    assert (tmp_path / "o.onnx").is_file()
    assert main([str(EQ / "head.eqx"), str(tmp_path / "e.pt"), "-q"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cells=" in err[0]
    assert main([str(EQ / "head.eqx"), str(tmp_path / "e.pt"), "-q", "--read-opt", "cells=lstm:3:4:nobias,skip:2"]) == 0


def test_renamed_cores_in_pickle_and_msgpack(tmp_path):
    """cells= works through every container of a Haiku tree: the pickle format and a msgpack named --from haiku
    (pickle.dump / flax-free msgpack of the fixture's own arrays under a renamed module)."""
    import pickle

    msgpack = pytest.importorskip("msgpack")
    with np.load(HK / "params.npz") as z:
        tree = {"dec/~/core": {"w_i": z["gru/w_i"], "w_h": z["gru/w_h"], "b": z["gru/b"]},
                "enc": {"w": z["lstm/linear/w"], "b": z["lstm/linear/b"]}}
    tree = {"dec/~/core": tree["dec/~/core"], "enc/linear": tree["enc"]}
    with open(tmp_path / "t.pkl", "wb") as fh:
        pickle.dump(tree, fh)
    ext = lambda a: msgpack.ExtType(1, msgpack.packb((list(a.shape), a.dtype.name, a.tobytes()), use_bin_type=True))  # noqa: E731
    (tmp_path / "t.msgpack").write_bytes(msgpack.packb(tree, default=ext, use_bin_type=True))
    orc = _orc(HK)
    for src, fmt in ((tmp_path / "t.pkl", "pickle"), (tmp_path / "t.msgpack", "haiku")):
        ckpt = api.load(src, fmt, cells="enc:lstm")
        assert sorted(la.name for la in ckpt.layers) == ["dec.core", "enc"]  # hk.GRU's own names: any module
        for name, key in (("enc", "lstm"), ("dec.core", "gru")):
            y = reference.forward(ckpt.layer(name), orc[f"{key}__in"])
            np.testing.assert_allclose(y, orc[f"{key}__out"], rtol=RTOL, atol=ATOL, err_msg=f"{src.name} {name}")
