"""The cuDNN buffer layout: tf_keras' own packing (CPU), round trips, and real cuDNN (tests marked cuda).

The third-party oracles of the multi-pseudo-layer layout (JAX, MXNet) are in ``tests/formats/cudnn_buffers/test_cudnn_oracles.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import cuda_mark, cudnn_gate_distinct, random_layer
from rnnconvert.core import cudnn, gates, reference
from rnnconvert.verify import cudnn_layout as cudnn_check
from rnnconvert.errors import FormatError, UnsupportedError
from rnnconvert.core.model import Cell, DirectionParams, RNNLayer, Semantics

CELLS = [Cell.LSTM, Cell.GRU, Cell.RNN_TANH, Cell.RNN_RELU]
GRID = [cudnn.Spec(c, i, h, nl, bi, p)
        for c, (i, h), nl, bi, p in itertools.product(CELLS, [(3, 4), (5, 2)], [1, 2, 3], [False, True], [0, 1])
        if not (p and c is not Cell.LSTM)]

needs_cuda = cuda_mark()



# ---- CPU: tf_keras' own packing helper -----------------------------------------------------------

@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")  # the GPU machine's image has none


@pytest.mark.parametrize("cell", [Cell.LSTM, Cell.GRU])
def test_single_layer_pack_equals_tf_keras_canonical_to_params(tf, cell):
    """pack() == the buffer tf_keras gpu_lstm/gpu_gru build (LAYOUTS §5, §11.5), bit for bit."""
    from tf_keras.src.layers.rnn import gru_lstm_utils  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415

    I, H = 3, 5
    layer_k = tf_keras.layers.LSTM(H) if cell is Cell.LSTM else tf_keras.layers.GRU(H, reset_after=True)
    layer_k.build((None, 2, I))
    rng = np.random.default_rng(1)
    G = cell.gates
    kernel = cudnn_gate_distinct(rng, (I, G * H), G, axis=1)
    rec = cudnn_gate_distinct(rng, (H, G * H), G, axis=1)
    bias = cudnn_gate_distinct(rng, (G * H,), G) if cell is Cell.LSTM else np.stack(
        [cudnn_gate_distinct(rng, (G * H,), G), cudnn_gate_distinct(rng, (G * H,), G)])
    layer_k.set_weights([kernel, rec, bias])
    k, r, b = (v.numpy() for v in layer_k.cell.weights)
    if cell is Cell.LSTM:  # tf_keras lstm.py gpu_lstm
        w = tf.split(k, 4, axis=1) + tf.split(r, 4, axis=1)
        full = tf.split(tf.concat((tf.zeros_like(b), b), 0), 8)
        conv = gates.convention("keras", cell)
        dp = DirectionParams(gates.to_canonical(k, conv, cell), gates.to_canonical(r, conv, cell),
                             np.zeros_like(b), gates.vec_to_canonical(b, conv, cell))
    else:  # tf_keras gru.py gpu_gru
        w = tf.split(k, 3, axis=1) + tf.split(r, 3, axis=1)
        full = tf.split(tf.reshape(b, [-1]), 6)
        w[0], w[1], w[3], w[4] = w[1], w[0], w[4], w[3]
        full[0], full[1], full[3], full[4] = full[1], full[0], full[4], full[3]
        conv = gates.convention("keras_ra", cell)
        dp = DirectionParams(gates.to_canonical(k, conv, cell), gates.to_canonical(r, conv, cell),
                             gates.vec_to_canonical(b[0], conv, cell), gates.vec_to_canonical(b[1], conv, cell))
    theirs = gru_lstm_utils.canonical_to_params(weights=w, biases=full, shape=tf.constant([-1]),
                                                transpose_weights=True).numpy()
    ours = cudnn.pack(RNNLayer("k", cell, I, H, params=[[dp]]))
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_param_count_matches_torch_parameter_count():
    """Buffer length = torch's own parameter count (bias regions are always present)."""
    for spec in GRID:
        m = cudnn_check._module(spec, device="cpu")
        assert cudnn.param_count(spec) == sum(p.numel() for p in m.parameters()), spec


# ---- CPU: layout properties and round trips ------------------------------------------------------

@pytest.mark.parametrize("spec", GRID, ids=str)
def test_layout_tiles_buffer(spec):
    regs = cudnn.layout(spec)
    off = 0
    for r in regs:
        assert r.offset == off
        off += r.size
    per = 2 * spec.cell.gates * 2 + (1 if spec.proj_size else 0)
    assert len(regs) == per * spec.num_layers * spec.dirs


