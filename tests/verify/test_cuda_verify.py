"""`rnnconvert verify SRC DST --device cuda`: converted files run through cuDNN (GPU machine only).

Oracle: cuDNN itself (through torch on an NVIDIA GPU, both routes of rnnconvert/verify/cuda.py). A correct
file must pass in float32 and float16 (the realworld textgenrnn LSTM, and every fixture that converts to .pt);
a file with a layout slip (swapped gate blocks, a nudged bias, swapped directions) must fail, by both routes
and in both precisions: the verification rule with cuDNN's measured accuracy (CudaTarget.act_ulps and
target_arithmetic) must still be able to fail. Run with ``RNNCONVERT_CUDA_TESTS=1`` (docs/gpu-validation.md).
"""

from __future__ import annotations

import pytest

import rnnconvert
from conftest import FIXTURES, cuda_mark, manifest
from rnnconvert.errors import FormatError, UnsupportedError

needs_cuda = cuda_mark()
TEXTGEN = "textgenrnn-reddit-cudnnlstm/reddit_rarepuppers_politics.hdf5"


def _explain(rep):
    return [(c.name, c.target_route, c.verdict, c.reason) for c in rep.layers]


def _text_inputs(src, n=3, steps=8):
    """The model's own inputs: embedding rows of random characters for ``rnn_1`` (N(0, 1) in 100 dimensions
    is far outside what the embedding feeds it), ``rnn_1``'s float32 output on them for ``rnn_2``."""
    import numpy as np

    from rnnconvert.core import reference

    ck = rnnconvert.load(src)
    emb = np.asarray(ck.tensors["embedding.weight"], np.float32)  # (465 characters, 100)
    x1 = emb[np.random.default_rng(0).integers(0, emb.shape[0], (n, steps))]
    return {"rnn_1": x1, "rnn_2": reference.forward(ck.layer("rnn_1"), x1, np.float32)}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("inputs", ["model", "normal"])
def test_textgenrnn_pt_through_cudnn_both_routes(realworld, tmp_path, dtype, inputs):
    src = realworld / TEXTGEN
    dst = tmp_path / "t.pt"
    rnnconvert.convert(src, dst)
    rep = rnnconvert.verify(src, dst, device="cuda", dtype=dtype,
                            inputs=_text_inputs(src) if inputs == "model" else None)
    routes = {c.target_route for c in rep.layers}
    assert len(routes) == 2 and all("cuDNN" in r for r in routes)
    if dtype == "float16":
        # float16 along 8 steps of this trained layer parts from the float64 run by 1.5e-2 (the model's inputs)
        # to 3.7e-2 (N(0, 1)) of the output's scale (H100): near or above what still tells a layout slip
        # (verify.fraction: 3.1e-2), so verification may not decide; it must say so, and never fail the file
        assert {c.verdict for c in rep.layers} <= {"ok", "inconclusive"}, _explain(rep)
    else:
        assert rep.ok, _explain(rep)


@pytest.mark.cuda
@needs_cuda
def test_dinornn_tf2_checkpoint_through_cudnn(dinornn, tmp_path):
    src = dinornn / "ckpt_100"
    dst = tmp_path / "g.pt"
    rnnconvert.convert(src, dst)
    assert rnnconvert.verify(src, dst, device="cuda").ok


FILES = [e["file"] for fam in ("keras", "keras_whole", "tf", "field", "cudnn") for e in manifest(fam)
         if not e["file"].endswith((".npz", ".json")) and "_lone" not in e["file"]]  # lone: spec by read options


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("suffix", [".pt", ".cudnn.npz"])
@pytest.mark.parametrize("name", FILES)
def test_every_fixture_that_converts_to_pt_passes_through_cudnn(name, suffix, dtype, tmp_path):
    """Every fixture the torch writer (or the cuDNN buffer writer, .cudnn.npz) can express, read back and run
    by cuDNN: the TF1 checkpoints holding JAX's and MXNet's cuDNN buffers (cudnn/tf1/*_companions) too."""
    src = FIXTURES / name
    dst = tmp_path / f"x{suffix}"
    try:
        rnnconvert.convert(src, dst)
    except UnsupportedError as exc:  # not expressible in torch.nn (hard_sigmoid, peepholes, ...): nothing to run
        pytest.skip(f"{name} does not convert to {suffix}: {str(exc)[:120]}")
    except FormatError as exc:
        if "--map" not in str(exc):
            raise
        pytest.skip(f"{name} needs a --map to be read: {str(exc)[:120]}")
    rep = rnnconvert.verify(src, dst, device="cuda", dtype=dtype)
    assert rep.ok, _explain(rep)


def _mutate(src, tmp_path, edit):
    """``src`` converted to .pt, then its state dict edited by torch (``edit(sd)``) and saved again."""
    import torch

    good = tmp_path / "good.pt"
    rnnconvert.convert(src, good)
    sd = torch.load(good, weights_only=True)
    edit(sd)
    bad = tmp_path / "bad.pt"
    torch.save(sd, bad)
    return bad


def _swap_rows(sd, key, a, b, blocks):
    w = sd[key]
    n = w.shape[0] // blocks
    ra, rb = w[a * n:(a + 1) * n].clone(), w[b * n:(b + 1) * n].clone()
    w[a * n:(a + 1) * n], w[b * n:(b + 1) * n] = rb, ra


def _swap_directions(sd):
    for key in [k for k in sd if k.endswith("_l0")]:
        sd[key], sd[key + "_reverse"] = sd[key + "_reverse"].clone(), sd[key].clone()


def _nudge(sd, key, block, blocks, by=0.05):
    n = sd[key].shape[0] // blocks
    sd[key][block * n:(block + 1) * n] += by


MUTATIONS = {  # (source, edit, layer that must fail)
    "lstm f<->g in W_hh": (f"realworld/{TEXTGEN}", lambda sd: _swap_rows(sd, "rnn_1.weight_hh_l0", 1, 2, 4), "rnn_1"),
    "lstm i<->o in W_ih": (f"realworld/{TEXTGEN}", lambda sd: _swap_rows(sd, "rnn_2.weight_ih_l0", 0, 3, 4), "rnn_2"),
    "lstm b_ih[f] + 0.05": (f"realworld/{TEXTGEN}", lambda sd: _nudge(sd, "rnn_2.bias_ih_l0", 1, 4), "rnn_2"),
    "bilstm directions swapped": ("keras/cudnn_bidi_lstm.h5", _swap_directions, "bidi"),
    "bilstm reverse g<->o in W_hh": ("keras/cudnn_bidi_lstm.h5",
                                     lambda sd: _swap_rows(sd, "bidi.weight_hh_l0_reverse", 2, 3, 4), "bidi"),
    "gru r<->z in W_ih": ("keras/cudnn_gru.h5", lambda sd: _swap_rows(sd, "rnn_1.weight_ih_l0", 0, 1, 3), "rnn_1"),
    "gru b_hh[n] + 0.05": ("keras/cudnn_gru.h5", lambda sd: _nudge(sd, "rnn_1.bias_hh_l0", 2, 3), "rnn_1"),
}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("what", list(MUTATIONS))
def test_cudnn_verification_fails_layout_slips(what, dtype, tmp_path):
    name, edit, layer = MUTATIONS[what]
    src = FIXTURES / name
    bad = _mutate(src, tmp_path, edit)
    rep = rnnconvert.verify(src, bad, device="cuda", dtype=dtype)
    verdicts = {(c.name, c.target_route): c.verdict for c in rep.layers}
    assert {v for (n, _), v in verdicts.items() if n == layer} == {"fail"}, _explain(rep)
