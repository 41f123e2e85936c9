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


def assert_within_float32_spread(layer, x, y, *, last_step: bool = False, what: str = "output"):
    """Assert that ``y`` -- a float32 evaluation of ``layer`` on ``x`` by code that is not ours (a
    framework, or an oracle file computed on another machine) -- is what verification would accept.

    Why not a fixed tolerance: on an ill-conditioned layer (the Mycroft GRU: ``activation='linear'``,
    inputs up to 36, outputs up to 66) two float32 evaluations of the same equations differ by up to
    ~5e-4 relative, and by how much depends on the order of operations, which the CPU's BLAS kernels
    choose (tf_keras missed a 1e-5 bound by 3.4e-2 on another CPU). So the bound is measured here, on
    this CPU, as verification's full-sequence comparison measures it
    (``rnnconvert.engine.verify.sequence_tolerance``):
    ``1e-5 * max(1, max|y64|) + 2 * max|y64 - y32|``, with ``y64`` the numpy reference
    (:func:`rnnconvert.reference.forward`) in float64 and ``y32`` the float32 evaluation farther from
    it of the two verification may use: the numpy reference in float32, and for a layer read from a
    Keras file the Keras equations on its stored tensors (``keras_math.source_forward``, Keras' order
    of operations). A layout slip (swapped gates, a dropped bias) moves the output by O(1) of its
    scale, far outside that bound (``tests/test_realworld_keras.py`` checks that it catches a 1%
    nudge).

    ``last_step``: ``y`` is the last step only (a layer with ``return_sequences=False``)."""
    import numpy as np

    from rnnconvert.core import reference
    from rnnconvert.formats.keras import keras_math
    from rnnconvert.engine.verify import sequence_tolerance

    y64 = reference.forward(layer, np.asarray(x, np.float64))
    y32s = [reference.forward(layer, np.asarray(x, np.float32), np.float32)]
    if layer.source.get("raw") is not None and layer.source.get("family") == "keras":
        y32s.append(keras_math.source_forward(layer, np.asarray(x, np.float32), np.float32))
    if last_step:
        y64, y32s = y64[:, -1], [v[:, -1] for v in y32s]
    y32 = max((np.asarray(v, np.float64) for v in y32s), key=lambda v: float(np.abs(v - y64).max()))
    tol = sequence_tolerance(y64, y32, 1e-5)
    err = float(np.abs(np.asarray(y, np.float64) - y64).max())
    assert err <= tol, (f"{what} of '{layer.name}' differs from the float64 reference by {err:.3g}, "
                        f"more than verification's bound {tol:.3g}")
    return err, tol
