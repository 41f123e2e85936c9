"""Shared test helpers: paths to fixtures and to the third-party files in fixtures/realworld."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REALWORLD = FIXTURES / "realworld"
#: Unlicensed third-party files that are not redistributed here (fixtures/realworld/README.md): only
#: where the shared collection sits beside the checkout.
SHARED_REALWORLD = ROOT.parent / "shared" / "realworld"


def manifest(family: str) -> list[dict]:
    path = FIXTURES / "manifest.json"
    if not path.exists():
        return []
    return json.loads(path.read_text()).get(family, [])


@pytest.fixture
def realworld():
    """The third-party checkpoints kept in the repository (``fixtures/realworld``)."""
    return REALWORLD


@pytest.fixture
def dinornn():
    """The DinoRNN TF2 object checkpoint: it has no license, so it is not in the repository; the tests
    that use it run where ``../shared/realworld`` sits beside the checkout and skip elsewhere."""
    d = SHARED_REALWORLD / "dinornn-gru-tf2-checkpoint"
    if not d.exists():
        pytest.skip(f"{d} is not present (unlicensed, not redistributed; see fixtures/realworld/README.md)")
    return d


def gate_distinct(rng, rows: int, cols: int, gates: int, scale: float = 0.5):
    """A ``(rows, cols)`` float32 matrix whose ``gates`` row blocks each sit in their own value range
    (block k centred on ``scale * (k - (gates-1)/2) / gates``), so any gate permutation slip shows."""
    import numpy as np

    blk = rows // gates
    out = np.empty((rows, cols), np.float32)
    for k in range(gates):
        centre = scale * (k - (gates - 1) / 2) / max(gates, 1)
        out[k * blk:(k + 1) * blk] = centre + rng.uniform(-0.1, 0.1, (blk, cols))
    return out


def torch_rnn(kind: str, input_size: int, hidden: int, *, seed: int = 0, **kw):
    """A torch nn.LSTM/GRU/RNN (batch_first) whose every parameter is gate-distinct."""
    import numpy as np
    import torch

    mod = getattr(torch.nn, kind)(input_size, hidden, batch_first=True, **kw)
    rng = np.random.default_rng(seed)
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    sd = {}
    for name, p in mod.state_dict().items():
        if p.ndim == 2:
            gg = g if p.shape[0] == g * hidden else 1
            sd[name] = torch.from_numpy(gate_distinct(rng, p.shape[0], p.shape[1], gg))
        else:
            sd[name] = torch.from_numpy(gate_distinct(rng, p.shape[0], 1, g)[:, 0])
    mod.load_state_dict(sd)
    return mod.eval()
