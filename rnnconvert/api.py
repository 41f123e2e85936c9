"""The Python API: load, save, convert, verify, inspect, diagnose -- the front door of the package.

Every function raises only :class:`~rnnconvert.errors.RNNConvertError` subclasses on bad input. The conversion
and verification pipeline behind :func:`convert`, :func:`verify`, :func:`load` and :func:`save` is
:mod:`rnnconvert.engine.pipeline` (one :class:`ConvertOptions` record per conversion).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .engine import commit, pipeline, registry
from .engine.finite import check_finite  # noqa: F401  (public: rnnconvert.api.check_finite)
from .engine.pipeline import ConversionReport, ConvertOptions, load, load_object, save, unique_names
from .safety import budget
from .errors import FormatError, RNNConvertError
from .core.finite import all_finite  # noqa: F401  (re-exported: rnnconvert.api.all_finite)
from .core.model import Checkpoint
from .verify.engine import VerifyReport

__all__ = ["ConversionReport", "ConvertOptions", "DiagnosisReport", "all_finite", "check_finite", "convert",
           "diagnose", "inspect", "list_formats", "load", "load_inputs", "load_object", "save", "to_module",
           "torch_modules", "unique_names", "verify"]


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, to: str | None = None, src_format: str | None = None,
            verify: str | None = "reference", force: bool = False, seed: int = 0,
            read_opts: dict[str, Any] | None = None, write_opts: dict[str, Any] | None = None,
            progress: Callable[[str, float, float], None] | None = None,
            verify_inputs: dict[str, Any] | None = None, map: Any = None,
            accept_inconclusive: bool = False, device: str = "cpu", threads: int | None = None,
            emit_module: str | os.PathLike | None = None, whole: bool = False,
            options: ConvertOptions | None = None, report: str | os.PathLike | None = None) -> ConversionReport:
    """Convert ``src`` to ``dst``; verify before the result is renamed into place.

    When the source reader is ``LAZY`` and the target writer ``STREAM`` (docs/performance.md "Streaming
    conversion") the conversion holds one slab of parameters at a time (:func:`rnnconvert.engine.pipeline.convert`);
    otherwise the whole checkpoint is read, written, then verified. Same report either way.

    Args:
        to: target format name; default from ``dst``'s extension.
        src_format: source format name; default detected by content.
        verify: ``'reference'`` (default), ``'framework'``, or ``None`` to skip.
        force: overwrite an existing ``dst``.
        progress: ``progress(stage, done, total)``, called as work advances: stage ``'convert'`` with
            parameter bytes written (streaming conversions, after each slab), ``'verify'`` with layers
            verified (the target side), ``'whole: <what>'`` (done, total) as the whole-model check of a model
            written whole goes from stage to stage (its stage in words, ``done`` of ``total`` stages), ``'done'``
            (1, 1) once DST is in place. The CLI draws its progress bar from it.
        verify_inputs: ``{layer name: float (batch, steps, input_size) array}`` to verify those layers on
            instead of the random batch (:func:`load_inputs` reads them from an ``.npz``).
        map: how to read tensors under their owner's own names (``.npz``, ``.safetensors``, ``.pt``,
            TorchScript, non-Keras HDF5): a dict ``{"tensors": {PATTERN: ROLE}, "gate_order": ...,
            "orientation": ..., ...}``, a ``.json``/``.toml`` path, or a list of ``PATTERN=ROLE`` /
            ``gate_order=ifog`` items (:func:`rnnconvert.core.names.parse_map`, docs/foreign-names.md). A reader
            option, like ``read_opts={"map": ...}``.
        accept_inconclusive: keep the output when verification is inconclusive (a tolerance too loose to
            decide, :mod:`rnnconvert.verify.engine`); by default that raises :class:`InconclusiveError`.
        device: ``'cpu'`` (the written file run by its own framework) or ``'cuda'``: the written file's weights run
            through cuDNN on the GPU, both routes of :mod:`rnnconvert.verify.cuda` (the nn module and our packed
            buffer), as ``verify(..., device='cuda')`` does; the conversion is then read whole (not streamed),
            and DST must be a format rnnconvert reads back.
        threads: threads for verification's products (default: the cores this process may use, at most 4, or
            ``RNNCONVERT_THREADS``; :mod:`rnnconvert.speed.parallel`); the bytes written and the verdicts do not
            depend on it.
        emit_module: a ``.py`` path: also write the source's whole Keras 1/2 model as readable ``torch.nn.Module``
            source there (class ``Model``) and its state dict beside it (``<stem>_state.pt``, ``torch.save`` of
            plain tensors: ``torch.load(path, weights_only=True)``); :mod:`rnnconvert.whole.formats.torch.module_write`.
            Verified like a ``.pt2`` (the written file imported, the state loaded, every model output against
            tf_keras: checks ``module output <i>``) and put in place with DST, or not at all.
        whole: a Keras full model that the whole-model writers cannot build (a layer they do not build:
            :class:`~rnnconvert.errors.WholeModelError`) is refused; by default (``False``) its recurrent layers are
            written alone, as ``write_opts={"recurrent_only": True}`` writes them, with a note naming that layer
            (its name and class; issue #41). ``whole=True`` with ``recurrent_only`` raises ``OptionError``.
        report: also write the self-contained HTML report the CLI's ``--report`` writes here
            (:mod:`rnnconvert.verify.report`: layers, exactness, notes, verdict, error plots; the ``report`` extra,
            matplotlib): checked before any work like DST (never SRC, DST or the emitted files; an existing file
            replaced only with ``force``), written once DST is in place, or, when the conversion fails, with the
            error and what was measured (then the error is raised).
        options: every option above as one :class:`ConvertOptions` record (the CLI builds one; it also holds the
            writer options ``cudnn``, ``recurrent_only`` and ``mask_layout``); give it or the keywords, not both
            (``TypeError``).

    A Keras 1/2 full-model source is written whole by the writers that take the write option ``whole_model``
    (``.onnx``: one graph; ``.pt2``: a ``torch.export`` program; issue #30) and verified end to end by the
    target runtime's ``verify_whole``; ``write_opts={"recurrent_only": True}`` writes its recurrent layers alone.

    Returns:
        a :class:`ConversionReport`.

    Raises:
        OutputExistsError, FormatError, UnsupportedError, VerificationError, InconclusiveError, DependencyError
        (also: ``report`` without matplotlib, before any work). On any error ``dst`` is left as it was (absent or
        with its previous content).
    """
    given = ConvertOptions(to=to, src_format=src_format, verify=verify, force=force, seed=seed, read_opts=read_opts,
                           write_opts=write_opts, verify_inputs=verify_inputs, map=map,
                           accept_inconclusive=accept_inconclusive, device=device, threads=threads,
                           emit_module=emit_module, whole=whole)
    if options is None:
        options = given
    elif given.given():
        raise TypeError(f"convert() takes options= or the keywords it holds, not both (also given: "
                        f"{', '.join(given.given())})")
    if report is None:
        return pipeline.convert(src, dst, options, progress)
    from .verify import report as html_report

    html_report.require()
    emitted = None if options.emit_module is None else Path(options.emit_module)
    state = None if emitted is None else emitted.with_name(emitted.stem + "_state.pt")
    html_report.check_path(report, options.force, {"the source": src, "the output": dst,
                                                   "the emitted module": emitted, "the emitted state dict": state})
    read_opts = options.reader_options()
    try:
        rep = pipeline.convert(src, dst, options, progress)
    except RNNConvertError as exc:  # the refusal or failure, with what was measured
        done = getattr(exc, "report", None)
        html_report.produce(report, "conversion", src, dst, read_opts, src_format=options.src_format, error=str(exc),
                            modules=done.modules if done else (), notes=done.notes if done else (),
                            verification=done.verification if done else None, read_dst=False, force=options.force)
        raise
    html_report.produce(report, "conversion", src, dst, read_opts, src_format=rep.src_format,
                        dst_format=rep.dst_format, modules=rep.modules, notes=rep.notes,
                        verification=rep.verification, force=options.force)
    return rep


def verify(src: str | os.PathLike, dst: str | os.PathLike, *, mode: str = "reference", seed: int = 0,
           src_format: str | None = None, dst_format: str | None = None,
           read_opts: dict[str, Any] | None = None, device: str = "cpu", dtype: str = "float32",
           inputs: dict[str, Any] | None = None, map: Any = None, threads: int | None = None,
           report: str | os.PathLike | None = None, force: bool = False) -> VerifyReport:
    """Compare an existing converted file ``dst`` with its source ``src`` (see :mod:`rnnconvert.verify.engine`).

    Args:
        map: how to read ``src``'s own tensor names (see :func:`convert`).
        inputs: ``{layer name: float (batch, steps, input_size) array}`` to verify those layers on instead of
            the random batch (:func:`load_inputs`); for a Keras model written whole, arrays keyed by the model's
            input names (integer token ids allowed) feed its whole-model check, as in :func:`convert`.
        device: ``'cpu'`` runs ``dst`` in its own framework; ``'cuda'`` runs its weights through cuDNN by
            both routes of :mod:`rnnconvert.verify.cuda` (``dst`` must be a readable format).
        dtype: ``'float32'`` or ``'float16'`` (cuDNN only).
        threads: see :func:`convert`.
        report: also write the HTML report the CLI's ``verify --report`` writes here (see :func:`convert`; checked
            before any work, never SRC or DST); ``force``: replace an existing file there.

    Raises:
        FormatError, DependencyError (``device='cuda'`` without a GPU), VerificationError (the cuDNN
        buffer layout differs from :func:`rnnconvert.core.cudnn.layout`); a failed or inconclusive comparison is
        reported (:attr:`VerifyReport.verdict`), not raised.
    """
    if report is not None:
        from .verify import report as html_report

        html_report.require()
        html_report.check_path(report, force, {"the source": src, "the file verified": dst})
    rep = pipeline.verify(src, dst, mode=mode, seed=seed, src_format=src_format, dst_format=dst_format,
                          read_opts=read_opts, device=device, dtype=dtype, inputs=inputs, map=map, threads=threads)
    if report is not None:
        html_report.produce(report, "verification", src, dst, {**(read_opts or {}), **({"map": map} if map else {})},
                            verification=rep, force=force)
    return rep


def load_inputs(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Verification inputs from an ``.npz``: one float array ``(batch, steps, input_size)`` per layer, keyed by
    the layer's name (``rnnconvert inspect`` lists them); read with ``allow_pickle=False``.

    Raises:
        FormatError: not a readable ``.npz``, or an array that is not floating point.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise FormatError(f"{path}: not a readable .npz of verification inputs: {exc}") from exc
    for k, a in got.items():
        if a.dtype.kind not in "fiu":  # integer: token ids for a whole Keras model's Embedding input
            raise FormatError(f"{path}: verification input '{k}' is {a.dtype}, not floating point or integer")
    return got


def list_formats() -> list[dict[str, Any]]:
    """The formats rnnconvert knows, in detection order: for each a dict with ``name`` (the name
    ``format=``/``to=`` take), ``extensions``, ``read`` and ``write`` (bools: what rnnconvert can do
    with it), ``read_options`` (the reader options it accepts) and ``description``."""
    return [{"name": f.name, "extensions": list(f.extensions), "read": f.can_read, "write": f.can_write,
             "read_options": list(registry.read_options(f)), "description": f.description}
            for f in registry.FORMATS]


def inspect(path: str | os.PathLike, format: str | None = None, **opts: Any) -> dict[str, Any]:
    """Describe a file: format, recurrent layers (kinds, sizes, semantics) and other tensors' shapes;
    ``recognised``: for tensors read by their owner's own names (:mod:`rnnconvert.core.names`), one line per
    layer saying which name rules, orientation and gate order were used. ``**opts``: reader options,
    e.g. ``map=`` (see :func:`convert`).

    The recurrent parameters are not read where the format's reader is lazy (only shapes and dtypes are
    needed): every format's dataset/tensor headers are still checked against the resource budget."""
    ckpt = load(path, format, lazy=True, **opts)
    return {
        "path": str(path),
        "format": ckpt.format,
        "meta": {k: v for k, v in ckpt.meta.items() if k not in ("path", "recognised")},
        # foreign names (rnnconvert.core.names): per layer, which rules, orientation and gate order were used
        "recognised": list(ckpt.meta.get("recognised") or []),
        "layers": [layer.describe() for layer in ckpt.layers],
        "tensors": {k: list(v.shape) for k, v in ckpt.tensors.items()},
    }


