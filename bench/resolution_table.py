"""Per recurrent layer, what verification's one-step states catch (issue #39 "resolution 1e-3").

Each file is converted to ``.onnx`` (recurrent layers only: ``write_opts={"recurrent_only": True}``, so that
every layer gets its own :class:`rnnconvert.verify.checks.LayerCheck`) and verified by the conversion; the table
prints, per layer, its verdict and ``LayerCheck.resolution`` (any single weight), ``row_resolution`` (a whole
row's scaling) and ``bias_resolution``, as fractions of a gate row's largest weight
(:func:`rnnconvert.verify.states.resolution`), with the states used (constructed ones in brackets) and the
seconds the conversion took.

    PYTHONPATH=$PWD python bench/resolution_table.py [substring ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rnnconvert import api  # noqa: E402

FX = ROOT / "fixtures"
SHARED = ROOT.parent / "shared" / "realworld"


def files() -> list[Path]:
    out = sorted((FX / "loose").glob("*.h5")) + sorted((FX / "loose").glob("*.pb"))
    out += [p for p in sorted((FX / "loose").iterdir()) if p.is_dir()]
    out += sorted((FX / "keras").glob("*.h5"))
    out += [FX / "realworld/textgenrnn-reddit-cudnnlstm/reddit_rarepuppers_politics.hdf5",
            FX / "realworld/mycroft-precise-gru/hey-mycroft.net", FX / "realworld/mycroft-precise-gru/hey-mycroft.pb"]
    out += sorted((FX / "madmom").glob("*.pkl"))
    if (SHARED / "dinornn-gru-tf2-checkpoint").is_dir():
        out.append(SHARED / "dinornn-gru-tf2-checkpoint")
    return out


def fmt(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def main(argv: list[str]) -> int:
    sel = [p for p in files() if not argv or any(a in str(p) for a in argv)]
    print(f"{'file':58s} {'layer':28s} {'verdict':12s} {'element':>8s} {'row':>8s} {'bias':>8s} states  secs")
    for src in sel:
        name = str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else f"../shared/{src.relative_to(SHARED.parent)}"
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            try:
                rep = api.convert(src, Path(d) / "out.onnx", write_opts={"recurrent_only": True},
                                  accept_inconclusive=True)
            except Exception as e:  # noqa: BLE001  (a table of what verifies: say why a file did not)
                print(f"{name:58s} {'(' + type(e).__name__ + ': ' + str(e)[:80] + ')'}")
                continue
            secs = time.perf_counter() - t0
        for c in (rep.verification.layers if rep.verification else []):
            if c.source_route.startswith("whole") or (c.resolution is None and c.bias_resolution is None):
                continue
            print(f"{name:58s} {c.name[:28]:28s} {c.verdict:12s} {fmt(c.resolution):>8s} {fmt(c.row_resolution):>8s}"
                  f" {fmt(c.bias_resolution):>8s} {c.states}({c.constructed}) {secs:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
