"""Verification must be able to fail (issue #14): mutations of correctly converted real files.

Each case converts a real file (the third-party files of fixtures/realworld and the framework-made
fixtures) with rnnconvert, checks that the correct output verifies ``ok`` with the default batch and with
long real inputs (the file's oracle inputs tiled to hundreds of steps), then damages the written file the
way a layout slip would -- every gate-block swap, a transposed block, one bias element moved by 1e-3 of
its bias's scale, the two GRU bias rows swapped, directions swapped, layers swapped, go_backwards flipped,
hard_sigmoid read as sigmoid -- and requires verification to FAIL (not merely be inconclusive) both ways.

The target sides are the frameworks that load the files (torch for ``.pt``, onnxruntime for ``.onnx``);
the source sides are the files' own equations and the numpy reference (rnnconvert.verify.engine). The oracle of
the correct conversions is the frameworks' own outputs, tested elsewhere (test_realworld_keras.py,
test_keras_fixtures.py); here the property under test is the verdict.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.cli import main

from conftest import FIXTURES, REALWORLD

TEXTGEN = REALWORLD / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5"
MYCROFT = REALWORLD / "mycroft-precise-gru" / "hey-mycroft.net"


def _long(npz, keys: dict[str, str], reps: int) -> dict[str, np.ndarray]:
    """The oracle's real inputs of each layer tiled ``reps`` times along time: long real sequences."""
    z = np.load(npz)
    return {layer: np.tile(z[key], (1, reps, 1)).astype(np.float32) for layer, key in keys.items()}


# ----------------------------------------------------------------------------------------------- .pt (torch)

def _pt_mutate(src, dst, tmp_path, fn, name):
    torch = pytest.importorskip("torch")
    sd = {k: v.numpy().copy() for k, v in torch.load(dst, weights_only=True).items()}
    fn(sd)
    out = tmp_path / f"{name}.pt"
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, out)
    return out


def _swap_rows(sd, keys, H, a, b):
    for key in keys:
        w = sd[key]
        ra, rb = w[a * H:(a + 1) * H].copy(), w[b * H:(b + 1) * H].copy()
        w[a * H:(a + 1) * H], w[b * H:(b + 1) * H] = rb, ra


