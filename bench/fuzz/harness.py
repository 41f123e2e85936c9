"""Fuzz harness for rnnconvert's readers: hypothesis-driven mutations of real seed files.

Seed files per format are real files: the committed Keras fixtures (``fixtures/keras/*.h5``, made
by tf_keras), and files written here by torch (``torch.save`` zip and legacy formats, a
``torch.jit.script`` archive), by safetensors, and by rnnconvert's own ONNX/npz writers from a
torch-made checkpoint. Each case picks a seed and applies a hypothesis-drawn list of mutations
(bit flips, byte overwrites, truncation, insertion, deletion, chunk copies, NaN/Inf floats,
huge 32/64-bit integers for declared sizes), writes the result to a file and calls
:func:`rnnconvert.api.load` on it.

Outcome per case: ``ok`` (read), ``refused`` (an ``RNNConvertError``), ``crash`` (any other
exception), ``hang`` (over the per-case timeout). ``wrapped`` counts refusals that only the last
line of defence in ``api.load`` turned into a ``FormatError`` (a reader let a low-level error
through: worth fixing in that reader, but not a crash for a user).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("keras_h5", "pt", "onnx", "safetensors", "npz")
EXT = {"keras_h5": ".h5", "pt": ".pt", "onnx": ".onnx", "safetensors": ".safetensors", "npz": ".npz"}
KERAS_SEEDS = ("lstm.h5", "gru_reset_after_weights.h5", "bidi_lstm_concat.h5", "simplernn.h5",
               "keras1_gpu_simplernn_weights.h5", "embedding_lstm.h5")


def _torch_ckpt_files(workdir: Path) -> dict[str, list[Path]]:
    """Write the torch-made seed files for pt/onnx/safetensors/npz into ``workdir``."""
    import torch

    from rnnconvert import api

    torch.manual_seed(0)
    out: dict[str, list[Path]] = {f: [] for f in FORMATS}
    lstm = torch.nn.LSTM(3, 4, batch_first=True, bidirectional=True)
    gru = torch.nn.GRU(2, 3, num_layers=2, batch_first=True)
    for i, mod in enumerate((lstm, gru)):
        p = workdir / f"seed{i}.pt"
        torch.save({"rnn": mod.state_dict(), "epoch": 3}, p)
        out["pt"].append(p)
        q = workdir / f"seed{i}_legacy.pt"
        torch.save(mod.state_dict(), q, _use_new_zipfile_serialization=False)
        out["pt"].append(q)
        from safetensors.numpy import save_file
        s = workdir / f"seed{i}.safetensors"
        save_file({k: v.numpy() for k, v in mod.state_dict().items()}, str(s))
        out["safetensors"].append(s)
        ckpt = api.load(p)
        for fmt in ("onnx", "npz"):
            d = workdir / f"seed{i}{EXT[fmt]}"
            api.save(ckpt, d, force=True)
            out[fmt].append(d)
    ts = workdir / "seed_ts.pt"
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())).save(str(ts))
    # a scripted module holding an LSTM's weights as a plain module is enough for the archive layout
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(3, 4, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]
    ts2 = workdir / "seed_ts2.pt"
    try:
        torch.jit.script(Holder()).save(str(ts2))
        out["pt"].append(ts2)
    except Exception:  # pragma: no cover - TorchScript availability varies
        pass
    out["pt"].append(ts)
    return out


def seed_files(workdir: Path, fmt: str | None = None) -> dict[str, list[bytes]]:
    """The seed bytes per format (workdir receives the torch-written files; torch is not imported
    when only ``fmt='keras_h5'`` is asked for, which keeps the forked HDF5 reads cheap)."""
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = {f: [] for f in FORMATS}
    for name in KERAS_SEEDS:
        p = ROOT / "fixtures" / "keras" / name
        if p.exists():
            seeds["keras_h5"].append(p.read_bytes())
    if fmt == "keras_h5":
        return seeds
    for fmt, paths in _torch_ckpt_files(workdir).items():
        seeds[fmt].extend(p.read_bytes() for p in paths)
    return seeds


def mutation_ops():
    """Hypothesis strategy: a list of 1..6 mutation operations (positions are reduced modulo size)."""
    from hypothesis import strategies as st

    pos = st.one_of(st.integers(0, 600), st.integers(0, 1 << 24))
    op = st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("byte"), pos, st.integers(0, 255)),
        st.tuples(st.just("truncate"), pos),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 64)),
        st.tuples(st.just("copy"), pos, pos, st.integers(1, 256)),
        st.tuples(st.just("float"), pos, st.sampled_from(["nan", "inf", "-inf", "big"])),
        st.tuples(st.just("int"), pos, st.sampled_from([0xFFFFFFFF, 0x7FFFFFFF, 1 << 40, (1 << 63) - 1, 0])),
    )
    return st.lists(op, min_size=1, max_size=6)


def mutate(data: bytes, ops) -> bytes:
    """Apply ``ops`` (from :func:`mutation_ops`) to ``data``."""
    b = bytearray(data)
    for o in ops:
        n = max(len(b), 1)
        kind, p = o[0], o[1] % n
        if kind == "flip" and b:
            b[p] ^= 1 << o[2]
        elif kind == "byte" and b:
            b[p] = o[2]
        elif kind == "truncate":
            del b[p:]
        elif kind == "insert":
            b[p:p] = o[2]
        elif kind == "delete":
            del b[p:p + o[2]]
        elif kind == "copy" and b:
            q = o[2] % n
            b[q:q + o[3]] = b[p:p + o[3]]
        elif kind == "float":
            val = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "big": 3e38}[o[2]]
            p -= p % 4
            b[p:p + 4] = struct.pack("<f", val)
        elif kind == "int":
            b[p:p + 8] = struct.pack("<Q", o[2])
    return bytes(b)


def _where(exc: BaseException) -> str:
    """The innermost rnnconvert frame of ``exc``'s traceback (file:line), for the log."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "rnnconvert" in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