@pytest.mark.parametrize("spec", GRID, ids=str)
def test_all_matrices_before_all_biases_and_v1_permutation(spec):
    """layout(): every matrix region before every bias region, pseudo-layers in order within each section;
    layout_v1 (old, per pseudo-layer blocks) equals it for one pseudo-layer; from_layout_v1 is a permutation."""
    regs = cudnn.layout(spec)
    kinds = [r.kind for r in regs]
    assert kinds == sorted(kinds, key=lambda k: k == "bias")
    for kind in ("matrix", "bias"):
        ps = [r.pseudo_layer for r in regs if r.kind == kind]
        assert ps == sorted(ps)
    old = cudnn.layout_v1(spec)
    if spec.num_layers * spec.dirs == 1:
        assert old == regs
    buf = np.arange(cudnn.param_count(spec), dtype=np.float64)
    moved = cudnn.from_layout_v1(buf, spec)
    assert sorted(moved) == list(buf)
    where = {(r.pseudo_layer, r.kind, r.linear_layer_id): r for r in old}
    for r in regs:
        o = where[(r.pseudo_layer, r.kind, r.linear_layer_id)]
        assert np.array_equal(moved[r.offset:r.offset + r.size], buf[o.offset:o.offset + o.size])


@pytest.mark.parametrize("spec", GRID, ids=str)
def test_round_trip_bit_exact(spec):
    layer = random_layer(spec)
    buf = cudnn.pack(layer)
    back = cudnn.unpack(buf, spec)
    for a_dirs, b_dirs in zip(layer.params, back.params):
        for a, b in zip(a_dirs, b_dirs):
            for key, arr in a.arrays().items():
                assert np.array_equal(arr, b.arrays()[key]), key
    assert np.array_equal(cudnn.pack(back), buf)


def test_round_trip_float16_and_float64():
    for dt in (np.float16, np.float64):
        spec = cudnn.Spec(Cell.GRU, 3, 4, 2, True)
        buf = cudnn.pack(random_layer(spec, dtype=dt))
        assert buf.dtype == dt and np.array_equal(cudnn.pack(cudnn.unpack(buf, spec)), buf)


def test_unpack_wrong_size_and_refusals():
    spec = cudnn.Spec(Cell.LSTM, 3, 4)
    with pytest.raises(FormatError, match="needs"):
        cudnn.unpack(np.zeros(cudnn.param_count(spec) + 1, np.float32), spec)
    layer = random_layer(spec)
    with pytest.raises(UnsupportedError, match="peephole"):
        p = layer.params[0][0]
        cudnn.pack(RNNLayer("p", Cell.LSTM, 3, 4, params=[[DirectionParams(
            p.w_ih, p.w_hh, p.b_ih, p.b_hh, peep=np.ones((3, 4), np.float32))]]))


def test_forget_bias_folded_into_input_bias():
    spec = cudnn.Spec(Cell.LSTM, 3, 4)
    layer = random_layer(spec).with_semantics(forget_bias=1.0)
    back = cudnn.unpack(cudnn.pack(layer), spec)
    x = np.random.default_rng(2).normal(size=(2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(reference.forward(back, x), reference.forward(layer, x), atol=1e-6)


def test_candidate_specs_solves_and_lists_ambiguity():
    spec = cudnn.Spec(Cell.LSTM, 7, 6, 2, True)
    n = cudnn.param_count(spec)
    assert cudnn.candidate_specs(n, Cell.LSTM, hidden_size=6, num_layers=2, bidirectional=True) == [spec]
    assert spec in cudnn.candidate_specs(n, Cell.LSTM, max_hidden=64)


# ---- real cuDNN (GPU machine only) ----------------------------------------------------------------

CUDA_GRID = [s for s in GRID if s.input_size == 3] + [cudnn.Spec(Cell.LSTM, 16, 32, 3, True, 8)]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("spec", CUDA_GRID, ids=str)
def test_layout_matches_cudnn_offsets(spec):
    assert cudnn_check.compare_offsets(spec) == []
    cudnn_check.check_layout(spec)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("spec", CUDA_GRID, ids=str)
@pytest.mark.parametrize("route", ["module", "buffer"])
def test_cudnn_forward_matches_reference(spec, route):
    layer = random_layer(spec, seed=3)
    x = np.random.default_rng(4).normal(size=(2, 6, spec.input_size)).astype(np.float32)
    fn = cudnn_check.forward_module if route == "module" else cudnn_check.forward_buffer
    np.testing.assert_allclose(fn(layer, x), reference.forward(layer, x), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", [s for s in GRID if s.input_size == 3], ids=str)
def test_cuda_check_names_follow_torch_flat_weights(spec):
    """The GPU checks pair torch's _flat_weights_names (in torch's order) with layout() regions; CPU part."""
    m = cudnn_check._module(spec, device="cpu")
    assert [n for n, *_ in cudnn_check._names(spec)] == list(m._flat_weights_names)
    offs = cudnn_check.expected_offsets(spec)
    assert offs["weight_ih_l0"] == 0 and len(set(offs.values())) == len(offs)