def _gate_swaps(prefix: str, gates: str, H: int, sfx: str = "_l0"):
    keys = [f"{prefix}.{t}{sfx}" for t in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    return {f"swap {gates[a]}{gates[b]}": (lambda sd, a=a, b=b: _swap_rows(sd, keys, H, a, b))
            for a, b in itertools.combinations(range(len(gates)), 2)}


def _transpose_block(key: str, H: int, g: int = 0):
    def fn(sd):
        w = sd[key]
        w[g * H:(g + 1) * H] = w[g * H:(g + 1) * H].T.copy()
    return fn


def _nudge(key: str, j: int = 0, rel: float = 1e-3):
    """One bias element moved by ``rel`` of its bias vector's scale (max |b|)."""
    def fn(sd):
        b = sd[key]
        b[j] += np.float32(rel * float(np.abs(b).max()))
    return fn


def _swap_keys(*pairs):
    def fn(sd):
        for a, b in pairs:
            sd[a], sd[b] = sd[b].copy(), sd[a].copy()
    return fn


@pytest.fixture(scope="module")
def textgen_pt(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("textgen")
    api.convert(TEXTGEN, d / "good.pt")
    return d / "good.pt"


TEXTGEN_LONG = dict(npz=REALWORLD / "textgenrnn-reddit-cudnnlstm" / "oracle_out.npz",
                    keys={"rnn_1": "rnn_1__in", "rnn_2": "rnn_2__in"}, reps=10)

TEXTGEN_MUTATIONS = {
    **_gate_swaps("rnn_1", "ifgo", 128),
    "transposed W_hh block i": _transpose_block("rnn_1.weight_hh_l0", 128, 0),
    "bias_ih[0] + 1e-3 scale": _nudge("rnn_1.bias_ih_l0", 0),
    "bias_hh[300] + 1e-3 scale": _nudge("rnn_2.bias_hh_l0", 300),
    "layers swapped (W_hh, biases of rnn_1 and rnn_2)": _swap_keys(
        *[(f"rnn_1.{t}_l0", f"rnn_2.{t}_l0") for t in ("weight_hh", "bias_ih", "bias_hh")]),
}


def test_correct_textgenrnn_pt_verifies_ok_at_any_length(textgen_pt):
    assert api.verify(TEXTGEN, textgen_pt).ok
    assert api.verify(TEXTGEN, textgen_pt, inputs=_long(**TEXTGEN_LONG)).ok


@pytest.mark.slow
@pytest.mark.parametrize("what", list(TEXTGEN_MUTATIONS))
def test_textgenrnn_pt_mutation_fails(textgen_pt, tmp_path, what):
    bad = _pt_mutate(TEXTGEN, textgen_pt, tmp_path, TEXTGEN_MUTATIONS[what], "bad")
    rep = api.verify(TEXTGEN, bad)
    assert rep.failed, (what, [(c.name, c.verdict, c.step_ratio, c.seq_err) for c in rep.layers])
    rep = api.verify(TEXTGEN, bad, inputs=_long(**TEXTGEN_LONG))
    assert rep.failed, (what, [(c.name, c.verdict, c.step_ratio, c.seq_err) for c in rep.layers])


def test_issue_14_broken_file_fails_on_the_command_line(textgen_pt, tmp_path, capsys):
    """The report of issue #14: f and g blocks of rnn_1 swapped, verified on 400-step real inputs (the
    oracle's tiled) -- was `ok` with a tolerance of 3.5; must exit 5, with and without --inputs."""
    bad = _pt_mutate(TEXTGEN, textgen_pt, tmp_path, TEXTGEN_MUTATIONS["swap fg"], "broken")
    long = tmp_path / "long.npz"
    np.savez(long, **_long(**TEXTGEN_LONG))
    assert main(["verify", str(TEXTGEN), str(bad), "--inputs", str(long)]) == 5
    assert main(["verify", str(TEXTGEN), str(bad)]) == 5
    assert main(["verify", str(TEXTGEN), str(textgen_pt), "--inputs", str(long)]) == 0
    out = capsys.readouterr().out
    assert "FAIL rnn_1" in out and "torch" in out and "numpy float64 equations" in out


BIDI_GRU = FIXTURES / "keras" / "bidi_gru_sum.h5"
BIDI_LONG = dict(npz=FIXTURES / "keras" / "bidi_gru_sum.npz", keys={"bidi": "bidi__in"}, reps=40)
BIDI_MUTATIONS = {
    **_gate_swaps("bidi", "rzn", 3),
    **{f"{k} (reverse)": v for k, v in _gate_swaps("bidi", "rzn", 3, "_l0_reverse").items()},
    "transposed W_hh block n": _transpose_block("bidi.weight_hh_l0", 3, 2),
    "bias_ih[7] + 1e-3 scale": _nudge("bidi.bias_ih_l0", 7),
    "GRU bias rows swapped": _swap_keys(("bidi.bias_ih_l0", "bidi.bias_hh_l0")),
    "directions swapped": _swap_keys(*[(f"bidi.{t}_l0", f"bidi.{t}_l0_reverse")
                                       for t in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]),
}


@pytest.fixture(scope="module")
def bidi_pt(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("bidi")
    api.convert(BIDI_GRU, d / "good.pt")
    return d / "good.pt"


def test_correct_bidi_gru_pt_verifies_ok(bidi_pt):
    assert api.verify(BIDI_GRU, bidi_pt).ok
    assert api.verify(BIDI_GRU, bidi_pt, inputs=_long(**BIDI_LONG)).ok


@pytest.mark.slow
@pytest.mark.parametrize("what", list(BIDI_MUTATIONS))
def test_bidi_gru_pt_mutation_fails(bidi_pt, tmp_path, what):
    bad = _pt_mutate(BIDI_GRU, bidi_pt, tmp_path, BIDI_MUTATIONS[what], "bad")
    assert api.verify(BIDI_GRU, bad).failed, what
    assert api.verify(BIDI_GRU, bad, inputs=_long(**BIDI_LONG)).failed, what


SRNN = FIXTURES / "keras" / "simple_rnn_tanh.h5"
SRNN_LONG = dict(npz=FIXTURES / "keras" / "simple_rnn_tanh.npz", keys={"rnn": "rnn__in"}, reps=40)
SRNN_MUTATIONS = {
    "transposed W_hh": _transpose_block("rnn.weight_hh_l0", 6, 0),
    "bias_ih[2] + 1e-3 scale": _nudge("rnn.bias_ih_l0", 2),  # Keras' one bias is b_ih (b_hh is zeros)
}

STACK = FIXTURES / "tf" / "multi_basic_lstm" / "ckpt"
STACK_LONG = dict(npz=FIXTURES / "tf" / "multi_basic_lstm.npz", keys={"stack": "x"}, reps=40)
STACK_MUTATIONS = {"layers swapped (W_hh, biases of l0 and l1)": _swap_keys(
    *[(f"stack.{t}_l0", f"stack.{t}_l1") for t in ("weight_hh", "bias_ih", "bias_hh")])}


@pytest.mark.slow
@pytest.mark.parametrize("src,long,what,fn", [
    *[(SRNN, SRNN_LONG, k, v) for k, v in SRNN_MUTATIONS.items()],
    *[(STACK, STACK_LONG, k, v) for k, v in STACK_MUTATIONS.items()],
])
def test_rnn_and_stacked_pt_mutations_fail(tmp_path, src, long, what, fn):
    pytest.importorskip("torch")
    good = tmp_path / "good.pt"
    api.convert(src, good)
    assert api.verify(src, good).ok and api.verify(src, good, inputs=_long(**long)).ok
    bad = _pt_mutate(src, good, tmp_path, fn, "bad")
    assert api.verify(src, bad).failed, what
    assert api.verify(src, bad, inputs=_long(**long)).failed, what


# ----------------------------------------------------------------------------------------- .onnx (onnxruntime)

def _onnx_mutate(dst, tmp_path, fn):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    model = onnx.load(str(dst))
    arrays = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    fn(model, arrays)
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    out = tmp_path / "bad.onnx"
    onnx.save(model, str(out))
    return out


def _onnx_swap(key: str, H: int, a: int, b: int, axis: int):
    def fn(model, arrays):
        w = np.moveaxis(arrays[key], axis, 0)
        ra, rb = w[a * H:(a + 1) * H].copy(), w[b * H:(b + 1) * H].copy()
        w[a * H:(a + 1) * H], w[b * H:(b + 1) * H] = rb, ra
    return fn


def _onnx_gate_swaps(node: str, gates: str, H: int):
    """Swap gate blocks ``a, b`` (ONNX order) in W, R and both halves of B of ``node``."""
    G = len(gates)

    def make(a, b):
        def fn(model, arrays):
            for key in ("W", "R"):
                _onnx_swap(f"{node}.{key}", H, a, b, 1)(model, arrays)
            for half in (0, G):
                _onnx_swap(f"{node}.B", H, half + a, half + b, 1)(model, arrays)
        return fn
    return {f"swap {gates[a]}{gates[b]}": make(a, b) for a, b in itertools.combinations(range(G), 2)}


def _onnx_attr(node: str, fn_attrs):
    def fn(model, arrays):
        n = next(n for n in model.graph.node if n.name == node)
        fn_attrs(n)
    return fn


def _hard_to_sigmoid(n):
    """Every HardSigmoid activation of node ``n`` read as Sigmoid (its alpha/beta dropped)."""
    from onnx import helper

    at = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    acts = [a.decode() if isinstance(a, bytes) else a for a in at["activations"]]
    alpha, beta = list(at.get("activation_alpha", [])), list(at.get("activation_beta", []))
    new_acts, new_a, new_b, j = [], [], [], 0
    for a in acts:
        has = a in ("HardSigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "Elu", "Softplus")
        if a == "HardSigmoid":
            new_acts.append("Sigmoid")
        else:
            new_acts.append(a)
            if has:
                new_a.append(alpha[j])
                new_b.append(beta[j])
        j += has
    keep = [a for a in n.attribute if a.name not in ("activations", "activation_alpha", "activation_beta")]
    del n.attribute[:]
    n.attribute.extend(keep)
    n.attribute.append(helper.make_attribute("activations", new_acts))
    if new_a:
        n.attribute.append(helper.make_attribute("activation_alpha", new_a))
        n.attribute.append(helper.make_attribute("activation_beta", new_b))


def _flip_direction(n):
    from onnx import helper

    keep = [a for a in n.attribute if a.name != "direction"]
    old = next(helper.get_attribute_value(a) for a in n.attribute if a.name == "direction")
    del n.attribute[:]
    n.attribute.extend(keep)
    n.attribute.append(helper.make_attribute("direction", "forward" if old == b"reverse" else "reverse"))


def _onnx_nudge(key: str, j: int, rel: float = 1e-3):
    def fn(model, arrays):
        b = arrays[key].reshape(-1)
        b[j] += np.float32(rel * float(np.abs(b).max()))
    return fn


def _onnx_transpose(key: str, H: int, g: int):
    def fn(model, arrays):
        w = arrays[key][0]
        w[g * H:(g + 1) * H] = w[g * H:(g + 1) * H].T.copy()
    return fn


MYCROFT_LONG = dict(npz=REALWORLD / "mycroft-precise-gru" / "oracle_out.npz", keys={"net": "net__in"}, reps=10)
MYCROFT_MUTATIONS = {
    **_onnx_gate_swaps("net", "zrh", 20),
    "transposed R block h": _onnx_transpose("net.R", 20, 2),
    "B[5] + 1e-3 scale": _onnx_nudge("net.B", 5),
    # (the two GRU bias rows swapped is no mutation here: with reset_after=False, b_in and b_hn are added
    # alike, and swapping them computes the same function; the reset_after GRU of BIDI_MUTATIONS has it)
    "hard_sigmoid read as sigmoid": _onnx_attr("net", _hard_to_sigmoid),
}
GOBACK = FIXTURES / "keras" / "lstm_go_backwards.h5"
GOBACK_LONG = dict(npz=FIXTURES / "keras" / "lstm_go_backwards.npz", keys={"lstm": "lstm__in"}, reps=40)
HARD = FIXTURES / "keras" / "lstm_hard_sigmoid.h5"
HARD_LONG = dict(npz=FIXTURES / "keras" / "lstm_hard_sigmoid.npz", keys={"lstm": "lstm__in"}, reps=40)


@pytest.mark.slow
@pytest.mark.parametrize("src,long,what,fn", [
    *[(MYCROFT, MYCROFT_LONG, k, v) for k, v in MYCROFT_MUTATIONS.items()],
    (GOBACK, GOBACK_LONG, "go_backwards flipped", _onnx_attr("lstm", _flip_direction)),
    (HARD, HARD_LONG, "hard_sigmoid read as sigmoid", _onnx_attr("lstm", _hard_to_sigmoid)),
])
def test_onnx_mutation_fails(tmp_path, src, long, what, fn):
    """The Mycroft GRU (hard_sigmoid gates, linear activation: ill-conditioned) passes honestly into ONNX
    through the one-step comparison; every mutation of it fails."""
    pytest.importorskip("onnxruntime")
    good = tmp_path / "good.onnx"
    api.convert(src, good)
    assert api.verify(src, good).ok and api.verify(src, good, inputs=_long(**long)).ok
    bad = _onnx_mutate(good, tmp_path, fn)
    rep = api.verify(src, bad)
    assert rep.failed, (what, [(c.name, c.verdict, c.step_ratio, c.seq_err, c.seq_tol) for c in rep.layers])
    rep = api.verify(src, bad, inputs=_long(**long))
    assert rep.failed, (what, [(c.name, c.verdict, c.step_ratio, c.seq_err, c.seq_tol) for c in rep.layers])


# ------------------------------------------------------------- the large-model sample (verify.SAMPLE_LARGE)

LARGE_PT = [*[(TEXTGEN, k, v) for k, v in TEXTGEN_MUTATIONS.items()],
            *[(BIDI_GRU, k, v) for k, v in BIDI_MUTATIONS.items()],
            *[(SRNN, k, v) for k, v in SRNN_MUTATIONS.items()],
            *[(STACK, k, v) for k, v in STACK_MUTATIONS.items()]]
LARGE_ONNX = [*[(MYCROFT, k, v) for k, v in MYCROFT_MUTATIONS.items()],
              (GOBACK, "go_backwards flipped", _onnx_attr("lstm", _flip_direction)),
              (HARD, "hard_sigmoid read as sigmoid", _onnx_attr("lstm", _hard_to_sigmoid))]


@pytest.fixture
def large_sample(monkeypatch):
    """Every checkpoint verified on the batch of a multi-GB one (``verify.SAMPLE_LARGE``: fewer sequences and
    steps than ``SAMPLE``), by lowering ``verify.LARGE_BYTES`` to 0."""
    from rnnconvert.verify import engine as verify_mod

    monkeypatch.setattr(verify_mod, "LARGE_BYTES", 0)
    return verify_mod.SAMPLE_LARGE


@pytest.mark.slow
@pytest.mark.parametrize("src,what,fn", LARGE_PT + LARGE_ONNX,
                         ids=[f"{s.stem}-{w}" for s, w, _ in LARGE_PT + LARGE_ONNX])
def test_mutation_fails_on_the_large_model_sample(tmp_path, large_sample, src, what, fn):
    """What a multi-GB model is verified on (the 3 GB benchmark model, issue #18) must catch every mutation
    above too: the correct file ``ok``, each damaged one FAILED (torch, onnxruntime as the targets)."""
    onnx_case = (src, what, fn) in LARGE_ONNX
    pytest.importorskip("onnxruntime" if onnx_case else "torch")
    good = tmp_path / ("good.onnx" if onnx_case else "good.pt")
    api.convert(src, good)
    rep = api.verify(src, good)
    assert rep.ok and (rep.batch, rep.steps) == large_sample
    bad = _onnx_mutate(good, tmp_path, fn) if onnx_case else _pt_mutate(src, good, tmp_path, fn, "bad")
    rep = api.verify(src, bad)
    assert rep.failed, (what, [(c.name, c.verdict, c.step_ratio, c.seq_err, c.seq_tol) for c in rep.layers])
