"""Batch conversion of a directory tree: parallel over files, one bad file never stops the others.

Used by ``rnnconvert SRC_DIR DST_DIR --to FORMAT [-j N] [--skip-existing]``. Each source file whose format
is recognised (by content, then extension: :func:`rnnconvert.engine.registry.detect`) is converted to
``DST_DIR/<relative path>`` with the target format's first extension; a file no reader recognises (a
``notes.txt``, a ``vocab.json`` beside the model) is listed as skipped, not failed. The result of every
file is collected as a :class:`FileResult`.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from .engine import registry
from .errors import FormatError, RNNConvertError


@dataclass
class FileResult:
    """The outcome for one file: ``status`` is ``converted``, ``refused`` (exit code 4), ``failed``, or
    ``skipped`` (no reader recognises the file, or its output exists and ``skip_existing`` was asked)."""

    src: str
    dst: str
    status: str
    message: str = ""
    exit_code: int = 0


def _tf_companion(name: str, files: list[str]) -> bool:
    """A TensorFlow checkpoint's data shard or ``checkpoint`` state file: read through its ``.index``."""
    return bool(re.search(r"\.data-\d{5}-of-\d{5}$", name)) or (
        name == "checkpoint" and any(f.endswith(".index") for f in files))


def candidates(src_dir: Path, skip: Path | None = None) -> Iterator[Path]:
    """Regular files under ``src_dir`` in sorted order (hidden files, symlinks and TF checkpoint
    companions -- ``*.data-*`` shards, the ``checkpoint`` file -- skipped: the ``.index`` stands for them).
    ``skip``: a folder never entered (the batch's own output folder inside its input folder: a second run
    would convert its own outputs)."""
    skip_r = skip.resolve() if skip is not None else None
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and (skip_r is None or (Path(root) / d).resolve() != skip_r))
        for name in sorted(files):
            p = Path(root) / name
            if not name.startswith(".") and p.is_file() and not p.is_symlink() and not _tf_companion(name, files):
                yield p


def _one(src: str, dst: str, kwargs: dict[str, Any]) -> FileResult:
    from .api import convert

    try:
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        rep = convert(src, dst, **kwargs)
        return FileResult(src, dst, "converted", f"{len(rep.modules)} layer(s)")
    except RNNConvertError as exc:
        status = "refused" if exc.exit_code == 4 else "failed"
        return FileResult(src, dst, status, str(exc), exc.exit_code)
    except Exception as exc:  # a bug in one file's conversion must not stop the batch
        return FileResult(src, dst, "failed", f"internal error: {type(exc).__name__}: {exc}", 1)


def recognised(path: Path, src_format: str | None = None) -> bool:
    """Whether a reader takes ``path``: its content or name matches a format (``src_format``: that
    format is named, so every file is given to it)."""
    if src_format:
        return True
    try:
        registry.detect(path)
    except FormatError:
        return False
    return True


def convert_tree(src_dir: str | os.PathLike, dst_dir: str | os.PathLike, *, to: str, jobs: int = 1,
                 on_done: Callable[[FileResult], None] | None = None, skip_existing: bool = False,
                 **kwargs: Any) -> list[FileResult]:
    """Convert every recognised file under ``src_dir`` into ``dst_dir`` in format ``to``.

    Args:
        jobs: worker processes (1 = in this process).
        on_done: called with each :class:`FileResult` as it completes (progress display).
        skip_existing: leave a file whose output exists as it is (status ``skipped``): resume a run.
        **kwargs: passed to :func:`rnnconvert.api.convert` (``verify``, ``force``, ..., or ``options``: a
            :class:`rnnconvert.api.ConvertOptions`, whose ``to`` is set to ``to``).

    Returns:
        one :class:`FileResult` per candidate file, in source order. Files whose output names collide
        (``model.h5`` and ``model.pt`` both to ``model.onnx``) are not converted: each is ``failed``
        (exit code 6) naming the others, decided before anything is converted.

    Raises:
        FormatError: ``src_dir`` is not a directory, or ``to`` is unknown.
    """
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    if not src_dir.is_dir():
        raise FormatError(f"{src_dir}: not a directory")
    fmt = registry.get(to)
    ext = fmt.extensions[0] if fmt.extensions else ""  # a directory format (TF checkpoints): DST_DIR/<stem>/
    work, order = [], []
    results: dict[str, FileResult] = {}
    for p in candidates(src_dir, skip=dst_dir):
        rel = p.relative_to(src_dir)
        s, d = str(p), str(dst_dir / rel.parent / (rel.name.split(".")[0] + ext))
        order.append(s)
        if not recognised(p, kwargs.get("src_format") or getattr(kwargs.get("options"), "src_format", None)):
            results[s] = FileResult(s, d, "skipped", "not a format rnnconvert reads")
        elif skip_existing and Path(d).exists():
            results[s] = FileResult(s, d, "skipped", "output exists (skip-existing)")
        else:
            work.append((s, d))
            continue
        if on_done:
            on_done(results[s])
    # the CLI passes its options as one record (rnnconvert.api.ConvertOptions): ``to`` goes there
    kwargs = {**kwargs, "options": replace(kwargs["options"], to=to)} if "options" in kwargs else {**kwargs, "to": to}
    by_dst: dict[str, list[str]] = {}
    for s, d in work:
        by_dst.setdefault(d, []).append(s)
    for d, srcs in by_dst.items():  # two sources, one output name: neither converted (none would survive)
        if len(srcs) > 1:
            for s in srcs:
                others = ", ".join(Path(o).name for o in srcs if o != s)
                results[s] = r = FileResult(s, d, "failed", f"{Path(s).name} and {others} would both be written "
                                            f"to {d}; not converted (rename one of them)", 6)
                if on_done:
                    on_done(r)
    work = [(s, d) for s, d in work if s not in results]
    if jobs <= 1:
        for s, d in work:
            results[s] = r = _one(s, d, kwargs)
            if on_done:
                on_done(r)
    else:
        # spawn, not fork: a forked child of a process holding torch/TF thread pools can deadlock.
        from .process import signals

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=signals.install) as pool:
            futs = [pool.submit(_one, s, d, kwargs) for s, d in work]
            try:
                for fut in as_completed(futs):
                    r = fut.result()
                    results[r.src] = r
                    if on_done:
                        on_done(r)
            except BaseException:  # interrupted: the workers clean up as this process does (SIGTERM)
                for fut in futs:
                    fut.cancel()
                for child in multiprocessing.active_children():
                    child.terminate()
                raise
    return [results[s] for s in order]
