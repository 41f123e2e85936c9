"""THE table of layout conventions: gate order, kernel orientation and bias style per format.

This module is the one place where rnnconvert states which gate block sits where. Readers and
writers never hard-code an index swap; they call :func:`to_canonical` / :func:`from_canonical`
with a :class:`Convention` looked up here.

Gate letters (canonical names, the cuDNN/PyTorch ones):

* LSTM ``i`` input, ``f`` forget, ``g`` candidate (Keras ``c``, TF1 ``j``), ``o`` output.
* GRU ``r`` reset, ``z`` update (TF1 ``u``), ``n`` candidate (Keras ``h``, cuDNN "new memory").
* simple RNN: one block, ``h``.

The canonical order is cuDNN's linear-layer-id order, which PyTorch uses too:
LSTM ``i f g o``, GRU ``r z n`` (cuDNN ``cudnnGetRNNLinLayerMatrixParams`` doc; PyTorch
``torch/nn/modules/rnn.py`` docstrings of ``weight_ih_l[k]``).

Orientation: ``"out_in"`` means a matrix of shape ``(G*H, in)`` applied as ``W x`` (cuDNN, PyTorch,
ONNX); ``"in_out"`` means ``(in, G*H)`` applied as ``x @ K`` (Keras, TF).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Cell

#: Canonical gate order per cell kind (cuDNN linLayerID order; PyTorch order).
CANONICAL: dict[Cell, str] = {
    Cell.LSTM: "ifgo",
    Cell.GRU: "rzn",
    Cell.RNN_TANH: "h",
    Cell.RNN_RELU: "h",
}


@dataclass(frozen=True)
class Convention:
    """How one format stores one cell kind.

    Attributes:
        gate_order: gate letters (canonical names) in the order the format stores its blocks.
        orientation: ``"in_out"`` (``(in, G*H)``, ``x @ K``) or ``"out_in"`` (``(G*H, in)``, ``W x``).
        bias: ``"single"`` (one vector, ``b_ih + b_hh``), ``"double"`` (two vectors ``b_ih``,
            ``b_hh``), ``"double_rows"`` (Keras GRU ``(2, G*H)``: row 0 input, row 1 recurrent),
            ``"double_flat"`` (Keras CuDNN layers ``(2*G*H,)``: input biases then recurrent),
            ``"b_bhn"`` (MLX GRU: ``b`` ``(3H,)`` = ``b_ih`` with ``b_hr``, ``b_hz`` summed in, and ``bhn`` = ``b_hn``).
        source: where the fact comes from.
    """

    gate_order: str
    orientation: str
    bias: str
    source: str


# Keys: (format family, cell). Every reader and writer looks its convention up here.
_L, _G, _T, _R = Cell.LSTM, Cell.GRU, Cell.RNN_TANH, Cell.RNN_RELU
TABLE: dict[tuple[str, Cell], Convention] = {
    # Keras 2 / tf.keras / tf_keras / Keras 3 LSTM: kernel (I,4H) columns i,f,c,o; one bias.
    ("keras", _L): Convention("ifgo", "in_out", "single", "tf_keras layers/rnn/lstm.py (LSTMCell.call split)"),
    # Keras GRU: columns z,r,h; bias (3H,) if reset_after=False, (2,3H) if True.
    ("keras", _G): Convention("zrn", "in_out", "single", "tf_keras layers/rnn/gru.py (x_z, x_r, x_h = split)"),
    ("keras_ra", _G): Convention("zrn", "in_out", "double_rows", "tf_keras layers/rnn/gru.py (reset_after bias (2,3H))"),
    ("keras", _T): Convention("h", "in_out", "single", "tf_keras layers/rnn/simple_rnn.py"),
    ("keras", _R): Convention("h", "in_out", "single", "tf_keras layers/rnn/simple_rnn.py"),
    # Keras CuDNNLSTM / CuDNNGRU: slices in Keras order, each slice's bytes are cuDNN's (H, in)
    # row-major matrix (a reinterpretation, not a transpose); bias (2*G*H,) input then recurrent.
    ("keras_cudnn", _L): Convention("ifgo", "in_out", "double_flat", "tf_keras layers/rnn/cudnn_lstm.py, gru_lstm_utils.canonical_to_params(transpose_weights=False)"),
    ("keras_cudnn", _G): Convention("zrn", "in_out", "double_flat", "tf_keras layers/rnn/cudnn_gru.py (_process_batch swaps z/r for cuDNN)"),
    # Keras 1 (consume_less='cpu') LSTM: 12 tensors saved in order i, c, f, o (trainable_weights override).
    ("keras1", _L): Convention("igfo", "in_out", "single", "keras 1.2.2 keras/layers/recurrent.py (LSTM.trainable_weights)"),
    # Keras 1 GRU: 9 tensors in order z, r, h; reset before the matmul.
    ("keras1", _G): Convention("zrn", "in_out", "single", "keras 1.2.2 keras/layers/recurrent.py (GRU.build)"),
    # PyTorch nn.LSTM/GRU/RNN: weight_ih_l[k] (G*H, in), gates i,f,g,o / r,z,n, two biases.
    ("torch", _L): Convention("ifgo", "out_in", "double", "torch/nn/modules/rnn.py (LSTM docstring)"),
    ("torch", _G): Convention("rzn", "out_in", "double", "torch/nn/modules/rnn.py (GRU docstring)"),
    ("torch", _T): Convention("h", "out_in", "double", "torch/nn/modules/rnn.py (RNN docstring)"),
    ("torch", _R): Convention("h", "out_in", "double", "torch/nn/modules/rnn.py (RNN docstring)"),
    # ONNX LSTM W[iofc], GRU W[zrh], B = [Wb, Rb]; peepholes P[iof].
    ("onnx", _L): Convention("iofg", "out_in", "double", "onnx operator spec LSTM (W[iofc])"),
    ("onnx", _G): Convention("zrn", "out_in", "double", "onnx operator spec GRU (W[zrh])"),
    ("onnx", _T): Convention("h", "out_in", "double", "onnx operator spec RNN"),
    ("onnx", _R): Convention("h", "out_in", "double", "onnx operator spec RNN"),
    # TF1 LSTMCell / BasicLSTMCell / LSTMBlockCell / CudnnCompatibleLSTMCell: kernel (I+H, 4H)
    # columns i,j,f,o; one bias; forget_bias added at run time.
    ("tf1", _L): Convention("igfo", "in_out", "single", "tensorflow rnn_cell_impl.py LSTMCell.call (i, j, f, o = split)"),
    # TF1 GRUCell gates/kernel (I+H, 2H) columns r,u; candidate kernel separate.
    ("tf1_gates", _G): Convention("rz", "in_out", "single", "tensorflow rnn_cell_impl.py GRUCell.call (r, u = split)"),
    ("tf1", _T): Convention("h", "in_out", "single", "tensorflow rnn_cell_impl.py BasicRNNCell"),
    ("tf1", _R): Convention("h", "in_out", "single", "tensorflow rnn_cell_impl.py BasicRNNCell"),
    # TFLite UNIDIRECTIONAL_SEQUENCE_LSTM: one (H, in) tensor per gate, inputs 1-4 input_to_{input,forget,cell,
    # output}_weights, 5-8 recurrent_to_*, 12-15 one bias per gate (stacked in that order: i,f,c,o).
    ("tflite", _L): Convention("ifgo", "out_in", "single", "tensorflow/lite/kernels/lstm_shared.h (input tensor indices 1-8, 12-15)"),
    # Flax linen/NNX cells: per-gate Dense kernels (in, H) stacked in gate order (NNX fused (in, G*H) the same);
    # LSTM bias on the hidden side only (b_hh), GRU biases ir/iz/in (b_ih) and hn (b_hh[n]).
    ("flax", _L): Convention("ifgo", "in_out", "double", "flax/linen/recurrent.py LSTMCell (ii/if/ig/io, hi/hf/hg/ho), flax/nnx/nn/recurrent.py OptimizedLSTMCell (i, f, g, o = split)"),
    ("flax", _G): Convention("rzn", "in_out", "double", "flax/linen/recurrent.py GRUCell (ir/iz/in, hr/hz/hn), flax/nnx/nn/recurrent.py GRUCell (r, z, n)"),
    ("flax", _T): Convention("h", "in_out", "double", "flax/linen/recurrent.py SimpleCell (i, h)"),
    # Haiku hk.LSTM: linear/w (I+H, 4H) rows input then hidden, columns i,g,f,o, one bias, +1 on f at run time;
    # hk.GRU: w_i (I, 3H), w_h (H, 3H) columns z,r,a, one bias, h' = (1-z) h + z a (z negated on reading:
    # conventions/haiku_params); hk.VanillaRNN: linear (I, H) + linear_1 (H, H), ReLU, two biases.
    ("haiku", _L): Convention("igfo", "in_out", "single", "haiku/_src/recurrent.py v0.0.17 LSTM.__call__ (i, g, f, o = jnp.split(gated, 4); f + 1)"),
    ("haiku", _G): Convention("zrn", "in_out", "single", "haiku/_src/recurrent.py v0.0.17 GRU.__call__ (zr_x, a_x; z, r = split; (1 - z) * state + z * a)"),
    ("haiku", _R): Convention("h", "in_out", "double", "haiku/_src/recurrent.py v0.0.17 VanillaRNN (relu(input_to_hidden(x) + hidden_to_hidden(h)))"),
    # Equinox eqx.nn.LSTMCell weight_ih (4H, I), weight_hh (4H, H), one bias, split i,f,g,o; GRUCell (3H, I),
    # bias (3H,) on the input side and bias_n (H,) inside reset * (W_hn h + bias_n): MLX's b/bhn layout.
    ("equinox", _L): Convention("ifgo", "out_in", "single", "equinox/nn/_rnn.py v0.13.8 LSTMCell.__call__ (i, f, g, o = jnp.split(lin, 4))"),
    ("equinox", _G): Convention("rzn", "out_in", "b_bhn", "equinox/nn/_rnn.py v0.13.8 GRUCell.__call__ (reset, inp, new; bias_n)"),
    # cuDNN opaque buffer: linLayerID order (0..G-1 input, G..2G-1 recurrent), (H, in) row-major.
    ("cudnn", _L): Convention("ifgo", "out_in", "double", "cuDNN cudnnGetRNNLinLayerMatrixParams doc (linLayerID 0-3 i,f,c,o)"),
    ("cudnn", _G): Convention("rzn", "out_in", "double", "cuDNN cudnnGetRNNLinLayerMatrixParams doc (linLayerID 0-2 r,z,n)"),
    ("cudnn", _T): Convention("h", "out_in", "double", "cuDNN doc"),
    ("cudnn", _R): Convention("h", "out_in", "double", "cuDNN doc"),
    # OpenVINO LSTMSequence-5 W [D, 4H, I] gates f,i,c,o, one summed B; GRUSequence-5 z,r,h, B 3H summed or
    # 4H [z, r summed; h input; hn recurrent] under linear_before_reset; RNNSequence-5 one block.
    ("openvino", _L): Convention("figo", "out_in", "single", "OpenVINO opset spec LSTMSequence-5 (gate order f, i, c, o)"),
    ("openvino", _G): Convention("zrn", "out_in", "single", "OpenVINO opset spec GRUSequence-5 (z, r, h; linear_before_reset B 4H)"),
    ("openvino", _T): Convention("h", "out_in", "single", "OpenVINO opset spec RNNSequence-5"),
    ("openvino", _R): Convention("h", "out_in", "single", "OpenVINO opset spec RNNSequence-5 (activations relu)"),
    # PaddlePaddle nn.LSTM/GRU/SimpleRNN cells: weight_ih (G*H, in), x @ W.T, i,f,g,o / r,z,n, two biases;
    # weight_ho (H, P) is the transpose of torch's weight_hr (pdparams_read).
    ("paddle", _L): Convention("ifgo", "out_in", "double", "paddle/nn/layer/rnn.py 3.3.1 (LSTMCell.forward: chunked_gates i, f, c, o)"),
    ("paddle", _G): Convention("rzn", "out_in", "double", "paddle/nn/layer/rnn.py 3.3.1 (GRUCell.forward: x_r, x_z, x_c)"),
    ("paddle", _T): Convention("h", "out_in", "double", "paddle/nn/layer/rnn.py 3.3.1 (SimpleRNNCell)"),
    ("paddle", _R): Convention("h", "out_in", "double", "paddle/nn/layer/rnn.py 3.3.1 (SimpleRNNCell, activation='relu')"),
    # MLX nn.LSTM Wx (4H, I) split i,f,g,o, one bias; nn.GRU Wx (3H, I) r,z,n, b (3H) + bhn (H); nn.RNN Wxh.
    # MLX < 0.18 stored the transpose (in, G*H): the reader detects it from shapes (mlx_read).
    ("mlx", _L): Convention("ifgo", "out_in", "single", "mlx/nn/layers/recurrent.py v0.32.4 (LSTM.__call__ split i, f, g, o)"),
    ("mlx", _G): Convention("rzn", "out_in", "b_bhn", "mlx/nn/layers/recurrent.py v0.32.4 (GRU: x_rz, x_n; b, bhn)"),
    ("mlx", _T): Convention("h", "out_in", "single", "mlx/nn/layers/recurrent.py v0.32.4 (RNN)"),
    ("mlx", _R): Convention("h", "out_in", "single", "mlx/nn/layers/recurrent.py v0.32.4 (RNN, nonlinearity=relu)"),
}


def convention(family: str, cell: Cell) -> Convention:
    """Return the :class:`Convention` of ``family`` for ``cell``.

    Raises:
        KeyError: no such entry (a programming error, not a user error).
    """
    return TABLE[(family, cell)]



def reorder(blocks: np.ndarray, src: str, dst: str, axis: int = 0, *, turn=np.ascontiguousarray) -> np.ndarray:
    """Reorder the ``len(src)`` equal gate blocks of ``blocks`` along ``axis`` from ``src`` to ``dst``.

    A pure permutation: the result is bit-identical element by element (C-contiguous; ``blocks``
    itself when it is C-contiguous and ``src == dst``, else a new array). ``turn``: how a non-contiguous
    (transposed) matrix is made C-contiguous (plain numpy; :mod:`rnnconvert.speed.transpose` passes a faster,
    bit-exact one).

    Raises:
        ValueError: ``src`` and ``dst`` are not permutations of each other, or the axis length is
            not a multiple of the number of gates.
    """
    if sorted(src) != sorted(dst):
        raise ValueError(f"gate orders {src!r} and {dst!r} are not permutations of each other")
    n = blocks.shape[axis]
    if n % len(src):
        raise ValueError(f"axis of length {n} does not split into {len(src)} gate blocks")
    if src == dst:
        return turn(blocks)
    if axis == 0 and blocks.ndim == 2 and not blocks.flags.c_contiguous:
        blocks = turn(blocks)  # turn first, then move whole row blocks
    parts = dict(zip(src, np.split(blocks, len(src), axis=axis)))
    return np.ascontiguousarray(np.concatenate([parts[g] for g in dst], axis=axis))


def to_canonical(mat: np.ndarray, conv: Convention, cell: Cell, *, turn=np.ascontiguousarray) -> np.ndarray:
    """Turn a matrix stored under ``conv`` into canonical ``(G*H, in)`` in canonical gate order.

    Only transposes and block permutations: bit-exact.
    """
    m = mat.T if conv.orientation == "in_out" else mat
    return reorder(m, conv.gate_order, CANONICAL[cell], axis=0, turn=turn)


def from_canonical(mat: np.ndarray, conv: Convention, cell: Cell, *, turn=np.ascontiguousarray) -> np.ndarray:
    """Inverse of :func:`to_canonical`: canonical ``(G*H, in)`` into the layout of ``conv``."""
    m = reorder(mat, CANONICAL[cell], conv.gate_order, axis=0, turn=turn)
    return turn(m.T) if conv.orientation == "in_out" else m


def vec_to_canonical(vec: np.ndarray, conv: Convention, cell: Cell) -> np.ndarray:
    """Reorder a ``(G*H,)`` bias vector stored under ``conv`` into canonical gate order."""
    return reorder(vec, conv.gate_order, CANONICAL[cell], axis=0)


def vec_from_canonical(vec: np.ndarray, conv: Convention, cell: Cell) -> np.ndarray:
    """Reorder a canonical ``(G*H,)`` vector into the gate order of ``conv``."""
    return reorder(vec, CANONICAL[cell], conv.gate_order, axis=0)


def gate_slice(cell: Cell, gate: str, hidden: int) -> slice:
    """Rows of gate ``gate`` (canonical letter) in a canonical ``(G*H, ...)`` array."""
    k = CANONICAL[cell].index(gate)
    return slice(k * hidden, (k + 1) * hidden)


def gate_moves(src: str, dst: str, hidden: int) -> list[tuple[slice, slice]]:
    """``(rows of a gate in a src-ordered stack, its rows in a dst-ordered stack)`` for each gate block of
    ``hidden`` rows: the moves :func:`reorder` makes, for code that moves blocks piece by piece."""
    if sorted(src) != sorted(dst):
        raise ValueError(f"gate orders {src!r} and {dst!r} are not permutations of each other")
    return [(slice(j * hidden, (j + 1) * hidden), slice(dst.index(g) * hidden, (dst.index(g) + 1) * hidden))
            for j, g in enumerate(src)]


