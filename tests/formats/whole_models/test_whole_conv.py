"""Conv2D, 2-D pooling and TensorFlow's 'same' padding at strides > 1 in whole-model ONNX graphs and ``.pt2``
programs (issue #30).

Oracle: tf_keras 2.21 (``fixtures/gen_whole_conv.py`` made both fixtures and their outputs ``out__<i>`` on
``in__<name>``; every 'same' pad total of ``conv_strided_same`` is odd, so TensorFlow's split -- the extra zero at
the end -- is visible); targets: onnxruntime on the written graph, torch on the loaded program. Tolerance
``2e-5 * max(1, max|ref|)``. The mutation tests (a transposed kernel, the odd pad at the start, an average over the
padding) must fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import rnnconvert  # noqa: E402
from rnnconvert.formats.keras import keras_whole  # noqa: E402
from rnnconvert.whole.formats.onnx import model_write  # noqa: E402

from conftest import whole_close as _close, whole_feeds as _feeds  # noqa: E402
from conftest import whole_graph as _graph, whole_model as _full  # noqa: E402
from conftest import assert_whole_outputs, whole_mutated_check, whole_onnx_outputs, whole_pt2_program  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "whole_conv"
CONV = sorted(FIX.glob("conv_*.h5"))


@pytest.mark.parametrize("path", CONV, ids=lambda p: p.stem)
def test_onnx_graph_matches_tf_keras(path):
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    outs = whole_onnx_outputs(g, _feeds(g, z))
    assert len(outs) == len([k for k in z.files if k.startswith("out__")])
    assert_whole_outputs(outs, z, path.name)


@pytest.mark.parametrize("path", CONV, ids=lambda p: p.stem)
def test_pt2_program_matches_tf_keras(path, tmp_path):
    torch = pytest.importorskip("torch")
    g = _graph(path)
    prog = whole_pt2_program(g, tmp_path)
    z = np.load(path.with_suffix(".npz"))
    assert_whole_outputs(prog(*[torch.from_numpy(v) for v in _feeds(g, z).values()]), z, path.name)


def test_pt2_same_pads_follow_the_length(tmp_path):
    """The .pt2 program's 'same' pads are computed from the length it is given (TensorFlow's rule), not fixed at
    export: tf_keras' outputs at other lengths (even and odd) from the same program."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("tf_keras")
    from rnnconvert.whole.formats.torch import pt2_write

    path = FIX / "conv_strided_same.h5"
    g = _graph(path)
    prog = pt2_write.export(g).module()
    src = keras_whole.source_model(str(path), _full(path)[1].config)
    rng = np.random.default_rng(7)
    for steps in (26, 40, 61):
        x = rng.standard_normal((2, steps, 4)).astype(np.float32)
        assert _close(prog(torch.from_numpy(x))[0].detach().numpy(), np.asarray(src(x))), steps


def test_conv2d_layers_are_native_onnx_ops():
    ops = [n.op_type for n in model_write.build(_graph(FIX / "conv_crnn.h5")).graph.node]
    assert ops.count("Conv") == 3 and "MaxPool" in ops and "AveragePool" in ops and "LSTM" in ops


# ----------------------------------------------------------------------------- mutations: the check must FAIL
def _mutated_check(path, mutate):
    return whole_mutated_check(path, mutate)


def _attr(node, name, value):
    from onnx import helper

    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep + [helper.make_attribute(name, value)])


@pytest.mark.parametrize("kind", ["transposed_kernel", "pad_at_start", "avg_counts_padding", "flatten_nchw"])
def test_conv_mutations_fail(kind):
    pytest.importorskip("tf_keras")
    path = FIX / "conv_crnn.h5"
    if kind == "transposed_kernel":  # conv_c's 3x3 kernel with its spatial axes swapped (HWIO read as WHIO)
        def mutate(m):
            from onnx import numpy_helper

            t = next(t for t in m.graph.initializer if t.name.startswith("conv_c.kernel"))
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(t).transpose(0, 1, 3, 2)),
                                               t.name))
    elif kind == "pad_at_start":  # TensorFlow puts the odd 'same' pad at the end; SAME_LOWER at the start
        def mutate(m):
            for n in m.graph.node:
                for a in n.attribute:
                    if a.name == "auto_pad" and a.s == b"SAME_UPPER":
                        a.s = b"SAME_LOWER"
    elif kind == "avg_counts_padding":  # TensorFlow averages over the valid elements only
        def mutate(m):
            for n in m.graph.node:
                if n.op_type == "AveragePool":
                    _attr(n, "count_include_pad", 1)
    else:  # Flatten of the NCHW tensor (the channels_first order) instead of channels_last
        def mutate(m):
            for n in m.graph.node:
                if n.op_type == "Flatten":
                    src = n.input[0]
                    perm = next(p for p in m.graph.node if p.output[0] == src)
                    assert perm.op_type in ("Identity", "Transpose")
                    from onnx import helper

                    t = src + "__nchw"
                    m.graph.node.append(helper.make_node("Transpose", [src], [t], perm=[0, 3, 1, 2]))
                    n.input[0] = t
            from onnx import helper as h  # keep the graph topologically sorted
            nodes = list(m.graph.node)
            order = []
            made = {i.name for i in m.graph.input} | {i.name for i in m.graph.initializer}
            while nodes:
                for nd in list(nodes):
                    if all(i == "" or i in made for i in nd.input):
                        order.append(nd)
                        made |= set(nd.output)
                        nodes.remove(nd)
            del m.graph.node[:]
            m.graph.node.extend(order)
            del h
    if kind == "pad_at_start":
        path = FIX / "conv_strided_same.h5"
    checks = _mutated_check(path, mutate)
    assert any(c.verdict == "fail" for c in checks), [(c.name, c.max_abs_err) for c in checks]


def test_pt2_mutated_same_pads_fail():
    """The .pt2 program with TensorFlow's split reversed (the odd pad at the start) no longer gives tf_keras'
    outputs: the oracle comparison decides the split."""
    torch = pytest.importorskip("torch")
    from rnnconvert.whole.formats.torch import pt2_write

    path = FIX / "conv_strided_same.h5"
    g = _graph(path)
    z = np.load(path.with_suffix(".npz"))
    right = pt2_write.tf_same_pads
    try:
        pt2_write.tf_same_pads = lambda t, n, k, s: tuple(reversed(right(t, n, k, s)))
        y = pt2_write.build_module(g)(*[torch.from_numpy(v) for v in _feeds(g, z).values()])[0]
    finally:
        pt2_write.tf_same_pads = right
    assert not _close(y.detach().numpy(), z["out__0"])
