"""The exception tree of rnnconvert.

Every failure that reaches a user is an :class:`RNNConvertError` subclass whose message is one
line saying *where* (file, layer), *what* (the feature or the defect) and *what to do next*.
Lower-level errors (h5py, numpy, torch, ...) are translated at the format boundary and kept as
``__cause__``. Each class carries the process exit code that the CLI uses.

Exit codes (documented in ``docs/cli.md``):

====  =====================================================================
0     success
1     unexpected internal error (a bug: please report it)
2     usage error (bad command-line arguments; typer's own code), :class:`OptionError` -- an unknown option,
      :class:`SettingError` -- an environment variable holding a value it cannot use
3     :class:`FormatError` -- the input file is unreadable, malformed or of an unknown format
4     :class:`UnsupportedError` -- the target cannot express the source faithfully (refused)
5     :class:`VerificationError` -- the written result does not compute the source's function
6     :class:`OutputExistsError` -- the output exists and ``--force`` was not given
7     :class:`DependencyError` -- an optional framework needed for this format is not installed
8     (CLI only) a directory SRC: at least one file was not converted
9     :class:`InconclusiveError` -- verification could not decide (its tolerance was too loose to tell a
      broken file from a correct one); no output kept unless ``--accept-inconclusive``
10    :class:`OutputError` -- the output could not be written (no space left, read-only file system,
      permission denied), or the process's limits left too little memory or threads (the CLI's
      ``environment_limit``); nothing was left behind
11    :class:`BudgetError` -- the file asks for more than the resource budget (``rnnconvert.safety.budget``)
129   SIGHUP, 130 SIGINT (Ctrl-C), 143 SIGTERM: interrupted; temporaries removed, DST as it was
====  =====================================================================
"""

from __future__ import annotations


