"""The quick tier (``pytest -m "not slow"``, README "Running the tests") keeps every format family: the lists that
mark tests slow (tests/conftest.py ``SLOW``, ``SLOW_MODULES``, ``QUICK``) are checked here from the files, without
collecting the suite."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

from conftest import QUICK, SLOW, SLOW_MODULES

TESTS = Path(__file__).resolve().parents[1]


def _slow_module(rel: str) -> bool:
    return any(rel.startswith(m) for m in SLOW_MODULES)


def test_every_family_folder_keeps_a_quick_test():
    """Each folder of tests/formats/ has a module not marked slow as a whole, or a test of it named in ``QUICK``."""
    bare = []
    for folder in sorted(p for p in (TESTS / "formats").iterdir() if p.is_dir() and p.name != "__pycache__"):
        mods = [f"tests/formats/{folder.name}/{m.name}" for m in sorted(folder.glob("test_*.py"))]
        if mods and all(_slow_module(m) for m in mods) and not any(q.startswith(f"tests/formats/{folder.name}/")
                                                                   for q in QUICK):
            bare.append(folder.name)
    assert not bare, f"folders of tests/formats with nothing in the quick tier: {bare}"


def test_the_registry_driven_contract_stays_quick():
    """tests/engine/test_formats_contract.py tests every registered format: only the cases of single formats may be
    slow (``pt2``'s torch.export), never the module or a whole test function."""
    rel = "tests/engine/test_formats_contract.py"
    assert not _slow_module(rel)
    whole = [p for p in SLOW if p.startswith(rel) and ("[" not in p.split("::", 1)[1] or p.endswith("::*"))]
    assert not whole, whole


def test_every_listed_module_exists():
    """Every module ``SLOW``, ``SLOW_MODULES`` and ``QUICK`` name is a file (or folder) of tests/: a moved test file
    leaves no stale entry that would silently bring its tests back into the quick tier."""
    root = TESTS.parent
    gone = sorted({p.split("::")[0] for p in (*SLOW, *QUICK)} | set(SLOW_MODULES))
    gone = [p for p in gone if not (root / p).exists() and not any(fnmatchcase(str(f.relative_to(root)), p)
                                                                   for f in TESTS.rglob("test_*.py"))]
    assert not gone, gone
