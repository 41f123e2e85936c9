"""The source :func:`rnnconvert.api.load` gives a lazy checkpoint (:class:`CheckedSlabs`, its
:class:`~rnnconvert.core.model.SlabSource`): the load rules on every slab the reader loads later -- one-line
errors, the NaN/Inf rule of :mod:`.finite`."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..core.model import Checkpoint
from ..errors import FormatError, RNNConvertError
from .finite import check_arrays


def _fields(dp) -> dict[str, Any]:
    """A direction's non-``None`` arrays by field name (as ``DirectionParams.arrays``), read as attributes."""
    return {f.name: getattr(dp, f.name) for f in fields(dp) if getattr(dp, f.name) is not None}



class CheckedSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` :func:`rnnconvert.api.load` gives a lazy checkpoint: its reader's
    source with :func:`rnnconvert.api.load`'s rules applied to every slab read: low-level errors become FormatError,
    NaN/Inf is refused. A memory-mapped source's pages are then given back array by array (the reader's
    ``release_array``), so that a writer holds one tensor's pages at a time, not the slab's."""

    def __init__(self, ckpt: Checkpoint, where: str, fmt: str) -> None:
        self.inner, self.layers, self.where, self.fmt = ckpt.slabs, ckpt.layers, where, fmt

    def read(self, i: int, k: int):
        try:
            dirs = self.inner.read(i, k)
        except RNNConvertError:
            raise
        except Exception as exc:  # the file changed or is damaged past its header
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise FormatError(f"{self.where}: malformed {self.fmt} file ({type(exc).__name__}: {first})") from exc
        layer = self.layers[i]
        name = f"{layer.name}[{k}]" if layer.num_layers > 1 else layer.name  # messages name the stacked layer
        for d, dp in enumerate(dirs):
            check_arrays(_fields(dp), name, 0, d, self.where, self.inner.release_array)
        return dirs

    def release(self, i: int, k: int) -> None:
        self.inner.release(i, k)

    def release_array(self, a) -> None:
        self.inner.release_array(a)