class RNNConvertError(Exception):
    """Base class of every error rnnconvert raises on purpose.

    The message (``str(exc)``) speaks the Python API's words (``force=True``, ``gate_activation=...``);
    where the way out differs on the command line, ``cli`` holds the same message in the CLI's words
    (``--force``, ``--gate-activation``), which :meth:`cli_message` gives and the CLI prints."""

    exit_code = 1

    def __init__(self, message: str = "", *, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli

    def cli_message(self) -> str:
        """The message as the command line says it (CLI options instead of API arguments)."""
        return self.cli or str(self)


class FormatError(RNNConvertError):
    """The input is unreadable, malformed, or not of a format rnnconvert knows."""

    exit_code = 3


class OptionError(FormatError):
    """An option the operation does not know: a reader or writer option the format does not take (the
    message names the valid ones), e.g. one another format has; a usage error."""

    exit_code = 2


class UnsupportedError(RNNConvertError):
    """The source uses a feature the target format cannot express; nothing was written."""

    exit_code = 4


class WholeModelError(UnsupportedError):
    """A whole model (a Keras full model) the whole-model writers cannot build: a layer they do not build, or a
    setting outside rnnconvert's whitelist (issue #41). Exit code 4, like every refusal. A conversion to a writer
    of whole models (``.onnx``, ``.pt2``, ``.keras``) then writes the model's recurrent layers alone, with a note
    naming this layer, unless asked to write the model whole (``whole=True``, CLI ``--whole``), which raises it.

    Attributes:
        layer: the layer's name (its path in nested models; ``''``: the model config itself).
        layer_class: its Keras class name (``''`` when unknown).
        reason: the message without its way out (what kept the model from being written whole)."""

    def __init__(self, message: str = "", *, cli: str | None = None, layer: str = "", layer_class: str = "",
                 reason: str = "") -> None:
        super().__init__(message, cli=cli)
        self.layer, self.layer_class = str(layer), str(layer_class)
        self.reason = reason or message


class VerificationError(RNNConvertError):
    """Source and result disagree beyond the tolerance; the output file was not kept."""

    exit_code = 5


class InconclusiveError(RNNConvertError):
    """Verification passed its tolerances, but a tolerance was too loose to tell a broken file from a
    correct one (:attr:`rnnconvert.verify.engine.LayerCheck.reason`); the output was not kept unless
    ``accept_inconclusive`` (``--accept-inconclusive``)."""

    exit_code = 9


class OutputExistsError(RNNConvertError):
    """The destination exists and overwriting was not asked for (``force=True``, CLI ``--force``)."""

    exit_code = 6


class SettingError(RNNConvertError):
    """An environment variable of rnnconvert holds a value it cannot use (:mod:`rnnconvert.process.settings`):
    the message names the variable and what it takes; a usage error."""

    exit_code = 2


class UnrecognisedError(FormatError):
    """A file rnnconvert reads, whose tensors it does not recognise as recurrent weights (no name of the
    foreign-name table, no recurrent node or cell scope). Besides the one-line message it carries what the file
    holds, so that ``rnnconvert inspect`` can list it and suggest a ``--map`` (docs/foreign-names.md):

    Attributes:
        tensors: ``[(name, shape, dtype), ...]`` in the file's order, at most
            :data:`rnnconvert.core.names.LISTED` entries (``shape`` a tuple of ints, ``dtype`` a numpy dtype
            name or ``'?'``).
        total: how many tensors the file holds (``len(tensors)`` or more).
        suggested_map: ``--map`` items read from the shapes alone (:func:`rnnconvert.core.names.suggest_map`);
            a starting point to check, never applied by rnnconvert."""

    exit_code = 3

    def __init__(self, message: str = "", *, tensors: list | None = None, total: int | None = None,
                 suggested_map: list[str] | None = None, cli: str | None = None) -> None:
        super().__init__(message, cli=cli)
        self.tensors = list(tensors or [])
        self.total = len(self.tensors) if total is None else total
        self.suggested_map = list(suggested_map or [])


class BudgetError(FormatError):
    """The file declares more work or memory than the resource budget allows (:mod:`rnnconvert.safety.budget`);
    the message names the limit and the environment variable that raises it."""

    exit_code = 11


class OutputError(RNNConvertError):
    """The environment refused the output (no space left, read-only file system, permission denied):
    the message names the path and the cause; temporaries were removed, DST was left as it was."""

    exit_code = 10


class DependencyError(RNNConvertError):
    """An optional dependency (torch, tensorflow, tf_keras, onnx, ...) is missing."""

    exit_code = 7


#: What each optional extra adds (``pyproject.toml``; one place for this fact, docs/cli.md repeats it).
#: The plain install (numpy, h5py, typer, rich) reads Keras HDF5, safetensors, .npz, and the TF checkpoint
#: bytes, and writes .pt, .safetensors, .npz and .cudnn.npz.
EXTRAS = {
    "torch": "reading .pt/.pth files, and verification of .pt, .safetensors and .npz output by PyTorch "
             "running the written file",
    "tensorflow": "Keras 2 .h5 and TF checkpoint output, reading .pb graphs and Keras 3 files, and "
                  "framework verification (tf_keras/TensorFlow running the source)",
    "onnx": ".onnx output and input, and verification of .onnx output by onnxruntime",
    "safetensors": "nothing required (rnnconvert reads and writes the format itself); the library is used "
                   "when present",
    "fast": "a C CRC-32C for TensorFlow checkpoint checksums",
    "report": "the plots of the HTML report (--report)",
    "openvino": "OpenVINO IR output and its verification by the OpenVINO runtime (reading IRs needs nothing)",
    "mlx": "verification of MLX output by MLX running the written file (reading MLX files needs nothing)",
    "paddle": "verification of .pdparams output by Paddle running the written file (reading and writing .pdparams "
              "need nothing; without it torch verifies)",
    "tflite": "reading .tflite flatbuffers (the TensorFlow Lite schema package)",
    "jax": "reading Flax .msgpack files (msgpack) and Orbax folders (tensorstore), and JAX/Flax/Haiku/Equinox themselves",
}


def require(module: str, extra: str):
    """Import an optional framework or raise :class:`DependencyError` naming the extra to install and
    what that extra adds (:data:`EXTRAS`)."""
    import importlib

    import importlib.util

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        try:
            installed = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            installed = False
        if installed:  # installed, but its import failed (a process memory limit, a broken install): say that
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DependencyError(f"the Python package '{module}' is installed but could not be imported here "
                                  f"({first}); a process memory limit (ulimit -v) or a damaged install does "
                                  "this") from exc
        adds = f" (the '{extra}' extra adds {EXTRAS[extra]})" if extra in EXTRAS else ""
        raise DependencyError(
            f"this needs the Python package '{module}', which is not installed: "
            f"pip install 'rnnconvert[{extra}]' -c constraints.txt{adds}"
        ) from exc


def printable(text: object) -> str:
    """``text`` made safe for one terminal line: control characters (newlines, escape sequences, DEL,
    C1 controls) shown as ``\\n``, ``\\x1b``...; names read from a file are data, never layout or markup
    (the CLI's rich console runs with markup off; this keeps the rest out)."""
    s = str(text)
    if s.isprintable():
        return s
    out = []
    for ch in s:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        else:
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)
