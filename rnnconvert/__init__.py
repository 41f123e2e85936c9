"""rnnconvert: move trained LSTM, GRU and simple RNN weights between formats, exactly, and verify.

Public API::

    import rnnconvert
    ckpt = rnnconvert.load("model.h5")                  # canonical Checkpoint
    rnnconvert.convert("model.h5", "model.pt")           # write + verify + atomic rename
    mods = rnnconvert.torch_modules("model.h5")          # {'lstm': nn.LSTM(...)} ready to run
    rnnconvert.list_formats()                            # what each format reads and writes

Heavy frameworks (torch, tensorflow, onnx) are imported only inside the formats that need them; the names
below are imported on first use (``import rnnconvert`` loads no numpy, format, runtime or verification module).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module defining it, imported on first use (PEP 562): ``import rnnconvert`` and
#: ``rnnconvert --help`` import neither numpy nor a format, runtime or verification module
_LAZY = {
    **dict.fromkeys(("ConversionReport", "ConvertOptions", "DiagnosisReport", "convert", "diagnose", "inspect", "list_formats", "load",
                     "load_inputs", "save", "to_module", "torch_modules", "verify"), "api"),
    **dict.fromkeys(("RNNConvertError", "FormatError", "OptionError", "UnsupportedError", "VerificationError",
                     "InconclusiveError", "OutputExistsError", "BudgetError", "OutputError", "DependencyError",
                     "SettingError", "UnrecognisedError", "WholeModelError"),
                    "errors"),
    **dict.fromkeys(("Cell", "Checkpoint", "DirectionParams", "RNNLayer", "Semantics"), "core.model"),
    "VerifyReport": "verify.engine", "LayerCheck": "verify.checks", "Refused": "engine.refusal",
}

__all__ = sorted(_LAZY)


class _Package(types.ModuleType):
    """The package's module type: the import system binds a subpackage on its parent when it is first imported,
    and the subpackage :mod:`rnnconvert.verify` has the name of the public function :func:`verify`; the
    function keeps the name (as when ``__init__`` imported it eagerly, after its subpackages)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (then cached in the package); a module of
    the package (``rnnconvert.api``) is imported when first read as an attribute."""
    where = _LAZY.get(name)
    if where is None:  # a subpackage or module (``rnnconvert.api``, ``rnnconvert.errors``), as after an import
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'rnnconvert' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .api import (ConversionReport, ConvertOptions, DiagnosisReport, convert, diagnose, inspect,  # noqa: F401
                      list_formats, load, load_inputs, save, to_module, torch_modules, verify)
    from .core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics  # noqa: F401
    from .errors import (BudgetError, DependencyError, FormatError, InconclusiveError, OptionError,  # noqa: F401
                         OutputError, OutputExistsError, RNNConvertError, SettingError, UnrecognisedError,
                         UnsupportedError, VerificationError, WholeModelError)
    from .engine.refusal import Refused  # noqa: F401
    from .verify.checks import LayerCheck  # noqa: F401
    from .verify.engine import VerifyReport  # noqa: F401


sys.modules[__name__].__class__ = _Package
