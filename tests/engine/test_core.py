"""The canonical model and the numpy reference against PyTorch's own kernels.

torch computes the expected outputs (a real framework); rnnconvert reads the file torch wrote.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnconvert
from rnnconvert.core import reference
from rnnconvert.core.gates import CANONICAL, reorder
from rnnconvert.core.model import Cell

from conftest import torch_rnn

torch = pytest.importorskip("torch")

SPECS = [
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 3}),
    ("LSTM", {"num_layers": 3, "bias": False}),
    ("GRU", {}),
    ("GRU", {"num_layers": 2, "bidirectional": True}),
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2}),
]


@pytest.mark.parametrize("kind,kw", SPECS, ids=[f"{k}-{'-'.join(f'{a}{b}' for a, b in kw.items()) or 'plain'}"
                                                for k, kw in SPECS])
def test_reference_matches_torch(tmp_path, kind, kw):
    mod = torch_rnn(kind, 5, 6, **kw)
    src = tmp_path / "m.pt"
    torch.save({f"enc.{k}": v for k, v in mod.state_dict().items()}, src)
    x = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(np.float32)
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].double().numpy()
    opts = {"nonlinearity": "relu"} if kw.get("nonlinearity") == "relu" else {}
    layer = rnnconvert.load(src, **opts).layer("enc")
    got = reference.forward(layer, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("kind,kw", SPECS[:6], ids=[str(i) for i in range(6)])
def test_pt_round_trip_is_bit_exact(tmp_path, kind, kw):
    mod = torch_rnn(kind, 4, 5, **kw)
    src, dst = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, src)
    rep = rnnconvert.convert(src, dst)
    assert rep.verification.ok
    a, b = torch.load(src, weights_only=True), torch.load(dst, weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_reorder_is_a_permutation():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((12, 5)).astype(np.float32)
    back = reorder(reorder(m, "ifgo", "iofg"), "iofg", "ifgo")
    assert np.array_equal(back, m)
    with pytest.raises(ValueError):
        reorder(m, "ifgo", "ifgx")
    assert CANONICAL[Cell.GRU] == "rzn"


def test_validate_rejects_wrong_shapes(tmp_path):
    mod = torch_rnn("LSTM", 4, 5)
    src = tmp_path / "a.pt"
    sd = dict(mod.state_dict())
    sd["weight_hh_l0"] = sd["weight_hh_l0"][:, :4]
    torch.save(sd, src)
    with pytest.raises(rnnconvert.FormatError):
        rnnconvert.load(src)


def test_verification_catches_a_wrong_file(tmp_path):
    """Swap two gate blocks in a written file: torch then computes something else and verify says so."""
    mod = torch_rnn("LSTM", 4, 5)
    src, dst = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({f"rnn.{k}": v for k, v in mod.state_dict().items()}, src)
    rnnconvert.convert(src, dst)
    sd = torch.load(dst, weights_only=True)
    w = sd["rnn.weight_ih_l0"]
    sd["rnn.weight_ih_l0"] = torch.cat([w[5:10], w[:5], w[10:]])  # i <-> f
    torch.save(sd, dst)
    rep = rnnconvert.verify(src, dst)
    assert not rep.ok
    assert rep.layers[0].max_abs_err > 100 * rep.layers[0].tolerance


@pytest.mark.parametrize("family,cell", [("keras", Cell.LSTM), ("keras", Cell.GRU), ("onnx", Cell.LSTM)])
def test_large_kernels_take_the_tiled_transpose_bit_exactly(family, cell):
    """Kernels above 65536 elements go through the tiled copy of speed.transpose.contiguous (issue 7): the
    canonical matrix must equal, bit for bit, the file's gate blocks picked by hand (Keras: column block j of the
    (in, G*H) kernel, transposed), with odd sizes so that the last tile is partial; and the plain turns of
    core.gates give the same bits."""
    from rnnconvert.core import gates
    from rnnconvert.speed import transpose

    G, H, I = cell.gates, 67, 401
    conv = gates.convention(family, cell)
    rng = np.random.default_rng(5)
    if conv.orientation == "in_out":
        k = rng.standard_normal((I, G * H)).astype(np.float32)
        blocks = {g: k[:, j * H:(j + 1) * H].T for j, g in enumerate(conv.gate_order)}
    else:
        k = np.asfortranarray(rng.standard_normal((G * H, I)).astype(np.float32))  # a transposed view's layout
        blocks = {g: k[j * H:(j + 1) * H] for j, g in enumerate(conv.gate_order)}
    out = transpose.to_canonical(k, conv, cell)
    assert out.flags.c_contiguous and k.size > 65536
    assert np.array_equal(out, np.concatenate([blocks[g] for g in CANONICAL[cell]]))
    assert np.array_equal(gates.to_canonical(k, conv, cell), out)
    back = transpose.from_canonical(out, conv, cell)
    assert np.array_equal(back, k) and np.array_equal(gates.from_canonical(out, conv, cell), k)
