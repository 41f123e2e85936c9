"""The migration guides (docs/guides/*.md, docs/keras3.md) run as written.

One mechanism for every guide, in a fresh scratch directory per guide:

* ``<!-- guide-files: PATH ... -->`` (paths relative to the repository root) names the input files the
  guide expects in its working directory; they are copied there (the guide is skipped when one is
  absent).
* ```` ```console ```` blocks: each ``$ rnnconvert ARGS`` line runs the CLI in-process
  (``rnnconvert.cli.main``); it must exit 0, or the code a trailing ``# exit N`` comment states. The
  lines shown under it are what it prints (stdout, then stderr), compared line by line (:func:`same`)
  modulo what legitimately varies: measured numbers with a decimal point (errors, tolerances, fractions
  of a bound) and version numbers (``onnxruntime 1.32.0``, ``torch 2.13.0+cpu``), table borders and
  spacing; ``...`` in a shown line stands for any text. A command with no lines
  shown is not compared.
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


_BOX_ONLY = re.compile(r"^[\s\u2500-\u257f]*$")


def normal(line: str) -> str:
    """A printed or shown line with what legitimately varies taken out (module docstring)."""
    line = re.sub(r"[\u2502\u2503]", " ", line)  # table column rules
    line = re.sub(r"\d+(?:\.\d+)+(?:e[-+]\d+)?(?:\+\w+)?", "<n>", line)  # measured numbers, versions
    return " ".join(line.split())


def same(shown: list[str], printed: list[str]) -> bool:
    """Whether the lines a guide shows are the lines printed (both :func:`normal`, border lines dropped;
    ``...`` in a shown line matches any text)."""
    a = [normal(x) for x in shown if not _BOX_ONLY.match(x)]
    b = [normal(x) for x in printed if not _BOX_ONLY.match(x)]
    return len(a) == len(b) and all(re.fullmatch(".*".join(map(re.escape, x.split("..."))), y) for x, y in zip(a, b))


def _commands(code: str) -> list[tuple[str, list[str]]]:
    """The ``$ `` lines of a console block, each with the lines shown under it."""
    out: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            out.append((line, []))
        elif out and line.strip():
            out[-1][1].append(line)
    return out


def _run_console(code: str, where: str, capsys) -> None:
    from rnnconvert import cli

    for line, shown in _commands(code):
        cmd, _, comment = line[2:].partition(" #")
        argv = shlex.split(cmd)
        assert argv[0] == "rnnconvert", f"{where}: only rnnconvert commands run in guides: {line}"
        m = re.search(r"exit (\d+)", comment)
        want = int(m.group(1)) if m else 0
        capsys.readouterr()
        rc = cli.main(argv[1:])
        got = capsys.readouterr()
        printed = got.out.splitlines() + got.err.splitlines()
        assert rc == want, f"{where}: {line}: exit {rc}\n" + "\n".join(printed)
        if shown:
            assert same(shown, printed), (f"{where}: the output shown under `{line}` is not what it prints now:\n"
                                          + "\n".join(printed))


@pytest.mark.parametrize("guide", GUIDES, ids=[g.name for g in GUIDES])
def test_guide_runs(guide, tmp_path, monkeypatch, capsys):
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
            _run_console(code, where, capsys)
        else:
            exec(compile(code, where, "exec"), ns)


def test_shown_output_comparison_can_fail():
    """The comparison catches a changed word, a missing line, an extra line; it forgives measured
    numbers, versions, borders and spacing, and ``...``."""
    printed = ["a.h5 (keras_h5) -> a.pt (pt)", "  verified x: one step: max abs error 3.37e-06, 0.033 of its bound, "
               "24 steps; sequence: max abs error 1.14e-05 (tolerance 3.0e-05); vs torch 2.13.0+cpu", "\u250f\u2501\u2513"]
    shown = ["a.h5 (keras_h5) -> a.pt (pt)", "  verified x: one step: max abs error 1.00e-07, 0.5 of its bound, "
             "24 steps; sequence: max abs error 2.0e-05 (tolerance 1.0e-05); vs torch 2.14.1"]
    assert same(shown, printed)
    assert same([shown[0], "  verified x: one step: ... vs torch 2.13.0"], printed)
    assert not same([shown[0], shown[1].replace("vs torch", "vs onnxruntime")], printed)
    assert not same(shown[:1], printed)
    assert not same(shown + ["  note: extra"], printed)
    assert not same([shown[0], shown[1].replace("24 steps", "25 steps")], printed)


def test_docs_cite_only_what_is_in_the_repository():
    """Every file a doc or docstring cites (a markdown link, ``NAME.md §N``, a ``docs/...`` path) is in the
    repository; nothing points outside it (``../shared``, ``/work/``)."""
    texts = [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "rnnconvert").rglob("*.py")]
    cites = re.compile(r"\]\(([^)#\s]+\.md)|(?<![/\w.-])([\w-]+\.md)\s*§|(?<![/\w.-])(docs/[\w/.-]+\.md)")
    for p in texts:
        t = p.read_text(encoding="utf-8")
        # (``../shared/realworld`` is named only as where the unlicensed DinoRNN file may sit: its tests skip)
        outside = re.search(r"\.\./shared/(?!realworld)|/work/", t)
        assert not outside, f"{p.relative_to(ROOT)} cites a file outside the repository: {outside.group(0)}"
        for m in cites.finditer(t):
            name = next(g for g in m.groups() if g)
            if "://" in name:
                continue
            here = [p.parent / name, ROOT / name, ROOT / "docs" / name]
            assert any(q.exists() for q in here), f"{p.relative_to(ROOT)} cites {name}, which is not in the repository"
