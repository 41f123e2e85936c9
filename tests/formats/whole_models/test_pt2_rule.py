"""A ``.pt2`` program of the recurrent layers alone (``--recurrent-only``, and every source without a whole model) is
judged by the per-layer rule, as an ``.onnx`` of the recurrent layers is (issue #39: no second tolerance scheme):
the ``torch_export`` runtime runs the written program whole for the short sequence and one step with the program's
own constants, and :func:`rnnconvert.verify.verdict.decide` gives the verdict.

Wrong programs are made by hand from a correct one: the program loaded by ``torch.export.load``, one of its
constants edited (a recurrent weight element x1.01, the input rows of two gates swapped, the two directions'
constants swapped), saved again by ``torch.export.save``. Each wrong program's true error is measured without
rnnconvert: the edited program run by torch (``torch.export.load(...).module()``) on the fixture's stored input
against the fixture's stored tf_keras output (fixtures made by tf_keras through ``fixtures/gen_keras.py``); a slip
counts only where that error is above 100 times the correct program's own error on the same data (measured, not
assumed). Every such slip must FAIL, every correct program must be ``ok``, and the verdicts must not change with
torch's thread count (1, 2, 3 threads: other blockings of the same float32 sums).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tf_keras")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "keras"
#: (fixture, its layer): a native LSTM (oneDNN's kernel, two directions) and a reset-before GRU (the chunked scan)
CASES = {"bidi_lstm_concat": "bidi", "gru_reset_before": "gru"}
EXTRA = "rnnconvert_inputs.txt"


def _load(path: Path):
    extra = {EXTRA: ""}
    with open(path, "rb") as fh:
        ep = torch.export.load(io.BytesIO(fh.read()), extra_files=extra)
    return ep, extra


def _true_error(path: Path, case: str) -> float:
    """max |program(x) - tf_keras(x)| on the fixture's stored input and output (no rnnconvert involved)."""
    layer = CASES[case]
    d = np.load(FIX / f"{case}.npz")
    ep, _ = _load(path)
    with torch.no_grad():
        y = ep.module()(torch.from_numpy(d[f"{layer}__in"].astype(np.float32)))[0].numpy()
    return float(np.max(np.abs(y.astype(np.float64) - d[f"{layer}__out"].astype(np.float64))))


def _edited(src: Path, dst: Path, edit) -> Path:
    """``src``'s program with ``edit(state_dict)`` applied to its constants, saved at ``dst``."""
    ep, extra = _load(src)
    with torch.no_grad():
        edit(ep.state_dict)
    with open(dst, "wb") as fh:
        torch.export.save(ep, fh, extra_files=extra)
    return dst


def _times(key: str, f: float):
    def edit(sd):
        t = sd[key]
        idx = np.unravel_index(int(torch.argmax(t.abs())), tuple(t.shape))  # its largest element
        t[idx] = t[idx] * f
    return edit


def _swap_rows(keys, H: int, a: int, b: int):
    """Gate blocks ``a`` and ``b`` (rows ``a*H:(a+1)*H``...) of each of ``keys`` swapped."""
    def edit(sd):
        for key in keys:
            t = sd[key]
            ra, rb = t[a * H:(a + 1) * H].clone(), t[b * H:(b + 1) * H].clone()
            t[a * H:(a + 1) * H], t[b * H:(b + 1) * H] = rb, ra
    return edit


