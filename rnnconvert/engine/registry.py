"""The format registry: one :class:`Format` record per file format, and format detection.

Each record names a format's CLI name, file name endings, description and where its declared
capabilities live: a :class:`~rnnconvert.engine.protocol.FormatSpec` in its family's ``spec.py``
(``rnnconvert/formats/<family>/spec.py``), loaded on first use so that ``import rnnconvert`` stays light.
The engine uses a format only through that record (docs/architecture.md).

Detection (:func:`detect`) runs every sniffer: a file two sniffers claim is an error naming both and
``--from``; a duplicate name is refused at import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError
from .protocol import FormatSpec
from .refusal import Refused


@dataclass(frozen=True)
class Format:
    """A file format: its CLI name, where its :class:`FormatSpec` lives (``"module:NAME"``), file name
    endings, and a description."""

    name: str
    spec: str
    extensions: tuple[str, ...]
    description: str
    #: where its sniffer lives (``"module:function"``, the family's light ``sniff`` module), or ``""`` for a
    #: format detected as another (``tf2_checkpoint``) or only named (``tf_graph``): ``sniff(head, path) ->
    #: bool`` claims a file from its first 64 bytes (``b""`` for a path naming no file: a TF checkpoint
    #: prefix) and its layout; detection runs every sniffer, so a sniff module imports nothing heavy
    sniff: str = ""

    def load(self) -> FormatSpec:
        """The format's declared record (its family's modules are imported on first use)."""
        module, _, attr = self.spec.partition(":")
        spec = getattr(importlib.import_module(module), attr)  # the one place a record is looked up by name
        if not isinstance(spec, FormatSpec) or spec.name != self.name:
            raise RuntimeError(f"{self.spec} is not the FormatSpec of {self.name!r}")
        return spec

    def sniffer(self):
        """The format's sniffer (:attr:`sniff`), or None; imports only the family's ``sniff`` module."""
        if not self.sniff:
            return None
        module, _, attr = self.sniff.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def can_read(self) -> bool:
        return self.load().read is not None

    @property
    def can_write(self) -> bool:
        return self.load().write is not None


FORMATS: tuple[Format, ...] = (
    Format("keras_h5", "rnnconvert.formats.keras.spec:KERAS_H5", (".h5", ".hdf5", ".net"),
           "Keras 1/2, tf.keras, tf_keras HDF5 (full model or weights only)",
           sniff="rnnconvert.formats.keras.sniff:keras_h5"),
    # keras_h5's sniff declines HDF5 files without model_weights/layer_names (Keras 3 stores)
    Format("keras3", "rnnconvert.formats.keras.spec:KERAS3", (".keras", ".weights.h5"),
           "Keras 3 .keras archive or .weights.h5 (vars/0..2 under class-name paths)",
           sniff="rnnconvert.formats.keras.sniff:keras3"),
    Format("pt", "rnnconvert.formats.torch.spec:PT", (".pt", ".pth"),
           "PyTorch state dict, training checkpoint or TorchScript archive (weights only)",
           sniff="rnnconvert.formats.torch.sniff:pt"),
    Format("pt2", "rnnconvert.whole.formats.torch.spec:PT2", (".pt2",),
           "torch.export program (output only: whole Keras models, or the recurrent layers; never read)"),
    Format("tf_checkpoint", "rnnconvert.formats.tf.spec:TF_CHECKPOINT", (),
           "TensorFlow checkpoint: TF1 name-based (cells, cuDNN opaque_kernel) or TF2 object-based "
           "(tf.keras save_weights); give the prefix, the .index file or the directory",
           sniff="rnnconvert.formats.tf.sniff:tf_checkpoint"),
    Format("tf2_checkpoint", "rnnconvert.formats.tf.spec:TF2_CHECKPOINT", (),
           "TF2 object checkpoint of tf_keras layers (layer_with_weights-N), written as a directory; "
           "read like tf_checkpoint"),
    Format("tf_graph", "rnnconvert.formats.tf.spec:TF_GRAPH", (".pb",),
           "TensorFlow 1 frozen GraphDef (weights as Const nodes)"),
    Format("onnx", "rnnconvert.formats.onnx.spec:ONNX", (".onnx",),
           "ONNX model with LSTM/GRU/RNN nodes (onnxruntime runs it)",
           sniff="rnnconvert.formats.onnx.sniff:onnx"),
    Format("safetensors", "rnnconvert.formats.storage.spec:SAFETENSORS", (".safetensors",),
           "safetensors with PyTorch state-dict key names",
           sniff="rnnconvert.formats.storage.sniff:safetensors"),
    # both are zips of .npy members: cudnn_npz's sniff looks for its spec member, npz's for its schema member
    Format("cudnn_npz", "rnnconvert.formats.storage.spec:CUDNN_NPZ", (".cudnn.npz",),
           "raw cuDNN parameter buffers (one per layer) + JSON spec, in one .npz",
           sniff="rnnconvert.formats.storage.sniff:cudnn_npz"),
    Format("npz", "rnnconvert.formats.storage.spec:NPZ", (".npz",),
           "numpy .npz in rnnconvert's canonical schema (docs/pytorch.md)",
           sniff="rnnconvert.formats.storage.sniff:npz"),
    # mlx's sniff claims safetensors/.npz files of MLX recurrent key sets; safetensors' sniff declines them
    Format("mlx", "rnnconvert.formats.mlx.spec:MLX", (".mlx.safetensors",),
           "MLX mlx.nn.LSTM/GRU/RNN weights (save_weights .safetensors or .npz; written as safetensors)",
           sniff="rnnconvert.formats.mlx.sniff:mlx"),
    Format("openvino", "rnnconvert.formats.openvino.spec:OPENVINO", (),
           "OpenVINO IR with LSTMSequence/GRUSequence/RNNSequence nodes: read from the .xml (its .bin beside it) "
           "or a folder holding one; written as a folder DST/ with model.xml and model.bin",
           sniff="rnnconvert.formats.openvino.sniff:openvino"),
    Format("paddle", "rnnconvert.formats.paddle.spec:PADDLE", (".pdparams",),
           "PaddlePaddle paddle.save state dict of nn.LSTM/GRU/SimpleRNN (read by an allow-list unpickler)",
           sniff="rnnconvert.formats.paddle.sniff:paddle"),
    Format("pickle", "rnnconvert.formats.pickle.spec:PICKLE", (".pkl", ".pickle"),
           "pickled numpy arrays under a project's own names (dicts, lists, objects; allow-list unpickler)",
           sniff="rnnconvert.formats.pickle.sniff:pickle"),
    Format("tflite", "rnnconvert.formats.tflite.spec:TFLITE", (".tflite",),
           "TensorFlow Lite / LiteRT flatbuffer with fused UNIDIRECTIONAL_SEQUENCE_LSTM ops",
           sniff="rnnconvert.formats.tflite.sniff:tflite"),
    Format("flax_msgpack", "rnnconvert.formats.jax.spec:FLAX_MSGPACK", (".msgpack",),
           "Flax linen/NNX parameters saved with flax.serialization (msgpack): LSTM, GRU, SimpleCell",
           sniff="rnnconvert.formats.jax.sniff:flax_msgpack"),
    # haiku's sniff claims .npz files of Haiku core names (npz's needs its schema member, mlx's MLX names);
    # a Haiku tree in msgpack is detected as flax_msgpack, whose reader hands it to Haiku's convention; the
    # endings only list what it reads (npz and flax_msgpack come first, so they keep them for output and fallback)
    Format("haiku", "rnnconvert.formats.jax.spec:HAIKU", (".npz", ".msgpack"),
           "Haiku hk.LSTM/GRU/VanillaRNN parameters (np.savez of <module>/<param> keys, flax.serialization "
           "msgpack; a pickled tree is read as pickle)",
           sniff="rnnconvert.formats.jax.sniff:haiku"),
    Format("equinox", "rnnconvert.formats.jax.spec:EQUINOX", (".eqx",),
           "Equinox eqx.nn.LSTMCell/GRUCell saved by eqx.tree_serialise_leaves (unnamed .npy leaves; sizes inferred "
           "from the shapes or given as --read-opt cells=...)",
           sniff="rnnconvert.formats.jax.sniff:equinox"),
    Format("orbax", "rnnconvert.formats.jax.spec:ORBAX", (),
           "Orbax checkpoint folder (_METADATA, OCDBT/zarr arrays) of a Flax or Haiku parameter tree; arrays read by "
           "tensorstore (the jax extra); give the step folder",
           sniff="rnnconvert.formats.jax.sniff:orbax"),
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


def _sniffed(head: bytes, p: Path) -> list[Format]:
    """Every format whose sniffer claims ``p`` (``head``: its first 64 bytes, ``b""`` for no file)."""
    out = []
    for f in FORMATS:
        sniff = f.sniffer()
        if sniff is None:
            continue
        try:
            hit = sniff(head, p)
        except Exception:  # a damaged file must not crash detection; the reader reports it properly
            hit = False
        if hit:
            out.append(f)
    return out


def _one(p: Path, found: list[Format]) -> Format:
    if len(found) > 1:
        raise FormatError(f"{p}: ambiguous file format, it looks like {' and '.join(f.name for f in found)}; "
                          f"name it with --from {found[0].name} (or --from {found[1].name})")
    return found[0]


def detect(path: str | Path) -> Format:
    """Detect the format of an existing file by content (magic bytes), falling back to its extension.

    Every format's sniffer runs; formats' sniffers are written to exclude each other, so two claims are
    an error, never a guess.

    Raises:
        FormatError: the path does not exist, is unreadable, matches no known format, or matches more
        than one (the message names them and ``--from``).
    """
    p = Path(path)
    if not p.exists():
        # a checkpoint prefix (``ckpt-1`` beside ``ckpt-1.index``) names no file itself
        found = _sniffed(b"", p)
        if found:
            return _one(p, found)
        raise FormatError(f"{p}: no such file or directory")
    head = b""
    if p.is_file():
        try:
            with open(p, "rb") as fh:
                head = fh.read(64)
        except OSError as exc:
            raise FormatError(f"{p}: cannot read ({exc.strerror})") from exc
    found = _sniffed(head, p)
    if found:
        return _one(p, found)
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
    exact, scaled = [], []
    for f in FORMATS:
        if f.name in (exclude, "npz", "safetensors"):
            continue
        spec = f.load()
        ref = spec.refusals
        if ref is not None and not ref(layer):
            ext = f.extensions[0] if f.extensions else f"--to {f.name}"
            rescaled = spec.rescale_plan  # a redefined hard_sigmoid met by scaled weights
            (scaled if rescaled and rescaled(layer) else exact).append(ext)
    also = f"to {' or '.join(scaled)} (hard_sigmoid rescaled: one float32 rounding per weight, not bit-exact)"
    if not exact:
        return (f"Convert {also} instead" if scaled
                else "No format rnnconvert writes computes this exactly; keep the source checkpoint")
    out = f"Convert to {' or '.join(exact)} instead, which {'expresses' if len(exact) == 1 else 'express'} it exactly"
    return out + (f", or {also}" if scaled else "")


def complete(exc: Refused) -> Refused:
    """Give a writer's :class:`~rnnconvert.engine.refusal.Refused` its way out (:func:`way_out`) and return
    it, for the caller to raise. The engine calls this wherever a writer's ``check``/``write`` runs; the
    writer itself never looks at the registry (no import cycle)."""
    if exc.way_out is None:
        exc.way_out = way_out(exc.layer, exc.fmt)
    return exc


def for_output(path: str | Path, to: str | None = None) -> Format:
    """The format to write ``path`` in: ``to`` when given, else by the file name's extension.

    Raises:
        FormatError: no ``to`` and an extension rnnconvert does not write.
    """
    if to:
        return get(to)
    f = _by_extension(Path(path))
    if f is None and Path(path).suffix == ".py":  # nn.Module source comes with a model file, not as one
        head = f"{path}: Python source is not a checkpoint format; write it beside one with "
        raise FormatError(head + f"convert(src, 'model.pt2', emit_module='{Path(path).name}')",
                          cli=head + f"rnnconvert SRC model.pt2 --emit-module {Path(path).name}")
    if f is None:
        names = ", ".join(x.name for x in FORMATS)
        raise FormatError(f"{path}: cannot tell the output format from the extension; pass to=... ({names})",
                          cli=f"{path}: cannot tell the output format from the extension; pass --to ({names})")
    return f


def read_options(fmt: Format) -> tuple[str, ...]:
    """The option names ``fmt``'s reader accepts (its :attr:`FormatSpec.read_options
    <rnnconvert.engine.protocol.FormatSpec.read_options>`; anything else is refused by
    :meth:`FormatSpec.check_options <rnnconvert.engine.protocol.FormatSpec.check_options>`)."""
    return tuple(fmt.load().read_options)
