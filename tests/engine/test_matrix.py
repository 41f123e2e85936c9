"""docs/formats.md is generated from the registry by running every writer and reader; keep it current."""

from __future__ import annotations

from conftest import ROOT


def test_support_matrix_is_current_and_consistent():
    from rnnconvert.engine.matrix import render

    text = render()
    assert "MISMATCH" not in text, "a writer/reader pair changed a tensor: see the MISMATCH cell"
    doc = (ROOT / "docs" / "formats.md").read_text()
    assert doc == text, "docs/formats.md is stale: run `python -m rnnconvert.engine.matrix > docs/formats.md`"