class Timeout(Exception):
    """Raised by the per-case alarm."""


def classify(path: Path) -> tuple[str, str]:
    """Load ``path``; return (outcome, detail)."""
    from rnnconvert import api
    from rnnconvert.errors import RNNConvertError

    try:
        api.load(path)
        return "ok", ""
    except Timeout:
        return "hang", ""
    except RNNConvertError as exc:
        msg = str(exc)
        if "\n" in msg:
            return "crash", f"multi-line message: {msg[:120]!r}"
        if "did not finish within" in msg:
            return "guarded_hang", ""
        if "parser crashed on this file" in msg:
            return "guarded_crash", msg[-60:]
        if "malformed" in msg and exc.__cause__ is not None and not isinstance(exc.__cause__, RNNConvertError) \
                and " file (" in msg:
            return "wrapped", f"{type(exc.__cause__).__name__}: {str(exc.__cause__)[:100]} at {_where(exc.__cause__)}"
        return "refused", ""
    except BaseException as exc:  # noqa: BLE001 - that is what we count
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "crash", f"{type(exc).__name__}: {str(exc)[:120]}"


def run_worker(fmt: str, n: int, seed: int, timeout: float, workdir: Path, out=sys.stdout) -> None:
    """Run ``n`` hypothesis cases for ``fmt``; print one line per case: ``<i> <outcome> <detail>``."""
    import signal

    from hypothesis import HealthCheck, given, seed as hseed, settings, strategies as st

    seeds = seed_files(workdir / "seeds", fmt)[fmt]
    target = workdir / f"case{EXT[fmt]}"
    count = [0]

    def alarm(*_):
        raise Timeout()

    signal.signal(signal.SIGALRM, alarm)

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[__import__("hypothesis").Phase.generate])
    @given(k=st.integers(0, len(seeds) - 1), ops=mutation_ops())
    def case(k, ops):
        target.write_bytes(mutate(seeds[k], ops))
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            outcome, detail = classify(target)
        except Timeout:
            outcome, detail = "hang", ""
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        count[0] += 1
        print(count[0], outcome, detail.replace("\n", " ") if detail else "", file=out, flush=True)

    case()
