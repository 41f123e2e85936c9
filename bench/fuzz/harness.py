"""Fuzz harness for rnnconvert's readers: hypothesis-driven mutations of real seed files.

Seed files per format are real files: the committed Keras fixtures (``fixtures/keras/*.h5``, made
by tf_keras), the committed TensorFlow fixtures (``fixtures/tf/*``: TF1 name-based and TF2
object-based checkpoints, a SavedModel's ``variables/``, frozen ``.pb`` graphs, all made by
TensorFlow), files written here by torch (``torch.save`` zip and legacy formats, a
``torch.jit.script`` archive), by safetensors, by Keras 3 (``model.save`` / ``save_weights``, through
rnnconvert's keras3 writer, in a subprocess so that the fuzzing worker does not carry Keras), and by
rnnconvert's own ONNX/npz/cuDNN-buffer writers from a torch-made checkpoint. A TF checkpoint seed is
a pair of files (``.index``, ``.data-00000-of-00001``); a case mutates one of them.

Each case picks a seed and applies a hypothesis-drawn list of mutations
(bit flips, byte overwrites, truncation, insertion, deletion, chunk copies, NaN/Inf floats,
huge 32/64-bit integers for declared sizes), writes the result to a file and calls
:func:`rnnconvert.api.load` on it.

Outcome per case: ``ok`` (read), ``refused`` (an ``RNNConvertError``), ``crash`` (any other
exception), ``hang`` (over the per-case timeout). ``wrapped`` counts refusals that only the last
line of defence in ``api.load`` turned into a ``FormatError`` (a reader let a low-level error
through: worth fixing in that reader, but not a crash for a user). The files of every case that is
neither ``ok`` nor ``refused`` are kept in ``<workdir>/found/`` for a regression test.
"""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("keras_h5", "pt", "onnx", "safetensors", "npz", "keras3", "tf_checkpoint", "tf_graph", "cudnn_npz")
EXT = {"keras_h5": ".h5", "pt": ".pt", "onnx": ".onnx", "safetensors": ".safetensors", "npz": ".npz",
       "keras3": ".keras", "tf_checkpoint": ".index", "tf_graph": ".pb", "cudnn_npz": ".cudnn.npz"}
#: the files of one TF checkpoint seed (suffixes after the prefix); the first is the one loaded
CKPT_PARTS = (".index", ".data-00000-of-00001")
TF_CKPT_SEEDS = ("lstm_cell/ckpt", "bidi_gru/ckpt", "cudnn_lstm/ckpt", "keras_lstm_bigru/ckpt",
                 "keras_gru_v1_srnn/ckpt", "lstm_peep_clip/ckpt", "multi_basic_lstm/ckpt",
                 "keras_lstm_bigru_savedmodel/variables/variables")
KERAS_SEEDS = ("lstm.h5", "gru_reset_after_weights.h5", "bidi_lstm_concat.h5", "simplernn.h5",
               "keras1_gpu_simplernn_weights.h5", "embedding_lstm.h5")


def _torch_ckpt_files(workdir: Path) -> dict[str, list[Path]]:
    """Write the torch-made seed files for pt/onnx/safetensors/npz into ``workdir``."""
    import torch

    from rnnconvert import api

    torch.manual_seed(0)
    out: dict[str, list[Path]] = {f: [] for f in ("pt", "onnx", "safetensors", "npz", "cudnn_npz")}
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
        for fmt in ("onnx", "npz", "cudnn_npz"):
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


def write_keras3_seeds(workdir: Path) -> list[Path]:
    """Keras 3 files (``.keras`` and ``.weights.h5``) of torch-made layers, written by Keras 3 through
    rnnconvert's keras3 writer (run by :func:`seed_files` in a subprocess)."""
    import torch

    from rnnconvert import api

    torch.manual_seed(1)
    out = []
    for i, mod in enumerate((torch.nn.LSTM(3, 4, batch_first=True, bidirectional=True),
                             torch.nn.GRU(2, 3, num_layers=2, batch_first=True), torch.nn.RNN(2, 3))):
        src = workdir / f"k3src{i}.pt"
        torch.save(mod.state_dict(), src)
        ckpt = api.load(src)
        for ext in (".keras", ".weights.h5"):
            d = workdir / f"seed{i}{ext}"
            api.save(ckpt, d, force=True)
            out.append(d)
    return out


