"""A writer's refusal: the one way every writer says that a layer cannot be written faithfully.

A writer's ``check`` (or ``write``) calls :func:`refuse` with its ``refusals(layer)``; the engine, which
knows every format, adds the way out (:func:`rnnconvert.engine.registry.complete`) before the error
reaches the user. Writers therefore never import the registry that loads them.
"""

from __future__ import annotations

from ..errors import UnsupportedError


class Refused(UnsupportedError):
    """``layer`` cannot be written as ``target``: one line naming the layer, the target, every blocking
    feature (``why``) and -- once the engine has set :attr:`way_out` -- the way out. Public as
    ``rnnconvert.Refused`` (an :class:`~rnnconvert.errors.UnsupportedError`, exit code 4).

    Attributes:
        layer: the refused :class:`~rnnconvert.core.model.RNNLayer` (its parameters may be a lazy
            checkpoint's placeholders: ``repr`` shows only its name). why: the blocking features, one string
            each. fmt: the writer's registry name. target: what it writes (``"PyTorch nn.GRU"``). way_out: the
            formats that express the layer (set by :func:`rnnconvert.engine.registry.complete`), or ``None``."""

    def __init__(self, layer, why: list[str], fmt: str, target: str) -> None:
        cls = layer.source.get("class_name") if isinstance(layer.source, dict) else None
        self.layer, self.why, self.fmt, self.target = layer, list(why), fmt, target
        self.base = f"layer '{layer.name}'{f' ({cls})' if cls else ''} cannot be written as {target}: {'; '.join(why)}."
        self.way_out: str | None = None
        super().__init__(self.base)

    def __str__(self) -> str:
        return self.base if self.way_out is None else f"{self.base} {self.way_out}"

    def __repr__(self) -> str:
        """One short line: the layer's name (never its arrays, which a lazy checkpoint holds as NaN
        placeholders), the target, the blocking features and the way out."""
        out = f"Refused(layer={self.layer.name!r}, target={self.target!r}, why={self.why!r}"
        return out + (f", way_out={self.way_out!r})" if self.way_out else ")")


def refuse(layer, why: list[str], fmt: str, target: str) -> None:
    """Raise :class:`Refused` when ``why`` (a writer's ``refusals(layer)``) is not empty; ``fmt`` is the
    writer's registry name (excluded from the way out), ``target`` what it writes (``"PyTorch nn.GRU"``)."""
    if why:
        raise Refused(layer, why, fmt, target)
