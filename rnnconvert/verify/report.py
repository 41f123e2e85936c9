"""The HTML report of ``convert``, ``verify`` and ``diagnose`` (``--report PATH``): one self-contained file
(inline CSS, PNG plots as base64 ``data:`` URIs; it opens in a browser with no server and nothing fetched).

What it holds: a summary at the top (verdict, layers by verdict, the largest measured error against its
tolerance, notes, refusal); the run (the command line as typed, or the Python call; date in UTC; host, OS and CPU;
Python and the versions of the libraries installed); source and target (paths, formats, sizes and the sha256 of
every file, a folder's files each); every layer of both with its cell, sizes and semantics;
per layer and tensor what the target holds against the source's canonical parameters (bit-exact; the gate
blocks permuted, named: "permuted gates: z, r, n where the source has r, z, n"; or the largest difference
measured: rounded or rescaled); the conversion's notes, module lines and any refusal or
error; the verdict with the numbers verification measured (:class:`rnnconvert.verify.checks.LayerCheck`:
nothing that was not measured is printed: a comparison that did not run shows a dash); the diagnosis
(:mod:`rnnconvert.verify.diagnose`) with its slips; and two matplotlib plots per verified layer: the one-step
error against its bound per time step (``step_err_t``, ``step_bound_t``; the measured tolerance's largest element,
``step_applied_t``, where rule E applied it) and the short sequence's error per
step against its tolerance (``seq_err_t``, ``seq_tol``).

Tables never cut a column: cells wrap (long paths and names break anywhere) and the page has a print stylesheet
(no width limit, smaller type, plots kept on one page), so a printed or PDF report holds every column.

matplotlib is the ``report`` extra: without it :func:`write` raises :class:`~rnnconvert.errors.DependencyError`.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.transforms import fold_forget_bias
from ..errors import RNNConvertError
from ..errors import require as require_module

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#1b1f24;background:#fff;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #d0d7de;padding-bottom:.2em;
margin-top:1.6em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em;max-width:100%}
th,td{border:1px solid #d0d7de;padding:.25em .55em;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f6f8fa}td.mono{overflow-wrap:anywhere}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em;overflow-wrap:anywhere}
.badge{display:inline-block;padding:.15em .6em;border-radius:1em;font-weight:600;color:#fff}
.ok{background:#1a7f37}.fail,.slip,.unexplained{background:#cf222e}.inconclusive{background:#9a6700}
.none{background:#57606a}
.note{color:#57606a}.plot{max-width:100%;border:1px solid #d0d7de;margin:.4em 0}
.summary{border:1px solid #d0d7de;border-radius:6px;padding:.5em 1em;background:#f6f8fa}
ul{margin:.3em 0 .3em 1.2em;padding:0}
@media print{body{max-width:none;margin:0;padding:0;font-size:10pt}table{font-size:7.5pt;page-break-inside:auto}
th,td{overflow-wrap:anywhere;padding:.15em .3em}
tr,.plot{page-break-inside:avoid}.badge{border:1px solid #000;color:#000;background:none}}
"""


@dataclass
class Content:
    """What one report shows; ``kind``: ``'conversion'``, ``'verification'`` or ``'diagnosis'``."""

    kind: str
    src: str
    dst: str
    src_format: str = ""
    dst_format: str = ""
    src_ckpt: Any = None
    dst_ckpt: Any = None
    modules: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    verification: Any = None
    diagnosis: Any = None
    #: how the command was run: the CLI's arguments as typed (:data:`COMMAND`), else the Python call
    command: str = ""


#: the command line of the running CLI command (set by :func:`rnnconvert.cli.main`); empty under the Python API
COMMAND = ""
#: the libraries whose installed versions a report lists (read from their metadata: nothing is imported)
LIBRARIES = ("numpy", "h5py", "safetensors", "onnx", "onnxruntime", "torch", "tensorflow", "tf_keras", "keras",
             "jax", "openvino", "paddlepaddle", "mlx", "matplotlib")
#: a folder's files hashed at most (a report stays bounded whatever the folder holds)
MAX_HASHED = 64


def _clean(text: object) -> str:
    """``text`` as valid Unicode: a lone surrogate (a name read from a file, ``os.fsdecode`` of a path's bytes)
    becomes U+FFFD, which UTF-8 and matplotlib take."""
    import re

    return re.sub("[\ud800-\udfff]", "\ufffd", str(text))