def torch_modules(src: str | os.PathLike | Checkpoint, **opts: Any) -> dict[str, Any]:
    """Ready ``torch.nn.LSTM/GRU/RNN`` modules (eval mode, ``batch_first=True``) for every recurrent layer.

    Raises:
        UnsupportedError: a layer PyTorch cannot express.
    """
    from .runtimes import torch as torch_rt

    ckpt = src if isinstance(src, Checkpoint) else load(src, **opts)
    registry.get("pt").load().check(ckpt)  # modules() assumes the .pt writer's check passed, as a writer does
    return torch_rt.modules(ckpt)


def to_module(src: str | os.PathLike, *, src_format: str | None = None, read_opts: dict[str, Any] | None = None,
              verify: bool = True, verify_inputs: dict[str, Any] | None = None, seed: int = 0,
              accept_inconclusive: bool = False):
    """The source's whole Keras 1/2 model as a ``torch.nn.Module`` object (eval mode, float32): the module
    ``--emit-module`` writes (:mod:`rnnconvert.whole.formats.torch.module_write`: readable source, class ``Model``,
    its inputs in the model's input order, token ids as integer tensors), built in a temporary folder, imported
    from there and returned with its state dict loaded; nothing is left on disk. The source is read by
    rnnconvert's hardened readers (never the file's own code: the module is generated by rnnconvert from the
    sanitized config).

    With ``verify`` (default) the module is checked against tf_keras running the source as ``--emit-module``'s
    is (:func:`rnnconvert.whole.runtimes.torch_export.verify_module`), and the report is attached as
    ``module.rnnconvert_verification`` (a :class:`~rnnconvert.verify.engine.VerifyReport`).

    Raises:
        UnsupportedError: a source without a Keras 1/2 full model, or a layer the module does not build (named).
        VerificationError: the module does not compute what the source computes. InconclusiveError: the check
        could not decide (unless ``accept_inconclusive``). DependencyError: torch (or, to verify, tf_keras)
        missing. FormatError: the source cannot be read.
    """
    import tempfile

    from .engine import protocol
    from .verify.engine import VerifyReport

    src_p = Path(src)
    in_fmt = registry.get(src_format) if src_format else registry.detect(src_p)
    ckpt = load(src_p, in_fmt.name, **(read_opts or {}))
    emit = protocol.located("rnnconvert.whole.pipeline:emit")
    load_module = protocol.located("rnnconvert.whole.runtimes.torch_export:load_module")
    with tempfile.TemporaryDirectory(prefix="rnnconvert-module-") as tmp:
        py, state = Path(tmp) / "rnnconvert_model.py", Path(tmp) / "rnnconvert_model_state.pt"
        _, em = emit(ckpt, in_fmt.load(), src_p, (py, state), None)
        py.write_text(em.source, encoding="utf-8")
        state.write_bytes(protocol.located("rnnconvert.whole.formats.torch.module_write:state_bytes")(em.state))
        module = load_module(py, state)
        rep = None
        if verify:
            check = protocol.located("rnnconvert.whole.runtimes.torch_export:verify_module")
            rep = VerifyReport(seed=seed)
            rep.layers += check(ckpt, src_p, py, state, inputs=verify_inputs, seed=seed)
            rep.raise_if_failed(accept_inconclusive=accept_inconclusive)
    module.rnnconvert_verification = rep
    return module


