"""The format registry: one :class:`Format` record per file format, and format detection.

A format module (``rnnconvert/formats/<name>.py``) offers the same small verbs, each optional:

* ``sniff(head: bytes, path: Path) -> bool`` -- recognise a file by its first bytes (and layout).
* ``read(path, **opts) -> Checkpoint`` -- read into the canonical model.
* ``check(ckpt, **opts) -> list[str]`` -- raise :class:`~rnnconvert.errors.UnsupportedError` if the
  target cannot express ``ckpt`` exactly; returns notes (e.g. "a merge_mode='sum' post-op is needed").
* ``write(ckpt, path, **opts) -> list[str]`` -- write ``ckpt`` to ``path`` (a temporary path; the
  caller renames it into place), returns one line per layer saying how to load it.
* ``target_forward(path, ckpt, layer_name, x) -> np.ndarray`` -- run a layer of a written file
  through the target framework, for verification.
* ``target_forward_slab(path, ckpt, layer_name, k, x) -> np.ndarray`` -- the same for stacked layer ``k``
  alone (``x`` is its input): verification of a streamed conversion reads one slab at a time.
* ``target_step(path, ckpt, layer_name, k, x, states) -> [(h1, c1 or None)]`` -- one step of stacked
  layer ``k`` of a written file in the target framework, from each of ``N`` given states
  (``x`` ``(N, I_k)``; ``states[d] = (h0 (N, out), c0 (N, H) or None)`` per direction): verification's
  one-step comparison (:mod:`rnnconvert.engine.verify`; without it, the numpy reference on the arrays
  ``read`` back, and the report says so).
* ``ROUTE`` / ``ENGINE``: the target side's engine as the report names it, and the distribution whose
  version it reports.

Streaming (docs/performance.md "Streaming conversion"): a reader module with ``LAZY = True`` accepts
``read(path, lazy=True)`` (placeholders + ``Checkpoint.loader``); a writer module with ``STREAM = True``
offers ``open_stream(ckpt, path, **opts)`` returning an object with ``write_slab(i, k, dirs)`` (called
once per slab, ``i`` then ``k`` ascending), ``close() -> list[str]`` and ``abort()``; its ``write`` is
:func:`stream_write`.

Formats appear here only once they are implemented; a duplicate name is refused at import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import FormatError


@dataclass(frozen=True)
class Format:
    """A file format: its CLI name, module, file name endings, and what rnnconvert can do with it."""

    name: str
    module: str
    extensions: tuple[str, ...]
    description: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def can_read(self) -> bool:
        return hasattr(self.load(), "read")

    @property
    def can_write(self) -> bool:
        return hasattr(self.load(), "write")


FORMATS: tuple[Format, ...] = (
    Format("keras_h5", "rnnconvert.formats.keras.keras_h5", (".h5", ".hdf5", ".net"),
           "Keras 1/2, tf.keras, tf_keras HDF5 (full model or weights only)"),
    # after keras_h5, whose sniff declines HDF5 files without model_weights/layer_names (Keras 3 stores)
    Format("keras3", "rnnconvert.formats.keras.keras3", (".keras", ".weights.h5"),
           "Keras 3 .keras archive or .weights.h5 (vars/0..2 under class-name paths)"),
    Format("pt", "rnnconvert.formats.torch.torch_pt", (".pt", ".pth"),
           "PyTorch state dict, training checkpoint or TorchScript archive (weights only)"),
    Format("tf_checkpoint", "rnnconvert.formats.tf.tf_checkpoint", (),
           "TensorFlow checkpoint: TF1 name-based (cells, cuDNN opaque_kernel) or TF2 object-based "
           "(tf.keras save_weights); give the prefix, the .index file or the directory"),
    Format("tf2_checkpoint", "rnnconvert.formats.tf.tf2_writer", (),
           "TF2 object checkpoint of tf_keras layers (layer_with_weights-N), written as a directory; "
           "read like tf_checkpoint"),
    Format("tf_graph", "rnnconvert.formats.tf.tf_graph", (".pb",),
           "TensorFlow 1 frozen GraphDef (weights as Const nodes)"),
    Format("onnx", "rnnconvert.formats.onnx.onnx_fmt", (".onnx",),
           "ONNX model with LSTM/GRU/RNN nodes (onnxruntime runs it)"),
    Format("safetensors", "rnnconvert.formats.storage.safetensors_fmt", (".safetensors",),
           "safetensors with PyTorch state-dict key names"),
    # before npz: both are zips of .npy members; cudnn_npz's sniff looks for its spec member
    Format("cudnn_npz", "rnnconvert.formats.storage.cudnn_npz", (".cudnn.npz",),
           "raw cuDNN parameter buffers (one per layer) + JSON spec, in one .npz"),
    Format("npz", "rnnconvert.formats.storage.npz_fmt", (".npz",),
           "numpy .npz in rnnconvert's canonical schema (docs/pytorch.md)"),
)

_BY_NAME: dict[str, Format] = {}
for _f in FORMATS:
    if _f.name in _BY_NAME:
        raise RuntimeError(f"duplicate format name {_f.name!r} in the registry")
    _BY_NAME[_f.name] = _f


def get(name: str) -> Format:
    """The format called ``name``; raises :class:`FormatError` listing the known names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise FormatError(f"unknown format '{name}'; known formats: {', '.join(_BY_NAME)}") from None