def _swap_directions(prefix: str):
    def edit(sd):
        for key in [k for k in sd if k.startswith(prefix + "l0_d0_")]:
            other = key.replace("_d0_", "_d1_")
            a, b = sd[key].clone(), sd[other].clone()
            sd[key].copy_(b)
            sd[other].copy_(a)
        for key in [k for k in sd if k.startswith(prefix) and "_d" not in k[len(prefix):]]:
            t = sd[key]
            if t.shape[0] == 2:  # the stacked (D, ...) constants of the scan
                a = t[0].clone()
                t[0] = t[1]
                t[1] = a
    return edit


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each fixture converted ``--recurrent-only`` to ``.pt2`` by rnnconvert (verified on the way)."""
    out = tmp_path_factory.mktemp("pt2rule")
    got = {}
    for case in CASES:
        dst = out / f"{case}.pt2"
        rnnconvert.convert(FIX / f"{case}.h5", dst, write_opts={"recurrent_only": True})
        got[case] = dst
    return got


def _slips(written, tmp: Path) -> list[tuple[str, str, Path]]:
    b, g = "rnns.bidi.", "rnns.gru."
    made = [
        ("bidi_lstm_concat", "largest recurrent weight x1.01 (backward)", _times(b + "l0_d1_w_hh", 1.01)),
        ("bidi_lstm_concat", "input weights of gates i and f swapped", _swap_rows([b + "l0_d0_w_ih"], 3, 0, 1)),
        ("bidi_lstm_concat", "directions swapped", _swap_directions(b)),
        ("gru_reset_before", "largest recurrent weight x1.01 (scan's W_hh^T)", _times(g + "l0_whhT", 1.01)),
        ("gru_reset_before", "input weights of gates r and z swapped", _swap_rows([g + "l0_d0_w_ih"], 4, 0, 1)),
        ("gru_reset_before", "largest input weight x1.01", _times(g + "l0_d0_w_ih", 1.01)),
    ]
    return [(case, what, _edited(written[case], tmp / f"{case}_{i}.pt2", edit))
            for i, (case, what, edit) in enumerate(made)]


def _verdict(case: str, path: Path, threads: int) -> tuple[str, str]:
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rep = rnnconvert.verify(FIX / f"{case}.h5", path)
    finally:
        torch.set_num_threads(was)
    return rep.verdict, "; ".join(f"{c.name}: {c.reason}" for c in rep.layers)


def test_correct_ok_and_hand_edited_slips_fail_on_every_thread_count(written, tmp_path):
    base = {case: _true_error(p, case) for case, p in written.items()}
    for case, p in written.items():
        verdicts = {n: _verdict(case, p, n)[0] for n in (1, 2, 3)}
        assert set(verdicts.values()) == {"ok"}, (case, verdicts, _verdict(case, p, 1)[1])
    checked = 0
    for case, what, p in _slips(written, tmp_path):
        true = _true_error(p, case)
        if true <= 100 * max(base[case], 1e-9):  # not a slip on the stored data (measured, not assumed)
            continue
        checked += 1
        verdicts = {n: _verdict(case, p, n) for n in (1, 2, 3)}
        assert {v for v, _ in verdicts.values()} == {"fail"}, (case, what, true, base[case], verdicts)
    assert checked >= 5  # the slips above are slips on the stored data


def test_cli_recurrent_only_pt2_report_names_the_per_layer_rule(written):
    """The per-layer report (one step with its bound and resolution, the sequence with its tolerance), not a
    whole-model comparison of a file that holds no whole model."""
    rep = rnnconvert.verify(FIX / "gru_reset_before.h5", written["gru_reset_before"])
    assert [c.name for c in rep.layers] == ["gru"]
    c = rep.layers[0]
    assert c.verdict == "ok" and "torch.export" in c.target_route
    assert c.resolution  # the per-layer rule's resolution (docs/cli.md "Verdicts")


def _swap_stack(prefix: str):
    """Stacked layers 0 and 1 exchanged (every constant ``l0_*`` with its ``l1_*``: a bidirectional stack whose input
    is as wide as its output, so the shapes still fit)."""
    def edit(sd):
        for key in [k for k in sd if k.startswith(prefix + "l0_")]:
            other = prefix + "l1_" + key[len(prefix) + 3:]
            a, b = sd[key].clone(), sd[other].clone()
            sd[key].copy_(b)
            sd[other].copy_(a)
    return edit


def test_stacked_torch_gru_slips_fail(tmp_path):
    """A torch ``nn.GRU(6, 3, num_layers=2, bidirectional=True)`` state dict (a source without a whole model: its
    ``.pt2`` is the recurrent layers alone), made here by torch, which is also the oracle (the module run on a
    fixed input). The correct program is ``ok``; the stacked layers exchanged, or one element of layer 1's
    recurrent weights x1.01, each first shown wrong against torch's own output, FAIL."""
    torch.manual_seed(3)
    m = torch.nn.GRU(6, 3, num_layers=2, bidirectional=True, batch_first=True).eval()
    src = tmp_path / "stack.pt"
    torch.save(m.state_dict(), src)
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((3, 11, 6)).astype(np.float32))
    with torch.no_grad():
        want = m(x)[0].numpy().astype(np.float64)
    good = tmp_path / "stack.pt2"
    rnnconvert.convert(src, good)

    def true_error(path):
        ep, _ = _load(path)
        with torch.no_grad():
            y = ep.module()(x)[0].numpy().astype(np.float64)
        return float(np.max(np.abs(y - want)))

    base = true_error(good)
    assert rnnconvert.verify(src, good).verdict == "ok"
    p = "rnns.rnn."
    for i, edit in enumerate([_swap_stack(p), _times(p + "l1_whhT", 1.01)]):
        bad = _edited(good, tmp_path / f"bad{i}.pt2", edit)
        assert true_error(bad) > 100 * max(base, 1e-9), i
        rep = rnnconvert.verify(src, bad)
        assert rep.verdict == "fail", (i, [c.reason for c in rep.layers])
