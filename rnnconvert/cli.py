"""The ``rnnconvert`` command line (typer): a thin layer over :mod:`rnnconvert.api`.

``rnnconvert SRC DST`` converts (the ``convert`` command is implied); ``inspect``, ``verify`` and
``formats`` are the other commands. Errors print one line on stderr and exit with the code of their
:class:`~rnnconvert.errors.RNNConvertError` class (see :mod:`rnnconvert.errors`); never a traceback
(set ``RNNCONVERT_DEBUG=1`` to see one).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Convert trained LSTM/GRU/RNN weights between formats, exactly, and verify the result.")

COMMANDS = {"convert", "inspect", "verify", "formats", "diagnose"}


def _console(stderr: bool = False):
    from rich.console import Console

    # markup and emoji off: names come from files (a layer called '[bold]' is data); the lines printed
    # through it pass :func:`_shown` first (control characters made visible)
    return Console(stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=True,
                   width=None if sys.stdout.isatty() else 160)


def _shown(text: object) -> str:
    """A string from a file (a name, a message) as one terminal line (:func:`rnnconvert.errors.printable`)."""
    from .errors import printable

    return printable(text)


def _is_checkpoint_dir(src: Path) -> bool:
    """A directory that is ONE TensorFlow checkpoint/SavedModel or Orbax checkpoint (not a batch of files)."""
    from .formats.jax.sniff import orbax
    from .formats.tf.sniff import prefix_of

    return prefix_of(src) is not None or orbax(b"", src)


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _read_opts(gate_activation: Optional[str], extra: Optional[list[str]] = None,
               name_map: Optional[list[str]] = None) -> dict:
    out = {"gate_activation": gate_activation} if gate_activation else {}
    if name_map:
        out["map"] = list(name_map)  # read by rnnconvert.core.names.parse_map (docs/foreign-names.md)
    for item in extra or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--read-opt takes KEY=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = _value(val.strip())
    return out


MapOpt = Annotated[Optional[list[str]], typer.Option(
    "--map", help="How to read tensors under their owner's own names (.npz, .safetensors, .pt, TorchScript, "
                  "HDF5): PATTERN=ROLE (e.g. 'enc_*_x=w_ih'), gate_order=ifog, orientation=in_out, cell=GRU, "
                  "reset_after=false, or a .json/.toml map file; repeatable (docs/foreign-names.md).",
    show_default=False)]
GateOpt = Annotated[Optional[str], typer.Option(
    "--gate-activation", help="Gate activation of a Keras weights-only file that cannot tell (sigmoid, hard_sigmoid).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Print the details: every measured number, "
                                          "every slip, every layer pairing.")]
InputsOpt = Annotated[Optional[Path], typer.Option(
    "--inputs", help="Verify on these inputs instead of a random batch: an .npz of float (batch, steps, "
                     "input_size) arrays keyed by layer name.", show_default=False)]
AcceptOpt = Annotated[bool, typer.Option(
    "--accept-inconclusive", help="Keep the output (convert) or exit 0 (verify) when verification cannot decide "
                                  "(exit 9 otherwise).")]
ReportOpt = Annotated[Optional[Path], typer.Option(
    "--report", help="Also write a self-contained HTML report here (layers, exactness, notes, verdict, error plots; "
                     "needs the 'report' extra: matplotlib).", show_default=False)]
ReadOpt = Annotated[Optional[list[str]], typer.Option(
    "--read-opt", help="Reader option KEY=VALUE, repeatable (TensorFlow: forget_bias=0, cell_clip=3, "
                       "num_layers=2, hidden_size=256, bidirectional=true, activation=linear).")]


def _show_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"rnnconvert {__version__}")
        raise typer.Exit()


@app.callback()
def _top(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """Convert trained LSTM/GRU/RNN weights between formats, exactly, and verify the result."""


ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", help="Threads for the products of verification (default: the cores this process may use, at most 4, "
    "the measured best; RNNCONVERT_THREADS sets the default).", show_default=False)]


def _threads(n: int | None) -> None:
    """``--threads``: refuse a count below 1, then use it for this process (:mod:`rnnconvert.speed.parallel`)."""
    if n is None:
        return
    if n < 1:
        raise typer.BadParameter("--threads (or -j) is at least 1")
    from .speed import parallel

    parallel.set_threads(n)


@app.command()
def convert(
    src: Annotated[Path, typer.Argument(help="Source checkpoint.", show_default=False)],
    dst: Annotated[Path, typer.Argument(help="Output file; its extension picks the format unless --to is given.",
                                        show_default=False)],
    to: Annotated[Optional[str], typer.Option("--to", help="Output format name (see `rnnconvert formats`).")] = None,
    src_format: Annotated[Optional[str], typer.Option("--from", help="Source format name (default: detect).")] = None,
    verify: Annotated[Optional[str], typer.Option("--verify", help="reference (numpy, default) or framework.",
                                                  show_default=False)] = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip verification.")] = False,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing DST.")] = False,
    skip_existing: Annotated[bool, typer.Option("--skip-existing", help="With a directory SRC: leave outputs "
                                                "that exist as they are (resume a run).")] = False,
    gate_activation: GateOpt = None,
    read_opt: ReadOpt = None,
    name_map: MapOpt = None,
    cudnn: Annotated[bool, typer.Option("--cudnn", help="Keras 2 .h5 output: write CuDNNLSTM/CuDNNGRU layers "
                                        "(GPU-only in Keras 2) instead of LSTM/GRU.")] = False,
    recurrent_only: Annotated[bool, typer.Option(
        "--recurrent-only", help="A Keras 2 full model to .keras, .onnx or .pt2: write only the recurrent "
        "layers, each with its own input, not the whole model.")] = False,
    whole: Annotated[bool, typer.Option(
        "--whole", help="A Keras full model to .keras, .onnx or .pt2: insist on the whole model (exit 4 when a layer "
        "cannot be written whole); by default such a model's recurrent layers are written alone, with a note "
        "naming the layer.")] = False,
    mask_layout: Annotated[Optional[str], typer.Option(
        "--mask-layout", help="A masked Keras full model to .onnx: 'any' (default) makes masks exact for any "
        "padding (front, end, inside); 'end' writes a smaller graph, exact only when every sequence's padding is "
        "at its end.", show_default=False)] = None,
    runtime: Annotated[Optional[str], typer.Option(
        "--runtime", help="A Keras full model to .onnx: the runtime the graph is for: 'onnxruntime' (default, native "
        "LSTM/GRU/RNN nodes), 'openvino' (recurrent nodes as Scans of elementwise ops, which OpenVINO compiles "
        "and computes as tf_keras does) or 'tensorrt' (Scans where a node has HardSigmoid or another activation "
        "TensorRT refuses in RNN nodes).", show_default=False)] = None,
    states: Annotated[bool, typer.Option(
        "--states", help="A Keras full model to .onnx or .pt2 (and --emit-module's source): every unidirectional "
        "recurrent layer's initial states as graph inputs (state_in:<layer>:h/:c) and final states as outputs "
        "(state_out:...), to run a sequence in chunks. An .onnx of the recurrent layers alone refuses it.")] = False,
    emit_module: Annotated[Optional[Path], typer.Option(
        "--emit-module", help="A Keras 2 full model: also write it as readable PyTorch nn.Module source to this .py "
        "file (class Model) and its state dict beside it (<stem>_state.pt), verified against tf_keras.",
        show_default=False)] = None,
    verbose: VerboseOpt = False,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", help="Parallel workers: files at a time for a directory SRC (default 1); for one SRC file, "
        "threads (as --threads).", show_default=False)] = None,
    threads: ThreadsOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    inputs: InputsOpt = None,
    accept_inconclusive: AcceptOpt = False,
    device: Annotated[str, typer.Option("--device", help="Verify with cpu (DST's own framework, default) or cuda "
                                        "(cuDNN on the GPU, two routes).")] = "cpu",
    as_json: JsonOpt = False,
    report: ReportOpt = None,
) -> None:
    """Convert SRC to DST, verify it, and only then put DST in place. With a directory SRC, convert
    every recognised file under it into DST_DIR (--to required), in parallel with -j."""
    from dataclasses import replace

    from . import api
    from .errors import RNNConvertError

    verify = _verify_mode(verify, no_verify)
    if skip_existing and force:
        raise typer.BadParameter("--skip-existing and --force contradict each other; give one")
    if skip_existing and not src.is_dir():
        raise typer.BadParameter("--skip-existing applies to a directory SRC (batch conversion)")
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter("--device is cpu or cuda")
    if whole and recurrent_only:
        raise typer.BadParameter("--whole and --recurrent-only contradict each other; give one")
    # one record of the conversion's options (rnnconvert.engine.pipeline); --cudnn is a keras_h5 writer option:
    # any other writer refuses it, naming the options it takes
    opts = api.ConvertOptions(to=to, src_format=src_format, verify=None if no_verify else verify, force=force,
                              read_opts=_read_opts(gate_activation, read_opt, name_map), cudnn=cudnn,
                              recurrent_only=recurrent_only, mask_layout=mask_layout, whole=whole,
                              accept_inconclusive=accept_inconclusive, device=device, emit_module=emit_module,
                              write_opts={**({"runtime": runtime} if runtime is not None else {}),
                                          **({"states": True} if states else {})} or None)
    batch = src.is_dir() and not _is_checkpoint_dir(src)
    if not batch and threads is None:
        threads = jobs  # one file: -j N is its threads
    _threads(threads)
    if batch:
        jobs = jobs or 1
        from .speed import parallel  # the worker processes share the cores: each gets its part (environment)

        os.environ[parallel.VARIABLE] = str(threads or max(1, parallel.available() // jobs))
        if inputs is not None:
            raise typer.BadParameter("--inputs names the layers of one model; it does not apply to a directory")
        if report is not None:
            raise typer.BadParameter("--report describes one conversion; it does not apply to a directory")
        if emit_module is not None:
            raise typer.BadParameter("--emit-module writes one model's source; it does not apply to a directory")
        raise typer.Exit(_batch(src, dst, to, jobs, quiet, as_json, {"options": opts, "skip_existing": skip_existing}))
    if report is not None:
        from .verify import report as html_report

        html_report.require()
        state = None if emit_module is None else emit_module.with_name(emit_module.stem + "_state.pt")
        _check_report(report, force, {"the source": src, "the output": dst, "the emitted module": emit_module,
                                       "the emitted state dict": state})
    started = time.monotonic()
    with _progress(quiet, f"converting {src.name}") as bar:
        try:
            if inputs is not None:
                opts = replace(opts, verify_inputs=api.load_inputs(inputs))
            rep = api.convert(src, dst, progress=bar.update, options=opts)
        except RNNConvertError as exc:
            _pytorch_way_out(exc, src, dst)
            if report is not None:  # the refusal or failure, with what was measured
                done = getattr(exc, "report", None)
                _html(report, "conversion", src, dst, opts.read_opts, src_format=src_format, error=exc.cli_message(),
                      modules=done.modules if done else (), notes=done.notes if done else (),
                      verification=done.verification if done else None, read_dst=False, force=force)
            raise
        except KeyboardInterrupt:
            if not (bar.stage and bar.stage[0] == "done"):
                raise
            from .process import signals  # interrupted after DST was put in place: that is a success

            signals.received = None
            print(f"rnnconvert: {_shown(dst)} was written; interrupted before the report", file=sys.stderr)
            return
    try:  # DST is in place: whatever happens while reporting, the conversion succeeded (exit 0)
        if report is not None:
            _html(report, "conversion", src, dst, opts.read_opts, src_format=rep.src_format,
                  dst_format=rep.dst_format, modules=rep.modules, notes=rep.notes, verification=rep.verification,
                  force=force)
        _report(rep, as_json, verbose, time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001 - e.g. a closed stdout
        print(f"rnnconvert: warning: {_shown(rep.dst)} was written; the report could not be printed "
              f"({type(exc).__name__}: {_shown(exc)})", file=sys.stderr)


def _check_report(report: Path, force: bool, others: dict) -> None:
    """``--report PATH`` follows DST's rules, checked before any work (:func:`rnnconvert.verify.report.check_path`).

    Raises:
        OutputExistsError (exit 6); FormatError: its folder does not exist."""
    from .verify import report as html_report

    html_report.check_path(report, force, others)


def _html(path: Path, kind: str, src, dst, read_opts: dict, read_dst: bool = True, force: bool = False,
          **content) -> None:
    """Write the HTML report (:func:`rnnconvert.verify.report.produce`) of a command to ``path`` (replacing a file
    there only with ``force``)."""
    from .verify import report as html_report

    html_report.produce(path, kind, src, dst, read_opts, read_dst=read_dst, force=force, **content)


def _report(rep, as_json: bool, verbose: bool = False, seconds: float | None = None) -> None:
    """Print what :func:`rnnconvert.api.convert` did (after DST was put in place): the formats, the writer's
    lines and notes, what was carried beyond the recurrent layers, one short line per check (name, verdict,
    error against tolerance; ``verbose``: every measured number and both routes, :func:`_rule`), and a closing
    line (file, size, overall verdict, time). ``--json`` has everything (``carried``, ``bytes``, ``seconds``)."""
    size = _size(Path(rep.dst))
    carried = _carried(rep)
    if as_json:
        out = {"src": rep.src, "dst": rep.dst, "src_format": rep.src_format, "dst_format": rep.dst_format,
               "modules": rep.modules, "notes": rep.notes, "carried": carried, "bytes": size,
               "seconds": None if seconds is None else round(seconds, 3),
               "verification": rep.verification.to_dict() if rep.verification else None}
        typer.echo(json.dumps(out, indent=2))
        return
    con = _console()
    con.print(_shown(f"{rep.src} ({rep.src_format}) -> {rep.dst} ({rep.dst_format})"), soft_wrap=True)
    for line in rep.modules:
        con.print(f"  {_shown(line)}", soft_wrap=True)
    for note in rep.notes:
        con.print(f"  note: {_shown(note)}", soft_wrap=True)
    if carried:
        con.print(_shown(f"  carried beyond the recurrent layers: {_tensor_list(carried)}"), soft_wrap=True)
    checks = rep.verification.layers if rep.verification else []
    for c in checks:
        word = "verified" if c.ok else c.verdict
        if verbose:
            con.print(f"  {word} {_shown(c.name)}: {_rule(c)}; {c.source_route} vs {c.target_route}"
                      + (f" ({_shown(c.reason)})" if c.reason else ""), soft_wrap=True)
        else:
            con.print(f"  {word} {_shown(c.name)}: {_short_rule(c)}", soft_wrap=True)
            if c.reason:
                con.print(f"    {_shown(c.reason)}", soft_wrap=True)
    if not rep.verification:
        con.print("  not verified (--no-verify)")
    con.print(_shown(_closing(rep, size, seconds)), soft_wrap=True)


def _size(path: Path) -> int | None:
    """Bytes of the written file (of every file under a written folder); ``None`` where it cannot be told."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return None


