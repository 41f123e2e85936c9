"""The migration guides (docs/guides/*.md, docs/keras3.md) run as written.

One mechanism for every guide, in a fresh scratch directory per guide:

* ``<!-- guide-files: PATH ... -->`` (paths relative to the repository root) names the input files the
  guide expects in its working directory; they are copied there (the guide is skipped when one is
  absent).
* ```` ```console ```` blocks: each ``$ rnnconvert ARGS`` line runs the CLI in-process
  (``rnnconvert.cli.main``); it must exit 0, or the code a trailing ``# exit N`` comment states.
* ```` ```python ```` blocks run in order, in one namespace per guide (a later block sees the
  names of earlier ones); their ``assert`` lines are the guide's checks against real outputs.
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest

from conftest import ROOT

GUIDES = [*sorted(p for p in (ROOT / "docs" / "guides").glob("*.md") if p.name != "README.md"),
          ROOT / "docs" / "keras3.md"]
BLOCK = re.compile(r"```(python|console)\n(.*?)```", re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """The guide's ``python`` and ``console`` blocks, in document order."""
    return BLOCK.findall(text)


def _run_console(code: str, where: str) -> None:
    from rnnconvert import cli

    for line in code.splitlines():
        if not line.startswith("$ "):
            continue  # shown output
        cmd, _, comment = line[2:].partition(" #")
        argv = shlex.split(cmd)
        assert argv[0] == "rnnconvert", f"{where}: only rnnconvert commands run in guides: {line}"
        m = re.search(r"exit (\d+)", comment)
        want = int(m.group(1)) if m else 0
        assert cli.main(argv[1:]) == want, f"{where}: {line}"


@pytest.mark.parametrize("guide", GUIDES, ids=[g.name for g in GUIDES])
def test_guide_runs(guide, tmp_path, monkeypatch):
    text = guide.read_text()
    found = blocks(text)
    assert any(kind == "python" for kind, _ in found), f"{guide.name} has no python example"
    for files in re.findall(r"<!-- guide-files:(.*?)-->", text, re.S):
        for rel in files.split():
            src = (ROOT / rel).resolve()
            if not src.exists():
                pytest.skip(f"{rel} is not present")
            (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / src.name)
    monkeypatch.chdir(tmp_path)
    where = f"docs/{guide.relative_to(ROOT / 'docs')}"
    ns = {"__name__": "docs_example"}
    for kind, code in found:
        if kind == "console":
            _run_console(code, where)
        else:
            exec(compile(code, where, "exec"), ns)
