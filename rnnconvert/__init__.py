"""rnnconvert: move trained LSTM, GRU and simple RNN weights between formats, exactly, and verify.

Public API::

    import rnnconvert
    ckpt = rnnconvert.load("model.h5")                  # canonical Checkpoint
    rnnconvert.convert("model.h5", "model.pt")           # write + verify + atomic rename
    mods = rnnconvert.torch_modules("model.h5")          # {'lstm': nn.LSTM(...)} ready to run
    rnnconvert.list_formats()                            # what each format reads and writes

Heavy frameworks (torch, tensorflow, onnx) are imported only inside the formats that need them.
"""

from .api import ConversionReport, DiagnosisReport, convert, diagnose, inspect, list_formats, load, load_inputs, save, torch_modules, verify
from .errors import (DependencyError, FormatError, OptionError, OutputExistsError, RNNConvertError,
                     UnsupportedError, VerificationError)
from .core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics
from .engine.refusal import Refused

__version__ = "0.1.0"

__all__ = [
    "Cell", "Checkpoint", "ConversionReport", "DiagnosisReport", "diagnose", "DependencyError", "DirectionParams", "FormatError",
    "OptionError", "OutputExistsError", "Refused", "RNNConvertError", "RNNLayer", "Semantics", "UnsupportedError",
    "VerificationError", "convert", "inspect", "list_formats", "load", "load_inputs", "save", "torch_modules", "verify",
]