def _by_extension(path: Path) -> Format | None:
    name = path.name.lower()
    best = None
    for f in FORMATS:
        for ext in f.extensions:
            if name.endswith(ext) and (best is None or len(ext) > best[0]):
                best = (len(ext), f)
    return best[1] if best else None


def detect(path: str | Path) -> Format:
    """Detect the format of an existing file by content (magic bytes), falling back to its extension.

    Raises:
        FormatError: the path does not exist, is unreadable, or matches no known format.
    """
    p = Path(path)
    if not p.exists():
        # a checkpoint prefix (``ckpt-1`` beside ``ckpt-1.index``) names no file itself
        for f in FORMATS:
            sniff = getattr(f.load(), "sniff", None)
            if sniff is not None and sniff(b"", p):
                return f
        raise FormatError(f"{p}: no such file or directory")
    head = b""
    if p.is_file():
        try:
            with open(p, "rb") as fh:
                head = fh.read(64)
        except OSError as exc:
            raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    for f in FORMATS:
        sniff = getattr(f.load(), "sniff", None)
        try:
            hit = sniff is not None and sniff(head, p)
        except Exception:  # a damaged file must not crash detection; the reader reports it properly
            hit = False
        if hit:
            return f
    f = _by_extension(p)
    if f is None:
        names = ", ".join(x.name for x in FORMATS)
        raise FormatError(f"{p}: unrecognised file format; name it with format=... ({names})",
                          cli=f"{p}: unrecognised file format; name it with --from ({names})")
    return f


def way_out(layer, exclude: str) -> str:
    """The way out for a refused ``layer``: the other runnable formats whose ``refusals(layer)`` is empty.

    One sentence, e.g. ``"Convert to .onnx instead, which expresses it exactly"``; the facts come from
    each format module's own ``refusals`` (``npz``, a storage format, is never suggested).
    """
    ok = []
    for f in FORMATS:
        if f.name in (exclude, "npz", "safetensors"):
            continue
        mod = f.load()
        ref = getattr(mod, "refusals", None)
        if ref is not None and not ref(layer):
            ext = f.extensions[0] if f.extensions else f"--to {f.name}"
            rescaled = getattr(mod, "rescale_plan", None)  # a redefined hard_sigmoid met by scaled weights
            ok.append(f"{ext} (hard_sigmoid rescaled, not bit-exact)" if rescaled and rescaled(layer) else ext)
    if not ok:
        return "No format rnnconvert writes computes this exactly; keep the source checkpoint"
    return f"Convert to {' or '.join(ok)} instead, which {'expresses' if len(ok) == 1 else 'express'} it exactly"


def refuse(layer, why: list[str], fmt: str, target: str) -> None:
    """Raise :class:`~rnnconvert.errors.UnsupportedError` when ``why`` (a writer's ``refusals(layer)``) is
    not empty: one line naming the layer, the target (``"PyTorch nn.GRU"``), every blocking feature and
    the way out (:func:`way_out`). Every writer refuses through here."""
    if why:
        from ..errors import UnsupportedError

        cls = layer.source.get("class_name") if isinstance(layer.source, dict) else None
        raise UnsupportedError(f"layer '{layer.name}'{f' ({cls})' if cls else ''} cannot be written as {target}: "
                               f"{'; '.join(why)}. {way_out(layer, fmt)}")


def for_output(path: str | Path, to: str | None = None) -> Format:
    """The format to write ``path`` in: ``to`` when given, else by the file name's extension.

    Raises:
        FormatError: no ``to`` and an extension rnnconvert does not write.
    """
    if to:
        return get(to)
    f = _by_extension(Path(path))
    if f is None:
        names = ", ".join(x.name for x in FORMATS)
        raise FormatError(f"{path}: cannot tell the output format from the extension; pass to=... ({names})",
                          cli=f"{path}: cannot tell the output format from the extension; pass --to ({names})")
    return f


def stream_write(writer, ckpt, on_slab=None, *, progress=None) -> list[str]:
    """Feed every slab of ``ckpt`` (read through :meth:`Checkpoint.slab`, released after) to a stream
    ``writer`` in order and close it; ``abort()`` on any error. What a ``STREAM`` module's ``write`` does.
    ``on_slab(i, k, dirs)``, when given, runs on each slab before it is released (the source side of a
    streamed verification): before the writer has it, as a writer may release each array it has written
    (``ckpt.release_array``: the peak is then one tensor of a memory-mapped source, not one slab). ``progress(done, total)``: parameter bytes written.

    A writer whose ``WRITE_BEHIND`` attribute is true (its ``write_slab`` spends its time in code that
    releases the GIL: CRC-32 and ``write``) writes slab ``n`` in a background thread while slab ``n + 1`` is
    read: two slabs in memory instead of one, for writers whose memory goal is the file size, not the
    layer (:class:`_Behind`, docs/performance.md)."""
    from .stream import order, slab_bytes, slabs

    total = sum(slab_bytes(ckpt.layers[i].params[k]) for i, k in order(ckpt))
    if getattr(writer, "WRITE_BEHIND", False):
        return _Behind(writer, ckpt, total).run(on_slab, progress)
    done = 0
    try:
        for i, k, dirs in slabs(ckpt):
            if on_slab is not None:  # first: the writer may give back each array's pages once written
                on_slab(i, k, dirs)
            writer.write_slab(i, k, dirs)
            done += slab_bytes(dirs)
            del dirs  # before the next slab is read (and this one released by slabs): one slab alive at a time
            if progress is not None:
                progress(done, total)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


