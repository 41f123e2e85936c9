"""Streaming states in the ``.pt2`` program and the emitted ``nn.Module`` (issue #41, CLI ``--states``): every
unidirectional recurrent layer call's initial states are an input (a dict ``{"state_in:<layer>:h": (B, units)}``,
``:c`` for an LSTM) and its final states an output (``state_out:...``), the names of the ONNX form
(``tests/formats/whole_models/test_whole_states_chunks.py``), so a sequence runs in two chunks and gives the one
pass' outputs. A Bidirectional layer is refused by name: its backward direction starts at the sequence's end, so a
first chunk cannot hand it a state (as the ONNX form refuses it).

Oracles: tf_keras 2.21 running the whole sequence in one pass, (a) stored with ``whole_masked_stack``
(``fixtures/gen_keras_whole.py``: Masking -> GRU -> GRU(hard_sigmoid) -> LSTM -> Dense, row 1 padded at its end), (b)
run here on ``masks_gru_stack`` (``fixtures/gen_whole_masks.py``: Embedding(mask_zero) -> GRU -> GRU(hard_sigmoid,
reset-before) -> GRU -> Dense, the issue's masked 3-GRU model; its config rebuilt and weights loaded by tf_keras,
``keras_whole.source_model``) on 40 steps padded at the end, the front and inside across the split. The targets run the
first chunk from zero states and the second from the first's final states (tf_keras keeps the state over masked
steps; every row has an unmasked step in the second chunk, whose last output a ``return_sequences=False`` layer
gives). Tolerance as ``tests/formats/whole_models/test_pt2_fast.py``: ``2e-5 * max(1, max|ref|)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tf_keras")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.conventions import keras_graph  # noqa: E402
from rnnconvert.whole.formats.torch import module_write, pt2_write  # noqa: E402
from rnnconvert.whole.runtimes import torch_export  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures"
STACK = FIX / "keras_whole" / "whole_masked_stack.h5"
GRUS = FIX / "whole_masks" / "masks_gru_stack.h5"
TOL = 2e-5


def _graph(path):
    ckpt = rnnconvert.load(path)
    full = keras_whole.read_full_model(ckpt)
    return keras_graph.build(full.config, full.weights, ckpt), full


def _err(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) / max(1.0, float(np.max(np.abs(ref))))


def _pt2(graph, tmp_path):
    """The program written and loaded back as a user would (``torch.export.save`` / ``load``)."""
    path = tmp_path / "m.pt2"
    torch.export.save(pt2_write.export(graph, states=True), str(path))
    return torch.export.load(str(path)).module()


def _module(graph, tmp_path):
    em = module_write.emit(graph, "src.h5", "streamed", "streamed_state.pt", states=True)
    py = tmp_path / "streamed.py"
    py.write_text(em.source)
    (tmp_path / "streamed_state.pt").write_bytes(module_write.state_bytes(em.state))
    return torch_export.load_module(py, tmp_path / "streamed_state.pt"), torch_export.import_module(py).STATES


def _two_chunks(run, x, split: int, sizes: dict):
    """output 0 after ``x`` in two chunks, the second from the first's final states; the output of the second
    chunk alone from zero states; the first chunk's final states."""
    zero = {k: torch.zeros(len(x), h) for k, h in sizes.items()}
    with torch.no_grad():
        *_, carry = run(torch.from_numpy(x[:, :split]), zero)
        out = run(torch.from_numpy(x[:, split:]), {k: carry[k.replace("state_in:", "state_out:")] for k in zero})
        alone = run(torch.from_numpy(x[:, split:]), zero)
    return out[0].numpy(), alone[0].numpy(), carry


def _sizes(graph):
    return {f"state_in:{n}:{k}": h for n, k, h in pt2_write.carried(graph)}


def test_stack_pt2_and_module_two_chunks_match_one_tf_keras_pass(tmp_path):
    g, _ = _graph(STACK)
    z = np.load(STACK.with_suffix(".npz"))
    sizes = _sizes(g)
    assert sizes == {"state_in:gru_a:h": 4, "state_in:gru_b:h": 4, "state_in:lstm:h": 3, "state_in:lstm:c": 3}
    x = z["in__feats"]
    prog = _pt2(g, tmp_path)
    mod, states = _module(g, tmp_path)
    assert states == sizes
    for run in (lambda a, s: prog(a, s), lambda a, s: mod(a, s)):
        got, alone, _ = _two_chunks(run, x, 3, sizes)
        assert _err(got, z["out__0"]) <= TOL
        assert _err(alone, z["out__0"]) > 10 * TOL  # the states carry the difference
    with torch.no_grad():  # the module without states: zeros, one pass
        assert _err(mod(torch.from_numpy(x))[0].numpy(), z["out__0"]) <= TOL


def test_gru_stack_padding_across_the_split_matches_tf_keras(tmp_path):
    """The issue's masked 3-GRU model (hard_sigmoid, reset-before) on 40 steps: padding at the end, the front (a
    first chunk all padding), inside across the split; tf_keras runs the whole sequence."""
    g, full = _graph(GRUS)
    rng = np.random.default_rng(41)
    x = rng.integers(1, 30, (3, 40)).astype(np.int32)
    x[0, 32:] = 0
    x[1, :22] = 0
    x[2, 15:26] = 0
    ref = keras_whole.source_model(str(GRUS), full.config).predict_on_batch(x)
    sizes = _sizes(g)
    assert sizes == {"state_in:gru1:h": 4, "state_in:gru2:h": 3, "state_in:gru3:h": 4}
    prog = _pt2(g, tmp_path)
    mod, _ = _module(g, tmp_path)
    for run in (lambda a, s: prog(a, s), lambda a, s: mod(a, s)):
        got, _, carry = _two_chunks(run, x, 20, sizes)
        assert _err(got, ref) <= TOL
        for name, h in carry.items():  # a masked step keeps the state: row 1's first chunk is all padding
            assert torch.equal(h[1], torch.zeros_like(h[1])), name
            assert float(h[[0, 2]].abs().max()) > 0.01, name


def test_bidirectional_is_refused_by_name():
    g, _ = _graph(FIX / "keras_whole" / "whole_embed_conv_bilstm.h5")
    with pytest.raises(rnnconvert.errors.UnsupportedError, match="'bilstm'.*Bidirectional"):
        pt2_write.build_module(g, states=True)
    with pytest.raises(rnnconvert.errors.UnsupportedError, match="'bilstm'.*Bidirectional"):
        module_write.emit(g, states=True)


def test_cli_states_pt2_and_module_convert_and_verify(tmp_path):
    """``--states`` to ``.pt2`` with ``--emit-module``: both verified against tf_keras (zero states fed, as the source
    starts); the notes say how to run chunks; the program's extra file names the states."""
    dst, py = tmp_path / "s.pt2", tmp_path / "s_mod.py"
    r = subprocess.run([sys.executable, "-m", "rnnconvert", "convert", str(STACK), str(dst), "--states",
                        "--emit-module", str(py)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "state_in:<layer>:h" in r.stdout + r.stderr
    extra = {"rnnconvert_inputs.txt": ""}
    torch.export.load(str(dst), extra_files=extra)
    assert "'state_out:lstm:c'" in extra["rnnconvert_inputs.txt"]
    assert "def forward(self, feats, states=None):" in py.read_text()