@dataclass
class DiagnosisReport:
    """What :func:`diagnose` found: per DST layer a :class:`rnnconvert.verify.diagnose.LayerDiagnosis`
    (``'ok'``, ``'slip'`` with its slips, or ``'unexplained'``), the ordinary verification of DST against SRC
    where it could run (``verification``; else ``verification_error``), and the corrected file when asked."""

    src: str
    dst: str
    src_format: str
    dst_format: str
    layers: list = field(default_factory=list)
    verification: VerifyReport | None = None
    verification_error: str = ""
    fixed: str | None = None
    fix_verification: VerifyReport | None = None
    #: how DST's layers were paired with SRC's where DST names them otherwise
    #: (:class:`rnnconvert.verify.pairing.Pairing`; ``None``: all by name, or compared as one-layer pieces)
    pairing: Any = None

    @property
    def verdict(self) -> str:
        """``'ok'`` (every layer computes the source's function), ``'slip'`` (every other layer explained by
        known slips) or ``'unexplained'``."""
        got = {ld.verdict for ld in self.layers}
        return "unexplained" if "unexplained" in got else "slip" if "slip" in got else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "src_format": self.src_format, "dst_format": self.dst_format,
                "verdict": self.verdict, "layers": [ld.to_dict() for ld in self.layers],
                "verification": self.verification.to_dict() if self.verification else None,
                "verification_error": self.verification_error or None, "fixed": self.fixed,
                "fix_verification": self.fix_verification.to_dict() if self.fix_verification else None,
                "pairing": self.pairing.to_dict() if self.pairing is not None else None}


