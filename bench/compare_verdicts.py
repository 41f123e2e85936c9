"""Same verdicts, same numbers: run verification of one set of (source, written file) pairs with two checkouts of
rnnconvert and compare every field of the JSON reports (:meth:`rnnconvert.verify.engine.VerifyReport.to_dict`)
but the timing (``seconds``).

For a change of the verification engine that must not change behaviour (issue #38: rnnconvert/verify/engine.py
split into parts)::

    python bench/compare_verdicts.py prepare /tmp/cv/cases            # written files, once (this checkout)
    python bench/compare_verdicts.py run /work/main /tmp/cv/cases /tmp/cv/main.json
    python bench/compare_verdicts.py run .          /tmp/cv/cases /tmp/cv/branch.json
    python bench/compare_verdicts.py diff /tmp/cv/main.json /tmp/cv/branch.json

``prepare`` converts each source of :data:`CASES` with ``--no-verify`` into the case folder, writes the torch
sources it needs with torch (seeded, gate-distinct), and the mutated files of :data:`MUTATIONS` (the slips of
tests/verify/test_verify_mutations.py: a gate-block swap, a bias nudge, directions swapped), so that both checkouts
judge the very same bytes. ``run`` imports the given checkout's package (``sys.path[0]``, in a child process) and
records, per case, ``api.verify`` (in-memory source) and ``api.convert`` (the conversion's own verification,
streamed where the formats allow) as JSON, or the error's class and message. ``diff`` prints every difference
and the counts; exit 1 when any. Cost: a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"

#: (name, source relative to fixtures/ (or ``torch:NAME`` made by :func:`_torch_sources`), written file name)
CASES: list[tuple[str, str, str]] = [
    ("loose_bidi_gru-onnx", "loose/keras_bidi_gru_before.h5", "m.onnx"),
    ("loose_bidi_gru-h5", "loose/keras_bidi_gru_before.h5", "m.h5"),
    ("loose_rnn_stack-onnx", "loose/keras_simple_rnn_stack.h5", "m.onnx"),
    ("loose_tf1_gru_chaotic-onnx", "loose/tf1_gru_chaotic", "m.onnx"),
    ("loose_tf1_gru_stack-onnx", "loose/tf1_gru_stack.pb", "m.onnx"),
    ("keras_lstm-pt", "keras/lstm.h5", "m.pt"),
    ("keras_lstm-npz", "keras/lstm.h5", "m.npz"),
    ("keras_bidi_concat-onnx", "keras/bidi_lstm_concat.h5", "m.onnx"),
    ("keras_bidi_gru_sum-pt", "keras/bidi_gru_sum.h5", "m.pt"),
    ("keras_cudnn_lstm-onnx", "keras/cudnn_lstm.h5", "m.onnx"),
    ("keras_cudnn_gru-pt", "keras/cudnn_gru.h5", "m.pt"),
    ("keras_gru_before-onnx", "keras/gru_reset_before.h5", "m.onnx"),
    ("keras_gru_after-keras", "keras/gru_reset_after.h5", "m.keras"),
    ("keras_hard_sigmoid-onnx", "keras/lstm_hard_sigmoid.h5", "m.onnx"),
    ("keras_go_backwards-onnx", "keras/lstm_go_backwards.h5", "m.onnx"),
    ("keras_stack-onnx", "keras/stack_lstm_gru_rnn.h5", "m.onnx"),
    ("keras_stack-h5", "keras/stack_lstm_gru_rnn.h5", "m.h5"),
    ("keras_seq_gru_lstm-pt", "keras/sequential_gru_lstm.h5", "m.pt"),
    ("keras_simple_relu-pt", "keras/simple_rnn_relu.h5", "m.pt"),
    ("keras_nobias-onnx", "keras/lstm_nobias.h5", "m.onnx"),
    ("keras1_lstm_gru-onnx", "keras/keras1_lstm_gru_weights.h5", "m.onnx"),
    ("mycroft-onnx", "realworld/mycroft-precise-gru/hey-mycroft.net", "m.onnx"),
    ("textgen-pt", "realworld/textgenrnn-reddit-cudnnlstm/reddit_rarepuppers_politics.hdf5", "m.pt"),
    ("torch_lstm_stack_bi-onnx", "torch:lstm_stack_bi", "m.onnx"),
    ("torch_gru_stack-onnx", "torch:gru_stack", "m.onnx"),
    ("torch_lstm_stack_bi-keras", "torch:lstm_stack_bi", "m.keras"),
    ("torch_gru_stack-npz", "torch:gru_stack", "m.npz"),
]

#: (name, case whose written file is mutated, mutation) -- every one of them must stay ``fail``
MUTATIONS: list[tuple[str, str, str]] = [
    ("mut_textgen_swap_if", "textgen-pt", "swap01"),
    ("mut_textgen_nudge_bias", "textgen-pt", "nudge"),
    ("mut_bidi_gru_dirs", "keras_bidi_gru_sum-pt", "dirs"),
    ("mut_torch_gru_stack_swap", "torch_gru_stack-npz", "swap01"),
]


def _torch_sources(out: Path) -> None:
    import numpy as np
    import torch

    torch.manual_seed(0)
    for name, mod in (("lstm_stack_bi", torch.nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True)),
                      ("gru_stack", torch.nn.GRU(3, 6, num_layers=3, batch_first=True))):
        sd = mod.state_dict()
        rng = np.random.default_rng(1)
        for v in sd.values():  # gate-distinct: each gate block its own scale
            v.mul_(torch.from_numpy(rng.uniform(0.5, 1.5, v.shape).astype(np.float32)))
        torch.save(sd, out / f"{name}.pt")


def _mutate(path: Path, how: str, out: Path) -> None:
    import numpy as np
    import torch

    if path.suffix == ".pt":
        sd = {k: v.numpy().copy() for k, v in torch.load(path, weights_only=True).items()}
    else:
        sd = dict(np.load(path))
    keys = sorted(sd)
    if how == "swap01":  # the first two gate blocks of the first weight_ih and weight_hh
        hh = next(k for k in keys if "hh" in k and sd[k].ndim == 2)
        h = min(sd[hh].shape)  # the hidden size: W_hh is (gates * H, H) or its transpose
        for k in [k for k in keys if sd[k].ndim == 2 and ("hh" in k or "ih" in k)][:2]:
            w = sd[k] if sd[k].shape[0] > h or sd[k].shape[0] != sd[k].shape[1] else sd[k]
            w[:h], w[h:2 * h] = w[h:2 * h].copy(), w[:h].copy()
    elif how == "nudge":
        k = next(k for k in keys if "bias" in k or k.endswith("b_ih"))
        sd[k][0] += np.float32(1e-3 * float(np.abs(sd[k]).max()))
    elif how == "dirs":
        for k in [k for k in keys if not k.endswith("_reverse")]:
            if k + "_reverse" in sd:
                sd[k], sd[k + "_reverse"] = sd[k + "_reverse"], sd[k]
    if path.suffix == ".pt":
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, out)
    else:
        np.savez(out, **sd)


def prepare(cases: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from rnnconvert import api

    cases.mkdir(parents=True, exist_ok=True)
    _torch_sources(cases)
    for name, src, out in CASES:
        s = cases / f"{src[6:]}.pt" if src.startswith("torch:") else FIX / src
        d = cases / name / out
        d.parent.mkdir(exist_ok=True)
        if not d.exists():
            try:
                api.convert(s, d, verify=None)
            except Exception as e:  # noqa: BLE001 -- a case the writer refuses is left out (both runs skip it)
                print(f"{name}: left out ({type(e).__name__}: {e})")
                d.parent.rmdir()
    for name, base, how in MUTATIONS:
        d = next((cases / base).iterdir())
        (cases / name).mkdir(exist_ok=True)
        _mutate(d, how, cases / name / d.name)


def _source(cases: Path, name: str) -> Path:
    src = dict((n, s) for n, s, _ in CASES)[name]
    return cases / f"{src[6:]}.pt" if src.startswith("torch:") else FIX / src


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k != "seconds"}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def record(cases: Path) -> dict:
    """In the child: every case's reports (``sys.path[0]`` is the checkout)."""
    import tempfile

    from rnnconvert import api

    out = {"package": api.__file__}
    pairs = [(n, _source(cases, n), next((cases / n).iterdir())) for n, _, _ in CASES if (cases / n).is_dir()]
    pairs += [(n, _source(cases, base), next((cases / n).iterdir())) for n, base, _ in MUTATIONS]
    for name, src, dst in pairs:
        try:
            out[f"{name}/verify"] = _strip(api.verify(src, dst).to_dict())
        except Exception as e:  # noqa: BLE001 -- the error is the answer
            out[f"{name}/verify"] = f"{type(e).__name__}: {e}"
        if name.startswith("mut_"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                rep = api.convert(src, Path(tmp) / dst.name, accept_inconclusive=True)
                out[f"{name}/convert"] = _strip(rep.verification.to_dict())
            except Exception as e:  # noqa: BLE001
                out[f"{name}/convert"] = f"{type(e).__name__}: {e}".replace(tmp, "TMP")
        print(name, flush=True)
    return out


def run(checkout: Path, cases: Path, dest: Path) -> None:
    code = (f"import sys, json, runpy; sys.path.insert(0, {str(checkout.resolve())!r}); "
            f"record = runpy.run_path({__file__!r})['record']; from pathlib import Path; "
            f"json.dump(record(Path({str(cases.resolve())!r})), open({str(dest)!r}, 'w'), indent=1, sort_keys=True)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(checkout))


def diff(a: Path, b: Path) -> int:
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    da.pop("package"), db.pop("package")
    same = bad = 0
    for k in sorted(set(da) | set(db)):
        if da.get(k) == db.get(k):
            same += 1
        else:
            bad += 1
            print(f"DIFFERS {k}:\n  {json.dumps(da.get(k))[:2000]}\n  {json.dumps(db.get(k))[:2000]}")
    verdicts = {k: (v["verdict"] if isinstance(v, dict) else v.split(":")[0]) for k, v in da.items()}
    print(f"{same} identical, {bad} different, of {len(set(da) | set(db))} reports; verdicts: "
          + ", ".join(f"{v} {list(verdicts.values()).count(v)}" for v in sorted(set(verdicts.values()))))
    return 1 if bad else 0


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "prepare":
        prepare(Path(args[0]))
    elif cmd == "run":
        run(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "diff":
        sys.exit(diff(Path(args[0]), Path(args[1])))
    else:
        sys.exit(__doc__)