class _Behind:
    """:func:`stream_write` with the writing in one background thread, one slab behind the reading.

    At most two slabs are alive: the main thread may read slab ``n + 1`` only once slab ``n - 1`` is
    written (a semaphore of two slots, given back by the writer thread after each slab, which then also
    releases that slab through ``ckpt.release``). A writer error stops the reading at the next slab and is
    raised in the caller's thread; any error ends in ``writer.abort()`` after the thread has stopped."""

    def __init__(self, writer, ckpt, total: int) -> None:
        import queue
        import threading

        self.writer, self.ckpt, self.total = writer, ckpt, total
        self.slots = threading.Semaphore(2)
        self.todo: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.written = 0
        self.thread = threading.Thread(target=self._work, name="rnnconvert-writer", daemon=True)

    def _work(self) -> None:
        from .stream import slab_bytes

        while True:
            item = self.todo.get()
            if item is None:
                return
            i, k, dirs = item
            try:
                if self.error is None:
                    self.writer.write_slab(i, k, dirs)
                    self.written += slab_bytes(dirs)
            except BaseException as exc:  # handed to the main thread
                self.error = exc
            finally:
                del dirs, item
                if self.ckpt.release is not None:
                    self.ckpt.release(i, k)
                self.slots.release()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def run(self, on_slab, progress) -> list[str]:
        from .stream import order

        self.thread.start()
        try:
            for i, k in order(self.ckpt):
                self.slots.acquire()
                self._check()
                if progress is not None:
                    progress(self.written, self.total)
                dirs = self.ckpt.slab(i, k)
                self.todo.put((i, k, dirs))
                if on_slab is not None:
                    on_slab(i, k, dirs)
                del dirs
            self.todo.put(None)
            self.thread.join()
            self._check()
            if progress is not None:
                progress(self.written, self.total)
            return self.writer.close()
        except BaseException:
            self.error = self.error or RuntimeError("stopped")  # the thread skips what is still queued
            self.todo.put(None)
            self.thread.join()
            self.writer.abort()
            raise


# ------------------------------------------------------------------------------------- reader options
#: Formats whose reader hands its ``**opts`` on to another format's reader, whose options it therefore
#: accepts too (``tf_graph.read`` -> TF1-cell options of ``tf_checkpoint.read``; ``tf2_writer.read`` is
#: ``tf_checkpoint.read``).
READ_OPTIONS_OF = {"tf_graph": "tf_checkpoint", "tf2_checkpoint": "tf_checkpoint"}
#: Options a reader takes through its ``**opts`` catch-all: ``keras_h5`` (plain HDF5) and ``npz`` (no
#: rnnconvert schema) hand them to the foreign-name table (``core.names.fallback``: ``map``, ``nonlinearity``).
READ_OPTIONS_EXTRA = {"keras_h5": ("map", "nonlinearity"), "npz": ("map", "nonlinearity")}
#: Reader parameters that are not user options (set by :func:`rnnconvert.api.load` itself).
_NOT_OPTIONS = {"path", "lazy"}


def read_options(fmt: Format) -> tuple[str, ...]:
    """The option names ``fmt``'s reader accepts: the keyword parameters of its ``read`` (the reader
    declares them; ``**_`` catch-alls are not options), plus those of :data:`READ_OPTIONS_OF`."""
    import inspect

    names: list[str] = []
    for f in (fmt, get(READ_OPTIONS_OF[fmt.name]) if fmt.name in READ_OPTIONS_OF else None):
        read = getattr(f.load(), "read", None) if f is not None else None
        if read is None:
            continue
        for p in inspect.signature(read).parameters.values():
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _NOT_OPTIONS \
                    and p.name not in names:
                names.append(p.name)
    names += [n for n in READ_OPTIONS_EXTRA.get(fmt.name, ()) if n not in names]
    return tuple(names)


def check_read_options(fmt: Format, opts: dict) -> None:
    """Refuse reader options ``fmt`` does not know (a typo such as ``forget_bais`` must not pass silently).

    Raises:
        OptionError: naming the unknown keys and the valid ones for ``fmt``.
    """
    from ..errors import OptionError

    valid = read_options(fmt)
    unknown = [k for k, v in opts.items() if k not in valid and v is not None]
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise OptionError(f"unknown reader option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                          f"for {fmt.name} files; valid: {listed}")