def diagnose(src: str | os.PathLike, dst: str | os.PathLike, *, fix: str | os.PathLike | None = None,
             force: bool = False, src_format: str | None = None, dst_format: str | None = None,
             read_opts: dict[str, Any] | None = None, seed: int = 0, run_verify: bool = True,
             report: str | os.PathLike | None = None) -> DiagnosisReport:
    """Name the slip that makes ``dst`` (someone's conversion of ``src``) compute something else
    (:mod:`rnnconvert.verify.diagnose`; docs/diagnose.md).

    Both files are read by rnnconvert's readers (``read_opts`` for ``src``); each DST layer is compared with its
    source layer tensor by tensor, the slip found is confirmed by the float64 equations. ``run_verify``: also
    run the ordinary verification of DST (:func:`verify`; its numbers go to the report).

    Args:
        fix: write DST with every slip undone here, with DST's own format's writer (:func:`save`), verified
            against ``src`` (:func:`verify`) before it is put in place.
        report: also write the HTML report the CLI's ``diagnose --report`` writes here (see :func:`convert`; checked
            before any work, never SRC, DST or ``fix``; ``force`` replaces an existing file there).

    Raises:
        FormatError, UnsupportedError (``fix``: DST's format cannot express the source's layer, e.g. a Keras-2
        ``hard_sigmoid`` in ``.pt``; the way out is named), VerificationError (``fix``: some layer is
        unexplained, or the corrected file does not verify), OutputExistsError.
    """
    from .verify import diagnose as dg

    if fix is not None:  # before any work: never SRC or the file diagnosed, never an existing file unforced
        commit.check_distinct(Path(fix), {"the source": src, "the file diagnosed": dst}, "the fix output",
                              "--fix output")
        commit.check_destination(Path(fix), force)
    if report is not None:
        from .verify import report as html_report

        html_report.require()
        html_report.check_path(report, force, {"the source": src, "the file diagnosed": dst, "the --fix output": fix})
    budget.regular_source(src)
    budget.regular_source(dst)
    s_ckpt = load(src, src_format, **(read_opts or {})).materialize()
    d_ckpt = load(dst, dst_format).materialize()
    try:
        layers = dg.diagnose(s_ckpt, d_ckpt, seed)
    except ValueError as exc:
        raise FormatError(f"{dst}: {exc}") from exc
    rep = DiagnosisReport(str(src), str(dst), s_ckpt.format, d_ckpt.format, layers,
                          pairing=pipeline.paired_layers(s_ckpt, d_ckpt, seed))
    if run_verify:
        try:
            rep.verification = verify(src, dst, src_format=s_ckpt.format, dst_format=d_ckpt.format,
                                      read_opts=read_opts, seed=seed)
        except RNNConvertError as exc:
            rep.verification_error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if fix is not None:
        rep.fixed, rep.fix_verification = pipeline.write_fixed(s_ckpt, d_ckpt, layers, Path(src), Path(fix), force,
                                                               read_opts, seed, Path(dst))
    if report is not None:
        html_report.produce(report, "diagnosis", src, dst, read_opts, src_format=rep.src_format,
                            dst_format=rep.dst_format, verification=rep.verification, diagnosis=rep, force=force)
    return rep
