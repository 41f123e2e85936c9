"""Shared test helpers: paths to fixtures and to the third-party files in ../shared/realworld."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REALWORLD = ROOT.parent / "shared" / "realworld"


def manifest(family: str) -> list[dict]:
    path = FIXTURES / "manifest.json"
    if not path.exists():
        return []
    return json.loads(path.read_text()).get(family, [])


@pytest.fixture
def realworld():
    if not REALWORLD.exists():
        pytest.skip(f"{REALWORLD} is not present (it lives beside the checkout)")
    return REALWORLD