def seed_files(workdir: Path, fmt: str | None = None) -> dict[str, list]:
    """The seeds per format: bytes, or for ``tf_checkpoint`` a tuple of bytes (one per :data:`CKPT_PARTS`).
    ``workdir`` receives the written files; torch is not imported when only ``keras_h5``, ``tf_checkpoint``
    or ``tf_graph`` is asked for, which keeps the forked reads cheap."""
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, list] = {f: [] for f in FORMATS}
    for name in KERAS_SEEDS:
        p = ROOT / "fixtures" / "keras" / name
        if p.exists():
            seeds["keras_h5"].append(p.read_bytes())
    tf = ROOT / "fixtures" / "tf"
    for pre in TF_CKPT_SEEDS:
        if Path(f"{tf / pre}.index").exists():
            seeds["tf_checkpoint"].append(tuple(Path(f"{tf / pre}{s}").read_bytes() for s in CKPT_PARTS))
    seeds["tf_graph"] = [p.read_bytes() for p in sorted(tf.glob("*.pb"))]
    if fmt in ("keras_h5", "tf_checkpoint", "tf_graph"):
        return seeds
    if fmt in (None, "keras3"):
        subprocess.run([sys.executable, __file__, "keras3-seeds", str(workdir)], check=True,
                       env=dict(__import__("os").environ, PYTHONPATH=str(ROOT)))
        seeds["keras3"] = [p.read_bytes() for p in sorted(workdir.glob("seed*.keras"))
                           + sorted(workdir.glob("seed*.weights.h5"))]
        if fmt == "keras3":
            return seeds
    for f, paths in _torch_ckpt_files(workdir).items():
        seeds[f].extend(p.read_bytes() for p in paths)
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


class Timeout(BaseException):
    """Raised by the per-case alarm (a BaseException, so that no reader's ``except Exception`` hides it)."""


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
    multi = fmt == "tf_checkpoint"

    def alarm(*_):
        raise Timeout()

    signal.signal(signal.SIGALRM, alarm)

    def write_case(k, ops, part):
        if multi:  # one file of the pair mutated, the other as made
            for j, suffix in enumerate(CKPT_PARTS):
                Path(f"{workdir / 'case'}{suffix}").write_bytes(mutate(seeds[k][j], ops) if j == part else seeds[k][j])
        else:
            # a .keras seed may be HDF5 (.weights.h5): the name decides nothing, detection reads content
            target.write_bytes(mutate(seeds[k], ops))

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[__import__("hypothesis").Phase.generate])
    @given(k=st.integers(0, len(seeds) - 1), ops=mutation_ops(), part=st.integers(0, len(CKPT_PARTS) - 1)
           if multi else st.just(0))
    def case(k, ops, part):
        write_case(k, ops, part)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            outcome, detail = classify(target)
        except Timeout:
            outcome, detail = "hang", ""
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        count[0] += 1
        if outcome not in ("ok", "refused"):  # keep the file(s) for a regression test
            found = workdir / "found"
            found.mkdir(exist_ok=True)
            for f in workdir.glob("case*"):
                shutil.copyfile(f, found / f"{count[0]}-{f.name}")
        print(count[0], outcome, detail.replace("\n", " ") if detail else "", file=out, flush=True)

    case()


if __name__ == "__main__":  # python harness.py keras3-seeds DIR (used by seed_files)
    if sys.argv[1:2] == ["keras3-seeds"]:
        write_keras3_seeds(Path(sys.argv[2]))