def _bytes(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _carried(rep) -> list[str]:
    """The non-recurrent tensors the conversion wrote (:attr:`rnnconvert.api.ConversionReport.tensors`), none
    where a writer's note says they are not written (ONNX, Keras, TF, TFLite, cuDNN buffers)."""
    tensors = list(getattr(rep, "tensors", []) or [])
    dropped = any("non-recurrent tensor" in n and "not written" in n for n in rep.notes)
    return [] if dropped else tensors


def _tensor_list(names: list[str], room: int = 70) -> str:
    """``embedding (weight), dense (weight, bias)``: the tensors by owner, cut to about ``room`` characters."""
    owners: dict[str, list[str]] = {}
    for n in names:
        owner, _, leaf = n.rpartition(".")
        owners.setdefault(owner or n, []).append(leaf if owner else "")
    parts = [f"{o} ({', '.join(x for x in leaves if x)})" if any(leaves) else o for o, leaves in owners.items()]
    out, more = "", ""
    for k, part in enumerate(parts):
        if out and len(out) + len(part) > room:
            more = f", and {len(parts) - k} more"
            break
        out = f"{out}, {part}" if out else part
    return f"{len(names)} tensor{'s' if len(names) != 1 else ''}: {out}{more}"


def _short_rule(c) -> str:
    """A check in a few words: for a layer judged by :mod:`rnnconvert.verify.engine`, the short sequence's
    largest error against its tolerance and the one-step error against the tolerance that comparison applied, at
    the element closest to it (:func:`_step_against`); for another check
    (a whole-model comparison) its largest error against its tolerance (:func:`_rule` has every number)."""
    parts = []
    if c.seq_tol > 0 or c.seq_err > 0:
        parts.append(f"sequence: max abs error {c.seq_err:.2e} (tolerance {c.seq_tol:.1e})")
    if c.steps_checked:
        parts.append(f"one step {_step_against(c)}")
    if parts:
        return "; ".join(parts)
    return _unmeasured(c) or f"max abs error {c.max_abs_err:.2e} (tolerance {c.tolerance:.1e})"


def _step_against(c) -> str:
    """The one-step comparison's error against the tolerance it applied (docs/cli.md "Verdicts" rule E), both at the
    element closest to that tolerance (``step_applied_err``, ``step_applied_tol``), the tolerance named:
    ``'3.10e-07 (measured tolerance 9.8e-07)'``, or ``'(bound ...)'`` where the rigorous bound was applied."""
    what = "measured tolerance" if c.step_applied_kind == "measured" else "bound"
    return f"{c.step_applied_err:.2e} ({what} {c.step_applied_tol:.1e})"


def _unmeasured(c) -> str | None:
    """``'not compared'`` or ``'not measured'`` for a check without an error to print (:func:`_short_rule`,
    :func:`_rule`), else ``None``."""
    if c.max_abs_err != c.max_abs_err or c.max_abs_err == float("inf"):
        return "not compared"
    if c.tolerance <= 0 and c.max_abs_err == 0:
        return "not measured"
    return None


def _closing(rep, size: int | None, seconds: float | None) -> str:
    """The last line: the written file, its size, the overall verdict, the time the conversion took."""
    v = rep.verification
    took = "" if seconds is None else f", {seconds:.1f} s"
    if v is None:
        verdict = "not verified (--no-verify)"
    elif not v.layers:
        verdict = "written (no check ran)"
    elif v.inconclusive:
        unsure = sum(c.verdict == "inconclusive" for c in v.layers)
        verdict = f"inconclusive, accepted ({unsure} of {len(v.layers)} checks)"
    else:
        verdict = f"verified ({len(v.layers)} check{'s' if len(v.layers) != 1 else ''})"
    return f"{rep.dst}: {_bytes(size)}, {verdict}{took}"


def _pytorch_way_out(exc, src: Path, dst: Path) -> None:
    """A refusal into ``.pt`` (``torch.nn`` modules cannot express the layer) where a ``.pt2`` program can: the
    PyTorch user's way out named too, the ``--emit-module`` command (a Keras 2 full model: an exact
    ``torch.export`` program and readable ``nn.Module`` source beside it, docs/pytorch.md)."""
    from .engine.refusal import Refused

    if not isinstance(exc, Refused) or exc.fmt != "pt" or ".pt2" not in (exc.way_out or ""):
        return
    import shlex

    from .engine import registry

    try:  # a Keras 2 full model (its config stored, not a weights-only file): --emit-module applies
        spec = registry.detect(src).load()
        if spec.whole_model is None:
            whole = False
        else:
            from .api import load

            whole = spec.whole_model(load(src)) is not None
    except Exception:  # noqa: BLE001 - the refusal stands as it is
        whole = False
    pt2 = shlex.quote(str(dst.with_suffix(".pt2")))
    if whole:
        py = dst.with_suffix(".py")
        if not py.stem.isidentifier():
            py = py.with_name("model.py")
        tail = (f"rnnconvert {shlex.quote(str(src))} {pt2} --emit-module {shlex.quote(str(py))} (a Keras 2 full "
                f"model: an exact torch.export program, and nn.Module source to read and train)")
    else:
        tail = f"rnnconvert {shlex.quote(str(src))} {pt2} (a torch.export program: torch.export.load(path).module())"
    exc.way_out = f"{exc.way_out.rstrip('.')}. For PyTorch code: {tail}"


def _verify_mode(verify: Optional[str], no_verify: bool) -> str:
    """``--verify`` checked: 'reference' (default) or 'framework'; refused beside ``--no-verify``."""
    if verify is not None and no_verify:
        raise typer.BadParameter(f"--no-verify and --verify {verify} contradict each other; give one")
    if verify is None:
        return "reference"
    if verify not in ("reference", "framework"):
        raise typer.BadParameter("--verify must be 'reference' or 'framework'")
    return verify


def _rule(c) -> str:
    """How a layer was judged, in the numbers that were measured and only those (``--json`` gives the same
    numbers in full): for a layer judged by :mod:`rnnconvert.verify.engine`, the one-step comparison (largest
    error; the error against the tolerance applied, rule E's measured one or the bound, at the element closest to
    it, and the ratio there; the largest share of the bound) where it ran and the short full-sequence one (a measured
    sequence tolerance is never 0); for any other check (a format's whole-model comparison: no step or
    sequence fields), its own largest error and tolerance (``reference`` ``'float64'``: the tolerance
    includes twice the float32/float64 spread of the written model); nothing where nothing was measured."""
    parts = []
    if c.steps_checked:
        what = "measured tolerance" if c.step_applied_kind == "measured" else "bound"
        rule = "rule E" if c.step_applied_kind == "measured" else "the tolerance applied"
        parts.append(f"one step: max abs error {c.step_err:.2e}, closest to its tolerance {c.step_applied_err:.2e} "
                     f"({what} {c.step_applied_tol:.1e}, {rule}: {c.step_applied_ratio:.2g} of it), "
                     f"{c.step_ratio:.2g} of its bound at most, "
                     f"{c.steps_checked} steps" + (f" ({c.constructed} states constructed)" if c.constructed else "")
                     + f", every gate unit responsive in {c.coverage} or more")
        if c.resolution is not None or c.bias_resolution is not None:
            el = "not computed" if c.resolution is None else f"{c.resolution:.1e}"
            parts.append(f"resolution: any weight {el}, bias {c.bias_resolution:.1e}, row {c.row_resolution:.1e} "
                         f"of its row's scale")
    if c.seq_tol > 0 or c.seq_err > 0:
        parts.append(f"sequence: max abs error {c.seq_err:.2e} (tolerance {c.seq_tol:.1e})")
    if parts:
        return "; ".join(parts)
    if why := _unmeasured(c):
        return why
    spread = " with the float32/float64 spread" if c.reference == "float64" else ""
    return (f"max abs error {c.max_abs_err:.2e} (tolerance {c.tolerance:.1e}{spread}; "
            f"output scale {c.max_abs_ref:.2e})")


class _Bar:
    """The progress bar of one conversion (rich, on stderr): it appears only once the conversion has
    run for :attr:`DELAY` seconds (a pulsing bar while the source is read, then bytes written and layers
    verified as :func:`rnnconvert.api.convert` reports them); nothing when quiet or not a terminal."""

    DELAY = 1.0

    def __init__(self, enabled: bool, what: str) -> None:
        self.enabled, self.what = enabled, what
        self.prog = self.task = self.timer = None
        self.stage: tuple[str, float, float] | None = None

    def __enter__(self) -> "_Bar":
        if self.enabled:
            import threading

            self.timer = threading.Timer(self.DELAY, self._show)
            self.timer.daemon = True
            self.timer.start()
        return self

    def _show(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                             TimeElapsedColumn(), console=_console(stderr=True), transient=True)
        from rich.markup import escape

        self.what = escape(_shown(self.what))  # the description column reads markup
        self.task = self.prog.add_task(self.what, total=None, detail="reading")
        self.prog.start()
        if self.stage:
            self.update(*self.stage)

    def update(self, stage: str, done: float, total: float) -> None:
        """``api.convert``'s progress callback."""
        self.stage = (stage, done, total)
        if self.prog is None or stage == "done":
            return
        if stage.startswith("whole: "):  # the whole-model check's stages, in words
            self.prog.update(self.task, description="verifying the whole model", completed=done, total=total,
                             detail=stage[len("whole: "):])
        elif stage == "verify":  # layers, not bytes
            self.prog.update(self.task, description="verifying", completed=done, total=total,
                             detail=f"{done:.0f}/{total:.0f} layers")
        else:
            self.prog.update(self.task, description=self.what, completed=done, total=total,
                             detail=f"{done / 1e6:,.0f}/{total / 1e6:,.0f} MB")

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.prog is not None:
            self.prog.stop()


def _progress(quiet: bool, what: str) -> _Bar:
    """A :class:`_Bar` for one conversion: off when quiet or stderr is not a terminal."""
    return _Bar(not quiet and sys.stderr.isatty(), what)


def _batch(src: Path, dst: Path, to: Optional[str], jobs: int, quiet: bool, as_json: bool, kwargs: dict) -> int:
    from .batch import candidates, convert_tree
    from .errors import FormatError

    if not to:
        raise FormatError("a directory SRC needs --to FORMAT (see `rnnconvert formats`)")
    total = sum(1 for _ in candidates(src, skip=dst))
    show = not quiet and not as_json and sys.stderr.isatty()
    if show:
        from rich.progress import Progress

        prog = Progress(console=_console(stderr=True), transient=True)
        task = prog.add_task(f"converting {total} files", total=total)
        prog.start()
        on_done = lambda r: prog.advance(task)  # noqa: E731
    else:
        prog, on_done = None, None
    try:
        results = convert_tree(src, dst, to=to, jobs=jobs, on_done=on_done, **kwargs)
    finally:
        if prog:
            prog.stop()
    if as_json:
        typer.echo(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        from rich.table import Table

        t = Table(title=_shown(f"{src} -> {dst} ({to})"))
        for c in ("file", "status", "detail"):
            t.add_column(c)
        for r in results:
            t.add_row(_shown(Path(r.src).relative_to(src)), r.status, _shown(r.message))
        _console().print(t)
        n_ok = sum(r.status == "converted" for r in results)
        n_skip = sum(r.status == "skipped" for r in results)
        _console().print(f"{n_ok} of {len(results) - n_skip} converted" + (f", {n_skip} skipped" if n_skip else ""))
    return 0 if all(r.status in ("converted", "skipped") for r in results) else 8


@app.command()
def inspect(
    src: Annotated[Path, typer.Argument(help="Checkpoint to describe.", show_default=False)],
    src_format: Annotated[Optional[str], typer.Option("--from", help="Source format name (default: detect).")] = None,
    gate_activation: GateOpt = None,
    read_opt: ReadOpt = None,
    name_map: MapOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the recurrent layers of SRC: kinds, sizes, semantics; and its other tensors. A file whose tensors
    are not recognised: its tensors (names, shapes, dtypes) and a --map to start from (with --json: the same as
    the error's JSON object, key "unrecognised"), then the error (exit 3)."""
    from . import api
    from .errors import UnrecognisedError

    try:
        info = api.inspect(src, src_format, **_read_opts(gate_activation, read_opt, name_map))
    except UnrecognisedError as exc:
        if as_json:  # one JSON object: main's {"error": ...} with the listing beside it
            exc.listing = _unrecognised_listing(src, exc)
        else:
            _list_unrecognised(src, exc)
        raise
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    from rich.table import Table

    con = _console()
    meta = ", ".join(f"{k} {v}" for k, v in info["meta"].items() if v is not None)
    t = Table(title=_shown(f"{info['path']} ({info['format']}{', ' + meta if meta else ''})"))
    cols = {"name": "layer", "cell": "cell", "source_class": "source", "input_size": "I", "hidden_size": "H",
            "num_layers": "layers", "bidirectional": "bidi", "gate_activation": "gates", "activation": "act",
            "reset_after": "reset_after", "bias": "bias", "dtype": "dtype"}
    for head in cols.values():
        t.add_column(head, no_wrap=True)
    for lay in info["layers"]:
        t.add_row(*[_shown(lay.get(c, "-")) for c in cols])
    con.print(t)
    for line in info.get("recognised") or []:
        con.print(f"recognised {_shown(line)}")
    if info["tensors"]:
        con.print(_shown("other tensors: " + ", ".join(f"{k} {tuple(v)}" for k, v in info["tensors"].items())))


#: how many tensors `inspect` lists of a file it does not recognise
INSPECT_LISTED = 40


def _unrecognised_listing(src: Path, exc) -> dict:
    """What ``inspect`` shows of a file no reader recognised (:class:`rnnconvert.errors.UnrecognisedError`), as
    one dict (``inspect --json`` prints it as ``"unrecognised"`` beside ``"error"``): ``path``, ``total``
    (tensors in the file), ``tensors`` (the first :data:`INSPECT_LISTED`:
    ``{"name", "shape", "dtype"}``, names as read: JSON escapes them), ``more`` (``total`` less those listed),
    ``suggested_map`` (``--map`` items read from the shapes alone, docs/foreign-names.md; ``[]`` when the
    format's reader takes no map) and ``command`` (the ``inspect`` line that tries them, shell-quoted, or
    None)."""
    import shlex

    shown = exc.tensors[:INSPECT_LISTED]
    total = max(int(exc.total), len(shown))
    cmd = ("rnnconvert inspect " + shlex.quote(str(src)) + " "
           + " ".join(f"--map {shlex.quote(m)}" for m in exc.suggested_map)) if exc.suggested_map else None
    return {"path": str(src), "total": total,
            "tensors": [{"name": n, "shape": list(sh), "dtype": dt} for n, sh, dt in shown],
            "more": total - len(shown), "suggested_map": list(exc.suggested_map), "command": cmd}


def _list_unrecognised(src: Path, exc) -> None:
    """The tensors of a file no reader recognised (:class:`rnnconvert.errors.UnrecognisedError`), at most
    :data:`INSPECT_LISTED` of them, and the ``--map`` read from their shapes (docs/foreign-names.md); every
    name through :func:`_shown` (control characters made visible; the console prints no markup)."""
    from rich.table import Table

    con = _console()
    info = _unrecognised_listing(src, exc)
    t = Table(title=_shown(f"{src}: {info['total']} tensor(s), none recognised as recurrent weights"))
    for head in ("tensor", "shape", "dtype"):
        t.add_column(head, no_wrap=True)
    for row in info["tensors"]:
        t.add_row(_shown(row["name"]), _shown(tuple(row["shape"])), _shown(row["dtype"]))
    con.print(t)
    if info["more"]:
        con.print(f"... and {info['more']} more")
    if info["command"]:
        con.print("a --map read from the shapes alone (check each role and the gate order: the file does not say "
                  "them; docs/foreign-names.md):")
        con.print(_shown("  " + info["command"]), soft_wrap=True)


@app.command()
def verify(
    src: Annotated[Path, typer.Argument(help="Source checkpoint.", show_default=False)],
    dst: Annotated[Path, typer.Argument(help="Converted file to check against SRC.", show_default=False)],
    mode: Annotated[str, typer.Option("--verify", help="reference (numpy, default) or framework.")] = "reference",
    gate_activation: GateOpt = None,
    read_opt: ReadOpt = None,
    name_map: MapOpt = None,
    device: Annotated[str, typer.Option("--device", help="cpu (DST's own framework) or cuda (cuDNN, two routes).")]
    = "cpu",
    dtype: Annotated[str, typer.Option("--dtype", help="float32 or float16 (cuDNN route).")] = "float32",
    inputs: InputsOpt = None,
    accept_inconclusive: AcceptOpt = False,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
    report: ReportOpt = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing --report file.")] = False,
) -> None:
    """Check that DST computes what SRC computes, on a random batch (or --inputs); exit 5 if not, 9 when
    the check cannot decide."""
    from . import api
    from .errors import VerificationError

    if device not in ("cpu", "cuda") or dtype not in ("float32", "float16"):
        raise typer.BadParameter("--device is cpu or cuda; --dtype is float32 or float16")
    _threads(threads)
    if report is not None:
        from .verify import report as html_report

        html_report.require()
        _check_report(report, force, {"the source": src, "the file verified": dst})
    opts = _read_opts(gate_activation, read_opt, name_map)
    rep = api.verify(src, dst, mode=mode, read_opts=opts, device=device, dtype=dtype,
                     inputs=None if inputs is None else api.load_inputs(inputs))
    if report is not None:
        _html(report, "verification", src, dst, opts, verification=rep, force=force)
    paired = getattr(rep, "pairing", None)  # DST names its layers otherwise (rnnconvert.engine.pipeline.paired_layers)
    if as_json:
        out = rep.to_dict()
        out["pairing"] = paired.to_dict() if paired is not None else None
        if device == "cuda":
            from .verify.cudnn_layout import versions

            out["versions"] = versions()
        typer.echo(json.dumps(out, indent=2))
    else:
        con = _console()
        if paired is not None:  # how DST's layers were found (the lines below name SRC's layers)
            for line in paired.lines():
                con.print(_shown(line), soft_wrap=True)
        for note in getattr(rep, "notes", ()):  # what the checks ran on beyond their own batch (#39)
            con.print(f"note: {_shown(note)}", soft_wrap=True)
        for c in rep.layers:
            tag = {"ok": "ok  ", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}[c.verdict]
            con.print(f"{tag} {_shown(c.name)}: {_rule(c)}; {c.source_route} vs {c.target_route}"
                      + (f" ({_shown(c.reason)})" if c.reason else ""))
    if rep.failed:
        if as_json:  # the report (with "ok": false) is the JSON answer; one JSON document on stdout
            raise typer.Exit(VerificationError.exit_code)
        raise VerificationError(f"{dst} does not compute what {src} computes")
    if rep.inconclusive and not accept_inconclusive:
        from .errors import InconclusiveError

        if as_json:  # the report is the JSON answer
            raise typer.Exit(InconclusiveError.exit_code)

        raise InconclusiveError(f"verification of {dst} against {src} is inconclusive (see above; "
                                f"--accept-inconclusive to accept)")


@app.command()
def diagnose(
    src: Annotated[Path, typer.Argument(help="Source checkpoint.", show_default=False)],
    dst: Annotated[Path, typer.Argument(help="Someone's conversion of SRC to diagnose.", show_default=False)],
    fix: Annotated[Optional[Path], typer.Option("--fix", help="Write DST with the slips undone here (DST's format; "
                                                "verified against SRC).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing --fix output or --report "
                                        "file.")] = False,
    gate_activation: GateOpt = None,
    read_opt: ReadOpt = None,
    name_map: MapOpt = None,
    as_json: JsonOpt = False,
    report: ReportOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Name the slip (gate order, transpose, biases, directions, activations...) that makes DST compute
    something else than SRC, per layer; exit 0 when DST is right (or --fix wrote a verified file), 5 if not
    (docs/diagnose.md)."""
    from . import api
    from .errors import VerificationError

    if report is not None:
        from .verify import report as html_report

        html_report.require()
        _check_report(report, force, {"the source": src, "the file diagnosed": dst, "the --fix output": fix})
    opts = _read_opts(gate_activation, read_opt, name_map)
    rep = api.diagnose(src, dst, fix=fix, force=force, read_opts=opts)
    if report is not None:
        _html(report, "diagnosis", src, dst, opts, src_format=rep.src_format, dst_format=rep.dst_format,
              verification=rep.verification, diagnosis=rep, force=force)
    if as_json:
        typer.echo(json.dumps(rep.to_dict(), indent=2))
    else:
        _diagnosis_lines(rep, src, dst, verbose, gate_activation, read_opt, name_map)
    if rep.verdict != "ok" and not rep.fixed:
        raise typer.Exit(VerificationError.exit_code)


def _diagnosis_lines(rep, src: Path, dst: Path, verbose: bool, gate_activation, read_opt, name_map) -> None:
    """Print a diagnosis: how the layers were paired (where DST names them otherwise), the ok and unexplained
    layers one line each, the slips grouped (``12 slips in 2 layers (encoder, decoder), all z<->r``; a group of
    one slip is its own line; ``verbose``: every slip, and every pair), then the ``--fix`` command line that
    undoes them (when every layer is explained and nothing was fixed) or what ``--fix`` wrote."""
    import shlex

    from .verify import diagnose as dg

    con = _console()
    if rep.pairing is not None:
        for line in (rep.pairing.lines() if verbose else [rep.pairing.summary()]):
            con.print(_shown(line), soft_wrap=True)
    for ld in rep.layers:
        if ld.verdict == "ok":
            con.print(f"ok   {_shown(ld.note or ld.name)}")
        elif ld.verdict == "unexplained":
            con.print(f"UNEXPLAINED {_shown(ld.note)}")
        elif verbose:
            for s in ld.slips:
                con.print(f"SLIP {_shown(s.message)}")
    if not verbose:
        for g in dg.groups(rep.layers):
            if g["count"] == 1:
                con.print(f"SLIP {_shown(g['example'])}")
                continue
            where = (f"in {len(g['layers'])} layers ({', '.join(g['layers'])})" if len(g["layers"]) > 1
                     else f"in {g['layers'][0]}")
            con.print(_shown(f"SLIP {g['count']} slips {where}, all {g['short']}: {g['what']}"), soft_wrap=True)
        if any(g["count"] > 1 for g in dg.groups(rep.layers)):
            con.print("     (-v lists every slip; --json gives each with its layer, direction and tensor)")
    if rep.fixed:
        kept = f" (DST's layer names kept: {', '.join(rep.pairing.dst_names)})" if rep.pairing is not None else ""
        con.print(_shown(f"fixed: {rep.fixed} written and verified against {src}{kept}"), soft_wrap=True)
    elif rep.verdict == "slip":
        fixed = dst.with_name(f"{dst.stem}_fixed{dst.suffix}")
        extra = ([f"--gate-activation {shlex.quote(gate_activation)}"] if gate_activation else []) + \
            [f"--read-opt {shlex.quote(o)}" for o in read_opt or []] + [f"--map {shlex.quote(m)}" for m in name_map or []]
        cmd = " ".join(["rnnconvert diagnose", shlex.quote(str(src)), shlex.quote(str(dst)), *extra, "--fix",
                        shlex.quote(str(fixed))])
        con.print(_shown(f"to undo every slip (writes a corrected copy of DST, verified against SRC): {cmd}"),
                  soft_wrap=True)


@app.command()
def formats(as_json: JsonOpt = False) -> None:
    """List the formats rnnconvert reads and writes."""
    from . import api

    rows = api.list_formats()  # with each format's read_options
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        rw = ("read" if r["read"] else "") + ("/write" if r["write"] else "")
        typer.echo(f"{r['name']:<15} {rw:<11} {' '.join(r['extensions']) or '(directory)':<20} {r['description']}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app, maps rnnconvert errors to one stderr line and their exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    if any(a == "--report" or a.startswith("--report=") for a in args):  # the report's "command" row, as typed
        import shlex

        from .verify import report as html_report

        html_report.COMMAND = shlex.join(["rnnconvert", *(argv if argv is not None else sys.argv[1:])])
        try:
            return _main(args, as_json)
        finally:
            html_report.COMMAND = ""  # a later Python call in this process is no CLI command
    return _main(args, as_json)


def _main(args: list[str], as_json: bool) -> int:
    """:func:`main` after its argument checks."""
    from .errors import RNNConvertError

    typo = _command_typo(args)
    if typo:
        return _fail(f"no such command '{_shown(args[0])}'; did you mean '{typo}'?", 2, "UsageError", as_json)
    if args and args[0] not in COMMANDS and (not args[0].startswith("-") or "--" in args):
        args.insert(0, "convert")  # (``rnnconvert [OPTIONS] -- -odd.h5 DST``: a SRC starting with '-' after '--')
    from .process import signals

    signals.install()  # SIGTERM / SIGHUP clean up like Ctrl-C (rnnconvert/process/signals.py)
    # TensorFlow's C++ log lines (CUDA probing, a failed write's own report) are not for the user: errors
    # reach them as rnnconvert's one line (RNNCONVERT_DEBUG=1 or a TF_CPP_MIN_LOG_LEVEL of one's own shows them)
    if not os.environ.get("RNNCONVERT_DEBUG"):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        from .process import settings

        settings.check_all()  # every RNNCONVERT_* variable: a bad one is a usage error (exit 2), one line
        rc = app(args=args, prog_name="rnnconvert", standalone_mode=False)
        # typer turned the interruption into a plain 130; a command that returned 0 was not interrupted
        # (the handler's exception was swallowed where Python ignores exceptions, e.g. a fork hook, and the
        # work went on to its end: its output is in place, so no "no output was written")
        if signals.received is not None and rc:
            raise signals.Interrupted(signals.received)
        if isinstance(rc, int) and rc:
            return rc
    except RNNConvertError as exc:
        if os.environ.get("RNNCONVERT_DEBUG"):
            raise
        return _fail(_shown(exc.cli_message()), exc.exit_code, type(exc).__name__, as_json,
                     getattr(exc, "listing", None))
    except SystemExit as exc:
        return int(exc.code or 0)
    except KeyboardInterrupt as exc:
        print("rnnconvert: interrupted; no output was written", file=sys.stderr)
        return signals.exit_code(exc)
    except Exception as exc:  # click usage errors and genuine bugs
        # Usage errors come from the click that typer bundles (typer._click, private): match by behaviour.
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            if not args or type(exc).__name__ == "NoArgsIsHelpError":  # the help page, asked for by no arguments
                show()
                return code
            return _fail(_usage_line(exc, args), code, "UsageError", as_json)
        if type(exc).__name__ == "Abort":
            return 1
        if os.environ.get("RNNCONVERT_DEBUG"):
            raise
        limited = environment_limit(exc)
        if limited:  # not a bug: the process's limits (ulimit -v, threads) left too little to work with
            return _fail(f"{limited}; nothing was written", 10, "OutputError", as_json)
        return _fail(f"internal error: {type(exc).__name__}: {_shown(exc)} (set RNNCONVERT_DEBUG=1 for a traceback; "
                     "please report it)", 1, "InternalError", as_json)
    return 0


def _usage_line(exc: BaseException, args: list[str]) -> str:
    """A click usage error as one line (click prints three: usage, a hint, the error): its message, where to
    find help, and for an unknown option that is a path (``-odd.h5``) how to give it (after ``--``)."""
    msg = _shown(getattr(exc, "format_message", lambda: str(exc))()).strip()
    msg = (msg[:1].lower() + msg[1:]).rstrip(".")
    ctx = getattr(exc, "ctx", None)
    where = getattr(ctx, "command_path", None) or "rnnconvert"
    odd = next((a for a in args if a.startswith("-") and a != "--" and ("." in a or "/" in a or os.path.lexists(a))),
               None)
    if odd is not None and "no such option" in msg:
        return (f"{msg} ('{_shown(odd)}' is read as an option: a path starting with '-' goes after '--', e.g. "
                f"rnnconvert -- {_shown(odd)} DST, or ./{_shown(odd)})")
    return f"{msg} (see '{_shown(where)} -h')"


def environment_limit(exc: BaseException) -> str | None:
    """What the environment refused, when ``exc`` (or its cause) is the process running out of what its
    limits allow rather than a bug: memory (``MemoryError``), a thread (``can't start new thread`` under
    ``ulimit -v``), ``ENOMEM`` from a fork or a mapping, a library left half-imported by either. ``None`` otherwise."""
    seen = [exc, exc.__cause__, exc.__context__]
    for e in seen:
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
            # (ENOMEM: a fork, a thread's stack or a mapping refused under the limit)
            return "out of memory (the process's memory limit, e.g. ulimit -v, is too low for this command)"
        text = str(e) if e is not None else ""
        if isinstance(e, RuntimeError) and "can't start new thread" in text:
            return "cannot start a thread (the process's memory or thread limit, e.g. ulimit -v, is too low)"
        if isinstance(e, (AttributeError, ImportError)) and "partially initialized module" in text:
            return (f"a library failed to load ({_shown(text)[:120]}); the process's memory limit (e.g. ulimit -v) "
                    "is probably too low")
    return None


def _command_typo(args: list[str]) -> str | None:
    """The command the first argument probably meant, when it is no command, no option, no existing path
    (nor a TensorFlow checkpoint prefix) and close to a command name (``inspct`` -> ``inspect``)."""
    if not args or args[0] in COMMANDS or args[0].startswith("-"):
        return None
    first = Path(args[0])
    if first.exists() or first.with_name(first.name + ".index").exists() or "/" in args[0] or "." in args[0]:
        return None
    import difflib

    close = difflib.get_close_matches(args[0].lower(), sorted(COMMANDS), n=1, cutoff=0.6)
    return close[0] if close else None


def _fail(message: str, code: int, kind: str, as_json: bool, listing: dict | None = None) -> int:
    """Report a failure: one line on stderr, or with ``--json`` a JSON object on stdout
    (``{"error": {"type", "message", "exit_code"}}``, and ``"unrecognised": listing`` when given: ``inspect``
    of a file no reader recognised, :func:`_unrecognised_listing`); returns the exit code."""
    if as_json:
        out = {"error": {"type": kind, "message": message, "exit_code": code}}
        if listing is not None:
            out["unrecognised"] = listing
        typer.echo(json.dumps(out, indent=2))
    else:
        print(f"rnnconvert: error: {message}", file=sys.stderr)
    return code


def run() -> None:  # console_scripts entry point
    from .process import native_log

    native_log.install()  # TensorFlow's C++ log lines kept off the terminal
    quiet_warnings()
    private = private_tmpdir()
    rc = main()
    from .process import signals

    signals.ignore()  # done: a signal during the interpreter's teardown must not turn rc into a kill
    if private:
        import shutil

        shutil.rmtree(private, ignore_errors=True)
    leave(rc)


def private_tmpdir() -> str | None:
    """A private folder (``$TMPDIR/rnnconvert-XXXXXXXX``, mode 0700) made the process's ``TMPDIR`` for the
    command, removed by :func:`run` when it is done: what libraries leave in the temporary folder stays
    out of the user's. onnxruntime writes ``$TMPDIR/.ses`` when it is imported (1.32: verification of every
    ONNX output), the Keras 3 writer its ``rnnconvert-k3-*`` folders (removed by their own ``finally``).
    Set before anything is imported by a command; child processes (batch workers, the tf_keras helper)
    inherit it. ``None`` (the user's ``TMPDIR`` kept) when no folder can be made there."""
    import tempfile

    try:
        d = tempfile.mkdtemp(prefix="rnnconvert-")
    except OSError:
        return None
    os.environ["TMPDIR"] = d
    tempfile.tempdir = d
    return d


def quiet_warnings() -> None:
    """Python, torch and numpy warnings go to the ``py.warnings`` logger, which prints nothing, instead of
    stderr: a refusal is one line, and a library's ``UserWarning`` about a file it was handed is not the
    user's business (issue 29: refusals printed 3-13 lines). ``RNNCONVERT_DEBUG=1`` leaves them on stderr."""
    import logging

    if os.environ.get("RNNCONVERT_DEBUG"):
        return
    logging.captureWarnings(True)
    log = logging.getLogger("py.warnings")
    log.addHandler(logging.NullHandler())
    log.propagate = False


def leave(rc: int) -> None:
    """End the ``rnnconvert`` process with ``rc`` once the command is done, without the interpreter's
    teardown: the output is committed or discarded and every thread, child and temporary file of the command
    is gone (their ``with`` blocks have ended), so all that is left is Python unloading torch, TensorFlow
    and onnxruntime module by module: 0.35-0.45 s of every run that imported torch on the 2-core test machine
    (docs/performance.md, session 8), seconds for TensorFlow. ``sys.stdout`` and ``sys.stderr`` are flushed
    first; a reader that went away (``rnnconvert formats | head -1``) is ignored, as the exit code says
    what happened. Only the command line ends this way; :func:`main` returns to a caller that imports it."""
    for stream in dict.fromkeys((sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)
