"""The committed Keras 3 ``.keras`` fixtures are the byte-stable form ``fixtures/make_fixtures.py`` writes
(``fixtures/_stable.py``): regenerating a family writes the same bytes, so git stays clean.

What Keras 3.15 ``model.save`` varies from run to run (``keras/src/saving/saving_lib.py``,
``serialization_lib.py``): the ``model.weights.h5`` member's zip date, ``metadata.json``'s ``date_saved`` and the
``shared_object_id`` values (Python ``id()``s) in ``config.json``. Standard library only: no framework needed."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, fixture_script

KERAS = sorted(FIXTURES.rglob("*.keras"))


def _ids(obj, out: list) -> list:
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(v) if k == "shared_object_id" else _ids(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _ids(v, out)
    return out


def test_there_are_keras3_fixtures():
    assert len(KERAS) >= 8


@pytest.mark.parametrize("path", KERAS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_committed_keras_archive_is_the_stable_form(path, tmp_path):
    with zipfile.ZipFile(path) as z:
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert "date_saved" not in json.loads(z.read("metadata.json"))
        ids = _ids(json.loads(z.read("config.json")), [])
    first = list(dict.fromkeys(ids))  # distinct, in order of first appearance
    assert first == list(range(1, len(first) + 1)), first
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    assert fixture_script("_stable").stable_keras(copy) is False  # a fixed point: the post-pass changes nothing
    assert copy.read_bytes() == path.read_bytes()
