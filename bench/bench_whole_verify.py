"""Issue 39 speed goal: a whole model verified against the same file's ``--recurrent-only`` verified conversion and
``--no-verify``, side by side in one run.

    .venv/bin/python bench/bench_whole_verify.py [--to onnx] [--repeat 1] [--only SUBSTRING ...] [--tree DIR]

Models: every ``fixtures/keras_whole/whole_*.h5``, and the whole Keras models among ``fixtures/realworld`` and
``../shared/realworld`` (``*.h5``, ``*.hdf5``, ``*.net``, ``*.keras``: kept where the ``--no-verify`` conversion
writes a whole-model graph). Each conversion runs the CLI in a fresh interpreter (``python -m rnnconvert SRC DST
--force [...]``), as a user runs it: the wall time includes importing the frameworks. Prints a markdown table (the
median of ``--repeat`` runs) with the ratio whole / ``--recurrent-only``; the goal is at most 2. ``--tree DIR``: also
time the whole (verified) conversion by the rnnconvert of another checkout (``DIR/rnnconvert``, e.g. the code
before a change), interleaved with this one's, as the column "whole, DIR".
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"whole (verified)": [], "--recurrent-only (verified)": ["--recurrent-only"], "--no-verify": ["--no-verify"]}


def candidates() -> list[Path]:
    out = sorted((ROOT / "fixtures" / "keras_whole").glob("whole_*.h5"))
    for base in (ROOT / "fixtures" / "realworld", ROOT.parent / "shared" / "realworld"):
        if base.is_dir():
            out += sorted(p for ext in ("h5", "hdf5", "net", "keras") for p in base.glob(f"*/*.{ext}"))
    seen, keep = set(), []
    for p in out:  # a model in both folders once
        if p.name not in seen:
            seen.add(p.name)
            keep.append(p)
    return keep


def run(src: Path, dst: Path, extra: list[str], tree: Path = ROOT) -> tuple[float, int, str]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(src), str(dst), "--force", *extra], cwd=tree,
                       capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or [""])[-1]
    return time.perf_counter() - t, r.returncode, last


def is_whole(dst: Path) -> bool:
    from rnnconvert.runtimes.onnxruntime import whole_meta

    try:
        return dst.suffix == ".onnx" and whole_meta(dst) is not None
    except Exception:  # noqa: BLE001 - not a graph we wrote whole
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", default="onnx", help="output suffix (default onnx)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="keep models whose path contains one of these")
    ap.add_argument("--tree", type=Path, default=None, help="another checkout to time the whole conversion with")
    a = ap.parse_args()
    modes = dict(MODES)
    if a.tree is not None:
        modes[f"whole, {a.tree}"] = []
    sys.path.insert(0, str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-whole-") as tmp:
        for src in candidates():
            if a.only and not any(s in str(src) for s in a.only):
                continue
            dst = Path(tmp) / f"{src.stem}.{a.to}"
            t, rc, _ = run(src, dst, MODES["--no-verify"])
            if rc != 0 or (a.to == "onnx" and not is_whole(dst)):
                continue  # not a whole Keras model (or not convertible whole): not this benchmark's subject
            times, notes = {}, []
            for mode, extra in modes.items():
                tree = a.tree if mode.startswith("whole, ") else ROOT
                got = [run(src, dst, extra, tree) for _ in range(a.repeat)]
                times[mode] = statistics.median(g[0] for g in got)
                if any(g[1] != 0 for g in got):
                    notes.append(f"{mode}: exit {got[0][1]} ({got[0][2][:80]})")
            rows.append((src, times, notes))
    print(f"| model ({a.to}) | size | " + " | ".join(modes) + " | whole / --recurrent-only |")
    print("|---|---:|" + "---:|" * (len(modes) + 1))
    for src, times, notes in rows:
        ratio = times["whole (verified)"] / times["--recurrent-only (verified)"]
        size = src.stat().st_size
        print(f"| {src.relative_to(src.parents[1])} | {size / 1e6:.2f} MB | "
              + " | ".join(f"{times[m]:.1f} s" for m in modes) + f" | {ratio:.1f}x |"
              + (f" {'; '.join(notes)}" if notes else ""))


if __name__ == "__main__":
    main()
