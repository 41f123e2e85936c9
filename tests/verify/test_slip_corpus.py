"""Verification's own adversary (issue #39): every file of the committed slip corpus, fixtures/slip_corpus/.

The corpus (fixtures/gen_slip_corpus.py) holds correct ``.onnx`` conversions of tight, loose and real third-party
layers and, in its manifest, single-weight, single-row, bias, saturated-unit and graph edits of them, each with its
TRUE error: onnxruntime running the edited file against the source framework's own outputs (tf_keras, the owners'
oracle files), never rnnconvert. Each edit is applied here with the ``onnx`` library (the generator's
:func:`apply`) and ``rnnconvert.verify`` (the public API) judges it:

* every correct file is ``ok``;
* a wrong file whose true error exceeds 10x the correct file's and 2e-5 of the output's scale is not ``ok``
  (``fail``, or ``inconclusive`` with the layer's reason);
* a wrong file judged ``ok`` has a relative size below the layer's stated resolution
  (``LayerCheck.resolution`` / ``bias_resolution`` / ``row_resolution``; docs/cli.md "Verdicts").

The last test prints the counts (bench/slip_corpus_counts.py prints the same table standalone)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from conftest import FIXTURES

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

sys.path.insert(0, str(FIXTURES))
import gen_slip_corpus as corpus  # noqa: E402

from rnnconvert import api  # noqa: E402

ROOT = FIXTURES.parent
MANIFEST = corpus.load_manifest()
SOURCES = MANIFEST["sources"]
RESULTS: dict[str, str] = {}


@pytest.mark.parametrize("key", list(SOURCES))
def test_correct_file_is_ok(key):
    s = SOURCES[key]
    rep = api.verify(ROOT / s["src"], FIXTURES / s["correct"])
    assert rep.ok, [(c.name, c.verdict, c.reason) for c in rep.layers]


@pytest.mark.parametrize("slip", MANIFEST["slips"], ids=[s["id"] for s in MANIFEST["slips"]])
def test_slip(slip, tmp_path):
    src = SOURCES[slip["source"]]
    bad = corpus.materialize(FIXTURES / src["correct"], slip["edit"], src["node"], tmp_path / "bad.onnx")
    rep = api.verify(ROOT / src["src"], bad)
    bucket, problem = corpus.classify(slip, src, rep)
    RESULTS[slip["id"]] = bucket
    print(f"\n{slip['id']} {slip['what']}: true error {slip['true_err']:.3g} "
          f"({'above' if corpus.significant(slip, src) else 'within'} the promise): {rep.verdict} -> {bucket}")
    assert not problem, (slip["id"], slip["what"], problem, [(c.name, c.verdict, c.reason[:80]) for c in rep.layers])


def test_counts():
    """The corpus counts (of the slips this run verified): printed, and every slip tried has a bucket."""
    if not RESULTS:
        pytest.skip("no slip of the corpus ran in this session")
    n = Counter(RESULTS.values())
    sig = sum(corpus.significant(s, SOURCES[s["source"]]) for s in MANIFEST["slips"] if s["id"] in RESULTS)
    print(f"\nslip corpus: {len(RESULTS)} slips tried ({sig} above the promise), {n['fail']} caught as fail, "
          f"{n['inconclusive']} inconclusive, {n['ok within resolution']} ok within resolution, {n['ok']} ok (holes)")
    assert sum(n.values()) == len(RESULTS)
    assert n["ok"] == 0
