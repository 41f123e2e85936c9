"""The conversion pipeline (issue #38): what :func:`rnnconvert.api.convert`, :func:`rnnconvert.api.verify`,
:func:`rnnconvert.api.load` and :func:`rnnconvert.api.save` do, behind the front door of :mod:`rnnconvert.api`.

One conversion is described by one record, :class:`ConvertOptions` (the API's keywords, or what the CLI parsed),
and run by :func:`convert`: detection, the destination rules, the whole-model routes (a source holding a whole
Keras model, a writer of whole models), the writer's refusals, streaming when the reader is lazy and the writer
streams (docs/performance.md "Streaming conversion"), verification of the written temporary file, then the rename
(:mod:`rnnconvert.engine.commit`). The steps only whole models take (``--emit-module``) live in
:mod:`rnnconvert.whole.pipeline`, above this module (docs/architecture.md): they are named by location
(:func:`rnnconvert.engine.protocol.located`) and imported only when asked for.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from . import commit, registry
from .checked import CheckedSlabs
from .finite import check_finite
from .protocol import located
from .refusal import Refused
from .stream import FoldingWriter, order, slab_bytes, stream_write, writer_view
from ..core.model import Checkpoint
from ..errors import (DependencyError, FormatError, OptionError, OutputExistsError, RNNConvertError, UnsupportedError,
                      WholeModelError)
from ..safety import budget
from ..speed.prefetch import ReadAhead, ahead_window, prefetch
from ..verify.checks import WHOLE_STAGE
from ..verify.engine import LayerCheck, StreamedVerification, VerifyReport, import_engine, verify as _verify
from ..verify.target import as_target

#: the steps only whole models take (``--emit-module``), in ``rnnconvert/whole/`` above this module: named by
#: location, imported on the first call (a conversion of recurrent layers imports nothing of ``whole/``)
EMIT_PATHS = located("rnnconvert.whole.pipeline:emit_paths")
EMIT = located("rnnconvert.whole.pipeline:emit")
EMIT_WRITE = located("rnnconvert.whole.pipeline:emit_write")
GRAPH_FED = located("rnnconvert.whole.pipeline:graph_fed")


@dataclass(frozen=True)
class ConvertOptions:
    """Every option of one conversion (:func:`convert`), as one record: what :func:`rnnconvert.api.convert`'s
    keywords say, or what the CLI's ``convert`` command parsed. Frozen: a stage reads it, never changes it
    (:func:`dataclasses.replace` makes a changed copy, as the batch runner does for ``to``).

    Attributes:
        to: target format name (``rnnconvert formats``); ``None``: from DST's extension.
        src_format: source format name; ``None``: detected by content (:func:`rnnconvert.engine.registry.detect`).
        verify: ``'reference'`` (default), ``'framework'``, or ``None`` to skip verification.
        force: replace an existing DST (and ``--emit-module``'s files).
        seed: the seed of the verification batch.
        read_opts: reader options (``gate_activation``, TensorFlow's ``forget_bias``, ...;
            :func:`rnnconvert.engine.registry.read_options` lists each format's).
        write_opts: writer options, as the writer takes them (``external_data``, ...); the three below are
            added to them.
        verify_inputs: ``{layer name: float (batch, steps, input_size) array}`` (or a whole Keras model's
            inputs by model input name, integer token ids allowed) to verify on instead of the random batch.
        map: how to read tensors under their owner's own names (a reader option: a dict, a ``.json``/``.toml``
            path or ``PATTERN=ROLE`` items; :func:`rnnconvert.core.names.parse_map`).
        accept_inconclusive: keep DST when verification is inconclusive (else :class:`~rnnconvert.errors.InconclusiveError`).
        device: ``'cpu'`` or ``'cuda'`` (the written weights run through cuDNN, :mod:`rnnconvert.verify.cuda`).
        threads: threads for verification's products (``None``: :mod:`rnnconvert.speed.parallel`'s default).
        emit_module: a ``.py`` path: also write the source's whole Keras model as ``torch.nn.Module`` source
            (:mod:`rnnconvert.whole.pipeline`).
        cudnn: the Keras 2 ``.h5`` writer's option ``cudnn`` (CuDNNLSTM/CuDNNGRU layers; CLI ``--cudnn``).
        recurrent_only: write option ``recurrent_only`` (a whole model's recurrent layers alone; CLI
            ``--recurrent-only``).
        mask_layout: the whole-model ONNX writer's option ``mask_layout`` (``'any'`` or ``'end'``; CLI
            ``--mask-layout``).
        whole: a source holding a whole model that the whole-model writers cannot build
            (:class:`~rnnconvert.errors.WholeModelError`: a layer they do not build) is refused (CLI ``--whole``);
            by default its recurrent layers are written alone, as ``recurrent_only`` writes them, with a note
            naming that layer (issue #41). Contradicts ``recurrent_only`` (:class:`~rnnconvert.errors.OptionError`).
    """

    to: str | None = None
    src_format: str | None = None
    verify: str | None = "reference"
    force: bool = False
    seed: int = 0
    read_opts: Mapping[str, Any] | None = None
    write_opts: Mapping[str, Any] | None = None
    verify_inputs: Mapping[str, Any] | None = None
    map: Any = None
    accept_inconclusive: bool = False
    device: str = "cpu"
    threads: int | None = None
    emit_module: str | os.PathLike | None = None
    cudnn: bool = False
    recurrent_only: bool = False
    mask_layout: str | None = None
    whole: bool = False

    def reader_options(self) -> dict[str, Any]:
        """``read_opts`` with ``map`` added (a reader option)."""
        opts = dict(self.read_opts or {})
        if self.map is not None:
            opts["map"] = self.map
        return opts

    def writer_options(self) -> dict[str, Any] | None:
        """``write_opts`` with ``cudnn``, ``recurrent_only`` and ``mask_layout`` added where set; ``None`` when empty."""
        opts = {**(self.write_opts or {}), **({"cudnn": True} if self.cudnn else {}),
                **({"recurrent_only": True} if self.recurrent_only else {}),
                **({"mask_layout": self.mask_layout} if self.mask_layout is not None else {})}
        return opts or None

    def given(self) -> list[str]:
        """The fields that differ from their defaults (by identity, or equality for plain values)."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v is f.default or (isinstance(v, (str, int, float)) and v == f.default):
                continue
            out.append(f.name)
        return out


@contextlib.contextmanager
def way_out():
    """Within the block, a writer's :class:`Refused` gets its way out (the other formats that express the
    layer, :func:`rnnconvert.engine.registry.complete`) before it propagates."""
    try:
        yield
    except Refused as exc:
        raise registry.complete(exc)


def load(path: str | os.PathLike | bytes | Any, format: str | None = None, *, lazy: bool = False,
         **opts: Any) -> Checkpoint:
    """Read ``path`` into the canonical :class:`~rnnconvert.core.model.Checkpoint`.

    Args:
        path: the source file (or directory, for directory formats); or an object in memory
            (:func:`load_object`): the ``bytes`` of a one-file format (detected by content), a state dict
            (a mapping of names to ``torch.Tensor`` or numpy arrays, nested as ``torch.save`` would save it), a
            ``torch.nn.Module`` (its ``state_dict()``). Those are read eagerly, whatever ``lazy`` says.
        format: a registry name (``'keras_h5'``, ``'pt'``, ...) or ``None`` to detect by content.
        lazy: ask for a lazy checkpoint (:attr:`Checkpoint.slabs`: parameters read one slab at a time,
            placeholders until then) when the format's reader can do it (``FormatSpec.lazy``);
            otherwise, or when false, everything is read now. Loaded slabs are checked for NaN/Inf too.
        **opts: reader options (e.g. ``gate_activation='hard_sigmoid'`` for Keras weights-only files);
            :func:`rnnconvert.engine.registry.read_options` lists each format's.

    Raises:
        OptionError: an option this format's reader does not know (the valid ones are named).
        FormatError: also for NaN/Inf weights (every format, naming the tensor) and, as a last line
            of defence, for any other exception a reader lets through (kept as ``__cause__``),
            ``MemoryError`` and ``RecursionError`` included (docs/security.md).
        UnsupportedError, DependencyError. TypeError: ``path`` is none of the accepted kinds.
    """
    if not isinstance(path, (str, os.PathLike)):
        return load_object(path, format, **opts)
    budget.regular_source(path)  # a FIFO or /dev/zero: refused before anything reads it
    fmt = registry.get(format) if format else registry.detect(path)
    mod = fmt.load()
    if mod.read is None:
        raise FormatError(f"rnnconvert can write {fmt.name} but not read it")
    mod.check_options("read", opts)
    if lazy and mod.lazy:
        opts = {**opts, "lazy": True}
    try:
        ckpt = mod.read(Path(path), **opts)
    except RNNConvertError:
        raise
    except MemoryError as exc:
        raise FormatError(f"{path}: the file declares more data than fits in memory; refused") from exc
    except RecursionError as exc:
        raise FormatError(f"{path}: structures nested too deeply; refused") from exc
    except Exception as exc:  # last line of defence: a reader let a low-level error through
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise FormatError(f"{path}: malformed {fmt.name} file ({type(exc).__name__}: {first})") from exc
    # every reader: a bounded number of layers and tensors (the readers that walk a list check it before)
    budget.check_count(path, "layers", sum(layer.num_layers for layer in ckpt.layers), "recurrent layers")
    budget.check_count(path, "names", len(ckpt.tensors), "tensors")
    check_finite(ckpt, str(path))
    return replace(ckpt, format=fmt.name,
                   slabs=None if ckpt.slabs is None else CheckedSlabs(ckpt, str(path), fmt.name))


#: suffixes tried, in order, for ``bytes`` whose content alone no sniffer claims (formats told by their extension)
_BYTES_SUFFIXES = {b"\x89HDF\r\n\x1a\n": (".h5",), b"PK\x03\x04": (".npz", ".keras")}
_BYTES_FALLBACK = (".onnx", ".pdparams", ".msgpack")


def load_object(obj: Any, format: str | None = None, **opts: Any) -> Checkpoint:
    """:func:`load` of an object in memory, read by the same readers as a file (never unpickled by ``pickle``:
    the readers' allow-list unpicklers), through a private temporary folder (mode 0700, removed before this
    returns; the checkpoint is read eagerly and holds every array).

    * ``bytes``/``bytearray``/``memoryview``: the content of a one-file format (``.pt``, ``.h5``, ``.keras``,
      ``.safetensors``, ``.npz``, ``.onnx``, ``.tflite``, ...), detected by content as a file is
      (:func:`rnnconvert.engine.registry.detect`), or read as ``format``; formats told by their extension are
      tried with it (HDF5 as ``.h5``, a zip as ``.npz`` then ``.keras``, else ``.onnx``, ``.pdparams``,
      ``.msgpack``). Folder formats (TF checkpoints, OpenVINO IRs, Orbax) cannot come as bytes.
    * a mapping (a state dict: names to ``torch.Tensor`` or numpy arrays; nested dicts as a training checkpoint)
      or a ``torch.nn.Module`` (its ``state_dict()``): saved with ``torch.save`` and read as a ``.pt``
      (numpy arrays become tensors sharing their memory); without torch installed, a flat mapping of numpy
      arrays is saved with ``np.savez`` and read as an ``.npz`` (its names through the foreign-name table).

    The checkpoint's ``meta['path']`` names the object (``<bytes: 1,234>``, ``<state dict>``,
    ``<nn.Module LSTM>``), not the temporary file.

    Raises:
        FormatError: bytes of no known one-file format, or as :func:`load`. TypeError: ``obj`` is none of these
            kinds (the message names them). UnsupportedError, DependencyError, OptionError: as :func:`load`."""
    import shutil
    import sys
    import tempfile
    from collections.abc import Mapping

    torch = sys.modules.get("torch")  # a Module or tensor means torch is imported already
    if torch is not None and isinstance(obj, torch.nn.Module):
        what, obj = f"<nn.Module {type(obj).__name__}>", obj.state_dict()
    elif isinstance(obj, Mapping):
        what = "<state dict>"
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        what = f"<bytes: {memoryview(obj).nbytes:,}>"
    else:
        raise TypeError(f"rnnconvert.load takes a path, the bytes of a file, a state dict (a mapping of names to "
                        f"tensors or arrays) or a torch.nn.Module, not {type(obj).__name__}")
    tmp = Path(tempfile.mkdtemp(prefix="rnnconvert-load-"))  # mode 0700: private to this user
    try:
        if what.startswith("<bytes"):
            data = memoryview(obj).cast("B")
            if format:
                exts = registry.get(format).extensions
                suffixes = (exts[0] if exts else "",)
            else:
                suffixes = ("", *next((v for k, v in _BYTES_SUFFIXES.items() if bytes(data[:len(k)]) == k),
                                      _BYTES_FALLBACK))
            path = tmp / "input"
            path.write_bytes(data)
            found, by_content = None, True
            for i, suffix in enumerate(suffixes):
                target = tmp / f"input{suffix}"
                path.rename(target)
                path = target
                if format:
                    found = format
                    break
                try:
                    found = registry.detect(path).name
                    by_content = i == 0 or suffix in (".h5", ".npz", ".keras")  # a magic number led there
                    break
                except FormatError:
                    continue
            if found is None:
                raise FormatError(f"{what}: unrecognised content; name its format with format=... "
                                  "(folder formats, TF checkpoints and OpenVINO IRs among them, cannot come as bytes)")
        else:
            state = obj
            if torch is not None:
                path = tmp / "state.pt"
                torch.save(as_tensors(torch, state), path)
            else:
                path = tmp / "state.npz"
                np.savez(path, **{str(k): np.asarray(v) for k, v in state.items()})
            found, by_content = format, True
        try:
            ckpt = load(path, found, lazy=False, **opts)
        except RNNConvertError as exc:  # the message names the object, not the temporary file
            msg = str(exc).replace(str(path), what)
            if not by_content:
                msg = (f"{what}: no format recognised these bytes by content; read as {found}, the one left: "
                       f"{msg.removeprefix(what + ': ')}")
            exc.args = (msg,)
            exc.cli = exc.cli and exc.cli.replace(str(path), what)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return replace(ckpt, meta={**ckpt.meta, "path": what})


def as_tensors(torch, obj: Any) -> Any:
    """``obj`` with numpy arrays turned into tensors (sharing memory), in dicts, lists and tuples."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: as_tensors(torch, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_tensors(torch, v) for v in obj)
    return obj


@dataclass
class ConversionReport:
    """What :func:`convert` did: source and target formats, per-layer lines, notes, verification."""

    src: str
    dst: str
    src_format: str
    dst_format: str
    modules: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verification: VerifyReport | None = None
    #: the source's non-recurrent tensors handed to the writer (Embedding, Dense...: ``Checkpoint.tensors`` keys,
    #: PyTorch naming); written unless a note says "non-recurrent tensor(s) ... are not written"
    tensors: list[str] = field(default_factory=list)


def unique_names(ckpt: Checkpoint, target: str) -> None:
    """Refuse two layers, or a layer and a carried tensor, that would take the same name in the output
    (a writer would fail half-way or one would overwrite the other); naming both.

    Raises:
        UnsupportedError."""
    from ..errors import UnsupportedError

    seen: dict[str, str] = {}
    for layer in ckpt.layers:
        if layer.name in seen:
            raise UnsupportedError(f"layers '{layer.name}' and '{seen[layer.name]}' would both be written as "
                                   f"'{layer.name}' in {target}; refused (rename one in the source)")
        seen[layer.name] = layer.name
    for key in ckpt.tensors:
        if key in seen:
            raise UnsupportedError(f"tensor '{key}' and layer '{seen[key]}' would both be written as '{key}' in "
                                   f"{target}; refused (rename one in the source)")


def save(ckpt: Checkpoint, path: str | os.PathLike, format: str | None = None, *, force: bool = False,
         **opts: Any) -> list[str]:
    """Write ``ckpt`` to ``path`` atomically (temporary file beside it, then rename).

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is false.
        UnsupportedError: the target cannot express a layer; nothing is written.
    """
    dst = Path(path)
    fmt = registry.for_output(dst, format)
    mod = fmt.load()
    commit.check_destination(dst, force)
    if mod.write is None:
        raise FormatError(f"rnnconvert can read {fmt.name} but not write it")
    mod.check_options("write", opts)
    unique_names(ckpt, fmt.name)
    if mod.check is not None:
        with way_out():
            mod.check(ckpt, **opts)

    def write(tmp: Path) -> list[str]:
        with way_out():
            return mod.write(writer_view(ckpt, mod.forget_bias), tmp, **opts)
    return commit.write_in_place(dst, write, force)


def convert(src: str | os.PathLike, dst: str | os.PathLike, options: ConvertOptions = ConvertOptions(),
            progress: Callable[[str, float, float], None] | None = None) -> ConversionReport:
    """Convert ``src`` to ``dst`` as ``options`` say; verify before the result is renamed into place
    (:func:`rnnconvert.api.convert` documents the options, the returned :class:`ConversionReport` and the errors;
    ``progress(stage, done, total)`` as there). On any error ``dst`` is left as it was."""
    from ..speed import gpu, parallel

    # device='cuda': the float64 side of verification on the GPU as well (speed/gpu.py)
    with parallel.using(options.threads), gpu.using(options.device == "cuda" and options.verify is not None):
        if options.whole and (options.recurrent_only or (options.write_opts or {}).get("recurrent_only")):
            raise OptionError("whole=True and recurrent_only=True contradict each other; give one",
                              cli="--whole and --recurrent-only contradict each other; give one")
        try:
            return _convert(Path(src), Path(dst), options, progress)
        except WholeModelError as exc:
            partial = _partial(exc, Path(dst), options)
            if partial is None:
                raise
            note = partial_note(exc)
        rep = _convert(Path(src), Path(dst), partial, progress)
        rep.notes.insert(0, note)
        return rep


def _partial(exc: WholeModelError, dst: Path, o: ConvertOptions) -> ConvertOptions | None:
    """The options of the partial conversion that replaces a whole model refused by ``exc`` (its recurrent
    layers alone: ``recurrent_only``), or ``None`` where the refusal stands: ``whole`` asked for, the recurrent
    layers asked for already, ``--emit-module`` (the emitted module is the whole model), or a writer without
    the option ``recurrent_only``."""
    if o.whole or o.recurrent_only or (o.write_opts or {}).get("recurrent_only") or o.emit_module is not None:
        return None
    if "recurrent_only" not in registry.for_output(dst, o.to).load().write_options:
        return None
    return replace(o, recurrent_only=True)


def partial_note(exc: WholeModelError) -> str:
    """The note of a partial conversion (issue #41): what was written, and the layer (name and class) that kept
    the model from being written whole, with the reason ``exc`` gave."""
    what = f"layer '{exc.layer}' ({exc.layer_class})" if exc.layer_class else \
        f"layer '{exc.layer}'" if exc.layer else "the model config"
    why = exc.reason if what in exc.reason else f"{what}: {exc.reason}"
    return (f"partial model: the recurrent layers alone were written (as recurrent_only=True, CLI --recurrent-only, "
            f"writes them), not the whole model: {why}; whole=True (CLI --whole) refuses instead")


def _convert(src_p: Path, dst_p: Path, o: ConvertOptions, progress) -> ConversionReport:
    """:func:`convert`."""
    to, src_format, verify, force, seed, device = o.to, o.src_format, o.verify, o.force, o.seed, o.device
    read_opts, write_opts, verify_inputs = o.reader_options(), o.writer_options(), o.verify_inputs
    out_fmt = registry.for_output(dst_p, to)
    commit.check_destination(dst_p, force)
    budget.regular_source(src_p)  # before anything resolves SRC: a symlink loop is refused here
    if dst_p.resolve() == src_p.resolve():
        raise OutputExistsError(f"{dst_p} is the source file; choose another output path")
    in_fmt = registry.get(src_format) if src_format else registry.detect(src_p)
    in_mod, out_mod = in_fmt.load(), out_fmt.load()
    targets = _device_targets(device, out_fmt.name, out_mod, dst_p) if verify else [out_mod]
    if as_target(out_mod).verify_whole is None:  # integer inputs are for whole Keras models only
        _float_inputs(verify_inputs)
    emit = None
    if o.emit_module is not None:  # the whole-model steps (rnnconvert.whole) load only when asked for
        emit = EMIT_PATHS(o.emit_module, src_p, dst_p, force)
    # the cuDNN routes read the written file back slab by slab: a streamed conversion serves them as well
    stream = in_mod.lazy and out_mod.stream and (targets == [out_mod] or device == "cuda") and emit is None
    if out_mod.write is None:
        raise FormatError(f"rnnconvert can read {out_fmt.name} but not write it")
    out_mod.check_options("write", write_opts or {})
    ckpt = load(src_p, in_fmt.name, lazy=stream, **(read_opts or {}))
    ckpt, write_opts, stream = _whole_model(ckpt, in_mod, out_mod, write_opts, stream)
    rep = ConversionReport(str(src_p), str(dst_p), in_fmt.name, out_fmt.name, tensors=list(ckpt.tensors))
    unique_names(ckpt, out_fmt.name)
    emitted = EMIT(ckpt, in_mod, src_p, emit, write_opts) if emit is not None else None
    if out_mod.check is not None:  # on a lazy skeleton: refusals look at structure only
        with way_out():
            rep.notes = list(out_mod.check(ckpt, **(write_opts or {})) or [])
    rep.notes.extend(ckpt.meta.get("notes") or [])  # what the reader kept aside (a pickle's learned initial states)
    for layer in ckpt.layers:  # read by the foreign-name table: the reading itself is an assumption
        how = layer.source.get("recognised") if isinstance(layer.source, dict) else None
        if how:
            rep.notes.append(f"{layer.name}: read by its tensor names ({how['line'].split(' -- ', 1)[1]}); "
                             "verification checks the written file against this reading, not the reading "
                             "itself: inconclusive about the names (docs/foreign-names.md)")
    if not dst_p.parent.exists():
        raise FormatError(f"{dst_p.parent}: output directory does not exist")
    from ..speed import directio

    # a verified output is read back at once: written through the page cache (speed/directio.py)
    cache = directio.through_page_cache() if verify else contextlib.nullcontext()
    tmp = None
    emit_tmps: list[Path] = []
    stages = WHOLE_STAGE.set(None if progress is None else (lambda what, d, t: progress(f"whole: {what}", d, t)))
    try:
        tmp = commit.temp_beside(dst_p)
        with cache, way_out():
            if stream:
                rep.modules, rep.verification = _convert_streamed(ckpt, in_mod, out_mod, tmp, verify,
                                                                  src_p, seed, write_opts or {}, progress,
                                                                  verify_inputs, targets)
            else:
                if verify:
                    import_engine(out_mod)  # the target's framework loads while the file is written
                rep.modules = list(out_mod.write(writer_view(ckpt, out_mod.forget_bias), tmp, **(write_opts or {})) or [])
                if verify:
                    whole = as_target(out_mod).verify_whole  # Keras 2 models written whole (#17)
                    names = {layer.name for layer in ckpt.layers}
                    model_in = {k: v for k, v in (verify_inputs or {}).items() if whole and k not in names}
                    layer_in = _float_inputs({k: v for k, v in (verify_inputs or {}).items() if k not in model_in})
                    if (out_mod.read is not None or as_target(out_mod).target_step is not None) \
                            and not _whole_program(out_mod, tmp, ckpt):  # a whole .tflite, .pt2 runs whole only
                        added = _graph_fed(ckpt, model_in, seed, rep.notes) if whole else None
                        # one source side for every target (the cuDNN routes): one report
                        rep.verification = _verify(ckpt, in_mod, tmp, targets, mode=verify, src_path=src_p,
                                                   seed=seed, inputs=layer_in or None, added=added)
                    else:  # a program (.pt2, a whole-model .tflite): its runtime's whole-model checks only
                        rep.verification = VerifyReport(seed=seed)
                    if whole:
                        _whole_checks(whole, rep.verification, ckpt, src_p, tmp, model_in, seed, "keras 3 load_model")
        if emit is not None:  # its temporaries go into emit_tmps as they are made (discarded below)
            EMIT_WRITE(emitted, emit, ckpt, src_p, rep, verify, verify_inputs, seed, emit_tmps)
        if rep.verification is not None:
            try:
                rep.verification.raise_if_failed(o.accept_inconclusive)
            except RNNConvertError as exc:
                exc.report = rep  # what was measured, for the caller's --report
                raise
        commit.commit_set([(tmp, dst_p), *zip(emit_tmps, emit or ())], force)  # as one (a journal)
        if progress is not None:  # DST is in place: whatever the caller does with this, it succeeded
            try:
                progress("done", 1, 1)
            except Exception:  # noqa: BLE001
                pass
    except RNNConvertError:
        raise
    except Exception as exc:  # a full disk, a read-only file system: one line (exit 10), not a trace
        env = commit.output_error(exc, dst_p)
        if env is None:
            raise
        raise env from exc
    finally:
        WHOLE_STAGE.reset(stages)
        if tmp is not None:
            commit.discard(tmp)
        for t in emit_tmps:
            commit.discard(t)
    return rep


def _whole_model(ckpt: Checkpoint, in_mod, out_mod, write_opts: dict[str, Any] | None, stream: bool):
    """``(ckpt, write_opts, stream)``: for a writer that writes whole models (write option ``whole_model``) and a
    source that holds one (:attr:`~rnnconvert.engine.protocol.FormatSpec.whole_model`), the source's whole model
    added to the write options and the checkpoint read eagerly (a whole model is written in one piece);
    unchanged otherwise and under ``recurrent_only``."""
    opts = dict(write_opts or {})
    if "whole_model" not in out_mod.write_options or in_mod.whole_model is None or opts.get("recurrent_only") \
            or "whole_model" in opts:
        return ckpt, write_opts, stream
    full = in_mod.whole_model(ckpt)
    if full is None:
        return ckpt, write_opts, stream
    # a SavedModel's checkpoint names its recurrent layers by object path; the whole model by Keras name
    return full.renamed(ckpt.materialize()), {**opts, "whole_model": full}, False


def _convert_streamed(ckpt: Checkpoint, in_mod, out_mod, tmp: Path, verify: str | None, src_p: Path,
                      seed: int, write_opts: dict[str, Any], progress=None,
                      inputs: dict[str, Any] | None = None, targets: list | None = None
                      ) -> tuple[list[str], VerifyReport | None]:
    """Streaming conversion (docs/performance.md "Streaming conversion"): one slab of parameters in memory
    at a time. Each slab is loaded, written, run through the source side of verification, and released;
    after the writer closed, the target side of verification reads the written file back, for each of
    ``targets`` (default: the written format's own runtime) against the one source side."""
    targets = targets or [out_mod]
    check = (StreamedVerification(ckpt, in_mod, mode=verify, src_path=src_p, seed=seed, inputs=inputs,
                                  target=targets[0])
             if verify else None)
    if check is not None:
        import_engine(out_mod)  # the target's framework loads while the slabs stream
    view = writer_view(ckpt, out_mod.forget_bias)  # the writer's layers: forget_bias folded or kept
    writer = out_mod.open_stream(view, tmp, **write_opts)
    if view is not ckpt:  # each slab folded on its way to the writer, after the source side saw it
        writer = FoldingWriter(writer, ckpt)
    with _read_ahead(ckpt, src_p) as reading:
        modules = list(stream_write(writer, ckpt, on_slab=check.source_slab if check else None, reading=reading,
                                    progress=(lambda d, t: progress("convert", d, t)) if progress else None) or [])
    if check is None:
        return modules, None
    for t in targets:
        rep = check.target_side(tmp, t, progress=(lambda d, n: progress("verify", d, n)) if progress else None)
    return modules, rep


def _data_files(ckpt: Checkpoint, src: Path) -> list[Path]:
    """The files a streamed read of ``src`` reads its slabs from: ``src`` itself when it is a file; for a TF
    checkpoint named by a folder or prefix, its shards (``<prefix>.data-NNNNN-of-MMMMM``, in shard order: a
    folder may hold older checkpoints and event files too); else none (nothing is read ahead)."""
    if src.is_file():
        return [src]
    prefix = ckpt.meta.get("prefix") if isinstance(ckpt.meta, dict) else None
    if prefix:
        import glob

        return [Path(p) for p in sorted(glob.glob(glob.escape(str(prefix)) + ".data-[0-9]*-of-[0-9]*"))]
    return []


@contextlib.contextmanager
def _read_ahead(ckpt: Checkpoint, src: Path):
    """A :class:`~rnnconvert.speed.prefetch.ReadAhead` of the streamed source ``src`` for the block (its window:
    :func:`~rnnconvert.speed.prefetch.ahead_window` of the largest slab); yields its ``advance``, which
    :func:`~rnnconvert.engine.stream.stream_write` calls before each slab."""
    largest = max((slab_bytes(ckpt.layers[i].params[k]) for i, k in order(ckpt)), default=0)
    ahead = ReadAhead(_data_files(ckpt, src), ahead_window(largest)).start()
    try:
        yield ahead.advance
    finally:
        ahead.stop()


def _verify_streamed(ckpt: Checkpoint, in_mod, src: Path, dst: Path, targets: list, mode: str, seed: int,
                     inputs: dict[str, Any] | None = None, first_tol: float | None = None,
                     target_dtype=None, added: dict[str, Any] | None = None) -> VerifyReport:
    """:func:`verify` of a lazy source: the source side slab by slab (each released after), then the target
    side on ``dst`` for each of ``targets`` (the written format, or the cuDNN routes) -- the verification of a
    streamed conversion, with the same report as the eager one."""
    check = StreamedVerification(ckpt, in_mod, mode=mode, src_path=src, seed=seed, inputs=inputs,
                                 target=targets[0], first_tol=first_tol, target_dtype=target_dtype, added=added)
    import_engine(targets[0])
    with _read_ahead(ckpt, src) as reading:  # the next slab read while one is checked
        stream_write(None, ckpt, on_slab=check.source_slab, reading=reading)
    for t in targets:
        rep = check.target_side(dst, t)
    return rep


def verify(src: str | os.PathLike, dst: str | os.PathLike, *, mode: str = "reference", seed: int = 0,
           src_format: str | None = None, dst_format: str | None = None,
           read_opts: dict[str, Any] | None = None, device: str = "cpu", dtype: str = "float32",
           inputs: dict[str, Any] | None = None, map: Any = None, threads: int | None = None) -> VerifyReport:
    """:func:`rnnconvert.api.verify` (its arguments and errors): ``dst`` compared with its source ``src``."""
    from ..speed import gpu, parallel

    with parallel.using(threads), gpu.using(device == "cuda"):
        return _verify_files(src, dst, mode, seed, src_format, dst_format, read_opts, device, dtype, inputs, map)


def _verify_files(src, dst, mode, seed, src_format, dst_format, read_opts, device, dtype, inputs, map) -> VerifyReport:
    """:func:`verify` (its arguments, in order)."""
    budget.regular_source(src)
    budget.regular_source(dst)
    if map is not None:
        read_opts = {**(read_opts or {}), "map": map}
    in_fmt = registry.get(src_format) if src_format else registry.detect(src)
    out_fmt = registry.get(dst_format) if dst_format else registry.detect(dst)
    out_mod = out_fmt.load()
    in_mod = in_fmt.load()
    whole = as_target(out_mod).verify_whole if device == "cpu" and in_mod.whole_model is not None else None
    d_ckpt = unread = None
    if out_mod.read is not None:  # DST is as untrusted as SRC: the hardened reader (links, bombs, budget)
        try:  # sees it before a framework does
            d_ckpt = load(dst, out_fmt.name, lazy=out_mod.lazy)
        except UnsupportedError as exc:  # a whole-model program its reader refuses (a whole .tflite, issue #39):
            if whole is None:  # judged whole only, as its conversion judges it; refused if it is not one
                raise
            unread = exc
    if device == "cuda":
        from ..verify.cuda import ROUTES, CudaTarget, require_cuda

        require_cuda()
        if out_mod.read is None:
            raise FormatError(f"device='cuda' reads {dst} back, and rnnconvert cannot read {out_fmt.name}",
                              cli=f"--device cuda reads {dst} back, and rnnconvert cannot read {out_fmt.name}")
        targets = [CudaTarget(out_mod, r, dtype) for r in ROUTES]
    elif device == "cpu":
        if as_target(out_mod).target_forward is None:
            raise FormatError(f"rnnconvert cannot run {out_fmt.name} files for verification")
        targets = [out_mod]
    else:
        raise FormatError(f"unknown device '{device}' (cpu or cuda)")
    model_in = {k: v for k, v in (inputs or {}).items() if whole and np.asarray(v).dtype.kind != "f"}
    inputs = _float_inputs({k: v for k, v in (inputs or {}).items() if k not in model_in})
    lazy = in_mod.lazy  # the cuDNN routes too: their emulation runs on each slab as it is read (verify/cuda.py)
    # DST is read into the page cache while the source side runs: torch faulting a cold multi-GB file in as it
    # maps it was 3x slower than reading it ahead (speed/prefetch.py)
    prefetch(dst)
    ckpt = load(src, in_fmt.name, lazy=lazy, **(read_opts or {}))
    if whole is not None and inputs:  # float arrays that name no recurrent layer are model inputs, as converted
        names = {layer.name for layer in ckpt.layers}
        model_in.update({k: v for k, v in inputs.items() if k not in names})
        inputs = {k: v for k, v in inputs.items() if k in names} or None
    first_tol, target_dtype = (1e-2, np.float16) if dtype == "float16" else (None, None)
    fed_notes: list[str] = []
    # a whole model written whole: each recurrent layer also checked on the rows its graph feeds it (#39)
    added = _graph_fed(ckpt, model_in, seed, fed_notes) if whole is not None else None

    def attempt(targets: list) -> VerifyReport:
        try:
            if whole is not None and (unread is not None or _whole_program(out_mod, Path(dst), ckpt) or (
                    out_mod.read is None and as_target(out_mod).target_step is None)):
                # a program (.pt2, a whole .tflite): its runtime's whole-model checks only, as converted
                rep = VerifyReport(seed=seed)
            elif lazy:  # one slab of the source at a time, as a streamed conversion verifies
                rep = _verify_streamed(ckpt, in_mod, Path(src), Path(dst), targets, mode, seed, inputs,
                                       first_tol, target_dtype, added)
                rep.notes += fed_notes if added else []
            else:
                rep = _verify(ckpt, in_mod, Path(dst), targets, mode=mode, src_path=Path(src), seed=seed,
                              first_tol=first_tol, inputs=inputs, target_dtype=target_dtype, added=added)
                rep.notes += fed_notes if added else []
            if whole is not None:  # a whole model written whole: the conversion's own whole-model check (#39)
                before = len(rep.layers)
                _verify_whole_file(ckpt, in_mod, whole, Path(src), Path(dst), model_in, inputs, seed, rep)
                if unread is not None and not rep.layers:  # not a whole-model program: its reader's refusal
                    raise unread
                if len(rep.layers) == before and model_in:  # DST holds the recurrent layers only
                    raise FormatError(f"verification inputs name no recurrent layer: {', '.join(sorted(model_in))} "
                                      f"(layers: {', '.join(layer.name for layer in ckpt.layers)}), and {dst} "
                                      f"holds the recurrent layers only, not the whole model")
            return rep
        except RNNConvertError:
            raise
        except Exception as exc:  # the target framework rejected the file: it does not match the source
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise FormatError(f"{dst}: does not load as a conversion of {src}: {first}") from exc

    try:  # DST's layers looked up by SRC's names (every file rnnconvert writes keeps them, or its runtime finds them)
        rep = attempt(targets)
        rep.pairing = None
        return rep
    except FormatError:
        # DST names its layers otherwise (a hand port's encoder/decoder): paired as diagnose pairs them (#42)
        paired = paired_layers(ckpt, d_ckpt, seed)
        if paired is None:
            raise
    from ..verify.pairing import RenamedTarget

    rep = attempt([RenamedTarget(t, paired.names()) for t in targets])
    rep.pairing = paired
    return rep


def paired_layers(ckpt: Checkpoint, d_ckpt: Checkpoint | None, seed: int):
    """How ``verify`` pairs SRC's layers with DST's where looking DST's layers up by SRC's names failed and DST
    does not name them all as SRC does: the pairing ``diagnose`` uses
    (:func:`rnnconvert.verify.diagnose.pair_checkpoints`: by name where the names match, else by position, shape
    or parameters), or ``None`` (all by name; DST unreadable by rnnconvert; the files stack their layers
    otherwise). Only after the lookup by name failed: a file whose reader names its layers otherwise (a TF2
    object checkpoint's ``layer_with_weights-0``) but whose runtime finds SRC's names verifies as before."""
    if d_ckpt is None or {l.name for l in d_ckpt.layers} <= {l.name for l in ckpt.layers}:
        return None
    from ..verify import diagnose as dg

    try:
        got = dg.pair_checkpoints(ckpt.materialize(), d_ckpt.materialize(), seed)
    except ValueError:
        return None
    return None if got is None or got.named else got


def _verify_whole_file(ckpt, in_mod, whole, src: Path, dst: Path, model_in: dict, layer_in: dict | None, seed: int,
                       rep: VerifyReport) -> None:
    """``verify SRC DST`` of a whole model written whole (a whole-model ONNX graph, ``.pt2`` program or ``.keras``):
    the runtime's ``verify_whole``, the check a conversion runs, appended to ``rep`` (nothing when DST holds the
    recurrent layers only). ``model_in``: the integer (token id) inputs, keyed by model input name; float arrays
    that name no recurrent layer are model inputs too."""
    full = in_mod.whole_model(ckpt)
    if full is None:
        return
    names = {layer.name for layer in ckpt.layers}
    model_in = {**{k: v for k, v in (layer_in or {}).items() if k not in names}, **model_in}
    _whole_checks(whole, rep, full.renamed(ckpt.materialize()), src, dst, model_in, seed, str(dst.suffix))


def _graph_fed(ckpt: Checkpoint, model_in: dict | None, seed: int, notes: list[str]) -> dict | None:
    """The rows the per-layer check of each recurrent layer of a whole Keras model runs on besides its own batch:
    the inputs the model's graph feeds it on the whole-model check's model inputs (issue #39;
    :func:`rnnconvert.whole.pipeline.graph_fed`), its notes appended to ``notes``; ``None`` where the source's
    numpy evaluator does not cover the model (the per-layer check on its own batch alone, as before)."""
    try:
        added, said = GRAPH_FED(ckpt, model_in or None, seed)
    except UnsupportedError:
        return None
    notes.extend(said)
    return added or None


def _whole_program(out_mod, dst: Path, ckpt) -> bool:
    """Whether the written ``dst`` is a program of a whole model, judged by its runtime's ``verify_whole`` only:
    marked so by its writer's check (``ckpt.meta["whole_program"]``: a whole ``.tflite``), or by its runtime
    (:attr:`~rnnconvert.engine.protocol.Runtime.whole_only`: a ``.pt2`` of a whole model, not of the recurrent
    layers alone)."""
    if ckpt.meta.get("whole_program"):
        return True
    says = getattr(as_target(out_mod), "target_whole_only", None)
    return bool(says is not None and says(dst, ckpt))


def _whole_checks(whole, rep: VerifyReport, ckpt, src: Path, dst: Path, model_in: dict, seed: int, route: str) -> None:
    """The runtime's whole-model checks ``whole`` of ``dst`` appended to ``rep``; without tf_keras one
    ``inconclusive`` check naming why (the whole model cannot be judged), ``route`` its target side."""
    try:
        rep.layers += whole(ckpt, src, dst, inputs=model_in or None, seed=seed)
    except DependencyError as exc:
        rep.layers.append(LayerCheck("model (whole)", 0.0, 0.0, 0.0, "tf_keras (whole model)", route,
                                     verdict="inconclusive", reason=f"whole-model check not run: {exc}"))


def _float_inputs(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    """``inputs`` after checking that every per-layer input is floating point (integer arrays are token ids
    for a whole Keras model's inputs only). Raises FormatError."""
    for k, a in (inputs or {}).items():
        if np.asarray(a).dtype.kind != "f":
            raise FormatError(f"verification input '{k}' is {np.asarray(a).dtype}, not floating point")
    return inputs


def _device_targets(device: str, name: str, out_mod, dst: Path) -> list:
    """The targets a conversion's verification runs the written file with: its own framework (``'cpu'``), or
    cuDNN's two routes (``'cuda'``: :class:`rnnconvert.verify.cuda.CudaTarget`, float32)."""
    if device == "cpu":
        return [out_mod]
    if device != "cuda":
        raise FormatError(f"unknown device '{device}' (cpu or cuda)")
    from ..verify.cuda import ROUTES, CudaTarget, require_cuda

    require_cuda()
    if out_mod.read is None:
        raise FormatError(f"device='cuda' reads {dst} back, and rnnconvert cannot read {name}",
                          cli=f"--device cuda reads {dst} back, and rnnconvert cannot read {name}")
    return [CudaTarget(out_mod, r, "float32") for r in ROUTES]


def write_fixed(s_ckpt: Checkpoint, d_ckpt: Checkpoint, layers: list, src: Path, out: Path, force: bool,
                 read_opts: dict[str, Any] | None, seed: int, d_path: Path) -> tuple[str, VerifyReport]:
    """The corrected DST written with DST's format's writer into a folder beside ``out``, verified against
    ``src``, then put in place (nothing is left at ``out`` on any error)."""
    import shutil
    import tempfile

    from ..errors import VerificationError
    from ..verify import diagnose as dg

    commit.check_distinct(out, {"the source": src, "the file diagnosed": d_path}, "the fix output",
                          "--fix output")
    commit.check_destination(out, force)
    bad = [ld.name for ld in layers if ld.verdict == "unexplained"]
    if bad:
        raise VerificationError(f"--fix: no known slip explains layer(s) {', '.join(bad)}; nothing was written")
    try:
        fixed = dg.fixed_checkpoint(s_ckpt, d_ckpt, layers)
    except ValueError as exc:
        raise VerificationError(f"--fix: {exc}; nothing was written") from exc
    if not out.parent.exists():
        raise FormatError(f"{out.parent}: output directory does not exist")
    folder = Path(tempfile.mkdtemp(prefix=".rnnconvert-fix-", dir=out.parent))
    try:
        tmp = folder / out.name
        save(fixed, tmp, d_ckpt.format)
        rep = verify(src, tmp, src_format=s_ckpt.format, dst_format=d_ckpt.format, read_opts=read_opts, seed=seed)
        if rep.verdict != "ok":
            c = next(c for c in rep.layers if not c.ok)
            raise VerificationError(f"--fix: the corrected file does not verify: layer '{c.name}': {c.reason}; "
                                    f"nothing was written")
        commit.commit(tmp, out, force)
        return str(out), rep
    finally:
        shutil.rmtree(folder, ignore_errors=True)