def _e(x: object) -> str:
    return html.escape(_clean(x))


def _plain(text: object, limit: int = 80) -> str:
    """A name for a plot title: valid Unicode (:func:`_clean`), at most ``limit`` characters; drawn with
    :data:`PLAIN` (never mathtext nor TeX: a ``$...$`` in a layer name is text)."""
    s = _clean(text)
    return s if len(s) <= limit else s[:limit - 3] + "..."


#: matplotlib text properties for strings from a file: plain text (no ``$...$`` mathtext, no TeX).
PLAIN = {"parse_math": False, "usetex": False}


def _num(x: float, fmt: str = ".3g") -> str:
    return format(x, fmt) if np.isfinite(x) else str(x)


def _load(path: str, fmt: str | None, opts: dict | None) -> tuple[Any, str]:
    """The checkpoint at ``path`` read eagerly by rnnconvert's reader, or ``(None, why)``."""
    from ..engine import pipeline  # rnnconvert's hardened load (rnnconvert.api.load); imported when a report is written

    try:
        return pipeline.load(path, fmt or None, **(opts or {})).materialize(), ""
    except RNNConvertError as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - a report is written whatever the files are
        return None, f"{type(exc).__name__}: {exc}"


def gather(kind: str, src, dst, *, src_format: str | None = None, dst_format: str | None = None,
           read_opts: dict | None = None, modules=(), notes=(), error: str = "", verification=None,
           diagnosis=None) -> Content:
    """A :class:`Content` with both files read (where they can be) for the layer tables and the parameter
    comparison."""
    c = Content(kind, str(src), str(dst), src_format or "", dst_format or "", modules=list(modules),
                notes=list(notes), error=error, verification=verification, diagnosis=diagnosis, command=COMMAND)
    if src is not None and Path(src).exists():
        c.src_ckpt, why = _load(str(src), src_format, read_opts)
        if c.src_ckpt is not None:
            c.src_format = c.src_ckpt.format
        elif why:
            c.notes.append(f"source not read for this report: {why}")
    if dst is not None and Path(dst).exists():
        c.dst_ckpt, why = _load(str(dst), dst_format, None)
        if c.dst_ckpt is not None:
            c.dst_format = c.dst_ckpt.format
        elif why:
            c.notes.append(f"target not read back for this report: {why}")
    return c


GATE_NAMES = {"LSTM": "i f g o", "GRU": "r z n"}


def _permuted(a: np.ndarray, b: np.ndarray, cell: str) -> str | None:
    """``"z, r, n where the source has r, z, n"`` when ``b`` holds ``a``'s gate blocks (first axis) in another
    order, exactly; else ``None``."""
    names = GATE_NAMES.get(cell, "").split()
    G = len(names)
    if G < 2 or a.shape != b.shape or a.ndim == 0 or a.shape[0] % G:
        return None
    n = a.shape[0] // G
    ab = [a[i * n:(i + 1) * n] for i in range(G)]
    order = []
    for i in range(G):
        hit = [j for j in range(G) if j not in order and np.array_equal(b[i * n:(i + 1) * n], ab[j])]
        if not hit:
            return None
        order.append(hit[0])
    if order == list(range(G)):
        return None
    return f"{', '.join(names[j] for j in order)} where the source has {', '.join(names)}"


