"""A real PyTorch-exported ONNX model: Silero VAD (``fixtures/realworld/silero-vad/silero_vad_16k_op15.onnx``,
PyPI silero-vad 6.2.3, MIT). Its two ``LSTM`` nodes sit in the branches of an ``If`` (a sample-rate switch) and
take ``W``/``R``/``B`` computed from the stored ``nn.LSTMCell`` weights by ``Slice``+``Concat``+``Unsqueeze``
(torch's gate order to ONNX's), and their names start with ``/`` as every torch export's do. It was read as "no
LSTM, GRU or RNN node" (exit 3), and its ``.h5`` failed inside tf_keras on the name (exit 1).

The oracle is onnxruntime running the owner's own nodes: each branch's ``LSTM`` node with every node that
computes its weights, copied unchanged from the file into a small model (``X`` in, ``Y`` out, zero initial state:
the written layers start from zero) -- never rnnconvert's reading of them. The converted ``.pt`` runs in
``torch.nn.LSTM``, the ``.h5`` in tf_keras.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rnnconvert import api

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[3] / "fixtures" / "realworld" / "silero-vad" / "silero_vad_16k_op15.onnx"
NODES = ("/model/decoder/rnn/LSTM", "/model/decoder/rnn_1/LSTM")


def _owner_lstm(model, name: str):
    """A model of the owner's node ``name`` and the nodes (and outer-scope constants) computing its W, R, B."""
    from onnx import helper

    outer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}

    def branches(g):
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    yield a.g
                    yield from branches(a.g)

    sub = next(b for b in branches(model.graph) if any(n.name == name for n in b.node))
    inner = {o: n for n in sub.node for o in n.output}
    lstm = next(n for n in sub.node if n.name == name)
    nodes, init, seen, todo = [], [], set(), list(lstm.input[1:4])
    while todo:
        t = todo.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        if t in inits:
            init.append(inits[t])
            continue
        n = inner.get(t) or outer.get(t)
        nodes.append(n)
        todo += list(n.input)
    order = {id(n): i for i, n in enumerate(list(model.graph.node) + list(sub.node))}
    nodes = sorted({id(n): n for n in nodes}.values(), key=lambda n: order[id(n)])
    x_name, H = lstm.input[0], next(a.i for a in lstm.attribute if a.name == "hidden_size")
    core = helper.make_node("LSTM", list(lstm.input[:4]), ["Y"], hidden_size=H)
    graph = helper.make_graph(nodes + [core], "owner", [helper.make_tensor_value_info(x_name, 1, None)],
                              [helper.make_tensor_value_info("Y", 1, None)], init)
    return helper.make_model(graph, opset_imports=model.opset_import), x_name


@pytest.fixture(scope="module")
def owner():
    model = onnx.load(str(SRC))
    x = np.random.default_rng(7).standard_normal((40, 2, 128)).astype(np.float32)  # (T, B, I): layout 0
    out = {}
    for name in NODES:
        m, x_name = _owner_lstm(model, name)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        y = sess.run(["Y"], {x_name: x})[0]  # (T, 1, B, H)
        out[name] = (x.transpose(1, 0, 2), y[:, 0].transpose(1, 0, 2))  # batch-first
    return out


def test_the_lstm_nodes_in_if_branches_are_read(tmp_path, owner):
    ckpt = api.load(SRC)
    assert [l.name for l in ckpt.layers] == list(NODES)
    assert any("control-flow subgraphs" in n for n in ckpt.meta["notes"])
    dst = tmp_path / "vad.pt"
    api.convert(SRC, dst)
    sd = torch.load(dst, weights_only=True)
    for name, (x, want) in owner.items():
        lstm = torch.nn.LSTM(128, 128, batch_first=True)
        lstm.load_state_dict({k[len(name) + 1:]: v for k, v in sd.items() if k.startswith(name + ".")})
        with torch.no_grad():
            got = lstm(torch.from_numpy(x))[0].numpy()
        # float32 rounding of two LSTM kernels over 40 steps of outputs in (-1, 1): orders below 1e-5
        assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max()), name


def test_a_slash_named_node_writes_a_keras_h5(tmp_path, owner):
    tf_keras = pytest.importorskip("tf_keras")
    dst = tmp_path / "vad.h5"
    rep = api.convert(SRC, dst)
    assert rep.verification.verdict == "ok"
    model = tf_keras.models.load_model(dst, compile=False)
    (x, want), = [owner[NODES[0]]]
    ys = model.predict([x, x], verbose=0) if len(model.inputs) == 2 else model.predict(x, verbose=0)
    got = np.asarray(ys[0] if isinstance(ys, list) else ys)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
