"""The slip corpus's count table (issue #39 "Your own adversary"): every file of fixtures/slip_corpus/ verified.

Each slip of ``fixtures/slip_corpus/manifest.json`` (fixtures/gen_slip_corpus.py) is applied to its correct file
with the ``onnx`` library and judged by ``rnnconvert.api.verify``; the table counts, per source and family, the
slips tried, those above the promise (true error > 10x the correct file's and > 2e-5 of the output scale), and
the verdicts: ``fail``, ``inconclusive``, ``ok`` within the layer's stated resolution, and ``ok`` holes (a slip
above the promise, or above the stated resolution, judged ok). tests/verify/test_slip_corpus.py asserts the same.

    PYTHONPATH=$PWD python bench/slip_corpus_counts.py [source-key ...]
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures"))

import gen_slip_corpus as corpus  # noqa: E402

from rnnconvert import api  # noqa: E402

COLS = ("tried", "above", "fail", "inconclusive", "ok within resolution", "ok")


def main(argv: list[str]) -> int:
    m = corpus.load_manifest()
    table: dict = defaultdict(Counter)
    with tempfile.TemporaryDirectory() as d:
        for key, src in m["sources"].items():
            if argv and key not in argv:
                continue
            rep = api.verify(ROOT / src["src"], corpus.FX / src["correct"])
            print(f"{key} (correct file): {rep.verdict}", flush=True)
            for s in (s for s in m["slips"] if s["source"] == key):
                bad = corpus.materialize(corpus.FX / src["correct"], s["edit"], src["node"], Path(d) / "bad.onnx")
                rep = api.verify(ROOT / src["src"], bad)
                bucket, problem = corpus.classify(s, src, rep)
                above = corpus.significant(s, src)
                print(f"  {s['id']} {s['what']}: true {s['true_err']:.3g}{' (above)' if above else ''}: "
                      f"{rep.verdict}{'  HOLE: ' + problem if problem else ''}", flush=True)
                for row in (f"{src['class']}/{s['family']}", "all"):
                    table[row].update({"tried": 1, "above": int(above), bucket: 1})
    print(f"\n{'class/family':22s}" + "".join(f"{c:>22s}" for c in COLS))
    for row in sorted(table, key=lambda r: (r == "all", r)):
        print(f"{row:22s}" + "".join(f"{table[row][c]:>22d}" for c in COLS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