def _sha256(path: Path) -> list[tuple[str, int, str]]:
    """``[(name, bytes, sha256)]`` of a file, or of a folder's regular files (sorted, at most :data:`MAX_HASHED`;
    links are not followed)."""
    import hashlib

    def one(p: Path) -> str:
        with open(p, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    if path.is_symlink() or not path.exists():
        return []
    if path.is_file():
        return [(path.name, path.stat().st_size, one(path))]
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    out = [(str(p.relative_to(path)), p.stat().st_size, one(p)) for p in files[:MAX_HASHED]]
    if len(files) > MAX_HASHED:
        out.append((f"... {len(files) - MAX_HASHED} more files not hashed", 0, ""))
    return out


def _files_table(c: Content) -> str:
    rows = []
    for role, path, fmt in (("source", c.src, c.src_format), ("target", c.dst, c.dst_format)):
        if not path or path == "None":
            continue
        got = _sha256(Path(path))
        rows.append(f"<tr><th>{role}</th><td class='mono'>{_e(path)}</td><td>{_e(fmt or '–')}</td>"
                    f"<td>{'' if got else 'not present'}</td><td></td></tr>")
        for name, size, digest in got:
            rows.append(f"<tr><td></td><td class='mono'>{_e(name)}</td><td></td><td>{size:,} bytes</td>"
                        f"<td class='mono'>{_e(digest)}</td></tr>")
    return ("<table><tr><th></th><th>path</th><th>format</th><th>size</th><th>sha256</th></tr>"
            + "".join(rows) + "</table>")


def _run_table(c: Content) -> str:
    import datetime
    import platform
    from importlib import metadata

    versions = []
    for lib in LIBRARIES:
        try:
            versions.append(f"{lib} {metadata.version(lib)}")
        except metadata.PackageNotFoundError:
            continue
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    call = {"conversion": "convert", "verification": "verify"}.get(c.kind, "diagnose")
    rows = [("command", c.command or f"rnnconvert.{call}(...) (Python API)"),
            ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")),
            ("host", f"{platform.node()} ({platform.platform()}; {cpu}; {os.cpu_count()} CPUs)"),
            ("python", f"{platform.python_implementation()} {platform.python_version()}"),
            ("libraries", ", ".join(versions))]
    return "<table>" + "".join(f"<tr><th>{k}</th><td class='mono'>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _summary(c: Content, verdict: str) -> str:
    """One box: the verdict, layers per verdict, the largest error against its tolerance, the notes, a refusal."""
    items = [f"verdict: <b>{_e(verdict or 'not verified')}</b>"]
    rep = c.verification
    if rep is not None and rep.layers:
        counts: dict[str, int] = {}
        for lc in rep.layers:
            counts[lc.verdict] = counts.get(lc.verdict, 0) + 1
        items.append(f"{len(rep.layers)} check(s): " + ", ".join(f"{n} {_e(v)}" for v, n in sorted(counts.items())))
        worst = max(rep.layers, key=lambda lc: (lc.seq_err / lc.seq_tol) if lc.seq_tol > 0 else -1.0)
        if worst.seq_tol > 0:
            items.append(f"largest sequence error against its tolerance: {_e(worst.name)} {_num(worst.seq_err)} "
                         f"of {_num(worst.seq_tol)}")
    if c.diagnosis is not None:
        items.append(f"diagnosis: {_e(c.diagnosis.verdict)} over {len(c.diagnosis.layers)} layer(s)")
    if c.error:
        items.append(f"refused or failed: {_e(c.error)}")
    if c.notes:
        items.append(f"{len(c.notes)} note(s) below")
    return "<div class='summary'><ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul></div>"


# ---------------------------------------------------------------------------------------------------------
# sections

def _layers_table(ckpt) -> str:
    cols = ["name", "cell", "input_size", "hidden_size", "num_layers", "bidirectional", "proj_size", "bias",
            "dtype", "gate_activation", "activation", "reset_after", "forget_bias", "go_backwards", "merge_mode",
            "source_class"]
    rows = [layer.describe() for layer in ckpt.layers]
    cols = [c for c in cols if any(c in r for r in rows)]
    head = "".join(f"<th>{_e(c).replace('_', '_<wbr>')}</th>" for c in cols)  # headers may wrap after '_'
    body = "".join("<tr>" + "".join(f"<td>{_e(r.get(c, '–'))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _params_table(src, dst, paired: dict[str, str] | None = None) -> str:
    """Per layer and tensor: bit-exact, the gate blocks permuted, or the largest measured difference between the
    target's parameters (read back) and the source's canonical ones (a TF1 forget bias folded). ``paired``:
    ``{source layer: target layer}`` where the target names its layers otherwise (verification's pairing,
    :class:`rnnconvert.verify.pairing.Pairing`); else layers are matched by name."""
    names = {layer.name: layer for layer in dst.layers}
    rows = []
    for s in src.layers:
        d = names.get((paired or {}).get(s.name, s.name))
        if d is None or (s.cell, s.input_size, s.hidden_size, s.num_layers, s.bidirectional) != (
                d.cell, d.input_size, d.hidden_size, d.num_layers, d.bidirectional):
            rows.append(f"<tr><td>{_e(s.name)}</td><td colspan=3>not compared: the target holds no layer of this "
                        f"name and shape</td></tr>")
            continue
        e = fold_forget_bias(s)
        for k in range(e.num_layers):
            for di in range(e.num_directions):
                ea, da = e.params[k][di].arrays(), d.params[k][di].arrays()
                for t in ea:
                    a, b = ea[t], da.get(t)
                    if b is None or a.shape != b.shape:
                        what = "not held by the target" if b is None else f"shape {b.shape} vs {a.shape}"
                    elif np.array_equal(a, b):
                        what = "bit-exact" + ("" if a.dtype == b.dtype else f" ({a.dtype} -> {b.dtype})")
                    elif t in ("w_ih", "w_hh", "b_ih", "b_hh") and (order := _permuted(a, b, s.cell.value)):
                        what = f"permuted gates: {order}"
                    else:
                        diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
                        rel = float((diff / np.maximum(np.abs(np.asarray(a, np.float64)), 1e-300)).max())
                        what = (f"differs: max abs {_num(float(diff.max()))}, max relative {_num(rel)} "
                                f"({'rounded' if rel < 1e-5 else 'rescaled or changed'})")
                    shown = s.name if d.name == s.name else f"{s.name} = {d.name}"
                    rows.append(f"<tr><td>{_e(shown)}</td><td>{k}</td><td>{'backward' if di else 'forward'}</td>"
                                f"<td><code>{_e(t)}</code>: {_e(what)}</td></tr>")
    return ("<table><tr><th>layer</th><th>stacked</th><th>direction</th><th>target against source</th></tr>"
            + "".join(rows) + "</table>")


def _measured(c, attr: str, fmt: str = ".3g") -> str:
    v = getattr(c, attr)
    return "–" if (attr.startswith("step") and not c.steps_checked) or (
        attr.startswith("seq") and not (c.seq_tol > 0 or c.seq_err > 0)) else _e(_num(v, fmt))


def _applied(c) -> str:
    """The one-step error against the tolerance that comparison applied, at the element closest to it, the
    tolerance named (docs/cli.md "Verdicts" rule E: measured, or the rigorous bound); a dash where no step ran."""
    if not c.steps_checked or not c.step_applied_kind:
        return "–"
    what = "measured tolerance (rule E)" if c.step_applied_kind == "measured" else "bound"
    return (f"error {_measured(c, 'step_applied_err')}, {what} {_measured(c, 'step_applied_tol')}: "
            f"{_measured(c, 'step_applied_ratio')} of it")


def _verification(rep) -> str:
    rows = []
    for c in rep.layers:
        rows.append(
            f"<tr><td>{_e(c.name)}</td><td><span class='badge {_e(c.verdict)}'>{_e(c.verdict)}</span></td>"
            f"<td>{_measured(c, 'step_err')}</td><td>{_applied(c)}</td><td>{_measured(c, 'step_ratio')}</td>"
            f"<td>{c.steps_checked or '–'}</td><td>{_measured(c, 'seq_err')}</td><td>{_measured(c, 'seq_tol')}</td>"
            f"<td>{_e(c.source_route)}<br>vs {_e(c.target_route)}</td><td>{_e(c.reason) or '–'}</td></tr>")
    head = ("<tr><th>layer</th><th>verdict</th><th>one-step max abs error</th>"
            "<th>one step against the tolerance applied (the element closest to it)</th><th>largest error / bound</th>"
            "<th>steps</th><th>sequence max abs error</th><th>sequence tolerance</th><th>engines</th>"
            "<th>reason</th></tr>")
    meta = (f"<p class='note'>batch {rep.batch} x {rep.steps} steps, seed {rep.seed}, "
            f"{rep.seconds:.2f} s</p>") if rep.batch else ""
    return f"{meta}<table>{head}{''.join(rows)}</table>"


def _plot(c) -> str:
    """Two panels as one PNG data URI ``<img>``: one-step error and bound per step; sequence error and tolerance
    per step. Empty when neither was measured."""
    if not (c.step_err_t or c.seq_err_t):
        return ""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2), dpi=90)
    axes = fig.subplots(1, 2)

    def pos(v):  # log axes: an exact 0 is not drawn (said in the legend)
        a = np.asarray(v, np.float64)
        return np.where(a > 0, a, np.nan)

    ax = axes[0]
    if c.step_err_t:
        t = np.arange(len(c.step_err_t))
        ax.semilogy(t, pos(c.step_err_t), "o-", color="#cf222e", label="max |target - exact| (h, c)")
        ax.semilogy(t, pos(c.step_bound_t), "s--", color="#0969da", label="max element of the bound")
        if c.step_applied_kind == "measured" and len(c.step_applied_t) == len(t):
            ax.semilogy(t, pos(c.step_applied_t), "^:", color="#1a7f37",
                        label="max element of the measured tolerance (rule E)")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "one-step comparison not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"{_plain(c.name)}: one step from the source's states", fontsize=9, **PLAIN)
    ax.set_xlabel("time step t (state before step t)", fontsize=8)
    ax = axes[1]
    if c.seq_err_t:
        t = np.arange(len(c.seq_err_t))
        ax.semilogy(t, pos(c.seq_err_t), "o-", color="#cf222e", label="max |target - source|")
        if c.seq_tol > 0:
            ax.axhline(c.seq_tol, color="#0969da", ls="--", label=f"tolerance {c.seq_tol:.2g}")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "sequence comparison not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"{_plain(c.name)}: the short sequence", fontsize=9, **PLAIN)
    ax.set_xlabel("time step", fontsize=8)
    for ax in axes:
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f"<img class='plot' alt='errors of {_e(c.name)} per time step' "
            f"src='data:image/png;base64,{data}'>")


def _diagnosis(dg) -> str:
    out = []
    for ld in dg.layers:
        nums = ", ".join(f"{k} {_num(v)}" for k, v in ld.errors.items())
        out.append(f"<h3>{_e(ld.name)} <span class='badge {_e(ld.verdict)}'>{_e(ld.verdict)}</span></h3>"
                   f"<p class='note'>compared with source layer <code>{_e(ld.source)}</code> by the float64 "
                   f"equations; max abs output difference: {_e(nums) or '–'}</p>")
        if ld.slips:
            out.append("<ul>" + "".join(f"<li>{_e(s.message)}</li>" for s in ld.slips) + "</ul>")
        if ld.note:
            out.append(f"<p>{_e(ld.note)}</p>")
    if dg.fixed:
        out.append(f"<p>Corrected file written: <code>{_e(dg.fixed)}</code> (verified: "
                   f"{_e(dg.fix_verification.verdict if dg.fix_verification else '–')})</p>")
    return "".join(out)


def render(c: Content) -> str:
    """The report's HTML text.

    Raises:
        DependencyError: matplotlib is missing and there is something to plot."""
    import sys

    # the package's version, read from the package module (loaded before any of its submodules) rather than
    # imported: ``rnnconvert.api`` writes reports (``report=``), and an import of the package here would close the
    # cycle package -> api -> report -> package (docs/architecture.md, import rule 1)
    __version__ = getattr(sys.modules.get(__name__.split(".")[0]), "__version__", "?")

    verdict = ""
    if c.error:
        verdict = "fail"
    if c.verification is not None:
        verdict = c.verification.verdict
    if c.diagnosis is not None:
        verdict = c.diagnosis.verdict
    title = {"conversion": "Conversion", "verification": "Verification", "diagnosis": "Diagnosis"}[c.kind]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>rnnconvert {title.lower()} "
             f"report</title><style>{CSS}</style></head><body>",
             f"<h1>rnnconvert {title.lower()} report <span class='badge {_e(verdict or 'none')}'>"
             f"{_e(verdict or 'not verified')}</span></h1>",
             f"<p class='note'>rnnconvert {_e(__version__)}</p>", _summary(c, verdict),
             "<h2>Run</h2>" + _run_table(c),
             "<h2>Source and target</h2>" + _files_table(c)]
    if c.error:
        parts.append(f"<h2>Refusal or error</h2><p><code>{_e(c.error)}</code></p>")
    parts.append("<h2>Layers</h2>")
    if c.src_ckpt is not None:
        parts.append("<h3>source</h3>" + _layers_table(c.src_ckpt))
    if c.dst_ckpt is not None:
        parts.append("<h3>target, read back</h3>" + _layers_table(c.dst_ckpt))
    if c.src_ckpt is not None and c.dst_ckpt is not None:
        pairing = getattr(c.verification, "pairing", None) or getattr(c.diagnosis, "pairing", None)
        paired = pairing.names() if pairing is not None else None
        parts.append("<h2>Parameters: exact, permuted, rounded or rescaled</h2>"
                     + _params_table(c.src_ckpt, c.dst_ckpt, paired))
    if c.modules or c.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(m)}</li>" for m in [*c.modules, *c.notes]) + "</ul>")
    if c.diagnosis is not None:
        parts.append("<h2>Diagnosis</h2>" + _diagnosis(c.diagnosis))
    rep = c.verification
    if rep is not None:
        parts.append("<h2>Verification</h2>" + _verification(rep))
        plots = [p for p in (_plot(lc) for lc in rep.layers) if p]
        if plots:
            parts.append("<h2>Errors per time step</h2><p class='note'>Left: the largest one-step error against "
                         "the largest element of its float bound; right: the short sequence's largest error "
                         "against its tolerance (log scale; an exact 0 is not drawn).</p>" + "".join(plots))
    fixed = getattr(c.diagnosis, "fix_verification", None)
    if fixed is not None:  # the corrected file's own verification (diagnose --fix)
        parts.append(f"<h2>Verification of the corrected file</h2><p class='mono'>{_e(c.diagnosis.fixed)}</p>"
                     + _verification(fixed) + "".join(p for p in (_plot(lc) for lc in fixed.layers) if p))
    if rep is None and (c.kind != "diagnosis" or (c.diagnosis is not None and c.diagnosis.verification_error)):
        why = c.diagnosis.verification_error if c.diagnosis is not None else "not verified"
        parts.append(f"<h2>Verification</h2><p>{_e(why or 'not verified')}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def check_path(path, force: bool, others: dict, cli_name: str = "--report", api_name: str = "report=") -> None:
    """A report path follows DST's rules, checked before any work: never one of ``others`` (``{label: path}``: SRC,
    DST, the file diagnosed, ``--fix``'s or ``--emit-module``'s outputs; by resolved path and file identity), never
    an existing file without ``force``, never a folder, link or device
    (:func:`rnnconvert.engine.commit.check_destination`); its folder exists.

    Raises:
        OutputExistsError (exit 6); FormatError: its folder does not exist."""
    from ..engine import commit
    from ..errors import FormatError

    path = Path(path)
    commit.check_distinct(path, others, "the report", cli_name)
    commit.check_destination(path, force)
    if not path.parent.exists():
        raise FormatError(f"{path.parent}: output directory does not exist ({api_name}{path})",
                          cli=f"{path.parent}: output directory does not exist ({cli_name} {path})")


def produce(path, kind: str, src, dst, read_opts: dict | None, read_dst: bool = True, force: bool = False,
            **content) -> None:
    """Gather (:func:`gather`: both files read by rnnconvert's readers where they can be) and :func:`write` the
    report of a command (``kind``: ``'conversion'``, ``'verification'``, ``'diagnosis'``) to ``path``; ``read_dst``
    false leaves DST unread (a failed conversion: nothing is there). ``content``: :func:`gather`'s keywords
    (``src_format``, ``dst_format``, ``modules``, ``notes``, ``error``, ``verification``, ``diagnosis``).

    Raises:
        as :func:`write`."""
    src_format, dst_format = content.pop("src_format", None), content.pop("dst_format", None)
    write(path, gather(kind, src, dst if read_dst else None, src_format=src_format, dst_format=dst_format,
                       read_opts=read_opts, **content), force=force)


def require() -> None:
    """Raise :class:`rnnconvert.errors.DependencyError` now when matplotlib (the ``report`` extra) is missing, before any work."""
    require_module("matplotlib", "report")


def write(path, content: Content, force: bool = False) -> None:
    """Write the report of ``content`` to ``path`` (a temporary file beside it, then renamed; an existing file
    replaced only with ``force``, never a folder, link or device: DST's rules,
    :func:`rnnconvert.engine.commit.check_destination`). The caller keeps it apart from SRC and DST
    (:func:`rnnconvert.engine.commit.check_distinct`).

    Raises:
        DependencyError: matplotlib (the ``report`` extra) is not installed.
        OutputExistsError: ``path`` exists (without ``force``) or is not a regular file.
        OutputError: the file cannot be written."""
    from ..engine import commit

    require()
    commit.check_destination(Path(path), force)
    text = _clean(render(content))
    commit.write_in_place(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"), force)
